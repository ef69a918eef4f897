//! Serving the HTTP API: what one client may hold of the agent.
//!
//! Each connection is served by hyper's HTTP/1 with a header deadline that also ends a kept-
//! alive connection left idle, a deadline between two pieces of a request body, and a bound on
//! header and body sizes; each client address holds at most `http_max_conns_per_client`
//! connections (Nomad's `limits` block; 100 by default), and one more is answered 429 and
//! closed. Before this, an idle connection, one with partial headers and one with a partial
//! body were all still open after 130 s, and 1,150 of them took every file descriptor the agent
//! had.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tower::ServiceExt;

use std::sync::Arc;

pub use drover_host::limits::HttpLimits;
use drover_host::sockets::Sockets;
use drover_host::tls::agent::AgentTls;
use drover_host::tls::stream::{MaybeTls, Prefixed, sniff};

/// The body limit on every route, and a 413 that names it.
pub(super) fn with_body_limit(app: Router, limits: HttpLimits) -> Router {
    let max = limits.body_max;
    app.layer(axum::middleware::map_response(move |response: Response| async move {
        if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return payload_too_large(max);
        }
        response
    }))
    .layer(DefaultBodyLimit::max(max))
}

fn payload_too_large(max: usize) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("Request body too large: the limit is {max} bytes"),
    )
        .into_response()
}

/// Accepts connections on `listener` for ever, serving each with `app` within `limits`.
pub(super) async fn accept_loop<S: Sockets>(
    listener: S::Listener,
    app: Router,
    limits: HttpLimits,
    tls: Option<Arc<AgentTls>>,
) {
    let conns = drover_host::sockets::ConnLimit::default();
    loop {
        let accepted = drover_host::sockets::accept_retrying::<S>(&listener).await;
        match conns.take(accepted.peer.ip(), limits.max_conns_per_client) {
            Some(slot) => {
                let (app, tls) = (app.clone(), tls.clone());
                let peer = accepted.peer;
                tokio::spawn(async move {
                    let stream = match tls {
                        None => MaybeTls::Plain(Prefixed::new(accepted.stream)),
                        Some(tls) => match https(accepted.stream, &tls, limits.handshake_timeout).await {
                            Ok(stream) => stream,
                            Err(error) => {
                                tracing::debug!(%peer, %error, "HTTPS handshake failed");
                                return;
                            }
                        },
                    };
                    serve_connection(stream, app, limits, slot).await;
                });
            }
            None => {
                tokio::spawn(refuse::<S>(accepted.stream, accepted.peer, limits.max_conns_per_client));
            }
        }
    }
}

/// The TLS side of an HTTPS connection; a client speaking plain HTTP to it is told so, as Go's
/// servers (and so Nomad's) do, rather than left with a closed connection.
async fn https<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: S,
    tls: &AgentTls,
    timeout: Duration,
) -> std::io::Result<MaybeTls<Prefixed<S>>> {
    let (is_tls, mut stream) = sniff(stream, timeout).await?;
    if !is_tls {
        let text = "Client sent an HTTP request to an HTTPS server.\n";
        let response = format!(
            "HTTP/1.0 400 Bad Request\r\n{}: text/plain\r\n{}: {}\r\nConnection: close\r\n\r\n{text}",
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            text.len()
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(response.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "plain HTTP to the HTTPS port",
        ));
    }
    drover_host::tls::stream::accept(stream, tls.http_server_config(), timeout).await
}

async fn serve_connection<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static>(
    stream: T,
    app: Router,
    limits: HttpLimits,
    _slot: drover_host::sockets::ConnSlot,
) {
    let body_timeout = limits.body_timeout;
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let request = request.map(|body| Body::new(tower_http::timeout::TimeoutBody::new(body_timeout, body)));
        app.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.header_max);
    // Upgrades: `alloc exec` is a WebSocket. The connection lingers when hyper is done with
    // it, so an answer given before the request was read is not lost to a reset.
    if let Err(error) = builder
        .serve_connection(TokioIo::new(super::linger::Lingering::new(stream)), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(%error, "HTTP connection ended");
    }
}

/// Answers a connection over the per-client limit with 429, then closes it.
async fn refuse<S: Sockets>(mut stream: S::Stream, peer: SocketAddr, max: usize) {
    tracing::debug!(%peer, max, "refused an HTTP connection: the client holds the most it may");
    let text = format!(
        "Your IP is issuing too many concurrent connections: the limit is {max} (limits {{ http_max_conns_per_client }})\n"
    );
    let response = format!(
        "HTTP/1.1 429 Too Many Requests\r\n{}: text/plain\r\n{}: {}\r\nConnection: close\r\n\r\n{text}",
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        text.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}
