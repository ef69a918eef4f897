//! The simulation lane's command line: `-- --seed N`, `-- --seeds A..B`, `--scenario NAME`,
//! `--negative-control`, `--check-determinism`, `--trace`, `--log` (agent logs, filtered by
//! `RUST_LOG`), `--list`, `--coverage FILE` (the coverage table printed after the runs, as
//! JSON), `--schedule FILE` (replay a shrunk schedule), `--shrink` (shrink a regression
//! switch's catch too), `--no-shrink` (do not shrink failures). A failing seed is shrunk to a
//! smallest schedule that still violates its first invariant, written beside its trace
//! (`shrink`). With no seed given it runs
//! the default range, replays every run of it to check that the trace is byte-identical (an
//! explicit range replays its first seed per scenario, or every seed with
//! `--check-determinism`) and runs the negative control. Replays run in the same process after
//! hundreds of other runs, which is what exposes state that leaks between runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::runner::{self, Report};
use crate::shrink::{self, Schedule};
use drover_core::config::{BootstrapFault, ClientFaults, ConnectFaults, CsiFaults, RaftFaults, SchedulerFaults};
use drover_io_sim::task_files::HostFaults;

use crate::scenarios::{Options, Scenario, all_scenarios, find};

/// Seeds per scenario in the fast lane (the default run, what CI runs): every scenario on a few
/// seeds, each run replayed.
const FAST_SEEDS: std::ops::Range<u64> = 0..6;
/// Seeds per scenario in the long lane (`--long`), every run replayed.
const LONG_SEEDS: std::ops::Range<u64> = 0..200;
/// Seeds that once exposed a bug, replayed by every default run. Each was checked to fail with
/// its fix disabled (re-check when timing defaults change).
const REGRESSION_SEEDS: &[(&str, u64, &str)] = &[
    (
        "partition_during_formation",
        32,
        "servers that came up on opposite sides of a partition stayed in two gossip islands",
    ),
    (
        "leader_killed",
        643,
        "two survivors split the vote forever: openraft 0.9 keeps one election timeout per server",
    ),
    (
        "read_storm",
        31,
        "a quorum round per consistent read starved replication: writes stalled, reads failed",
    ),
    (
        "client_agent_restart",
        17,
        "after an agent restart the volume manager forgot which allocations still used a staged volume and unstaged it under them",
    ),
    (
        "leader_killed",
        139,
        "two survivors split the vote forever: openraft 0.9 keeps one election timeout per server",
    ),
    (
        "swarm",
        44,
        "a leader restarted in its own term called a slow controller plugin while its previous life's call still ran there",
    ),
];

/// The negative control must find the split brain within this many seeds.
const NEGATIVE_CONTROL_SEEDS: u64 = 200;
const TRACE_TAIL_LINES: usize = 60;

#[derive(Default)]
struct Args {
    seeds: Option<std::ops::Range<u64>>,
    scenarios: Vec<&'static Scenario>,
    negative_control: bool,
    check_determinism: bool,
    trace: bool,
    list: bool,
    bench_jobs: bool,
    bench_idle: bool,
    log: bool,
    /// Write the coverage table of the run range as JSON here.
    coverage: Option<std::path::PathBuf>,
    /// Replay this shrunk schedule file.
    schedule: Option<PathBuf>,
    /// Shrink a regression switch's catch too.
    shrink: bool,
    /// Leave failures unshrunk.
    no_shrink: bool,
    /// Run only the given regression switch (`REGRESSION_SWITCHES` names them).
    regression_switch: Option<String>,
    /// Print every scenario's real and virtual time per run, not only the five slowest.
    per_scenario: bool,
    /// The long lane: many seeds, every switch searched from seed 0 and shrunk, coverage floors.
    long: bool,
    /// Only search every regression switch from seed 0, timed (the long lane's second half).
    catch_times: bool,
    /// How long one shrink may take ([`SHRINK_BUDGET`] unless set).
    shrink_budget: Option<Duration>,
    /// Parse and route the arguments, say what would run, run nothing (the fast lane checks
    /// the README's commands this way).
    dry_run: bool,
}

fn parse_range(text: &str) -> Result<std::ops::Range<u64>, String> {
    let bad = || format!("invalid seed range {text:?}: expected A..B or A..=B");
    if let Some((start, end)) = text.split_once("..=") {
        let start: u64 = start.parse().map_err(|_| bad())?;
        let end: u64 = end.parse().map_err(|_| bad())?;
        return Ok(start..end + 1);
    }
    let (start, end) = text.split_once("..").ok_or_else(bad)?;
    let start: u64 = start.parse().map_err(|_| bad())?;
    let end: u64 = end.parse().map_err(|_| bad())?;
    if end <= start {
        return Err(bad());
    }
    Ok(start..end)
}

fn parse_args(raw: Vec<String>) -> Result<Args, String> {
    let mut args = Args::default();
    let mut raw = raw.into_iter();
    while let Some(arg) = raw.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| raw.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--seed" => {
                let seed: u64 = value("--seed")?
                    .parse()
                    .map_err(|_| "--seed needs a number".to_string())?;
                args.seeds = Some(seed..seed + 1);
            }
            "--seeds" => args.seeds = Some(parse_range(&value("--seeds")?)?),
            "--scenario" => {
                for name in value("--scenario")?.split(',') {
                    let scenario = find(name).ok_or_else(|| format!("unknown scenario {name:?} (see --list)"))?;
                    args.scenarios.push(scenario);
                }
            }
            "--negative-control" => args.negative_control = true,
            "--check-determinism" => args.check_determinism = true,
            "--trace" => args.trace = true,
            "--list" => args.list = true,
            "--bench-jobs" => args.bench_jobs = true,
            "--bench-idle" => args.bench_idle = true,
            "--log" => args.log = true,
            "--per-scenario" => args.per_scenario = true,
            "--long" => args.long = true,
            "--catch-times" => args.catch_times = true,
            "--dry-run" => args.dry_run = true,
            "--coverage" => args.coverage = Some(value("--coverage")?.into()),
            "--schedule" => args.schedule = Some(value("--schedule")?.into()),
            "--shrink" => args.shrink = true,
            "--no-shrink" => args.no_shrink = true,
            "--regression-switch" => {
                let which = value("--regression-switch")?;
                if !REGRESSION_SWITCHES.iter().any(|switch| switch.name == which) {
                    let names: Vec<&str> = REGRESSION_SWITCHES.iter().map(|switch| switch.name).collect();
                    return Err(format!(
                        "unknown regression switch {which:?}: expected one of {}",
                        names.join(", ")
                    ));
                }
                args.regression_switch = Some(which);
            }
            // Flags cargo or libtest habits may pass through; they mean nothing here.
            "--nocapture" | "--show-output" | "--quiet" | "-q" | "--include-ignored" | "--ignored" | "--exact" => {}
            "--test-threads" | "--color" | "--format" => {
                let _ = value(&flag)?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.scenarios.is_empty() {
        args.scenarios = all_scenarios().collect();
    }
    Ok(args)
}

pub fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let raw = match crate::lanes::route(crate::lanes::Lane::Madsim, &raw) {
        Ok(crate::lanes::Route::Run(raw)) => raw,
        Ok(crate::lanes::Route::Skip(why)) => {
            println!("madsim lane: skipped ({why})");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("sim-tests: {error}");
            return ExitCode::FAILURE;
        }
    };
    let args = match parse_args(raw) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("sim-tests: {error}");
            return ExitCode::FAILURE;
        }
    };
    // A panic is reported with its seed like any other violation; one line on stderr is
    // enough (the negative control provokes openraft's own split-brain assertion on purpose).
    // `--log` keeps Rust's default hook (with backtraces) for debugging one seed.
    if !args.log {
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            eprintln!("sim: panic in {}: {info}", thread.name().unwrap_or("simulation"));
        }));
    }
    if args.log {
        // Agent logs (core decisions included), filtered by RUST_LOG, e.g. RUST_LOG=info.
        madsim::runtime::init_logger();
        crate::runner::AGENT_LOGS.store(true, Ordering::Relaxed);
    }
    if args.dry_run {
        println!(
            "madsim lane: would run {} scenario(s), seeds {}",
            args.scenarios.len(),
            args.seeds
                .as_ref()
                .map_or("(the lane's own)".to_string(), |seeds| format!("{seeds:?}"))
        );
        return ExitCode::SUCCESS;
    }
    if args.bench_idle {
        crate::bench::idle_bench();
        return ExitCode::SUCCESS;
    }
    if args.bench_jobs {
        return if crate::bench::jobs_bench() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if args.list {
        for scenario in all_scenarios() {
            println!("{:<28} {}", scenario.name, scenario.about);
        }
        println!("\nregression switches (--regression-switch NAME):");
        for switch in REGRESSION_SWITCHES {
            println!(
                "{:<28} {} [{}]; caught by {} seed {}",
                switch.name,
                switch.bug,
                switch.scenarios.join(", "),
                switch.caught_by.0,
                switch.caught_by.1
            );
        }
        return ExitCode::SUCCESS;
    }
    if let Some(path) = &args.schedule {
        return exit(replay_schedule(&shrink::resolve_path(path)));
    }
    if args.negative_control {
        return exit(negative_control(&args));
    }
    if let Some(which) = args.regression_switch.clone() {
        return exit(regression_switch(&args, &which).is_some());
    }
    if args.long {
        return exit(long_lane(args));
    }
    if args.catch_times {
        return exit(catch_times(!args.no_shrink).0);
    }
    let explicit = args.seeds.is_some();
    let seeds = args.seeds.clone().unwrap_or(FAST_SEEDS);
    let mut ok = run_range(&args, seeds);
    if !explicit {
        ok &= regression_seeds();
        ok &= recorded_catches(&args);
    }
    exit(ok)
}

/// The fast lane's half of the regression switches: each switch on at the run its table
/// records (the negative control's bug among them), which must still catch it; then the
/// catch of #13416 shrunk and replayed from its schedule file, so the log shows one whole
/// shrink.
fn recorded_catches(args: &Args) -> bool {
    let started = Instant::now();
    let mut ok = every_fault_has_a_switch();
    let jobs: Vec<(&Switch, &'static Scenario, u64)> = REGRESSION_SWITCHES
        .iter()
        .map(|switch| {
            let scenario = find(switch.caught_by.0).unwrap_or_else(|| {
                panic!(
                    "switch #{}'s recorded catch names no scenario {:?}",
                    switch.name, switch.caught_by.0
                )
            });
            (switch, scenario, switch.caught_by.1)
        })
        .collect();
    // Runs with different switches in parallel: one job list per switch's options would
    // serialise them, so each job carries its own options. Each recorded run also runs with
    // its switch off, and must then pass: the catch is the switch's, not the seed's.
    let reports = run_jobs_with(
        jobs.iter()
            .flat_map(|(switch, scenario, seed)| {
                [
                    (*scenario, *seed, (switch.options)()),
                    (*scenario, *seed, Options::default()),
                ]
            })
            .collect(),
        false,
    );
    let (reports, controls): (Vec<Report>, Vec<Report>) = {
        let mut pairs = reports.into_iter();
        let mut on = Vec::new();
        let mut off = Vec::new();
        while let (Some(with), Some(without)) = (pairs.next(), pairs.next()) {
            on.push(with);
            off.push(without);
        }
        (on, off)
    };
    for ((switch, _, _), control) in jobs.iter().zip(&controls) {
        if !control.passed() {
            ok = false;
            println!(
                "FAILED regression switch #{}'s recorded run fails with the switch off too: it proves nothing",
                switch.name
            );
            print_failure(control, false);
        }
    }
    for ((switch, _, _), report) in jobs.iter().zip(&reports) {
        match switch.caught(report) {
            Some(violation) => {
                println!(
                    "ok     regression switch #{} ({}): caught at its recorded seed {} of {}: \"{}\"",
                    switch.name, switch.bug, report.seed, report.scenario, violation.invariant
                );
                if switch.name == SHRUNK_SWITCH && !args.no_shrink {
                    ok &= shrink_switch_catch(report, (switch.options)(), switch.name, violation.invariant);
                }
            }
            None => {
                ok = false;
                println!(
                    "FAILED regression switch #{} ({}) is no longer caught at its recorded seed {} of {}: \
                     search for it (cargo test -p sim-tests -- --regression-switch {}) and record the new \
                     catch in sim-tests/src/cli.rs, or find what stopped catching it",
                    switch.name, switch.bug, report.seed, report.scenario, switch.name
                );
            }
        }
    }
    println!(
        "sim: {} regression switches at their recorded seeds in {:.1} s",
        jobs.len(),
        started.elapsed().as_secs_f64()
    );
    ok
}

/// The long lane (`--long`, `scripts/test.sh --long`): hundreds of seeds per scenario with
/// every run replayed and the coverage floors held, the seeds that once exposed bugs, and
/// every regression switch searched from seed 0 and shrunk, timed: how fast the simulator
/// finds each bug is the figure that matters.
fn long_lane(mut args: Args) -> bool {
    let started = Instant::now();
    let seeds = args.seeds.clone().unwrap_or(LONG_SEEDS);
    args.check_determinism = true;
    let range_started = Instant::now();
    let (mut ok, table, runs) = run_range_table(&args, seeds.clone());
    let range_secs = range_started.elapsed().as_secs_f64();
    let floors = coverage_floors(&table);
    ok &= floors;
    ok &= regression_seeds();
    ok &= every_fault_has_a_switch();
    let (caught, catches) = catch_times(!args.no_shrink);
    ok &= caught;
    println!(
        "sim long lane: {} | {runs} runs of {} scenarios x seeds {}..{} (each replayed) in {range_secs:.0} s \
         ({:.0} runs/min, {:.1} virtual s per wall s) | switches caught {}/{}, {} within 60 s, \
         median {:.1} s, slowest {:.1} s | coverage floors {} | {:.0} s in all",
        if ok { "PASSED" } else { "FAILED" },
        args.scenarios.len(),
        seeds.start,
        seeds.end,
        2.0 * runs as f64 * 60.0 / range_secs.max(0.001),
        2.0 * table.virtual_secs as f64 / range_secs.max(0.001),
        catches.caught,
        catches.switches,
        catches.within_60s,
        catches.median,
        catches.slowest,
        if floors { "held" } else { "BROKEN" },
        started.elapsed().as_secs_f64()
    );
    ok
}

/// How fast the simulator finds the regression switches' bugs.
struct CatchTimes {
    switches: usize,
    caught: usize,
    within_60s: usize,
    median: f64,
    slowest: f64,
}

/// Every regression switch searched from seed 0 (`--catch-times`, and the long lane), each
/// catch shrunk when `shrink`: prints the wall time to each catch and where the table's
/// recorded catch moved. Whether every switch was caught, and the figures.
fn catch_times(shrink: bool) -> (bool, CatchTimes) {
    let mut ok = true;
    let search = Args {
        seeds: None,
        shrink,
        shrink_budget: Some(LONG_SHRINK_BUDGET),
        ..Args::default()
    };
    let mut catches: Vec<(&'static str, Option<Catch>)> = Vec::new();
    for switch in REGRESSION_SWITCHES {
        let catch = regression_switch(&search, switch.name);
        if let Some(catch) = catch
            .as_ref()
            .filter(|catch| (catch.scenario, catch.seed) != switch.caught_by)
        {
            println!(
                "note   regression switch #{} is first caught at seed {} of {} now; the table records seed {} of {}: \
                 update caught_by in sim-tests/src/cli.rs",
                switch.name, catch.seed, catch.scenario, switch.caught_by.1, switch.caught_by.0
            );
        }
        ok &= catch.is_some();
        catches.push((switch.name, catch));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("sim: time to catch each regression switch, searching from seed 0 on {cores} cores:");
    let mut times: Vec<f64> = Vec::new();
    for (name, catch) in &catches {
        match catch {
            Some(catch) => {
                times.push(catch.elapsed.as_secs_f64());
                println!(
                    "sim:   #{name:<26} {:>7.1} s  ({} runs, seed {} of {})",
                    catch.elapsed.as_secs_f64(),
                    catch.runs,
                    catch.seed,
                    catch.scenario
                );
            }
            None => println!("sim:   #{name:<26}  not caught"),
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    let slowest = times.last().copied().unwrap_or(f64::NAN);
    let within = times.iter().filter(|secs| **secs <= 60.0).count();
    let summary = CatchTimes {
        switches: catches.len(),
        caught: times.len(),
        within_60s: within,
        median,
        slowest,
    };
    println!(
        "sim: switches caught {}/{}, {} within 60 s, median {:.1} s, slowest {:.1} s",
        summary.caught, summary.switches, summary.within_60s, summary.median, summary.slowest
    );
    (ok, summary)
}

fn exit(ok: bool) -> ExitCode {
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs `jobs` on as many threads as there are cores; results come back in job order.
fn run_parallel(jobs: Vec<(&'static Scenario, u64)>, options: Options) -> Vec<Report> {
    run_jobs(jobs, options, false)
}

/// Runs replays like `run_parallel`, each after shifting the process-global state a run
/// could depend on by mistake, so a replay never starts from the first run's history.
fn run_replays(jobs: Vec<(&'static Scenario, u64)>) -> Vec<Report> {
    run_jobs(jobs, Options::default(), true)
}

fn run_jobs(jobs: Vec<(&'static Scenario, u64)>, options: Options, perturb: bool) -> Vec<Report> {
    run_jobs_with(
        jobs.into_iter()
            .map(|(scenario, seed)| (scenario, seed, options))
            .collect(),
        perturb,
    )
}

/// Runs each job with its own options on as many threads as there are cores; results come
/// back in job order.
fn run_jobs_with(jobs: Vec<(&'static Scenario, u64, Options)>, perturb: bool) -> Vec<Report> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let next = Arc::new(AtomicUsize::new(0));
    let results: Arc<Mutex<Vec<Option<Report>>>> = Arc::new(Mutex::new(vec![None; jobs.len()]));
    let jobs = Arc::new(jobs);
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (next, results, jobs) = (next.clone(), results.clone(), jobs.clone());
            std::thread::spawn(move || {
                loop {
                    let job = next.fetch_add(1, Ordering::SeqCst);
                    let Some((scenario, seed, options)) = jobs.get(job).copied() else {
                        return;
                    };
                    if perturb {
                        runner::perturb_process_history(seed);
                    }
                    let report = runner::run(scenario, seed, options);
                    results.lock().expect("results lock")[job] = Some(report);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("worker thread");
    }
    let results = std::mem::take(&mut *results.lock().expect("results lock"));
    results
        .into_iter()
        .map(|report| report.expect("every job ran"))
        .collect()
}

/// The scenarios that take the most real time per run, with their share of the range's: where
/// throughput goes (issue 20 §7).
fn print_slowest(reports: &[Report], every: bool) {
    let mut per_scenario: BTreeMap<&'static str, (f64, u64)> = BTreeMap::new();
    let mut virtual_secs: BTreeMap<&'static str, u64> = BTreeMap::new();
    for report in reports {
        let entry = per_scenario.entry(report.scenario).or_default();
        entry.0 += report.wall.as_secs_f64();
        entry.1 += 1;
        *virtual_secs.entry(report.scenario).or_default() += report.virtual_secs;
    }
    let total: f64 = per_scenario.values().map(|(secs, _)| secs).sum();
    let mut slowest: Vec<(&str, f64, f64)> = per_scenario
        .iter()
        .map(|(name, (secs, runs))| (*name, secs / *runs as f64, *secs))
        .collect();
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let named: Vec<String> = slowest
        .iter()
        .take(5)
        .map(|(name, mean, secs)| {
            format!(
                "{name} {mean:.2} s/run ({:.0}% of run time)",
                100.0 * secs / total.max(f64::EPSILON)
            )
        })
        .collect();
    println!(
        "sim: slowest scenarios (real time per run, one core): {}",
        named.join(", ")
    );
    if every {
        println!("sim: scenario                      ms/run  virtual s/run  ms per virtual s");
        for (name, mean, secs) in &slowest {
            let virtual_total = virtual_secs.get(name).copied().unwrap_or(0).max(1) as f64;
            let runs = per_scenario.get(name).map_or(1, |(_, runs)| *runs) as f64;
            println!(
                "sim: {name:<28} {:>8.0} {:>14.1} {:>17.2}",
                mean * 1000.0,
                virtual_total / runs,
                secs * 1000.0 / virtual_total
            );
        }
    }
}

fn run_range(args: &Args, seeds: std::ops::Range<u64>) -> bool {
    run_range_table(args, seeds).0
}

/// Runs every scenario of `args` on `seeds`, replays (all runs with `--check-determinism` or
/// no explicit range, else the first seed per scenario), prints the results and the coverage
/// table: whether all passed and replayed identically, the table, and the number of runs.
fn run_range_table(args: &Args, seeds: std::ops::Range<u64>) -> (bool, crate::coverage::Table, usize) {
    let started = Instant::now();
    let jobs: Vec<(&'static Scenario, u64)> = seeds
        .clone()
        .flat_map(|seed| args.scenarios.iter().map(move |scenario| (*scenario, seed)))
        .collect();
    let runs = jobs.len();
    let reports = run_parallel(jobs, Options::default());
    let mut failures = 0;
    let mut failed: Vec<&Report> = Vec::new();
    let mut virtual_secs = 0;
    for report in &reports {
        virtual_secs += report.virtual_secs;
        if report.passed() {
            println!(
                "ok     {:<28} seed={:<6} ({} virtual s in {} ms)",
                report.scenario,
                report.seed,
                report.virtual_secs,
                report.wall.as_millis()
            );
        } else {
            failures += 1;
            print_failure(report, false);
            if !failed.iter().any(|first| first.scenario == report.scenario) {
                failed.push(report);
            }
        }
        if args.trace {
            println!(
                "--- trace {} seed={} ---\n{}",
                report.scenario, report.seed, report.trace
            );
        }
    }
    let mut deterministic = true;
    let determinism_jobs: Vec<(&'static Scenario, u64)> = reports
        .iter()
        .filter(|report| args.check_determinism || args.seeds.is_none() || report.seed == seeds.start)
        .map(|report| (find(report.scenario).expect("known scenario"), report.seed))
        .collect();
    let replays = run_replays(determinism_jobs);
    for replay in &replays {
        let first = reports
            .iter()
            .find(|report| report.scenario == replay.scenario && report.seed == replay.seed)
            .expect("original run");
        if first.trace == replay.trace {
            println!(
                "same   {:<28} seed={:<6} replay gave a byte-identical trace ({} bytes)",
                replay.scenario,
                replay.seed,
                replay.trace.len()
            );
        } else {
            deterministic = false;
            let line = first
                .trace
                .lines()
                .zip(replay.trace.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            println!(
                "FAILED {:<28} seed={:<6} nondeterminism: the replay's trace differs from line {}",
                replay.scenario,
                replay.seed,
                line + 1
            );
            println!("  first:  {}", first.trace.lines().nth(line).unwrap_or(""));
            println!("  replay: {}", replay.trace.lines().nth(line).unwrap_or(""));
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total_runs = runs + replays.len();
    let runs_per_minute = total_runs as f64 * 60.0 / elapsed.max(0.001);
    let real_clients = args
        .scenarios
        .iter()
        .filter(|scenario| {
            crate::runner::plan_for(scenario, 0, &Options::default())
                .real_clients
                .is_some()
        })
        .count();
    println!(
        "sim: {real_clients} of {} scenarios have client nodes, every one running the production client driver",
        args.scenarios.len()
    );
    println!(
        "sim: {runs} runs ({} scenarios x {} seeds) + {} determinism replays, {failures} failed, \
         {virtual_secs} virtual s in {elapsed:.1} s wall ({runs_per_minute:.0} runs/minute = {:.0} seeds/minute \
         with every scenario per seed)",
        args.scenarios.len(),
        seeds.end - seeds.start,
        replays.len(),
        runs_per_minute / args.scenarios.len() as f64,
    );
    print_slowest(&reports, args.per_scenario);
    let mut table = crate::coverage::Table::default();
    for report in &reports {
        table.add(&report.coverage);
    }
    table.virtual_secs = virtual_secs;
    print!("{}", table.render());
    let mut written = true;
    if let Some(path) = &args.coverage {
        match std::fs::write(path, table.to_json()) {
            Ok(()) => println!("sim: coverage written to {}", path.display()),
            Err(error) => {
                println!("sim: could not write the coverage to {}: {error}", path.display());
                written = false;
            }
        }
    }
    if !args.no_shrink {
        shrink_failures(&failed);
    }
    (failures == 0 && deterministic && written, table, runs)
}

/// How long one shrink may take, and all the shrinks of one invocation together.
const SHRINK_BUDGET: Duration = Duration::from_secs(300);
const SHRINK_TOTAL: Duration = Duration::from_secs(600);
/// The regression switch whose catch every default run shrinks and replays from its schedule
/// file, so the CI log shows one whole shrink.
const SHRUNK_SWITCH: &str = "13416";

/// Shrinks the first failure of each failing scenario, within the budgets.
fn shrink_failures(failed: &[&Report]) {
    let started = Instant::now();
    for report in failed {
        let Some(invariant) = shrink::first_invariant(report) else {
            continue;
        };
        let left = SHRINK_TOTAL.saturating_sub(started.elapsed());
        if left.is_zero() {
            println!(
                "sim: no time left to shrink {} seed={} (shrinks take at most {SHRINK_TOTAL:?} per run)",
                report.scenario, report.seed
            );
            continue;
        }
        shrink_and_write(report, Options::default(), None, invariant, left.min(SHRINK_BUDGET));
    }
}

/// Shrinks `report`, writes its schedule file and prints what is left; the file's path.
fn shrink_and_write(
    report: &Report,
    options: Options,
    switch: Option<String>,
    invariant: &str,
    budget: Duration,
) -> Option<PathBuf> {
    println!(
        "sim: shrinking {} seed={} ({} events) to keep violating \"{invariant}\" ...",
        report.scenario,
        report.seed,
        shrink::events(
            &runner::plan_for(find(report.scenario).expect("known scenario"), report.seed, &options),
            report.fault_writes
        )
        .len()
    );
    let (schedule, stats) = shrink::shrink(report, options, switch, invariant, budget);
    let plan = runner::plan_for(schedule.scenario(), schedule.seed, &options);
    let path = schedule.path();
    let written = std::fs::create_dir_all(shrink::traces_dir())
        .and_then(|()| std::fs::write(&path, schedule.to_json(&plan, &stats, &path)));
    println!(
        "shrunk {} seed={}: {} of {} events left after {} runs in {:.1} s{}; still violates \"{invariant}\"",
        schedule.scenario,
        schedule.seed,
        schedule.keep.len(),
        stats.from,
        stats.runs,
        stats.elapsed.as_secs_f64(),
        if stats.out_of_time {
            " (out of time: not minimal)"
        } else {
            ""
        },
    );
    for event in &schedule.keep {
        println!("    {}", shrink::describe(&plan, event));
    }
    match written {
        Ok(()) => {
            println!("  replay: cargo test -p sim-tests -- --schedule {}", path.display());
            Some(path)
        }
        Err(error) => {
            println!("  could not write the schedule to {}: {error}", path.display());
            None
        }
    }
}

/// The options a schedule's switch names.
fn switch_options(switch: Option<&str>) -> Result<Options, String> {
    match switch {
        None => Ok(Options::default()),
        Some("negative-control") => Ok(Options {
            negative_control: true,
            ..Options::default()
        }),
        Some(name) => REGRESSION_SWITCHES
            .iter()
            .find(|switch| switch.name == name)
            .map(|switch| (switch.options)())
            .ok_or_else(|| format!("unknown regression switch {name:?}")),
    }
}

/// Replays a schedule file twice (the second time to check the trace is byte-identical).
/// Succeeds only when no invariant is violated, like any run: a schedule that still
/// reproduces its bug fails.
fn replay_schedule(path: &Path) -> bool {
    let loaded = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))
        .and_then(|text| Schedule::from_json(&text))
        .and_then(|schedule| Ok((switch_options(schedule.switch.as_deref())?, schedule)));
    let (options, schedule) = match loaded {
        Ok(loaded) => loaded,
        Err(error) => {
            println!("sim: {error}");
            return false;
        }
    };
    let report = schedule.run(options);
    let again = schedule.run(options);
    if report.passed() {
        println!(
            "ok     {:<28} seed={:<6} schedule {} ({} events): no invariant violated",
            report.scenario,
            report.seed,
            path.display(),
            schedule.keep.len()
        );
    } else {
        print_failure(&report, schedule.switch.as_deref() == Some("negative-control"));
        println!(
            "  replay this schedule: cargo test -p sim-tests -- --schedule {}",
            path.display()
        );
    }
    println!(
        "sim: the schedule's invariant \"{}\" {}",
        schedule.invariant,
        if schedule.reproduced_by(&report) {
            "was violated again"
        } else {
            "was not violated"
        }
    );
    let same = report.trace == again.trace;
    println!(
        "{}   {:<28} seed={:<6} the schedule's replay gave {} trace",
        if same { "same" } else { "FAILED" },
        report.scenario,
        report.seed,
        if same { "a byte-identical" } else { "a different" }
    );
    report.passed() && same
}

fn regression_seeds() -> bool {
    let jobs: Vec<(&'static Scenario, u64)> = REGRESSION_SEEDS
        .iter()
        .map(|(name, seed, _)| (find(name).expect("regression scenario exists"), *seed))
        .collect();
    let mut ok = true;
    for (report, (_, _, bug)) in run_parallel(jobs, Options::default()).iter().zip(REGRESSION_SEEDS) {
        if report.passed() {
            println!(
                "ok     {:<28} seed={:<6} regression: {bug}",
                report.scenario, report.seed
            );
        } else {
            ok = false;
            print_failure(report, false);
        }
    }
    ok
}

fn print_failure(report: &Report, negative_control: bool) {
    println!(
        "FAILED {:<28} seed={:<6}{}",
        report.scenario,
        report.seed,
        if negative_control { " (negative control)" } else { "" }
    );
    for violation in &report.violations {
        println!("  invariant violated: {}: {}", violation.invariant, violation.detail);
    }
    let mut replay = format!(
        "cargo test -p sim-tests -- --seed {} --scenario {}",
        report.seed, report.scenario
    );
    if negative_control {
        replay.push_str(" --negative-control");
    }
    println!("  replay: {replay} --trace");
    println!("  fault schedule:");
    for line in &report.schedule {
        println!("    {line}");
    }
    let lines: Vec<&str> = report.trace.lines().collect();
    let first_violation = report
        .violations
        .iter()
        .map(|violation| violation.at_line)
        .min()
        .unwrap_or(lines.len());
    let end = first_violation.min(lines.len());
    let start = end.saturating_sub(TRACE_TAIL_LINES);
    println!(
        "  trace up to the first violation (lines {}..{} of {}):",
        start + 1,
        end,
        lines.len()
    );
    for line in &lines[start..end] {
        println!("    {line}");
    }
    let dir = shrink::traces_dir();
    if std::fs::create_dir_all(&dir).is_ok() {
        let path = dir.join(format!("{}-{}.txt", report.scenario, report.seed));
        if std::fs::write(&path, &report.trace).is_ok() {
            println!("  full trace: {}", path.display());
        }
    }
}

/// Scenarios the negative control runs: formation with and without a partition.
const NEGATIVE_CONTROL_SCENARIOS: &[&str] = &["formation_3", "partition_during_formation"];

/// With the old self-election bug switched on, the suite must see a split brain.
fn negative_control(args: &Args) -> bool {
    let scenarios: Vec<&'static Scenario> = NEGATIVE_CONTROL_SCENARIOS
        .iter()
        .map(|name| find(name).expect("negative-control scenario exists"))
        .collect();
    let seeds = args.seeds.clone().unwrap_or(0..NEGATIVE_CONTROL_SEEDS);
    let options = Options {
        negative_control: true,
        ..Options::default()
    };
    let batch = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mut seed = seeds.start;
    while seed < seeds.end {
        let jobs: Vec<_> = (seed..(seed + batch).min(seeds.end))
            .flat_map(|seed| scenarios.iter().map(move |scenario| (*scenario, seed)))
            .collect();
        for report in run_parallel(jobs, options) {
            let split = report.violations.iter().find(|violation| {
                violation.invariant.contains("split brain") || violation.invariant.contains("one leader per term")
            });
            if let Some(violation) = split {
                println!(
                    "ok     negative control: with the self-election bug switched on, seed {} of {} shows \
                     \"{}\": {}",
                    report.seed, report.scenario, violation.invariant, violation.detail
                );
                if args.trace {
                    print_failure(&report, true);
                }
                return true;
            }
        }
        seed += batch;
    }
    println!(
        "FAILED negative control: the self-election bug went unnoticed over seeds {}..{} of {:?}",
        seeds.start, seeds.end, NEGATIVE_CONTROL_SCENARIOS
    );
    false
}

/// Historical Nomad CSI defects, re-created by a test-only switch: with the switch on, the
/// suite must report the leaked claim within this many seeds of the scenarios listed. The
/// search stops at the first catch, so the bound costs only a switch that got harder to catch:
/// `learner-left-behind` needs a swarm seed that keeps a server away until autopilot removes
/// it and then brings it back (seed 1306 once the client's controller turns moved into core).
const REGRESSION_SWITCH_SEEDS: u64 = 2000;
/// The defects the configuration can re-create, as `path: on` pairs read from `options`'
/// debug form (`csi_faults.abandon_failed_unpublish: false`, ...): every boolean fault flag,
/// whichever struct it sits in, found without a list to keep up to date.
fn fault_flags(options: &Options) -> Vec<(String, bool)> {
    let text = format!("{options:?}");
    let mut path: Vec<String> = Vec::new();
    let mut flags = Vec::new();
    for piece in text.split_inclusive(['{', '}', ',']) {
        let piece = piece.trim();
        if piece.ends_with('{') {
            // `csi_faults: CsiFaults {` (or the outer `Options {`): one level down.
            let field = piece.split(':').next().unwrap_or_default().trim().to_string();
            path.push(field);
        } else {
            let field = piece.trim_end_matches([',', '}']).trim();
            if let Some((name, value)) = field.split_once(": ")
                && let Ok(on) = value.trim().parse::<bool>()
            {
                let mut qualified: Vec<&str> = path.iter().skip(1).map(String::as_str).collect();
                qualified.push(name.trim());
                flags.push((qualified.join("."), on));
            }
            for _ in piece.matches('}') {
                path.pop();
            }
        }
    }
    flags
}

/// The formation defects `Options::bootstrap_fault` can name; the match fails to compile when
/// one is added, so it cannot be left out of this list (and so of the switch table's check).
fn bootstrap_faults() -> [BootstrapFault; 2] {
    let listed = |fault: BootstrapFault| match fault {
        BootstrapFault::SelfElectAfterElectionTimeout | BootstrapFault::SkipPeerQuery => (),
    };
    let all = [
        BootstrapFault::SelfElectAfterElectionTimeout,
        BootstrapFault::SkipPeerQuery,
    ];
    all.into_iter().for_each(listed);
    all
}

/// Every defect the simulation can re-create is in the switch table, so every run of the fast
/// lane tries it: a switch taken out of the table (or a new fault flag never given one) fails
/// the lane here, naming the flag.
fn every_fault_has_a_switch() -> bool {
    let switched: Vec<Options> = REGRESSION_SWITCHES.iter().map(|switch| (switch.options)()).collect();
    let mut missing: Vec<String> = Vec::new();
    for (flag, _) in fault_flags(&Options::default()) {
        if !switched
            .iter()
            .any(|options| fault_flags(options).contains(&(flag.clone(), true)))
        {
            missing.push(flag);
        }
    }
    for fault in bootstrap_faults() {
        let covered = switched.iter().any(|options| {
            options.bootstrap_fault == Some(fault)
                || (fault == BootstrapFault::SelfElectAfterElectionTimeout && options.negative_control)
        });
        if !covered {
            missing.push(format!("bootstrap_fault: {fault:?}"));
        }
    }
    if missing.is_empty() {
        println!(
            "ok     every fault flag the simulation can set has a regression switch ({} flags, {} switches)",
            fault_flags(&Options::default()).len() + bootstrap_faults().len(),
            REGRESSION_SWITCHES.len()
        );
        return true;
    }
    for flag in &missing {
        println!(
            "FAILED fault flag {flag} has no regression switch in sim-tests/src/cli.rs: nothing proves the \
             simulation still catches the defect it re-creates"
        );
    }
    false
}

/// A historical defect re-created on purpose: its number, what it does, the faults that
/// re-create it, the scenarios that must catch it, the invariant that must report it, and
/// where it was last caught.
struct Switch {
    name: &'static str,
    bug: &'static str,
    options: fn() -> Options,
    scenarios: &'static [&'static str],
    /// The invariant that must report it (alternatives separated by `|`).
    invariant: &'static str,
    /// The run that catches it: (scenario, seed), the first catch of the long lane's search
    /// from seed 0. The fast lane runs only this one and fails if it no longer catches the
    /// defect; `--long` prints the new first catch to record here.
    caught_by: (&'static str, u64),
}
const REGRESSION_SWITCHES: &[Switch] = &[
    Switch {
        name: "e812954",
        bug: "the self-election of Nomad before e812954: a server with bootstrap disabled still stands on its own and elects itself (the negative control's bug)",
        options: || Options {
            negative_control: true,
            ..Options::default()
        },
        scenarios: NEGATIVE_CONTROL_SCENARIOS,
        invariant: "split brain|one leader per term",
        caught_by: ("partition_during_formation", 0),
    },
    Switch {
        name: "10927",
        bug: "claims leak when unpublish fails once",
        options: || Options {
            csi_faults: CsiFaults {
                abandon_failed_unpublish: true,
                ..CsiFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["csi_controller_faults", "csi_node_detach_hang"],
        invariant: "leaked claims",
        caught_by: ("csi_controller_faults", 7),
    },
    Switch {
        name: "13416",
        bug: "detach blocked by a down node",
        options: || Options {
            csi_faults: CsiFaults {
                node_detach_on_down_node: true,
                ..CsiFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["csi_node_down"],
        invariant: "leaked claims",
        caught_by: ("csi_node_down", 0),
    },
    Switch {
        name: "8232",
        bug: "a drain stops the node plugin before its volumes are released",
        options: || Options {
            csi_faults: CsiFaults {
                drain_plugins_before_release: true,
                ..CsiFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["jobs_node_drain"],
        invariant: "a drain stops system and plugin allocations only after",
        caught_by: ("jobs_node_drain", 0),
    },
    Switch {
        name: "lagging-first-sync",
        bug: "a restarted client takes the first allocation list of a server still catching up, and destroys what it left out",
        options: || Options {
            client_faults: ClientFaults {
                trust_lagging_first_sync: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["servers_away", "swarm"],
        // The service job's allocation, destroyed and reported complete, is never replaced.
        invariant: "liveness",
        caught_by: ("servers_away", 45),
    },
    Switch {
        name: "8336",
        bug: "controller RPCs serialised per volume, not per plugin: two volumes' publishes race in one plugin",
        options: || Options {
            csi_faults: CsiFaults {
                serialize_per_volume: true,
                ..CsiFaults::default()
            },
            // The client's turn per plugin would hide the servers' per-volume queue.
            client_faults: ClientFaults {
                no_controller_turn: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["csi_leader_failover", "csi_controller_faults"],
        invariant: "at most one controller RPC in flight per plugin",
        caught_by: ("csi_leader_failover", 0),
    },
    Switch {
        name: "create-name",
        bug: "a create names the plugin's volume per request, not after the volume: a retry after a crash between create and register makes a second volume",
        options: || Options {
            csi_faults: CsiFaults {
                create_name_per_request: true,
                ..CsiFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["csi_create_crash"],
        invariant: "every volume the plugin made belongs to exactly one registered volume",
        caught_by: ("csi_create_crash", 0),
    },
    Switch {
        name: "create-topology",
        bug: "a created volume is registered without its accessible topology: its consumers are placed outside its zone",
        options: || Options {
            csi_faults: CsiFaults {
                create_drops_topology: true,
                ..CsiFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["csi_two_zones"],
        invariant: "consumers of a volume run only inside its accessible topology",
        caught_by: ("csi_two_zones", 0),
    },
    Switch {
        name: "task-leak",
        bug: "a task's processes are not destroyed once its leader is gone (issue 16)",
        options: || Options {
            client_faults: ClientFaults {
                skip_task_destroy: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["real_clients_job", "client_shared_stage"],
        invariant: "no task process outlives its task",
        caught_by: ("real_clients_job", 0),
    },
    Switch {
        name: "follow-task-links",
        bug: "files below an allocation directory are made, written and read by name: a link a task planted leads the agent, as root, onto the host's files (issue 54)",
        options: || Options {
            host_faults: HostFaults {
                follow_task_links: true,
            },
            ..Options::default()
        },
        scenarios: &["task_planted_links"],
        invariant: drover_io_sim::task_files::WRITTEN_OUTSIDE,
        caught_by: ("task_planted_links", 0),
    },
    Switch {
        name: "no-anti-entropy",
        bug: "Consul services are synced only on change: a deregistration failed while Consul was down is never retried",
        options: || Options {
            client_faults: ClientFaults {
                no_service_anti_entropy: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["real_clients_connect"],
        invariant: "nothing is left behind after a job stop",
        caught_by: ("real_clients_connect", 2),
    },
    Switch {
        name: "no-unmount-retry",
        bug: "a volume whose unmount fails in postrun is given up at once, not retried",
        options: || Options {
            client_faults: ClientFaults {
                no_unmount_retry: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["client_churn"],
        invariant: "nothing is left behind after a job stop",
        caught_by: ("client_churn", 35),
    },
    Switch {
        name: "max-parallel",
        bug: "a rollout's destructive updates are not held to max_parallel: every allocation of an updated group is replaced at once",
        options: || Options {
            scheduler_faults: SchedulerFaults {
                ignore_max_parallel: true,
                ..SchedulerFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["real_clients_rolling_update"],
        invariant: "a rollout never has more than max_parallel unhealthy replacements",
        caught_by: ("real_clients_rolling_update", 0),
    },
    Switch {
        name: "periodic-from-leadership",
        bug: "a new leader's periodic dispatcher counts from when it took office: a time that fell due during the election is never launched",
        options: || Options {
            scheduler_faults: SchedulerFaults {
                periodic_from_leadership: true,
                ..SchedulerFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["real_clients_periodic"],
        invariant: "every time a periodic spec names is launched once or counted as skipped",
        caught_by: ("real_clients_periodic", 6),
    },
    Switch {
        name: "cas-at-endpoint",
        bug: "a job register's EnforceIndex is checked only by the endpoint: two writers that read the same version, both in flight, both win",
        options: || Options {
            scheduler_faults: SchedulerFaults {
                enforce_index_at_endpoint_only: true,
                ..SchedulerFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["concurrent_writers"],
        invariant: "no acknowledged check-and-set write is silently overwritten",
        caught_by: ("concurrent_writers", 0),
    },
    Switch {
        name: "8609",
        bug: "a claim refused while the previous allocation still holds the volume is not retried: the replacement fails",
        options: || Options {
            client_faults: ClientFaults {
                no_claim_retry: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["real_clients_rolling_update", "real_clients_csi"],
        invariant: "a claim refused for capacity is waited out",
        caught_by: ("real_clients_rolling_update", 0),
    },
    Switch {
        name: "12744",
        bug: "a stopping plugin allocation deregisters its plugin by name, removing the replacement's registration",
        options: || Options {
            client_faults: ClientFaults {
                deregister_plugin_by_name: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["real_clients_csi", "client_churn"],
        invariant: "liveness",
        caught_by: ("real_clients_csi", 2),
    },
    Switch {
        name: "7200",
        bug: "a claim is not idempotent per allocation: an allocation claiming a volume it holds is refused",
        options: || Options {
            csi_faults: CsiFaults {
                claims_not_idempotent: true,
                ..CsiFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["swarm", "real_clients_csi"],
        invariant: "liveness",
        caught_by: ("swarm", 3),
    },
    Switch {
        name: "restore-dup",
        bug: "a task that cannot be reattached after a client restart is started again without killing the old process",
        options: || Options {
            client_faults: ClientFaults {
                restore_failure_keeps_process: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["client_churn"],
        invariant: "no task process outlives its task",
        caught_by: ("client_churn", 22),
    },
    Switch {
        name: "abandoned-wait",
        bug: "the docker driver stops watching a container whose wait broke (its daemon stopped or hung): the task is reported running after its container is gone",
        options: || Options {
            client_faults: ClientFaults {
                abandon_broken_waits: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["containers"],
        invariant: "no task reported running whose container is gone",
        caught_by: ("containers", 0),
    },
    Switch {
        name: "25293",
        bug: "a plugin that misses its health timeout is killed and left dead, not restarted",
        options: || Options {
            client_faults: ClientFaults {
                plugin_timeout_kills: true,
                ..ClientFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["client_plugin_never_healthy"],
        invariant: "a plugin that never becomes ready is restarted after its health timeout",
        caught_by: ("client_plugin_never_healthy", 0),
    },
    Switch {
        name: "si-leak",
        bug: "service identity tokens of a failed derivation are never revoked (issue 17)",
        options: || Options {
            connect_faults: ConnectFaults {
                keep_failed_derivation_tokens: true,
            },
            ..Options::default()
        },
        scenarios: &["real_clients_connect"],
        // "no SI token outlives its allocation ..." or "SI tokens alive in Consul are ...".
        invariant: "SI token",
        caught_by: ("real_clients_connect", 3),
    },
    Switch {
        name: "stale-read",
        bug: "consistent reads are served from the answering server's state without the read barrier (issue 19)",
        options: || Options {
            raft_faults: RaftFaults {
                local_consistent_reads: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["leader_killed", "lossy_network"],
        invariant: "consistent reads are linearizable",
        caught_by: ("leader_killed", 0),
    },
    Switch {
        name: "bootstrap-no-peer-check",
        bug: "a server bootstraps on seeing bootstrap_expect servers without asking for their Raft peers",
        options: || Options {
            bootstrap_fault: Some(BootstrapFault::SkipPeerQuery),
            ..Options::default()
        },
        scenarios: &["late_fourth_server", "consul_discovery"],
        invariant: "no split brain",
        caught_by: ("late_fourth_server", 0),
    },
    Switch {
        name: "deposed-leader-read",
        bug: "the leader names a read index without confirming it still leads (Raft §8)",
        options: || Options {
            raft_faults: RaftFaults {
                leader_reads_without_quorum: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["swarm", "leader_killed"],
        invariant: "consistent reads are linearizable",
        caught_by: ("swarm", 13),
    },
    Switch {
        name: "read-no-apply-wait",
        bug: "a consistent read does not wait to apply up to the leader's read index",
        options: || Options {
            raft_faults: RaftFaults {
                reads_skip_apply_wait: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["leader_killed", "lossy_network", "read_storm"],
        invariant: "consistent reads are linearizable",
        caught_by: ("lossy_network", 24),
    },
    Switch {
        name: "unsynced-log",
        bug: "log entries are acknowledged before they reach the disk",
        options: || Options {
            raft_faults: RaftFaults {
                unsynced_log: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["leader_killed", "restart_with_state"],
        invariant: "nothing acknowledged is lost",
        caught_by: ("restart_with_state", 164),
    },
    Switch {
        name: "no-fail-stop",
        bug: "an agent whose Raft storage failed stays up with Raft stopped instead of exiting",
        options: || Options {
            raft_faults: RaftFaults {
                linger_on_storage_error: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["swarm"],
        invariant: "liveness",
        caught_by: ("swarm", 2),
    },
    Switch {
        name: "read-joins-round",
        bug: "a consistent read joins the ReadIndex round already running, whose index predates it",
        options: || Options {
            raft_faults: RaftFaults {
                reads_join_running_round: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["read_storm", "leader_killed", "lossy_network"],
        invariant: "consistent reads are linearizable",
        caught_by: ("read_storm", 3),
    },
    Switch {
        name: "unsynced-vote",
        bug: "a vote is granted before it reaches the disk",
        options: || Options {
            raft_faults: RaftFaults {
                unsynced_vote: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["restart_with_state", "leader_killed", "swarm"],
        invariant: "a server votes once per term",
        caught_by: ("swarm", 4),
    },
    Switch {
        name: "purge-beyond-snapshot",
        bug: "the log is purged past what a durable snapshot covers",
        options: || Options {
            raft_faults: RaftFaults {
                purge_beyond_snapshot: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["servers_reform", "swarm"],
        // A follower installing a snapshot on a disk whose syncs fail: the purge reached the
        // disk, the snapshot did not, and the restarted server cannot read its log.
        invariant: "agent starts",
        caught_by: ("servers_reform", 22),
    },
    Switch {
        name: "swallowed-log-error",
        bug: "a failed log write is reported to Raft as durable, the error only logged",
        options: || Options {
            raft_faults: RaftFaults {
                swallow_log_write_errors: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["swarm"],
        // openraft's own check on the leader: a follower's log went back on entries it had
        // acknowledged ("follower log reversion"), reported as the server panicking.
        invariant: "no panic",
        caught_by: ("swarm", 8),
    },
    Switch {
        name: "learner-left-behind",
        bug: "a voter autopilot removed while it was gone comes back a Raft learner and is never made a voter again",
        options: || Options {
            raft_faults: RaftFaults {
                learner_left_behind: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["servers_away", "swarm"],
        invariant: "every live server ends up a voter of the one cluster",
        caught_by: ("servers_away", 32),
    },
    Switch {
        name: "no-gossip-reconnect",
        bug: "retry_join stops once a server has a gossip peer and a Raft leader: two gossip islands after a partition and a leader restart, and a server autopilot removed is never added back",
        options: || Options {
            raft_faults: RaftFaults {
                no_gossip_reconnect: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["servers_reform", "swarm"],
        invariant: "every live server ends up a voter of the one cluster",
        caught_by: ("servers_reform", 61),
    },
    Switch {
        name: "no-handover",
        bug: "a leader stopping gracefully names no successor (issue 19)",
        options: || Options {
            raft_faults: RaftFaults {
                skip_handover: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["leader_stops_gracefully"],
        invariant: "a graceful stop hands leadership over",
        caught_by: ("leader_stops_gracefully", 0),
    },
    Switch {
        name: "rpc-no-authz",
        bug: "agent RPC served whoever's certificate called: a client's certificate writes to the state directly (issue 21)",
        options: || Options {
            raft_faults: RaftFaults {
                skip_caller_check: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["leader_killed", "read_storm"],
        invariant: "only servers write directly",
        caught_by: ("leader_killed", 0),
    },
    Switch {
        name: "rpc-no-token-check",
        bug: "server calls over agent RPC carried no token and were served as with ACLs off: a client's certificate read secret variables, purged jobs, ran GC (issue 54)",
        options: || Options {
            raft_faults: RaftFaults {
                skip_token_check: true,
                ..RaftFaults::default()
            },
            ..Options::default()
        },
        scenarios: &["acl_rogue_client"],
        invariant: drover_io_sim::rogue::CALLS_REFUSED,
        caught_by: ("acl_rogue_client", 0),
    },
];

/// Shrinks a regression switch's catch, then replays the written schedule: it must violate the
/// same invariant again, byte for byte the same way twice.
fn shrink_switch_catch(report: &Report, options: Options, name: &str, invariant: &str) -> bool {
    shrink_switch_catch_within(report, options, name, invariant, SHRINK_BUDGET)
}

fn shrink_switch_catch_within(
    report: &Report,
    options: Options,
    name: &str,
    invariant: &str,
    budget: Duration,
) -> bool {
    let Some(path) = shrink_and_write(report, options, Some(name.to_string()), invariant, budget) else {
        return false;
    };
    let replayed = std::fs::read_to_string(&path)
        .map_err(|error| error.to_string())
        .and_then(|text| Schedule::from_json(&text));
    let schedule = match replayed {
        Ok(schedule) => schedule,
        Err(error) => {
            println!("FAILED the shrunk schedule of #{name} does not read back: {error}");
            return false;
        }
    };
    let (first, second) = (schedule.run(options), schedule.run(options));
    let reproduced = schedule.reproduced_by(&first);
    let same = first.trace == second.trace;
    if reproduced && same {
        println!(
            "ok     the shrunk schedule of #{name} ({} events), replayed from its file, violates \"{invariant}\" again, \
             with a byte-identical trace each time",
            schedule.keep.len()
        );
        true
    } else {
        println!(
            "FAILED the shrunk schedule of #{name}, replayed from its file: {}",
            if reproduced {
                "two replays gave different traces"
            } else {
                "the invariant was not violated"
            }
        );
        false
    }
}

/// A regression switch's first catch in a search.
struct Catch {
    scenario: &'static str,
    seed: u64,
    /// Wall time from the search's first run to the catch.
    elapsed: Duration,
    /// Runs made, the catching one included.
    runs: usize,
}

impl Switch {
    /// The violation by which `report` catches this switch's defect, if it does.
    fn caught<'a>(&self, report: &'a Report) -> Option<&'a drover_io_sim::trace::Violation> {
        report
            .violations
            .iter()
            .find(|violation| self.invariant.split('|').any(|one| violation.invariant.contains(one)))
    }
}

/// Searches for a run that catches switch `which`, from seed 0 (or over `--seeds`), as many
/// runs at a time as there are cores; shrinks the catch with `--shrink`.
fn regression_switch(args: &Args, which: &str) -> Option<Catch> {
    let switch = REGRESSION_SWITCHES
        .iter()
        .find(|switch| switch.name == which)
        .expect("known switch");
    let (name, bug) = (switch.name, switch.bug);
    let scenarios: Vec<&'static Scenario> = switch
        .scenarios
        .iter()
        .map(|name| find(name).expect("scenario"))
        .collect();
    let options = (switch.options)();
    let seeds = args.seeds.clone().unwrap_or(0..REGRESSION_SWITCH_SEEDS);
    let batch = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let started = Instant::now();
    let mut runs = 0;
    let mut seed = seeds.start;
    while seed < seeds.end {
        let jobs: Vec<_> = (seed..(seed + batch).min(seeds.end))
            .flat_map(|seed| scenarios.iter().map(move |scenario| (*scenario, seed)))
            .collect();
        for report in run_parallel(jobs, options) {
            runs += 1;
            if let Some(violation) = switch.caught(&report) {
                // A run that fails the same way with the switch off shows a defect of its
                // own, not this one: the search goes on past it (and the fast lane's control
                // run of the recorded seed would refuse it anyway).
                let scenario = find(report.scenario).expect("scenario");
                let control = run_parallel(vec![(scenario, report.seed)], Options::default());
                runs += 1;
                if control.first().and_then(|control| switch.caught(control)).is_some() {
                    println!(
                        "note   regression switch #{name}: seed {} of {} fails \"{}\" with the switch off too; not a catch",
                        report.seed, report.scenario, violation.invariant
                    );
                    continue;
                }
                let catch = Catch {
                    scenario: report.scenario,
                    seed: report.seed,
                    elapsed: started.elapsed(),
                    runs,
                };
                println!(
                    "ok     regression switch #{name} ({bug}): caught at seed {} of {} after {runs} runs in {:.1} s: \"{}\": {}",
                    report.seed,
                    report.scenario,
                    catch.elapsed.as_secs_f64(),
                    violation.invariant,
                    violation.detail
                );
                if args.trace {
                    println!(
                        "--- trace {} seed={} ---\n{}",
                        report.scenario, report.seed, report.trace
                    );
                }
                if args.shrink {
                    let budget = args.shrink_budget.unwrap_or(SHRINK_BUDGET);
                    if !shrink_switch_catch_within(&report, options, name, violation.invariant, budget) {
                        return None;
                    }
                }
                return Some(catch);
            }
        }
        seed += batch;
    }
    println!(
        "FAILED regression switch #{name} ({bug}) went unnoticed over seeds {}..{} of {:?}",
        seeds.start, seeds.end, switch.scenarios
    );
    None
}

/// How long the long lane may shrink each switch's catch.
const LONG_SHRINK_BUDGET: Duration = Duration::from_secs(30);

/// Invariants that need a scenario the long lane runs by default to be checked at all; one
/// never checked over the long lane's runs means its checker or its scenario stopped working.
fn coverage_floors(table: &crate::coverage::Table) -> bool {
    let mut ok = true;
    for invariant in drover_io_sim::invariants::all() {
        let invariant = invariant.name();
        if table.checks.get(invariant).copied().unwrap_or(0) == 0 {
            ok = false;
            println!("FAILED coverage floor: the invariant \"{invariant}\" was never checked");
        }
    }
    for kind in table.rare_faults() {
        ok = false;
        println!("FAILED coverage floor: the fault kind \"{kind}\" was played in under 1% of runs");
    }
    for transition in crate::coverage::EXPECTED_REACHED {
        if table.reached.get(*transition).copied().unwrap_or(0) == 0 {
            ok = false;
            println!("FAILED coverage floor: \"{transition}\" was never reached");
        }
    }
    for reached in table.reached.keys() {
        if !crate::coverage::EXPECTED_REACHED.contains(&reached.as_str()) {
            println!(
                "note   coverage: \"{reached}\" is reached but not in coverage::EXPECTED_REACHED: add it, so the floor holds it"
            );
        }
    }
    if ok {
        println!(
            "ok     coverage floors: every invariant checked, every fault kind in at least 1% of runs, \
             every expected transition reached"
        );
    }
    ok
}
