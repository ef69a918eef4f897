//! The process drivers against real processes: exit codes, logs, env, SIGINT then SIGKILL,
//! reattaching after a "restart", and (as root) `exec`'s mount namespace with bind mounts
//! that vanish with the task.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_core::client::{MountConfig, TaskConfig};
use drover_core::structs::{ConfigValue, Propagation};
use drover_host::drivers::process::ProcessDriver;
use drover_io_real::drivers::TaskDriver;
use drover_testkit::mounts_under;

fn config(dir: &Path, task: &str, command: &str, args: &[&str]) -> TaskConfig {
    let mut config = BTreeMap::new();
    config.insert("command".to_string(), ConfigValue::String(command.into()));
    config.insert(
        "args".to_string(),
        ConfigValue::List(args.iter().map(|a| ConfigValue::String(a.to_string())).collect()),
    );
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
async fn raw_exec_runs_logs_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let driver = ProcessDriver::raw_exec();
    let handle = driver
        .start(config(
            dir.path(),
            "t",
            "/bin/sh",
            &["-c", "echo hello; echo \"$GREETING\" >&2; exit 3"],
        ))
        .await
        .unwrap();
    let exit = driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    assert_eq!(exit.exit_code, 3);
    let logs = dir.path().join("alloc/logs");
    assert_eq!(std::fs::read_to_string(logs.join("t.stdout.0")).unwrap(), "hello\n");
    assert_eq!(std::fs::read_to_string(logs.join("t.stderr.0")).unwrap(), "hi there\n");
    // Nomad's shared alloc dirs beside the logs, writable by a task of any user.
    for (name, mode) in [("data", 0o777), ("tmp", 0o1777)] {
        let meta = std::fs::symlink_metadata(dir.path().join("alloc").join(name)).unwrap();
        assert!(meta.is_dir(), "alloc/{name}");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
            mode,
            "alloc/{name}"
        );
    }
    let missing = driver
        .start(config(dir.path(), "u", "/nonexistent/bin", &[]))
        .await
        .unwrap_err();
    assert!(missing.message.contains("/nonexistent/bin"), "{}", missing.message);
}

#[tokio::test]
async fn stop_interrupts_then_kills_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let driver = ProcessDriver::raw_exec();
    // Ignores SIGINT: only SIGKILL after kill_timeout ends it.
    let handle = driver
        .start(config(
            dir.path(),
            "stubborn",
            "/bin/sh",
            &["-c", "trap '' INT; sleep 30 & wait"],
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    driver
        .stop(handle.clone(), Duration::from_millis(300), libc::SIGINT)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(driver.wait(handle.clone()).await.signal, libc::SIGKILL);
    driver.destroy(handle).await.unwrap();

    // A polite task exits on SIGINT at once.
    let handle = driver
        .start(config(dir.path(), "polite", "/bin/sleep", &["30"]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    driver
        .stop(handle.clone(), Duration::from_secs(10), libc::SIGINT)
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(driver.wait(handle.clone()).await.signal, libc::SIGINT);
    driver.destroy(handle).await.unwrap();

    // A task's `kill_signal` is what it is sent first.
    let handle = driver
        .start(config(dir.path(), "termed", "/bin/sleep", &["30"]))
        .await
        .unwrap();
    driver
        .stop(handle.clone(), Duration::from_secs(10), libc::SIGTERM)
        .await
        .unwrap();
    assert_eq!(driver.wait(handle.clone()).await.signal, libc::SIGTERM);
    driver.destroy(handle).await.unwrap();
}

/// CPU and memory of the task's whole session: a child that spins is counted, its pid
/// listed; the numbers are the kernel's (only their presence is checked, not a speed).
#[tokio::test]
async fn stats_cover_the_whole_task_session() {
    let dir = tempfile::tempdir().unwrap();
    let driver = ProcessDriver::raw_exec();
    let handle = driver
        .start(config(
            dir.path(),
            "busy",
            "/bin/sh",
            &["-c", "(while :; do :; done) & wait"],
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = driver.stats(&handle).expect("a running task is measured");
    assert!(first.pids.len() >= 2, "the shell and its spinning child: {first:?}");
    assert!(first.rss_bytes > 0, "{first:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = driver.stats(&handle).unwrap();
    assert!(
        second.user_percent + second.system_percent > 1.0,
        "a spinning child uses CPU: {second:?}"
    );
    let members = second.pids.clone();
    driver
        .stop(handle.clone(), Duration::from_secs(2), libc::SIGINT)
        .await
        .unwrap();
    driver.wait(handle.clone()).await;
    driver.destroy(handle.clone()).await.unwrap();
    assert_eq!(driver.stats(&handle), None, "a task that is gone is not measured");
    // The spinning child ignores SIGINT and outlives the shell: stop must not leave it behind.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let alive: Vec<&i32> = members
        .iter()
        .filter(|pid| {
            // A zombie has exited; it waits only for its new parent to reap it.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
        })
        .collect();
    assert!(alive.is_empty(), "task processes left running after stop: {alive:?}");
}

#[tokio::test]
async fn a_new_driver_reattaches_by_handle() {
    let dir = tempfile::tempdir().unwrap();
    let first = ProcessDriver::raw_exec();
    let handle = first
        .start(config(dir.path(), "long", "/bin/sleep", &["30"]))
        .await
        .unwrap();
    // The agent restarted: a fresh driver knows only the persisted handle.
    let second = ProcessDriver::raw_exec();
    second.recover(handle.clone()).await.unwrap();
    second
        .stop(handle.clone(), Duration::from_secs(5), libc::SIGINT)
        .await
        .unwrap();
    let exit = second.wait(handle.clone()).await;
    second.destroy(handle.clone()).await.unwrap();
    assert!(exit.err.is_some(), "exit status of a non-child is unknown: {exit:?}");
    assert!(second.recover(handle).await.is_err(), "gone after stop");
}

#[tokio::test]
async fn exec_binds_mounts_in_its_own_namespace() {
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
    let driver = ProcessDriver::exec();
    assert!(driver.fingerprint().healthy);
    let mut task = config(
        dir.path(),
        "web",
        "/bin/sh",
        &[
            "-c",
            "cat /data/in > /data/out && echo task >> /data/out && ! touch /ro/x 2>/dev/null && ls /alloc >/dev/null \
             && test -L /dev/fd && echo err >&2",
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
    // The task's bind mounts live only in its namespace.
    assert!(mounts_under(dir.path()).is_empty(), "{:?}", mounts_under(dir.path()));
    let exit = driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    let stderr = std::fs::read_to_string(dir.path().join("alloc/logs/web.stderr.0")).unwrap_or_default();
    assert_eq!(exit.exit_code, 0, "stderr: {stderr}");
    assert_eq!(stderr, "err\n");
    assert_eq!(
        std::fs::read_to_string(volume.join("out")).unwrap(),
        "from the host\ntask\n"
    );
    assert!(!readonly.join("x").exists());
    assert!(mounts_under(dir.path()).is_empty());
}

/// `exec` tasks get PID, IPC and UTS namespaces: the task is PID 1, its /proc lists only its
/// own processes, and its exit code still reaches the driver through the stand-in process.
/// Stopping one that handles SIGINT ends it politely; one that does not (PID 1 gets only the
/// signals it handles) is killed after `kill_timeout`, with every process it started.
#[tokio::test]
async fn exec_tasks_are_pid_1_of_their_own_pid_namespace() {
    if !is_root() {
        eprintln!("skipped: the exec driver needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let driver = ProcessDriver::exec();
    let task = config(
        dir.path(),
        "ps",
        "/bin/sh",
        &[
            "-c",
            "echo pid=$$; sleep 30 & ls /proc | grep -c '^[0-9]*$'; \
             echo host=$(cat /proc/sys/kernel/hostname); exit 7",
        ],
    );
    let handle = driver.start(task).await.unwrap();
    let exit = driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    let stdout = std::fs::read_to_string(dir.path().join("alloc/logs/ps.stdout.0")).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.path().join("alloc/logs/ps.stderr.0")).unwrap_or_default();
    assert_eq!(exit.exit_code, 7, "stdout: {stdout} stderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "pid=1", "{stdout}");
    // sh, the background sleep, ls and grep: nothing of the host.
    let count: usize = lines[1].parse().unwrap();
    assert!(
        (2..=5).contains(&count),
        "the task's /proc shows {count} processes: {stdout}"
    );
    assert!(lines[2].starts_with("host="), "{stdout}");

    // Stopping: a task that traps SIGINT exits by itself; one that ignores it is killed.
    for (name, script, polite) in [
        (
            "polite",
            "trap 'exit 3' INT; echo ready; while :; do sleep 0.05; done",
            true,
        ),
        ("deaf", "echo ready; exec sleep 300", false),
    ] {
        let handle = driver
            .start(config(dir.path(), name, "/bin/sh", &["-c", script]))
            .await
            .unwrap();
        let log = dir.path().join(format!("alloc/logs/{name}.stdout.0"));
        for _ in 0..250 {
            if std::fs::read_to_string(&log).unwrap_or_default().contains("ready") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        driver
            .stop(handle.clone(), Duration::from_millis(300), libc::SIGINT)
            .await
            .unwrap();
        let exit = driver.wait(handle.clone()).await;
        driver.destroy(handle).await.unwrap();
        if polite {
            assert_eq!((exit.exit_code, exit.signal), (3, 0), "{exit:?}");
        } else {
            assert_eq!(exit.signal, 9, "{exit:?}");
        }
    }
}

/// A bidirectional mount, as a CSI plugin run under `exec` needs it: what the task mounts
/// below it shows up on the host (and stays after the task is gone: a staged volume outlives
/// its plugin), while the task's other mounts stay in its namespace. A mount the host makes
/// below it reaches the task.
#[tokio::test]
async fn exec_bidirectional_mounts_reach_the_host() {
    if !is_root() {
        eprintln!("skipped: the exec driver needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("plugin-root");
    let socket = dir.path().join("socket-dir");
    let host_made = root.join("from-host");
    std::fs::create_dir_all(root.join("staging")).unwrap();
    std::fs::create_dir_all(&host_made).unwrap();
    std::fs::create_dir_all(&socket).unwrap();
    let driver = ProcessDriver::exec();
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
    task.mounts = vec![
        MountConfig {
            task_path: "/csi".into(),
            host_path: socket.display().to_string(),
            readonly: false,
            propagation: Propagation::Bidirectional,
        },
        MountConfig {
            task_path: "/local/csi".into(),
            host_path: root.display().to_string(),
            readonly: false,
            propagation: Propagation::Bidirectional,
        },
    ];
    let handle = driver.start(task).await.unwrap();
    let ready = socket.join("ready");
    for _ in 0..100 {
        if ready.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready.exists(), "the task ran");
    // The task's mount reached the host.
    let staging = root.join("staging").canonicalize().unwrap();
    assert!(
        mounts_under(dir.path()).contains(&staging.display().to_string()),
        "{:?}",
        mounts_under(dir.path())
    );
    assert_eq!(std::fs::read_to_string(staging.join("file")).unwrap(), "staged\n");
    // A host mount reaches the task.
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
    assert!(socket.join("host-mount-seen").exists());
    // After the task: the socket dir's self-bind is gone (nothing below it), the staged
    // mount and the plugin root that holds it remain.
    let mounts = mounts_under(dir.path());
    let socket_path = socket.canonicalize().unwrap().display().to_string();
    assert!(!mounts.contains(&socket_path), "{mounts:?}");
    assert!(mounts.contains(&staging.display().to_string()), "{mounts:?}");
    for mount in mounts.iter().rev() {
        let _ = std::process::Command::new("umount").arg(mount).status();
    }
    assert!(mounts_under(dir.path()).is_empty(), "{:?}", mounts_under(dir.path()));
}

fn proc_start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn handle_for(pid: i64, start_time: u64) -> drover_core::client::TaskHandle {
    drover_core::client::TaskHandle {
        driver: "raw_exec".into(),
        alloc_id: "gone".into(),
        task: "t".into(),
        state: format!(r#"{{"pid":{pid},"start_time":{start_time}}}"#),
    }
}

/// A persisted handle whose pid now belongs to another process (the task exited while the agent
/// was down and the pid was reused) must not be signalled; pids 0 and 1 never are.
#[tokio::test]
async fn stop_never_signals_a_process_that_is_not_the_task() {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new("sleep");
    command.arg("30").process_group(0);
    let mut foreign = drover_testkit::ChildGuard(command.spawn().unwrap());
    let pid = foreign.0.id();
    let actual = proc_start_time(pid);
    let driver = ProcessDriver::raw_exec();
    let timeout = Duration::from_millis(100);

    driver
        .stop(handle_for(pid.into(), actual + 1), timeout, libc::SIGINT)
        .await
        .unwrap();
    driver.stop(handle_for(1, 0), timeout, libc::SIGINT).await.unwrap();
    driver.stop(handle_for(0, 0), timeout, libc::SIGINT).await.unwrap();
    driver.stop(handle_for(-1, 0), timeout, libc::SIGINT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        foreign.0.try_wait().unwrap().is_none(),
        "a process that is not the task was signalled"
    );

    // The same pid with its true start time is the task: stopped.
    driver
        .stop(handle_for(pid.into(), actual), timeout, libc::SIGINT)
        .await
        .unwrap();
    let status = foreign.0.wait().unwrap();
    assert!(!status.success(), "{status:?}");
}

#[test]
fn a_disabled_raw_exec_is_not_detected_so_nothing_is_placed_on_it() {
    let enabled = ProcessDriver::raw_exec().fingerprint();
    assert!(enabled.detected && enabled.healthy, "{enabled:?}");
    let disabled = ProcessDriver::raw_exec().disabled().fingerprint();
    assert!(!disabled.detected && !disabled.healthy, "{disabled:?}");
    assert!(disabled.health_description.starts_with("disabled"), "{disabled:?}");
    assert!(!disabled.attributes.contains_key("driver.raw_exec"), "{disabled:?}");
}

/// A link planted where a shared alloc dir goes is left alone: the host directory it names
/// keeps its mode (the agent, as root, never changes a host path through it).
#[tokio::test]
async fn a_link_planted_for_a_shared_alloc_dir_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir_all(dir.path().join("alloc")).unwrap();
    std::os::unix::fs::symlink(host.path(), dir.path().join("alloc/data")).unwrap();
    let driver = ProcessDriver::raw_exec();
    let handle = driver.start(config(dir.path(), "t", "/bin/true", &[])).await.unwrap();
    driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    let mode = std::fs::metadata(host.path()).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "the host directory behind the link keeps its mode");
    assert!(
        std::fs::symlink_metadata(dir.path().join("alloc/data"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let tmp = std::fs::symlink_metadata(dir.path().join("alloc/tmp")).unwrap();
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
}
