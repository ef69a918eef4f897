//! `cargo test -p sim-tests --test turmoil -- --seeds A..B` (or `--seed N`, `--scenario NAME`):
//! the turmoil lane (`sim_tests::turmoil_lane`).
//!
//! Built without `--cfg tokio_unstable`, this binary is a trampoline: it re-runs itself through
//! cargo with that flag and a separate target directory (`target/turmoil`), because only then
//! can turmoil seed each host's tokio runtime, whose `select!` would otherwise draw its branch
//! order from the OS and break replays. Under madsim it is empty (the madsim lane is
//! `tests/sim.rs`).

use std::process::ExitCode;

#[cfg(all(not(madsim), tokio_unstable))]
fn main() -> ExitCode {
    sim_tests::turmoil_lane::cli::main()
}

#[cfg(madsim)]
fn main() -> ExitCode {
    eprintln!("the turmoil lane runs in a normal build: cargo test -p sim-tests --test turmoil");
    ExitCode::SUCCESS
}

#[cfg(all(not(madsim), not(tokio_unstable)))]
fn main() -> ExitCode {
    use std::path::Path;
    use std::process::Command;

    let args: Vec<String> = std::env::args().skip(1).collect();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim-tests lives in the workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    // The same flags as scripts/test.sh's turmoil lines, or target/turmoil rebuilds every time.
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !rustflags.split_whitespace().any(|flag| flag == "tokio_unstable") {
        rustflags.push_str(" --cfg tokio_unstable");
    }
    eprintln!("sim-tests: building the turmoil lane under --cfg tokio_unstable in target/turmoil ...");
    let status = Command::new(cargo)
        .current_dir(workspace)
        .env("RUSTFLAGS", rustflags.trim())
        .env("CARGO_TARGET_DIR", workspace.join("target").join("turmoil"))
        .args(["test", "--profile", "sim", "-p", "sim-tests", "--test", "turmoil", "--"])
        .args(&args)
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("sim-tests: the turmoil lane failed ({status})");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("sim-tests: could not run cargo: {error}");
            ExitCode::FAILURE
        }
    }
}
