//! The demo that must always work, run as the README shows it: `scripts/demo.sh` against the
//! binaries this test build made (root only: exec tasks and CSI mounts need it).

use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_script_runs_end_to_end() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the demo needs root (CI runs as root)");
        return;
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_agent")).parent().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo.sh");
    let output = Command::new("bash")
        .arg(&script)
        .env("SKIP_BUILD", "1")
        .env("BIN", bin)
        .env("DEMO_HTTP_PORT", "24646")
        .output()
        .expect("the demo script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
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
    let stage = calls
        .iter()
        .position(|call| *call == "NodeStageVolume")
        .expect("staged");
    let publish = calls
        .iter()
        .position(|call| *call == "NodePublishVolume")
        .expect("published");
    let unpublish = calls
        .iter()
        .position(|call| *call == "NodeUnpublishVolume")
        .expect("unpublished");
    let unstage = calls
        .iter()
        .position(|call| *call == "NodeUnstageVolume")
        .expect("unstaged");
    assert!(
        stage < publish && publish < unpublish && unpublish < unstage,
        "{calls:?}"
    );
}
