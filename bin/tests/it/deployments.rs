//! Deployments for real: one agent (server + client) runs an HCL job with an `update` block
//! through the CLI. The first version's deployment succeeds once the client finds its tasks
//! healthy; a new version places a canary beside the old allocations and waits for
//! `deployment promote`; a broken version (its task exits at once) fails its deployment on the
//! client's unhealthy verdict and `auto_revert` rolls the job back to the last stable version,
//! leaving the old allocations running; `job revert` and `/v1/job/:id/stable` do what an
//! operator asks. The HTTP shapes are checked on the way (durations in nanoseconds).

use crate::support;

use std::path::Path;

use std::time::Duration;

use serde_json::Value;
use support::{Agent, cli, cli_stdout, get_json, http, http_status, wait_for};

/// Version `version` of the job; a `broken` one's task exits at once, again and again.
fn jobspec(version: &str, broken: bool) -> String {
    let script = if broken { "exit 1" } else { "exec sleep 300" };
    format!(
        r#"job "web" {{
  update {{
    max_parallel     = 1
    min_healthy_time = "1s"
    healthy_deadline = "8s"
    progress_deadline = "30s"
    auto_revert      = true
  }}
  group "g" {{
    count = 2
    update {{
      canary = 1
    }}
    restart {{
      attempts = 10
      interval = "5m"
      delay    = "1s"
      mode     = "fail"
    }}
    task "t" {{
      driver = "raw_exec"
      env {{
        VERSION = "{version}"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
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

fn run_job(port: u16, dir: &Path, version: &str, broken: bool) {
    let file = dir.join(format!("web-{version}.hcl"));
    std::fs::write(&file, jobspec(version, broken)).unwrap();
    cli_stdout(&cli(port, &["job", "run", "-detach", file.to_str().unwrap()]));
}

fn latest(port: u16) -> Option<Value> {
    get_json(port, "/v1/job/web/deployment").filter(|d| !d.is_null())
}

/// Waits until the latest deployment is of `version` and has `status`.
fn deployment(agent: &Agent, port: u16, version: u64, status: &str) -> Value {
    wait_for(Duration::from_secs(60), || {
        let d = latest(port)?;
        (d["JobVersion"] == version && d["Status"] == status).then_some(d)
    })
    .unwrap_or_else(|| {
        panic!(
            "deployment of version {version} {status}: {:?}\n{}",
            latest(port),
            agent.log()
        )
    })
}

fn live_versions(port: u16) -> Vec<u64> {
    let allocs = get_json(port, "/v1/job/web/allocations").unwrap_or(Value::Null);
    let mut versions: Vec<u64> = allocs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["DesiredStatus"] == "run" && a["ClientStatus"] == "running")
        .filter_map(|a| a["JobVersion"].as_u64())
        .collect();
    versions.sort();
    versions
}

#[test]
fn a_job_rolls_out_through_deployments_with_canaries_promotion_and_auto_revert() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());

    // Version 0: no canaries for a first version; healthy after 1 s of running.
    run_job(port, root.path(), "0", false);
    let first = deployment(&agent, port, 0, "successful");
    assert_eq!(first["StatusDescription"], "Deployment completed successfully");
    let group = &first["TaskGroups"]["g"];
    assert_eq!(group["DesiredTotal"], 2);
    assert_eq!(group["HealthyAllocs"], 2);
    assert_eq!(group["ProgressDeadline"], 30_000_000_000u64, "nanoseconds");
    assert_eq!(group["AutoRevert"], true, "inherited from the job's update block");
    let job = get_json(port, "/v1/job/web").unwrap();
    assert_eq!(job["Stable"], true);
    assert_eq!(job["Update"]["MaxParallel"], 1);
    assert_eq!(job["TaskGroups"][0]["Update"]["Canary"], 1);
    assert_eq!(job["TaskGroups"][0]["Update"]["MinHealthyTime"], 1_000_000_000u64);
    assert_eq!(
        job["TaskGroups"][0]["Update"]["HealthCheck"], "checks",
        "Nomad's default"
    );
    let allocs = get_json(port, "/v1/job/web/allocations").unwrap();
    assert!(
        allocs
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["DeploymentStatus"]["Healthy"] == true),
        "{allocs}"
    );

    // Version 1: one canary beside the two old allocations, waiting for a promotion.
    run_job(port, root.path(), "1", false);
    let waiting = wait_for(Duration::from_secs(30), || {
        let d = latest(port)?;
        (d["JobVersion"] == 1 && d["TaskGroups"]["g"]["HealthyAllocs"] == 1).then_some(d)
    })
    .unwrap_or_else(|| panic!("the canary turns healthy: {:?}\n{}", latest(port), agent.log()));
    assert_eq!(waiting["Status"], "running");
    assert_eq!(
        waiting["StatusDescription"],
        "Deployment is running but requires manual promotion"
    );
    assert_eq!(live_versions(port), vec![0, 0, 1]);
    let id = waiting["ID"].as_str().unwrap().to_string();
    let status = cli_stdout(&cli(port, &["deployment", "status", &id[..8]]));
    assert!(status.contains("requires manual promotion"), "{status}");
    assert!(
        status.contains(
            "Task Group  Auto Revert  Promoted  Desired  Canaries  Placed  Healthy  Unhealthy  Progress Deadline"
        ),
        "{status}"
    );
    let job_status = cli_stdout(&cli(port, &["job", "status", "web"]));
    assert!(job_status.contains("Latest Deployment"), "{job_status}");
    assert!(job_status.contains(&id[..8]), "{job_status}");
    let promoted = cli_stdout(&cli(port, &["deployment", "promote", &id[..8]]));
    assert!(promoted.contains("promoted"), "{promoted}");
    deployment(&agent, port, 1, "successful");
    wait_for(Duration::from_secs(20), || {
        (live_versions(port) == vec![1, 1]).then_some(())
    })
    .unwrap_or_else(|| panic!("version 1 everywhere: {:?}", live_versions(port)));
    // Promoting a finished deployment is refused with Nomad's text.
    let (code, body) = http_status(
        "PUT",
        port,
        &format!("/v1/deployment/promote/{id}"),
        Some(r#"{"All":true}"#),
    )
    .unwrap();
    assert_eq!((code, body.trim()), (400, "can't promote terminal deployment"));

    // Version 2 is broken: its canary never stays up, the client finds it unhealthy at its
    // healthy deadline, and auto_revert registers version 1's spec again as version 3.
    run_job(port, root.path(), "2", true);
    let failed = wait_for(Duration::from_secs(60), || {
        get_json(port, "/v1/job/web/deployments")?
            .as_array()?
            .iter()
            .find(|d| d["JobVersion"] == 2 && d["Status"] == "failed")
            .cloned()
    })
    .unwrap_or_else(|| panic!("version 2 fails: {:?}\n{}", latest(port), agent.log()));
    assert_eq!(
        failed["StatusDescription"],
        "Failed due to unhealthy allocations - rolling back to job version 1"
    );
    deployment(&agent, port, 3, "successful");
    let job = get_json(port, "/v1/job/web").unwrap();
    assert_eq!(job["Version"], 3);
    assert_eq!(job["TaskGroups"][0]["Tasks"][0]["Env"]["VERSION"], "1");
    wait_for(Duration::from_secs(20), || {
        (live_versions(port) == vec![3, 3]).then_some(())
    })
    .unwrap_or_else(|| panic!("the old allocations run on as version 3: {:?}", live_versions(port)));

    // An operator's revert, and the stability flag.
    let reverted = cli_stdout(&cli(port, &["job", "revert", "web", "0"]));
    assert!(reverted.contains("reverted to version 0"), "{reverted}");
    let job = get_json(port, "/v1/job/web").unwrap();
    assert_eq!(
        (job["Version"].as_u64(), job["Stable"].as_bool()),
        (Some(4), Some(false))
    );
    let (code, body) = http_status("PUT", port, "/v1/job/web/revert", Some(r#"{"JobVersion":4}"#)).unwrap();
    assert_eq!((code, body.trim()), (400, "can't revert to current version"));
    http(
        "PUT",
        port,
        "/v1/job/web/stable",
        Some(r#"{"JobVersion":4,"Stable":true}"#),
    )
    .expect("stable");
    assert_eq!(get_json(port, "/v1/job/web").unwrap()["Stable"], true);
    let list = cli_stdout(&cli(port, &["deployment", "list"]));
    assert!(list.contains("Job ID  Job Version  Status"), "{list}");
    assert!(list.contains("failed"), "{list}");
}

/// A group's `scaling` block: its policy listed and read, `job scale` within its bounds
/// (refused outside them, and while a deployment runs), and a registration outside them
/// refused, with Nomad's texts.
#[test]
fn job_scale_moves_a_group_within_its_scaling_policy() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());
    let spec = |count: u32| {
        format!(
            r#"job "scaled" {{
  update {{
    min_healthy_time  = "1s"
    healthy_deadline  = "8s"
    progress_deadline = "30s"
  }}
  group "web" {{
    count = {count}
    scaling {{
      min = 1
      max = 3
      policy {{
        cooldown = "1m"
      }}
    }}
    task "t" {{
      driver = "raw_exec"
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
        )
    };
    let file = root.path().join("scaled.hcl");
    std::fs::write(&file, spec(1)).unwrap();
    cli_stdout(&cli(port, &["job", "run", "-detach", file.to_str().unwrap()]));
    let finished = |version: u64| {
        wait_for(Duration::from_secs(60), || {
            let d = get_json(port, "/v1/job/scaled/deployment").filter(|d| !d.is_null())?;
            (d["JobVersion"] == version && d["Status"] == "successful").then_some(())
        })
        .unwrap_or_else(|| panic!("version {version} deployed:\n{}", agent.log()))
    };
    finished(0);

    let policies = get_json(port, "/v1/scaling/policies").unwrap();
    let stub = &policies[0];
    assert_eq!(stub["Target"]["Job"], "scaled", "{policies}");
    assert_eq!(stub["Target"]["Group"], "web");
    assert_eq!(stub["Type"], "horizontal");
    let id = stub["ID"].as_str().unwrap();
    let policy = get_json(port, &format!("/v1/scaling/policy/{id}")).unwrap();
    assert_eq!((policy["Min"].as_i64(), policy["Max"].as_i64()), (Some(1), Some(3)));
    assert_eq!(policy["Policy"]["cooldown"], "1m");
    let job = get_json(port, "/v1/job/scaled").unwrap();
    assert_eq!(job["TaskGroups"][0]["Scaling"]["ID"], id, "the same ID inside the job");

    let over = cli(port, &["job", "scale", "scaled", "4"]);
    assert!(!over.status.success());
    let said = String::from_utf8_lossy(&over.stderr).into_owned();
    assert!(
        said.contains("group count was greater than scaling policy maximum: 4 > 3"),
        "{said}"
    );
    let scaled = cli_stdout(&cli(port, &["job", "scale", "-detach", "scaled", "web", "2"]));
    assert!(scaled.starts_with("Job scale successful\nEvaluation ID: "), "{scaled}");
    let status = wait_for(Duration::from_secs(60), || {
        let status = get_json(port, "/v1/job/scaled/scale")?;
        (status["TaskGroups"]["web"]["Running"] == 2).then_some(status)
    })
    .unwrap_or_else(|| panic!("two running:\n{}", agent.log()));
    assert_eq!(status["TaskGroups"]["web"]["Desired"], 2);
    assert_eq!(status["JobStopped"], false);
    finished(1);
    // An autoscaler's report without a count records an event and changes nothing.
    let report = r#"{"Target":{"Group":"web"},"Message":"cooling down","Error":true,"Meta":{"reason":"cpu"}}"#;
    let answer: Value =
        serde_json::from_str(&http("PUT", port, "/v1/job/scaled/scale", Some(report)).unwrap()).unwrap();
    assert_eq!(answer["EvalID"], "", "{answer}");
    let events = get_json(port, "/v1/job/scaled/scale").unwrap()["TaskGroups"]["web"]["Events"].clone();
    let events = events.as_array().unwrap_or_else(|| panic!("events: {events}"));
    assert_eq!(events.len(), 2, "{events:?}");
    let (report, scale) = (&events[0], &events[1]);
    assert_eq!(
        (
            &report["Count"],
            &report["Error"],
            &report["Message"],
            &report["Meta"]["reason"],
            &report["EvalID"]
        ),
        (
            &Value::Null,
            &Value::Bool(true),
            &Value::from("cooling down"),
            &Value::from("cpu"),
            &Value::Null
        ),
        "newest first: {events:?}"
    );
    assert_eq!(
        (scale["Count"].as_i64(), scale["PreviousCount"].as_i64()),
        (Some(2), Some(1))
    );
    assert!(scale["EvalID"].as_str().is_some_and(|id| id.len() == 36), "{scale}");
    assert!(
        scale["Time"].as_u64().unwrap() > 1_000_000_000_000_000_000,
        "nanoseconds"
    );
    assert_eq!(
        get_json(port, "/v1/job/scaled").unwrap()["Version"],
        1,
        "no new version"
    );

    std::fs::write(&file, spec(5)).unwrap();
    let refused = cli(port, &["job", "run", "-detach", file.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        said.contains("task group count must not be greater than maximum count in scaling policy"),
        "{said}"
    );
    http("DELETE", port, "/v1/job/scaled?purge=true", None).expect("purged");
}

/// Nomad's `AllocationListStub` (`api/allocations.go`).
const ALLOC_STUB: &[&str] = &[
    "ID",
    "EvalID",
    "Name",
    "Namespace",
    "NodeID",
    "NodeName",
    "JobID",
    "JobType",
    "JobVersion",
    "TaskGroup",
    "DesiredStatus",
    "DesiredDescription",
    "ClientStatus",
    "ClientDescription",
    "TaskStates",
    "DeploymentStatus",
    "FollowupEvalID",
    "NextAllocation",
    "RescheduleTracker",
    "PreemptedAllocations",
    "PreemptedByAllocation",
    "CreateIndex",
    "ModifyIndex",
    "CreateTime",
    "ModifyTime",
];

/// Nomad's `Allocation`.
const ALLOCATION: &[&str] = &[
    "ID",
    "Namespace",
    "EvalID",
    "Name",
    "NodeID",
    "NodeName",
    "JobID",
    "Job",
    "TaskGroup",
    "Resources",
    "TaskResources",
    "AllocatedResources",
    "Services",
    "Metrics",
    "DesiredStatus",
    "DesiredDescription",
    "DesiredTransition",
    "ClientStatus",
    "ClientDescription",
    "TaskStates",
    "DeploymentID",
    "DeploymentStatus",
    "FollowupEvalID",
    "PreviousAllocation",
    "NextAllocation",
    "RescheduleTracker",
    "NetworkStatus",
    "PreemptedAllocations",
    "PreemptedByAllocation",
    "CreateIndex",
    "ModifyIndex",
    "AllocModifyIndex",
    "CreateTime",
    "ModifyTime",
];

/// Nomad's `Evaluation`.
const EVALUATION: &[&str] = &[
    "ID",
    "Priority",
    "Type",
    "TriggeredBy",
    "Namespace",
    "JobID",
    "JobModifyIndex",
    "NodeID",
    "NodeModifyIndex",
    "DeploymentID",
    "Status",
    "StatusDescription",
    "Wait",
    "WaitUntil",
    "NextEval",
    "PreviousEval",
    "BlockedEval",
    "RelatedEvals",
    "FailedTGAllocs",
    "ClassEligibility",
    "EscapedComputedClass",
    "QuotaLimitReached",
    "AnnotatePlan",
    "QueuedAllocations",
    "SnapshotIndex",
    "CreateIndex",
    "ModifyIndex",
    "CreateTime",
    "ModifyTime",
];

/// Nomad's `NodeListStub`, as listed without `resources` or `os`.
const NODE_STUB: &[&str] = &[
    "Address",
    "ID",
    "Datacenter",
    "Name",
    "NodePool",
    "NodeClass",
    "Version",
    "Drain",
    "SchedulingEligibility",
    "Status",
    "StatusDescription",
    "Drivers",
    "HostVolumes",
    "LastDrain",
    "CreateIndex",
    "ModifyIndex",
];

/// Nomad's `Node`.
const NODE: &[&str] = &[
    "ID",
    "Datacenter",
    "Name",
    "HTTPAddr",
    "TLSEnabled",
    "Attributes",
    "NodeResources",
    "ReservedResources",
    "Links",
    "Meta",
    "NodeClass",
    "NodePool",
    "CgroupParent",
    "Drain",
    "DrainStrategy",
    "SchedulingEligibility",
    "Status",
    "StatusDescription",
    "StatusUpdatedAt",
    "Events",
    "Drivers",
    "HostVolumes",
    "HostNetworks",
    "CSIControllerPlugins",
    "CSINodePlugins",
    "LastDrain",
    "CreateIndex",
    "ModifyIndex",
];

/// Nomad's `TaskEvent`, deprecated flat fields included.
const TASK_EVENT: &[&str] = &[
    "Type",
    "Time",
    "DisplayMessage",
    "Details",
    "Message",
    "FailsTask",
    "RestartReason",
    "SetupError",
    "DriverError",
    "DriverMessage",
    "ExitCode",
    "Signal",
    "KillReason",
    "KillTimeout",
    "KillError",
    "StartDelay",
    "DownloadError",
    "ValidationError",
    "DiskLimit",
    "DiskSize",
    "FailedSibling",
    "VaultError",
    "TaskSignalReason",
    "TaskSignal",
    "GenericSource",
];

/// The allocation, evaluation, node, deployment and cluster families, table-driven: each read
/// answers exactly Nomad's field names, with Go's nulls where Nomad's Go structs hold nil.
#[test]
fn the_cluster_families_answer_nomads_field_names() {
    let (keys, sorted) = (support::field_names, support::sorted_names);
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());
    run_job(port, root.path(), "0", false);
    let deployment = deployment(&agent, port, 0, "successful");
    let stubs = get_json(port, "/v1/allocations").unwrap();
    let stub = stubs[0].clone();
    let alloc_id = stub["ID"].as_str().unwrap().to_string();
    let alloc = get_json(port, &format!("/v1/allocation/{alloc_id}")).unwrap();
    let node_stub = get_json(port, "/v1/nodes").unwrap()[0].clone();
    let node = get_json(port, &format!("/v1/node/{}", node_stub["ID"].as_str().unwrap())).unwrap();
    let eval = get_json(port, "/v1/evaluations").unwrap()[0].clone();
    let members = get_json(port, "/v1/agent/members").unwrap();
    let raft = get_json(port, "/v1/operator/raft/configuration").unwrap();
    let with_resources: Vec<&str> = ALLOC_STUB.iter().copied().chain(["AllocatedResources"]).collect();
    let node_with_resources: Vec<&str> = NODE_STUB
        .iter()
        .copied()
        .chain(["NodeResources", "ReservedResources"])
        .collect();
    let table: Vec<(&str, Value, Vec<String>)> = vec![
        ("AllocationListStub", stub.clone(), sorted(ALLOC_STUB)),
        (
            "AllocationListStub with resources",
            get_json(port, "/v1/allocations?resources=true").unwrap()[0].clone(),
            sorted(&with_resources),
        ),
        ("Allocation", alloc.clone(), sorted(ALLOCATION)),
        (
            "AllocDeploymentStatus",
            alloc["DeploymentStatus"].clone(),
            sorted(&["Healthy", "Timestamp", "Canary", "ModifyIndex"]),
        ),
        (
            "DesiredTransition",
            alloc["DesiredTransition"].clone(),
            sorted(&["Migrate", "Reschedule", "ForceReschedule"]),
        ),
        (
            "TaskState",
            alloc["TaskStates"]["t"].clone(),
            sorted(&[
                "State",
                "Failed",
                "Restarts",
                "LastRestart",
                "StartedAt",
                "FinishedAt",
                "Events",
            ]),
        ),
        (
            "TaskEvent",
            alloc["TaskStates"]["t"]["Events"][0].clone(),
            sorted(TASK_EVENT),
        ),
        ("Evaluation", eval.clone(), sorted(EVALUATION)),
        ("NodeListStub", node_stub.clone(), sorted(NODE_STUB)),
        (
            "NodeListStub with resources",
            get_json(port, "/v1/nodes?resources=true").unwrap()[0].clone(),
            sorted(&node_with_resources),
        ),
        ("Node", node.clone(), sorted(NODE)),
        (
            "DriverInfo",
            node["Drivers"]["raw_exec"].clone(),
            sorted(&["Attributes", "Detected", "Healthy", "HealthDescription", "UpdateTime"]),
        ),
        (
            "Deployment",
            deployment.clone(),
            sorted(&[
                "ID",
                "Namespace",
                "JobID",
                "JobVersion",
                "JobModifyIndex",
                "JobSpecModifyIndex",
                "JobCreateIndex",
                "IsMultiregion",
                "TaskGroups",
                "Status",
                "StatusDescription",
                "EvalPriority",
                "CreateIndex",
                "ModifyIndex",
                "CreateTime",
                "ModifyTime",
            ]),
        ),
        (
            "DeploymentState",
            deployment["TaskGroups"]["g"].clone(),
            sorted(&[
                "AutoRevert",
                "AutoPromote",
                "ProgressDeadline",
                "RequireProgressBy",
                "Promoted",
                "PlacedCanaries",
                "DesiredCanaries",
                "DesiredTotal",
                "PlacedAllocs",
                "HealthyAllocs",
                "UnhealthyAllocs",
            ]),
        ),
        (
            "ServerMembers",
            members.clone(),
            sorted(&["ServerName", "ServerRegion", "ServerDC", "Members"]),
        ),
        (
            "AgentMember",
            members["Members"][0].clone(),
            sorted(&[
                "Name",
                "Addr",
                "Port",
                "Tags",
                "Status",
                "ProtocolMin",
                "ProtocolMax",
                "ProtocolCur",
                "DelegateMin",
                "DelegateMax",
                "DelegateCur",
            ]),
        ),
        ("RaftConfiguration", raft.clone(), sorted(&["Servers", "Index"])),
        (
            "RaftServer",
            raft["Servers"][0].clone(),
            sorted(&["ID", "Node", "Address", "Leader", "Voter", "RaftProtocol"]),
        ),
    ];
    for (shape, value, expected) in table {
        assert_eq!(keys(&value), expected, "{shape}: {value}");
    }
    // Go's nulls where Nomad's structs hold nil; times and durations as Nomad sends them.
    for (shape, value) in [
        ("stub RescheduleTracker", &stub["RescheduleTracker"]),
        ("NetworkStatus", &alloc["NetworkStatus"]),
        ("Services", &alloc["Services"]),
        ("Evaluation FailedTGAllocs", &eval["FailedTGAllocs"]),
        ("Evaluation RelatedEvals", &eval["RelatedEvals"]),
        ("Node Links", &node["Links"]),
    ] {
        assert!(value.is_null(), "{shape}: {value}");
    }
    assert_eq!(alloc["Job"]["ID"], "web", "the job as placed");
    assert_eq!(alloc["Job"]["Version"], stub["JobVersion"]);
    assert!(
        stub["CreateTime"].as_i64().unwrap() > 1_000_000_000_000_000_000,
        "nanoseconds"
    );
    assert_eq!(eval["Wait"], 0);
    assert_eq!(eval["WaitUntil"], "0001-01-01T00:00:00Z");
    assert_eq!(deployment["TaskGroups"]["g"]["ProgressDeadline"], 30_000_000_000u64);
}
