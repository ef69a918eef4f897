//! Concurrent writers with check-and-set (issue 55 §3): several writers each read a counter
//! through a random server (a consistent read), then write the next value through another,
//! conditioned on the version they read: a variable (`?cas=`) and a job (`EnforceIndex`,
//! through the servers' register endpoint). Servers are killed and partitioned meanwhile.
//!
//! A third counter is written under a variable lock instead: acquire, read, write as the
//! holder, release, sometimes dawdling past the lock's TTL so the leader takes it away and
//! another acquires it meanwhile. A holder's write is fenced by its lock ID at apply time, so
//! the late one is refused and the same chain holds.
//!
//! The invariant, checked when the writers are done and the cluster is quiet: **no
//! acknowledged write was silently overwritten.** Every write that lands replaces exactly the
//! version it read, so the values that land form one chain, 1, 2, 3, …: two acknowledged
//! writes of the same value mean both replaced the same version (one overwrote the other
//! unseen), and an acknowledged value above the final one means it was lost. Writes whose
//! outcome is unknown (a timeout, a server killed mid-write) may or may not have landed; they
//! only lengthen the chain.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::fsm::{Command, Response, ServerState, VariableLockCommand};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{Job, JobType, Task, TaskGroup, TaskResources};
use drover_io_sim::cluster::{ServerLink, SimCluster};
use rand::{Rng, SeedableRng};
use rand_chacha_03::ChaCha8Rng;

/// The variable the writers count in.
const VARIABLE: &str = "cas/counter";
/// The variable the writers count in under its lock.
const LOCKED: &str = "cas/locked";
/// The lock's TTL: shorter than a writer's longest dawdle, so some locks run out mid-write.
const LOCK_TTL_MS: u64 = 2_000;
/// The job whose `meta.n` the writers count in.
const JOB: &str = "cas-counter";
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Subject {
    Variable,
    Job,
    Locked,
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::Variable => "variable",
            Subject::Job => "job",
            Subject::Locked => "locked variable",
        }
    }

    /// The counter's value and the version to condition on (0, 0 when there is none yet).
    fn read(self, state: &ServerState) -> (u64, u64) {
        match self {
            Subject::Variable | Subject::Locked => {
                let path = if self == Subject::Variable { VARIABLE } else { LOCKED };
                state.variable(path).map_or((0, 0), |variable| {
                    let value = variable.items.get("v").and_then(|v| v.parse().ok());
                    (value.unwrap_or(0), variable.modify_index)
                })
            }
            Subject::Job => state.job("default", JOB).map_or((0, 0), |job| {
                let value = job.meta.get("n").and_then(|n| n.parse().ok());
                (value.unwrap_or(0), job.job_modify_index)
            }),
        }
    }
}

#[derive(Default)]
struct Tally {
    /// Acknowledged writes, by subject: (value, through which server).
    acked: BTreeMap<Subject, Vec<(u64, String)>>,
    refused: u64,
    unknown: u64,
}

impl Tally {
    fn record(&mut self, subject: Subject, value: u64, via: String, outcome: Outcome) {
        match outcome {
            Outcome::Acked => self.acked.entry(subject).or_default().push((value, via)),
            Outcome::Refused => self.refused += 1,
            Outcome::Unknown => self.unknown += 1,
        }
    }
}

enum Outcome {
    Acked,
    Refused,
    Unknown,
}

/// The job the writers register: a service job that places nothing (`count = 0`), its
/// counter in `meta.n`.
fn counter_job(value: u64) -> Job {
    Job {
        id: JOB.into(),
        name: JOB.into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        meta: BTreeMap::from([("n".to_string(), value.to_string())]),
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count: 0,
            tasks: vec![Task {
                name: "t".into(),
                driver: "raw_exec".into(),
                config: BTreeMap::from([(
                    "command".to_string(),
                    drover_core::structs::ConfigValue::String("/bin/true".into()),
                )]),
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    ..TaskResources::default()
                },
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// The answer to a variable write.
async fn variable_outcome(via: &ServerLink, command: Command) -> Outcome {
    let Some(write) = via.start_apply(command, TIMEOUT) else {
        return Outcome::Unknown;
    };
    match write.await {
        Ok((_, Response::VariableConflict(_))) => Outcome::Refused,
        Ok((_, Response::Variable(_) | Response::Done)) => Outcome::Acked,
        _ => Outcome::Unknown,
    }
}

/// One increment under the lock: acquired through one server, the counter read through
/// another, written as the holder after `dawdle` through a third, released. `None` when the
/// lock was not had (held by another, or its answer lost); the value written otherwise.
async fn locked_increment(
    links: &[ServerLink],
    rng: &mut ChaCha8Rng,
    lock_id: String,
) -> Option<(u64, String, Outcome)> {
    let pick = |rng: &mut ChaCha8Rng| links[rng.gen_range(0..links.len())].clone();
    let acquire = Command::VariableLock(VariableLockCommand::Acquire {
        path: LOCKED.into(),
        items: None,
        lock_id: lock_id.clone(),
        ttl_ms: LOCK_TTL_MS,
        lock_delay_ms: 200,
    });
    let via = pick(rng);
    let Ok((_, Response::Variable(_))) = via.start_apply(acquire, TIMEOUT)?.await else {
        return None;
    };
    let reader = pick(rng);
    let read = reader.start_read(|state| Subject::Locked.read(state), TIMEOUT);
    let value = match read {
        Some(read) => read.await.ok().map(|(value, _)| value),
        None => None,
    };
    let dawdle = Duration::from_millis(rng.gen_range(0..LOCK_TTL_MS + LOCK_TTL_MS / 2));
    let via = pick(rng);
    let mut result = None;
    if let Some(value) = value {
        tokio::time::sleep(dawdle).await;
        let write = Command::VariableUpsert {
            path: LOCKED.into(),
            items: [("v".to_string(), (value + 1).to_string())].into(),
            cas: None,
            lock_id: Some(lock_id.clone()),
        };
        result = Some((value + 1, via.name().to_string(), variable_outcome(&via, write).await));
    }
    let release = Command::VariableLock(VariableLockCommand::Release {
        path: LOCKED.into(),
        lock_id,
    });
    if let Some(released) = pick(rng).start_apply(release, TIMEOUT) {
        let _ = released.await;
    }
    result
}

/// One conditioned write of `value` over the version `index`, through `via`.
async fn write(via: &ServerLink, subject: Subject, value: u64, index: u64) -> Outcome {
    match subject {
        Subject::Locked => unreachable!("written by locked_increment"),
        Subject::Variable => {
            let command = Command::VariableUpsert {
                path: VARIABLE.into(),
                items: [("v".to_string(), value.to_string())].into(),
                cas: Some(index),
                lock_id: None,
            };
            variable_outcome(via, command).await
        }
        Subject::Job => {
            let request = ServerRequest::JobRegister {
                job: Box::new(counter_job(value)),
                enforce_index: Some(index),
            };
            let Some(write) = via.start_request(request, TIMEOUT) else {
                return Outcome::Unknown;
            };
            match write.await {
                Ok(ServerReply::JobRegistered { .. }) => Outcome::Acked,
                Ok(ServerReply::Error(error)) if error.kind == drover_core::error::ErrorKind::Invalid => {
                    Outcome::Refused
                }
                _ => Outcome::Unknown,
            }
        }
    }
}

/// Starts `writers` writers for `lasting`, then checks what they were told against what the
/// cluster holds; the returned task ends when the check is made. Everything is drawn from
/// `seed`.
pub fn spawn(cluster: &SimCluster, seed: u64, writers: u32, lasting: Duration) -> tokio::task::JoinHandle<()> {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let links: Vec<ServerLink> = (0..cluster.len()).map(|index| cluster.link(index)).collect();
    let recorder = cluster.recorder().clone();
    let until = tokio::time::Instant::now() + lasting;
    let mut running = Vec::new();
    for writer in 0..writers {
        let links = links.clone();
        let tally = tally.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ u64::from(writer).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        running.push(tokio::spawn(async move {
            let mut attempts = 0u64;
            while tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..150))).await;
                attempts += 1;
                let subject = match rng.gen_range(0..3) {
                    0 => Subject::Variable,
                    1 => Subject::Job,
                    _ => Subject::Locked,
                };
                if subject == Subject::Locked {
                    let lock_id = format!("writer{writer}-{attempts}");
                    if let Some((value, via, outcome)) = locked_increment(&links, &mut rng, lock_id).await {
                        tally.lock().expect("tally").record(subject, value, via, outcome);
                    }
                    continue;
                }
                let reader = &links[rng.gen_range(0..links.len())];
                let via = &links[rng.gen_range(0..links.len())];
                let Some(read) = reader.start_read(move |state| subject.read(state), TIMEOUT) else {
                    continue;
                };
                let Ok((value, index)) = read.await else { continue };
                let outcome = write(via, subject, value + 1, index).await;
                tally
                    .lock()
                    .expect("tally")
                    .record(subject, value + 1, via.name().to_string(), outcome);
            }
        }));
    }
    tokio::spawn(async move {
        for writer in running {
            let _ = writer.await;
        }
        let finals = final_values(&links).await;
        let tally = tally.lock().expect("tally");
        let acked: usize = tally.acked.values().map(Vec::len).sum();
        recorder.note(format!(
            "check-and-set writers over: {acked} acknowledged, {} refused as stale, {} unknown; final {finals:?}",
            tally.refused, tally.unknown
        ));
        let Some(finals) = finals else {
            recorder.violate(
                "liveness: the check-and-set counters can be read",
                "no consistent read answered within 30 s of the writers' end".to_string(),
            );
            return;
        };
        for problem in violations(&tally.acked, &finals) {
            recorder.violate("no acknowledged check-and-set write is silently overwritten", problem);
        }
        recorder.checked(
            "no acknowledged check-and-set write is silently overwritten",
            acked as u64,
        );
    })
}

/// The counters as a consistent read finds them, retried through every server for 30 s.
async fn final_values(links: &[ServerLink]) -> Option<BTreeMap<Subject, u64>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        for link in links {
            let read = link.start_read(
                |state| {
                    BTreeMap::from([
                        (Subject::Variable, Subject::Variable.read(state).0),
                        (Subject::Job, Subject::Job.read(state).0),
                        (Subject::Locked, Subject::Locked.read(state).0),
                    ])
                },
                TIMEOUT,
            );
            if let Some(read) = read
                && let Ok(values) = read.await
            {
                return Some(values);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// What breaks the chain: a value acknowledged twice, or one above the final value.
fn violations(acked: &BTreeMap<Subject, Vec<(u64, String)>>, finals: &BTreeMap<Subject, u64>) -> Vec<String> {
    let mut out = Vec::new();
    for (subject, writes) in acked {
        let last = finals.get(subject).copied().unwrap_or(0);
        let mut seen: BTreeMap<u64, &str> = BTreeMap::new();
        for (value, via) in writes {
            if let Some(first) = seen.insert(*value, via) {
                out.push(format!(
                    "the {} counter's value {value} was acknowledged twice (through {first} and {via}): \
                     both replaced the same version",
                    subject.name()
                ));
            }
            if *value > last {
                out.push(format!(
                    "the {} counter's value {value} was acknowledged through {via}, but the counter ends at {last}",
                    subject.name()
                ));
            }
        }
    }
    out
}
