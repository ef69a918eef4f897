//! The demo that must always work, run as the README shows it: `scripts/demo.sh` against the
//! binaries this test build made (root only: exec tasks and CSI mounts need it) — with one
//! `agent -dev`, and with three servers whose leader is killed while the writer runs.

use std::path::Path;
use std::process::Command;

/// Runs the demo script; `None` when not root.
fn run_demo(args: &[&str], port: u16) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the demo needs root (CI runs as root)");
        return None;
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_agent")).parent().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo.sh");
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .env("SKIP_BUILD", "1")
        .env("BIN", bin)
        .env("DEMO_HTTP_PORT", port.to_string())
        .output()
        .expect("the demo script runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("the reader printed: hello from the writer"), "{stdout}");
    assert!(stdout.contains("demo complete"), "{stdout}");
    // The writer's claim was visible while it ran, and every claim was released at the end.
    assert!(stdout.contains("write=['"), "{stdout}");
    let calls: Vec<&str> = stdout
        .lines()
        .skip_while(|line| !line.contains("the CSI calls the plugin saw"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .map(str::trim)
        .collect();
    let position = |name: &str| {
        calls
            .iter()
            .position(|call| *call == name)
            .unwrap_or_else(|| panic!("no {name} in {calls:?}"))
    };
    let (stage, publish, unpublish, unstage) = (
        position("NodeStageVolume"),
        position("NodePublishVolume"),
        position("NodeUnpublishVolume"),
        position("NodeUnstageVolume"),
    );
    assert!(
        stage < publish && publish < unpublish && unpublish < unstage,
        "{calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|call| **call == "NodePublishVolume").count(),
        2,
        "one publish per consumer: {calls:?}"
    );
    Some(stdout)
}

#[test]
fn the_demo_script_runs_end_to_end() {
    run_demo(&[], 24646);
}

#[test]
fn the_demo_with_three_servers_survives_the_leader_being_killed() {
    let Some(stdout) = run_demo(&["--servers", "3"], 25646) else {
        return;
    };
    assert!(stdout.contains("with SIGKILL"), "{stdout}");
    assert!(stdout.contains("new leader:"), "{stdout}");
    // The writer's claim, taken before the kill, was released through the new leader.
    let after_kill: Vec<&str> = stdout
        .lines()
        .skip_while(|line| !line.contains("new leader:"))
        .filter(|line| line.contains("claims:"))
        .collect();
    assert_eq!(after_kill.first(), Some(&"  claims: read=[] write=[]"), "{stdout}");
}
