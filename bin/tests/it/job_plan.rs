//! `job plan` for real: the scheduler's dry run against a running agent, Nomad's diff as the
//! CLI prints it, the exit codes (1 when something would be created or destroyed, 0 when
//! not), and `job run -check-index` refusing a register when the job changed since the plan.

use crate::support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::{cli, get_json, wait_for};

fn out(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn write_job(dir: &Path, version: &str, count: u32) -> String {
    let file = dir.join("web.hcl");
    std::fs::write(
        &file,
        format!(
            r#"job "web" {{
  group "g" {{
    count = {count}
    task "t" {{
      driver = "raw_exec"
      env {{
        VERSION = "{version}"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "exec sleep 300"]
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
        ),
    )
    .unwrap();
    file.to_str().unwrap().to_string()
}

#[test]
fn job_plan_shows_the_dry_run_and_check_index_guards_the_run() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());

    // A new job: everything added, two creates, exit 1.
    let file = write_job(root.path(), "1", 2);
    let plan = cli(port, &["job", "plan", &file]);
    let text = out(&plan);
    assert_eq!(plan.status.code(), Some(1), "{text}");
    assert!(text.contains("+ Job: \"web\""), "{text}");
    assert!(text.contains("+ Task Group: \"g\" (2 create)"), "{text}");
    assert!(
        text.contains("  + Task: \"t\" (forces create/destroy update)"),
        "{text}"
    );
    assert!(text.contains("- All tasks successfully allocated."), "{text}");
    assert!(text.contains("Job Modify Index: 0"), "{text}");
    assert!(get_json(port, "/v1/job/web").is_none(), "a plan registers nothing");

    // -check-index 0 runs a new job once, and refuses once it exists.
    let run = cli(port, &["job", "run", "-detach", "-check-index", "0", &file]);
    assert!(run.status.success(), "{}", out(&run));
    let again = cli(port, &["job", "run", "-detach", "-check-index", "0", &file]);
    assert!(!again.status.success());
    assert!(
        out(&again).contains("Enforcing job modify index 0: job already exists"),
        "{}",
        out(&again)
    );
    wait_for(Duration::from_secs(30), || {
        let allocs = get_json(port, "/v1/job/web/allocations")?;
        (allocs
            .as_array()?
            .iter()
            .filter(|a| a["ClientStatus"] == "running")
            .count()
            == 2)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("both allocations run:\n{}", agent.log()));
    let index = get_json(port, "/v1/job/web").unwrap()["JobModifyIndex"]
        .as_u64()
        .unwrap();

    // The same file again: nothing to do, exit 0.
    let same = cli(port, &["job", "plan", &file]);
    assert_eq!(same.status.code(), Some(0), "{}", out(&same));
    assert!(
        out(&same).contains("Job: \"web\"\nTask Group: \"g\" (2 ignore)\n  Task: \"t\""),
        "{}",
        out(&same)
    );

    // A new env value: with the default update block, one allocation at a time.
    let file = write_job(root.path(), "2", 2);
    let changed = cli(port, &["job", "plan", &file]);
    let text = out(&changed);
    assert_eq!(changed.status.code(), Some(1), "{text}");
    assert!(text.contains("+/- Job: \"web\""), "{text}");
    assert!(
        text.contains("+/- Task Group: \"g\" (1 create/destroy update, 1 ignore)"),
        "{text}"
    );
    assert!(
        text.contains("  +/- Task: \"t\" (forces create/destroy update)"),
        "{text}"
    );
    assert!(
        text.contains("    +/- Env {\n      +/- VERSION: \"1\" => \"2\"\n    }"),
        "{text}"
    );
    assert!(text.contains(&format!("Job Modify Index: {index}")), "{text}");

    // The HTTP answer, in Nomad's shape.
    let job = serde_json::from_str::<Value>(&out(&cli(port, &["job", "status", "web"]))).ok();
    assert!(job.is_none(), "job status prints text");
    let body = json!({"Job": get_json(port, "/v1/job/web").unwrap(), "Diff": false}).to_string();
    let answer: Value =
        serde_json::from_str(&support::http("PUT", port, "/v1/job/web/plan", Some(&body)).unwrap()).unwrap();
    assert_eq!(answer["Diff"], Value::Null);
    assert_eq!(answer["JobModifyIndex"], index);
    assert_eq!(
        answer["Annotations"]["DesiredTGUpdates"]["g"],
        json!({"Ignore": 2, "Place": 0, "Migrate": 0, "Stop": 0, "InPlaceUpdate": 0,
               "DestructiveUpdate": 0, "Canary": 0, "Preemptions": 0})
    );

    // A stale index is refused; the plan's index runs.
    let stale = (index + 1000).to_string();
    let refused = cli(port, &["job", "run", "-detach", "-check-index", &stale, &file]);
    assert!(!refused.status.success());
    assert!(
        out(&refused).contains(&format!(
            "Enforcing job modify index {stale}: job exists with conflicting job modify index: {index}"
        )),
        "{}",
        out(&refused)
    );
    let run = cli(
        port,
        &["job", "run", "-detach", "-check-index", &index.to_string(), &file],
    );
    assert!(run.status.success(), "{}", out(&run));
    assert_eq!(get_json(port, "/v1/job/web").unwrap()["Version"], 1);

    // `system gc` takes a stopped job once everything of it has finished.
    let stop = cli(port, &["job", "stop", "web"]);
    assert!(stop.status.success(), "{}", out(&stop));
    wait_for(Duration::from_secs(30), || {
        let allocs = get_json(port, "/v1/job/web/allocations")?;
        let evals = get_json(port, "/v1/job/web/evaluations")?;
        let finished = allocs.as_array()?.iter().all(|a| a["ClientStatus"] == "complete");
        let settled = evals
            .as_array()?
            .iter()
            .all(|e| e["Status"] != "pending" && e["Status"] != "blocked");
        (finished && settled).then_some(())
    })
    .unwrap_or_else(|| panic!("every allocation finishes, every evaluation is done:\n{}", agent.log()));
    let gc = cli(port, &["system", "gc"]);
    assert!(gc.status.success(), "{}", out(&gc));
    assert!(get_json(port, "/v1/job/web").is_none(), "the stopped job is collected");
    assert_eq!(get_json(port, "/v1/allocations").unwrap(), json!([]));
    let evals = get_json(port, "/v1/evaluations").unwrap();
    assert!(evals.as_array().unwrap().iter().all(|e| e["JobID"] != "web"), "{evals}");
    // As Nomad's: 200 and an empty body (it was `null`).
    assert_eq!(
        support::http_status("PUT", port, "/v1/system/gc", None),
        Some((200, String::new()))
    );
    let summaries = cli(port, &["system", "reconcile", "summaries"]);
    assert!(
        out(&summaries).contains("Reconciled summaries for all jobs"),
        "{}",
        out(&summaries)
    );
}
