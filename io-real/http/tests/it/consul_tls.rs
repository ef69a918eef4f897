//! The production Consul client against a Consul that speaks HTTPS and checks client
//! certificates (`verify_incoming`), with basic auth: certificates are made for each run (a
//! CA, Consul's server certificate for 127.0.0.1, the agent's client certificate, and a CA
//! nobody uses), and a rustls server plays Consul.
//!
//! What must hold: with `ssl`, the CA, the client certificate and `auth`, the fingerprint and
//! ACL calls go through and carry the basic auth; without a client certificate, or trusting
//! another CA, every call fails (naming the certificate problem) rather than falling back;
//! `verify_ssl = false` takes Consul's certificate without a CA; a missing or empty file is
//! refused at setup, naming the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::connect::ConsulTransport;
use drover_core::rpc::{ConsulAclCall, ConsulAclReply};
use drover_host::consul::ConsulHttp;
use drover_io_real::io::Consul;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;

/// The files of one run's PKI.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn write_pair(dir: &Path, name: &str, cert: &rcgen::Certificate, key: &KeyPair) -> (PathBuf, PathBuf) {
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let issuer = ca("Consul Agent CA");
    let ca_path = dir.path().join("consul-agent-ca.pem");
    std::fs::write(&ca_path, issuer.pem()).unwrap();
    let other = ca("Somebody Else's CA");
    let other_path = dir.path().join("other-ca.pem");
    std::fs::write(&other_path, other.pem()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client_cert = CertificateParams::new(vec!["client.dc1.consul".to_string()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    Pki {
        server: write_pair(dir.path(), "dc1-server-consul-0", &server_cert, &server_key),
        client: write_pair(dir.path(), "dc1-client-consul-0", &client_cert, &client_key),
        ca: ca_path,
        other_ca: other_path,
        _dir: dir,
    }
}

/// What the fake Consul saw: the path and `Authorization` header of each request.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A Consul on HTTPS with Consul's server certificate; with `verify_incoming` it refuses
/// clients without a certificate from the CA.
async fn serve(pki: &Pki, verify_incoming: bool) -> (SocketAddr, Seen) {
    let provider = drover_host::tls::provider();
    let chain = drover_host::tls::certificates("cert", pki.server.0.to_str().unwrap()).unwrap();
    let key = drover_host::tls::private_key(pki.server.1.to_str().unwrap()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if verify_incoming {
        let mut roots = rustls::RootCertStore::empty();
        for cert in drover_host::tls::certificates("ca", pki.ca.to_str().unwrap()).unwrap() {
            roots.add(cert).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder.with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let shared = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, seen) = (acceptor.clone(), shared.clone());
            tokio::spawn(async move {
                // A refused handshake just ends this connection.
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(request, &seen).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

async fn answer(request: hyper::Request<hyper::body::Incoming>, seen: &Seen) -> hyper::Response<Full<Bytes>> {
    let path = request.uri().path().to_string();
    let auth = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|value| value.to_str().unwrap().to_string());
    seen.lock().unwrap().push((path.clone(), auth));
    let _ = request.into_body().collect().await;
    let body = match path.as_str() {
        "/v1/agent/self" => json!({
            "Config": {"Datacenter": "dc1", "NodeName": "tls-host", "Revision": "abc", "Server": false, "Version": "1.9.5"},
            "DebugConfig": {"ConnectEnabled": true, "GRPCPort": 8503},
        }),
        "/v1/acl/token" => json!({"AccessorID": "acc-1", "SecretID": "secret-1"}),
        _ => json!([]),
    };
    hyper::Response::new(Full::new(Bytes::from(body.to_string())))
}

fn transport(pki: &Pki) -> ConsulTransport {
    ConsulTransport {
        auth: Some("nomad:s3cret".into()),
        ssl: true,
        verify_ssl: true,
        ca_file: pki.ca.display().to_string(),
        cert_file: pki.client.0.display().to_string(),
        key_file: pki.client.1.display().to_string(),
    }
}

fn create() -> ConsulAclCall {
    ConsulAclCall::CreateToken {
        description: "_nomad_si [c1] [a1] [connect-proxy-web]".into(),
        service_name: "web".into(),
    }
}

#[tokio::test]
async fn calls_go_through_mutual_tls_with_basic_auth() {
    let pki = pki();
    let (addr, seen) = serve(&pki, true).await;
    let consul = ConsulHttp::with_transport(&addr.to_string(), Duration::from_secs(5), &transport(&pki)).unwrap();
    let attributes = consul.fingerprint().await.unwrap();
    assert_eq!(attributes["consul.version"], "1.9.5");
    assert_eq!(attributes["consul.grpc"], "8503");
    let created = consul.acl_call(create()).await.unwrap();
    assert_eq!(
        created,
        ConsulAclReply::Created {
            accessor_id: "acc-1".into(),
            secret_id: "secret-1".into()
        }
    );
    // base64("nomad:s3cret")
    let basic = Some("Basic bm9tYWQ6czNjcmV0".to_string());
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("/v1/agent/self".to_string(), basic.clone()),
            ("/v1/acl/token".to_string(), basic)
        ]
    );
}

#[tokio::test]
async fn an_https_address_is_enough_to_speak_tls() {
    let pki = pki();
    let (addr, _) = serve(&pki, false).await;
    let transport = ConsulTransport {
        ca_file: pki.ca.display().to_string(),
        ..ConsulTransport::default()
    };
    let consul = ConsulHttp::with_transport(&format!("https://{addr}"), Duration::from_secs(5), &transport).unwrap();
    assert_eq!(consul.fingerprint().await.unwrap()["consul.version"], "1.9.5");
    // Without TLS the same Consul is not understood.
    let plain = ConsulHttp::new(&addr.to_string(), Duration::from_secs(2));
    assert!(plain.fingerprint().await.is_err());
}

#[tokio::test]
async fn without_a_client_certificate_or_with_another_ca_nothing_goes_through() {
    let pki = pki();
    let (addr, seen) = serve(&pki, true).await;
    let no_cert = ConsulTransport {
        cert_file: String::new(),
        key_file: String::new(),
        ..transport(&pki)
    };
    let consul = ConsulHttp::with_transport(&addr.to_string(), Duration::from_secs(5), &no_cert).unwrap();
    let refused = consul.acl_call(create()).await.unwrap_err();
    assert!(refused.retryable, "{refused:?}");
    let other_ca = ConsulTransport {
        ca_file: pki.other_ca.display().to_string(),
        ..transport(&pki)
    };
    let consul = ConsulHttp::with_transport(&addr.to_string(), Duration::from_secs(5), &other_ca).unwrap();
    let untrusted = consul.fingerprint().await.unwrap_err();
    assert!(untrusted.to_lowercase().contains("certificate"), "{untrusted}");
    assert!(seen.lock().unwrap().is_empty(), "no request reached Consul");
}

#[tokio::test]
async fn verify_ssl_false_takes_consuls_certificate_without_a_ca() {
    let pki = pki();
    let (addr, seen) = serve(&pki, true).await;
    let unverified = ConsulTransport {
        ca_file: String::new(),
        verify_ssl: false,
        ..transport(&pki)
    };
    let consul = ConsulHttp::with_transport(&addr.to_string(), Duration::from_secs(5), &unverified).unwrap();
    assert_eq!(consul.fingerprint().await.unwrap()["unique.consul.name"], "tls-host");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
fn files_that_cannot_be_used_are_named_at_setup() {
    let pki = pki();
    let missing = ConsulTransport {
        ca_file: "/nonexistent/ca.pem".into(),
        ..transport(&pki)
    };
    let error = ConsulHttp::with_transport("127.0.0.1:8501", Duration::from_secs(1), &missing)
        .err()
        .unwrap()
        .to_string();
    assert!(error.starts_with("ca_file /nonexistent/ca.pem:"), "{error}");
    let not_a_cert = ConsulTransport {
        // A key where the certificate should be.
        cert_file: pki.client.1.display().to_string(),
        ..transport(&pki)
    };
    let error = ConsulHttp::with_transport("127.0.0.1:8501", Duration::from_secs(1), &not_a_cert)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("cert_file") && error.contains("no PEM certificate"),
        "{error}"
    );
    // Without ssl the files are not read at all (as Consul's API client only reads them for
    // HTTPS), so a plain Consul keeps working with TLS settings meant for the CLI.
    let plain = ConsulTransport { ssl: false, ..missing };
    assert!(ConsulHttp::with_transport("127.0.0.1:8500", Duration::from_secs(1), &plain).is_ok());
}
