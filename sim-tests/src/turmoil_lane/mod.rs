//! The turmoil lane: three servers running the production network stack (tonic agent RPC, UDP
//! gossip, the axum HTTP API) on turmoil's simulated network, with the same safety invariants
//! as the madsim lane, a workload of variable writes and consistent reads through the real
//! HTTP API of every server (its history checked for linearizability), a liveness phase after
//! the faults, and every seed run twice to prove the trace replays byte for byte.
//!
//! `cargo test -p sim-tests --test turmoil -- --seeds 0..20` (see `tests/turmoil.rs`).

pub mod cli;
pub mod csi;
pub mod scenarios;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_io_sim::invariants::linearizable::{self, Op};
use drover_io_sim::invariants::{liveness, state_equal};
use drover_io_sim::trace::{Recorder, Violation};
use drover_io_sim::turmoil::cluster::{RealTimeJitter, TurmoilCluster};
use drover_io_sim::turmoil::http;
use rand::{Rng, SeedableRng};
use rand_chacha_03::ChaCha8Rng;

use scenarios::Scenario;

/// Virtual time turmoil may run before it calls the run stuck (the phases' own bounds are
/// far shorter).
const LIMIT: Duration = Duration::from_secs(900);
/// A leader must emerge this soon after the last server started.
const FORMATION_BOUND: Duration = Duration::from_secs(60);
/// After the faults heal, every server must agree on a leader and hold its state this soon.
const CONVERGENCE_BOUND: Duration = Duration::from_secs(60);
/// Every acknowledged write must read back through every server this soon after convergence.
const AUDIT_BOUND: Duration = Duration::from_secs(30);
/// One HTTP request of the workload gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What one run found.
pub struct Report {
    pub scenario: &'static str,
    pub seed: u64,
    pub trace: String,
    pub violations: Vec<Violation>,
    /// Virtual time the run took.
    pub virtual_time: Duration,
    pub writes_acknowledged: usize,
    pub reads: usize,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn salt(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The leader every running server agrees on.
pub fn common_leader(cluster: &TurmoilCluster) -> Result<u64, String> {
    liveness::common_leader(&cluster.statuses())
}

/// Runs `scenario` for `seed` once.
pub fn run(scenario: &'static Scenario, seed: u64) -> Report {
    run_with(scenario, seed, None)
}

/// Runs `scenario` for `seed` once, with a regression switch on.
pub fn run_with(scenario: &'static Scenario, seed: u64, switch: Option<&scenarios::Switch>) -> Report {
    run_jittered(scenario, seed, switch, None)
}

/// Runs `scenario` for `seed` once, its driving thread paused in real time as `jitter` says
/// (the trace must not change).
pub fn run_jittered(
    scenario: &'static Scenario,
    seed: u64,
    switch: Option<&scenarios::Switch>,
    jitter: Option<RealTimeJitter>,
) -> Report {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ salt(scenario.name));
    let keep_dead_connections = switch.is_some_and(|switch| switch.name == "no-keepalive");
    let specs = scenarios::servers(&mut rng, keep_dead_connections);
    let network = scenarios::network(&mut rng);
    let clients = scenarios::clients(scenario.clients, &mut rng, keep_dead_connections);
    let mut cluster = TurmoilCluster::new(seed, network, specs, clients, LIMIT);
    if let Some(jitter) = jitter {
        cluster.jitter_real_time(jitter);
    }
    let recorder = cluster.recorder().clone();
    recorder.note(format!("turmoil lane: {} seed {seed}", scenario.name));
    let history: Arc<Mutex<Vec<Op>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<(String, SocketAddr)> = (0..3)
        .map(|index| (cluster.server_names()[index].clone(), cluster.http_addr(index)))
        .collect();
    cluster.client(
        "operator",
        operator(
            addrs.clone(),
            history.clone(),
            stop.clone(),
            recorder.clone(),
            rng.r#gen(),
        ),
    );
    let csi_progress: Arc<Mutex<csi::Progress>> = Arc::default();
    if scenario.csi {
        cluster.client(
            "csi-operator",
            csi::operate(addrs.clone(), recorder.clone(), csi_progress.clone(), stop.clone()),
        );
    }
    if let Err(error) = phases(scenario, &mut cluster, &mut rng, &stop) {
        recorder.violate("the simulation runs", error);
    }
    stop.store(true, Ordering::SeqCst);
    if scenario.csi {
        finish_csi(&mut cluster, &csi_progress);
    }
    audit(&mut cluster, &addrs, &history);
    let history = history.lock().expect("history").clone();
    for violation in linearizable::check(&history) {
        recorder.violate("consistent reads are linearizable", violation);
    }
    recorder.checked("consistent reads are linearizable", history.len() as u64);
    let virtual_time = cluster.elapsed();
    let recorder = cluster.finish();
    Report {
        scenario: scenario.name,
        seed,
        trace: recorder.text(),
        violations: recorder.violations(),
        virtual_time,
        writes_acknowledged: history
            .iter()
            .filter(|op| matches!(op, Op::Write { completed: Some(_), .. }))
            .count(),
        reads: history.iter().filter(|op| matches!(op, Op::Read { .. })).count(),
    }
}

/// Formation, the scenario's faults, then liveness: violations go to the recorder; `Err` when
/// the simulation itself failed.
fn phases(
    scenario: &Scenario,
    cluster: &mut TurmoilCluster,
    rng: &mut ChaCha8Rng,
    stop: &AtomicBool,
) -> Result<(), String> {
    let recorder = cluster.recorder().clone();
    let formed = cluster.step_until(FORMATION_BOUND + Duration::from_secs(2), |cluster| {
        cluster.statuses().len() == 3 && common_leader(cluster).is_ok()
    })?;
    if !formed {
        let why = common_leader(cluster).err().unwrap_or_default();
        recorder.violate(
            "liveness",
            format!("no leader within {FORMATION_BOUND:?} of formation: {why}"),
        );
        return Ok(());
    }
    recorder.note(format!("formed: leader {}", common_leader(cluster)?));
    (scenario.faults)(cluster, rng)?;
    cluster.heal();
    cluster.set_fail_rate(0.0);
    recorder.note("faults healed");
    cluster.step_until(CONVERGENCE_BOUND, |cluster| converged(cluster).is_ok())?;
    stop.store(true, Ordering::SeqCst);
    match converged(cluster) {
        Ok(()) => recorder.note(format!("converged: leader {}", common_leader(cluster)?)),
        Err(why) => recorder.violate(
            "liveness",
            format!("not converged {CONVERGENCE_BOUND:?} after healing: {why}"),
        ),
    }
    Ok(())
}

/// Every server runs, all agree on a leader, all applied as far as it, and hold its state.
fn converged(cluster: &TurmoilCluster) -> Result<(), String> {
    if cluster.statuses().len() != 3 {
        return Err("not every server is running".to_string());
    }
    let leader = common_leader(cluster)?;
    let states = cluster.states();
    let Some(index) = cluster.index_of(leader) else {
        return Err(format!("leader {leader} is not running"));
    };
    let name = &cluster.server_names()[index];
    let Some((_, leader_state)) = states.iter().find(|(server, _)| server == name) else {
        return Err(format!("leader {name} holds no state"));
    };
    let behind: Vec<&str> = states
        .iter()
        .filter(|(_, state)| state.last_applied() != leader_state.last_applied())
        .map(|(server, _)| server.as_str())
        .collect();
    if !behind.is_empty() {
        return Err(format!("{} not applied as far as {name}", behind.join(", ")));
    }
    let others: Vec<(String, drover_core::fsm::ServerState)> =
        states.iter().filter(|(server, _)| server != name).cloned().collect();
    state_equal::same_state((name, leader_state), &others)?;
    Ok(())
}

/// The CSI script must finish once the faults are over; then nothing of the job may be left on
/// the client host and no claim of a finished allocation in the leader's state.
fn finish_csi(cluster: &mut TurmoilCluster, progress: &Arc<Mutex<csi::Progress>>) {
    let recorder = cluster.recorder().clone();
    let finished = |progress: &Arc<Mutex<csi::Progress>>| {
        let progress = progress.lock().expect("progress");
        progress.done || progress.failed.is_some()
    };
    if let Err(error) = cluster.step_until(Duration::from_secs(300), |_| finished(progress)) {
        recorder.violate("the simulation runs", error);
        return;
    }
    let progress = progress.lock().expect("progress").clone();
    if let Some(failed) = &progress.failed {
        recorder.violate("the CSI lifecycle completes", failed.clone());
        return;
    }
    if !progress.done {
        recorder.violate("the CSI lifecycle completes", format!("stuck at {:?}", progress.step));
        return;
    }
    let alloc = progress.alloc.unwrap_or_default();
    let host = cluster.client_host(0);
    let leftovers: Vec<String> = host
        .task_processes()
        .into_iter()
        .filter(|(task_alloc, _)| *task_alloc == alloc)
        .map(|(task_alloc, task)| format!("task {task} of {task_alloc}"))
        .chain(host.mounts().into_iter().filter(|mount| mount.contains(&alloc)))
        .collect();
    recorder.checked("a stopped job leaves nothing on its host", 1);
    if !leftovers.is_empty() {
        recorder.violate(
            "a stopped job leaves nothing on its host",
            format!("left on c1: {}", leftovers.join(", ")),
        );
    }
    if let Some(state) = common_leader(cluster)
        .ok()
        .and_then(|leader| cluster.index_of(leader))
        .and_then(|index| cluster.agent(index))
        .and_then(|agent| agent.read_state(drover_core::fsm::ServerState::clone))
    {
        recorder.checked("claims of finished allocations are freed", 1);
        if let Err(leak) = drover_io_sim::invariants::claims_freed::no_leaked_claims(&state) {
            recorder.violate("claims of finished allocations are freed", leak);
        }
    }
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The workload: writes of fresh variables and consistent reads of written, unwritten and
/// not-yet-written ones, each through a random server's HTTP API, until told to stop.
async fn operator(
    servers: Vec<(String, SocketAddr)>,
    history: Arc<Mutex<Vec<Op>>>,
    stop: Arc<AtomicBool>,
    recorder: Recorder,
    seed: u64,
) -> turmoil::Result {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut written = 0u64;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..400))).await;
        let (server, addr) = &servers[rng.gen_range(0..servers.len())];
        let write = written == 0 || rng.gen_bool(0.4);
        let number = if write { written } else { rng.gen_range(0..=written) };
        let path = format!("t/w{number}");
        let invoked = now();
        let answer = if write {
            written += 1;
            let body = format!(r#"{{"Items":{{"n":"{number}"}}}}"#).into_bytes();
            call(*addr, "PUT", &format!("/v1/var/{path}"), Some(body)).await
        } else {
            call(*addr, "GET", &format!("/v1/var/{path}"), None).await
        };
        let completed = now();
        let verb = if write { "PUT" } else { "GET" };
        recorder.note(format!("operator {verb} {path} via {server}: {}", describe(&answer)));
        let op = match (write, &answer) {
            (true, Ok(answer)) => Op::Write {
                path,
                invoked,
                completed: (answer.status == 200).then_some(completed),
            },
            (true, Err(_)) => Op::Write {
                path,
                invoked,
                completed: None,
            },
            (false, Ok(answer)) if answer.status == 200 || answer.status == 404 => Op::Read {
                path,
                server: server.clone(),
                invoked,
                completed,
                present: answer.status == 200,
            },
            (false, _) => continue,
        };
        history.lock().expect("history").push(op);
    }
    Ok(())
}

async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<http::Answer, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, http::request(addr, method, path, body)).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("timed out after {REQUEST_TIMEOUT:?}")),
    }
}

fn describe(answer: &Result<http::Answer, String>) -> String {
    match answer {
        Ok(answer) if answer.status == 200 => "200".to_string(),
        Ok(answer) => format!("{} {}", answer.status, answer.text().trim()),
        Err(error) => error.clone(),
    }
}

/// After the run: every acknowledged write is read back through every server (consistent
/// reads, added to the history the linearizability check reads).
fn audit(cluster: &mut TurmoilCluster, servers: &[(String, SocketAddr)], history: &Arc<Mutex<Vec<Op>>>) {
    let acknowledged: Vec<String> = history
        .lock()
        .expect("history")
        .iter()
        .filter_map(|op| match op {
            Op::Write {
                path,
                completed: Some(_),
                ..
            } => Some(path.clone()),
            _ => None,
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let (servers, history_for_auditor, done_for_auditor, recorder) = (
        servers.to_vec(),
        history.clone(),
        done.clone(),
        cluster.recorder().clone(),
    );
    cluster.client("auditor", async move {
        let deadline = tokio::time::Instant::now() + AUDIT_BOUND;
        for path in acknowledged {
            for (server, addr) in &servers {
                // A failed read (a connection found dead, a barrier timing out) is retried
                // until the bound; only an answer counts.
                loop {
                    let invoked = now();
                    let answer = call(*addr, "GET", &format!("/v1/var/{path}"), None).await;
                    let completed = now();
                    match &answer {
                        Ok(answer) if answer.status == 200 || answer.status == 404 => {
                            history_for_auditor.lock().expect("history").push(Op::Read {
                                path: path.clone(),
                                server: server.clone(),
                                invoked,
                                completed,
                                present: answer.status == 200,
                            });
                            break;
                        }
                        _ if tokio::time::Instant::now() < deadline => {
                            recorder.note(format!("auditor GET {path} via {server}: {}", describe(&answer)));
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        _ => {
                            recorder.violate(
                                "acknowledged writes read back",
                                format!(
                                    "GET {path} via {server} still fails {AUDIT_BOUND:?} after the run: {}",
                                    describe(&answer)
                                ),
                            );
                            break;
                        }
                    }
                }
            }
        }
        done_for_auditor.store(true, Ordering::SeqCst);
        Ok(())
    });
    match cluster.step_until(AUDIT_BOUND * 4, |_| done.load(Ordering::SeqCst)) {
        Ok(true) => {}
        Ok(false) => cluster
            .recorder()
            .violate("acknowledged writes read back", "the audit did not finish".to_string()),
        Err(error) => cluster.recorder().violate("the simulation runs", error),
    }
}
