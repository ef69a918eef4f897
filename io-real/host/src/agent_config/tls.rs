//! Nomad's `tls {}` agent block: mutual TLS between agents and HTTPS on the API.

use serde::Deserialize;

use crate::tls::agent::TlsSettings;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TlsBlock {
    pub http: Option<bool>,
    pub rpc: Option<bool>,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub verify_server_hostname: Option<bool>,
    pub verify_https_client: Option<bool>,
    pub rpc_upgrade_mode: Option<bool>,
    pub tls_min_version: Option<String>,
    pub tls_cipher_suites: Option<String>,
    pub tls_prefer_server_cipher_suites: Option<bool>,
}

/// Lays one file's `tls {}` over what earlier files set; notes what is read but not acted on.
pub fn apply(settings: &mut TlsSettings, notes: &mut Vec<String>, block: TlsBlock) -> anyhow::Result<()> {
    let flags = [
        (&mut settings.http, block.http),
        (&mut settings.rpc, block.rpc),
        (&mut settings.verify_server_hostname, block.verify_server_hostname),
        (&mut settings.verify_https_client, block.verify_https_client),
    ];
    for (field, value) in flags {
        if let Some(value) = value {
            *field = value;
        }
    }
    let files = [
        (&mut settings.ca_file, block.ca_file),
        (&mut settings.cert_file, block.cert_file),
        (&mut settings.key_file, block.key_file),
    ];
    for (field, value) in files {
        if let Some(value) = value {
            *field = value;
        }
    }
    if let Some(version) = block.tls_min_version {
        // rustls speaks TLS 1.2 and 1.3 only.
        match version.as_str() {
            "tls12" => settings.tls13_only = false,
            "tls13" => settings.tls13_only = true,
            "tls10" | "tls11" => notes.push(format!(
                "tls.tls_min_version = {version:?}: Drover never speaks below TLS 1.2"
            )),
            other => anyhow::bail!("tls.tls_min_version: {other:?} is not one of tls10, tls11, tls12, tls13"),
        }
    }
    if let Some(upgrade) = block.rpc_upgrade_mode {
        settings.rpc_upgrade_mode = upgrade;
    }
    if let Some(text) = block.tls_cipher_suites {
        settings.cipher_suites = crate::tls::agent::parse_cipher_suites(&text)?;
    }
    if block.tls_prefer_server_cipher_suites.is_some() {
        notes.push("tls.tls_prefer_server_cipher_suites: rustls servers always choose by their own order".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_blocks_override_and_bad_versions_are_refused() {
        let mut settings = TlsSettings::default();
        let mut notes = Vec::new();
        let (first, _) = crate::agent_config::parse_text(
            r#"tls {
                 http = true
                 rpc = true
                 ca_file = "ca.pem"
                 cert_file = "a.pem"
                 key_file = "a-key.pem"
                 verify_server_hostname = true
               }"#,
        )
        .unwrap();
        apply(&mut settings, &mut notes, first.tls.unwrap()).unwrap();
        let (second, _) = crate::agent_config::parse_text(r#"tls { cert_file = "b.pem" }"#).unwrap();
        apply(&mut settings, &mut notes, second.tls.unwrap()).unwrap();
        assert!(settings.http && settings.rpc && settings.verify_server_hostname);
        assert_eq!(settings.cert_file, "b.pem");
        assert_eq!(settings.ca_file, "ca.pem");

        let (modern, _) = crate::agent_config::parse_text(
            r#"tls {
                 tls_min_version = "tls13"
                 rpc_upgrade_mode = true
                 tls_cipher_suites = "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
               }"#,
        )
        .unwrap();
        apply(&mut settings, &mut notes, modern.tls.unwrap()).unwrap();
        assert!(settings.tls13_only && settings.rpc_upgrade_mode);
        assert_eq!(
            settings.cipher_suites,
            [
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
            ]
        );
        for (suites, why) in [
            ("TLS_RSA_WITH_AES_128_CBC_SHA", "is not offered by Drover"),
            ("TLS_NOPE", "unsupported TLS cipher suite \"TLS_NOPE\""),
        ] {
            let (bad, _) =
                crate::agent_config::parse_text(&format!("tls {{ tls_cipher_suites = \"{suites}\" }}")).unwrap();
            let error = apply(&mut settings, &mut notes, bad.tls.unwrap()).unwrap_err();
            assert!(error.to_string().contains(why), "{error}");
        }

        let (bad, _) = crate::agent_config::parse_text(r#"tls { tls_min_version = "ssl3" }"#).unwrap();
        let error = apply(&mut settings, &mut notes, bad.tls.unwrap()).unwrap_err();
        assert!(error.to_string().contains("tls_min_version"), "{error}");
    }
}
