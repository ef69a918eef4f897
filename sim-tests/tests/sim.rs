//! `cargo test -p sim-tests -- --seed N` (or `--seeds A..B`, or nothing for the fast lane, or
//! `--long` for the long one; `--lane madsim|turmoil` picks one of the two lanes).
//!
//! In a normal build this binary is a trampoline: it re-runs itself through cargo with
//! `--cfg madsim` and a separate target directory (`target/madsim`), so nobody has to remember
//! the flags. Under madsim it runs the scenarios.

use std::process::ExitCode;

#[cfg(madsim)]
fn main() -> ExitCode {
    sim_tests::cli::main()
}

#[cfg(not(madsim))]
fn main() -> ExitCode {
    use std::path::Path;
    use std::process::Command;

    let args: Vec<String> = std::env::args().skip(1).collect();
    // A command for the turmoil lane alone needs no madsim build.
    if let Ok(sim_tests::lanes::Route::Skip(why)) = sim_tests::lanes::route(sim_tests::lanes::Lane::Madsim, &args) {
        println!("madsim lane: skipped ({why})");
        return ExitCode::SUCCESS;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim-tests lives in the workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    // The same flags as scripts/test.sh's madsim lines, or target/madsim rebuilds every time.
    // `tokio_unstable` lets each run seed tokio's `select!` generator (runner.rs).
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    for cfg in ["madsim", "tokio_unstable"] {
        if !rustflags.split_whitespace().any(|flag| flag == cfg) {
            rustflags.push_str(" --cfg ");
            rustflags.push_str(cfg);
        }
    }
    eprintln!("sim-tests: building the simulation under --cfg madsim in target/madsim ...");
    let status = Command::new(cargo)
        .current_dir(workspace)
        .env("RUSTFLAGS", rustflags.trim())
        .env("CARGO_TARGET_DIR", workspace.join("target").join("madsim"))
        .args(["test", "--profile", "sim", "-p", "sim-tests", "--test", "sim", "--"])
        .args(&args)
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("sim-tests: simulation failed ({status})");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("sim-tests: could not run cargo: {error}");
            ExitCode::FAILURE
        }
    }
}
