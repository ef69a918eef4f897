//! The agent's own TLS (Nomad's `tls {}` block): mutual TLS between agents on the RPC port and
//! HTTPS on the API, from one CA, one certificate and one key, all re-read on SIGHUP.
//!
//! Every configuration built here reads the current certificate, key and CA through
//! [`AgentTls`]'s shared [`Material`], so a reload reaches new handshakes at once while
//! connections already open keep theirs: the cluster is not dropped to change a certificate.
//!
//! Roles are Nomad's: servers hold a certificate for `server.<region>.nomad`, clients one for
//! `client.<region>.nomad`. With `verify_server_hostname` an agent dialing a server checks that
//! name, and a server tells its callers apart by it ([`Identity`]); without it any certificate
//! of the CA will do, as in Nomad.

use std::sync::{Arc, RwLock};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};

use super::{TlsError, certificates, private_key, provider};
use drover_io_real::io::Identity;

/// Nomad's `tls {}` block, as read from the agent config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// HTTPS on the HTTP API.
    pub http: bool,
    /// Mutual TLS on agent RPC.
    pub rpc: bool,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    /// Dialing a server checks it presents `server.<region>.nomad`, and servers accept
    /// server-only calls only from such certificates.
    pub verify_server_hostname: bool,
    /// HTTPS clients must present a certificate of the CA.
    pub verify_https_client: bool,
    /// `rpc_upgrade_mode`: the RPC port accepts plaintext connections too (while a cluster
    /// moves to TLS); this agent still dials TLS.
    pub rpc_upgrade_mode: bool,
    /// `tls_min_version = "tls13"`: TLS 1.2 is refused.
    pub tls13_only: bool,
    /// `tls_cipher_suites`: the TLS 1.2 suites offered, by Nomad's (Go's) names; empty: rustls's
    /// defaults. TLS 1.3's suites are not configurable, as in Go.
    pub cipher_suites: Vec<String>,
}

/// The TLS 1.2 suites rustls implements, by the names Nomad's `tls_cipher_suites` takes.
const SUITE_NAMES: &[(&str, rustls::CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Suites Nomad accepts that rustls does not implement (RSA key exchange, CBC): refused by
/// name rather than silently dropped, so an operator's list means what it says.
const SUITES_NOT_OFFERED: &[&str] = &[
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// Parses Nomad's `tls_cipher_suites` (comma-separated), each name checked.
pub fn parse_cipher_suites(text: &str) -> Result<Vec<String>, TlsError> {
    let mut names = Vec::new();
    for name in text.split(',').map(str::trim).filter(|name| !name.is_empty()) {
        if SUITES_NOT_OFFERED.contains(&name) {
            return Err(TlsError::Config(format!(
                "tls.tls_cipher_suites: {name} is not offered by Drover (rustls implements ECDHE with AES-GCM or ChaCha20-Poly1305 only)"
            )));
        }
        if !SUITE_NAMES.iter().any(|(known, _)| *known == name) {
            return Err(TlsError::Config(format!(
                "tls.tls_cipher_suites: unsupported TLS cipher suite {name:?}"
            )));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// The crypto provider for `settings`: rustls's ring provider, its TLS 1.2 suites cut to the
/// configured ones.
fn provider_for(settings: &TlsSettings) -> Arc<CryptoProvider> {
    let mut provider = (*provider()).clone();
    if !settings.cipher_suites.is_empty() {
        let wanted: Vec<rustls::CipherSuite> = settings
            .cipher_suites
            .iter()
            .filter_map(|name| {
                SUITE_NAMES
                    .iter()
                    .find(|(known, _)| known == name)
                    .map(|(_, suite)| *suite)
            })
            .collect();
        provider
            .cipher_suites
            .retain(|suite| suite.version() == &rustls::version::TLS13 || wanted.contains(&suite.suite()));
    }
    Arc::new(provider)
}

/// TLS 1.3 alone (`tls_min_version = "tls13"`).
static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

impl TlsSettings {
    fn versions(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        if self.tls13_only {
            TLS13_ONLY
        } else {
            rustls::DEFAULT_VERSIONS
        }
    }

    /// Whether anything is served over TLS.
    pub fn enabled(&self) -> bool {
        self.http || self.rpc
    }

    /// What is missing for the settings to be usable, if anything.
    pub fn check(&self) -> Result<(), TlsError> {
        if !self.enabled() {
            return Ok(());
        }
        for (key, value) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if value.is_empty() {
                return Err(TlsError::Config(format!(
                    "tls: {key} is required when http or rpc is enabled"
                )));
            }
        }
        Ok(())
    }
}

/// What one reload reads: the CA and this agent's certificate and key.
struct Material {
    key: Arc<CertifiedKey>,
    client_verifier: Arc<dyn ClientCertVerifier>,
    server_verifier: Arc<WebPkiServerVerifier>,
}

impl Material {
    fn read(settings: &TlsSettings, provider: &Arc<CryptoProvider>) -> Result<Material, TlsError> {
        // `check` made sure a CA file is named: never the host's roots here.
        let roots = Arc::new(super::roots(&settings.ca_file)?);
        let chain = certificates("cert_file", &settings.cert_file)?;
        let key = CertifiedKey::from_der(chain, private_key(&settings.key_file)?, provider)
            .map_err(|error| super::file_error("key_file", &settings.key_file, error))?;
        let client_verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|error| super::file_error("ca_file", &settings.ca_file, error))?;
        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|error| super::file_error("ca_file", &settings.ca_file, error))?;
        Ok(Material {
            key: Arc::new(key),
            client_verifier,
            server_verifier,
        })
    }
}

/// The agent's TLS: its settings, the material last read, and the configurations built on it.
pub struct AgentTls {
    settings: TlsSettings,
    region: String,
    shared: Arc<Shared>,
    rpc_server: Arc<ServerConfig>,
    http_server: Arc<ServerConfig>,
    rpc_client: Arc<ClientConfig>,
}

struct Shared {
    material: RwLock<Arc<Material>>,
    provider: Arc<CryptoProvider>,
    verify_server_hostname: bool,
}

impl Shared {
    fn current(&self) -> Arc<Material> {
        self.material.read().expect("tls material").clone()
    }
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls")
            .field("settings", &self.settings)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The name a server of `region` presents.
pub fn server_name(region: &str) -> String {
    format!("server.{region}.nomad")
}

/// The name a client of `region` presents.
pub fn client_name(region: &str) -> String {
    format!("client.{region}.nomad")
}

impl AgentTls {
    /// Reads the files the settings name; every problem names its file.
    pub fn load(settings: TlsSettings, region: &str) -> Result<AgentTls, TlsError> {
        settings.check()?;
        let provider = provider_for(&settings);
        let material = Material::read(&settings, &provider)?;
        let shared = Arc::new(Shared {
            material: RwLock::new(Arc::new(material)),
            provider: provider.clone(),
            verify_server_hostname: settings.verify_server_hostname,
        });
        let server_config = |client_auth: Arc<dyn ClientCertVerifier>, alpn: &[u8]| {
            let mut config = ServerConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(settings.versions())
                .map_err(|error| TlsError::Config(error.to_string()))?
                .with_client_cert_verifier(client_auth)
                .with_cert_resolver(Arc::new(Reloadable(shared.clone())));
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok::<_, TlsError>(Arc::new(config))
        };
        let rpc_server = server_config(Arc::new(Reloadable(shared.clone())), b"h2")?;
        let http_client_auth: Arc<dyn ClientCertVerifier> = if settings.verify_https_client {
            Arc::new(Reloadable(shared.clone()))
        } else {
            Arc::new(OptionalClientCert(Reloadable(shared.clone())))
        };
        let http_server = server_config(http_client_auth, b"http/1.1")?;
        let mut rpc_client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(settings.versions())
            .map_err(|error| TlsError::Config(error.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Reloadable(shared.clone())))
            .with_client_cert_resolver(Arc::new(Reloadable(shared.clone())));
        rpc_client.alpn_protocols = vec![b"h2".to_vec()];
        Ok(AgentTls {
            settings,
            region: region.to_string(),
            shared,
            rpc_server,
            http_server,
            rpc_client: Arc::new(rpc_client),
        })
    }

    /// Re-reads the CA, certificate and key; on an error the material in use is kept.
    pub fn reload(&self) -> Result<(), TlsError> {
        let material = Material::read(&self.settings, &self.shared.provider)?;
        *self.shared.material.write().expect("tls material") = Arc::new(material);
        Ok(())
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// The RPC listener's configuration: a client certificate of the CA is required.
    pub fn rpc_server_config(&self) -> Arc<ServerConfig> {
        self.rpc_server.clone()
    }

    /// The HTTPS listener's configuration (a client certificate required only with
    /// `verify_https_client`).
    pub fn http_server_config(&self) -> Arc<ServerConfig> {
        self.http_server.clone()
    }

    /// Dialing another agent's RPC port: this agent's certificate presented, the peer's
    /// checked against the CA (and named `server.<region>.nomad` with
    /// `verify_server_hostname`).
    pub fn rpc_client_config(&self) -> Arc<ClientConfig> {
        self.rpc_client.clone()
    }

    /// The name dialed: a server of this region.
    pub fn server_name(&self) -> ServerName<'static> {
        ServerName::try_from(server_name(&self.region)).expect("a region makes a valid DNS name")
    }

    /// Who presented `chain` (already verified against the CA by the handshake).
    pub fn identity(&self, chain: Option<&[CertificateDer<'_>]>) -> Identity {
        let Some(leaf) = chain.and_then(|chain| chain.first()) else {
            return Identity::Other;
        };
        if !self.settings.verify_server_hostname {
            return Identity::Cluster;
        }
        let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
            return Identity::Other;
        };
        let names = |name: String| {
            ServerName::try_from(name)
                .ok()
                .is_some_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
        };
        if names(server_name(&self.region)) {
            Identity::Server
        } else if names(client_name(&self.region)) {
            Identity::Client
        } else {
            Identity::Other
        }
    }
}

/// Resolves and verifies through whatever material was read last.
#[derive(Debug)]
struct Reloadable(Arc<Shared>);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl ResolvesServerCert for Reloadable {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().key.clone())
    }
}

impl rustls::client::ResolvesClientCert for Reloadable {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ServerCertVerifier for Reloadable {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.0.current().server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verified {
            // Without verify_server_hostname the CA's signature is all that is asked.
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }))
                if !self.0.verify_server_hostname =>
            {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.provider.signature_verification_algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for Reloadable {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: an agent has one certificate and sends it.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current()
            .client_verifier
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ServerCertVerifier::verify_tls12_signature(self, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ServerCertVerifier::verify_tls13_signature(self, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ServerCertVerifier::supported_verify_schemes(self)
    }
}

/// HTTPS without `verify_https_client`: a certificate is asked for and checked when sent, but
/// a client without one is served (the CLI and browsers usually have none).
#[derive(Debug)]
struct OptionalClientCert(Reloadable);

impl ClientCertVerifier for OptionalClientCert {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ServerCertVerifier::verify_tls12_signature(&self.0, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        ServerCertVerifier::verify_tls13_signature(&self.0, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ServerCertVerifier::supported_verify_schemes(&self.0)
    }
}
