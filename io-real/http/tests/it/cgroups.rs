//! Tasks leave nothing behind: with cgroups (as root on a host that has them) every process a
//! task started dies with it — children that ignore SIGINT, daemons that `setsid` out of its
//! session, whether the task is stopped or exits by itself — its memory limit holds and an OOM
//! kill is reported. Without cgroups the process-group fallback still kills what stayed in the
//! task's session.
//!
//! Every task here carries a marker in its environment; a guard kills every process with that
//! marker when the test ends, pass or fail, so a failing test cannot leak a spinning process.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_core::client::TaskConfig;
use drover_core::structs::ConfigValue;
use drover_host::drivers::process::ProcessDriver;
use drover_io_real::drivers::TaskDriver;

const MARKER: &str = "DROVER_CGROUP_TEST";

fn config(dir: &Path, task: &str, marker: &str, command: &str, args: &[&str]) -> TaskConfig {
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
        env: BTreeMap::from([(MARKER.to_string(), marker.to_string())]),
        mounts: Vec::new(),
        devices: Vec::new(),
        task_dir: dir.join(task).display().to_string(),
        log_dir: dir.join("alloc/logs").display().to_string(),
        kill_timeout: Duration::from_millis(300),
        cpu_mhz: 100,
        memory_mb: 64,
        memory_max_mb: 0,
        logs: Default::default(),
        node_cpu_mhz: 4_000,
        node_cores: 2,
        reserved_cores: Vec::new(),
        network: None,
    }
}

/// Live (not zombie) processes whose environment carries `marker`.
fn marked(marker: &str) -> Vec<i32> {
    let needle = format!("{MARKER}={marker}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
        });
        if !zombie && environ.split(|byte| *byte == 0).any(|var| var == needle.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Kills every process of the test's tasks when the test ends, however it ends.
struct Reaper(String);

impl Reaper {
    fn new(test: &str) -> Reaper {
        Reaper(format!("{test}-{}", std::process::id()))
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in marked(&self.0) {
            // SAFETY: kill has no memory preconditions; the pid carries our marker.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Polls until `marker`'s processes are gone (processes killed by SIGKILL vanish within
/// milliseconds; the bound only keeps a broken build from hanging).
async fn none_left(marker: &str) -> Vec<i32> {
    for _ in 0..100 {
        if marked(marker).is_empty() {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    marked(marker)
}

/// The session of `pid` (field 6 of /proc/<pid>/stat).
fn session(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(3)?.parse().ok()
}

/// The marked process leading a session other than `leader`'s: a daemon that `setsid` out.
async fn until_daemon(marker: &str, leader: i32) -> i32 {
    for _ in 0..250 {
        let daemon = marked(marker)
            .into_iter()
            .find(|pid| *pid != leader && session(*pid) == Some(*pid));
        if let Some(daemon) = daemon {
            return daemon;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no daemon left the task's session: {:?}", marked(marker));
}

async fn until_marked(marker: &str, at_least: usize) {
    for _ in 0..250 {
        if marked(marker).len() >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the task never started {at_least} processes: {:?}", marked(marker));
}

fn cgroup_dirs(handle: &drover_core::client::TaskHandle) -> Vec<String> {
    let state: serde_json::Value = serde_json::from_str(&handle.state).unwrap();
    state["cgroup"]["dirs"]
        .as_array()
        .map(|dirs| dirs.iter().map(|dir| dir.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// A shell that leaves a SIGINT-ignoring child in its session and a daemon in a session of
/// its own, then waits.
const LEAKY: &str = "(trap '' INT; while :; do sleep 0.05; done) & \
                     setsid sh -c 'trap \"\" INT; while :; do sleep 0.05; done' & wait";

fn cgroup_driver(test: &str) -> Option<ProcessDriver> {
    let driver = ProcessDriver::raw_exec();
    if !driver.uses_cgroups() {
        eprintln!("skipped {test}: this host gives tasks no cgroups (not root, or no controllers)");
        return None;
    }
    Some(driver)
}

#[tokio::test]
async fn a_stopped_task_leaves_no_process_behind() {
    let Some(driver) = cgroup_driver("a_stopped_task_leaves_no_process_behind") else {
        return;
    };
    let reaper = Reaper::new("stopped");
    let dir = tempfile::tempdir().unwrap();
    let handle = driver
        .start(config(dir.path(), "leaky", &reaper.0, "/bin/sh", &["-c", LEAKY]))
        .await
        .unwrap();
    let dirs = cgroup_dirs(&handle);
    assert!(!dirs.is_empty(), "the task has a cgroup: {}", handle.state);
    until_marked(&reaper.0, 3).await;
    // The stats count every process of the task, the daemon outside its session too. The
    // daemon is the shell that leads a session of its own: wait until `setsid` has made it
    // one (until then it is still in the task's session), then measure.
    let leader: serde_json::Value = serde_json::from_str(&handle.state).unwrap();
    let leader = leader["pid"].as_i64().unwrap() as i32;
    let daemon = until_daemon(&reaper.0, leader).await;
    let measured = driver.stats(&handle).expect("a running task is measured");
    assert!(
        measured.pids.contains(&daemon),
        "the setsid daemon {daemon} is measured with the task: {measured:?}"
    );
    driver
        .stop(handle.clone(), Duration::from_millis(300), libc::SIGINT)
        .await
        .unwrap();
    driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    assert_eq!(
        none_left(&reaper.0).await,
        Vec::<i32>::new(),
        "processes outlived the stop"
    );
    for dir in dirs {
        assert!(!Path::new(&dir).exists(), "cgroup {dir} left behind");
    }
}

#[tokio::test]
async fn a_task_that_exits_by_itself_leaves_no_process_behind() {
    let Some(driver) = cgroup_driver("a_task_that_exits_by_itself_leaves_no_process_behind") else {
        return;
    };
    let reaper = Reaper::new("exits");
    let dir = tempfile::tempdir().unwrap();
    let script = "setsid sh -c 'sleep 1000' & (sleep 1000 &); sleep 0.3; exit 0";
    let handle = driver
        .start(config(dir.path(), "daemonizes", &reaper.0, "/bin/sh", &["-c", script]))
        .await
        .unwrap();
    until_marked(&reaper.0, 2).await;
    let exit = driver.wait(handle.clone()).await;
    assert_eq!((exit.exit_code, exit.oom_killed), (0, false), "{exit:?}");
    // The leader's exit alone kills nothing: what it left behind goes when the client
    // destroys the task (Nomad's `DestroyTask`), which the client core asks for next.
    assert!(
        marked(&reaper.0).len() >= 2,
        "the daemons run until the task is destroyed"
    );
    driver.destroy(handle.clone()).await.unwrap();
    driver.destroy(handle).await.expect("destroy is idempotent");
    assert_eq!(
        none_left(&reaper.0).await,
        Vec::<i32>::new(),
        "processes outlived the task"
    );
}

#[tokio::test]
async fn a_task_over_its_memory_limit_is_oom_killed_and_reported() {
    let Some(driver) = cgroup_driver("a_task_over_its_memory_limit_is_oom_killed_and_reported") else {
        return;
    };
    let reaper = Reaper::new("oom");
    let dir = tempfile::tempdir().unwrap();
    // `tail` keeps the last lines in memory, and /dev/zero has no line end: it grows until the
    // 64 MB limit stops it.
    let mut task = config(dir.path(), "hungry", &reaper.0, "/usr/bin/tail", &["/dev/zero"]);
    task.memory_mb = 64;
    let handle = driver.start(task).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(60), driver.wait(handle.clone()))
        .await
        .expect("the memory limit stops the task");
    driver.destroy(handle).await.unwrap();
    assert!(exit.oom_killed, "reported as OOM killed: {exit:?}");
    assert_eq!(exit.signal, libc::SIGKILL, "{exit:?}");
}

#[tokio::test]
async fn without_cgroups_the_session_is_still_killed_after_the_leader_exits() {
    let reaper = Reaper::new("fallback");
    let dir = tempfile::tempdir().unwrap();
    let driver = ProcessDriver::raw_exec().without_cgroups();
    // A child that stays in the task's session outlives the shell's own exit.
    let script = "(trap '' INT; while :; do sleep 0.05; done) & sleep 0.3; exit 0";
    let handle = driver
        .start(config(
            dir.path(),
            "leaves-a-child",
            &reaper.0,
            "/bin/sh",
            &["-c", script],
        ))
        .await
        .unwrap();
    until_marked(&reaper.0, 2).await;
    let exit = driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    assert_eq!(exit.exit_code, 0, "{exit:?}");
    assert_eq!(
        none_left(&reaper.0).await,
        Vec::<i32>::new(),
        "the session's processes outlived the leader"
    );
}

#[tokio::test]
async fn memory_max_is_the_hard_limit_and_memory_the_soft_one() {
    let Some(driver) = cgroup_driver("memory_max_is_the_hard_limit_and_memory_the_soft_one") else {
        return;
    };
    let reaper = Reaper::new("memory-max");
    let dir = tempfile::tempdir().unwrap();
    let mut task = config(dir.path(), "oversubscribed", &reaper.0, "/bin/sleep", &["30"]);
    task.memory_mb = 32;
    task.memory_max_mb = 96;
    let handle = driver.start(task).await.unwrap();
    let read = |file: &str| {
        cgroup_dirs(&handle)
            .iter()
            .find_map(|dir| std::fs::read_to_string(Path::new(dir).join(file)).ok())
            .map(|text| text.trim().to_string())
    };
    let mb = |bytes: u64| (bytes / (1024 * 1024)).to_string();
    match read("memory.limit_in_bytes") {
        Some(hard) => {
            assert_eq!(mb(hard.parse().unwrap()), "96");
            assert_eq!(mb(read("memory.soft_limit_in_bytes").unwrap().parse().unwrap()), "32");
        }
        None => {
            assert_eq!(mb(read("memory.max").unwrap().parse().unwrap()), "96");
            assert_eq!(mb(read("memory.low").unwrap().parse().unwrap()), "32");
        }
    }
    driver
        .stop(handle.clone(), Duration::from_millis(300), libc::SIGINT)
        .await
        .unwrap();
    driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    assert_eq!(none_left(&reaper.0).await, Vec::<i32>::new());
}

/// The stats of a task with a cgroup carry what its controllers account: memory usage and its
/// peak, the page cache it filled, and CFS throttling (measured, 0 here: `cpu` is a share, not
/// a quota, as in Nomad).
#[tokio::test]
async fn stats_come_from_the_tasks_cgroup() {
    let Some(driver) = cgroup_driver("stats_come_from_the_tasks_cgroup") else {
        return;
    };
    let reaper = Reaper::new("cgroup-stats");
    let dir = tempfile::tempdir().unwrap();
    let task = config(
        dir.path(),
        "cache",
        &reaper.0,
        "/bin/sh",
        &[
            "-c",
            "head -c 8000000 /dev/zero > f && cat f > /dev/null && echo done > marker && exec sleep 30",
        ],
    );
    let marker = Path::new(&task.task_dir).join("marker");
    let handle = driver.start(task).await.unwrap();
    for _ in 0..250 {
        if marker.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(marker.exists(), "the task wrote its file");
    let measured = driver.stats(&handle).expect("a running task is measured");
    let cgroup = measured.cgroup.expect("a task with a cgroup is measured by it");
    let usage = cgroup.usage_bytes.expect("memory usage");
    assert!(usage > 0, "{cgroup:?}");
    assert!(cgroup.max_usage_bytes.is_none_or(|peak| peak >= usage), "{cgroup:?}");
    assert!(
        cgroup.cache_bytes.is_some_and(|cache| cache >= 4_000_000),
        "the 8 MB file it wrote is page cache charged to it: {cgroup:?}"
    );
    assert_eq!(cgroup.throttled_periods, Some(0), "{cgroup:?}");
    driver
        .stop(handle.clone(), Duration::from_millis(300), libc::SIGINT)
        .await
        .unwrap();
    driver.wait(handle.clone()).await;
    driver.destroy(handle).await.unwrap();
    assert_eq!(none_left(&reaper.0).await, Vec::<i32>::new());
}

/// A task with reserved cores (`resources { cores }`) runs only on them (its cgroup's
/// cpuset); a task without any runs on every core the agent may use.
#[tokio::test]
async fn reserved_cores_hold_a_task_to_them() {
    let Some(driver) = cgroup_driver("reserved_cores_hold_a_task_to_them") else {
        return;
    };
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let reaper = Reaper::new("cgroup-cores");
    let dir = tempfile::tempdir().unwrap();
    let mut allowed = Vec::new();
    for (task, cores) in [("pinned", vec![1]), ("free", Vec::new())] {
        let mut config = config(
            dir.path(),
            task,
            &reaper.0,
            "/bin/sh",
            &[
                "-c",
                "grep Cpus_allowed_list /proc/self/status | cut -f2 > cpus.tmp && mv cpus.tmp cpus && exec sleep 30",
            ],
        );
        config.reserved_cores = cores;
        let written = Path::new(&config.task_dir).join("cpus");
        let handle = driver.start(config).await.unwrap();
        for _ in 0..250 {
            if written.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        allowed.push(std::fs::read_to_string(&written).unwrap_or_default().trim().to_string());
        driver
            .stop(handle.clone(), Duration::from_millis(300), libc::SIGINT)
            .await
            .unwrap();
        driver.wait(handle.clone()).await;
        driver.destroy(handle).await.unwrap();
    }
    assert_eq!(allowed, ["1".to_string(), online.trim().to_string()]);
    assert_eq!(none_left(&reaper.0).await, Vec::<i32>::new());
}
