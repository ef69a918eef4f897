//! What an allocation costs in memory (issue 54 §8), measured end to end on one `agent -dev`
//! (server and client in one process) running the scripted `mock` driver, so no process is
//! started per task:
//! - the agent's RSS idle (the baseline of this run);
//! - after a 1-group job with `ALLOCS` allocations is running, and after it is purged and
//!   `system gc` has run;
//! - the same for a 100-group job with the same number of allocations (`ALLOCS / 100` each).
//!
//! Printed per 1,000 allocations, as the growth over the RSS before each job. The issue's
//! figure before shared job versions: about 430 KB per allocation of a 100-group job, linear,
//! and not given back by purge and GC. Nothing is asserted.
//!
//!   cargo bench -p drover --bench alloc_memory [-- ALLOCS]     (default 1,000)

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::{get_json, http, start_dev_with_mock_driver, wait_for_every};

fn main() {
    let allocs: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(1_000);
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev_with_mock_driver(root.path());
    let port = agent.spec.http;
    let pid = agent.pid().expect("running");
    settle();
    let idle = rss_kb(pid);
    println!("alloc_memory: agent -dev idle RSS {} MB", idle / 1024);

    for groups in [1usize, 100] {
        let id = format!("mem-{groups}");
        let before = rss_kb(pid);
        let started = Instant::now();
        http("PUT", port, "/v1/jobs", Some(&job(&id, groups, allocs / groups))).expect("registered");
        wait_for_every(Duration::from_secs(600), Duration::from_millis(500), || {
            let summary = get_json(port, &format!("/v1/job/{id}/summary"))?;
            let running: u64 = summary["Summary"]
                .as_object()?
                .values()
                .map(|group| group["Running"].as_u64().unwrap_or(0))
                .sum();
            (running as usize == allocs).then_some(())
        })
        .unwrap_or_else(|| panic!("{allocs} allocations of {id} run:\n{}", agent.log()));
        let placed = started.elapsed();
        settle();
        let running = rss_kb(pid);
        http("DELETE", port, &format!("/v1/job/{id}?purge=true"), None).expect("purged");
        // Their tasks are stopped, then `system gc` collects the allocations (terminal on the
        // servers and on the client).
        wait_for_every(Duration::from_secs(300), Duration::from_millis(1_000), || {
            let allocs = get_json(port, "/v1/allocations")?;
            let running = allocs
                .as_array()?
                .iter()
                .filter(|alloc| !matches!(alloc["ClientStatus"].as_str(), Some("complete" | "failed" | "lost")))
                .count();
            (running == 0).then_some(())
        })
        .unwrap_or_else(|| panic!("the allocations of {id} stop:\n{}", agent.log()));
        wait_for_every(Duration::from_secs(300), Duration::from_millis(1_000), || {
            http("PUT", port, "/v1/system/gc", None)?;
            let left = get_json(port, "/v1/allocations")?.as_array()?.len();
            (left == 0).then_some(())
        })
        .unwrap_or_else(|| panic!("system gc collects the allocations of {id}:\n{}", agent.log()));
        // The agent hands freed heap back every 15 s.
        std::thread::sleep(Duration::from_secs(20));
        let after = rss_kb(pid);
        let per_thousand = |kb: u64| kb as f64 * 1_000.0 / allocs as f64 / 1024.0;
        println!(
            "alloc_memory: {groups:>3}-group job, {allocs} allocations running in {:.1} s: RSS {} MB, \
             +{:.1} MB per 1,000 allocations ({:.0} KB each); purged and collected: RSS {} MB \
             ({:.1} MB per 1,000 kept)",
            placed.as_secs_f64(),
            running / 1024,
            per_thousand(running.saturating_sub(before)),
            running.saturating_sub(before) as f64 / allocs as f64,
            after / 1024,
            per_thousand(after.saturating_sub(before)),
        );
    }
    println!(
        "alloc_memory: idle {} MB at the start, {} MB at the end",
        idle / 1024,
        rss_kb(pid) / 1024
    );
}

/// A job of `groups` groups of `count` mock tasks that run until stopped.
fn job(id: &str, groups: usize, count: usize) -> String {
    let groups: Vec<String> = (0..groups)
        .map(|n| {
            format!(
                r#"{{"Name": "g{n:03}", "Count": {count}, "Tasks": [{{"Name": "t", "Driver": "mock",
                "Config": {{}}, "Env": {{"GROUP": "g{n:03}", "PURPOSE": "a task of a big job"}},
                "Meta": {{"owner": "bench", "tier": "memory"}},
                "Resources": {{"CPU": 1, "MemoryMB": 10}}}}]}}"#
            )
        })
        .collect();
    format!(
        r#"{{"Job": {{"ID": "{id}", "Type": "service", "Datacenters": ["dc1"], "TaskGroups": [{}]}}}}"#,
        groups.join(",")
    )
}

/// Lets the agent finish what the last step started (reports, fsync, GC of buffers).
fn settle() {
    std::thread::sleep(Duration::from_secs(3));
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the agent runs");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
