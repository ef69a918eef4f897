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

mod support;

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
struct FakeConsul {
    /// Agent services by id, as `GET /v1/agent/services` shows them.
    services: Mutex<BTreeMap<String, Value>>,
    /// ACL tokens alive: accessor → (secret, description, service identity).
    tokens: Mutex<BTreeMap<String, (String, String, String)>>,
    created: Mutex<u32>,
    /// The `X-Consul-Token` of every ACL call.
    acl_callers: Mutex<Vec<String>>,
}

impl FakeConsul {
    fn answer(&self, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, String) {
        if path.starts_with("/v1/agent/self") {
            let agent = json!({
                "Config": {"Datacenter": "dc1", "NodeName": "fake", "Revision": "abc", "Server": false, "Version": "1.9.5"},
                "DebugConfig": {"ConnectEnabled": true, "GRPCPort": 8502},
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

fn serve(consul: &FakeConsul, stream: std::net::TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
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
    reader.read_exact(&mut body).unwrap();
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or("").to_string();
    let path = words.next().unwrap_or("").to_string();
    let (status, answer) = consul.answer(&method, &path, &headers, &body);
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

fn start_consul() -> (Arc<FakeConsul>, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let consul = Arc::new(FakeConsul::default());
    let shared = consul.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            serve(&shared, stream);
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
