//! A test CA with a certificate per role, written as files, and the `tls {}` settings that
//! present one of them (mutual TLS on RPC, `verify_server_hostname`).

use std::path::{Path, PathBuf};

use drover_host::tls::agent::TlsSettings;
use drover_host::tls::issue::{self, CertRequest, Role};

/// A CA called `name` under `dir`, and a server and a client certificate it signed:
/// `ca.pem`, `<role>.pem`, `<role>-key.pem`. Returns `dir`.
pub fn pki(dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let ca = issue::create_ca(name, 2).unwrap();
    std::fs::write(dir.join("ca.pem"), &ca.cert_pem).unwrap();
    for role in [Role::Server, Role::Client] {
        let request = CertRequest {
            role,
            region: "global",
            domain: "nomad",
            days: 2,
            extra_dns: &[],
            extra_ips: &[],
        };
        let issued = issue::create_cert(&ca.cert_pem, &ca.key_pem, &request).unwrap();
        std::fs::write(dir.join(format!("{}.pem", role.as_str())), issued.cert_pem).unwrap();
        std::fs::write(dir.join(format!("{}-key.pem", role.as_str())), issued.key_pem).unwrap();
    }
    dir.to_path_buf()
}

/// Mutual TLS on RPC (not HTTP) with `role`'s certificate from `pki`, checking server names.
pub fn settings(pki: &Path, role: Role) -> TlsSettings {
    let file = |name: String| pki.join(name).display().to_string();
    TlsSettings {
        http: false,
        rpc: true,
        ca_file: file("ca.pem".into()),
        cert_file: file(format!("{}.pem", role.as_str())),
        key_file: file(format!("{}-key.pem", role.as_str())),
        verify_server_hostname: true,
        verify_https_client: false,
        ..TlsSettings::default()
    }
}

/// `settings` as an agent config's `tls {}` block.
pub fn block(settings: &TlsSettings) -> String {
    format!(
        "tls {{\n  http = {}\n  rpc = {}\n  ca_file = \"{}\"\n  cert_file = \"{}\"\n  key_file = \"{}\"\n  verify_server_hostname = {}\n}}\n",
        settings.http,
        settings.rpc,
        settings.ca_file,
        settings.cert_file,
        settings.key_file,
        settings.verify_server_hostname
    )
}
