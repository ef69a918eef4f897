//! Periodic jobs at the command line: `job periodic force`, the next launch `job run` prints
//! for a periodic job, and the parent's sections of `job status` (Nomad's layout).

use serde_json::Value;

use super::{Api, Failure, job_path, short, table, text};
use drover_core::periodic::Calendar as _;

/// `job periodic force [-detach] <job>`.
pub(super) fn force(api: &Api, id: &str, detach: bool) -> Result<(), Failure> {
    let reply = api.job_call("PUT", &format!("{}/periodic/force", job_path(id)), None, id)?;
    let eval_id = text(&reply["EvalID"]);
    if detach {
        println!("Force periodic successful");
        println!("Evaluation ID: {eval_id}");
        return Ok(());
    }
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    super::job::monitor(api, &eval_id, reply["EvalCreateIndex"].as_u64().unwrap_or(0))
}

/// The job's periodic block as the core reads it (None unless enabled).
fn config(job: &Value) -> Option<drover_core::structs::PeriodicConfig> {
    let api: drover_io_real::jobs::ApiPeriodicConfig = serde_json::from_value(job["Periodic"].clone()).ok()?;
    let job_type = drover_core::structs::JobType::parse(&text(&job["Type"]))?;
    let config = api.to_config(job_type, &mut Vec::new());
    config.enabled.then_some(config)
}

/// When the job launches next, from now: `2026-11-28T06:00:00Z (4m10s from now)`.
pub(super) fn next_launch(job: &Value) -> Option<String> {
    let config = config(job)?;
    let now = drover_io_real::clock::unix_millis();
    let next = drover_io_real::periodic::CronCalendar.next_after(&config, now)?;
    let wait = std::time::Duration::from_secs((next.saturating_sub(now)).div_ceil(1000));
    Some(format!(
        "{} ({} from now)",
        drover_http::rfc3339(next),
        drover_core::goduration::format(wait)
    ))
}

/// Whether the job only launches children: a periodic or parameterized parent.
pub(super) fn is_parent(job: &Value) -> bool {
    job["Periodic"].is_object() || (job["ParameterizedJob"].is_object() && job["Dispatched"] != true)
}

/// The rows of `job status` a parent adds to the job's own.
pub(super) fn status_rows(job: &Value) -> Vec<Vec<String>> {
    let mut rows = vec![
        vec!["Periodic".into(), "=".into(), job["Periodic"].is_object().to_string()],
        vec![
            "Parameterized".into(),
            "=".into(),
            (job["ParameterizedJob"].is_object() && job["Dispatched"] != true).to_string(),
        ],
    ];
    if let Some(next) = next_launch(job) {
        rows.push(vec!["Next Periodic Launch".into(), "=".into(), next]);
    }
    rows
}

/// A parent's children, in place of allocations: their summary and the launched jobs.
pub(super) fn children_sections(api: &Api, job: &Value, summary: &Value) -> Result<String, Failure> {
    let children = &summary["Children"];
    let mut out = String::from("Children Job Summary\n");
    out.push_str(&table(&[
        vec!["Pending".into(), "Running".into(), "Dead".into()],
        vec![
            text(&children["Pending"]),
            text(&children["Running"]),
            text(&children["Dead"]),
        ],
    ]));
    let id = text(&job["ID"]);
    let prefix = format!("{id}/");
    let jobs = api.get(&format!("/v1/jobs?prefix={}", super::escape(&prefix)))?;
    let mut rows = vec![vec!["ID".into(), "Status".into()]];
    for child in jobs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|child| child["ParentID"] == id.as_str())
    {
        rows.push(vec![text(&child["ID"]), text(&child["Status"])]);
    }
    out.push_str("\n\nPreviously Launched Jobs\n");
    if rows.len() == 1 {
        out.push_str("No previously launched jobs");
    } else {
        out.push_str(&table(&rows));
    }
    Ok(out)
}
