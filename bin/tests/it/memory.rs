//! An idle agent lets go of its start-up code (issue 19 §5): a real `agent -dev` drops the
//! resident pages of its own executable once started, keeps working on the code it maps back
//! (a job and a variable written and read after the release), and holds fewer of those pages
//! than before.

use crate::support;

use std::time::Duration;

use support::{Agent, dev_spec, http, wait_for};

/// Resident kilobytes of the mappings of `pid`'s own executable.
fn executable_resident_kib(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut ours = false;
    let mut total = 0;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            ours = line.ends_with(exe.to_str().unwrap());
        } else if ours && first == "Rss:" {
            total += fields.next().and_then(|kib| kib.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

#[test]
fn an_idle_agent_releases_its_start_up_code_and_keeps_working() {
    let root = tempfile::tempdir().unwrap();
    let (spec, args) = dev_spec(root.path(), "dev");
    let agent = Agent::start(spec, args);
    wait_for(Duration::from_secs(30), || agent.leader()).expect("the dev agent leads");
    let pid = agent.pid().expect("running");
    let before = executable_resident_kib(pid);

    let released = wait_for(Duration::from_secs(40), || {
        let log = agent.log();
        log.lines()
            .find(|line| line.contains("released the start-up pages of the agent's code"))
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("no release logged:\n{}", agent.log()));
    assert!(released.contains("mappings=2"), "text and read-only data: {released}");
    let after = executable_resident_kib(pid);
    assert!(
        after < before,
        "the executable's resident pages: {before} kB before the release, {after} kB after"
    );

    // Everything still runs, on code mapped back from the same file.
    assert!(
        http(
            "PUT",
            agent.spec.http,
            "/v1/var/memory/test",
            Some(r#"{"Items":{"k":"v"}}"#)
        )
        .is_some()
    );
    let read = agent.get("/v1/var/memory/test").expect("the variable reads back");
    assert!(read.contains(r#""k":"v""#), "{read}");
    let job = r#"{"Job":{"ID":"after-release","Type":"batch","Datacenters":["dc1"],"TaskGroups":[{"Name":"g","Count":1,"Tasks":[{"Name":"t","Driver":"mock_driver","Config":{"run_for":"1s"}}]}]}}"#;
    assert!(http("PUT", agent.spec.http, "/v1/jobs", Some(job)).is_some());
    let jobs = agent.get("/v1/jobs").expect("jobs list");
    assert!(jobs.contains("after-release"), "{jobs}");
    assert!(agent.get("/v1/agent/self").is_some());
}
