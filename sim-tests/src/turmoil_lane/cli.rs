//! The turmoil lane's command line: `--seed N`, `--seeds A..B`, `--scenario NAME` (repeatable),
//! `--trace` (print each run's trace), `--list`, `--regression-switch NAME` (re-create a fixed
//! defect; the default run checks that each is caught), `--real-time-jitter` (replay every
//! seed with the driving thread paused in real time now and then; the long lane does so for
//! every fifth seed). Every run is replayed and its trace compared
//! byte for byte; a failing run prints its violations and the tail of its trace, which is also
//! written to `target/turmoil-failures/<scenario>-<seed>.trace`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use drover_io_sim::turmoil::cluster::RealTimeJitter;

use super::scenarios::{self, Scenario};
use super::{Report, run, run_jittered};

/// Seeds per scenario when none are given: the fast lane, what CI runs.
const DEFAULT_SEEDS: std::ops::Range<u64> = 0..3;
/// Seeds per scenario in the long lane (`--long`).
const LONG_SEEDS: std::ops::Range<u64> = 0..50;
/// A regression switch must be caught within this many seeds.
const SWITCH_SEEDS: u64 = 100;
const TRACE_TAIL_LINES: usize = 40;
/// In the long lane, the replay of every seed divisible by this is jittered in real time
/// (`--real-time-jitter` jitters every replay).
const LONG_JITTER_EVERY: u64 = 5;
/// About 500 pauses of up to 2 ms and three of up to 1.5 s (longer than h2 remembers a reset
/// stream) in a run of 10 virtual seconds: about three seconds added to it.
const JITTER_PAUSES: [(u32, Duration); 2] = [(20, Duration::from_millis(2)), (3_000, Duration::from_millis(1_500))];

struct Args {
    /// Seeds given on the command line (the default range otherwise).
    explicit_seeds: bool,
    /// Run only this regression switch.
    switch: Option<&'static scenarios::Switch>,
    seeds: std::ops::Range<u64>,
    scenarios: Vec<&'static Scenario>,
    trace: bool,
    list: bool,
    /// The long lane: more seeds, and each switch searched from seed 0.
    long: bool,
    /// Parse and route the arguments, say what would run, run nothing.
    dry_run: bool,
    /// Replay every seed with the driving thread paused in real time now and then.
    jitter: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        explicit_seeds: false,
        switch: None,
        seeds: DEFAULT_SEEDS,
        scenarios: Vec::new(),
        trace: false,
        list: false,
        long: false,
        dry_run: false,
        jitter: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--seed" => {
                let seed = value("--seed")?;
                let seed: u64 = seed.parse().map_err(|_| format!("--seed {seed:?} is not a number"))?;
                parsed.seeds = seed..seed + 1;
                parsed.explicit_seeds = true;
            }
            "--seeds" => {
                let range = value("--seeds")?;
                let (from, to) = range
                    .split_once("..")
                    .and_then(|(from, to)| Some((from.parse().ok()?, to.parse().ok()?)))
                    .ok_or_else(|| format!("--seeds {range:?} is not A..B"))?;
                parsed.seeds = from..to;
                parsed.explicit_seeds = true;
            }
            "--regression-switch" => {
                let name = value("--regression-switch")?;
                let names: Vec<&str> = scenarios::SWITCHES.iter().map(|switch| switch.name).collect();
                parsed.switch = Some(scenarios::find_switch(&name).ok_or_else(|| {
                    format!(
                        "unknown regression switch {name:?}: expected one of {}",
                        names.join(", ")
                    )
                })?);
            }
            "--scenario" => {
                let name = value("--scenario")?;
                let scenario = scenarios::find(&name).ok_or_else(|| format!("no turmoil scenario {name:?}"))?;
                parsed.scenarios.push(scenario);
            }
            "--trace" => parsed.trace = true,
            "--list" => parsed.list = true,
            "--long" => parsed.long = true,
            "--dry-run" => parsed.dry_run = true,
            "--real-time-jitter" => parsed.jitter = true,
            // cargo test's own flags, passed through by the harness-less target.
            "--nocapture" | "--show-output" | "--quiet" | "-q" | "--include-ignored" | "--ignored" | "--exact" => {}
            "--test-threads" | "--color" | "--format" => {
                value(arg)?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.scenarios.is_empty() {
        parsed.scenarios = scenarios::all().iter().collect();
    }
    if parsed.long && !parsed.explicit_seeds {
        parsed.seeds = LONG_SEEDS;
    }
    Ok(parsed)
}

/// With `DROVER_SIM_LOG` set to a tracing filter (`debug`, `drover_io_real=trace`), the agents'
/// logs go to stderr stamped with the simulation's virtual time, so two runs of a seed can be
/// compared line by line.
fn log_on_the_simulated_clock() {
    struct Virtual;
    impl tracing_subscriber::fmt::time::FormatTime for Virtual {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            match turmoil::sim_elapsed() {
                Some(at) => write!(w, "{:>10.6}", at.as_secs_f64()),
                None => write!(w, "{:>10}", "-"),
            }
        }
    }
    let Ok(filter) = std::env::var("DROVER_SIM_LOG") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_timer(Virtual)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    log_on_the_simulated_clock();
    // What the madsim lane needs to know of this one (crate::lanes) must stay true.
    let names: Vec<&str> = scenarios::all().iter().map(|scenario| scenario.name).collect();
    let switches: Vec<&str> = scenarios::SWITCHES.iter().map(|switch| switch.name).collect();
    assert_eq!(
        names,
        crate::lanes::TURMOIL_SCENARIOS,
        "crate::lanes::TURMOIL_SCENARIOS is stale"
    );
    assert_eq!(
        switches,
        crate::lanes::TURMOIL_SWITCHES,
        "crate::lanes::TURMOIL_SWITCHES is stale"
    );
    let args = match crate::lanes::route(crate::lanes::Lane::Turmoil, &args) {
        Ok(crate::lanes::Route::Run(args)) => args,
        Ok(crate::lanes::Route::Skip(why)) => {
            println!("turmoil lane: skipped ({why})");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("turmoil lane: {error}");
            return ExitCode::FAILURE;
        }
    };
    let args = match parse(&args) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("turmoil lane: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.dry_run {
        println!(
            "turmoil lane: would run {} scenario(s), seeds {:?}",
            args.scenarios.len(),
            args.seeds
        );
        return ExitCode::SUCCESS;
    }
    if args.list {
        for scenario in scenarios::all() {
            println!("{:<16} {}", scenario.name, scenario.about);
        }
        return ExitCode::SUCCESS;
    }
    if let Some(switch) = args.switch {
        let seeds = if args.explicit_seeds {
            args.seeds.clone()
        } else {
            0..SWITCH_SEEDS
        };
        return if catch(switch, seeds) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let started = Instant::now();
    let (mut runs, mut failed) = (0u64, 0u64);
    let mut virtual_time = Duration::ZERO;
    for scenario in &args.scenarios {
        for seed in args.seeds.clone() {
            let report = run(scenario, seed);
            let jitter = (args.jitter || (args.long && seed % LONG_JITTER_EVERY == 0)).then_some(RealTimeJitter {
                seed,
                pauses: JITTER_PAUSES,
            });
            let replay = run_jittered(scenario, seed, None, jitter);
            runs += 2;
            virtual_time += report.virtual_time + replay.virtual_time;
            if args.trace {
                print!("{}", report.trace);
            }
            let replayed = report.trace == replay.trace;
            println!(
                "{} seed {seed}: {} in {:.1} s virtual, {} writes acknowledged, {} reads{}",
                scenario.name,
                if report.passed() { "ok" } else { "FAILED" },
                report.virtual_time.as_secs_f64(),
                report.writes_acknowledged,
                report.reads,
                match (replayed, jitter.is_some()) {
                    (true, false) => ", replay identical",
                    (true, true) => ", replay identical (real time jittered)",
                    (false, false) => ", REPLAY DIFFERS",
                    (false, true) => ", REPLAY DIFFERS (real time jittered)",
                },
            );
            if !report.passed() || !replayed {
                failed += 1;
                explain(&report, &replay, replayed);
            }
        }
    }
    let wall = started.elapsed();
    println!(
        "turmoil lane: {runs} runs (each seed twice) in {:.1} s ({:.0} runs/min, {:.0}x virtual time), {failed} failed",
        wall.as_secs_f64(),
        runs as f64 * 60.0 / wall.as_secs_f64().max(1e-9),
        virtual_time.as_secs_f64() / wall.as_secs_f64().max(1e-9),
    );
    // The default run also proves the lane catches every re-created defect: at its recorded
    // run in the fast lane, searched from seed 0 (and timed) in the long lane.
    if (!args.explicit_seeds || args.long) && args.scenarios.len() == scenarios::all().len() {
        for switch in scenarios::SWITCHES {
            let caught = if args.long {
                catch(switch, 0..SWITCH_SEEDS)
            } else {
                caught_where_recorded(switch)
            };
            if !caught {
                failed += 1;
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The violation by which `report` catches `switch`'s defect, if it does.
fn caught<'a>(switch: &scenarios::Switch, report: &'a Report) -> Option<&'a super::Violation> {
    report
        .violations
        .iter()
        .find(|violation| switch.invariants.contains(&violation.invariant))
}

/// Runs the switch at the run its table records; it must still catch the defect.
fn caught_where_recorded(switch: &scenarios::Switch) -> bool {
    let (name, seed) = switch.caught_by;
    let scenario = scenarios::find(name).expect("the switch's recorded scenario exists");
    let report = super::run_with(scenario, seed, Some(switch));
    match caught(switch, &report) {
        Some(violation) => {
            println!(
                "ok     regression switch {} ({}) caught at its recorded seed {seed} of {name}: {}",
                switch.name, switch.bug, violation.invariant
            );
            true
        }
        None => {
            println!(
                "FAILED regression switch {} is no longer caught at its recorded seed {seed} of {name}: search for it \
                 (cargo test -p sim-tests --test turmoil -- --regression-switch {}) and record the new catch in \
                 sim-tests/src/turmoil_lane/scenarios.rs, or find what stopped catching it",
                switch.name, switch.name
            );
            false
        }
    }
}

/// Runs the switch's scenarios over `seeds` until one of its invariants reports it.
fn catch(switch: &scenarios::Switch, seeds: std::ops::Range<u64>) -> bool {
    let started = Instant::now();
    let mut tried = 0;
    for seed in seeds.clone() {
        for name in switch.scenarios {
            let scenario = scenarios::find(name).expect("the switch's scenario exists");
            let report = super::run_with(scenario, seed, Some(switch));
            tried += 1;
            if let Some(violation) = caught(switch, &report) {
                println!(
                    "ok     regression switch {} ({}) caught by {} seed {seed} after {tried} runs in {:.1} s: {}: {}",
                    switch.name,
                    switch.bug,
                    scenario.name,
                    started.elapsed().as_secs_f64(),
                    violation.invariant,
                    violation.detail
                );
                return true;
            }
        }
    }
    println!(
        "FAILED regression switch {} ({}) not caught in seeds {seeds:?} ({tried} runs)",
        switch.name, switch.bug
    );
    false
}

fn explain(report: &Report, replay: &Report, replayed: bool) {
    for violation in &report.violations {
        println!(
            "  violated {} (trace line {}): {}",
            violation.invariant, violation.at_line, violation.detail
        );
    }
    if !replayed {
        let first = report
            .trace
            .lines()
            .zip(replay.trace.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| report.trace.lines().count().min(replay.trace.lines().count()));
        println!("  the replay's trace differs from line {}:", first + 1);
        println!("    run:    {}", report.trace.lines().nth(first).unwrap_or("<end>"));
        println!("    replay: {}", replay.trace.lines().nth(first).unwrap_or("<end>"));
    }
    let lines: Vec<&str> = report.trace.lines().collect();
    println!("  last {TRACE_TAIL_LINES} lines of the trace:");
    for line in &lines[lines.len().saturating_sub(TRACE_TAIL_LINES)..] {
        println!("    {line}");
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("turmoil-failures");
    let file = dir.join(format!("{}-{}.trace", report.scenario, report.seed));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, &report.trace)) {
        Ok(()) => println!("  trace written to {}", file.display()),
        Err(error) => println!("  could not write the trace to {}: {error}", file.display()),
    }
    if !replayed {
        let file = dir.join(format!("{}-{}.replay.trace", report.scenario, report.seed));
        match std::fs::write(&file, &replay.trace) {
            Ok(()) => println!("  the replay's trace written to {}", file.display()),
            Err(error) => println!("  could not write the replay's trace to {}: {error}", file.display()),
        }
    }
}
