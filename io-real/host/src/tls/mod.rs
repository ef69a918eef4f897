//! TLS with rustls and ring. This module: client configurations built from an operator's PEM
//! files, whom to trust (a CA file, else the host's roots, or nobody checked at all when
//! verification is off) and which certificate to present, for Consul's HTTPS API and the CLI.
//! [`agent`]: the agent's own `tls {}` (mutual TLS on RPC, HTTPS, reload). [`stream`]: a
//! connection that is plaintext or TLS. [`issue`]: a dev CA and role certificates.

pub mod agent;
pub mod issue;
pub mod stream;

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Why a TLS configuration could not be built; names the file and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {reason}")]
    File {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("{0}")]
    Config(String),
}

/// What a TLS client trusts and presents.
#[derive(Clone, Debug, Default)]
pub struct ClientTls<'a> {
    /// PEM CA certificates to trust; empty: the host's trusted roots.
    pub ca_file: &'a str,
    /// PEM certificate chain and key to present (both or neither).
    pub cert_file: &'a str,
    pub key_file: &'a str,
    /// `false`: accept any server certificate (Consul's `verify_ssl = false`).
    pub verify: bool,
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn file_error(what: &'static str, path: &str, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate in a PEM file; a file without one is an error.
pub fn certificates(what: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(Path::new(path))
        .map_err(|error| file_error(what, path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(what, path, error))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

pub fn private_key(path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(Path::new(path)).map_err(|error| file_error("key_file", path, error))
}

/// The CA file's certificates, or the host's trusted roots. A host without any leaves the
/// store empty (said once in the log): every handshake then fails naming the unknown issuer.
fn roots(ca_file: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    if ca_file.is_empty() {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            tracing::warn!(errors = ?found.errors, "no trusted root certificates on this host; name a ca_file");
        }
        return Ok(roots);
    }
    for cert in certificates("ca_file", ca_file)? {
        roots.add(cert).map_err(|error| file_error("ca_file", ca_file, error))?;
    }
    Ok(roots)
}

/// The client configuration for `tls`.
pub fn client_config(tls: &ClientTls<'_>) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Config(error.to_string()))?;
    let builder = if tls.verify {
        builder.with_root_certificates(roots(tls.ca_file)?)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
    };
    match (tls.cert_file.is_empty(), tls.key_file.is_empty()) {
        (true, true) => Ok(builder.with_no_client_auth()),
        (false, false) => {
            let chain = certificates("cert_file", tls.cert_file)?;
            let key = private_key(tls.key_file)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| file_error("cert_file", tls.cert_file, error))
        }
        _ => Err(TlsError::Config("cert_file and key_file go together".into())),
    }
}

/// `verify_ssl = false`: any certificate is taken, but the handshake's signatures are still
/// checked, so the peer holds the key of the certificate it sent.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
