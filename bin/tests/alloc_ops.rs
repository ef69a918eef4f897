//! What an operator does with a running allocation, for real, through the CLI: `alloc status`
//! shows its tasks and their recent events, `job status` counts it, and `alloc stop` replaces
//! it (the old task's process ends, a new allocation runs).

mod support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::{Agent, cluster_specs, server_args, wait_for};

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&support::http_get(port, path)?).ok()
}

fn cli(port: u16, args: &[&str]) -> Output {
    std::process::Command::new(support::AGENT)
        .args(args)
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Lines `<alloc id> <pid>` the task writes when it starts, and `<alloc id> <signal>` when it
/// is signalled.
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn jobspec(marks: &Path) -> String {
    let marks = marks.display();
    format!(
        r#"job "web" {{
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "trap 'echo $NOMAD_ALLOC_ID USR1 >> {marks}' USR1; echo $NOMAD_ALLOC_ID $$ >> {marks}; while :; do sleep 0.1; done"]
      }}
      kill_timeout = "1s"
      resources {{
        cpu    = 20
        memory = 16
      }}
    }}
  }}
}}
"#
    )
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn an_operator_sees_an_allocations_tasks_and_stops_it() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));
    let marks = root.path().join("marks");
    let file = root.path().join("web.hcl");
    std::fs::write(&file, jobspec(&marks)).unwrap();
    stdout(&cli(port, &["job", "run", file.to_str().unwrap()]));
    let (first, pid) = wait_for(Duration::from_secs(20), || {
        let line = lines(&marks).first().cloned()?;
        let (alloc, pid) = line.split_once(' ')?;
        Some((alloc.to_string(), pid.parse::<i32>().ok()?))
    })
    .unwrap_or_else(|| panic!("the task starts:\n{}", agent.log()));

    // Its task states reach the servers: alloc status shows them in Nomad's layout.
    let status = wait_for(Duration::from_secs(10), || {
        let out = stdout(&cli(port, &["alloc", "status", &first[..8]]));
        out.contains("Started     Task started by client").then_some(out)
    })
    .unwrap_or_else(|| panic!("alloc status shows the task's events:\n{}", agent.log()));
    assert!(status.contains("Client Description  = Tasks are running"), "{status}");
    assert!(status.contains("Task \"t\" is \"running\""), "{status}");
    assert!(status.contains("Recent Events:\nTime"), "{status}");
    assert!(status.contains("Received    Task received by client"), "{status}");
    let job = stdout(&cli(port, &["job", "status", "web"]));
    assert!(
        job.contains("Task Group  Queued  Starting  Running  Failed  Complete  Lost\ng           0       0         1"),
        "{job}"
    );

    // Stopped: the scheduler replaces it, and its task's process is gone.
    let out = stdout(&cli(port, &["alloc", "stop", &first[..8]]));
    assert!(out.contains("==> Monitoring evaluation"), "{out}");
    assert!(out.contains("finished with status \"complete\""), "{out}");
    let second = wait_for(Duration::from_secs(20), || {
        let line = lines(&marks).get(1).cloned()?;
        Some(line.split_once(' ')?.0.to_string())
    })
    .unwrap_or_else(|| panic!("a replacement starts:\n{}", agent.log()));
    assert_ne!(second, first);
    let old = wait_for(Duration::from_secs(20), || {
        let old = get(port, &format!("/v1/allocation/{first}"))?;
        (old["ClientStatus"] == "complete").then_some(old)
    })
    .unwrap_or_else(|| panic!("the stopped allocation completes:\n{}", agent.log()));
    assert_eq!(old["DesiredStatus"], "stop");
    assert_eq!(old["DesiredDescription"], "alloc is being migrated");
    assert!(!alive(pid), "the stopped task's process {pid} is gone");
    let missing = cli(port, &["alloc", "stop", "ffffffff"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("No allocation(s) with prefix or id \"ffffffff\" found"),
        "{missing:?}"
    );
}
