//! Consul Connect end to end, for real: an agent (server + client) with a Consul address and
//! ACL token runs a job whose group service has a `connect { sidecar_service {} }` block. The
//! Consul is a small stateful HTTP server in this test (agent self, services with the sidecar
//! Consul derives, ACL tokens); the `consul` CLI is a shell script that records its argv and
//! prints a bootstrap, failing its first run as a real one does before the sidecar is known.
//!
//! What must hold: the node carries `consul.version` (so the job's injected constraint
//! places it); the group service and its sidecar are registered under Nomad's ids; the
//! sidecar task gets a service identity token created through Consul's ACL API, in
//! `secrets/si_token` with mode 0440; the bootstrap ran with `-token <that secret>` and wrote
//! `secrets/envoy_bootstrap.json`; a kill -9 and restart of the agent derives nothing again;
//! stopping the job revokes the token in Consul and removes the services.

use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Agent, cluster_specs, http, server_args, wait_for};

#[derive(Default)]
pub(crate) struct FakeConsul {
    /// Agent services by id, as `GET /v1/agent/services` shows them.
    pub(crate) services: Mutex<BTreeMap<String, Value>>,
    /// ACL tokens alive: accessor → (secret, description, service identity).
    tokens: Mutex<BTreeMap<String, (String, String, String)>>,
    created: Mutex<u32>,
    /// The `X-Consul-Token` of every ACL call.
    acl_callers: Mutex<Vec<String>>,
    /// The `Authorization` header of every request ("" when there was none).
    authorizations: Mutex<Vec<String>>,
    /// Every service id deregistered, in order.
    pub(crate) deregistered: Mutex<Vec<String>>,
}

impl FakeConsul {
    fn answer(&self, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, String) {
        if path.starts_with("/v1/agent/self") {
            let agent = json!({
                "Config": {"Datacenter": "dc1", "NodeName": "fake", "Revision": "abc", "Server": false, "Version": "1.9.5"},
                "DebugConfig": {"ConnectEnabled": true, "GRPCPort": 8502},
                // Consul 1.9.5's own list, newest first.
                "xDS": {"SupportedProxies": {"envoy": ["1.16.2", "1.15.3", "1.14.6", "1.13.7"]}},
            });
            return (200, agent.to_string());
        }
        if path.starts_with("/v1/agent/service/register") {
            let json: Value = serde_json::from_slice(body).unwrap();
            let id = json["ID"].as_str().unwrap().to_string();
            let mut services = self.services.lock().unwrap();
            if let Some(sidecar) = json["Connect"]["SidecarService"].as_object() {
                let sidecar_id = format!("{id}-sidecar-proxy");
                let service = json!({"ID": sidecar_id, "Service": format!("{}-sidecar-proxy", json["Name"].as_str().unwrap()),
                                     "Port": sidecar["Port"], "Kind": "connect-proxy", "Proxy": sidecar["Proxy"]});
                services.insert(sidecar_id, service);
            }
            let service = json!({"ID": id, "Service": json["Name"], "Tags": json["Tags"], "Port": json["Port"],
                                 "Address": json["Address"], "Checks": json["Checks"], "Connect": json["Connect"]});
            services.insert(id, service);
            return (200, String::new());
        }
        if let Some(id) = path.strip_prefix("/v1/agent/service/deregister/") {
            self.deregistered.lock().unwrap().push(id.to_string());
            let mut services = self.services.lock().unwrap();
            services.remove(id);
            services.remove(&format!("{id}-sidecar-proxy"));
            return (200, String::new());
        }
        if path.starts_with("/v1/agent/services") {
            return (200, serde_json::to_string(&*self.services.lock().unwrap()).unwrap());
        }
        if path.starts_with("/v1/acl/token") {
            let caller = headers
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("x-consul-token:")
                        .map(|v| v.trim().to_string())
                })
                .unwrap_or_default();
            self.acl_callers.lock().unwrap().push(caller);
            if method == "PUT" {
                let json: Value = serde_json::from_slice(body).unwrap();
                let mut created = self.created.lock().unwrap();
                *created += 1;
                let (accessor, secret) = (format!("accessor-{created}"), format!("secret-{created}"));
                let service = json["ServiceIdentities"][0]["ServiceName"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let description = json["Description"].as_str().unwrap().to_string();
                self.tokens
                    .lock()
                    .unwrap()
                    .insert(accessor.clone(), (secret.clone(), description, service));
                return (200, json!({"AccessorID": accessor, "SecretID": secret}).to_string());
            }
            if method == "DELETE" {
                let accessor = path.trim_start_matches("/v1/acl/token/");
                return match self.tokens.lock().unwrap().remove(accessor) {
                    Some(_) => (200, "true".into()),
                    None => (403, "ACL not found".into()),
                };
            }
        }
        if path.starts_with("/v1/catalog/datacenters") {
            return (200, "[\"dc1\"]".into());
        }
        (200, "[]".into())
    }
}

/// One request on `stream` (plain TCP, or TLS), answered and closed.
fn serve<S: Read + Write>(consul: &FakeConsul, mut stream: S) {
    let (request_line, headers, body) = {
        let mut reader = BufReader::new(&mut stream);
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).is_err() {
            return;
        }
        let mut content_length = 0;
        let mut headers = String::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                break;
            }
            if let Some(value) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                content_length = value.trim().parse().unwrap();
            }
            headers.push_str(&header);
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        (request_line, headers, body)
    };
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or("").to_string();
    let path = words.next().unwrap_or("").to_string();
    let authorization = headers.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_string())
    });
    consul
        .authorizations
        .lock()
        .unwrap()
        .push(authorization.unwrap_or_default());
    let (status, answer) = consul.answer(&method, &path, &headers, &body);
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.flush();
}

pub(crate) fn start_consul() -> (Arc<FakeConsul>, u16) {
    start_consul_with(None)
}

/// A fake Consul; with `tls`, it speaks HTTPS (and checks what that config checks).
fn start_consul_with(tls: Option<Arc<rustls::ServerConfig>>) -> (Arc<FakeConsul>, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let consul = Arc::new(FakeConsul::default());
    let shared = consul.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            match &tls {
                None => serve(&shared, stream),
                Some(config) => {
                    let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                    let mut tls = rustls::StreamOwned::new(connection, stream);
                    serve(&shared, &mut tls);
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
            }
        }
    });
    (consul, port)
}

/// A `consul` CLI that appends its argv to `calls.log` and prints a bootstrap. Its first run
/// fails as Consul's does before the agent knows the sidecar; its second holds until the test
/// creates `release` (at most 30 s), so the agent can be killed in the middle of it; later
/// runs succeed.
fn fake_consul_cli(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("consul");
    let text = format!(
        r#"#!/bin/sh
echo "$@" >> {dir}/calls.log
n=$(wc -l < {dir}/calls.log)
if [ "$n" -eq 1 ]; then
  echo 'No sidecar proxy registered' >&2
  exit 1
fi
if [ "$n" -eq 2 ]; then
  i=0
  while [ ! -e {dir}/release ] && [ "$i" -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
  exit 1
fi
echo '{{"admin": {{}}, "bootstrapped": true}}'
"#,
        dir = dir.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn cli_calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn job() -> String {
    json!({"Job": {
        "ID": "countdash",
        "TaskGroups": [{
            "Name": "api",
            "Networks": [{"Mode": "host", "DynamicPorts": [{"Label": "http"}]}],
            "Services": [{
                // Nomad refuses network checks on Connect services (they are reached through
                // the proxy); a plain group service carries one.
                "Name": "count-metrics",
                "PortLabel": "http",
                "Checks": [{"Name": "alive", "Type": "tcp", "Interval": 10_000_000_000u64, "Timeout": 2_000_000_000u64}],
            }, {
                "Name": "count-api",
                "PortLabel": "http",
                "Connect": {
                    "SidecarService": {"Proxy": {"Upstreams": [{"DestinationName": "count-db", "LocalBindPort": 8080}]}},
                    "SidecarTask": {"Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["300"]},
                                    "KillTimeout": 1_000_000_000u64},
                },
            }],
            "Tasks": [{
                "Name": "web",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": ["300"]},
                "KillTimeout": 1_000_000_000u64,
            }],
        }],
    }})
    .to_string()
}

#[test]
fn a_connect_job_gets_its_sidecar_token_bootstrap_and_services_and_leaves_nothing_behind() {
    let (consul, consul_port) = start_consul();
    let root = tempfile::tempdir().unwrap();
    let cli_dir = root.path().join("cli");
    std::fs::create_dir_all(&cli_dir).unwrap();
    let cli = fake_consul_cli(&cli_dir);
    let specs = cluster_specs(root.path(), 1);
    std::fs::create_dir_all(&specs[0].data_dir).unwrap();
    let config = specs[0].data_dir.join("consul.hcl");
    std::fs::write(
        &config,
        format!(
            "consul {{\n  address = \"127.0.0.1:{consul_port}\"\n  token = \"agent-token\"\n  binary = \"{}\"\n}}\n",
            cli.display()
        ),
    )
    .unwrap();
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    args.push(format!("-config={}", config.display()));
    let mut agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes: Value = serde_json::from_str(&http("GET", port, "/v1/nodes", None)?).ok()?;
        let node_id = nodes[0]["ID"].as_str()?;
        let node: Value = serde_json::from_str(&http("GET", port, &format!("/v1/node/{node_id}"), None)?).ok()?;
        (node["Attributes"]["consul.version"] == "1.9.5" && nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers with Consul's attributes:\n{}", agent.log()));

    let (status, body) = support::http_status("PUT", port, "/v1/jobs", Some(&job())).unwrap();
    assert_eq!(status, 200, "{body}");
    let alloc_id = wait_for(Duration::from_secs(60), || {
        let allocs: Value = serde_json::from_str(&http("GET", port, "/v1/job/countdash/allocations", None)?).ok()?;
        // Placed: its sidecar is set up first (lifecycle prestart), the app waits for it.
        let alloc = allocs.as_array()?.first()?;
        Some(alloc["ID"].as_str()?.to_string())
    })
    .unwrap_or_else(|| {
        panic!(
            "the allocation is placed: {:?}\n{}",
            http("GET", port, "/v1/job/countdash/allocations", None),
            agent.log()
        )
    });

    // The sidecar's bootstrap: the first run fails, the second (2 s on) holds.
    let secrets = specs[0]
        .data_dir
        .join("alloc")
        .join(&alloc_id)
        .join("connect-proxy-count-api")
        .join("secrets");
    wait_for(Duration::from_secs(30), || {
        (cli_calls(&cli_dir).len() == 2).then_some(())
    })
    .unwrap_or_else(|| panic!("a second bootstrap run: {:?}\n{}", cli_calls(&cli_dir), agent.log()));

    // The token: created through Consul's ACL API by the server (with the agent's token), for
    // the proxied service, described as Nomad does, and written 0440 for the sidecar.
    let tokens = consul.tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    let (secret, description, service) = tokens.values().next().unwrap().clone();
    assert_eq!(service, "count-api");
    assert!(description.starts_with("_nomad_si ["), "{description}");
    assert!(
        description.ends_with(&format!("] [{alloc_id}] [connect-proxy-count-api]")),
        "{description}"
    );
    assert!(
        consul
            .acl_callers
            .lock()
            .unwrap()
            .iter()
            .all(|caller| caller == "agent-token")
    );
    let token_file = secrets.join("si_token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), secret);
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o440
    );

    // kill -9 in the middle of the bootstrap, and restart: the token is not derived again,
    // the bootstrap runs again with the token the file holds, and writes the file.
    agent.restart();
    std::fs::write(cli_dir.join("release"), "").unwrap();
    wait_for(Duration::from_secs(60), || {
        secrets.join("envoy_bootstrap.json").exists().then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "bootstrapped after the restart: {:?}\n{}",
            cli_calls(&cli_dir),
            agent.log()
        )
    });
    assert_eq!(*consul.created.lock().unwrap(), 1, "no second token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), secret);

    // Every run with the token as its own argument and the group service's id.
    let service_id = format!("_nomad-task-{alloc_id}-group-api-count-api-http");
    let calls = cli_calls(&cli_dir);
    assert_eq!(calls.len(), 3, "{calls:?}");
    for call in &calls {
        assert!(
            call.starts_with("connect envoy -grpc-addr 127.0.0.1:8502 -http-addr 127.0.0.1:"),
            "{call}"
        );
        assert!(
            call.contains(&format!(" -bootstrap -sidecar-for {service_id} -token {secret}")),
            "{call}"
        );
        assert!(call.contains(" -admin-bind 127.0.0.2:"), "{call}");
    }
    let bootstrap = std::fs::read_to_string(secrets.join("envoy_bootstrap.json")).unwrap();
    assert!(bootstrap.contains("\"bootstrapped\": true"), "{bootstrap}");

    // The agent's restart took none of the running allocation's services out of Consul: the
    // client syncs services only once it has restored its allocations (a pass before would
    // have found none of them wanted and deregistered them all).
    let deregistered = consul.deregistered.lock().unwrap().clone();
    assert!(
        !deregistered.iter().any(|id| id.contains(&alloc_id)),
        "services of the running allocation deregistered across the restart: {deregistered:?}"
    );

    // The services: the group service with its Connect block and the sidecar Consul derived,
    // on the proxy's own dynamic port; the other group service with its tcp check.
    {
        let services = consul.services.lock().unwrap();
        let parent = services
            .get(&service_id)
            .unwrap_or_else(|| panic!("{service_id} in {:?}", services.keys()));
        let metrics = &services[&format!("_nomad-task-{alloc_id}-group-api-count-metrics-http")];
        assert_eq!(metrics["Checks"][0]["Name"], "alive");
        assert_eq!(
            metrics["Checks"][0]["TCP"].as_str().unwrap(),
            format!("127.0.0.1:{}", metrics["Port"])
        );
        let upstream = &parent["Connect"]["SidecarService"]["Proxy"]["Upstreams"][0];
        assert_eq!(upstream["DestinationName"], "count-db");
        let sidecar = &services[&format!("{service_id}-sidecar-proxy")];
        assert_ne!(sidecar["Port"], parent["Port"]);
    }

    // Once bootstrapped, the sidecar starts, and only then the app (lifecycle prestart
    // sidecar): both log files appear, the sidecar's first, and the allocation runs.
    let logs = specs[0].data_dir.join("alloc").join(&alloc_id).join("alloc/logs");
    let (sidecar_log, app_log) = (logs.join("connect-proxy-count-api.stdout.0"), logs.join("web.stdout.0"));
    wait_for(Duration::from_secs(60), || {
        let alloc: Value =
            serde_json::from_str(&http("GET", port, &format!("/v1/allocation/{alloc_id}"), None)?).ok()?;
        (alloc["ClientStatus"] == "running" && sidecar_log.exists() && app_log.exists()).then_some(())
    })
    .unwrap_or_else(|| panic!("the sidecar, then the app, run:\n{}", agent.log()));
    let created = |path: &Path| std::fs::metadata(path).and_then(|meta| meta.modified()).unwrap();
    assert!(created(&sidecar_log) <= created(&app_log), "the sidecar started first");

    // Stopping the job revokes the token and removes both services.
    http("DELETE", port, "/v1/job/countdash", None).expect("stopped");
    wait_for(Duration::from_secs(60), || {
        let gone = consul.tokens.lock().unwrap().is_empty()
            && !consul
                .services
                .lock()
                .unwrap()
                .keys()
                .any(|id| id.starts_with("_nomad-task-"));
        gone.then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "token revoked, services gone: {:?} {:?}\n{}",
            consul.tokens.lock().unwrap(),
            consul.services.lock().unwrap().keys(),
            agent.log()
        )
    });
    // The secret went to Consul, the file and the CLI, never to the agent's log.
    assert!(
        !agent.log().contains(&secret),
        "the SI token is in the log:\n{}",
        agent.log()
    );
}

/// A CA, Consul's server certificate for 127.0.0.1 and the agent's client certificate, as
/// files in `dir`; and the server side of a Consul with `verify_incoming`.
struct ConsulPki {
    ca: std::path::PathBuf,
    client_cert: std::path::PathBuf,
    client_key: std::path::PathBuf,
    server: Arc<rustls::ServerConfig>,
}

fn consul_pki(dir: &Path) -> ConsulPki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "Consul Agent CA");
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client_cert = CertificateParams::new(vec!["client.dc1.consul".to_string()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    let pki = ConsulPki {
        ca: dir.join("consul-agent-ca.pem"),
        client_cert: dir.join("dc1-client-consul-0.pem"),
        client_key: dir.join("dc1-client-consul-0-key.pem"),
        server: {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from(issuer.der().to_vec())).unwrap();
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .unwrap();
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(vec![CertificateDer::from(server_cert.der().to_vec())], key)
                .unwrap();
            Arc::new(config)
        },
    };
    std::fs::write(&pki.ca, issuer.pem()).unwrap();
    std::fs::write(&pki.client_cert, client_cert.pem()).unwrap();
    std::fs::write(&pki.client_key, client_key.serialize_pem()).unwrap();
    pki
}

/// A `consul` CLI that records its argv and the Consul variables of its environment, and
/// prints a bootstrap.
fn recording_consul_cli(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("consul");
    let text = format!(
        r#"#!/bin/sh
echo "$@" >> {dir}/calls.log
echo "CONSUL_HTTP_SSL=$CONSUL_HTTP_SSL CONSUL_HTTP_SSL_VERIFY=$CONSUL_HTTP_SSL_VERIFY CONSUL_HTTP_AUTH=$CONSUL_HTTP_AUTH" >> {dir}/env.log
echo '{{"admin": {{}}, "bootstrapped": true}}'
"#,
        dir = dir.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// The same job against a Consul that speaks only mutual TLS and wants basic auth (`consul {
/// ssl ca_file cert_file key_file auth }`): the fingerprint, the service registrations and the
/// ACL calls go through TLS with the agent's certificate and the auth, and the bootstrap gets
/// the files as Nomad passes them (`-ca-file -client-cert -client-key`) with
/// `CONSUL_HTTP_SSL/SSL_VERIFY/AUTH` in its environment. The password never reaches the log.
#[test]
fn a_connect_job_works_against_a_consul_that_speaks_only_mutual_tls() {
    let root = tempfile::tempdir().unwrap();
    let pki = consul_pki(root.path());
    let (consul, consul_port) = start_consul_with(Some(pki.server.clone()));
    let cli_dir = root.path().join("cli");
    std::fs::create_dir_all(&cli_dir).unwrap();
    let cli = recording_consul_cli(&cli_dir);
    let specs = cluster_specs(root.path(), 1);
    std::fs::create_dir_all(&specs[0].data_dir).unwrap();
    let config = specs[0].data_dir.join("consul.hcl");
    std::fs::write(
        &config,
        format!(
            "consul {{\n  address = \"127.0.0.1:{consul_port}\"\n  token = \"agent-token\"\n  binary = \"{}\"\n  ssl = true\n  ca_file = \"{}\"\n  cert_file = \"{}\"\n  key_file = \"{}\"\n  auth = \"nomad:s3cret-pw\"\n}}\n",
            cli.display(),
            pki.ca.display(),
            pki.client_cert.display(),
            pki.client_key.display()
        ),
    )
    .unwrap();
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    args.push(format!("-config={}", config.display()));
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes: Value = serde_json::from_str(&http("GET", port, "/v1/nodes", None)?).ok()?;
        let node_id = nodes[0]["ID"].as_str()?;
        let node: Value = serde_json::from_str(&http("GET", port, &format!("/v1/node/{node_id}"), None)?).ok()?;
        (node["Attributes"]["consul.version"] == "1.9.5" && nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the client fingerprints Consul over TLS:\n{}", agent.log()));

    let (status, body) = support::http_status("PUT", port, "/v1/jobs", Some(&job())).unwrap();
    assert_eq!(status, 200, "{body}");
    let alloc_id = wait_for(Duration::from_secs(60), || {
        let allocs: Value = serde_json::from_str(&http("GET", port, "/v1/job/countdash/allocations", None)?).ok()?;
        let alloc = allocs.as_array()?.first()?;
        (alloc["ClientStatus"] == "running").then(|| alloc["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|| panic!("the allocation runs:\n{}", agent.log()));

    let (secret, _, _) = consul.tokens.lock().unwrap().values().next().cloned().expect("a token");
    let calls = cli_calls(&cli_dir);
    assert!(!calls.is_empty());
    for call in &calls {
        assert!(
            call.ends_with(&format!(
                " -token {secret} -ca-file {} -client-cert {} -client-key {}",
                pki.ca.display(),
                pki.client_cert.display(),
                pki.client_key.display()
            )),
            "{call}"
        );
    }
    let env = std::fs::read_to_string(cli_dir.join("env.log")).unwrap();
    for line in env.lines() {
        assert_eq!(
            line,
            "CONSUL_HTTP_SSL=true CONSUL_HTTP_SSL_VERIFY=true CONSUL_HTTP_AUTH=nomad:s3cret-pw"
        );
    }
    assert!(
        consul
            .services
            .lock()
            .unwrap()
            .contains_key(&format!("_nomad-task-{alloc_id}-group-api-count-api-http"))
    );

    http("DELETE", port, "/v1/job/countdash", None).expect("stopped");
    wait_for(Duration::from_secs(60), || {
        consul.tokens.lock().unwrap().is_empty().then_some(())
    })
    .unwrap_or_else(|| panic!("the token is revoked over TLS:\n{}", agent.log()));
    // Every request came through TLS with the agent's certificate (the server refuses
    // others) and carried the basic auth: base64("nomad:s3cret-pw").
    let authorizations = consul.authorizations.lock().unwrap().clone();
    assert!(authorizations.len() > 3, "{authorizations:?}");
    assert!(
        authorizations.iter().all(|auth| auth == "Basic bm9tYWQ6czNjcmV0LXB3"),
        "{authorizations:?}"
    );
    let log = agent.log();
    assert!(
        !log.contains("s3cret-pw") && !log.contains(&secret),
        "a secret is in the log:\n{log}"
    );
}
