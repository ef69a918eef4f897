//! Shrinking (issue 20 §3): a failing seed's run is cut down, by delta debugging over its
//! events — the fault steps of its plan, the node plugins' faults, the workload's write
//! attempts — to a smallest schedule that still violates the same invariant, and written as a
//! schedule file beside the failure report. `cargo test -p sim-tests -- --schedule FILE`
//! replays it exactly: the seed rebuilds the plan, the file says which events stay.
//!
//! Leaving an event out changes nothing else the seed drew: a skipped step keeps its place
//! (the fault phase ends when it did, a skipped read storm still draws its seed) and a
//! skipped write attempt still draws its server and reader. What the leftover events do can
//! still differ — timing moves once a fault is gone — which is why each candidate is run, not
//! assumed.
//!
//! The search is Zeller's ddmin, after two cheap first tries (nothing at all; no writes), with
//! the candidates of one round run side by side on every core and the first failing one *in
//! order* taken, so the result does not depend on which finished first.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::runner::{self, Report};
use crate::scenarios::{Options, Plan, Scenario, find};

/// One thing a run does that a shrunk schedule may leave out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// The plan's step of this index.
    Step(usize),
    /// The node plugins' fault of this name: `crash_on`, `never_ready`, `startup`, or
    /// `slow <call>`.
    Plugin(String),
    /// The BUGGIFY point of this name.
    Buggify(String),
    /// The workload's fault-phase write attempt of this number.
    Write(u64),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Step(index) => write!(f, "step {index}"),
            Event::Plugin(name) => write!(f, "plugin {name}"),
            Event::Buggify(point) => write!(f, "buggify {point}"),
            Event::Write(attempt) => write!(f, "write {attempt}"),
        }
    }
}

impl std::str::FromStr for Event {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!("invalid event {text:?}: expected \"step N\", \"plugin NAME\", \"buggify POINT\" or \"write N\"")
        };
        let (kind, rest) = text.split_once(' ').ok_or_else(bad)?;
        match kind {
            "step" => rest.parse().map(Event::Step).map_err(|_| bad()),
            "write" => rest.parse().map(Event::Write).map_err(|_| bad()),
            "plugin" if !rest.is_empty() => Ok(Event::Plugin(rest.to_string())),
            "buggify" if !rest.is_empty() => Ok(Event::Buggify(rest.to_string())),
            _ => Err(bad()),
        }
    }
}

/// What a run leaves out of its seed's plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trim {
    pub steps: BTreeSet<usize>,
    pub plugin_faults: BTreeSet<String>,
    pub buggify: BTreeSet<String>,
    pub writes: BTreeSet<u64>,
}

impl Trim {
    /// Everything in `all` but `keep`.
    pub fn keeping(all: &[Event], keep: &[Event]) -> Trim {
        let keep: BTreeSet<&Event> = keep.iter().collect();
        let mut trim = Trim::default();
        for event in all.iter().filter(|event| !keep.contains(event)) {
            match event {
                Event::Step(index) => {
                    trim.steps.insert(*index);
                }
                Event::Plugin(name) => {
                    trim.plugin_faults.insert(name.clone());
                }
                Event::Buggify(point) => {
                    trim.buggify.insert(point.clone());
                }
                Event::Write(attempt) => {
                    trim.writes.insert(*attempt);
                }
            }
        }
        trim
    }

    /// Marks the skipped steps and removes the dropped plugin faults (the writes are left out
    /// by the runner's workload).
    pub fn apply(&self, plan: &mut Plan) {
        plan.skipped = self.steps.clone();
        plan.buggify.retain(|point, _| !self.buggify.contains(*point));
        if let Some(faults) = plan.real_clients.as_mut().map(|real| &mut real.plugin_faults) {
            for name in &self.plugin_faults {
                match name.as_str() {
                    "crash_on" => faults.crash_on = None,
                    "never_ready" => faults.never_ready = false,
                    "startup" => faults.startup = Duration::ZERO,
                    other => {
                        if let Some(call) = other.strip_prefix("slow ") {
                            faults.slow_calls.remove(call);
                        }
                    }
                }
            }
        }
    }
}

/// Every event of a plan whose run made `writes` fault-phase write attempts.
pub fn events(plan: &Plan, writes: u64) -> Vec<Event> {
    let mut events: Vec<Event> = (0..plan.steps.len()).map(Event::Step).collect();
    if let Some(faults) = plan.real_clients.as_ref().map(|real| &real.plugin_faults) {
        if faults.crash_on.is_some() {
            events.push(Event::Plugin("crash_on".into()));
        }
        if faults.never_ready {
            events.push(Event::Plugin("never_ready".into()));
        }
        if !faults.startup.is_zero() {
            events.push(Event::Plugin("startup".into()));
        }
        events.extend(
            faults
                .slow_calls
                .keys()
                .map(|call| Event::Plugin(format!("slow {call}"))),
        );
    }
    events.extend(plan.buggify.keys().map(|point| Event::Buggify(point.to_string())));
    events.extend((0..writes).map(Event::Write));
    events
}

/// How an event reads in a schedule file.
pub fn describe(plan: &Plan, event: &Event) -> String {
    match event {
        Event::Step(index) => plan.steps.get(*index).map_or_else(
            || format!("step {index}: (no such step)"),
            |step| format!("{event}: {step}"),
        ),
        Event::Plugin(name) => {
            let faults = plan.real_clients.as_ref().map(|real| &real.plugin_faults);
            let detail = match (name.as_str(), faults) {
                ("crash_on", Some(faults)) => format!("{:?}", faults.crash_on),
                ("startup", Some(faults)) => format!("{:?}", faults.startup),
                (other, Some(faults)) => other
                    .strip_prefix("slow ")
                    .and_then(|call| faults.slow_calls.get(call))
                    .map_or_else(String::new, |delay| format!("{delay:?}")),
                _ => String::new(),
            };
            format!("{event}: {detail}")
        }
        Event::Buggify(point) => {
            let chance = plan.buggify.get(point.as_str()).copied().unwrap_or_default();
            format!("{event}: fires {:.0}% of the times reached", chance * 100.0)
        }
        Event::Write(_) => format!("{event}: a write through a random server, read back through another"),
    }
}

/// A failing run to shrink, or a shrunk schedule to replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub scenario: &'static str,
    pub seed: u64,
    /// The regression switch the run had on (`REGRESSION_SWITCHES` names, or
    /// "negative-control"), if any.
    pub switch: Option<String>,
    /// The invariant the run must violate.
    pub invariant: String,
    /// Fault-phase write attempts of the unshrunk run.
    pub writes: u64,
    /// The events that stay.
    pub keep: Vec<Event>,
}

impl Schedule {
    pub fn to_json(&self, plan: &Plan, stats: &Stats, path: &Path) -> String {
        let value = json!({
            "scenario": self.scenario,
            "seed": self.seed,
            "switch": self.switch,
            "invariant": self.invariant,
            "knobs": plan.knobs.map(|knobs| knobs.to_json()),
            "writes": self.writes,
            "keep": self.keep.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "schedule": self.keep.iter().map(|event| describe(plan, event)).collect::<Vec<_>>(),
            "shrunk_from": stats.from,
            "runs": stats.runs,
            "seconds": stats.elapsed.as_secs_f64(),
            "replay": format!("cargo test -p sim-tests -- --schedule {}", path.display()),
        });
        serde_json::to_string_pretty(&value).expect("a JSON value always prints") + "\n"
    }

    pub fn from_json(text: &str) -> Result<Schedule, String> {
        let value: Value = serde_json::from_str(text).map_err(|error| format!("not a schedule file: {error}"))?;
        let field = |name: &str| value.get(name).ok_or_else(|| format!("schedule file: no {name:?}"));
        let name = field("scenario")?
            .as_str()
            .ok_or("schedule file: \"scenario\" is not a string")?;
        let scenario = find(name).ok_or_else(|| format!("schedule file: unknown scenario {name:?}"))?;
        let seed = field("seed")?
            .as_u64()
            .ok_or("schedule file: \"seed\" is not a number")?;
        let switch = match field("switch")? {
            Value::Null => None,
            Value::String(switch) => Some(switch.clone()),
            _ => return Err("schedule file: \"switch\" is neither null nor a string".into()),
        };
        let invariant = field("invariant")?
            .as_str()
            .ok_or("schedule file: \"invariant\" is not a string")?
            .to_string();
        let writes = field("writes")?
            .as_u64()
            .ok_or("schedule file: \"writes\" is not a number")?;
        let keep = field("keep")?
            .as_array()
            .ok_or("schedule file: \"keep\" is not a list")?
            .iter()
            .map(|event| event.as_str().ok_or("schedule file: an event is not a string")?.parse())
            .collect::<Result<Vec<Event>, String>>()?;
        Ok(Schedule {
            scenario: scenario.name,
            seed,
            switch,
            invariant,
            writes,
            keep,
        })
    }

    pub fn scenario(&self) -> &'static Scenario {
        find(self.scenario).expect("a schedule names a known scenario")
    }

    /// Every event of the seed's unshrunk plan.
    pub fn all_events(&self, options: &Options) -> Vec<Event> {
        events(&runner::plan_for(self.scenario(), self.seed, options), self.writes)
    }

    /// Runs the schedule with `options` (the switch's).
    pub fn run(&self, options: Options) -> Report {
        let trim = Trim::keeping(&self.all_events(&options), &self.keep);
        runner::run_trimmed(self.scenario(), self.seed, options, &trim)
    }

    /// Whether `report` violates this schedule's invariant.
    pub fn reproduced_by(&self, report: &Report) -> bool {
        report
            .violations
            .iter()
            .any(|violation| violation.invariant == self.invariant)
    }

    /// Where the schedule file of a failure goes: beside its trace.
    pub fn path(&self) -> PathBuf {
        traces_dir().join(format!("{}-{}.schedule.json", self.scenario, self.seed))
    }
}

/// The workspace root: cargo runs the test binary in `sim-tests/`, while an operator writes
/// paths from the root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim-tests sits in the workspace")
        .to_path_buf()
}

pub fn traces_dir() -> PathBuf {
    workspace_root().join("target/sim-traces")
}

/// A path given on the command line: as given when it exists, else from the workspace root.
pub fn resolve_path(path: &Path) -> PathBuf {
    if path.is_relative() && !path.exists() {
        workspace_root().join(path)
    } else {
        path.to_path_buf()
    }
}

/// What a shrink took.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub from: usize,
    pub runs: usize,
    pub elapsed: Duration,
    /// The time budget ran out before the schedule was 1-minimal.
    pub out_of_time: bool,
}

/// The invariant a failing report is shrunk to keep violating: its first violation's.
pub fn first_invariant(report: &Report) -> Option<&'static str> {
    report
        .violations
        .iter()
        .min_by_key(|violation| violation.at_line)
        .map(|violation| violation.invariant)
}

/// Shrinks `failing` (a run of `scenario` at `seed` with `options`) within `budget`: returns
/// the smallest schedule found that still violates `invariant`.
pub fn shrink(
    report: &Report,
    options: Options,
    switch: Option<String>,
    invariant: &str,
    budget: Duration,
) -> (Schedule, Stats) {
    let started = Instant::now();
    let scenario = find(report.scenario).expect("a report names a known scenario");
    let plan = runner::plan_for(scenario, report.seed, &options);
    let all = events(&plan, report.fault_writes);
    let mut schedule = Schedule {
        scenario: scenario.name,
        seed: report.seed,
        switch,
        invariant: invariant.to_string(),
        writes: report.fault_writes,
        keep: all.clone(),
    };
    let mut stats = Stats {
        from: all.len(),
        ..Stats::default()
    };
    let fails = |candidates: &[Vec<Event>], stats: &mut Stats| -> Option<usize> {
        stats.runs += candidates.len();
        first_failing(&schedule, options, &all, candidates)
    };
    // Cheap first tries: nothing at all, then the faults without the writes.
    let faults_only: Vec<Event> = all
        .iter()
        .filter(|event| !matches!(event, Event::Write(_)))
        .cloned()
        .collect();
    let mut current = all.clone();
    let firsts = vec![Vec::new(), faults_only];
    if let Some(found) = fails(&firsts, &mut stats) {
        current = firsts[found].clone();
    }
    // ddmin: try each chunk alone, then each complement, at ever finer granularity.
    let mut parts = 2;
    while current.len() >= 2 {
        if started.elapsed() > budget {
            stats.out_of_time = true;
            break;
        }
        let chunks = split(&current, parts);
        if let Some(found) = fails(&chunks, &mut stats) {
            current = chunks[found].clone();
            parts = 2;
            continue;
        }
        let complements: Vec<Vec<Event>> = (0..chunks.len())
            .map(|skip| {
                chunks
                    .iter()
                    .enumerate()
                    .filter(|(index, _)| *index != skip)
                    .flat_map(|(_, chunk)| chunk.iter().cloned())
                    .collect()
            })
            .collect();
        if chunks.len() > 2
            && let Some(found) = fails(&complements, &mut stats)
        {
            current = complements[found].clone();
            parts = (parts - 1).max(2);
            continue;
        }
        if parts >= current.len() {
            break;
        }
        parts = (parts * 2).min(current.len());
    }
    // A single event left may be droppable too (ddmin stops at one).
    if current.len() == 1 && fails(&[Vec::new()], &mut stats).is_some() {
        current.clear();
    }
    schedule.keep = current;
    stats.elapsed = started.elapsed();
    (schedule, stats)
}

/// `events` in `parts` contiguous chunks of near-equal size.
fn split(events: &[Event], parts: usize) -> Vec<Vec<Event>> {
    let parts = parts.min(events.len()).max(1);
    let (base, extra) = (events.len() / parts, events.len() % parts);
    let mut chunks = Vec::with_capacity(parts);
    let mut start = 0;
    for part in 0..parts {
        let len = base + usize::from(part < extra);
        chunks.push(events[start..start + len].to_vec());
        start += len;
    }
    chunks
}

/// Runs the candidates (kept-event lists) on every core; the first, in order, that still
/// violates the invariant. Later candidates of a batch are not run once one fails.
fn first_failing(schedule: &Schedule, options: Options, all: &[Event], candidates: &[Vec<Event>]) -> Option<usize> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (batch_index, batch) in candidates.chunks(workers).enumerate() {
        let next = Arc::new(AtomicUsize::new(0));
        let verdicts: Arc<Mutex<Vec<bool>>> = Arc::new(Mutex::new(vec![false; batch.len()]));
        std::thread::scope(|scope| {
            for _ in 0..workers.min(batch.len()) {
                let (next, verdicts) = (next.clone(), verdicts.clone());
                scope.spawn(move || {
                    loop {
                        let job = next.fetch_add(1, Ordering::SeqCst);
                        let Some(keep) = batch.get(job) else { return };
                        let trim = Trim::keeping(all, keep);
                        let report = runner::run_trimmed(schedule.scenario(), schedule.seed, options, &trim);
                        verdicts.lock().expect("verdicts lock")[job] = schedule.reproduced_by(&report);
                    }
                });
            }
        });
        let verdicts = verdicts.lock().expect("verdicts lock");
        if let Some(found) = verdicts.iter().position(|failed| *failed) {
            return Some(batch_index * workers + found);
        }
    }
    None
}
