//! `kill -HUP` re-reads an agent's TLS files, for real: an agent serving HTTPS and mutual-TLS
//! RPC with one CA's certificate is given another CA's files and a SIGHUP, then serves the new
//! certificate without restarting; a broken file on the next SIGHUP keeps the certificate in
//! use, and the agent says which file.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use drover_host::tls::issue::Role;
use support::{Agent, cluster_specs, server_args, tls, wait_for};

/// `GET path` over HTTPS trusting only `ca`: the status, or why the request failed.
fn https_status(port: u16, ca: &Path, path: &str) -> Result<u16, String> {
    let ca = ca.display().to_string();
    let settings = drover_host::tls::ClientTls {
        ca_file: &ca,
        cert_file: "",
        key_file: "",
        verify: true,
    };
    let config = drover_host::tls::client_config(&settings).map_err(|error| error.to_string())?;
    let agent = ureq::AgentBuilder::new()
        .tls_config(Arc::new(config))
        .timeout(Duration::from_secs(5))
        .build();
    match agent.get(&format!("https://127.0.0.1:{port}{path}")).call() {
        Ok(response) => Ok(response.status()),
        Err(ureq::Error::Status(code, _)) => Ok(code),
        Err(error) => Err(error.to_string()),
    }
}

#[test]
fn sighup_reloads_the_certificates_and_a_broken_file_keeps_the_old_ones() {
    let root = tempfile::tempdir().unwrap();
    let first = tls::pki(&root.path().join("first"), "first CA");
    let second = tls::pki(&root.path().join("second"), "second CA");
    let live = root.path().join("live");
    std::fs::create_dir_all(&live).unwrap();
    let install = |from: &Path| {
        for file in ["ca.pem", "server.pem", "server-key.pem"] {
            std::fs::copy(from.join(file), live.join(file)).unwrap();
        }
    };
    install(&first);
    let specs = cluster_specs(root.path(), 1);
    std::fs::create_dir_all(&specs[0].data_dir).unwrap();
    let config = specs[0].data_dir.join("tls.hcl");
    let mut settings = tls::settings(&live, Role::Server);
    settings.http = true;
    std::fs::write(&config, tls::block(&settings)).unwrap();
    let mut args = server_args(&specs, 0);
    args.push(format!("-config={}", config.display()));
    let mut agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        (https_status(port, &first.join("ca.pem"), "/v1/status/leader") == Ok(200)).then_some(())
    })
    .unwrap_or_else(|| panic!("the agent serves HTTPS:\n{}", agent.log()));
    let refused = https_status(port, &second.join("ca.pem"), "/v1/status/leader");
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("invalid peer certificate")),
        "{refused:?}"
    );

    install(&second);
    agent.signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), || {
        (https_status(port, &second.join("ca.pem"), "/v1/status/leader") == Ok(200)).then_some(())
    })
    .unwrap_or_else(|| panic!("the new certificate is served after SIGHUP:\n{}", agent.log()));
    assert!(https_status(port, &first.join("ca.pem"), "/v1/status/leader").is_err());
    assert!(agent.log().contains("reloaded the TLS certificates"), "{}", agent.log());

    std::fs::write(live.join("server.pem"), "not a certificate").unwrap();
    agent.signal(libc::SIGHUP);
    let said = wait_for(Duration::from_secs(10), || {
        agent
            .log()
            .contains("reloading the TLS certificates failed; keeping those in use")
            .then_some(())
    });
    assert!(said.is_some(), "{}", agent.log());
    assert!(agent.log().contains("server.pem"), "{}", agent.log());
    assert_eq!(https_status(port, &second.join("ca.pem"), "/v1/status/leader"), Ok(200));
    assert!(agent.is_running(), "SIGHUP does not stop the agent");
}
