//! Writes and reads against the size of the state (issue 19 §4): the real state machine (redb
//! store, openraft's apply path, one published version per batch) and the `GET /v1/jobs`
//! handler code, first on an empty state, then on one holding 100,000 jobs, 1,000,000
//! allocations and 10,000 nodes, in one run. Prints figures; asserts nothing.
//!
//! While the writer applies job registrations one entry at a time (as sequential acknowledged
//! writes arrive), a reader thread lists the first page of jobs (`per_page=100`) in a loop, and
//! a snapshot is built every `snapshot_threshold` entries beside them, as openraft does.
//!
//!   cargo bench -p drover-io-real --bench state_scale [-- JOBS ALLOCS_PER_JOB NODES]

// A bench measures wall time around the code it runs.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use drover_core::config::ServerTiming;
use drover_core::fsm::{Command, Entry as FsmEntry};
use drover_core::structs::{Allocation, ClientStatus, ConfigValue, Evaluation, Job, Node, NodeStatus, Task, TaskGroup};
use drover_io_real::raft::TypeConfig;
use drover_io_real::raft::store::{StateMachine, Store};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

/// Job registrations per phase.
const WRITES: usize = 5_000;
/// List samples per phase at least (the reader goes on after the writes until it has them).
const LISTS: usize = 500;
/// The first page's jobs: the baseline state holds exactly these, so both phases list the
/// same page (100 jobs with their allocations) and only the size of the state around it differs.
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
    };

    println!("state_scale: {WRITES} job registrations, one entry each, against a reader listing");
    println!("  GET /v1/jobs?per_page=100 in a loop and a snapshot every {threshold} entries");
    bench.populate(0, PAGE_JOBS, per_job, 10);
    let empty = bench.measure(&format!("{PAGE_JOBS} jobs"), 10);
    let started = Instant::now();
    bench.populate(PAGE_JOBS, jobs, per_job, nodes);
    let (size, _) = bench.snapshot_once();
    println!(
        "  populated {jobs} jobs, {} allocations, {nodes} nodes in {:.1} s (snapshot {:.0} MB)",
        jobs * per_job,
        started.elapsed().as_secs_f64(),
        size as f64 / 1e6
    );
    let full = bench.measure(&format!("{jobs} jobs"), nodes);
    println!("  ratios full/{PAGE_JOBS}-job state (goal ≤ 1.5):");
    println!(
        "    writes/s {:.2}x, write p50 {:.2}x, write p99 {:.2}x",
        full.writes_per_s / empty.writes_per_s,
        full.write_p50 / empty.write_p50,
        full.write_p99 / empty.write_p99
    );
    println!(
        "    list page p50 {:.2}x, p99 {:.2}x",
        full.list_p50 / empty.list_p50,
        full.list_p99 / empty.list_p99
    );
    let (_, took) = bench.snapshot_once();
    let whole = Instant::now();
    let listed = bench
        .machine
        .applied()
        .read(|applied| drover_io_real::http::jobs_list(&applied.state, "").unwrap().0.len());
    println!(
        "  for scale: one snapshot of the full state {:.0} ms; the whole unpaged list ({listed} jobs) {:.0} ms",
        took.as_secs_f64() * 1e3,
        whole.elapsed().as_secs_f64() * 1e3
    );
}

struct Bench {
    machine: StateMachine,
    runtime: tokio::runtime::Runtime,
    index: u64,
    threshold: u64,
    /// Job registrations so far in the measured phases (their ids sort after the page's).
    written: usize,
}

struct Figures {
    writes_per_s: f64,
    write_p50: f64,
    write_p99: f64,
    list_p50: f64,
    list_p99: f64,
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
            let registers = chunk
                .iter()
                .map(|j| register(&format!("job-{j:06}"), per_job))
                .collect();
            self.apply(registers);
            let allocs: Vec<Allocation> = chunk
                .iter()
                .flat_map(|j| (0..per_job).map(move |n| (*j, n)))
                .map(|(j, n)| alloc(&format!("job-{j:06}"), n, (j * per_job + n) % nodes.max(1)))
                .collect();
            self.apply(vec![Command::AllocUpsert { allocs }]);
        }
    }

    /// One snapshot of the state as it is: its size and how long it took.
    fn snapshot_once(&mut self) -> (usize, Duration) {
        let mut builder = self.runtime.block_on(self.machine.get_snapshot_builder());
        let started = Instant::now();
        let snapshot = self.runtime.block_on(builder.build_snapshot()).unwrap();
        (snapshot.snapshot.get_ref().len(), started.elapsed())
    }

    fn measure(&mut self, label: &str, nodes: usize) -> Figures {
        let applied = self.machine.applied();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut took = Vec::new();
                while !stop.load(Ordering::Relaxed) || took.len() < LISTS {
                    let started = Instant::now();
                    let (page, _) = applied
                        .read(|applied| drover_io_real::http::jobs_list(&applied.state, "per_page=100").unwrap());
                    assert!(page.len() <= 100);
                    took.push(started.elapsed().as_secs_f64());
                }
                took
            })
        };
        let mut took = Vec::new();
        let mut snapshots = Vec::new();
        let started = Instant::now();
        for _ in 0..WRITES {
            self.written += 1;
            let id = format!("new-{:07}", self.written);
            let write = Instant::now();
            self.apply(vec![register(&id, 1)]);
            took.push(write.elapsed().as_secs_f64());
            if self.index.is_multiple_of(self.threshold)
                && snapshots.iter().all(|s: &std::thread::JoinHandle<()>| s.is_finished())
            {
                // As openraft does: built beside the apply path, from the published version.
                let mut builder = self.runtime.block_on(self.machine.get_snapshot_builder());
                snapshots.push(std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                    runtime.block_on(builder.build_snapshot()).unwrap();
                }));
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let mut lists = reader.join().unwrap();
        let snapshot_count = snapshots.len();
        for snapshot in snapshots {
            snapshot.join().unwrap();
        }
        let (write_p50, write_p99) = percentiles(&mut took);
        let (list_p50, list_p99) = percentiles(&mut lists);
        let figures = Figures {
            writes_per_s: took.len() as f64 / elapsed,
            write_p50,
            write_p99,
            list_p50,
            list_p99,
        };
        println!(
            "  {label:<12} writes {:>7.0}/s  write p50 {:>6.1} µs p99 {:>7.1} µs  list page p50 {:>6.1} µs p99 {:>7.1} µs ({} lists, {} snapshots, {nodes} nodes)",
            figures.writes_per_s,
            write_p50 * 1e6,
            write_p99 * 1e6,
            list_p50 * 1e6,
            list_p99 * 1e6,
            lists.len(),
            snapshot_count,
        );
        figures
    }
}

fn percentiles(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

fn register(id: &str, count: usize) -> Command {
    let job = Job {
        id: id.into(),
        name: id.into(),
        namespace: "default".into(),
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: count as u32,
            tasks: vec![Task {
                name: "app".into(),
                driver: "raw_exec".into(),
                config: BTreeMap::from([("command".into(), ConfigValue::String("/bin/sleep".into()))]),
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    };
    let eval = Evaluation {
        id: format!("eval-{id}"),
        namespace: "default".into(),
        job_id: id.into(),
        status: "complete".into(),
        ..Evaluation::default()
    };
    Command::JobRegister { job, eval }
}

fn alloc(job: &str, n: usize, node: usize) -> Allocation {
    Allocation {
        id: format!("{job}-alloc-{n:02}"),
        name: format!("{job}.web[{n}]"),
        namespace: "default".into(),
        job_id: job.into(),
        task_group: "web".into(),
        node_id: format!("node-{node:05}"),
        client_status: ClientStatus::Running,
        ..Allocation::default()
    }
}

fn node(n: usize) -> Node {
    Node {
        id: format!("node-{n:05}"),
        name: format!("client-{n}"),
        datacenter: "dc1".into(),
        status: NodeStatus::Ready,
        ..Node::default()
    }
}
