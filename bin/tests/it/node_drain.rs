//! A node drain, for real: a server and two client-only agents; a service job on one client and
//! a system job on both. `agent node drain -enable` on the service job's node (the CLI follows
//! the drain to its end): the service allocation moves to the other client and runs there, the
//! system allocation on the drained node stops and is not placed again, the node stays
//! ineligible with `Node drain complete`. `agent node eligibility -enable` brings the system job
//! back to it.

use crate::support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{AGENT, Agent, client_spec, cluster_specs, http, http_status, server_args, wait_for};

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&http("GET", port, path, None)?).ok()
}

fn job(id: &str, kind: &str) -> Value {
    json!({"Job": {
        "ID": id,
        "Type": kind,
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": 1,
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": ["300"]},
                "KillTimeout": 1_000_000_000u64,
                "Resources": {"CPU": 50, "MemoryMB": 32},
            }],
        }],
    }})
}

fn cli(port: u16, args: &[&str]) -> std::process::Output {
    Command::new(AGENT)
        .args(args)
        .arg(format!("-address=http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs")
}

fn running_on(port: u16, job: &str) -> Vec<(String, String)> {
    get(port, &format!("/v1/job/{job}/allocations"))
        .and_then(|allocs| allocs.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|a| a["ClientStatus"] == "running" && a["DesiredStatus"] == "run")
        .map(|a| (a["ID"].as_str().unwrap().into(), a["NodeID"].as_str().unwrap().into()))
        .collect()
}

#[test]
fn a_drained_node_hands_its_allocations_over_and_stays_ineligible() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let server = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    let (c1_spec, c1_args) = client_spec(root.path(), "c1", specs[0].rpc);
    let (c2_spec, c2_args) = client_spec(root.path(), "c2", specs[0].rpc);
    let c1 = Agent::start(c1_spec, c1_args);
    let c2 = Agent::start(c2_spec, c2_args);
    let logs = || format!("{}\n{}\n{}", server.log(), c1.log(), c2.log());
    let nodes: Vec<String> = wait_for(Duration::from_secs(60), || {
        let nodes = get(port, "/v1/nodes")?;
        let ready: Vec<String> = nodes
            .as_array()?
            .iter()
            .filter(|n| n["Status"] == "ready" && n["Drivers"]["raw_exec"]["Healthy"] == true)
            .map(|n| n["ID"].as_str().unwrap().to_string())
            .collect();
        (ready.len() == 2).then_some(ready)
    })
    .unwrap_or_else(|| panic!("both clients register:\n{}", logs()));

    http("PUT", port, "/v1/jobs", Some(&job("web", "service").to_string())).expect("web registered");
    http("PUT", port, "/v1/jobs", Some(&job("agent", "system").to_string())).expect("agent registered");
    let (web_alloc, drained) = wait_for(Duration::from_secs(30), || {
        let web = running_on(port, "web");
        (web.len() == 1 && running_on(port, "agent").len() == 2).then(|| web[0].clone())
    })
    .unwrap_or_else(|| panic!("web and both agents run:\n{}", logs()));
    let other = nodes.iter().find(|id| **id != drained).unwrap().clone();
    let agent_on_drained = running_on(port, "agent")
        .into_iter()
        .find(|(_, node)| *node == drained)
        .unwrap()
        .0;

    // A bad request is refused with Nomad's words and changes nothing.
    let refused = cli(port, &["node", "drain", &drained[..8]]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Either the '-enable' or '-disable' flag must be set"));
    let unknown = http_status(
        "PUT",
        port,
        "/v1/node/no-such-node/drain",
        Some(r#"{"DrainSpec":{"Deadline":0}}"#),
    );
    assert_eq!(unknown, Some((404, "node not found".to_string())));
    let bad = http_status(
        "PUT",
        port,
        &format!("/v1/node/{drained}/eligibility"),
        Some(r#"{"Eligibility":"maybe"}"#),
    );
    assert_eq!(bad, Some((400, "invalid scheduling eligibility \"maybe\"".to_string())));

    let drain = cli(
        port,
        &["node", "drain", "-enable", "-yes", "-deadline", "1m", &drained[..8]],
    );
    let stdout = String::from_utf8_lossy(&drain.stdout).to_string();
    assert!(
        drain.status.success(),
        "the drain completes:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&drain.stderr),
        logs()
    );
    assert!(
        stdout.contains(&format!("Node {drained:?} drain strategy set")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("Drain complete for node {drained:?}")),
        "{stdout}"
    );

    // The service allocation moved; the system allocation stopped and was not replaced.
    let web = wait_for(Duration::from_secs(30), || {
        let web = running_on(port, "web");
        (web.len() == 1).then(|| web[0].clone())
    })
    .unwrap_or_else(|| panic!("web runs again:\n{}", logs()));
    assert_eq!(web.1, other, "web moved to the other client");
    let old = get(port, &format!("/v1/allocation/{web_alloc}")).unwrap();
    assert_eq!(old["DesiredDescription"], "alloc is being migrated", "{old:#}");
    assert_eq!(old["DesiredTransition"]["Migrate"], true);
    assert_eq!(old["ClientStatus"], "complete");
    let agent = get(port, &format!("/v1/allocation/{agent_on_drained}")).unwrap();
    assert_eq!(agent["ClientStatus"], "complete", "{agent:#}");
    let agents = running_on(port, "agent");
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0].1, other);
    // The system allocation was stopped only after web's had finished.
    assert!(
        agent["ModifyIndex"].as_u64() > old["ModifyIndex"].as_u64(),
        "agent {agent:#} web {old:#}"
    );

    let node = get(port, &format!("/v1/node/{drained}")).unwrap();
    assert_eq!(node["Drain"], false);
    assert_eq!(node["SchedulingEligibility"], "ineligible");
    assert_eq!(node["LastDrain"]["Status"], "complete");
    let events: Vec<&str> = node["Events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["Message"].as_str())
        .collect();
    assert!(events.contains(&"Node drain strategy set"), "{events:?}");
    assert!(events.contains(&"Node drain complete"), "{events:?}");
    let table = String::from_utf8_lossy(&cli(port, &["node", "status"]).stdout).to_string();
    let row = table.lines().find(|line| line.starts_with(&drained[..8])).unwrap();
    assert!(row.contains("false") && row.contains("ineligible"), "{table}");

    // Eligible again: the system job comes back to the node.
    let eligible = cli(port, &["node", "eligibility", "-enable", &drained[..8]]);
    assert!(
        eligible.status.success(),
        "{}",
        String::from_utf8_lossy(&eligible.stderr)
    );
    wait_for(Duration::from_secs(30), || {
        running_on(port, "agent")
            .iter()
            .any(|(_, node)| *node == drained)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the system job returns to the node:\n{}", logs()));
    assert_eq!(running_on(port, "web")[0].1, other, "web stays where it moved");
}
