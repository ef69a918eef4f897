//! The `agent` binary's start-up checks, with Nomad's wording.

use std::process::Command;

const AGENT: &str = env!("CARGO_BIN_EXE_agent");

fn run(args: &[&str]) -> (i32, String) {
    let output = Command::new(AGENT).args(args).output().expect("agent runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn bootstrap_expect_without_server_mode_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = format!("-data-dir={}", dir.path().display());
    let (code, text) = run(&["-client", "-bootstrap-expect=3", &data_dir]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("Bootstrap requires server mode to be enabled"), "{text}");
}

#[test]
fn no_mode_is_an_error() {
    let (code, text) = run(&["-data-dir=/tmp/x"]);
    assert_eq!(code, 1);
    assert!(
        text.contains("Must specify either server, client or dev mode for the agent."),
        "{text}"
    );
}

#[test]
fn missing_data_dir_is_an_error() {
    let (code, text) = run(&["-server", "-bootstrap-expect=3"]);
    assert_eq!(code, 1);
    assert!(
        text.contains("Must specify \"data_dir\" config option or \"data-dir\" CLI flag"),
        "{text}"
    );
}

#[test]
fn a_data_dir_that_cannot_be_opened_names_the_path_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let [http, rpc, serf] = crate::support::free_ports();
    let (code, text) = run(&[
        "-server",
        "-bootstrap-expect=1",
        &format!("-data-dir={}", file.display()),
        "-bind=127.0.0.1",
        &format!("-http-port={http}"),
        &format!("-rpc-port={rpc}"),
        &format!("-serf-port={serf}"),
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("data dir {} is not a directory", file.display())),
        "{text}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"x", "nothing overwritten");
}

#[test]
fn bad_config_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.hcl");
    std::fs::write(&file, "server {\n  bootstrap_expect = \"three\"\n}\n").unwrap();
    let (code, text) = run(&[&format!("-config={}", file.display())]);
    assert_eq!(code, 1);
    assert!(
        text.contains(&format!("Error loading configuration from {}", file.display())),
        "{text}"
    );
}

/// Warnings do not stop the agent: single-server bootstrap and an even bootstrap_expect.
#[test]
fn risky_bootstrap_expect_values_warn() {
    for (expect, warning) in [
        ("1", "WARNING: Bootstrap mode enabled! Potentially unsafe operation."),
        (
            "4",
            "WARNING: Number of bootstrap servers should ideally be set to an odd number.",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let [http, rpc, serf] = crate::support::free_ports();
        let mut child = Command::new(AGENT)
            .args([
                "-server",
                &format!("-bootstrap-expect={expect}"),
                &format!("-data-dir={}", dir.path().display()),
                "-bind=127.0.0.1",
                &format!("-http-port={http}"),
                &format!("-rpc-port={rpc}"),
                &format!("-serf-port={serf}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut stderr, &mut first).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(first.contains(warning), "expect={expect}: {first}");
    }
}

/// An operator's command whose output goes to a pipe already closed (`agent node status |
/// head -0`) ends quietly, killed by SIGPIPE as Nomad's and every Unix tool's, never with a
/// panic. The read end is closed before the command starts, so its first write fails, every
/// time.
#[test]
fn a_command_writing_into_a_closed_pipe_ends_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let root = tempfile::tempdir().unwrap();
    let agent = crate::support::start_dev_with_mock_driver(root.path());
    let mut fds = [0; 2];
    // SAFETY: pipe fills the two descriptors, each owned once wrapped below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: descriptors just made by pipe, owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let output = Command::new(AGENT)
        .args(["node", "status"])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{}", agent.spec.http))
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the CLI runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        output.status
    );
}
