//! Task logs for real: a batch task writes 25 MB to stdout in 1 MB files (`logs {
//! max_file_size = 1 }`), and `agent alloc logs -f` against a server-only agent, whose
//! requests the server relays to the client-only agent running the task, prints every line
//! once and in order, across every rotation, and ends when the task does. `max_files = 40`
//! keeps the whole run, so what is checked is the stream and the relay, not whether the
//! follower outruns the removal of old files (as in Nomad, a reader that falls more than
//! `max_files` behind loses what was removed).

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{Agent, client_spec, cluster_specs, server_args, wait_for};

/// 26 MB of `line <n>` lines, 13 bytes each.
const LINES: u64 = 2_000_000;

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&support::http_get(port, path)?).ok()
}

fn jobspec(go: &std::path::Path) -> String {
    format!(
        r#"job "talk" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "while [ ! -f {go} ]; do sleep 0.05; done; awk 'BEGIN {{ for (i = 0; i < {LINES}; i++) printf \"line %07d\\n\", i }}'; echo done >&2"]
      }}
      logs {{
        max_files     = 40
        max_file_size = 1
      }}
    }}
  }}
}}
"#,
        go = go.display()
    )
}

#[test]
fn following_a_rotated_log_through_a_server_sees_every_line_once() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let server = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    let (spec, args) = client_spec(root.path(), "c1", specs[0].rpc);
    let client = Agent::start(spec.clone(), args);
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}\n{}", server.log(), client.log()));
    let go = root.path().join("go");
    let file = root.path().join("talk.hcl");
    std::fs::write(&file, jobspec(&go)).unwrap();
    let address = format!("http://127.0.0.1:{port}");
    let run = Command::new(support::AGENT)
        .args(["job", "run", "-detach", file.to_str().unwrap()])
        .env("NOMAD_ADDR", &address)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let alloc = wait_for(Duration::from_secs(20), || {
        let allocs = get(port, "/v1/job/talk/allocations")?;
        let alloc = &allocs[0];
        (alloc["TaskStates"]["t"]["State"] == "running").then(|| alloc["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|| panic!("the task runs:\n{}", client.log()));

    let follower = Command::new(support::AGENT)
        .args(["alloc", "logs", "-f", &alloc, "t"])
        .env("NOMAD_ADDR", &address)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let guard = support::ChildGuard(follower);
    std::fs::write(&go, "").unwrap();
    let output = guard.wait_with_output(Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    let mut count = 0u64;
    for (expected, line) in text.lines().enumerate() {
        assert_eq!(
            line,
            format!("line {expected:07}"),
            "line {expected} of the followed log"
        );
        count += 1;
    }
    assert_eq!(count, LINES, "every line, once");
    let files = std::fs::read_dir(spec.data_dir.join("alloc").join(&alloc).join("alloc/logs"))
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|entry| entry.file_name().to_string_lossy().starts_with("t.stdout."))
        })
        .count();
    assert!(files >= 25, "1 MB files: {files}");
    // The stderr stream is its own.
    let stderr = Command::new(support::AGENT)
        .args(["alloc", "logs", "-stderr", &alloc])
        .env("NOMAD_ADDR", &address)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&stderr.stdout), "done\n");
}
