//! A dev agent's shutdown leaves nothing behind (issue 55 §4): Nomad's client destroys its
//! allocations when it stops in dev mode, so the task, its log collectors and its allocation
//! directory are gone once `agent -dev` has exited on SIGTERM. (Outside dev mode tasks keep
//! running for a restarted agent to reattach: `client_restart`.)

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::{Agent, dev_spec, http_status, running, wait_for};

/// Processes whose command line names `needle` (the agent's log collectors name their task's
/// log directory).
fn processes_naming(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
                && running(*pid)
        })
        .collect()
}

#[test]
fn a_dev_agent_destroys_its_allocations_when_it_stops() {
    let root = tempfile::tempdir().unwrap();
    let (spec, args) = dev_spec(root.path(), "dev");
    let data_dir = spec.data_dir.clone();
    let port = spec.http;
    let mut agent = Agent::start(spec, args);
    let marker = root.path().join("pid");
    let job = serde_json::json!({"Job": {
        "ID": "sleeper",
        "TaskGroups": [{"Name": "g", "Tasks": [{
            "Name": "t",
            "Driver": "raw_exec",
            "Config": {"command": "/bin/sh", "args": ["-c", format!("echo $$ > {}; echo started; exec sleep 600", marker.display())]},
            "Resources": {"CPU": 20, "MemoryMB": 16},
            "KillTimeout": 1_000_000_000u64,
        }]}],
    }});
    wait_for(Duration::from_secs(30), || {
        matches!(
            http_status("PUT", port, "/v1/jobs", Some(&job.to_string())),
            Some((200, _))
        )
        .then_some(())
    })
    .unwrap_or_else(|| panic!("the job is registered:\n{}", agent.log()));
    let pid: i32 = wait_for(Duration::from_secs(30), || {
        std::fs::read_to_string(&marker).ok()?.trim().parse().ok()
    })
    .unwrap_or_else(|| panic!("the task runs:\n{}", agent.log()));
    let alloc_dirs = |dir: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.join("alloc"))
            .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
            .unwrap_or_default()
    };
    let allocs = alloc_dirs(&data_dir);
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    let logs = allocs[0].join("alloc/logs");
    let collectors = wait_for(Duration::from_secs(10), || {
        let found = processes_naming(&logs.display().to_string());
        (!found.is_empty()).then_some(found)
    })
    .unwrap_or_else(|| panic!("the task's log collectors run:\n{}", agent.log()));
    assert!(running(pid));

    agent.terminate();
    let log = agent.log();
    assert!(!running(pid), "the task outlived its dev agent:\n{log}");
    let left: Vec<i32> = collectors.into_iter().filter(|pid| running(*pid)).collect();
    assert!(
        left.is_empty(),
        "log collectors {left:?} outlived their dev agent:\n{log}"
    );
    assert!(alloc_dirs(&data_dir).is_empty(), "allocation directories left:\n{log}");
    assert!(
        log.contains("destroying every allocation"),
        "the agent said what it did:\n{log}"
    );
}
