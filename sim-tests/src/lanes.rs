//! Which simulation lane a command is for.
//!
//! `cargo test -p sim-tests -- ARGS` hands the same ARGS to both test binaries: the madsim
//! lane (`tests/sim.rs`) and the turmoil lane (`tests/turmoil.rs`). Each binary is built in a
//! different world and knows only its own scenarios, so this module (compiled in both) holds
//! what each lane needs to know of the other to step aside rather than fail: `--lane` chooses
//! one outright; otherwise a lane skips (exit 0, saying why) a command that names a scenario,
//! switch or flag that belongs to the other lane. A name that belongs to neither is still an
//! error in the madsim lane, so a typo never passes.

/// The two lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Madsim,
    Turmoil,
}

impl Lane {
    pub fn name(self) -> &'static str {
        match self {
            Lane::Madsim => "madsim",
            Lane::Turmoil => "turmoil",
        }
    }

    fn parse(text: &str) -> Result<Lane, String> {
        match text {
            "madsim" => Ok(Lane::Madsim),
            "turmoil" => Ok(Lane::Turmoil),
            other => Err(format!("unknown lane {other:?}: expected madsim or turmoil")),
        }
    }
}

/// The turmoil lane's scenarios (its `scenarios::all()` is checked against this on every run).
pub const TURMOIL_SCENARIOS: &[&str] = &["formation", "leader_kill", "partition_loss", "csi_claim"];
/// The turmoil lane's regression switches (checked like the scenarios).
pub const TURMOIL_SWITCHES: &[&str] = &["no-keepalive"];
/// Flags only the madsim lane has.
pub const MADSIM_ONLY_FLAGS: &[&str] = &[
    "--negative-control",
    "--check-determinism",
    "--coverage",
    "--schedule",
    "--shrink",
    "--no-shrink",
    "--log",
    "--per-scenario",
    "--bench-jobs",
    "--bench-idle",
    "--catch-times",
];

/// What a lane does with a command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Run it, with these arguments (`--lane` taken out).
    Run(Vec<String>),
    /// Step aside: the command is the other lane's, for this reason.
    Skip(String),
}

/// Values of `flag` in `args` (`--flag v` or `--flag=v`, comma lists split).
fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == flag {
            if let Some(value) = iter.next() {
                found.extend(value.split(','));
            }
        } else if let Some(value) = arg.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
            found.extend(value.split(','));
        }
    }
    found
}

/// Decides whether `lane` runs `args`.
pub fn route(lane: Lane, args: &[String]) -> Result<Route, String> {
    let chosen = values(args, "--lane")
        .first()
        .map(|text| Lane::parse(text))
        .transpose()?;
    let rest: Vec<String> = {
        let mut rest = Vec::new();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            if arg == "--lane" {
                iter.next();
            } else if !arg.starts_with("--lane=") {
                rest.push(arg.clone());
            }
        }
        rest
    };
    match chosen {
        Some(chosen) if chosen == lane => return Ok(Route::Run(rest)),
        Some(chosen) => return Ok(Route::Skip(format!("--lane {} chosen", chosen.name()))),
        None => {}
    }
    let scenarios = values(&rest, "--scenario");
    let switches = values(&rest, "--regression-switch");
    match lane {
        Lane::Turmoil => {
            if let Some(flag) = rest
                .iter()
                .map(|arg| arg.split('=').next().unwrap_or(arg))
                .find(|flag| MADSIM_ONLY_FLAGS.contains(flag))
            {
                return Ok(Route::Skip(format!("{flag} is the madsim lane's")));
            }
            if let Some(name) = scenarios.iter().find(|name| !TURMOIL_SCENARIOS.contains(name)) {
                return Ok(Route::Skip(format!("{name:?} is not a turmoil scenario")));
            }
            if let Some(name) = switches.iter().find(|name| !TURMOIL_SWITCHES.contains(name)) {
                return Ok(Route::Skip(format!("{name:?} is not a turmoil regression switch")));
            }
        }
        Lane::Madsim => {
            if !scenarios.is_empty() && scenarios.iter().all(|name| TURMOIL_SCENARIOS.contains(name)) {
                return Ok(Route::Skip("only turmoil scenarios named".to_string()));
            }
            if !switches.is_empty() && switches.iter().all(|name| TURMOIL_SWITCHES.contains(name)) {
                return Ok(Route::Skip("a turmoil regression switch named".to_string()));
            }
        }
    }
    Ok(Route::Run(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    fn runs(lane: Lane, line: &str) -> bool {
        matches!(route(lane, &args(line)).unwrap(), Route::Run(_))
    }

    #[test]
    fn each_lane_takes_its_own_and_skips_the_others() {
        // The README's commands: each runs in one lane at least, and no lane fails on them.
        let madsim_only = [
            "--seed 42 --scenario leader_killed --trace",
            "--seeds 0..100 --coverage cov.json",
            "--negative-control",
            "--regression-switch 10927",
            "--schedule target/sim-traces/swarm-937.schedule.json",
        ];
        for line in madsim_only {
            assert!(runs(Lane::Madsim, line), "{line}");
            assert!(!runs(Lane::Turmoil, line), "{line}");
        }
        let turmoil_only = [
            "--seed 3 --scenario leader_kill --trace",
            "--regression-switch no-keepalive",
        ];
        for line in turmoil_only {
            assert!(!runs(Lane::Madsim, line), "{line}");
            assert!(runs(Lane::Turmoil, line), "{line}");
        }
        for line in ["", "--seed 42", "--seeds 0..10", "--list", "--long"] {
            assert!(runs(Lane::Madsim, line), "{line}");
            assert!(runs(Lane::Turmoil, line), "{line}");
        }
    }

    #[test]
    fn lane_chooses_outright_and_is_taken_out() {
        assert_eq!(
            route(Lane::Turmoil, &args("--lane turmoil --seed 1")).unwrap(),
            Route::Run(args("--seed 1"))
        );
        assert!(!runs(Lane::Madsim, "--lane=turmoil --seed 1"));
        // Chosen outright, a lane runs even names it does not know, and reports them.
        assert!(runs(Lane::Turmoil, "--lane turmoil --scenario leader_killed"));
        assert!(route(Lane::Madsim, &args("--lane both")).is_err());
    }

    #[test]
    fn a_typo_still_reaches_the_madsim_lane() {
        assert!(runs(Lane::Madsim, "--scenario leader_kiled"));
        assert!(!runs(Lane::Turmoil, "--scenario leader_kiled"));
    }
}
