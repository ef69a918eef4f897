//! What the agent config's `limits` block bounds on the HTTP API (served by `drover-http`).

use std::time::Duration;

/// Bounds on what one client can make the HTTP API hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Open connections per client address; 0 for no limit (Nomad's
    /// `limits { http_max_conns_per_client }`, 100 by default).
    pub max_conns_per_client: usize,
    /// Time to send a request's headers, counted from the connection's start or the end of
    /// the previous response: an idle kept-alive connection is closed after it too.
    pub header_timeout: Duration,
    /// The longest pause between two pieces of a request body.
    pub body_timeout: Duration,
    /// The largest request body, in bytes (answered 413 above it).
    pub body_max: usize,
    /// The largest request head, in bytes (answered 431 above it).
    pub header_max: usize,
    /// Time for an HTTPS client to finish its TLS handshake (`limits {
    /// https_handshake_timeout }`, 5 s).
    pub handshake_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_conns_per_client: 100,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            body_max: 8 << 20,
            header_max: 64 << 10,
            handshake_timeout: crate::tls::stream::HANDSHAKE_TIMEOUT,
        }
    }
}
