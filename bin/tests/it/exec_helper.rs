//! `exec` tasks started through `agent taskexec` (issue 54 §7): the driver spawns the agent's
//! own binary as a helper (no fork of the agent), which joins the task's cgroups, enters its
//! PID, IPC, UTS and mount namespaces and its root, and execs the task. What the forked start
//! promised still holds: the task is PID 1 of its namespace, sees only its binds, cannot write
//! a read-only one, exits with its own code, and a missing command fails the start by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_core::client::{MountConfig, TaskConfig};
use drover_core::structs::{ConfigValue, Propagation};
use drover_host::drivers::process::ProcessDriver;
use drover_io_real::drivers::TaskDriver;

fn agent() -> PathBuf {
    env!("CARGO_BIN_EXE_agent").into()
}

fn config(dir: &Path, task: &str, command: &str, args: &[&str]) -> TaskConfig {
    let config = BTreeMap::from([
        ("command".to_string(), ConfigValue::String(command.into())),
        (
            "args".to_string(),
            ConfigValue::List(args.iter().map(|a| ConfigValue::String(a.to_string())).collect()),
        ),
    ]);
    TaskConfig {
        alloc_id: "a1".into(),
        task: task.into(),
        driver: String::new(),
        config,
        env: BTreeMap::from([("GREETING".to_string(), "hi there".to_string())]),
        mounts: Vec::new(),
        devices: Vec::new(),
        task_dir: dir.join(task).display().to_string(),
        log_dir: dir.join("alloc/logs").display().to_string(),
        kill_timeout: Duration::from_millis(300),
        cpu_mhz: 100,
        memory_mb: 300,
        memory_max_mb: 0,
        logs: Default::default(),
        node_cpu_mhz: 4_000,
        node_cores: 2,
        reserved_cores: Vec::new(),
        network: None,
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[tokio::test]
async fn exec_tasks_start_through_the_helper_in_their_own_namespaces_and_root() {
    if !is_root() {
        eprintln!("skipped: the exec driver needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("volume");
    let readonly = dir.path().join("readonly");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::create_dir_all(&readonly).unwrap();
    std::fs::write(volume.join("in"), "from the host\n").unwrap();
    let driver = ProcessDriver::exec().with_logmon(agent());
    let mut task = config(
        dir.path(),
        "web",
        "/bin/sh",
        &[
            "-c",
            "echo pid=$$; ls /proc | grep -c '^[0-9]*$'; cat /data/in > /data/out; ! touch /ro/x 2>/dev/null \
             && echo \"$GREETING\" && sleep 0.3; exit 7",
        ],
    );
    task.mounts = vec![
        MountConfig {
            task_path: "/data".into(),
            host_path: volume.display().to_string(),
            readonly: false,
            propagation: Propagation::Private,
        },
        MountConfig {
            task_path: "/ro".into(),
            host_path: readonly.display().to_string(),
            readonly: true,
            propagation: Propagation::HostToTask,
        },
    ];
    let handle = driver.start(task).await.unwrap();
    // The pid the driver tracks is the helper, staying behind as the task's stand-in in the
    // host's namespaces: the agent's binary running `taskexec`, not a fork of the agent.
    let state: serde_json::Value = serde_json::from_str(&handle.state).unwrap();
    let pid = state["pid"].as_i64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline: Vec<String> = cmdline
        .split(|byte| *byte == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    assert_eq!(cmdline.get(1).map(String::as_str), Some("taskexec"), "{cmdline:?}");
    let exit = driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    let stdout = std::fs::read_to_string(dir.path().join("alloc/logs/web.stdout.0")).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.path().join("alloc/logs/web.stderr.0")).unwrap_or_default();
    assert_eq!(exit.exit_code, 7, "stdout: {stdout} stderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"pid=1"), "{stdout} {stderr}");
    let count: usize = lines[1].parse().unwrap();
    assert!(
        (1..=4).contains(&count),
        "the task's /proc shows {count} processes: {stdout}"
    );
    assert_eq!(lines.get(2), Some(&"hi there"), "{stdout}");
    assert_eq!(std::fs::read_to_string(volume.join("out")).unwrap(), "from the host\n");
    assert!(!readonly.join("x").exists());

    // A command that is not in the task's root fails the start, by name.
    let error = driver
        .start(config(dir.path(), "missing", "/bin/no-such-command", &[]))
        .await
        .unwrap_err();
    assert!(error.message.contains("no-such-command"), "{}", error.message);
}

/// A CSI node plugin's bidirectional mounts, started through the helper too (they were the
/// last `exec` starts that forked the agent, for the detached mount the child had to inherit):
/// the helper clones the shared host sources itself before it leaves the host's mount
/// namespace, so what the task mounts below them reaches the host, and a host mount the task.
#[tokio::test]
async fn bidirectional_mounts_start_through_the_helper_too() {
    if !is_root() {
        eprintln!("skipped: the exec driver needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _unmount = crate::support::UnmountUnder(dir.path().to_path_buf());
    let root = dir.path().join("plugin-root");
    let socket = dir.path().join("socket-dir");
    let host_made = root.join("from-host");
    std::fs::create_dir_all(root.join("staging")).unwrap();
    std::fs::create_dir_all(&host_made).unwrap();
    std::fs::create_dir_all(&socket).unwrap();
    let driver = ProcessDriver::exec().with_logmon(agent());
    let mut task = config(
        dir.path(),
        "plugin",
        "/bin/sh",
        &[
            "-c",
            "mount -t tmpfs staged /local/csi/staging && echo staged > /local/csi/staging/file && touch /csi/ready \
             && while [ ! -e /local/csi/from-host/marker ]; do sleep 0.05; done && echo seen > /csi/host-mount-seen",
        ],
    );
    task.mounts = [("/csi", &socket), ("/local/csi", &root)]
        .map(|(task_path, host)| MountConfig {
            task_path: task_path.into(),
            host_path: host.display().to_string(),
            readonly: false,
            propagation: Propagation::Bidirectional,
        })
        .to_vec();
    let handle = driver.start(task).await.unwrap();
    let state: serde_json::Value = serde_json::from_str(&handle.state).unwrap();
    let pid = state["pid"].as_i64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let second = cmdline.split(|byte| *byte == 0).nth(1).unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(second),
        "taskexec",
        "the helper, not a fork of the agent"
    );
    let ready = socket.join("ready");
    for _ in 0..200 {
        if ready.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready.exists(), "the task ran");
    let staging = root.join("staging").canonicalize().unwrap();
    assert!(
        crate::support::mounts_under(dir.path()).contains(&staging.display().to_string()),
        "the task's mount reached the host: {:?}",
        crate::support::mounts_under(dir.path())
    );
    assert_eq!(std::fs::read_to_string(staging.join("file")).unwrap(), "staged\n");
    let host_tmpfs = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "fromhost"])
        .arg(&host_made)
        .status()
        .unwrap();
    assert!(host_tmpfs.success());
    std::fs::write(host_made.join("marker"), "").unwrap();
    let exit = driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    let stderr = std::fs::read_to_string(dir.path().join("alloc/logs/plugin.stderr.0")).unwrap_or_default();
    assert_eq!(exit.exit_code, 0, "stderr: {stderr}");
    assert!(
        socket.join("host-mount-seen").exists(),
        "the host's mount reached the task"
    );
}
