//! Nothing lost across an agent restart, for real: an agent (server + client) runs a
//! `raw_exec` task; the agent is killed with SIGKILL and started again on the same data dir;
//! the restarted client reattaches to the task that kept running instead of starting a second
//! copy, and can still stop it.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use drover_core::rpc::ServerRequest;
use drover_core::structs::{Allocation, ConfigValue, DesiredStatus, Job, JobType, Task, TaskGroup};
use support::{Agent, cluster_specs, server_args, submit as request, wait_for};

fn starts(file: &Path) -> Vec<i32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect()
}

#[test]
fn a_restarted_agent_reattaches_to_its_running_task() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let mut agent = Agent::start(specs[0].clone(), args);
    let rpc: SocketAddr = agent.rpc_addr().parse().unwrap();
    wait_for(Duration::from_secs(30), || agent.leader()).expect("a leader");
    let node_id = wait_for(Duration::from_secs(30), || {
        let nodes: serde_json::Value = serde_json::from_str(&agent.get("/v1/nodes")?).ok()?;
        nodes[0]["ID"].as_str().map(String::from)
    })
    .expect("the client registers its node");

    let marker = root.path().join("starts");
    let script = format!("echo $$ >> {}; exec sleep 300", marker.display());
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
                        ConfigValue::List(vec![ConfigValue::String("-c".into()), ConfigValue::String(script)]),
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
    request(
        rpc,
        ServerRequest::JobUpsert {
            job: Box::new(job.clone()),
        },
    );
    request(
        rpc,
        ServerRequest::AllocUpsert {
            allocs: vec![alloc.clone()],
        },
    );
    let pid = wait_for(Duration::from_secs(30), || starts(&marker).first().copied()).expect("the task starts");
    assert!(support::running(pid));

    // kill -9 the agent: the task lives on in its own session.
    agent.kill();
    std::thread::sleep(Duration::from_millis(300));
    assert!(support::running(pid), "the task outlives its agent");
    agent.restart();
    wait_for(Duration::from_secs(30), || agent.leader()).expect("a leader after the restart");
    // Give the restored client time to reattach (and, if it were broken, to start a copy: a
    // failed reattach waits only for the first alloc sync, which comes with the leader).
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        starts(&marker),
        [pid],
        "reattached, not started again:\n{}",
        agent.log()
    );
    assert!(support::running(pid));

    // The restarted client still controls it.
    let mut stopped = alloc;
    stopped.desired_status = DesiredStatus::Stop;
    request(rpc, ServerRequest::AllocUpsert { allocs: vec![stopped] });
    wait_for(Duration::from_secs(30), || (!support::running(pid)).then_some(())).expect("the task is stopped");
    assert_eq!(starts(&marker), [pid]);
}
