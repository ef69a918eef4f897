//! What an operator watches, on a real agent. The event stream followed through a job's
//! life: `/v1/event/stream` sends Nomad's NDJSON lines for the job's registration, its
//! evaluation, its allocation placed and running, and its deregistration; topics and keys
//! pick what is sent, and `index` replays what the buffer kept. And `/v1/metrics`, in Nomad's
//! JSON and Prometheus' text.

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{http, http_status, start_with_client};

/// Follows the stream at `path` on a thread; its lines arrive on the channel.
fn follow(port: u16, path: &str) -> mpsc::Receiver<Value> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let agent = ureq::AgentBuilder::new().timeout_read(Duration::from_secs(60)).build();
        let Ok(response) = agent.get(&url).call() else { return };
        let reader: Box<dyn Read + Send> = response.into_reader();
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let Ok(value) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if sender.send(value).is_err() {
                return;
            }
        }
    });
    receiver
}

/// The events received until `done` holds of them all (or 60 s pass).
fn events_until(lines: &mpsc::Receiver<Value>, mut done: impl FnMut(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events = Vec::new();
    while !done(&events) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let index = line["Index"].clone();
                for event in line["Events"].as_array().cloned().unwrap_or_default() {
                    assert_eq!(event["Index"], index, "each event carries its line's index");
                    events.push(event);
                }
            }
            Err(_) => panic!("the stream stopped short: {events:#?}"),
        }
    }
    events
}

fn has(events: &[Value], topic: &str, kind: &str) -> bool {
    events
        .iter()
        .any(|event| event["Topic"] == topic && event["Type"] == kind)
}

#[test]
fn the_stream_follows_a_job_through_its_life() {
    let root = tempfile::tempdir().unwrap();
    let (_agent, port) = start_with_client(root.path());
    let jobs = follow(port, "/v1/event/stream?topic=Job:*&topic=Evaluation:*");
    let allocs = follow(port, "/v1/event/stream?topic=Allocation:events-web");
    // A subscription that starts late still sees it all: `index` 0 starts at the oldest
    // entry the buffer kept.
    let job = json!({"Job": {
        "ID": "events-web",
        "Type": "batch",
        "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Tasks": [{
            "Name": "t", "Driver": "raw_exec",
            "Config": {"command": "/bin/sh", "args": ["-c", "sleep 1"]},
            "Resources": {"CPU": 20, "MemoryMB": 16}
        }]}],
    }});
    http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered");

    let seen = events_until(&jobs, |events| {
        has(events, "Job", "JobRegistered") && has(events, "Evaluation", "PlanResult")
    });
    let registered = seen.iter().find(|event| event["Type"] == "JobRegistered").unwrap();
    assert_eq!(registered["Key"], "events-web");
    assert_eq!(registered["Namespace"], "default");
    assert_eq!(registered["Payload"]["Job"]["ID"], "events-web");
    assert_eq!(registered["Payload"]["Job"]["Type"], "batch");
    assert!(
        seen.iter()
            .all(|event| event["Topic"] == "Job" || event["Topic"] == "Evaluation"),
        "only the topics asked for: {seen:#?}"
    );

    // The allocation: placed by the plan, then running and complete as the client reports.
    let placed = events_until(&allocs, |events| {
        has(events, "Allocation", "PlanResult")
            && events
                .iter()
                .any(|event| event["Payload"]["Allocation"]["ClientStatus"] == "complete")
    });
    assert!(
        placed
            .iter()
            .all(|event| event["Payload"]["Allocation"]["JobID"] == "events-web"),
        "picked by the job's ID among the filter keys: {placed:#?}"
    );
    assert!(has(&placed, "Allocation", "AllocationUpdated"), "{placed:#?}");
    assert!(
        placed.iter().all(|event| {
            let alloc = &event["Payload"]["Allocation"];
            alloc["Job"].is_null() && alloc.get("Job").is_some()
        }),
        "allocation events carry no job, as Nomad's: {placed:#?}"
    );
    let index = placed[0]["Index"].as_u64().unwrap();

    http("DELETE", port, "/v1/job/events-web?purge=true", None).expect("purged");
    let gone = events_until(&jobs, |events| has(events, "Job", "JobDeregistered"));
    let purged = gone.iter().find(|event| event["Type"] == "JobDeregistered").unwrap();
    assert_eq!(purged["Payload"]["Job"]["ID"], "events-web", "the job as it was");

    // A new subscriber replays what the buffer kept from an index on.
    let replay = follow(port, &format!("/v1/event/stream?topic=Allocation:*&index={index}"));
    let replayed = events_until(&replay, |events| has(events, "Allocation", "PlanResult"));
    assert!(replayed.iter().all(|event| event["Index"].as_u64().unwrap() >= index));

    let bad = http_status("GET", port, "/v1/event/stream?index=soon", None).unwrap();
    assert_eq!(bad.0, 400, "{bad:?}");
}

/// `/v1/metrics` in Nomad's JSON and in Prometheus' text: what the agent counted (RPCs,
/// applies, HTTP requests, Raft roles) and what its state holds (jobs by status, allocations
/// by job and group).
#[test]
fn metrics_show_what_the_agent_did_and_what_its_state_holds() {
    let root = tempfile::tempdir().unwrap();
    let (_agent, port) = start_with_client(root.path());
    let job = json!({"Job": {
        "ID": "metered",
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Tasks": [{
            "Name": "t", "Driver": "raw_exec",
            "Config": {"command": "/bin/sh", "args": ["-c", "sleep 600"]},
            "Resources": {"CPU": 20, "MemoryMB": 16}
        }]}],
    }});
    http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered");
    let running = support::wait_for(Duration::from_secs(60), || {
        let metrics = support::get_json(port, "/v1/metrics")?;
        let gauges = metrics["Gauges"].as_array()?.clone();
        gauges
            .iter()
            .any(|gauge| {
                gauge["Name"] == "nomad.nomad.job_summary.running"
                    && gauge["Labels"]["job"] == "metered"
                    && gauge["Labels"]["task_group"] == "web"
                    && gauge["Value"] == 1.0
            })
            .then_some(metrics)
    })
    .expect("the running allocation is counted");
    let named = |kind: &str, name: &str| {
        running[kind]
            .as_array()
            .unwrap()
            .iter()
            .find(|metric| metric["Name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} among the {kind}: {running:#}"))
    };
    assert_eq!(named("Gauges", "nomad.nomad.job_status.running")["Value"], 1.0);
    // The agent's own client: what it runs.
    let client = support::wait_for(Duration::from_secs(30), || {
        let metrics = support::get_json(port, "/v1/metrics")?;
        let gauges = metrics["Gauges"].as_array()?.clone();
        let value = |name: &str| {
            gauges
                .iter()
                .find(|gauge| gauge["Name"] == name)
                .map(|gauge| gauge["Value"].clone())
        };
        (value("nomad.client.allocations.running")? == 1.0 && value("nomad.client.tasks.running")? == 1.0).then_some(())
    });
    assert!(client.is_some(), "the client's running allocation and task are counted");
    // Its task's resource use, labelled as Nomad labels it.
    let alloc_id = support::get_json(port, "/v1/job/metered/allocations").unwrap()[0]["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let rss = support::wait_for(Duration::from_secs(30), || {
        let metrics = support::get_json(port, "/v1/metrics")?;
        metrics["Gauges"]
            .as_array()?
            .iter()
            .find(|gauge| gauge["Name"] == "nomad.client.allocs.memory.rss" && gauge["Labels"]["task"] == "t")
            // A sample taken as the task's helper execs the shell can read no resident page
            // yet; the shell, once running, has some.
            .filter(|gauge| gauge["Value"].as_f64().is_some_and(|rss| rss > 0.0))
            .cloned()
    })
    .expect("the task's memory is a gauge");
    assert_eq!(
        (
            &rss["Labels"]["job"],
            &rss["Labels"]["task_group"],
            &rss["Labels"]["namespace"]
        ),
        (&json!("metered"), &json!("web"), &json!("default")),
        "{rss}"
    );
    assert_eq!(rss["Labels"]["alloc_id"], alloc_id);
    assert!(
        rss["Value"].as_f64().unwrap() > 0.0,
        "a running shell has resident memory: {rss}"
    );
    let stats = support::get_json(port, &format!("/v1/client/allocation/{alloc_id}/stats")).unwrap();
    assert!(
        stats["Tasks"]["t"]["ResourceUsage"]["MemoryStats"]["RSS"]
            .as_u64()
            .unwrap()
            > 0,
        "the stats endpoint reads the same samples: {stats}"
    );
    assert_eq!(named("Gauges", "nomad.raft.leader")["Value"], 1.0);
    assert!(named("Counters", "nomad.raft.state.leader")["Count"].as_u64().unwrap() >= 1);
    assert!(named("Samples", "nomad.raft.fsm.apply")["Count"].as_u64().unwrap() > 0);
    assert!(named("Samples", "nomad.raft.commitTime")["Count"].as_u64().unwrap() > 0);
    assert!(named("Counters", "nomad.raft.apply")["Count"].as_u64().unwrap() > 0);
    assert_eq!(
        named("Gauges", "nomad.nomad.heartbeat.active")["Value"],
        1.0,
        "the agent's own client"
    );
    assert!(
        named("Samples", "nomad.nomad.fsm.JobRegister")["Count"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(named("Samples", "nomad.http.PUT./v1/jobs")["Count"].as_u64().unwrap() >= 1);
    assert!(running["Timestamp"].is_string());

    let text = ureq::get(&format!("http://127.0.0.1:{port}/v1/metrics?format=prometheus"))
        .call()
        .unwrap();
    assert!(text.content_type().starts_with("text/plain"));
    let text = text.into_string().unwrap();
    assert!(text.contains("# TYPE nomad_raft_fsm_apply summary\n"), "{text}");
    assert!(
        text.contains("nomad_client_allocs_cpu_total_percent{job=\"metered\""),
        "{text}"
    );
    assert!(
        text.contains("nomad_nomad_job_summary_running{job=\"metered\",task_group=\"web\",namespace=\"default\"} 1\n"),
        "{text}"
    );
    // Lists answer for the request's namespace (default `default`), or every one with `*`.
    let count = |path: &str| support::get_json(port, path).unwrap().as_array().unwrap().len();
    assert_eq!(count("/v1/allocations"), 1);
    assert_eq!(count("/v1/allocations?namespace=*"), 1);
    assert_eq!(count("/v1/allocations?namespace=other"), 0);
    assert!(count("/v1/evaluations") >= 1);
    assert_eq!(count("/v1/evaluations?namespace=other"), 0);
    http("DELETE", port, "/v1/job/metered?purge=true", None).expect("purged");
}
