//! `tls {}` on a real server: agent RPC is mutual TLS, callers are told apart by their
//! certificate's role, HTTPS serves the API, and certificates reload without dropping the
//! connections already open.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use drover_host::net::GrpcTransport;
use drover_host::tls::agent::{AgentTls, TlsSettings};
use drover_host::tls::issue::{self, CertRequest, Role};
use drover_http::HttpLimits;
use drover_io_real::io::{Transport, TransportError};
use drover_io_real::service::envelope;
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::rpc_error::Kind as ErrorKind;
use drover_proto::agent::v1::{AgentResponse, JsonPayload, StatusPeersRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CALL: Duration = Duration::from_secs(5);

/// A CA and one certificate per role, as files under `dir/<name>`.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn create(dir: &Path, name: &str) -> Pki {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = issue::create_ca(&format!("{name} CA"), 30).unwrap();
        std::fs::write(dir.join("ca.pem"), &ca.cert_pem).unwrap();
        for role in [Role::Server, Role::Client, Role::Cli] {
            let request = CertRequest {
                role,
                region: "global",
                domain: "nomad",
                days: 30,
                extra_dns: &[],
                extra_ips: &[],
            };
            let issued = issue::create_cert(&ca.cert_pem, &ca.key_pem, &request).unwrap();
            std::fs::write(dir.join(format!("{}.pem", role.as_str())), &issued.cert_pem).unwrap();
            std::fs::write(dir.join(format!("{}-key.pem", role.as_str())), &issued.key_pem).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// Settings presenting `role`'s certificate.
    fn settings(&self, role: Role) -> TlsSettings {
        TlsSettings {
            http: true,
            rpc: true,
            ca_file: self.path("ca.pem"),
            cert_file: self.path(&format!("{}.pem", role.as_str())),
            key_file: self.path(&format!("{}-key.pem", role.as_str())),
            verify_server_hostname: true,
            verify_https_client: false,
            ..TlsSettings::default()
        }
    }

    fn agent_tls(&self, role: Role) -> Arc<AgentTls> {
        Arc::new(AgentTls::load(self.settings(role), "global").unwrap())
    }
}

fn peers_request() -> drover_proto::agent::v1::AgentRequest {
    envelope("global", RequestBody::StatusPeers(StatusPeersRequest {}))
}

/// A call only servers may make (and harmless to answer).
fn read_index_request() -> drover_proto::agent::v1::AgentRequest {
    envelope(
        "global",
        RequestBody::RaftReadIndex(JsonPayload { json: b"null".to_vec() }),
    )
}

fn denied(response: &AgentResponse) -> bool {
    matches!(&response.body, Some(ResponseBody::Error(error)) if error.kind() == ErrorKind::PermissionDenied)
}

async fn call(
    transport: &GrpcTransport,
    rpc: u16,
    request: drover_proto::agent::v1::AgentRequest,
) -> Result<AgentResponse, TransportError> {
    transport.call(([127, 0, 0, 1], rpc).into(), request, CALL).await
}

/// One HTTPS GET over a fresh connection trusting `ca_file`: the status line, or the error.
async fn https_get(port: u16, ca_file: &str, path: &str) -> Result<String, String> {
    let settings = drover_host::tls::ClientTls {
        ca_file,
        cert_file: "",
        key_file: "",
        verify: true,
    };
    let config = drover_host::tls::client_config(&settings).map_err(|error| error.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|error| error.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = connector
        .connect(name, stream)
        .await
        .map_err(|error| error.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&response).to_string();
    Ok(response.lines().next().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_rpc_is_mutual_tls_and_a_certificate_names_what_its_holder_may_call() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), "cluster");
    let rogue = Pki::create(dir.path(), "rogue");
    let server = support::start_server_with_tls(
        &dir.path().join("agent"),
        false,
        HttpLimits::default(),
        100,
        Some(pki.agent_tls(Role::Server)),
    )
    .await;

    // Plaintext: the handshake never completes.
    let plain = GrpcTransport::default();
    assert!(call(&plain, server.rpc, peers_request()).await.is_err());

    // A certificate of another CA: refused by the server (and the server refused by it).
    let outsider = GrpcTransport::default().with_tls(rogue.agent_tls(Role::Server));
    let error = call(&outsider, server.rpc, peers_request()).await.unwrap_err();
    assert!(matches!(error, TransportError::Unreachable { .. }), "{error}");

    // A client certificate: a node's calls are answered, a server's are refused by name.
    let client = GrpcTransport::default().with_tls(pki.agent_tls(Role::Client));
    let peers = call(&client, server.rpc, peers_request()).await.unwrap();
    assert!(matches!(peers.body, Some(ResponseBody::StatusPeers(_))), "{peers:?}");
    let refused = call(&client, server.rpc, read_index_request()).await.unwrap();
    assert!(denied(&refused), "{refused:?}");

    // A CLI certificate of the CA is neither role: not even a node's calls.
    let cli = GrpcTransport::default().with_tls(pki.agent_tls(Role::Cli));
    let refused = call(&cli, server.rpc, peers_request()).await.unwrap();
    assert!(denied(&refused), "{refused:?}");

    // A server certificate may make a server's calls.
    let peer = GrpcTransport::default().with_tls(pki.agent_tls(Role::Server));
    let answered = call(&peer, server.rpc, read_index_request()).await.unwrap();
    assert!(!denied(&answered), "{answered:?}");
    server.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_upgrade_mode_serves_plaintext_and_tls_callers_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), "cluster");
    let mut settings = pki.settings(Role::Server);
    settings.rpc_upgrade_mode = true;
    let server = support::start_server_with_tls(
        &dir.path().join("agent"),
        false,
        HttpLimits::default(),
        100,
        Some(Arc::new(AgentTls::load(settings, "global").unwrap())),
    )
    .await;
    // A plaintext caller (an agent not yet moved to TLS) is served, unverified.
    let plain = GrpcTransport::default();
    let answered = call(&plain, server.rpc, read_index_request()).await.unwrap();
    assert!(!denied(&answered), "{answered:?}");
    // TLS callers are told apart by their certificates as ever.
    let client = GrpcTransport::default().with_tls(pki.agent_tls(Role::Client));
    let refused = call(&client, server.rpc, read_index_request()).await.unwrap();
    assert!(denied(&refused), "{refused:?}");
    let peer = GrpcTransport::default().with_tls(pki.agent_tls(Role::Server));
    let answered = call(&peer, server.rpc, read_index_request()).await.unwrap();
    assert!(!denied(&answered), "{answered:?}");
    server.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_min_version_and_cipher_suites_bound_what_is_negotiated() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), "cluster");
    let mut strict = pki.settings(Role::Server);
    strict.tls13_only = true;
    let server = support::start_server_with_tls(
        &dir.path().join("agent"),
        false,
        HttpLimits::default(),
        100,
        Some(Arc::new(AgentTls::load(strict, "global").unwrap())),
    )
    .await;
    // `tls_cipher_suites` cuts the TLS 1.2 suites offered to those named (TLS 1.3's stay, as
    // in Go).
    let mut old = pki.settings(Role::Server);
    old.cipher_suites = vec!["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()];
    let old_tls = AgentTls::load(old, "global").unwrap();
    let config = old_tls.rpc_client_config();
    assert!(
        config
            .crypto_provider()
            .cipher_suites
            .iter()
            .filter(|suite| suite.version() == &rustls::version::TLS12)
            .all(|suite| suite.suite() == rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
        "only the configured TLS 1.2 suite is offered"
    );
    // A peer of default settings speaks TLS 1.3 with a tls13-only agent.
    let current = GrpcTransport::default().with_tls(pki.agent_tls(Role::Server));
    let answered = call(&current, server.rpc, peers_request()).await.unwrap();
    assert!(
        matches!(answered.body, Some(ResponseBody::StatusPeers(_))),
        "{answered:?}"
    );
    // A raw TLS 1.2-only client is refused at the handshake.
    let mut tls12 = rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS12])
        .with_root_certificates({
            let mut roots = rustls::RootCertStore::empty();
            let pem = std::fs::read(pki.path("ca.pem")).unwrap();
            for cert in rustls_pemfile_certs(&pem) {
                roots.add(cert).unwrap();
            }
            roots
        })
        .with_no_client_auth();
    tls12.alpn_protocols = vec![b"h2".to_vec()];
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", server.rpc)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("server.global.nomad").unwrap();
    let refused = tokio_rustls::TlsConnector::from(Arc::new(tls12))
        .connect(name, stream)
        .await;
    assert!(refused.is_err(), "a TLS 1.2 handshake with a tls13-only agent");
    server.handle.shutdown().await;
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_server_hostname_refuses_a_peer_whose_certificate_is_not_a_servers() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), "cluster");
    // An agent of the right CA serving RPC with a client's certificate.
    let impostor = support::start_server_with_tls(
        &dir.path().join("agent"),
        false,
        HttpLimits::default(),
        100,
        Some(pki.agent_tls(Role::Client)),
    )
    .await;
    let checking = GrpcTransport::default().with_tls(pki.agent_tls(Role::Server));
    let error = call(&checking, impostor.rpc, peers_request()).await.unwrap_err();
    assert!(matches!(error, TransportError::Unreachable { .. }), "{error}");

    let mut lax = pki.settings(Role::Server);
    lax.verify_server_hostname = false;
    let lax = GrpcTransport::default().with_tls(Arc::new(AgentTls::load(lax, "global").unwrap()));
    let answered = call(&lax, impostor.rpc, peers_request()).await.unwrap();
    assert!(
        matches!(answered.body, Some(ResponseBody::StatusPeers(_))),
        "{answered:?}"
    );
    impostor.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_the_api_and_a_reload_changes_certificates_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let first = Pki::create(dir.path(), "first");
    let second = Pki::create(dir.path(), "second");
    // The agent reads its files from a directory of its own, rewritten below.
    let live = Pki::create(dir.path(), "live");
    for file in ["ca.pem", "server.pem", "server-key.pem"] {
        std::fs::copy(first.path(file), live.path(file)).unwrap();
    }
    let tls = live.agent_tls(Role::Server);
    let server = support::start_server_with_tls(
        &dir.path().join("agent"),
        false,
        HttpLimits::default(),
        100,
        Some(tls.clone()),
    )
    .await;

    assert_eq!(
        https_get(server.http, &first.path("ca.pem"), "/v1/status/leader").await,
        Ok("HTTP/1.1 200 OK".to_string())
    );
    let unknown = https_get(server.http, &second.path("ca.pem"), "/v1/status/leader").await;
    assert!(
        unknown.as_ref().is_err_and(|e| e.contains("UnknownIssuer")),
        "{unknown:?}"
    );

    // Plain HTTP to the HTTPS port is told so.
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", server.http))
        .await
        .unwrap();
    plain
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request"), "{answer}");
    assert!(
        answer.ends_with("Client sent an HTTP request to an HTTPS server.\n"),
        "{answer}"
    );

    // A peer of the first CA holds a connection open across the reload.
    let peer = GrpcTransport::default().with_tls(first.agent_tls(Role::Server));
    call(&peer, server.rpc, peers_request()).await.unwrap();

    for file in ["ca.pem", "server.pem", "server-key.pem"] {
        std::fs::copy(second.path(file), live.path(file)).unwrap();
    }
    tls.reload().unwrap();
    assert_eq!(
        https_get(server.http, &second.path("ca.pem"), "/v1/status/leader").await,
        Ok("HTTP/1.1 200 OK".to_string())
    );
    let stale = https_get(server.http, &first.path("ca.pem"), "/v1/status/leader").await;
    assert!(stale.is_err(), "{stale:?}");
    // The open connection still carries calls; a new one with the old CA is refused.
    let kept = call(&peer, server.rpc, peers_request()).await.unwrap();
    assert!(matches!(kept.body, Some(ResponseBody::StatusPeers(_))), "{kept:?}");
    let fresh = GrpcTransport::default().with_tls(first.agent_tls(Role::Server));
    assert!(call(&fresh, server.rpc, peers_request()).await.is_err());

    // A broken file on reload keeps what is in use, and says which file.
    std::fs::write(live.path("server.pem"), "not a certificate").unwrap();
    let error = tls.reload().unwrap_err().to_string();
    assert!(error.contains("server.pem"), "{error}");
    assert_eq!(
        https_get(server.http, &second.path("ca.pem"), "/v1/status/leader").await,
        Ok("HTTP/1.1 200 OK".to_string())
    );
    server.handle.shutdown().await;
}
