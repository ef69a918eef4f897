//! Does a big read stall the agent? (issue 19 §4, measured end to end.) One real server,
//! `JOBS` jobs registered over HTTP (they cannot be placed: there is no client, so each waits
//! with a blocked evaluation), then, in one run:
//! - idle: `GET /v1/status/leader` and a variable write (`PUT /v1/var/..`, a Raft commit),
//!   one after the other;
//! - the same while two clients loop on the unpaged `GET /v1/jobs` (every job, with its
//!   summary), and the time of one such list.
//!
//! The issue's measurement before any of this: at 6,203 jobs one list took 1.2 s, and with one
//! client looping on it `/v1/status/leader` went from 0.6 ms to 1.2 s (p50) and writes from
//! 1.9 ms to 2.3 s. Figures are printed as p50 / p99 with the loaded/idle ratio; nothing is
//! asserted.
//!
//!   cargo bench -p drover --bench read_stall [-- JOBS]     (default 6,000)

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::{Agent, cluster_specs, http, http_status, server_args, wait_for};

const SAMPLES: usize = 300;

fn main() {
    let jobs: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(6_000);
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || http("GET", port, "/v1/jobs", None))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let next = next.clone();
            std::thread::spawn(move || {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= jobs {
                        return;
                    }
                    let job = format!(
                        r#"{{"Job": {{"ID": "job-{n:06}", "Type": "service", "Datacenters": ["dc1"],
                        "TaskGroups": [{{"Name": "web", "Count": 3, "Tasks": [{{"Name": "app",
                        "Driver": "raw_exec", "Config": {{"command": "/bin/sleep", "args": ["1000"]}}}}]}}]}}}}"#
                    );
                    http("PUT", port, "/v1/jobs", Some(&job)).expect("registered");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    println!(
        "read_stall: {jobs} jobs registered over HTTP in {:.1} s (4 writers)",
        started.elapsed().as_secs_f64()
    );

    let idle = measure(port, "idle");
    let stop = Arc::new(AtomicBool::new(false));
    let lists = Arc::new(std::sync::Mutex::new(Vec::new()));
    let loopers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, lists) = (stop.clone(), lists.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let body = http("GET", port, "/v1/jobs", None).expect("listed");
                    assert!(body.len() > jobs * 100, "every job is listed");
                    lists.lock().unwrap().push(started.elapsed());
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let loaded = measure(port, "2 clients looping on GET /v1/jobs");
    stop.store(true, Ordering::Relaxed);
    for looper in loopers {
        looper.join().unwrap();
    }
    let mut lists = lists.lock().unwrap().clone();
    lists.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  one unpaged GET /v1/jobs of {jobs} jobs: p50 {:.0} ms ({} lists)",
        ms(lists[lists.len() / 2]),
        lists.len()
    );
    println!(
        "  loaded / idle: status/leader p50 {:.1}x p99 {:.1}x; write p50 {:.1}x p99 {:.1}x",
        loaded.leader.0 / idle.leader.0,
        loaded.leader.1 / idle.leader.1,
        loaded.write.0 / idle.write.0,
        loaded.write.1 / idle.write.1,
    );
}

struct Figures {
    /// p50, p99 in ms.
    leader: (f64, f64),
    write: (f64, f64),
}

fn measure(port: u16, label: &str) -> Figures {
    let mut leader = Vec::new();
    let mut write = Vec::new();
    for n in 0..SAMPLES {
        let started = Instant::now();
        let (code, _) = http_status("GET", port, "/v1/status/leader", None).expect("answers");
        assert_eq!(code, 200);
        leader.push(started.elapsed());
        let started = Instant::now();
        http(
            "PUT",
            port,
            &format!("/v1/var/bench/{n}"),
            Some(r#"{"Items":{"k":"v"}}"#),
        )
        .expect("written");
        write.push(started.elapsed());
    }
    let figures = Figures {
        leader: percentiles(&mut leader),
        write: percentiles(&mut write),
    };
    println!(
        "  {label:<34} status/leader p50 {:>7.2} ms p99 {:>7.2} ms | write p50 {:>7.2} ms p99 {:>7.2} ms",
        figures.leader.0, figures.leader.1, figures.write.0, figures.write.1
    );
    figures
}

fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    (at(0.5), at(0.99))
}
