//! Writes and reads against the size of the state (issue 19 §4): the real state machine (redb
//! store, openraft's apply path, one published version per batch) and the `GET /v1/jobs`
//! handler code, first on the smallest state that fills a page (100 jobs), then on one holding
//! 100,000 jobs, 1,000,000 allocations and 10,000 nodes, in one run. Both list the same page,
//! so only the state around it differs. Prints figures; asserts nothing.
//!
//! Per state:
//! - writes: job updates (a new version of one of the page's jobs, with its evaluation),
//!   applied one entry at a time as sequential acknowledged writes arrive, while a reader
//!   thread lists the first page (`per_page=100`) in a loop: apply latency and list latency;
//! - one snapshot of the whole state, and what it adds to each write when taken every
//!   `snapshot_threshold` entries (openraft's policy): the part of a write that grows with
//!   the state.
//!
//! The Raft log append (one redb commit per write) does not depend on the state's size and is
//! not in these figures; the formation bench measures whole acknowledged writes.
//!
//!   cargo bench -p drover-http --bench state_scale [-- JOBS ALLOCS_PER_JOB NODES]

// A bench measures wall time around the code it runs.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use drover_core::config::ServerTiming;
use drover_core::fsm::{Command, Entry as FsmEntry};
use drover_core::structs::{Allocation, Evaluation};
use drover_io_real::raft::TypeConfig;
use drover_io_real::raft::store::{StateMachine, Store};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

#[path = "support/mod.rs"]
mod support;
use support::{alloc, job_id, node, percentiles};

/// Job updates per state.
const WRITES: usize = 20_000;
/// List samples per state at least (the reader goes on after the writes until it has them).
const LISTS: usize = 500;
/// The first page's jobs: the baseline state holds exactly these.
const PAGE_JOBS: usize = 100;

fn main() {
    let numbers: Vec<usize> = std::env::args().skip(1).filter_map(|arg| arg.parse().ok()).collect();
    let jobs = numbers.first().copied().unwrap_or(100_000);
    let per_job = numbers.get(1).copied().unwrap_or(10);
    let nodes = numbers.get(2).copied().unwrap_or(10_000);
    let threshold = ServerTiming::default().snapshot_threshold;

    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("raft.db")).unwrap();
    let machine = StateMachine::open(Store::new(db).unwrap(), None).unwrap();
    let mut bench = Bench {
        machine,
        runtime: tokio::runtime::Builder::new_current_thread().build().unwrap(),
        index: 0,
        threshold,
        written: 0,
        per_job,
    };

    println!("state_scale: {WRITES} job updates, one entry each, while a reader lists GET /v1/jobs?per_page=100");
    bench.populate(0, PAGE_JOBS, per_job, 10);
    let small = bench.measure(&format!("{PAGE_JOBS} jobs"));
    let started = Instant::now();
    bench.populate(PAGE_JOBS, jobs, per_job, nodes);
    println!(
        "  (populated {jobs} jobs, {} allocations, {nodes} nodes in {:.1} s)",
        jobs * per_job,
        started.elapsed().as_secs_f64()
    );
    let full = bench.measure(&format!("{jobs} jobs"));
    let ratio = |a: f64, b: f64| a / b;
    println!("  full / {PAGE_JOBS}-job state (goal ≤ 1.5x):");
    println!(
        "    apply: writes/s {:.2}x, p50 {:.2}x, p99 {:.2}x | list page: p50 {:.2}x, p99 {:.2}x",
        ratio(full.writes_per_s, small.writes_per_s),
        ratio(full.write_p50, small.write_p50),
        ratio(full.write_p99, small.write_p99),
        ratio(full.list_p50, small.list_p50),
        ratio(full.list_p99, small.list_p99),
    );
    println!(
        "    apply + snapshot share: {:.1} µs against {:.1} µs per write ({:.1}x)",
        full.per_write_with_snapshot() * 1e6,
        small.per_write_with_snapshot() * 1e6,
        ratio(full.per_write_with_snapshot(), small.per_write_with_snapshot()),
    );
    let whole = Instant::now();
    let listed = bench
        .machine
        .applied()
        .read(|applied| drover_http::jobs_list(&applied.state, "").unwrap().0.len());
    println!(
        "  for scale: the whole unpaged list of the full state ({listed} jobs) {:.0} ms",
        whole.elapsed().as_secs_f64() * 1e3
    );
}

struct Bench {
    machine: StateMachine,
    runtime: tokio::runtime::Runtime,
    index: u64,
    threshold: u64,
    /// Job updates so far.
    written: usize,
    per_job: usize,
}

struct Figures {
    writes_per_s: f64,
    write_p50: f64,
    write_p99: f64,
    list_p50: f64,
    list_p99: f64,
    /// Seconds to snapshot the state once.
    snapshot: f64,
    threshold: u64,
}

impl Figures {
    /// A write's apply plus its share of the snapshot taken every `threshold` entries.
    fn per_write_with_snapshot(&self) -> f64 {
        1.0 / self.writes_per_s + self.snapshot / self.threshold as f64
    }
}

impl Bench {
    fn apply(&mut self, commands: Vec<Command>) {
        let entries: Vec<Entry<TypeConfig>> = commands
            .into_iter()
            .map(|command| {
                self.index += 1;
                Entry {
                    log_id: LogId::new(CommittedLeaderId::new(1, 1), self.index),
                    payload: EntryPayload::Normal(FsmEntry {
                        at_unix_ms: self.index,
                        command,
                    }),
                }
            })
            .collect();
        self.runtime.block_on(self.machine.apply(entries)).unwrap();
    }

    /// Jobs `from..to` with `per_job` allocations each, spread over nodes `0..nodes`.
    fn populate(&mut self, from: usize, to: usize, per_job: usize, nodes: usize) {
        for chunk in (0..nodes).collect::<Vec<_>>().chunks(1000) {
            self.apply(chunk.iter().map(|n| Command::NodeRegister { node: node(*n) }).collect());
        }
        for chunk in (from..to).collect::<Vec<_>>().chunks(1000) {
            let registers = chunk.iter().map(|j| register(&job_id(*j), per_job)).collect();
            self.apply(registers);
            let allocs: Vec<Allocation> = chunk
                .iter()
                .flat_map(|j| (0..per_job).map(move |n| (*j, n)))
                .map(|(j, n)| alloc(&job_id(j), n, (j * per_job + n) % nodes.max(1)))
                .collect();
            self.apply(vec![Command::AllocUpsert { allocs }]);
        }
    }

    fn measure(&mut self, label: &str) -> Figures {
        let applied = self.machine.applied();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut took = Vec::new();
                while !stop.load(Ordering::Relaxed) || took.len() < LISTS {
                    let started = Instant::now();
                    let (page, _) =
                        applied.read(|applied| drover_http::jobs_list(&applied.state, "per_page=100").unwrap());
                    assert_eq!(page.len(), PAGE_JOBS);
                    took.push(started.elapsed().as_secs_f64());
                }
                took
            })
        };
        let mut took = Vec::new();
        let started = Instant::now();
        for n in 0..WRITES {
            self.written += 1;
            let mut update = register(&job_id(n % PAGE_JOBS), self.per_job);
            if let Command::JobRegister { job, eval, .. } = &mut update {
                job.meta.insert("revision".into(), self.written.to_string());
                if let Some(eval) = eval {
                    eval.id = format!("eval-update-{}", self.written);
                }
            }
            let write = Instant::now();
            self.apply(vec![update]);
            took.push(write.elapsed().as_secs_f64());
        }
        let elapsed = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let mut lists = reader.join().unwrap();
        let (size, snapshot) = self.snapshot_once();
        let (write_p50, write_p99) = percentiles(&mut took);
        let (list_p50, list_p99) = percentiles(&mut lists);
        let figures = Figures {
            writes_per_s: took.len() as f64 / elapsed,
            write_p50,
            write_p99,
            list_p50,
            list_p99,
            snapshot: snapshot.as_secs_f64(),
            threshold: self.threshold,
        };
        println!(
            "  {label:<12} apply {:>6.0} writes/s, p50 {:>5.1} µs, p99 {:>6.1} µs | list page p50 {:>6.1} µs, p99 {:>7.1} µs ({} lists) | snapshot {:>6.1} ms, {:>5.1} MB",
            figures.writes_per_s,
            write_p50 * 1e6,
            write_p99 * 1e6,
            list_p50 * 1e6,
            list_p99 * 1e6,
            lists.len(),
            figures.snapshot * 1e3,
            size as f64 / 1e6,
        );
        figures
    }

    /// One snapshot of the state as it is: its size and how long it took.
    fn snapshot_once(&mut self) -> (usize, Duration) {
        let mut builder = self.runtime.block_on(self.machine.get_snapshot_builder());
        let started = Instant::now();
        let snapshot = self.runtime.block_on(builder.build_snapshot()).unwrap();
        (snapshot.snapshot.get_ref().len(), started.elapsed())
    }
}

fn register(id: &str, count: usize) -> Command {
    let job = support::job(id, count);
    let eval = Evaluation {
        id: format!("eval-{id}"),
        namespace: "default".into(),
        job_id: id.into(),
        status: drover_core::structs::EvalStatus::Complete,
        ..Evaluation::default()
    };
    Command::JobRegister {
        job,
        eval: Some(eval),
        enforce_index: None,
    }
}
