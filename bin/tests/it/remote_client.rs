//! A client-only agent, for real: three servers (`bootstrap_expect = 3`) and a fourth agent
//! started with `-client -servers=...` and no Raft of its own. The client registers its node
//! (drivers and host volumes included) through whichever server answers, syncs its
//! allocations with blocking queries, runs a `raw_exec` task, and keeps following the servers
//! when the leader is killed: the stop written through the new leader reaches it.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_core::rpc::ServerRequest;
use drover_core::structs::{Allocation, ConfigValue, DesiredStatus, Job, JobType, Task, TaskGroup};
use support::{Agent, agreed_leader, cluster_specs, free_ports, server_args, submit, wait_for};

fn first_pid(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.lines().next()?.parse().ok()
}

#[test]
fn a_client_only_agent_follows_the_servers_through_a_leader_failover() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let mut servers: Vec<Agent> = (0..3)
        .map(|i| Agent::start(specs[i].clone(), server_args(&specs, i)))
        .collect();
    let refs: Vec<&Agent> = servers.iter().collect();
    let leader = wait_for(Duration::from_secs(60), || agreed_leader(&refs, 3)).expect("the servers elect a leader");

    // The client: no server flags, its servers given as a comma list (one without a port
    // would default to 4647; these have theirs).
    let [http, rpc, serf] = free_ports();
    let client_spec = support::ServerSpec {
        name: "c1".into(),
        http,
        rpc,
        serf,
        data_dir: root.path().join("c1"),
    };
    let shared = root.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let config = root.path().join("client.hcl");
    std::fs::write(
        &config,
        format!(
            "client {{\n  host_volume \"shared\" {{\n    path = \"{}\"\n    read_only = true\n  }}\n}}\n",
            shared.display()
        ),
    )
    .unwrap();
    // The leader first: the client talks to it until it dies, then has to move on.
    let mut addrs: Vec<String> = specs.iter().map(|spec| format!("127.0.0.1:{}", spec.rpc)).collect();
    addrs.sort_by_key(|addr| *addr != leader);
    let servers_flag = addrs.join(",");
    let client = Agent::start(
        client_spec.clone(),
        vec![
            "-client".into(),
            format!("-data-dir={}", client_spec.data_dir.display()),
            "-node=c1".into(),
            "-bind=127.0.0.1".into(),
            format!("-http-port={http}"),
            format!("-rpc-port={rpc}"),
            format!("-servers={servers_flag}"),
            format!("-config={}", config.display()),
        ],
    );
    let node: serde_json::Value = wait_for(Duration::from_secs(30), || {
        let nodes: serde_json::Value = serde_json::from_str(&servers[0].get("/v1/nodes")?).ok()?;
        let id = nodes.as_array()?.iter().find(|n| n["Name"] == "c1")?["ID"]
            .as_str()?
            .to_string();
        serde_json::from_str(&servers[0].get(&format!("/v1/node/{id}"))?).ok()
    })
    .unwrap_or_else(|| panic!("the client registers through the servers:\n{}", client.log()));
    let node_id = node["ID"].as_str().unwrap().to_string();
    // The client's servers as the agent endpoint lists them; a server without a client has
    // none to list; a bad address is refused and changes nothing.
    let listed: Vec<String> = serde_json::from_str(&client.get("/v1/agent/servers").unwrap()).unwrap();
    assert_eq!(listed, addrs, "the -servers flag, in its order");
    let (code, body) = support::http_status("GET", specs[0].http, "/v1/agent/servers", None).unwrap();
    assert_eq!((code, body.trim()), (501, "Invalid method"));
    let (code, body) = support::http_status("PUT", http, "/v1/agent/servers?address=nowhere", None).unwrap();
    assert_eq!(code, 400, "{body}");
    let (code, _) =
        support::http_status("PUT", http, &format!("/v1/agent/servers?address={}", addrs[0]), None).unwrap();
    assert_eq!(code, 200);
    let listed: Vec<String> = serde_json::from_str(&client.get("/v1/agent/servers").unwrap()).unwrap();
    assert_eq!(listed, addrs[..1].to_vec());
    support::http_status(
        "PUT",
        http,
        &format!(
            "/v1/agent/servers?{}",
            addrs
                .iter()
                .map(|a| format!("address={a}"))
                .collect::<Vec<_>>()
                .join("&")
        ),
        None,
    )
    .unwrap();
    assert_eq!(node["Drivers"]["raw_exec"]["Detected"], true, "{node:#}");
    assert_eq!(node["Drivers"]["raw_exec"]["Healthy"], true, "{node:#}");
    assert_eq!(node["Attributes"]["driver.raw_exec"], "1", "{node:#}");
    assert_eq!(node["HostVolumes"]["shared"]["Path"], shared.display().to_string());
    assert_eq!(node["HostVolumes"]["shared"]["ReadOnly"], true);

    let marker = root.path().join("starts");
    let job = Job {
        id: "sleeper".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count: 1,
            tasks: vec![Task {
                name: "sleep".into(),
                driver: "raw_exec".into(),
                config: BTreeMap::from([
                    ("command".to_string(), ConfigValue::String("/bin/sh".into())),
                    (
                        "args".to_string(),
                        ConfigValue::List(vec![
                            ConfigValue::String("-c".into()),
                            ConfigValue::String(format!("echo $$ >> {}; exec sleep 300", marker.display())),
                        ]),
                    ),
                ]),
                kill_timeout: Duration::from_secs(2),
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    };
    let alloc = Allocation {
        id: "sleeper-1".into(),
        namespace: "default".into(),
        name: "sleeper.g[0]".into(),
        node_id: node_id.clone(),
        job_id: "sleeper".into(),
        task_group: "g".into(),
        ..Allocation::default()
    };
    let any_server = specs[0].rpc;
    submit(
        ([127, 0, 0, 1], any_server).into(),
        ServerRequest::JobUpsert { job: Box::new(job) },
    );
    submit(
        ([127, 0, 0, 1], any_server).into(),
        ServerRequest::AllocUpsert {
            allocs: vec![alloc.clone()],
        },
    );
    let pid = wait_for(Duration::from_secs(30), || first_pid(&marker))
        .unwrap_or_else(|| panic!("the client runs the task:\n{}", client.log()));
    // Its status comes back through the servers.
    wait_for(Duration::from_secs(30), || {
        let alloc: serde_json::Value = serde_json::from_str(&servers[1].get("/v1/allocation/sleeper-1")?).ok()?;
        (alloc["ClientStatus"] == "running").then_some(())
    })
    .expect("the servers see the alloc running");

    // Kill the leader; the stop goes through the survivors and still reaches the client.
    let position = specs
        .iter()
        .position(|spec| format!("127.0.0.1:{}", spec.rpc) == leader)
        .expect("the leader is one of the servers");
    servers[position].kill();
    let survivors: Vec<&Agent> = servers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != position)
        .map(|(_, a)| a)
        .collect();
    wait_for(Duration::from_secs(60), || {
        let next = survivors[0].leader()?;
        (next != leader && survivors.iter().all(|agent| agent.leader().as_deref() == Some(&next))).then_some(())
    })
    .expect("a new leader among the survivors");
    let mut stopped = alloc;
    stopped.desired_status = DesiredStatus::Stop;
    let survivor_rpc = specs[(position + 1) % 3].rpc;
    submit(
        ([127, 0, 0, 1], survivor_rpc).into(),
        ServerRequest::AllocUpsert { allocs: vec![stopped] },
    );
    wait_for(Duration::from_secs(60), || (!support::running(pid)).then_some(()))
        .unwrap_or_else(|| panic!("the client stops the task after the failover:\n{}", client.log()));
    wait_for(Duration::from_secs(30), || {
        let alloc: serde_json::Value = serde_json::from_str(&survivors[0].get("/v1/allocation/sleeper-1")?).ok()?;
        (alloc["ClientStatus"] == "complete").then_some(())
    })
    .unwrap_or_else(|| panic!("the client reports the stop through a survivor:\n{}", client.log()));
    drop(survivors);
    servers.clear();
}
