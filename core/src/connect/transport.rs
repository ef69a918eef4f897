//! How the agent reaches Consul's HTTP API beyond its address: TLS (`consul { ssl verify_ssl
//! ca_file cert_file key_file }`) and HTTP basic auth (`consul { auth }`). The agent's own
//! calls use it (io-real's `ConsulHttp`), and the `envoy_bootstrap` hook hands it to the
//! `consul connect envoy` it runs, as Nomad's `consulTransportConfig` does: the files as
//! `-ca-file`/`-client-cert`/`-client-key`, the rest as `CONSUL_HTTP_AUTH`, `CONSUL_HTTP_SSL`
//! and `CONSUL_HTTP_SSL_VERIFY` in its environment.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulTransport {
    /// `consul { auth }`: `user:password` for HTTP basic auth; a secret.
    #[serde(default)]
    pub auth: Option<String>,
    /// `consul { ssl }`: Consul's HTTP API speaks HTTPS. Nomad's default is false.
    #[serde(default)]
    pub ssl: bool,
    /// `consul { verify_ssl }`: check Consul's certificate. Nomad's default is true.
    #[serde(default = "yes")]
    pub verify_ssl: bool,
    /// `consul { ca_file }`: the CA that signed Consul's certificate (PEM); empty: the host's
    /// trusted roots.
    #[serde(default)]
    pub ca_file: String,
    /// `consul { cert_file key_file }`: the agent's client certificate and key (PEM), for a
    /// Consul with `verify_incoming`.
    #[serde(default)]
    pub cert_file: String,
    #[serde(default)]
    pub key_file: String,
}

fn yes() -> bool {
    true
}

impl Default for ConsulTransport {
    fn default() -> Self {
        ConsulTransport {
            auth: None,
            ssl: false,
            verify_ssl: true,
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
        }
    }
}

/// The password in `auth` must never reach a log.
impl core::fmt::Debug for ConsulTransport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ConsulTransport")
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("ssl", &self.ssl)
            .field("verify_ssl", &self.verify_ssl)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl ConsulTransport {
    /// Nomad's checks of the block: a certificate needs its key and the other way round.
    pub fn validate(&self) -> Result<(), String> {
        match (self.cert_file.is_empty(), self.key_file.is_empty()) {
            (false, true) => Err("consul: cert_file is set but key_file is not; both are needed".into()),
            (true, false) => Err("consul: key_file is set but cert_file is not; both are needed".into()),
            _ => Ok(()),
        }
    }

    /// The arguments `consul connect envoy` gets after its own (Nomad's `envoyBootstrapArgs`).
    pub fn cli_args(&self) -> Vec<String> {
        [
            ("-ca-file", &self.ca_file),
            ("-client-cert", &self.cert_file),
            ("-client-key", &self.key_file),
        ]
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .flat_map(|(flag, value)| [flag.to_string(), value.clone()])
        .collect()
    }

    /// The environment `consul connect envoy` runs with (Nomad's `envoyBootstrapArgs.env`):
    /// Nomad always sets the two TLS switches, and the auth when there is one.
    pub fn cli_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(auth) = &self.auth {
            env.push(("CONSUL_HTTP_AUTH".to_string(), auth.clone()));
        }
        env.push(("CONSUL_HTTP_SSL".to_string(), self.ssl.to_string()));
        env.push(("CONSUL_HTTP_SSL_VERIFY".to_string(), self.verify_ssl.to_string()));
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_become_flags_and_the_switches_environment() {
        let transport = ConsulTransport {
            auth: Some("nomad:hunter2".into()),
            ssl: true,
            verify_ssl: false,
            ca_file: "/etc/consul/ca.pem".into(),
            cert_file: "/etc/consul/client.pem".into(),
            key_file: "/etc/consul/client-key.pem".into(),
        };
        assert_eq!(
            transport.cli_args(),
            [
                "-ca-file",
                "/etc/consul/ca.pem",
                "-client-cert",
                "/etc/consul/client.pem",
                "-client-key",
                "/etc/consul/client-key.pem"
            ]
        );
        assert_eq!(
            transport.cli_env(),
            [
                ("CONSUL_HTTP_AUTH".to_string(), "nomad:hunter2".to_string()),
                ("CONSUL_HTTP_SSL".to_string(), "true".to_string()),
                ("CONSUL_HTTP_SSL_VERIFY".to_string(), "false".to_string()),
            ]
        );
        assert!(!format!("{transport:?}").contains("hunter2"));
    }

    #[test]
    fn defaults_are_nomads() {
        let transport = ConsulTransport::default();
        assert!(transport.cli_args().is_empty());
        assert_eq!(
            transport.cli_env(),
            [
                ("CONSUL_HTTP_SSL".to_string(), "false".to_string()),
                ("CONSUL_HTTP_SSL_VERIFY".to_string(), "true".to_string()),
            ]
        );
        let decoded: ConsulTransport = serde_json::from_str("{}").unwrap();
        assert_eq!(decoded, transport);
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let half = ConsulTransport {
            cert_file: "/c.pem".into(),
            ..ConsulTransport::default()
        };
        assert!(half.validate().unwrap_err().contains("key_file"));
        let other_half = ConsulTransport {
            key_file: "/k.pem".into(),
            ..ConsulTransport::default()
        };
        assert!(other_half.validate().unwrap_err().contains("cert_file"));
        assert!(ConsulTransport::default().validate().is_ok());
    }
}
