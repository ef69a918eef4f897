//! Ports for real: one agent (server + client) places 50 allocations of a job with a dynamic
//! port on its one node; every task is told its own port (`NOMAD_PORT_*`, `NOMAD_HOST_PORT_*`,
//! `NOMAD_ADDR_*` on the node's address), no two share one, and they are the ports the API
//! shows. A static port a running allocation holds is not given twice: the second allocation
//! is not placed, with Nomad's exhausted-dimension text; a reserved port is never handed out.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Agent, cluster_specs, free_ports, http, server_args, wait_for};

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&http("GET", port, path, None)?).ok()
}

/// The line the allocation's task wrote into its marker file, once written whole: the shell
/// creates the file before it writes the line, so a file that exists may still be empty.
fn told(marker: &Path, id: &str) -> Option<String> {
    wait_for(Duration::from_secs(10), || {
        std::fs::read_to_string(marker.join(id))
            .ok()
            .filter(|text| text.ends_with('\n'))
    })
}

fn job(id: &str, count: u32, network: Value, marker: &Path) -> String {
    let script = format!(
        "echo \"$NOMAD_PORT_http $NOMAD_HOST_PORT_http $NOMAD_ADDR_http\" > {}/$NOMAD_ALLOC_ID; exec sleep 300",
        marker.display()
    );
    json!({"Job": {
        "ID": id,
        "TaskGroups": [{
            "Name": "g",
            "Count": count,
            "Networks": [network],
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", script]},
                "Resources": {"CPU": 20, "MemoryMB": 10},
                "KillTimeout": 1_000_000_000u64,
            }],
        }],
    }})
    .to_string()
}

fn running(port: u16, job: &str) -> Vec<Value> {
    get(port, &format!("/v1/job/{job}/allocations"))
        .and_then(|allocs| allocs.as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|alloc| alloc["ClientStatus"] == "running")
        .collect()
}

#[test]
fn fifty_allocations_on_one_node_get_distinct_ports_in_their_environment() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let [reserved, fixed, _] = free_ports();
    let config = root.path().join("ports.hcl");
    std::fs::write(
        &config,
        format!(
            "client {{\n  min_dynamic_port = 24000\n  max_dynamic_port = 24100\n  reserved {{\n    reserved_ports = \"{reserved},24000-24009\"\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    args.push(format!("-config={}", config.display()));
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    let node_id = wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then(|| nodes[0]["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));
    let node = get(port, &format!("/v1/node/{node_id}")).unwrap();
    let host_ip = node["NodeResources"]["Networks"][0]["IP"].as_str().unwrap().to_string();
    assert_eq!(host_ip, "127.0.0.1", "the address the agent advertises: {node}");
    let shown = node["ReservedResources"]["Networks"]["ReservedHostPorts"]
        .as_str()
        .unwrap();
    let mut expected: std::collections::BTreeSet<u16> = (24000..=24009).collect();
    expected.insert(reserved);
    assert_eq!(
        drover_core::structs::parse_port_ranges(shown).unwrap(),
        expected,
        "{shown}"
    );
    assert_eq!(
        (
            &node["NodeResources"]["MinDynamicPort"],
            &node["NodeResources"]["MaxDynamicPort"]
        ),
        (&json!(24000), &json!(24100))
    );

    let marker = root.path().join("ports");
    std::fs::create_dir_all(&marker).unwrap();
    let dynamic = json!({"DynamicPorts": [{"Label": "http"}]});
    http("PUT", port, "/v1/jobs", Some(&job("many", 50, dynamic, &marker))).expect("registered");
    let allocs = wait_for(Duration::from_secs(120), || {
        let live = running(port, "many");
        (live.len() == 50 && std::fs::read_dir(&marker).ok()?.count() == 50).then_some(live)
    })
    .unwrap_or_else(|| panic!("50 allocations run:\n{}", agent.log()));
    let mut seen = std::collections::BTreeSet::new();
    for alloc in &allocs {
        let id = alloc["ID"].as_str().unwrap();
        let full = get(port, &format!("/v1/allocation/{id}")).unwrap();
        let given = &full["AllocatedResources"]["Shared"]["Ports"][0];
        let value = given["Value"].as_u64().unwrap();
        assert!(
            (24010..=24100).contains(&value),
            "outside the range or reserved: {given}"
        );
        assert!(seen.insert(value), "port {value} handed out twice");
        assert_eq!(given["HostIP"], host_ip.as_str());
        let told = told(&marker, id).expect("the task wrote its port");
        assert_eq!(told.trim(), format!("{value} {value} {host_ip}:{value}"), "alloc {id}");
    }

    // `agent alloc status` shows the allocation's address as Nomad's does.
    let id = allocs[0]["ID"].as_str().unwrap();
    let value =
        get(port, &format!("/v1/allocation/{id}")).unwrap()["AllocatedResources"]["Shared"]["Ports"][0]["Value"]
            .as_u64()
            .unwrap();
    let output = std::process::Command::new(support::AGENT)
        .args(["alloc", "status", id])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs");
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("Allocation Addresses (mode = \"host\"):"), "{shown}");
    let row = shown
        .lines()
        .find(|line| line.starts_with("*http"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["*http", "yes", &format!("{host_ip}:{value}")],
        "{shown}"
    );

    // A static port: the first allocation holds it, the second cannot have it.
    let fixed_port = json!({"ReservedPorts": [{"Label": "http", "Value": fixed}]});
    let reply: Value = serde_json::from_str(
        &http("PUT", port, "/v1/jobs", Some(&job("fixed", 2, fixed_port, &marker))).expect("registered"),
    )
    .unwrap();
    let eval_id = reply["EvalID"].as_str().unwrap().to_string();
    let eval = wait_for(Duration::from_secs(30), || {
        let eval = get(port, &format!("/v1/evaluation/{eval_id}"))?;
        (eval["Status"] == "complete").then_some(eval)
    })
    .unwrap_or_else(|| panic!("the evaluation completes:\n{}", agent.log()));
    let exhausted = &eval["FailedTGAllocs"]["g"]["DimensionExhausted"];
    assert_eq!(
        exhausted[format!("network: reserved port collision http={fixed}")],
        1,
        "{eval}"
    );
    let placed = wait_for(Duration::from_secs(30), || {
        let live = running(port, "fixed");
        (live.len() == 1).then_some(live)
    })
    .unwrap_or_else(|| panic!("one allocation runs:\n{}", agent.log()));
    let id = placed[0]["ID"].as_str().unwrap();
    let told = told(&marker, id).expect("the task wrote its port");
    assert_eq!(told.trim(), format!("{fixed} {fixed} {host_ip}:{fixed}"));
    assert!(!seen.contains(&u64::from(reserved)));
}
