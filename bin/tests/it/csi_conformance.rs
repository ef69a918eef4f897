//! `drover-csi-check` against `drover-csi-fake` in every configuration of its flags: each
//! configuration passes every case its flags advertise what it needs for, and skips exactly
//! the others. Two planted spec violations (`--bug`) are caught by name, so the check can fail.
//! Real sockets, real bind mounts (root).

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::ChildGuard;

const PLUGIN: &str = env!("CARGO_BIN_EXE_drover-csi-fake");
const CHECK: &str = env!("CARGO_BIN_EXE_drover-csi-check");

/// Unmounts anything left under `dir` when dropped (a failed case must not leak mounts).
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|line| line.split_whitespace().nth(4))
                .filter(|point| point.starts_with(&*self.0.to_string_lossy()))
                .collect();
            points.sort_by_key(|point| std::cmp::Reverse(point.len()));
            for point in points {
                let _ = Command::new("umount").arg(point).status();
            }
        }
    }
}

/// Runs the check against a fake started with `flags`: the check's exit code and report.
fn check(flags: &[&str]) -> (i32, String) {
    let (code, report, _) = check_with(flags, &[], true);
    (code, report)
}

/// [`check`] with `args` for the checker, and a `--work-dir` of the test's unless
/// `own_work_dir` is false (the checker makes its own); also the checker's pid.
fn check_with(flags: &[&str], args: &[&str], own_work_dir: bool) -> (i32, String, u32) {
    let dir = tempfile::tempdir().unwrap();
    let _unmount = Unmount(dir.path());
    let socket = dir.path().join("csi.sock");
    let _plugin = ChildGuard(
        Command::new(PLUGIN)
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--state-dir={}", dir.path().join("state").display()))
            .arg("--node-id=node-1")
            .args(flags)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready = support::wait_for(Duration::from_secs(20), || {
        std::os::unix::net::UnixStream::connect(&socket).ok()
    });
    assert!(ready.is_some(), "the plugin never listened on {}", socket.display());
    let mut command = Command::new(CHECK);
    command.arg(format!("unix://{}", socket.display())).args(args);
    if own_work_dir {
        command.arg(format!("--work-dir={}", dir.path().join("work").display()));
    }
    let run = ChildGuard(command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let pid = run.0.id();
    let output = run.wait_with_output(Duration::from_secs(120));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), report, pid)
}

/// `--controller-only` on a correct plugin fails nothing (it sent an empty node id: a false
/// INVALID_ARGUMENT, and a publish case failed for want of a node it was told not to ask
/// for), and the work dir the checker made for itself is gone afterwards.
#[test]
fn controller_only_fails_nothing_on_a_correct_plugin_and_leaves_no_work_dir() {
    let (code, report, pid) = check_with(&["--attach-detach"], &["--controller-only"], false);
    assert_eq!((code, totals(&report).1), (0, 0), "{report}");
    assert!(
        skipped(&report)
            .iter()
            .any(|line| line.contains("repeated publish and unpublish") && line.contains("NodeGetInfo")),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|line| line.starts_with("PASS") && line.contains("unknown volume or node")),
        "{report}"
    );
    let work_dir = std::env::temp_dir().join(format!("drover-csi-check-{pid}"));
    assert!(!work_dir.exists(), "{} left behind", work_dir.display());
}

/// The (passed, failed, skipped) of a report's last line.
fn totals(report: &str) -> (usize, usize, usize) {
    let last = report.trim().lines().last().unwrap_or_default();
    let numbers: Vec<usize> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect();
    match numbers.as_slice() {
        [passed, failed, skipped] => (*passed, *failed, *skipped),
        _ => panic!("no totals in:\n{report}"),
    }
}

fn skipped(report: &str) -> Vec<&str> {
    report.lines().filter(|line| line.starts_with("SKIP")).collect()
}

#[test]
fn the_fake_plugin_conforms_in_every_configuration_of_its_flags() {
    unsafe extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { geteuid() },
        0,
        "the node cases bind-mount volumes and need root"
    );
    // Flags, and the skipped cases' names each configuration must leave out (by a word).
    let configurations: &[(&[&str], &[&str])] = &[
        (
            &[],
            &[
                "ListVolumes",
                "GetCapacity",
                "Snapshot",
                "cloned",
                "Expand",
                "GetVolume",
                "topology",
                "Stats",
                "ControllerPublish",
            ],
        ),
        (&["--stage-unstage"], &["ListVolumes", "Snapshot", "topology"]),
        (&["--attach-detach"], &["ListVolumes", "Snapshot", "topology"]),
        (
            &["--attach-detach", "--stage-unstage", "--max-volumes-per-node=4"],
            &["ListVolumes", "Snapshot"],
        ),
        (&["--list-volumes"], &["GetCapacity", "Snapshot", "ControllerPublish"]),
        (&["--get-capacity"], &["ListVolumes", "Snapshot"]),
        (&["--snapshots"], &["ListVolumes", "cloned", "Expand"]),
        (&["--clone"], &["Snapshot", "Expand"]),
        (&["--expand"], &["Snapshot", "Stats"]),
        (&["--expand", "--stage-unstage"], &["Snapshot", "Stats"]),
        (&["--volume-stats"], &["Expand", "Snapshot"]),
        (&["--get-volume"], &["Expand", "Snapshot"]),
        (&["--topology=zone=a", "--topology=rack=r1"], &["Snapshot", "Expand"]),
        (&["--all", "--topology=zone=a"], &[]),
    ];
    for (flags, absent) in configurations {
        let (code, report) = check(flags);
        let (passed, failed, skips) = totals(&report);
        assert_eq!((code, failed), (0, 0), "{flags:?}:\n{report}");
        assert!(passed >= 10, "{flags:?}: only {passed} cases ran:\n{report}");
        for word in *absent {
            assert!(
                skipped(&report).iter().any(|line| line.contains(word)),
                "{flags:?}: a case about {word} ran though not advertised:\n{report}"
            );
        }
        if absent.is_empty() {
            assert_eq!(skips, 0, "{flags:?} advertises everything:\n{report}");
        }
    }
}

/// `--auto-create` makes any volume id exist on first use (volumes registered out of band,
/// as pre-provisioned storage): by design the two NOT_FOUND cases for an unknown id fail, and
/// nothing else does.
#[test]
fn auto_create_departs_from_the_spec_only_where_it_says() {
    let (code, report) = check(&["--all", "--topology=zone=a", "--auto-create"]);
    assert_eq!(code, 1, "{report}");
    let failed: Vec<&str> = report
        .lines()
        .filter(|line| line.starts_with("FAIL"))
        .map(|line| line.split(':').next().unwrap_or_default())
        .collect();
    assert_eq!(
        failed,
        ["FAIL  ValidateVolumeCapabilities", "FAIL  ControllerPublishVolume"],
        "{report}"
    );
}

#[test]
fn planted_spec_violations_are_caught_by_name() {
    for (bug, case) in [
        (
            "create-conflict-ok",
            "FAIL  CreateVolume: same name, larger capacity (ALREADY_EXISTS)",
        ),
        (
            "token-ignored",
            "FAIL  ListVolumes: an unknown starting_token (ABORTED)",
        ),
        (
            "delete-missing-not-found",
            "FAIL  DeleteVolume: repeated and unknown ids succeed",
        ),
    ] {
        let (code, report) = check(&["--all", &format!("--bug={bug}")]);
        assert_eq!(code, 1, "{bug}:\n{report}");
        assert!(
            report.lines().any(|line| line.starts_with(case)),
            "{bug} not caught:\n{report}"
        );
        assert_eq!(
            totals(&report).1,
            report.lines().filter(|line| line.starts_with("FAIL")).count()
        );
    }
}
