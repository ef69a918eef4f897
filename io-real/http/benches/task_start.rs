//! What a cgroup costs a task: start latency of `raw_exec` tasks (driver `start` called →
//! the task's process running with its start time read) with and without a cgroup per task,
//! measured in the same run, interleaved so drift on the machine hits both alike; and the
//! stop (SIGINT, reap, then `destroy`: cgroup kill and removal) likewise. Prints the distributions and the
//! ratio; asserts nothing.
//!
//! `cargo bench -p drover-http --bench task_start [-- TASKS]` (needs root for cgroups;
//! without them it measures the fallback only and says so).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use drover_core::client::TaskConfig;
use drover_core::structs::ConfigValue;
use drover_host::drivers::process::ProcessDriver;
use drover_io_real::drivers::TaskDriver;

fn config(dir: &std::path::Path, task: &str) -> TaskConfig {
    let mut config = BTreeMap::new();
    config.insert("command".to_string(), ConfigValue::String("/bin/sleep".into()));
    config.insert(
        "args".to_string(),
        ConfigValue::List(vec![ConfigValue::String("30".into())]),
    );
    TaskConfig {
        alloc_id: "bench".into(),
        task: task.into(),
        driver: String::new(),
        config,
        env: BTreeMap::new(),
        mounts: Vec::new(),
        devices: Vec::new(),
        task_dir: dir.join(task).display().to_string(),
        log_dir: dir.join("alloc/logs").display().to_string(),
        kill_timeout: Duration::from_secs(5),
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn summary(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let p50 = percentile(&samples, 0.5);
    println!(
        "{name:<28} n={:<4} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
    );
    p50
}

#[tokio::main]
async fn main() {
    let tasks: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(100);
    let dir = tempfile::tempdir().unwrap();
    let with = ProcessDriver::raw_exec();
    let without = ProcessDriver::raw_exec().without_cgroups();
    if !with.uses_cgroups() {
        println!("this host gives tasks no cgroups (not root, or no controllers): both columns are the fallback");
    }
    let mut samples: BTreeMap<(&str, &str), Vec<Duration>> = BTreeMap::new();
    for round in 0..tasks {
        for (name, driver) in [("cgroup", &with), ("process group", &without)] {
            let task = format!("t{round}-{}", name.replace(' ', "-"));
            let started = Instant::now();
            let handle = driver.start(config(dir.path(), &task)).await.unwrap();
            samples.entry((name, "start")).or_default().push(started.elapsed());
            let stopping = Instant::now();
            driver
                .stop(handle.clone(), Duration::from_secs(5), libc::SIGINT)
                .await
                .unwrap();
            driver.wait(handle.clone()).await;
            driver.destroy(handle).await.unwrap();
            samples.entry((name, "stop")).or_default().push(stopping.elapsed());
        }
    }
    println!("raw_exec tasks (/bin/sleep 30), {tasks} of each, interleaved:");
    let start_cgroup = summary("start, cgroup", samples.remove(&("cgroup", "start")).unwrap());
    let start_plain = summary(
        "start, process group",
        samples.remove(&("process group", "start")).unwrap(),
    );
    let stop_cgroup = summary("stop, cgroup", samples.remove(&("cgroup", "stop")).unwrap());
    let stop_plain = summary(
        "stop, process group",
        samples.remove(&("process group", "stop")).unwrap(),
    );
    println!(
        "cgroup / process group: start p50 {:.2}x (+{:.3} ms per task for cgroup setup), stop p50 {:.2}x",
        start_cgroup.as_secs_f64() / start_plain.as_secs_f64(),
        (start_cgroup.as_secs_f64() - start_plain.as_secs_f64()) * 1e3,
        stop_cgroup.as_secs_f64() / stop_plain.as_secs_f64(),
    );
}
