//! Runs one (scenario, seed): builds the plan, starts the cluster inside a fresh madsim
//! runtime, plays the fault schedule with a write workload, then the quiet phase, and returns
//! the trace and every violation found.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::fsm::ServerState;
use drover_io_sim::cluster::{ClientSpec, ServerReader, ServerSpec, SimCluster};
use drover_io_sim::consul::{ConsulMode, SimConsul};
use drover_io_sim::csi::PluginMode;
use drover_io_sim::disk::DiskProbe;
use drover_io_sim::invariants::linearizable::{self, Op};
use drover_io_sim::invariants::{liveness, state_equal};
use drover_io_sim::trace::{Recorder, Violation};
use rand::{Rng, SeedableRng};
use rand_chacha_03::ChaCha8Rng;

use crate::coverage::{RunCoverage, plan_faults};
use crate::knobs::Knobs;
use crate::real_clients::{self, RealClientPlan};
use crate::scenarios::{self, Action, Options, Plan, Scenario, Step, Target};
use crate::shrink::Trim;
use crate::volume_churn::{self, Churn};
use drover_io_sim::coverage::CoverageCounter;

/// Set by `--log`: agent logs go to the global subscriber, and no run counts coverage.
pub static AGENT_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
const LIVENESS_POLL: Duration = Duration::from_millis(200);
/// How long the volume churn gets, once quiet, to finish the operation under way.
const CHURN_BOUND: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct Report {
    pub scenario: &'static str,
    pub seed: u64,
    pub trace: String,
    pub violations: Vec<Violation>,
    pub schedule: Vec<String>,
    /// Virtual seconds simulated.
    pub virtual_secs: u64,
    /// Fault kinds played, invariant checks made, state machine transitions reached.
    pub coverage: RunCoverage,
    /// Write attempts the workload made in the fault phase (each an event a shrink may drop).
    pub fault_writes: u64,
    /// Real time the run took (on this machine: not part of the trace).
    pub wall: std::time::Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A stable per-scenario salt so every scenario explores a different schedule for one seed.
fn salt(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn plan_for(scenario: &Scenario, seed: u64, options: &Options) -> Plan {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ salt(scenario.name));
    let mut plan = (scenario.build)(&mut rng, options);
    if let Some(real) = &mut plan.real_clients {
        real.client_faults = options.client_faults;
    }
    with_knobs(&mut plan, Knobs::draw(seed ^ salt(scenario.name)));
    plan
}

/// Runs every server of `plan`, those it adds later included, with `knobs`' timings, and
/// gives the checks that wait on them the time those timings take.
pub fn with_knobs(plan: &mut Plan, mut knobs: Knobs) {
    if let Some(threshold) = plan.snapshot_threshold {
        knobs.snapshot_threshold = threshold;
    }
    if let Some(interval) = plan.snapshot_interval {
        knobs.snapshot_interval = interval;
    }
    for spec in &mut plan.servers {
        knobs.apply(&mut spec.config.server);
    }
    for step in &mut plan.steps {
        if let Action::AddServer(spec) = &mut step.action {
            knobs.apply(&mut spec.config.server);
        }
    }
    stretch_client_outages(&mut plan.steps, &knobs);
    plan.quiet_bound += knobs.settle_extra();
    plan.handover_bound = plan.handover_bound.map(|bound| bound * knobs.raft_multiplier);
    plan.knobs = Some(knobs);
}

/// Ends every client outage where `knobs` keep what it was drawn to do ([`Knobs::outage_end`]).
fn stretch_client_outages(steps: &mut [Step], knobs: &Knobs) {
    for start in 0..steps.len() {
        let (Action::KillClient(client) | Action::RebootClient(client)) = steps[start].action else {
            continue;
        };
        let began = steps[start].at;
        let restart = steps[start + 1..]
            .iter_mut()
            .find(|step| matches!(step.action, Action::RestartClient(c) if c == client));
        if let Some(restart) = restart {
            restart.at = knobs.outage_end(began, restart.at);
        }
    }
    steps.sort_by_key(|step| step.at);
}

/// A client node running the production client driver, pointed at the plan's servers.
fn real_client(plan: &Plan, index: usize) -> ClientSpec {
    let mut spec = real_client_spec(&plan.servers, index);
    if let Some(real) = &plan.real_clients {
        spec.plugin_faults = real.plugin_faults.clone();
        spec.csi_topology = crate::zones::segments(real, index);
        spec.config.client.faults = real.client_faults;
        spec.task_files = real.planted_links;
        if real.containers {
            spec.container_images = Some(vec![crate::real_clients::CONTAINER_IMAGE.to_string()]);
        }
        if real.connect() {
            // With a Consul ACL token, Connect sidecars get service identity tokens.
            spec.config.consul.address = Some("127.0.0.1:8500".into());
            spec.config.consul.token = Some("sim-agent-token".into());
        }
    }
    spec
}

/// A client node running the production client driver, pointed at `servers`.
pub fn real_client_spec(servers: &[ServerSpec], index: usize) -> ClientSpec {
    let mut spec = scenarios::client(index);
    spec.config.client.servers = servers
        .iter()
        .map(|server| format!("{}:{}", server.ip, server.config.ports.rpc))
        .collect();
    spec
}

/// Advances process-global counters that dependencies seed their own randomness from (tokio
/// hashes one into every thread's `select!` generator), by an amount that varies with `seed`,
/// so a replay runs after a different process history than the run it replays.
pub fn perturb_process_history(seed: u64) {
    for _ in 0..=seed % 5 {
        let _ = std_tokio::runtime::Builder::new_current_thread();
    }
}

/// A real tokio runtime whose random generator comes from `seed`, for the run to execute
/// inside. madsim replaces tokio's executor, time and network but not its `select!`: an
/// unbiased `select!` (openraft's replication backoff has one) picks its first branch with
/// tokio's thread generator, which outside a seeded runtime is seeded from a process-global
/// counter, so a replay later in the process could pick differently. The run is polled
/// `unconstrained` so tokio's cooperative budget, which would otherwise start counting inside
/// this runtime, never makes a channel look empty. Needs `--cfg tokio_unstable`.
fn seeded_tokio_context(seed: u64) -> std_tokio::runtime::Runtime {
    std_tokio::runtime::Builder::new_current_thread()
        .rng_seed(std_tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
        .build()
        .expect("a current-thread tokio runtime without I/O or timers always builds")
}

/// Runs in a fresh thread so nothing (thread-local hash keys included) leaks between runs.
pub fn run(scenario: &'static Scenario, seed: u64, options: Options) -> Report {
    run_trimmed(scenario, seed, options, &Trim::default())
}

/// Runs the seed's plan without the events `trim` leaves out (a shrunk schedule).
pub fn run_trimmed(scenario: &'static Scenario, seed: u64, options: Options, trim: &Trim) -> Report {
    // Read outside the simulated world, whose clock is virtual.
    let started = std::time::Instant::now();
    let mut plan = plan_for(scenario, seed, &options);
    trim.apply(&mut plan);
    let dropped_writes = trim.writes.clone();
    let mut schedule = plan.schedule();
    if !dropped_writes.is_empty() {
        schedule.push(format!(
            "workload: {} write attempts left out ({})",
            dropped_writes.len(),
            ranges(&dropped_writes)
        ));
    }
    let attempts = Arc::new(AtomicU64::new(0));
    let attempts_out = attempts.clone();

    let faults = plan_faults(&plan);
    let counter = CoverageCounter::default();
    let counting = counter.clone();
    // The recorder lives outside the simulation thread so a run that panics still reports
    // the trace and every violation recorded before the panic.
    let recorder_slot: Arc<Mutex<Option<Recorder>>> = Arc::new(Mutex::new(None));
    let slot = recorder_slot.clone();
    let probes: Arc<Mutex<Vec<DiskProbe>>> = Arc::new(Mutex::new(Vec::new()));
    let probes_out = probes.clone();
    let result = std::thread::Builder::new()
        .name(format!("{}-{seed}", scenario.name))
        .spawn(move || {
            // madsim first: it seeds this thread's std hash keys, which only works before the
            // thread's first `HashMap`.
            let mut runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
            // Templates render through gtmpl, whose lexer runs on a thread of its own (Go's
            // lexer goroutine, ported) and hands back tokens over a channel it then joins: pure
            // work, so a run that renders them allows system threads and stays deterministic
            // (each run is replayed and compared).
            if plan
                .real_clients
                .as_ref()
                .is_some_and(|real| real.planted_links.is_some())
            {
                runtime.set_allow_system_thread(true);
            }
            // The core's coverage events, counted for this run (unless `--log` installed a
            // global subscriber to print agent logs: then they go there).
            let _counting = (!AGENT_LOGS.load(std::sync::atomic::Ordering::Relaxed))
                .then(|| tracing::subscriber::set_default(counting));
            let seeded = seeded_tokio_context(seed);
            drover_io_real::buggify::enable(plan.buggify.clone());
            let result = seeded.block_on(std_tokio::task::unconstrained(async {
                let workload = (seed ^ salt(scenario.name), dropped_writes, attempts_out);
                runtime.block_on(play(plan, workload, slot, probes_out))
            }));
            drop(runtime);
            (result, drover_io_real::buggify::fired())
        })
        .expect("spawn simulation thread")
        .join();
    // A run that panicked fired what it fired too, but its thread took the counts with it.
    let (result, injected) = match result {
        Ok((result, injected)) => (Ok(result), injected),
        Err(panic) => (Err(panic), BTreeMap::new()),
    };
    // Thousands of seeds per process only work if each run frees its world.
    let leaked = probes
        .lock()
        .expect("probes lock")
        .iter()
        .filter(|probe| probe.is_alive())
        .count();
    let leak = (leaked > 0).then(|| Violation {
        invariant: "the simulated world is freed after the run",
        detail: format!("{leaked} simulated disks outlived their runtime"),
        at_line: 0,
    });
    let recorder = recorder_slot.lock().expect("recorder slot").take();
    let mut faults = faults;
    faults.extend(injected.keys().filter_map(|point| crate::coverage::buggify_kind(point)));
    let coverage = RunCoverage {
        faults,
        checks: recorder.as_ref().map(Recorder::checks).unwrap_or_default(),
        reached: counter.counts(),
    };
    let fault_writes = attempts.load(AtomicOrdering::SeqCst);
    let wall = started.elapsed();
    match result {
        Ok((trace, mut violations, virtual_secs)) => {
            violations.extend(leak);
            Report {
                scenario: scenario.name,
                seed,
                trace,
                violations,
                schedule,
                virtual_secs,
                coverage,
                fault_writes,
                wall,
            }
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            let (trace, mut violations) = match recorder {
                Some(recorder) => (recorder.text(), recorder.violations()),
                None => (String::new(), Vec::new()),
            };
            violations.push(Violation {
                invariant: "no panic",
                detail: message,
                at_line: trace.lines().count(),
            });
            Report {
                scenario: scenario.name,
                seed,
                trace,
                violations,
                schedule,
                virtual_secs: 0,
                coverage,
                fault_writes,
                wall,
            }
        }
    }
}

/// `0..=4, 7, 9..=12` for {0, 1, 2, 3, 4, 7, 9, 10, 11, 12}.
fn ranges(numbers: &BTreeSet<u64>) -> String {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for &number in numbers {
        match spans.last_mut() {
            Some((_, end)) if *end + 1 == number => *end = number,
            _ => spans.push((number, number)),
        }
    }
    spans
        .iter()
        .map(|(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}..={end}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

struct Workload {
    rng: ChaCha8Rng,
    next_write_at: tokio::time::Instant,
    written: u64,
    acked: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Writes acknowledged in the quiet phase.
    quiet_acked: u64,
    /// Every write and consistent read of the run, for the linearizability check.
    history: Arc<Mutex<Vec<Op>>>,
    start: tokio::time::Instant,
    /// Fault-phase write attempts so far: each draws the same numbers whether or not it is
    /// made, so leaving one out changes no other.
    attempts: Arc<AtomicU64>,
    /// Attempts a shrunk schedule leaves out.
    dropped: BTreeSet<u64>,
    /// Fault-phase writes (with their read-back) still running.
    in_flight: Arc<AtomicU64>,
    /// Values are sealed under the root keyring before they are proposed, and each read-back
    /// opens what it finds (`Plan::sealed_writes`).
    sealed: bool,
}

/// Counts one running write for as long as it lives.
struct InFlight(Arc<AtomicU64>);

impl InFlight {
    fn new(count: &Arc<AtomicU64>) -> Self {
        count.fetch_add(1, AtomicOrdering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AtomicOrdering::SeqCst);
    }
}

async fn play(
    plan: Plan,
    (workload_seed, dropped, attempts): (u64, BTreeSet<u64>, Arc<AtomicU64>),
    slot: Arc<Mutex<Option<Recorder>>>,
    probes: Arc<Mutex<Vec<DiskProbe>>>,
) -> (String, Vec<Violation>, u64) {
    let recorder = Recorder::new();
    if let Some(knobs) = plan.knobs {
        recorder.note(knobs.to_string());
    }
    if let Some(bound) = plan.election_rounds {
        recorder.add_invariant(Box::new(drover_io_sim::invariants::elections::ElectionRounds::new(
            bound,
        )));
    }
    if let Some((from, until)) = plan.stable_leader {
        recorder.add_invariant(Box::new(drover_io_sim::invariants::elections::StableLeader::new(
            from, until,
        )));
    }
    *slot.lock().expect("recorder slot") = Some(recorder.clone());
    let consul = SimConsul::default();
    consul.set_mode(plan.consul_initial);
    let mut cluster = SimCluster::new(recorder.clone(), consul);
    for spec in plan.servers.iter().cloned() {
        cluster.add_server(spec);
    }
    let start = tokio::time::Instant::now();
    let mut lost: Vec<usize> = Vec::new();
    if let Some(real) = &plan.real_clients {
        for index in 0..real.clients - real.late_clients {
            cluster.add_client(real_client(&plan, index));
        }
        wait_for_leader(&cluster, Duration::from_secs(30)).await;
        if let Err(error) = real_clients::register(&cluster, real).await {
            recorder.violate("the jobs can be registered", error);
        }
    }
    if plan.acl {
        bootstrap_acl(&mut cluster, workload_seed).await;
    }
    let mut workload = Workload {
        rng: ChaCha8Rng::seed_from_u64(workload_seed.rotate_left(17)),
        next_write_at: start + Duration::from_secs(2),
        written: 0,
        acked: Arc::new(Mutex::new(BTreeMap::new())),
        quiet_acked: 0,
        history: Arc::default(),
        start,
        attempts,
        dropped,
        in_flight: Arc::default(),
        sealed: plan.sealed_writes,
    };
    let mut churn = plan
        .real_clients
        .as_ref()
        .filter(|real| real.volume_churn)
        .map(|_| Churn::new(workload_seed, start));
    let mut last_killed: Option<usize> = None;
    // The check-and-set writers' checks, each made once its writers are done.
    let mut cas_checks = Vec::new();
    recorder.note("fault phase");
    for (index, step) in plan.steps.iter().enumerate() {
        advance(
            &cluster,
            &mut workload,
            churn.as_mut(),
            plan.real_clients.as_ref(),
            start + step.at,
        )
        .await;
        if plan.skipped.contains(&index) {
            if let Action::ReadStorm { .. } | Action::CasWriters { .. } = step.action {
                // The storm's seed is drawn all the same: later writes stay as they were.
                let _ = workload.rng.r#gen::<u64>();
            }
            continue;
        }
        match &step.action {
            Action::Kill { target, crash } => {
                if let Some(index) = resolve(&cluster, *target, last_killed) {
                    cluster.kill(index, *crash);
                    last_killed = Some(index);
                }
            }
            Action::Restart(target) => {
                if let Some(index) = resolve(&cluster, *target, last_killed) {
                    cluster.restart(index);
                }
            }
            Action::StopGracefully(target) => {
                if let Some(index) = resolve(&cluster, *target, last_killed) {
                    let stopped = tokio::time::Instant::now();
                    let old = cluster.agent(index).map(|agent| {
                        let term = agent.status().raft.map_or(0, |raft| raft.term);
                        (agent.node_id(), term)
                    });
                    cluster.stop_gracefully(index).await;
                    last_killed = Some(index);
                    if let (Some(bound), Some(old)) = (plan.handover_bound, old) {
                        check_handover(&cluster, old, stopped, bound).await;
                    }
                }
            }
            Action::Partition(side) => cluster.partition(side),
            Action::ClogOneWay(from, to) => cluster.clog_one_way(*from, *to),
            Action::Bridge(a, b) => cluster.bridge(*a, *b),
            Action::BridgeFromFollower(server) => {
                let leader = resolve(&cluster, Target::Leader, last_killed);
                match (0..cluster.len()).find(|other| other != server && Some(*other) != leader) {
                    Some(follower) => cluster.bridge(*server, follower),
                    None => recorder.note("no follower to cut a server apart from"),
                }
            }
            Action::PartitionLastStanding => {
                let running: Vec<usize> = (0..cluster.len()).filter(|index| cluster.is_alive(*index)).collect();
                match running[..] {
                    [last] => cluster.partition(&[last]),
                    _ => recorder.note(format!("{} servers running: none is the last standing", running.len())),
                }
            }
            Action::DiskFault(server, fault) => cluster.set_disk_fault(*server, *fault),
            Action::Heal => cluster.heal(),
            Action::Consul(mode) => {
                cluster.consul().set_mode(*mode);
                recorder.note(format!("consul {mode:?}"));
            }
            Action::EnvoyRefused(refused) => {
                cluster.consul().refuse_envoy_bootstrap(*refused);
                recorder.note(format!("consul refuses envoy bootstrap: {refused}"));
            }
            Action::AddServer(spec) => {
                let index = cluster.add_server((**spec).clone());
                recorder.note(format!("add server {}", cluster.name(index)));
            }
            Action::NodeDown(client) => {
                cluster.lose_client(*client);
                lost.push(*client);
            }
            Action::Plugin(client, mode) => {
                cluster.plugins(*client).set(*mode);
                recorder.note(format!("plugin on {} {mode:?}", cluster.client_name(*client)));
            }
            Action::LoseJobNode => {
                let client = plan
                    .real_clients
                    .as_ref()
                    .and_then(|real| real_clients::job_client(&cluster, real));
                match client {
                    Some(client) => {
                        cluster.lose_client(client);
                        lost.push(client);
                    }
                    None => recorder.note("no running allocation to lose a node under"),
                }
            }
            Action::DrainJobNode => {
                if let Some(real) = &plan.real_clients {
                    real_clients::drain_job_node(&cluster, real);
                }
            }
            Action::KillClient(client) => cluster.kill_client(*client),
            Action::RebootClient(client) => cluster.reboot_client(*client),
            Action::WallClock(machine, ms) => cluster.set_wall_clock(*machine, *ms),
            Action::ClockJump(machine, by) => cluster.jump_clock(*machine, *by),
            Action::FailTaskStarts(client, count) => cluster.host(*client).fail_next_starts(*count),
            Action::Engine(client, mode) => match cluster.engine(*client) {
                Some(engine) => engine.set_mode(*mode),
                None => recorder.note(format!("{} has no container engine", cluster.client_name(*client))),
            },
            Action::OomKill(client, pick) => {
                if cluster.host(*client).oom_kill(*pick).is_none() {
                    recorder.note(format!("no task runs on {} to OOM kill", cluster.client_name(*client)));
                }
            }
            Action::Network(loss, (low, high)) => {
                let (loss, latency) = (
                    f64::from(*loss) / 100.0,
                    Duration::from_millis(*low)..Duration::from_millis(*high),
                );
                madsim::net::NetSim::current().update_config(|config| {
                    config.packet_loss_rate = loss;
                    config.send_latency = latency;
                });
                recorder.note(format!("network: {loss} loss, {low}-{high} ms latency"));
            }
            Action::UpdateJob(version) => {
                if let Some(real) = &plan.real_clients {
                    real_clients::update(&cluster, real, *version).await;
                }
            }
            Action::RestartClient(client) => cluster.restart_client(*client),
            Action::GcAllocs => real_clients::gc_allocs(&cluster).await,
            Action::RogueWrite(target) => {
                if let Some(index) = resolve(&cluster, *target, last_killed) {
                    cluster.rogue_direct_write(index);
                }
            }
            Action::RogueCalls(target) => {
                if let Some(index) = resolve(&cluster, *target, last_killed) {
                    // What it tries to read: variables the workload wrote.
                    let mut victims: Vec<String> =
                        workload.acked.lock().expect("acked").keys().take(3).cloned().collect();
                    if victims.is_empty() {
                        victims.push("w0".to_string());
                    }
                    cluster.rogue_server_calls(index, victims);
                }
            }
            Action::ReadStorm {
                per_second,
                lasting,
                all_answered,
            } => {
                let seed = workload.rng.r#gen::<u64>();
                read_storm(&cluster, seed, *per_second, *lasting, *all_answered);
            }
            Action::CasWriters { writers, lasting } => {
                let seed = workload.rng.r#gen::<u64>();
                cas_checks.push(crate::cas_writers::spawn(&cluster, seed, *writers, *lasting));
            }
            Action::JoinLateClients => {
                if let Some(real) = &plan.real_clients {
                    for index in real.clients - real.late_clients..real.clients {
                        let client = cluster.add_client(real_client(&plan, index));
                        recorder.note(format!("late client {} joins", cluster.client_name(client)));
                    }
                }
            }
        }
    }
    advance(
        &cluster,
        &mut workload,
        churn.as_mut(),
        plan.real_clients.as_ref(),
        start + plan.fault_phase_end(),
    )
    .await;

    recorder.note("quiet phase");
    drover_io_real::buggify::disable();
    cluster.heal();
    cluster.heal_disks();
    cluster.consul().set_mode(ConsulMode::Healthy);
    cluster.consul().refuse_envoy_bootstrap(false);
    for client in 0..cluster.client_count() {
        cluster.plugins(client).set(PluginMode::Healthy);
    }
    let keep_dead: Vec<usize> = plan
        .keep_dead
        .iter()
        .filter_map(|target| resolve(&cluster, *target, last_killed))
        .collect();
    for index in 0..cluster.len() {
        if !cluster.is_alive(index) && !keep_dead.contains(&index) {
            cluster.restart(index);
        }
    }
    // Killed agents start again; lost machines stay lost (their nodes stay down).
    for client in (0..cluster.client_count()).filter(|client| !lost.contains(client)) {
        cluster.restart_client(client);
    }
    let quiet_start = tokio::time::Instant::now();
    let deadline = quiet_start + plan.quiet_bound;
    let leader = loop {
        let statuses = cluster.live_statuses();
        let expected = (0..cluster.len()).filter(|index| cluster.is_alive(*index)).count();
        let verdict = if statuses.len() < expected {
            Err(format!("{} of {expected} live servers have started", statuses.len()))
        } else {
            liveness::common_leader(&statuses)
        };
        match verdict {
            Ok(leader) => break Some(leader),
            Err(why) if tokio::time::Instant::now() >= deadline => {
                recorder.violate(
                    "liveness: a leader known on every live server",
                    format!("not within {:?} of the quiet phase: {why}", plan.quiet_bound),
                );
                break None;
            }
            Err(_) => tokio::time::sleep(LIVENESS_POLL).await,
        }
    };
    recorder.checked("liveness: a leader known on every live server", 1);
    if let Some(leader) = leader {
        check_one_configuration(&cluster, &recorder, leader, plan.dead_removed, deadline).await;
        let elapsed = tokio::time::Instant::now().saturating_duration_since(quiet_start);
        recorder.note(format!(
            "leader {leader} known everywhere after {} ms of quiet",
            elapsed.as_millis()
        ));
        if let Some(churn) = &mut churn {
            churn
                .finish(
                    &cluster,
                    &recorder,
                    deadline.max(tokio::time::Instant::now() + CHURN_BOUND),
                )
                .await;
        }
        if let Some(real) = &plan.real_clients {
            real_clients::check_end(&cluster, &recorder, real, leader, deadline).await;
            if real.create_volumes || real.volume_churn {
                volume_churn::check_storage(&cluster, &recorder, leader);
            }
            if !real.volume_zones.is_empty() {
                crate::zones::check_placements(&cluster, &recorder, real, leader);
            }
        }
        // Every scenario: writes made once quiet must be acknowledged, nothing acknowledged
        // may be lost, and every server must end up with the leader's exact state; none of
        // these may pass by comparing nothing.
        quiet_writes(&cluster, &mut workload).await;
        check_acknowledged_writes(&cluster, &recorder, &workload, leader).await;
        for check in cas_checks.drain(..) {
            if tokio::time::timeout(Duration::from_secs(60), check).await.is_err() {
                recorder.violate(
                    "liveness: the check-and-set writers finish",
                    "their check was not made within 60 s of the quiet phase's checks".to_string(),
                );
            }
        }
        check_state_equal(&cluster, &recorder, leader, deadline).await;
        if plan
            .played_steps()
            .any(|step| matches!(step.action, Action::RogueCalls(_)))
        {
            check_rogue_left_nothing(&cluster, &recorder, leader);
        }
    }
    check_linearizable(&recorder, &workload);
    let virtual_secs = tokio::time::Instant::now().saturating_duration_since(start).as_secs();
    let result = (recorder.text(), recorder.violations(), virtual_secs);
    *probes.lock().expect("probes lock") = cluster.disk_probes();
    cluster.shutdown().await;
    result
}

fn resolve(cluster: &SimCluster, target: Target, last_killed: Option<usize>) -> Option<usize> {
    match target {
        Target::Server(index) => Some(index),
        Target::LastKilled => last_killed,
        Target::Leader => cluster.live_statuses().iter().find_map(|(name, id, status)| {
            let leads = status
                .raft
                .as_ref()
                .is_some_and(|raft| raft.leader.as_ref().is_some_and(|(leader, _)| leader == id));
            leads.then(|| (0..cluster.len()).find(|index| cluster.name(*index) == name))?
        }),
    }
}

/// The workload until `until`, and beside it the volume churn when the plan has one.
async fn advance(
    cluster: &SimCluster,
    workload: &mut Workload,
    churn: Option<&mut Churn>,
    real: Option<&RealClientPlan>,
    until: tokio::time::Instant,
) {
    match churn {
        Some(churn) => {
            tokio::join!(
                drive_workload(cluster, workload, real, until),
                churn.run_until(cluster, until)
            );
        }
        None => drive_workload(cluster, workload, real, until).await,
    }
}

/// Issues writes to random live servers at seeded intervals until `until`; with a plan that
/// asks for it, now and then an operator's attempt to deregister a claimed volume.
async fn drive_workload(
    cluster: &SimCluster,
    workload: &mut Workload,
    real: Option<&RealClientPlan>,
    until: tokio::time::Instant,
) {
    loop {
        if workload.next_write_at > until {
            tokio::time::sleep_until(until).await;
            return;
        }
        tokio::time::sleep_until(workload.next_write_at).await;
        workload.next_write_at += Duration::from_millis(workload.rng.gen_range(300..2_000));
        let deregister = (real.is_some_and(|real| real.deregister_attempts) && workload.rng.gen_bool(0.2))
            .then(|| workload.rng.r#gen::<u16>() as usize);
        let index = workload.rng.gen_range(0..cluster.len());
        let reader = workload.rng.gen_range(0..cluster.len());
        let attempt = workload.attempts.fetch_add(1, AtomicOrdering::SeqCst);
        if workload.dropped.contains(&attempt) {
            continue;
        }
        if let Some(pick) = deregister {
            real_clients::deregister_attempt(cluster, pick).await;
        }
        let invoked = workload.start.elapsed();
        let Some(write) = cluster.start_write_sealed(
            index,
            format!("w/{}", workload.written),
            workload.written.to_string(),
            WRITE_TIMEOUT,
            workload.sealed,
        ) else {
            continue;
        };
        let expected = workload.written.to_string();
        let path = format!("w/{}", workload.written);
        workload.written += 1;
        let acked = workload.acked.clone();
        let history = workload.history.clone();
        let start = workload.start;
        let recorder = cluster.recorder().clone();
        let name = cluster.name(index).to_string();
        let read_via = cluster.name(reader).to_string();
        // Read back at once, through another random server: its answer must hold the write.
        let sealed = workload.sealed;
        let read = {
            let (path, reader, recorder) = (path.clone(), cluster.reader(reader), cluster.recorder().clone());
            move || {
                if !sealed {
                    return reader
                        .start_read(path, WRITE_TIMEOUT)
                        .map(|read| Box::pin(read) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>);
                }
                // A sealed value must open, on whichever server reads it, to what was written.
                let open = reader.start_open(path.clone(), WRITE_TIMEOUT)?;
                Some(Box::pin(async move {
                    let value = open.await?;
                    if let Some(value) = &value
                        && *value != expected
                    {
                        recorder.violate(
                            "sealed values open to what was written",
                            format!("{path} opened to {value:?}, {expected:?} was written"),
                        );
                    }
                    Ok(value.is_some())
                })
                    as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>)
            }
        };
        let running = InFlight::new(&workload.in_flight);
        tokio::spawn(async move {
            let _running = running;
            let completed = match write.await {
                Ok(log_index) => {
                    recorder.note(format!("write {path} via {name} acknowledged at index {log_index}"));
                    acked.lock().expect("acked lock").insert(path.clone(), log_index);
                    Some(start.elapsed())
                }
                Err(error) => {
                    recorder.note(format!("write {path} via {name} failed: {error}"));
                    None
                }
            };
            history.lock().expect("history lock").push(Op::Write {
                path: path.clone(),
                invoked,
                completed,
            });
            if completed.is_none() {
                return;
            }
            let Some(read) = read() else { return };
            let invoked = start.elapsed();
            match read.await {
                Ok(present) => history.lock().expect("history lock").push(Op::Read {
                    path,
                    server: read_via,
                    invoked,
                    completed: start.elapsed(),
                    present,
                }),
                Err(error) => recorder.note(format!("consistent read of {path} via {read_via} failed: {error}")),
            }
        });
    }
}

/// After a graceful stop of server `old` (leading in term `old_term`) that began at `stopped`:
/// the survivors must agree on a new leader within `bound` (polled every millisecond of
/// virtual time), elected in the very next term — one round, the successor's.
async fn check_handover(
    cluster: &SimCluster,
    (old, old_term): (u64, u64),
    stopped: tokio::time::Instant,
    bound: Duration,
) {
    let recorder = cluster.recorder();
    loop {
        let waited = stopped.elapsed();
        let live = cluster.live_statuses();
        let agreed = liveness::common_leader(&live).ok();
        if let Some(leader) = agreed.filter(|leader| *leader != old) {
            let term = live
                .iter()
                .find(|(_, id, _)| *id == leader)
                .and_then(|(_, _, status)| status.raft.as_ref().map(|raft| raft.term))
                .unwrap_or(0);
            recorder.note(format!(
                "new leader {leader} in term {term} {} ms after the graceful stop began (term {old_term})",
                waited.as_millis()
            ));
            if term != old_term + 1 {
                recorder.violate(
                    "a graceful stop hands leadership over in one election round",
                    format!("the leader of term {old_term} stopped; the next leader was elected in term {term}"),
                );
            }
            return;
        }
        if waited > bound {
            recorder.violate(
                "a graceful stop hands leadership over in time",
                format!(
                    "no common leader {} ms after the leader began stopping",
                    waited.as_millis()
                ),
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Starts consistent reads through random servers, `per_second` of them for `lasting`, each
/// in its own task; when the storm is over (and the last read had its time), how many were
/// answered goes in the trace, and with `all_answered` an unanswered one is a violation
/// (nothing but reads happens meanwhile, so every read has a leader to ask).
fn read_storm(cluster: &SimCluster, seed: u64, per_second: u32, lasting: Duration, all_answered: bool) {
    let readers: Vec<ServerReader> = (0..cluster.len()).map(|index| cluster.reader(index)).collect();
    let names: Vec<String> = (0..cluster.len())
        .map(|index| cluster.name(index).to_string())
        .collect();
    let recorder = cluster.recorder().clone();
    let every = Duration::from_secs(1) / per_second.max(1);
    tokio::spawn(async move {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let answered = Arc::new(Mutex::new((0u64, Vec::<String>::new())));
        let until = tokio::time::Instant::now() + lasting;
        let mut next = tokio::time::Instant::now();
        while next < until {
            tokio::time::sleep_until(next).await;
            next += every;
            let index = rng.gen_range(0..readers.len());
            let Some(read) = readers[index].start_read("w/0".to_string(), WRITE_TIMEOUT) else {
                continue;
            };
            let (answered, name) = (answered.clone(), names[index].clone());
            tokio::spawn(async move {
                let outcome = read.await;
                let mut answered = answered.lock().expect("storm lock");
                match outcome {
                    Ok(_) => answered.0 += 1,
                    Err(error) => answered.1.push(format!("via {name}: {error}")),
                }
            });
        }
        tokio::time::sleep(WRITE_TIMEOUT + Duration::from_secs(1)).await;
        let (ok, failed) = answered.lock().expect("storm lock").clone();
        recorder.note(format!(
            "read storm over: {ok} consistent reads answered, {} not",
            failed.len()
        ));
        if let Some(first) = failed.first().filter(|_| all_answered) {
            recorder.violate(
                "every consistent read of a read storm is answered",
                format!(
                    "{} of {} failed, the first {first}",
                    failed.len(),
                    ok + failed.len() as u64
                ),
            );
        }
    });
}

pub(crate) async fn wait_for_leader(cluster: &SimCluster, bound: Duration) {
    let deadline = tokio::time::Instant::now() + bound;
    while tokio::time::Instant::now() < deadline {
        if liveness::common_leader(&cluster.live_statuses()).is_ok() {
            return;
        }
        tokio::time::sleep(LIVENESS_POLL).await;
    }
}

/// With ACLs on, the management token the workload's writes carry, made through the first
/// leader (retried until a leader takes it).
async fn bootstrap_acl(cluster: &mut SimCluster, seed: u64) {
    let secret = format!("{:08x}-0000-4000-8000-{:012x}", seed >> 32, seed & 0xffff_ffff_ffff);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        wait_for_leader(cluster, Duration::from_secs(5)).await;
        if let Some(index) = resolve(cluster, Target::Leader, None) {
            match cluster.bootstrap_acl(index, secret.clone()).await {
                Ok(at) => {
                    cluster.recorder().note(format!("ACLs bootstrapped at index {at}"));
                    return;
                }
                Err(error) => cluster.recorder().note(format!("ACL bootstrap: {error}")),
            }
        }
        tokio::time::sleep(LIVENESS_POLL).await;
    }
    cluster.recorder().violate(
        "liveness: ACLs can be bootstrapped",
        "no leader took the bootstrap within 60 s".to_string(),
    );
}

/// Nothing a rogue's token-only calls would have left is in the leader's state: no variable
/// or job of its naming, not its autopilot settings (a force-leave would show in the
/// configuration check, a purge has no job to take here: their answers are checked).
fn check_rogue_left_nothing(cluster: &SimCluster, recorder: &Recorder, leader: u64) {
    const INVARIANT: &str = drover_io_sim::rogue::CALLS_REFUSED;
    let Some(state) = leader_state(cluster, leader) else {
        return;
    };
    let mut marks: Vec<String> = state
        .variables()
        .filter(|variable| variable.path.starts_with("rogue"))
        .map(|variable| format!("variable {}", variable.path))
        .collect();
    marks.extend(
        state
            .jobs()
            .filter(|job| job.id.starts_with("rogue"))
            .map(|job| format!("job {}", job.id)),
    );
    if state
        .autopilot_config()
        .is_some_and(|config| config.max_trailing_logs == drover_io_sim::rogue::ROGUE_TRAILING_LOGS)
    {
        marks.push("the rogue's autopilot settings".to_string());
    }
    recorder.checked(INVARIANT, 1);
    if !marks.is_empty() {
        recorder.violate(INVARIANT, format!("the leader's state holds {}", marks.join(", ")));
    }
}

fn leader_state(cluster: &SimCluster, leader: u64) -> Option<ServerState> {
    (0..cluster.len())
        .filter_map(|index| cluster.agent(index))
        .find(|agent| agent.node_id() == leader)
        .and_then(|agent| agent.read_state(Clone::clone))
}

/// Writes made once the cluster is quiet (a leader known everywhere) through each live server
/// in turn, added to the acknowledged set: the check below then always has writes to look for.
async fn quiet_writes(cluster: &SimCluster, workload: &mut Workload) {
    const QUIET_WRITES: u64 = 3;
    for attempt in 0..QUIET_WRITES * 4 {
        if workload.quiet_acked >= QUIET_WRITES {
            return;
        }
        let index = (attempt as usize) % cluster.len();
        let path = format!("quiet/{attempt}");
        let Some(write) = cluster.start_write(index, path.clone(), attempt.to_string(), WRITE_TIMEOUT) else {
            continue;
        };
        match write.await {
            Ok(log_index) => {
                cluster.recorder().note(format!(
                    "quiet write {path} via {} acknowledged at index {log_index}",
                    cluster.name(index)
                ));
                workload.acked.lock().expect("acked lock").insert(path, log_index);
                workload.quiet_acked += 1;
            }
            Err(error) => cluster.recorder().note(format!(
                "quiet write {path} via {} failed: {error}",
                cluster.name(index)
            )),
        }
    }
}

/// Followers catch up, then hold the leader's state byte for byte (snapshot restore and
/// replication agree). Comparing no follower at all is a failure of the check, not a pass.
async fn check_state_equal(cluster: &SimCluster, recorder: &Recorder, leader: u64, deadline: tokio::time::Instant) {
    let deadline = deadline.max(tokio::time::Instant::now() + Duration::from_secs(10));
    loop {
        let Some(reference) = leader_state(cluster, leader) else {
            recorder.violate(
                "every server holds the leader's state",
                "the leader's state cannot be read".into(),
            );
            return;
        };
        let others: Vec<(String, ServerState)> = (0..cluster.len())
            .filter_map(|index| {
                let agent = cluster.agent(index)?;
                (agent.node_id() != leader)
                    .then(|| agent.read_state(Clone::clone))
                    .flatten()
                    .map(|state| (cluster.name(index).to_string(), state))
            })
            .collect();
        let caught_up = others
            .iter()
            .all(|(_, state)| state.last_applied() == reference.last_applied());
        if caught_up || tokio::time::Instant::now() >= deadline {
            let live = (0..cluster.len()).filter(|index| cluster.is_alive(*index)).count();
            match state_equal::same_state(("leader", &reference), &others) {
                Ok(0) if live > 1 => recorder.violate(
                    "every server holds the leader's state",
                    format!("compared no follower although {live} servers are live"),
                ),
                Ok(compared) => {
                    recorder.checked("every server holds the leader's state", compared as u64);
                    recorder.note(format!("{compared} servers hold the leader's exact state"));
                }
                Err(why) => recorder.violate("snapshot restore and replication give the leader's state", why),
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One cluster, in its final form: within the quiet bound, the leader's configuration holds
/// every live server of the run (late joiners included) as a voter, and no one else but
/// servers that stay dead. With `dead_removed`, those are gone too: autopilot removed them
/// (a dead server stays a voter only until its `server_stabilization_time` has passed).
async fn check_one_configuration(
    cluster: &SimCluster,
    recorder: &Recorder,
    leader: u64,
    dead_removed: bool,
    deadline: tokio::time::Instant,
) {
    const CHECK: &str = "every live server ends up a voter of the one cluster";
    loop {
        let statuses = cluster.live_statuses();
        let live: BTreeSet<u64> = statuses.iter().map(|(_, id, _)| *id).collect();
        let voters: BTreeSet<u64> = statuses
            .iter()
            .find(|(_, id, _)| *id == leader)
            .and_then(|(_, _, status)| status.raft.as_ref())
            .map(|raft| {
                raft.peers
                    .iter()
                    .filter(|(_, (_, voter))| *voter)
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default();
        let shaped = live.is_subset(&voters) && voters.len() <= cluster.len() && (!dead_removed || voters == live);
        if shaped {
            recorder.checked(CHECK, 1);
            recorder.note(format!(
                "the leader has {} voters: the {} live servers{}",
                voters.len(),
                live.len(),
                if voters.len() > live.len() {
                    " and dead ones autopilot has not removed yet"
                } else {
                    ""
                }
            ));
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            recorder.violate(
                CHECK,
                format!(
                    "the leader's voters are {voters:?}, the live servers {live:?} (of {} in the run{})",
                    cluster.len(),
                    if dead_removed { "; the dead must be removed" } else { "" }
                ),
            );
            return;
        }
        tokio::time::sleep(LIVENESS_POLL).await;
    }
}

/// Nothing acknowledged is lost: after the quiet phase the leader has every acknowledged write.
/// The writes and consistent reads of the run form a linearizable history
/// (`invariants::linearizable`): no read through any server missed a write acknowledged before
/// it began.
fn check_linearizable(recorder: &Recorder, workload: &Workload) {
    let history = workload.history.lock().expect("history lock").clone();
    let reads = history.iter().filter(|op| matches!(op, Op::Read { .. })).count();
    recorder.checked("consistent reads are linearizable", reads as u64);
    recorder.note(format!(
        "linearizability: {} writes and {reads} consistent reads checked",
        history.len() - reads
    ));
    for violation in linearizable::check(&history) {
        recorder.violate("consistent reads are linearizable", violation);
    }
}

async fn check_acknowledged_writes(cluster: &SimCluster, recorder: &Recorder, workload: &Workload, leader: u64) {
    // Let in-flight writes settle so the acknowledged set is final: each ends within its
    // timeout, so waiting for the last one is bounded by it.
    let settled_by = tokio::time::Instant::now() + WRITE_TIMEOUT;
    while workload.in_flight.load(AtomicOrdering::SeqCst) > 0 && tokio::time::Instant::now() < settled_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acked = workload.acked.lock().expect("acked lock").clone();
    let Some(agent) = (0..cluster.len())
        .filter_map(|index| cluster.agent(index))
        .find(|agent| agent.node_id() == leader)
    else {
        recorder.violate(
            "nothing acknowledged is lost",
            "the leader's state cannot be read".into(),
        );
        return;
    };
    // A write is acknowledged once applied, but the state this check reads is published a
    // moment later: wait (within the write timeout) until it reaches the newest acknowledged
    // index.
    let newest = acked.values().copied().max().unwrap_or(0);
    let applied_by = tokio::time::Instant::now() + WRITE_TIMEOUT;
    while agent.read_state(|state| state.last_applied()).flatten().unwrap_or(0) < newest
        && tokio::time::Instant::now() < applied_by
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if acked.is_empty() {
        recorder.violate(
            "nothing acknowledged is lost",
            "no write was acknowledged, not even once the cluster was quiet: the check compared nothing".into(),
        );
        return;
    }
    let missing: Vec<String> = agent
        .read_state(|state| {
            acked
                .keys()
                .filter(|path| state.variable(path).is_none())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    recorder.checked("nothing acknowledged is lost", acked.len() as u64);
    if missing.is_empty() {
        recorder.note(format!("all {} acknowledged writes present on the leader", acked.len()));
    } else {
        recorder.violate(
            "nothing acknowledged is lost",
            format!("the leader lacks acknowledged writes {missing:?}"),
        );
    }
}
