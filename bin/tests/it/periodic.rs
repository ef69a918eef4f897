//! Periodic and parameterized jobs for real. An agent launches a child of a periodic job at
//! every time its cron spec names (`<id>/periodic-<unix>`), `job periodic force` launches one
//! now, `job status` shows the parent's children, a bad spec is refused with Nomad's text, and
//! a stopped parent launches nothing more. `job dispatch` registers a child of a parameterized
//! job whose task finds the payload in `local/` and the meta in its environment, with Nomad's
//! checks and its idempotency token.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{cli, cli_stdout, get_json, wait_for};

fn write_job(dir: &Path, cron: &str) -> String {
    let file = dir.join("report.hcl");
    std::fs::write(
        &file,
        format!(
            r#"job "report" {{
  type = "batch"
  periodic {{
    cron             = "{cron}"
    prohibit_overlap = false
  }}
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/true"
      }}
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

/// The children of `report` as the job list shows them, by ID.
fn children(port: u16) -> Vec<Value> {
    get_json(port, "/v1/jobs?prefix=report%2F")
        .and_then(|jobs| jobs.as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|job| job["ParentID"] == "report")
        .collect()
}

/// The launch second in a child's ID.
fn launch_second(child: &Value) -> u64 {
    let id = child["ID"].as_str().unwrap_or_default();
    id.strip_prefix("report/periodic-")
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("a periodic child's ID: {id}"))
}

#[test]
fn a_periodic_job_launches_children_on_its_schedule_and_on_demand() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());

    // A spec that does not parse is refused, naming it; nothing is stored.
    let bad = cli(port, &["job", "run", &write_job(root.path(), "every two seconds")]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(!bad.status.success(), "{text}");
    assert!(text.contains("Invalid cron spec \"every two seconds\""), "{text}");
    assert!(get_json(port, "/v1/job/report").is_none());

    // Every second second (7 fields: seconds first, year last, as Nomad reads them).
    let run = cli_stdout(&cli(port, &["job", "run", &write_job(root.path(), "*/2 * * * * * *")]));
    assert!(run.contains("Job registration successful"), "{run}");
    assert!(run.contains("Approximate next launch time: "), "{run}");
    let parent = get_json(port, "/v1/job/report").expect("the parent is stored");
    assert_eq!(parent["Periodic"]["Spec"], "*/2 * * * * * *");
    assert_eq!(parent["Status"], "running");
    assert!(
        get_json(port, "/v1/job/report/evaluations").is_some_and(|evals| evals.as_array().is_some_and(Vec::is_empty)),
        "the parent itself is never evaluated"
    );

    let launched = wait_for(Duration::from_secs(30), || {
        let children = children(port);
        (children.len() >= 2).then_some(children)
    })
    .unwrap_or_else(|| panic!("two children are launched:\n{}", agent.log()));
    let mut seconds: Vec<u64> = launched.iter().map(launch_second).collect();
    seconds.sort();
    assert!(
        seconds.iter().all(|second| second % 2 == 0),
        "launched at the spec's times: {seconds:?}"
    );
    assert!(
        seconds.windows(2).all(|pair| pair[0] < pair[1]),
        "no time launched twice: {seconds:?}"
    );
    // A child runs to completion as a batch job.
    let first = format!("/v1/job/{}", launched[0]["ID"].as_str().unwrap().replace('/', "%2F"));
    wait_for(Duration::from_secs(30), || {
        let child = get_json(port, &first)?;
        (child["Status"] == "dead").then_some(())
    })
    .unwrap_or_else(|| panic!("the first child runs and finishes:\n{}", agent.log()));

    // Forced: a child of this second, off the schedule, with its evaluation (the same child
    // evaluated again when the schedule launched one in this very second).
    let forced = cli_stdout(&cli(port, &["job", "periodic", "force", "-detach", "report"]));
    assert!(forced.contains("Force periodic successful"), "{forced}");
    let eval_id = forced
        .lines()
        .find_map(|line| line.strip_prefix("Evaluation ID: "))
        .unwrap_or_else(|| panic!("{forced}"));
    let eval = get_json(port, &format!("/v1/evaluation/{eval_id}")).expect("the forced evaluation");
    assert!(
        eval["JobID"]
            .as_str()
            .is_some_and(|id| id.starts_with("report/periodic-")),
        "{eval}"
    );
    assert_eq!(eval["TriggeredBy"], "periodic-job");
    let plain = cli(port, &["job", "periodic", "force", "nothing-here"]);
    assert!(!plain.status.success());

    // The parent's status: periodic, its next launch, and its children instead of allocations.
    let status = cli_stdout(&cli(port, &["job", "status", "report"]));
    assert!(status.contains("Periodic"), "{status}");
    assert!(status.contains("Next Periodic Launch"), "{status}");
    assert!(status.contains("Children Job Summary"), "{status}");
    assert!(status.contains("Previously Launched Jobs"), "{status}");
    assert!(status.contains("report/periodic-"), "{status}");
    let summary = get_json(port, "/v1/job/report/summary").expect("summary");
    let total: u64 = ["Pending", "Running", "Dead"]
        .iter()
        .map(|key| summary["Children"][key].as_u64().unwrap_or(0))
        .sum();
    assert!(total as usize >= launched.len(), "{summary}");
    // A child's own status works through its escaped ID.
    let child_status = cli_stdout(&cli(port, &["job", "status", launched[0]["ID"].as_str().unwrap()]));
    assert!(child_status.contains("Allocations"), "{child_status}");

    // Stopped: the state machine refuses any launch after the stop is applied.
    cli_stdout(&cli(port, &["job", "stop", "report"]));
    let after_stop = children(port).len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(children(port).len(), after_stop, "a stopped parent launches nothing");
}

fn write_parameterized(dir: &Path, marker: &Path) -> String {
    let file = dir.join("render.hcl");
    std::fs::write(
        &file,
        format!(
            r#"job "render" {{
  type = "batch"
  meta {{
    owner = "ops"
  }}
  parameterized {{
    payload       = "required"
    meta_required = ["color"]
    meta_optional = ["size"]
  }}
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      dispatch_payload {{
        file = "in/input.txt"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "cat $NOMAD_TASK_DIR/in/input.txt > {marker}.tmp; echo \" $NOMAD_META_color $NOMAD_META_owner\" >> {marker}.tmp; mv {marker}.tmp {marker}"]
      }}
      resources {{
        cpu    = 20
        memory = 16
      }}
    }}
  }}
}}
"#,
            marker = marker.display()
        ),
    )
    .unwrap();
    file.to_str().unwrap().to_string()
}

#[test]
fn a_parameterized_job_is_dispatched_with_its_payload_and_meta() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());

    let marker = root.path().join("rendered");
    let run = cli_stdout(&cli(port, &["job", "run", &write_parameterized(root.path(), &marker)]));
    assert!(run.contains("Job registration successful"), "{run}");
    let status = cli_stdout(&cli(port, &["job", "status", "render"]));
    assert!(status.contains("Parameterized = true"), "{status}");

    // The payload goes to the task's local/in/input.txt, the meta to its environment.
    let input = root.path().join("input");
    std::fs::write(&input, b"hello payload").unwrap();
    let input = input.to_str().unwrap();
    let dispatched = cli_stdout(&cli(port, &["job", "dispatch", "-meta", "color=blue", "render", input]));
    assert!(
        dispatched.contains("Dispatched Job ID = render/dispatch-"),
        "{dispatched}"
    );
    assert!(dispatched.contains("Evaluation ID"), "{dispatched}");
    let rendered = wait_for(Duration::from_secs(30), || std::fs::read_to_string(&marker).ok())
        .unwrap_or_else(|| panic!("the dispatched task runs:\n{}", agent.log()));
    assert_eq!(rendered, "hello payload blue ops\n");

    // Nomad's checks, with its texts.
    let missing = cli(port, &["job", "dispatch", "render", input]);
    let text = String::from_utf8_lossy(&missing.stderr).into_owned();
    assert!(!missing.status.success());
    assert!(
        text.contains("Dispatch did not provide required meta keys: [color]"),
        "{text}"
    );
    let no_payload = cli(port, &["job", "dispatch", "-meta", "color=red", "render"]);
    let text = String::from_utf8_lossy(&no_payload.stderr).into_owned();
    assert!(
        text.contains("Payload is not provided but required by parameterized job"),
        "{text}"
    );

    // An idempotency token names the child it made (until that child is garbage collected).
    let token = [
        "job",
        "dispatch",
        "-detach",
        "-idempotency-token",
        "t-1",
        "-meta",
        "color=red",
        "render",
        input,
    ];
    let first = cli_stdout(&cli(port, &token));
    let second = cli_stdout(&cli(port, &token));
    let id = |out: &str| {
        out.lines()
            .find_map(|line| line.strip_prefix("Dispatched Job ID = "))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{out}"))
    };
    assert_eq!(id(&first), id(&second), "{first}\n{second}");
    let child = get_json(port, &format!("/v1/job/{}", id(&first).replace('/', "%2F"))).expect("the child");
    assert_eq!(child["ParentID"], "render");
    assert_eq!(child["Dispatched"], true);
    assert_eq!(child["Payload"], "aGVsbG8gcGF5bG9hZA==");
    assert_eq!(child["Meta"]["color"], "red");
}
