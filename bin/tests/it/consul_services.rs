//! Task `service` blocks in Consul, for real: an agent (server + client) configured with a
//! Consul address runs a `raw_exec` job whose task has two services. While the task runs, the
//! local Consul agent holds both under Nomad's `_nomad-task-` ids; a tag edited in Consul is
//! left alone only where `enable_tag_override` is set; a stray `_nomad-task-` service is
//! removed and anything else is left alone; when the job stops, its services go. A
//! deployment's allocation with `health_check = "checks"` is healthy only once Consul says its
//! checks pass. The Consul is a small stateful HTTP server in this test.

use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Agent, cluster_specs, http, server_args, wait_for};

#[derive(Default)]
struct FakeConsul {
    /// Agent services by id, as `GET /v1/agent/services` shows them.
    services: Mutex<BTreeMap<String, Value>>,
    /// Registered checks by id, as `GET /v1/agent/checks` shows them.
    checks: Mutex<BTreeMap<String, Value>>,
    /// The status every check reports (Consul's initial one until the test changes it).
    check_status: Mutex<String>,
    /// How many times `GET /v1/agent/checks` was asked.
    check_reads: std::sync::atomic::AtomicU64,
}

fn serve(consul: &FakeConsul, stream: std::net::TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut content_length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some(value) = header.to_ascii_lowercase().strip_prefix("content-length:") {
            content_length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).unwrap();
    let path = request_line.split_whitespace().nth(1).unwrap_or("").to_string();
    let answer = if path.starts_with("/v1/agent/service/register") {
        let json: Value = serde_json::from_slice(&body).unwrap();
        let id = json["ID"].as_str().unwrap().to_string();
        let service = json!({
            "ID": id, "Service": json["Name"], "Tags": json["Tags"], "Meta": json["Meta"],
            "Port": json["Port"], "Address": json["Address"],
            "EnableTagOverride": json["EnableTagOverride"],
        });
        for check in json["Checks"].as_array().into_iter().flatten() {
            let check_id = check["CheckID"].as_str().unwrap().to_string();
            let check = json!({"CheckID": check_id, "Name": check["Name"], "ServiceID": id});
            consul.checks.lock().unwrap().insert(check_id, check);
        }
        consul.services.lock().unwrap().insert(id, service);
        String::new()
    } else if let Some(id) = path.strip_prefix("/v1/agent/service/deregister/") {
        consul.services.lock().unwrap().remove(id);
        consul
            .checks
            .lock()
            .unwrap()
            .retain(|_, check| check["ServiceID"] != id);
        String::new()
    } else if path.starts_with("/v1/agent/checks") {
        consul.check_reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let status = consul.check_status.lock().unwrap().clone();
        let mut checks = consul.checks.lock().unwrap().clone();
        for check in checks.values_mut() {
            check["Status"] = json!(status);
        }
        serde_json::to_string(&checks).unwrap()
    } else if path.starts_with("/v1/agent/services") {
        serde_json::to_string(&*consul.services.lock().unwrap()).unwrap()
    } else if path.starts_with("/v1/catalog/datacenters") {
        "[\"dc1\"]".to_string()
    } else {
        "[]".to_string()
    };
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

fn start_consul() -> (Arc<FakeConsul>, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let consul = Arc::new(FakeConsul {
        check_status: Mutex::new("critical".into()),
        ..FakeConsul::default()
    });
    let shared = consul.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            serve(&shared, stream);
        }
    });
    (consul, port)
}

fn job() -> String {
    json!({"Job": {
        "ID": "web",
        "TaskGroups": [{
            "Name": "g",
            "Networks": [{"DynamicPorts": [{"Label": "admin"}]}],
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": ["300"]},
                "KillTimeout": 1_000_000_000u64,
                "Services": [
                    {"Name": "web-api", "PortLabel": "8080", "AddressMode": "driver", "Tags": ["v1"],
                     "Meta": {"team": "storage"}},
                    {"Name": "web-admin", "PortLabel": "admin", "Tags": ["admin"], "EnableTagOverride": true},
                ],
            }],
        }],
    }})
    .to_string()
}

/// A fake Consul, and an agent (server + client) using it under `root`, once its client has
/// registered with `raw_exec` healthy; the agent's HTTP port.
fn start_agent_with_consul(root: &std::path::Path) -> (Arc<FakeConsul>, Agent, u16) {
    let (consul, consul_port) = start_consul();
    let specs = cluster_specs(root, 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    args.push(format!("-consul-address=127.0.0.1:{consul_port}"));
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes: Value = serde_json::from_str(&http("GET", port, "/v1/nodes", None)?).ok()?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));
    (consul, agent, port)
}

fn ids(consul: &FakeConsul) -> Vec<String> {
    consul.services.lock().unwrap().keys().cloned().collect()
}

#[test]
fn running_tasks_services_are_kept_in_the_consul_agent() {
    let root = tempfile::tempdir().unwrap();
    let (consul, agent, port) = start_agent_with_consul(root.path());
    // Somebody else's service, and a leftover of ours from an allocation long gone.
    consul.services.lock().unwrap().insert(
        "redis-1".into(),
        json!({"ID": "redis-1", "Service": "redis", "Tags": [], "Port": 6379}),
    );
    consul.services.lock().unwrap().insert(
        "_nomad-task-gone-t-web-api-8080".into(),
        json!({"ID": "_nomad-task-gone-t-web-api-8080", "Service": "web-api", "Port": 8080}),
    );

    http("PUT", port, "/v1/jobs", Some(&job())).expect("registered");
    let (api_id, admin_id) = wait_for(Duration::from_secs(30), || {
        let ids = ids(&consul);
        let api = ids
            .iter()
            .find(|id| id.starts_with("_nomad-task-") && id.ends_with("-t-web-api-8080") && !id.contains("gone"))?;
        let admin = ids.iter().find(|id| id.ends_with("-t-web-admin-admin"))?;
        (!ids.iter().any(|id| id.contains("gone"))).then(|| (api.clone(), admin.clone()))
    })
    .unwrap_or_else(|| {
        panic!(
            "both services registered, the stray removed: {:?}\n{}",
            ids(&consul),
            agent.log()
        )
    });
    {
        let services = consul.services.lock().unwrap();
        let api = &services[&api_id];
        assert_eq!(api["Service"], "web-api");
        assert_eq!(api["Port"], 8080);
        assert_eq!(api["Tags"], json!(["v1"]));
        assert_eq!(api["Meta"]["team"], "storage");
        assert_eq!(api["Address"], "127.0.0.1");
        assert_eq!(services[&admin_id]["EnableTagOverride"], true);
        // A port label registers the port the allocation was given, on the node's address.
        let allocs: Value = serde_json::from_str(&http("GET", port, "/v1/job/web/allocations", None).unwrap()).unwrap();
        let alloc_id = allocs[0]["ID"].as_str().unwrap();
        let alloc: Value =
            serde_json::from_str(&http("GET", port, &format!("/v1/allocation/{alloc_id}"), None).unwrap()).unwrap();
        let given = &alloc["AllocatedResources"]["Shared"]["Ports"][0];
        assert_eq!(given["Label"], "admin", "{alloc}");
        assert!((20000..=32000).contains(&given["Value"].as_u64().unwrap()), "{given}");
        assert_eq!(services[&admin_id]["Port"], given["Value"]);
        assert_eq!(services[&admin_id]["Address"], given["HostIP"]);
        assert!(
            services.contains_key("redis-1"),
            "somebody else's service is left alone"
        );
    }

    // Tags edited in Consul: the next pass (woken here by a second job's task starting, rather
    // than waiting 30 s for anti-entropy) puts them back where Nomad owns the tags and keeps
    // them where enable_tag_override is set.
    for id in [&api_id, &admin_id] {
        consul.services.lock().unwrap().get_mut(id).unwrap()["Tags"] = json!(["edited"]);
    }
    let mut other = serde_json::from_str::<Value>(&job()).unwrap();
    other["Job"]["ID"] = json!("other");
    other["Job"]["TaskGroups"][0]["Tasks"][0]["Services"] = json!([{"Name": "other"}]);
    http("PUT", port, "/v1/jobs", Some(&other.to_string())).expect("registered");
    wait_for(Duration::from_secs(30), || {
        let services = consul.services.lock().unwrap();
        (services.values().any(|service| service["Service"] == "other") && services[&api_id]["Tags"] == json!(["v1"]))
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the edited tags are put back: {:?}\n{}",
            consul.services.lock().unwrap(),
            agent.log()
        )
    });
    assert_eq!(consul.services.lock().unwrap()[&admin_id]["Tags"], json!(["edited"]));

    // Stopping the job removes its services and nothing else.
    http("DELETE", port, "/v1/job/web", None).expect("stopped");
    wait_for(Duration::from_secs(30), || {
        let ids = ids(&consul);
        (!ids.contains(&api_id) && !ids.contains(&admin_id)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the stopped job's services are gone: {:?}\n{}",
            ids(&consul),
            agent.log()
        )
    });
    let left = ids(&consul);
    assert!(left.contains(&"redis-1".to_string()), "{left:?}");
    assert!(left.iter().any(|id| id.ends_with("-t-other-")), "{left:?}");
}

/// A deployment's allocation health waits on Consul's checks (`health_check = "checks"`):
/// while the check is critical the running allocation stays undecided well past
/// `min_healthy_time`; once it passes, the allocation is healthy and the deployment succeeds.
#[test]
fn deployment_health_waits_for_consul_checks_to_pass() {
    let root = tempfile::tempdir().unwrap();
    let (consul, agent, port) = start_agent_with_consul(root.path());
    let job = json!({"Job": {
        "ID": "checked",
        "Update": {"HealthCheck": "checks", "MinHealthyTime": 1_000_000_000u64,
                   "HealthyDeadline": 120_000_000_000u64, "MaxParallel": 1},
        "TaskGroups": [{
            "Name": "g",
            "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": ["300"]},
                "KillTimeout": 1_000_000_000u64,
                "Services": [{"Name": "checked-web", "PortLabel": "http", "Checks": [
                    {"Name": "alive", "Type": "tcp", "Interval": 1_000_000_000u64, "Timeout": 1_000_000_000u64},
                ]}],
            }],
        }],
    }});
    http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered");
    let deployment = |port: u16| -> Option<Value> {
        serde_json::from_str(&http("GET", port, "/v1/job/checked/deployment", None)?).ok()
    };
    wait_for(Duration::from_secs(30), || {
        (!consul.checks.lock().unwrap().is_empty()).then_some(())
    })
    .unwrap_or_else(|| panic!("the service's check is registered:\n{}", agent.log()));
    // Six reads at 500 ms apart: the task has run for well over min_healthy_time, with the
    // check critical at every read.
    let reads = consul.check_reads.load(std::sync::atomic::Ordering::SeqCst);
    wait_for(Duration::from_secs(30), || {
        (consul.check_reads.load(std::sync::atomic::Ordering::SeqCst) >= reads + 6).then_some(())
    })
    .unwrap_or_else(|| panic!("the client reads the checks while health waits:\n{}", agent.log()));
    let waiting = deployment(port).expect("a deployment");
    let group = &waiting["TaskGroups"]["g"];
    assert_eq!(
        (&waiting["Status"], &group["HealthyAllocs"], &group["UnhealthyAllocs"]),
        (&json!("running"), &json!(0), &json!(0)),
        "undecided while the check is critical: {waiting}"
    );

    *consul.check_status.lock().unwrap() = "passing".into();
    let done = wait_for(Duration::from_secs(30), || {
        let deployment = deployment(port)?;
        (deployment["Status"] == "successful").then_some(deployment)
    })
    .unwrap_or_else(|| panic!("healthy once the check passes: {:?}\n{}", deployment(port), agent.log()));
    assert_eq!(done["TaskGroups"]["g"]["HealthyAllocs"], 1, "{done}");
    let allocs: Value = serde_json::from_str(&http("GET", port, "/v1/job/checked/allocations", None).unwrap()).unwrap();
    assert_eq!(allocs[0]["DeploymentStatus"]["Healthy"], true, "{allocs}");
}
