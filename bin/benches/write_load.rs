//! Concurrent writers and mixed load against one real agent (issue 54 §7), end to end over
//! HTTP. Two parts, in one run:
//! - `registers`: `JOBS` job registrations (`PUT /v1/jobs`, each acknowledged once its Raft
//!   entry is durable and applied) against a single server, first one after the other, then
//!   from 16 clients at once; jobs/s and p50 / p99 latency side by side, and the ratio. The
//!   issue's figures before: sequential 575 jobs/s, 16-way 306 jobs/s with a p50 of 50 ms
//!   (Nomad v1.1.2 on the same disk: 144 and 962 jobs/s, p50 15 ms).
//! - `mixed`: an `agent -dev` (server and client, the scripted `mock` driver) under 32 clients
//!   for `SECS` seconds: one in four registers a one-allocation job, the rest list a page of jobs,
//!   read a job and list a page of allocations. Requests answered per second are printed second by second,
//!   with the node's status as the agent reports it each second; before, throughput fell to 0
//!   for 10-22 s and the agent marked its own node down.
//!
//! Prints figures; asserts nothing.
//!
//!   cargo bench -p drover --bench write_load [-- registers [JOBS] | mixed [SECS]]
//!   (both parts by default: 2,000 jobs, 60 s)

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Agent, cluster_specs, get_json, http, http_status, server_args, start_dev_with_mock_driver, wait_for};

const WRITERS: usize = 16;
const MIXED_CLIENTS: usize = 32;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| arg != "--bench").collect();
    let part = args.iter().find(|arg| arg.parse::<u64>().is_err()).cloned();
    let number: Option<u64> = args.iter().find_map(|arg| arg.parse().ok());
    match part.as_deref() {
        Some("registers") => registers(number.unwrap_or(2_000) as usize),
        Some("mixed") => mixed(number.unwrap_or(60)),
        _ => {
            registers(2_000);
            mixed(60);
        }
    }
}

fn job(id: &str, driver: &str) -> String {
    let config = if driver == "mock" {
        "{}"
    } else {
        r#"{"command": "/bin/sleep", "args": ["1000"]}"#
    };
    format!(
        r#"{{"Job": {{"ID": "{id}", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{{"Name": "web", "Count": 1, "Tasks": [{{"Name": "app",
        "Driver": "{driver}", "Config": {config}, "Resources": {{"CPU": 1, "MemoryMB": 10}}}}]}}]}}}}"#
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Registers `ids` from `writers` threads; returns the wall time and each write's latency.
fn register_all(port: u16, prefix: &str, jobs: usize, writers: usize) -> (Duration, Vec<Duration>) {
    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(jobs)));
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let (next, latencies, prefix) = (next.clone(), latencies.clone(), prefix.to_string());
            std::thread::spawn(move || {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= jobs {
                        return;
                    }
                    let body = job(&format!("{prefix}-{n:05}"), "raw_exec");
                    let sent = Instant::now();
                    match http_status("PUT", port, "/v1/jobs", Some(&body)) {
                        Some((200, _)) => {}
                        other => panic!("register {prefix}-{n:05}: {other:?}"),
                    }
                    latencies.lock().unwrap().push(sent.elapsed());
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let wall = started.elapsed();
    let mut latencies = Arc::try_unwrap(latencies).unwrap().into_inner().unwrap();
    latencies.sort();
    (wall, latencies)
}

fn registers(jobs: usize) {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || http("GET", port, "/v1/jobs", None))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    let mut rates = Vec::new();
    for (name, writers) in [("sequential", 1), ("16-way", WRITERS)] {
        let (wall, latencies) = register_all(port, name, jobs, writers);
        let rate = jobs as f64 / wall.as_secs_f64();
        rates.push(rate);
        println!(
            "write_load registers: {name:>10}: {jobs} jobs in {:.2} s, {rate:.0} jobs/s, p50 {:.1} ms, p99 {:.1} ms",
            wall.as_secs_f64(),
            percentile(&latencies, 0.5).as_secs_f64() * 1e3,
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        );
    }
    println!(
        "write_load registers: 16-way / sequential = {:.2}x",
        rates[1] / rates[0]
    );
}

fn mixed(secs: u64) {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev_with_mock_driver(root.path());
    let port = agent.spec.http;

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let registered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..MIXED_CLIENTS)
        .map(|client| {
            let (stop, answered, failed, registered) =
                (stop.clone(), answered.clone(), failed.clone(), registered.clone());
            std::thread::spawn(move || {
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let outcome = if client % 4 == 0 {
                        let n = registered.fetch_add(1, Ordering::Relaxed);
                        http_status("PUT", port, "/v1/jobs", Some(&job(&format!("mixed-{n:06}"), "mock")))
                    } else {
                        // Lists a page at a time, as the UI and the CLI read a big cluster:
                        // an unpaged list costs as much as the state is big, and the line
                        // would fall with every job registered.
                        match round % 3 {
                            0 => http_status("GET", port, "/v1/jobs?per_page=25", None),
                            1 => http_status("GET", port, "/v1/job/mixed-000000", None),
                            _ => http_status("GET", port, "/v1/allocations?per_page=25", None),
                        }
                    };
                    round += 1;
                    match outcome {
                        Some((200 | 404, _)) => answered.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();

    let mut per_second = Vec::new();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    let mut last = 0;
    let started = Instant::now();
    for second in 1..=secs {
        let until = started + Duration::from_secs(second);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let now = answered.load(Ordering::Relaxed);
        let node = get_json(port, "/v1/nodes")
            .and_then(|nodes| nodes.as_array()?.first()?["Status"].as_str().map(str::to_string))
            .unwrap_or_else(|| "unanswered".into());
        *statuses.entry(node.clone()).or_default() += 1;
        println!(
            "write_load mixed: second {second:>3} ({}): {:>5} req/s, node {node}",
            utc_now(),
            now - last
        );
        per_second.push(now - last);
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    let mut sorted = per_second.clone();
    sorted.sort();
    let mean = per_second.iter().sum::<usize>() as f64 / per_second.len().max(1) as f64;
    println!(
        "write_load mixed: {MIXED_CLIENTS} clients for {secs} s: mean {mean:.0} req/s, slowest second {} \
         ({:.2} of the mean), median {}, seconds under half the mean {}, failed requests {}, \
         jobs registered {}; node status seen each second: {statuses:?}",
        sorted[0],
        sorted[0] as f64 / mean.max(1.0),
        sorted[sorted.len() / 2],
        per_second.iter().filter(|&&n| (n as f64) < mean / 2.0).count(),
        failed.load(Ordering::Relaxed),
        registered.load(Ordering::Relaxed),
    );
    let log = agent.log();
    // The whole log, for a second to be looked into (WRITE_LOAD_LOG=path).
    if let Some(path) = std::env::var_os("WRITE_LOAD_LOG") {
        std::fs::write(path, &log).expect("the log is written");
    }
    println!(
        "write_load mixed: the agent logged \"heartbeat missed\" {} times",
        log.matches("heartbeat missed").count()
    );
    // What the agent itself said while under load: warnings, snapshots, leadership.
    for line in log
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("snapshot") || line.contains("leader"))
        .take(40)
    {
        println!("write_load mixed: agent: {line}");
    }
}

/// The wall clock as HH:MM:SS UTC, to line the seconds up with the agent's log.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
        % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}
