//! The coverage table (issue 20 §2): which fault kinds a run's schedule played, how often each
//! invariant was checked, and which states and transitions of the core's state machines the
//! runs reached (counted by `drover_io_sim::coverage` from the core's `cover` events).
//! Printed after every range of runs; `--coverage FILE` writes it as JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use drover_io_sim::consul::ConsulMode;
use drover_io_sim::csi::PluginMode;
use drover_io_sim::disk::Crash;
use drover_io_sim::engine::DaemonMode;

use crate::scenarios::{Action, Plan};

/// What one run covered.
#[derive(Clone, Debug, Default)]
pub struct RunCoverage {
    /// Fault kinds its schedule played.
    pub faults: BTreeSet<&'static str>,
    /// Checks made, by invariant.
    pub checks: BTreeMap<&'static str, u64>,
    /// State machine transitions and rare paths, with how often each was taken.
    pub reached: BTreeMap<String, u64>,
}

/// Every fault kind the scenarios can play, so the table names those no run played.
pub const FAULT_KINDS: &[&str] = &[
    "kill, losing unsynced writes",
    "kill, keeping unsynced writes",
    "restart",
    "graceful stop",
    "partition",
    "one-way clog",
    "bridge partition",
    "disk fsync error",
    "disk full",
    "slow disk",
    "torn writes on power loss",
    "consul down",
    "consul refuses envoy bootstrap",
    "consul hang",
    "consul slow",
    "consul 5xx",
    "consul down during a job stop",
    "server added",
    "client node down",
    "plugin error",
    "plugin hang",
    "plugin slow",
    "plugin error on one call",
    "plugin process crash on a call",
    "stale plugin socket",
    "slow plugin unmount",
    "slow plugin start",
    "job's node lost",
    "late clients join",
    "node drain",
    "client agent killed",
    "client agent restart",
    "job update",
    "allocation GC",
    "packet loss",
    "latency spike",
    "read storm",
    "concurrent check-and-set writers",
    "client certificate makes a server's call",
    "client certificate makes token-only calls",
    "client node power loss",
    "driver start failure",
    "task OOM killed",
    "clock skew",
    "wall clock step",
    "monotonic clock jump",
    "buggify: client rpc unreachable",
    "buggify: csi call unavailable",
    "buggify: csi call slow",
    "buggify: raft message slow",
    "buggify: task recover fails",
    "buggify: task recover slow",
];

/// Transitions and paths the long lane's runs must each reach at least once (its coverage
/// floor): a machine state no run reaches any more means a scenario or a fault stopped doing
/// what it was written for. The long lane names anything reached that is missing here. These
/// are what the long lane's seeds reach, rare paths taken by a handful of runs among them.
pub const EXPECTED_REACHED: &[&str] = &[
    "bootstrap: initializing -> bootstrapped",
    "bootstrap: querying -> bootstrapped",
    "bootstrap: querying -> initializing",
    "bootstrap: querying -> staggered",
    "bootstrap: staggered -> bootstrapped",
    "bootstrap: staggered -> initializing",
    "bootstrap: waiting -> bootstrapped",
    "bootstrap: waiting -> querying",
    "plugin_supervisor: registering -> running",
    "plugin_supervisor: registering -> stopped",
    "plugin_supervisor: running -> stopped",
    "plugin_supervisor: waiting_ready -> registering",
    "plugin_supervisor: waiting_ready -> stopped",
    "point: deployment health: tasks up, consul checks not yet passing",
    "point: group commit: concurrent proposals go out as one entry",
    "task_runner: destroying -> prestart",
    "task_runner: destroying -> restart_delay",
    "task_runner: destroying -> stopping",
    "task_runner: envoy -> prestart",
    "task_runner: envoy -> restart_delay",
    "task_runner: envoy -> stopping",
    "task_runner: idle -> dead",
    "task_runner: idle -> killing",
    "task_runner: idle -> prestart",
    "task_runner: idle -> restoring",
    "task_runner: idle -> stopping",
    "task_runner: prestart -> running",
    "task_runner: prestart -> starting",
    "task_runner: restart_delay -> prestart",
    "task_runner: restart_delay -> stopping",
    "task_runner: restoring -> killing",
    "task_runner: restoring -> prestart",
    "task_runner: running -> killing",
    "task_runner: si_token -> prestart",
    "task_runner: si_token -> stopping",
    "task_runner: starting -> killing",
    "task_runner: starting -> restart_delay",
    "task_runner: starting -> running",
    "task_runner: stopping -> dead",
    "task_runner: waiting_on_servers -> prestart",
    "task_runner: waiting_on_servers -> stopping",
    "unpublish: node_detached -> ready_to_free",
    "unpublish: ready_to_free -> freed",
    "unpublish: unpublishing -> node_detached",
];

/// The coverage name of a BUGGIFY point that fired.
pub fn buggify_kind(point: &str) -> Option<&'static str> {
    FAULT_KINDS
        .iter()
        .find(|kind| kind.strip_prefix("buggify: ") == Some(point))
        .copied()
}

/// The fault kinds one scheduled action plays (none for a recovery).
pub fn fault_kinds(action: &Action) -> Vec<&'static str> {
    match action {
        Action::Kill {
            crash: Crash::LoseUnsynced,
            ..
        } => vec!["kill, losing unsynced writes"],
        Action::Kill {
            crash: Crash::KeepUnsynced,
            ..
        } => vec!["kill, keeping unsynced writes"],
        Action::Kill {
            crash: Crash::Torn(_), ..
        } => vec!["torn writes on power loss"],
        Action::Bridge(..) | Action::BridgeFromFollower(..) => vec!["bridge partition"],
        Action::DiskFault(_, fault) => {
            let mut kinds = Vec::new();
            if fault.sync_errors {
                kinds.push("disk fsync error");
            }
            if fault.full {
                kinds.push("disk full");
            }
            if !fault.latency.is_zero() {
                kinds.push("slow disk");
            }
            if fault.power_cut_on_sync.is_some() {
                kinds.push("torn writes on power loss");
            }
            kinds
        }
        Action::Restart(_) => vec!["restart"],
        Action::StopGracefully(_) => vec!["graceful stop"],
        Action::Partition(_) | Action::PartitionLastStanding => vec!["partition"],
        Action::ClogOneWay(..) => vec!["one-way clog"],
        Action::Heal => vec![],
        Action::Consul(mode) => consul_kind(*mode).into_iter().collect(),
        Action::EnvoyRefused(true) => vec!["consul refuses envoy bootstrap"],
        Action::EnvoyRefused(false) => vec![],
        Action::AddServer(_) => vec!["server added"],
        Action::NodeDown(_) => vec!["client node down"],
        Action::Plugin(_, mode) => match mode {
            PluginMode::Healthy => vec![],
            PluginMode::Failing => vec!["plugin error"],
            PluginMode::Hanging => vec!["plugin hang"],
            PluginMode::Slow => vec!["plugin slow"],
            PluginMode::FailCall(_) => vec!["plugin error on one call"],
            PluginMode::LoseAnswers => vec!["plugin answer lost"],
        },
        Action::LoseJobNode => vec!["job's node lost"],
        Action::JoinLateClients => vec!["late clients join"],
        Action::DrainJobNode => vec!["node drain"],
        Action::KillClient(_) => vec!["client agent killed"],
        Action::RebootClient(_) => vec!["client node power loss"],
        Action::FailTaskStarts(..) => vec!["driver start failure"],
        Action::OomKill(..) => vec!["task OOM killed"],
        Action::Engine(_, DaemonMode::Up) => vec![],
        Action::Engine(_, DaemonMode::Down) => vec!["container engine down"],
        Action::Engine(_, DaemonMode::Hung) => vec!["container engine hang"],
        Action::Engine(_, DaemonMode::Slow) => vec!["container engine slow"],
        Action::RestartClient(_) => vec!["client agent restart"],
        Action::UpdateJob(_) => vec!["job update"],
        Action::GcAllocs => vec!["allocation GC"],
        // Setting a clock back to true time is the recovery, not a fault.
        Action::WallClock(_, 0) => vec![],
        Action::WallClock(_, ms) if ms.unsigned_abs() < 600_000 => vec!["clock skew"],
        Action::WallClock(..) => vec!["wall clock step"],
        Action::ClockJump(..) => vec!["monotonic clock jump"],
        Action::Network(loss, (_, high)) => {
            let mut kinds = Vec::new();
            if *loss > 0 {
                kinds.push("packet loss");
            }
            // madsim's default is 1–10 ms.
            if *high > 10 {
                kinds.push("latency spike");
            }
            kinds
        }
        Action::ReadStorm { .. } => vec!["read storm"],
        Action::CasWriters { .. } => vec!["concurrent check-and-set writers"],
        Action::RogueWrite(_) => vec!["client certificate makes a server's call"],
        Action::RogueCalls(_) => vec!["client certificate makes token-only calls"],
    }
}

fn consul_kind(mode: ConsulMode) -> Option<&'static str> {
    match mode {
        ConsulMode::Healthy => None,
        ConsulMode::Down => Some("consul down"),
        ConsulMode::Hang => Some("consul hang"),
        ConsulMode::Slow => Some("consul slow"),
        ConsulMode::Flaky => Some("consul 5xx"),
    }
}

/// The fault kinds `plan` plays: its steps, Consul's mode at the start and the real clients'
/// plugin faults.
pub fn plan_faults(plan: &Plan) -> BTreeSet<&'static str> {
    let mut kinds: BTreeSet<&'static str> = plan
        .played_steps()
        .flat_map(|step| fault_kinds(&step.action))
        .chain(consul_kind(plan.consul_initial))
        .collect();
    if let Some(faults) = plan.real_clients.as_ref().map(|real| &real.plugin_faults) {
        match &faults.crash_on {
            Some((call, _)) if call == "Probe" => {
                kinds.insert("stale plugin socket");
            }
            Some(_) => {
                kinds.insert("plugin process crash on a call");
            }
            None => {}
        }
        if !faults.slow_calls.is_empty() {
            kinds.insert("slow plugin unmount");
        }
        if !faults.startup.is_zero() {
            kinds.insert("slow plugin start");
        }
    }
    if plan.real_clients.as_ref().is_some_and(|real| real.consul_down_at_stop) {
        kinds.insert("consul down during a job stop");
    }
    kinds
}

/// The table over many runs.
#[derive(Debug, Default)]
pub struct Table {
    pub runs: u64,
    /// Virtual seconds simulated over all runs.
    pub virtual_secs: u64,
    /// Runs that played each fault kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Checks per invariant, over all runs.
    pub checks: BTreeMap<&'static str, u64>,
    /// Runs that reached each transition or path.
    pub reached: BTreeMap<String, u64>,
}

impl Table {
    pub fn add(&mut self, run: &RunCoverage) {
        self.runs += 1;
        for fault in &run.faults {
            *self.faults.entry(fault).or_default() += 1;
        }
        for (invariant, count) in &run.checks {
            *self.checks.entry(invariant).or_default() += count;
        }
        for key in run.reached.keys() {
            *self.reached.entry(key.clone()).or_default() += 1;
        }
    }

    /// Fault kinds played in fewer than 1% of the runs (the goal is every one in ≥ 1%).
    pub fn rare_faults(&self) -> Vec<&'static str> {
        FAULT_KINDS
            .iter()
            .copied()
            .filter(|kind| self.faults.get(kind).copied().unwrap_or(0) * 100 < self.runs)
            .collect()
    }

    pub fn render(&self) -> String {
        let percent = |runs: u64| 100.0 * runs as f64 / self.runs.max(1) as f64;
        let mut text = format!(
            "coverage over {} runs\n  fault kinds (runs that played it):\n",
            self.runs
        );
        for kind in FAULT_KINDS {
            let runs = self.faults.get(kind).copied().unwrap_or(0);
            let _ = writeln!(text, "    {kind:<34} {runs:>6}  {:>5.1}%", percent(runs));
        }
        let rare = self.rare_faults();
        if !rare.is_empty() {
            let _ = writeln!(text, "    below 1% of runs: {}", rare.join(", "));
        }
        text.push_str("  invariants (times checked):\n");
        for (invariant, count) in &self.checks {
            let _ = writeln!(text, "    {invariant:<66} {count:>10}");
        }
        text.push_str("  state machines and paths (runs that reached it):\n");
        for (key, runs) in &self.reached {
            let _ = writeln!(text, "    {key:<66} {runs:>6}  {:>5.1}%", percent(*runs));
        }
        text
    }

    pub fn to_json(&self) -> String {
        let counts = |map: Vec<(String, u64)>| {
            serde_json::Value::Object(
                map.into_iter()
                    .map(|(key, count)| (key, serde_json::Value::from(count)))
                    .collect(),
            )
        };
        let faults = FAULT_KINDS
            .iter()
            .map(|kind| (kind.to_string(), self.faults.get(kind).copied().unwrap_or(0)))
            .collect();
        let checks = self
            .checks
            .iter()
            .map(|(key, count)| (key.to_string(), *count))
            .collect();
        let reached = self.reached.iter().map(|(key, runs)| (key.clone(), *runs)).collect();
        let json = serde_json::json!({
            "runs": self.runs,
            "fault_kinds_runs": counts(faults),
            "fault_kinds_below_1_percent": self.rare_faults(),
            "invariant_checks": counts(checks),
            "reached_runs": counts(reached),
        });
        serde_json::to_string_pretty(&json).expect("a table serialises")
    }
}
