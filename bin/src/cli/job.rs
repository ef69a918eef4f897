//! `agent job run|status|stop` and the evaluation monitor.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use drover_http::api::{self, AllocListStub, Evaluation, JobListStub};
use drover_io_real::jobs::ApiJob;

use super::{Api, Failure, job_path, short_id, table, typed};

/// A jobspec file (HCL, or JSON with or without its `{"Job": ...}` wrapper) as the API's job.
pub(super) fn read_job_file(file: &str) -> Result<Value, Failure> {
    let source = std::fs::read_to_string(file).map_err(|error| Failure(format!("Error reading {file}: {error}"), 1))?;
    if file.ends_with(".json") {
        let value: Value = serde_json::from_str(&source)?;
        return Ok(value.get("Job").cloned().unwrap_or(value));
    }
    let parsed = drover_io_real::jobspec::parse(&source).map_err(|problems| {
        Failure(
            format!("Error parsing job file from {file}:\n{}", problems.join("\n")),
            1,
        )
    })?;
    Ok(serde_json::to_value(parsed)?)
}

/// `job run [-detach] [-check-index N] <file>`.
pub(super) fn job_run(api: &Api, file: &str, detach: bool, check_index: Option<u64>) -> Result<(), Failure> {
    let job = read_job_file(file)?;
    let mut body = json!({ "Job": job });
    if let Some(index) = check_index {
        body["EnforceIndex"] = json!(true);
        body["JobModifyIndex"] = json!(index);
    }
    let reply: api::JobRegisterResponse = typed("/v1/jobs", &api.call("PUT", "/v1/jobs", Some(&body))?)?;
    let eval_id = reply.eval_id;
    // A periodic parent is not evaluated itself: Nomad tells when it launches instead.
    if eval_id.is_empty() {
        println!("Job registration successful");
        let job: Option<ApiJob> = typed("the job file", &job).ok();
        if let Some(next) = job.as_ref().and_then(super::periodic::next_launch) {
            println!("Approximate next launch time: {next}");
        }
        return Ok(());
    }
    if detach {
        println!("Job registration successful");
        println!("Evaluation ID: {eval_id}");
        return Ok(());
    }
    println!("==> Monitoring evaluation {:?}", short_id(&eval_id));
    monitor(api, &eval_id, reply.eval_create_index)
}

/// Follows an evaluation (and the blocked one it leaves) until it is done; exit code 2 when
/// something could not be placed. The first read blocks until the server answering has
/// applied the write that created the evaluation (`created_at`): a follower may not have it
/// yet when the leader acknowledged the write.
pub(super) fn monitor(api: &Api, eval_id: &str, created_at: u64) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut path = format!(
        "/v1/evaluation/{eval_id}?index={}&wait=30s",
        created_at.saturating_sub(1)
    );
    let eval = loop {
        let eval: Evaluation = api.get_as(&path)?;
        path = format!("/v1/evaluation/{eval_id}");
        if eval.status != "pending" || Instant::now() > deadline {
            break eval;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("    Evaluation triggered by job {:?}", eval.job_id);
    let path = format!("{}/allocations", job_path(&eval.job_id));
    let allocs: Vec<AllocListStub> = api.get_as(&path)?;
    for alloc in allocs.iter().filter(|a| a.eval_id == eval_id) {
        println!(
            "    Allocation {:?} created: node {:?}, group {:?}",
            short_id(&alloc.id),
            short_id(&alloc.node_id),
            alloc.task_group
        );
    }
    println!("    Evaluation status changed: \"pending\" -> {:?}", eval.status);
    let failed = eval.failed_tg_allocs.as_ref().filter(|failed| !failed.is_empty());
    if let Some(failed) = failed {
        println!(
            "==> Evaluation {:?} finished with status {:?} but failed to place all allocations:",
            short_id(&eval.id),
            eval.status
        );
        for (group, metric) in failed {
            let queued = eval.queued_allocations.get(group).copied().unwrap_or(0);
            let plural = if queued == 1 { "" } else { "s" };
            println!("    Task Group {group:?} (failed to place {queued} allocation{plural}):");
            for (reason, count) in &metric.constraint_filtered {
                println!("      * Constraint {reason:?}: {count} nodes excluded by filter");
            }
            for (dimension, count) in &metric.dimension_exhausted {
                println!("      * Resources exhausted on {count} nodes");
                println!("      * Dimension {dimension:?} exhausted on {count} nodes");
            }
        }
        if !eval.blocked_eval.is_empty() {
            println!(
                "    Evaluation {:?} waiting for additional capacity to place remainder",
                short_id(&eval.blocked_eval)
            );
        }
        return Err(Failure(String::new(), 2));
    }
    println!(
        "==> Evaluation {:?} finished with status {:?}",
        short_id(&eval.id),
        eval.status
    );
    Ok(())
}

pub(super) fn job_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let Some(id) = id else {
        let jobs: Vec<JobListStub> = api.get_as("/v1/jobs")?;
        let mut rows = vec![vec![
            "ID".into(),
            "Type".into(),
            "Priority".into(),
            "Status".into(),
            "Submit Date".into(),
        ]];
        for job in jobs {
            rows.push(vec![
                job.id,
                job.job_type,
                job.priority.to_string(),
                job.status,
                drover_http::rfc3339((job.submit_time / 1_000_000) as u64),
            ]);
        }
        if rows.len() == 1 {
            println!("No running jobs");
        } else {
            println!("{}", table(&rows));
        }
        return Ok(());
    };
    let job: ApiJob = typed(&job_path(id), &api.job_call("GET", &job_path(id), None, id)?)?;
    let summary: api::JobSummary = api.get_as(&format!("{}/summary", job_path(id)))?;
    let mut rows = vec![
        vec!["ID".into(), "=".into(), job.id.clone()],
        vec!["Name".into(), "=".into(), job.name.clone()],
        vec!["Type".into(), "=".into(), job.job_type.clone()],
        vec![
            "Priority".into(),
            "=".into(),
            job.priority.map(|priority| priority.to_string()).unwrap_or_default(),
        ],
        vec!["Datacenters".into(), "=".into(), job.datacenters.join(",")],
        vec!["Status".into(), "=".into(), job.status.clone()],
        vec!["Version".into(), "=".into(), job.version.to_string()],
    ];
    let parent = super::periodic::is_parent(&job);
    if parent {
        rows.extend(super::periodic::status_rows(&job));
    }
    println!("{}", table(&rows).replace("  =  ", " = "));
    println!();
    if parent {
        println!("{}", super::periodic::children_sections(api, &job, &summary)?);
        return Ok(());
    }
    println!("Summary");
    let mut rows = vec![
        [
            "Task Group",
            "Queued",
            "Starting",
            "Running",
            "Failed",
            "Complete",
            "Lost",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    for (group, counts) in summary.summary {
        rows.push(vec![
            group,
            counts.queued.to_string(),
            counts.starting.to_string(),
            counts.running.to_string(),
            counts.failed.to_string(),
            counts.complete.to_string(),
            counts.lost.to_string(),
        ]);
    }
    println!("{}", table(&rows));
    if let Some(section) = super::deployment::latest_section(api, id)? {
        println!();
        println!("{section}");
    }
    println!();
    println!("Allocations");
    let allocs: Vec<AllocListStub> = api.get_as(&format!("{}/allocations", job_path(id)))?;
    let mut rows = vec![
        ["ID", "Node ID", "Task Group", "Version", "Desired", "Status"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for alloc in allocs {
        rows.push(vec![
            short_id(&alloc.id),
            short_id(&alloc.node_id),
            alloc.task_group,
            alloc.job_version.to_string(),
            alloc.desired_status,
            alloc.client_status,
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

pub(super) fn job_stop(api: &Api, id: &str, purge: bool) -> Result<(), Failure> {
    let path = format!("{}?purge={purge}", job_path(id));
    let reply: api::JobDeregisterResponse = typed(&path, &api.job_call("DELETE", &path, None, id)?)?;
    println!("==> Monitoring evaluation {:?}", short_id(&reply.eval_id));
    monitor(api, &reply.eval_id, reply.eval_create_index)
}
