//! A development CA and the certificates of Nomad's roles (`agent tls ca create`, `agent tls
//! cert create -server|-client|-cli`), made with rcgen: the same names and files as Nomad's
//! `nomad tls`, so a guide written for Nomad works.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::TlsError;

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[REDACTED]")
            .finish()
    }
}

/// Which of Nomad's roles a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
    Cli,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
            Role::Cli => "cli",
        }
    }
}

fn error(what: &str, error: impl std::fmt::Display) -> TlsError {
    TlsError::Config(format!("{what}: {error}"))
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // A minute of slack for clocks a little behind this one.
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A self-signed CA valid for `days` (Nomad's default: 5 years).
pub fn create_ca(common_name: &str, days: u32) -> Result<Issued, TlsError> {
    let key = KeyPair::generate().map_err(|e| error("generating the CA key", e))?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, "Drover");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    let cert = params.self_signed(&key).map_err(|e| error("signing the CA", e))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// What a role's certificate names.
#[derive(Clone, Debug)]
pub struct CertRequest<'a> {
    pub role: Role,
    pub region: &'a str,
    pub domain: &'a str,
    pub days: u32,
    pub extra_dns: &'a [String],
    pub extra_ips: &'a [IpAddr],
}

impl CertRequest<'_> {
    /// `server.global.nomad`: the name the role's certificate is for.
    pub fn name(&self) -> String {
        format!("{}.{}.{}", self.role.as_str(), self.region, self.domain)
    }

    /// Nomad's file name stem: `global-server-nomad`.
    pub fn file_stem(&self) -> String {
        format!("{}-{}-{}", self.region, self.role.as_str(), self.domain)
    }
}

/// A certificate for `request`, signed by the CA in `ca_cert_pem` / `ca_key_pem`.
pub fn create_cert(ca_cert_pem: &str, ca_key_pem: &str, request: &CertRequest<'_>) -> Result<Issued, TlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| error("reading the CA key", e))?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).map_err(|e| error("reading the CA certificate", e))?;
    let key = KeyPair::generate().map_err(|e| error("generating the key", e))?;
    let name = request.name();
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, name.clone());
    params.distinguished_name = subject;
    let mut dns = vec![name, "localhost".to_string()];
    dns.extend(request.extra_dns.iter().cloned());
    let mut ips: Vec<IpAddr> = Vec::new();
    if request.role != Role::Cli {
        ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    ips.extend(request.extra_ips.iter().copied());
    for name in dns {
        let name = name.try_into().map_err(|e| error("a DNS name", e))?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    params.subject_alt_names.extend(ips.into_iter().map(SanType::IpAddress));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = match request.role {
        Role::Cli => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Role::Server | Role::Client => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
    };
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, request.days);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| error("signing the certificate", e))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}
