//! How many allocation updates a busy client sends the servers (each one a Raft entry): the
//! client core runs ALLOCS allocations whose tasks are sent RATE signals per second in all
//! (each a `Signaling` task event that changes the task's state), for SECONDS of virtual time,
//! with every `Node.UpdateAlloc` answered after RTT. Deterministic; prints figures, asserts
//! nothing.
//!
//!   cargo bench -p drover-core --bench alloc_updates [-- RATE]
//!
//! The baseline, in the same run, is the events themselves: one update per event is what a
//! client without coalescing would send.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_core::Instant;
use drover_core::client::client::{ALLOC_UPDATE_INTERVAL, Client, ClientAction, ClientInput, ClientSettings};
use drover_core::client::paths::ClientPaths;
use drover_core::client::{AllocControl, DriverCapabilities, Io, MountConfigSupport, Outcome, Reply, TaskHandle};
use drover_core::op::OpId;
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{Allocation, DriverInfo, Job, JobType};

const ALLOCS: usize = 100;
const SECONDS: u64 = 20;
const RTT: Duration = Duration::from_millis(2);

fn job() -> Job {
    drover_core::testkit::job("busy", JobType::Service).with_count(ALLOCS as u32)
}

/// Answers the client's I/O at once; the updates to the servers are held for an RTT.
fn answer(io: &Io) -> Outcome {
    Ok(match io {
        Io::StartTask(config) => Reply::Started(TaskHandle {
            driver: config.driver.clone(),
            alloc_id: config.alloc_id.clone(),
            task: config.task.clone(),
            state: "pid=1".into(),
        }),
        Io::Server(_) => Reply::Server(ServerReply::Done { index: 1 }),
        _ => Reply::Unit,
    })
}

#[derive(Default)]
struct Counts {
    events: u64,
    updates: u64,
    entries: u64,
}

fn main() {
    let rate: u64 = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(1000);
    let mut client = Client::new(ClientSettings {
        node_id: "n1".into(),
        paths: ClientPaths::new("/s", "/a"),
        host_volumes: BTreeMap::new(),
        region: "global".into(),
        seed: 1,
        faults: Default::default(),
        consul: Default::default(),
        max_kill_timeout: drover_core::client::task_runner::DEFAULT_MAX_KILL_TIMEOUT,
    });
    let mut now = Instant::ZERO;
    client.handle(
        now,
        ClientInput::Driver {
            name: "exec".into(),
            capabilities: DriverCapabilities {
                mount_configs: MountConfigSupport::All,
                fs_isolation: true,
            },
            info: DriverInfo {
                detected: true,
                healthy: true,
                health_description: "Healthy".into(),
                attributes: BTreeMap::new(),
                update_time_ms: 0,
            },
        },
    );
    let job = std::sync::Arc::new(job());
    let allocs: Vec<(Allocation, std::sync::Arc<Job>)> = (0..ALLOCS)
        .map(|n| {
            let alloc = Allocation {
                id: format!("alloc-{n:03}"),
                namespace: "default".into(),
                name: format!("busy.g[{n}]"),
                node_id: "n1".into(),
                job_id: job.id.clone(),
                task_group: "g".into(),
                ..Allocation::default()
            };
            (alloc, job.clone())
        })
        .collect();
    let ids: Vec<String> = allocs.iter().map(|(alloc, _)| alloc.id.clone()).collect();
    client.handle(
        now,
        ClientInput::Allocs {
            allocs,
            finished_elsewhere: Vec::new(),
        },
    );
    let mut held: Vec<(Instant, OpId)> = Vec::new();
    let mut counts = Counts::default();
    let drain =
        |client: &mut Client, now: Instant, held: &mut Vec<(Instant, OpId)>, counting: bool, counts: &mut Counts| {
            while let Some(action) = client.poll_action() {
                match action {
                    ClientAction::Io {
                        op,
                        io: Io::Server(ServerRequest::AllocClientUpdates { updates, .. }),
                    } => {
                        if counting {
                            counts.updates += 1;
                            counts.entries += updates.len() as u64;
                        }
                        held.push((now + RTT, op));
                    }
                    ClientAction::Io { op, io } => {
                        let outcome = answer(&io);
                        client.handle(now, ClientInput::Outcome { op, outcome });
                    }
                    ClientAction::TaskEvent { .. } if counting => counts.events += 1,
                    _ => {}
                }
            }
        };
    drain(&mut client, now, &mut held, false, &mut counts);
    // Every task runs; then RATE signals per second, round robin over the allocations.
    let step = Duration::from_nanos(1_000_000_000 / rate);
    let end = now + Duration::from_secs(SECONDS);
    let mut next = 0usize;
    let mut req = 0u64;
    while now < end {
        now = now + step;
        for (_, op) in held.iter().filter(|(at, _)| *at <= now).copied().collect::<Vec<_>>() {
            client.handle(
                now,
                ClientInput::Outcome {
                    op,
                    outcome: Ok(Reply::Server(ServerReply::Done { index: 1 })),
                },
            );
        }
        held.retain(|(at, _)| *at > now);
        if client.poll_timeout().is_some_and(|at| at <= now) {
            client.handle_timeout(now);
        }
        req += 1;
        let alloc_id = ids[next % ids.len()].clone();
        next += 1;
        client.handle(
            now,
            ClientInput::AllocControl {
                req,
                request: AllocControl::Signal {
                    alloc_id,
                    task: None,
                    signal: "SIGHUP".into(),
                },
            },
        );
        drain(&mut client, now, &mut held, true, &mut counts);
    }
    let secs = SECONDS as f64;
    let per_second = |n: u64| n as f64 / secs;
    println!(
        "{ALLOCS} allocations, {rate} signals/s for {SECONDS} s of virtual time, updates answered after {RTT:?}, interval {ALLOC_UPDATE_INTERVAL:?}"
    );
    println!(
        "task events                      {:>9.1} /s  (baseline: one update each)",
        per_second(counts.events)
    );
    println!(
        "Node.UpdateAlloc requests        {:>9.1} /s  = {:.4}x baseline",
        per_second(counts.updates),
        counts.updates as f64 / counts.events.max(1) as f64
    );
    println!(
        "allocations per request          {:>9.1}",
        counts.entries as f64 / counts.updates.max(1) as f64
    );
}
