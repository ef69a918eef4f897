//! Node heartbeats, for real: a server with short heartbeat TTLs (`min_heartbeat_ttl`,
//! `heartbeat_grace` in its HCL) and two client-only agents. A service job's allocation runs on
//! one client; that client is killed (SIGKILL: no goodbye). The leader's heartbeat timer marks
//! its node down with the `Node heartbeat missed` event, the scheduler marks the allocation
//! lost and places a replacement on the other client, which runs it. The killed client comes
//! back and its node is ready again.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Agent, client_spec, cluster_specs, http, server_args, wait_for};

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&http("GET", port, path, None)?).ok()
}

#[test]
fn a_client_that_stops_heartbeating_goes_down_and_its_allocation_is_replaced() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let config = root.path().join("server.hcl");
    std::fs::write(
        &config,
        "server {\n  min_heartbeat_ttl = \"1s\"\n  heartbeat_grace = \"2s\"\n  failover_heartbeat_ttl = \"10s\"\n}\n",
    )
    .unwrap();
    let mut args = server_args(&specs, 0);
    args.push(format!("-config={}", config.display()));
    let server = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    let (c1_spec, c1_args) = client_spec(root.path(), "c1", specs[0].rpc);
    let (c2_spec, c2_args) = client_spec(root.path(), "c2", specs[0].rpc);
    let mut c1 = Agent::start(c1_spec, c1_args);
    let mut c2 = Agent::start(c2_spec, c2_args);
    let nodes: Vec<(String, String)> = wait_for(Duration::from_secs(60), || {
        let nodes = get(port, "/v1/nodes")?;
        let ready: Vec<(String, String)> = nodes
            .as_array()?
            .iter()
            .filter(|n| n["Status"] == "ready" && n["Drivers"]["raw_exec"]["Healthy"] == true)
            .map(|n| {
                (
                    n["Name"].as_str().unwrap().to_string(),
                    n["ID"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        (ready.len() == 2).then_some(ready)
    })
    .unwrap_or_else(|| panic!("both clients register:\n{}\n{}\n{}", server.log(), c1.log(), c2.log()));

    let marker = root.path().join("pids");
    let job = json!({"Job": {
        "ID": "sleeper",
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": 1,
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", format!("echo $$ >> {}; exec sleep 300", marker.display())]},
                "KillTimeout": 1_000_000_000u64,
            }],
        }],
    }});
    http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered");
    let first = wait_for(Duration::from_secs(30), || {
        let allocs = get(port, "/v1/job/sleeper/allocations")?;
        allocs
            .as_array()?
            .iter()
            .find(|a| a["ClientStatus"] == "running")
            .cloned()
    })
    .unwrap_or_else(|| panic!("the allocation runs:\n{}", server.log()));
    let first_id = first["ID"].as_str().unwrap().to_string();
    let lost_node = first["NodeID"].as_str().unwrap().to_string();
    let (lost_name, _) = nodes.iter().find(|(_, id)| *id == lost_node).unwrap().clone();
    let other_node = nodes.iter().find(|(_, id)| *id != lost_node).unwrap().1.clone();

    // Several TTLs pass with both clients alive: nobody is marked down.
    std::thread::sleep(Duration::from_secs(6));
    let node = get(port, &format!("/v1/node/{lost_node}")).unwrap();
    assert_eq!(node["Status"], "ready", "a heartbeating client stays ready: {node:#}");

    let victim = if lost_name == "c1" { &mut c1 } else { &mut c2 };
    victim.kill();
    let down = wait_for(Duration::from_secs(30), || {
        let node = get(port, &format!("/v1/node/{lost_node}"))?;
        (node["Status"] == "down").then_some(node)
    })
    .unwrap_or_else(|| panic!("the silent node is marked down:\n{}", server.log()));
    let events: Vec<&str> = down["Events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["Message"].as_str())
        .collect();
    assert!(events.contains(&"Node heartbeat missed"), "{events:?}");

    let replacement = wait_for(Duration::from_secs(30), || {
        let allocs = get(port, "/v1/job/sleeper/allocations")?;
        let allocs = allocs.as_array()?;
        let old = allocs.iter().find(|a| a["ID"] == first_id.as_str())?;
        let new = allocs
            .iter()
            .find(|a| a["ID"] != first_id.as_str() && a["ClientStatus"] == "running")?;
        (old["ClientStatus"] == "lost").then(|| new.clone())
    })
    .unwrap_or_else(|| {
        panic!(
            "the lost allocation is replaced on the other node:\n{}\n{}\n{}\n{:#}",
            server.log(),
            c1.log(),
            c2.log(),
            get(port, "/v1/job/sleeper/allocations").unwrap_or_default()
        )
    });
    assert_eq!(replacement["NodeID"], other_node.as_str());

    // The client comes back: its node is ready again.
    let victim = if lost_name == "c1" { &mut c1 } else { &mut c2 };
    victim.restart();
    wait_for(Duration::from_secs(30), || {
        let node = get(port, &format!("/v1/node/{lost_node}"))?;
        (node["Status"] == "ready").then_some(())
    })
    .unwrap_or_else(|| panic!("the returning client is ready again:\n{}", victim.log()));

    // Back, it stops the task of its lost allocation; the purge stops the replacement.
    http("DELETE", port, "/v1/job/sleeper?purge=true", None).expect("purged");
    wait_for(Duration::from_secs(30), || {
        let pids: Vec<i32> = std::fs::read_to_string(&marker)
            .ok()?
            .lines()
            .filter_map(|line| line.parse().ok())
            .collect();
        (pids.len() == 2 && pids.iter().all(|pid| !support::running(*pid))).then_some(())
    })
    .unwrap_or_else(|| {
        // Which recorded task processes still exist, and in what state (a zombie, say).
        let alive: Vec<String> = std::fs::read_to_string(&marker)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.parse::<i32>().ok())
            .map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
                format!("{pid}: {}", stat.unwrap_or_else(|_| "gone".into()).trim())
            })
            .collect();
        panic!(
            "no task is left running: {alive:?}\n{}\n{}\n{}\n{:#}",
            server.log(),
            c1.log(),
            c2.log(),
            get(port, "/v1/allocations").unwrap_or_default()
        )
    });
}
