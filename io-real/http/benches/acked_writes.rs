//! Whole acknowledged writes against the size of the state (issue 19 §4), the figure a user
//! sees: a real single-server agent (redb file, Raft log append synced before the write is
//! acknowledged, commit, apply, publish), written through the servers' job endpoint the HTTP
//! API calls, first on the smallest state that fills a page (100 jobs), then on one holding
//! 100,000 jobs, 1,000,000 allocations and 10,000 nodes, in one run. A reader thread lists the
//! first page of `GET /v1/jobs` from the published state in a loop in the second pass of each
//! state (the first has the writes alone). Prints figures; asserts nothing. `state_scale`
//! measures the apply path alone, without the log append.
//!
//! Each write is a new version of one of the page's jobs (`Job.Upsert`), sent after the
//! previous one was acknowledged. Snapshots follow the production policy (looked at every
//! `raft_snapshot_interval`, 120 to 240 s, taken past `raft_snapshot_threshold` entries), so a
//! pass of a few seconds rarely includes one; one that does pays for it: encoding the full
//! state takes 1.4 s of a core alone and ~2.8 s against the looping reader, during which that
//! pass's writes had a p99 of ~4 ms on 2 cores.
//!
//!   cargo bench -p drover-http --bench acked_writes [-- JOBS ALLOCS_PER_JOB NODES WRITES]

// A bench measures wall time around the code it runs.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use drover_core::config::Ports;
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{Allocation, Job};
use drover_host::net::GrpcTransport;
use drover_io_real::driver::{AgentHandle, AgentParts, start_agent};
use drover_io_real::io::{NoConsul, TracingObserver};

#[path = "support/mod.rs"]
mod support;
use support::{alloc, job_id, node, percentiles};

/// List samples per state at least (the reader goes on after the writes until it has them).
const LISTS: usize = 200;
/// The first page's jobs: the baseline state holds exactly these.
const PAGE_JOBS: usize = 100;
/// Requests in flight while the state is filled.
const FILL_CONCURRENCY: usize = 128;
/// Allocations per `Alloc.Upsert` while the state is filled.
const ALLOCS_PER_REQUEST: usize = 5_000;

fn main() {
    let numbers: Vec<usize> = std::env::args().skip(1).filter_map(|arg| arg.parse().ok()).collect();
    let jobs = numbers.first().copied().unwrap_or(100_000);
    let per_job = numbers.get(1).copied().unwrap_or(10);
    let nodes = numbers.get(2).copied().unwrap_or(10_000);
    let writes = numbers.get(3).copied().unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(jobs, per_job, nodes, writes));
}

async fn run(jobs: usize, per_job: usize, nodes: usize, writes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let handle = start(dir.path()).await;
    println!(
        "acked_writes: {writes} sequential acknowledged job updates through a single-server agent (synced Raft log) per pass; the second pass of each state has a reader looping on GET /v1/jobs?per_page=100"
    );
    fill(&handle, 0, PAGE_JOBS, per_job, 10).await;
    let small = [
        measure(
            &handle,
            &format!("{PAGE_JOBS} jobs, writes alone"),
            writes,
            per_job,
            0,
            false,
        )
        .await,
        measure(
            &handle,
            &format!("{PAGE_JOBS} jobs, with the reader"),
            writes,
            per_job,
            writes,
            true,
        )
        .await,
    ];
    let started = Instant::now();
    fill(&handle, PAGE_JOBS, jobs, per_job, nodes).await;
    println!(
        "  (filled to {jobs} jobs, {} allocations, {nodes} nodes through the endpoints in {:.1} s)",
        jobs * per_job,
        started.elapsed().as_secs_f64()
    );
    let full = [
        measure(
            &handle,
            &format!("{jobs} jobs, writes alone"),
            writes,
            per_job,
            2 * writes,
            false,
        )
        .await,
        measure(
            &handle,
            &format!("{jobs} jobs, with the reader"),
            writes,
            per_job,
            3 * writes,
            true,
        )
        .await,
    ];
    println!("  full / {PAGE_JOBS}-job state (goal ≤ 1.5x):");
    for ((small, full), label) in small.iter().zip(&full).zip(["writes alone", "with the reader"]) {
        let reads = if label == "writes alone" {
            String::new()
        } else {
            format!(
                " | list page p50 {:.2}x, p99 {:.2}x",
                full.list_p50 / small.list_p50,
                full.list_p99 / small.list_p99
            )
        };
        println!(
            "    {label:<16} writes/s {:.2}x, latency p50 {:.2}x, p99 {:.2}x{reads}",
            full.writes_per_s / small.writes_per_s,
            full.write_p50 / small.write_p50,
            full.write_p99 / small.write_p99,
        );
    }
    handle.shutdown().await;
}

async fn start(data_dir: &std::path::Path) -> AgentHandle {
    let [http, rpc, serf] = drover_testkit::free_ports::<3>();
    let ports = Ports { http, rpc, serf };
    let mut config = drover_core::testkit::lone_server_config("bench", &data_dir.display().to_string(), ports);
    // The bench's nodes never heartbeat: keep them up for the whole run, so no node-down
    // evaluation changes the state being measured.
    config.server.timing.heartbeat.min_ttl = Duration::from_secs(24 * 3600);
    config.server.timing.heartbeat.failover_ttl = Duration::from_secs(24 * 3600);
    let db = drover_host::disk::open_database(data_dir).unwrap();
    let handle = start_agent(AgentParts {
        config,
        db,
        transport: GrpcTransport::default(),
        consul: NoConsul,
        observer: Arc::new(TracingObserver),
        client_csi: None,
        disk_latency: None,
        keystore: None,
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while handle.status().raft.is_none_or(|raft| raft.leader.is_none()) {
        assert!(
            Instant::now() < deadline,
            "the single server elected no leader within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle
}

async fn ok(handle: &AgentHandle, request: ServerRequest) {
    let reply = handle.request(request).await;
    assert!(!matches!(reply, ServerReply::Error(_)), "{reply:?}");
}

/// Runs `requests` with at most `FILL_CONCURRENCY` in flight.
async fn in_flight(handle: &AgentHandle, requests: Vec<ServerRequest>) {
    let mut pending = tokio::task::JoinSet::new();
    for request in requests {
        if pending.len() >= FILL_CONCURRENCY {
            pending.join_next().await.unwrap().unwrap();
        }
        let handle = handle.clone();
        pending.spawn(async move { ok(&handle, request).await });
    }
    while let Some(done) = pending.join_next().await {
        done.unwrap();
    }
}

/// Nodes `0..nodes` (those not there yet), then jobs `from..to` with `per_job` allocations each.
async fn fill(handle: &AgentHandle, from: usize, to: usize, per_job: usize, nodes: usize) {
    let known = handle.read_state(|state| state.nodes().count()).unwrap();
    let registers = (known..nodes)
        .map(|n| ServerRequest::NodeRegister {
            node: Box::new(node(n)),
        })
        .collect();
    in_flight(handle, registers).await;
    let upserts = (from..to)
        .map(|j| ServerRequest::JobUpsert {
            job: Box::new(job(j, per_job, 0)),
        })
        .collect();
    in_flight(handle, upserts).await;
    let allocs: Vec<Allocation> = (from..to)
        .flat_map(|j| (0..per_job).map(move |n| (j, n)))
        .map(|(j, n)| alloc(&job_id(j), n, (j * per_job + n) % nodes.max(1)))
        .collect();
    let batches = allocs
        .chunks(ALLOCS_PER_REQUEST)
        .map(|chunk| ServerRequest::AllocUpsert { allocs: chunk.to_vec() })
        .collect();
    in_flight(handle, batches).await;
}

struct Figures {
    writes_per_s: f64,
    write_p50: f64,
    write_p99: f64,
    list_p50: f64,
    list_p99: f64,
}

/// `writes` sequential job updates, with a reader thread looping on the first jobs page
/// meanwhile or without one.
async fn measure(
    handle: &AgentHandle,
    label: &str,
    writes: usize,
    per_job: usize,
    revision_base: usize,
    with_reader: bool,
) -> Figures {
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let handle = handle.clone();
        std::thread::spawn(move || {
            let mut took = Vec::new();
            while with_reader && (!stop.load(Ordering::Relaxed) || took.len() < LISTS) {
                let started = Instant::now();
                let applied = handle.state_version().unwrap();
                let (page, _) = drover_http::jobs_list(&applied.state, "per_page=100").unwrap();
                assert_eq!(page.len(), PAGE_JOBS);
                took.push(started.elapsed().as_secs_f64());
            }
            took
        })
    };
    let mut took = Vec::with_capacity(writes);
    let started = Instant::now();
    for n in 0..writes {
        let update = job(n % PAGE_JOBS, per_job, revision_base + n + 1);
        let write = Instant::now();
        ok(handle, ServerRequest::JobUpsert { job: Box::new(update) }).await;
        took.push(write.elapsed().as_secs_f64());
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut lists = tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap();
    let (write_p50, write_p99) = percentiles(&mut took);
    let (list_p50, list_p99) = if lists.is_empty() {
        (0.0, 0.0)
    } else {
        percentiles(&mut lists)
    };
    let figures = Figures {
        writes_per_s: took.len() as f64 / elapsed,
        write_p50,
        write_p99,
        list_p50,
        list_p99,
    };
    let reads = if with_reader {
        format!(
            " | list page p50 {:>6.0} µs, p99 {:>7.0} µs ({} lists)",
            list_p50 * 1e6,
            list_p99 * 1e6,
            lists.len()
        )
    } else {
        String::new()
    };
    println!(
        "  {label:<26} {:>6.0} writes/s, p50 {:>6.0} µs, p99 {:>7.0} µs, max {:>7.0} µs{reads}",
        figures.writes_per_s,
        write_p50 * 1e6,
        write_p99 * 1e6,
        took[took.len() - 1] * 1e6,
    );
    figures
}

/// Job `n` of the state; a `revision` above 0 makes a new version of it.
fn job(n: usize, count: usize, revision: usize) -> Job {
    let mut job = support::job(&job_id(n), count);
    if revision > 0 {
        job.meta.insert("revision".to_string(), revision.to_string());
    }
    job
}
