//! Periodic jobs at the command line: `job periodic force`, the next launch `job run` prints
//! for a periodic job, and the parent's sections of `job status` (Nomad's layout).

use drover_http::api;
use drover_io_real::jobs::ApiJob;

use super::{Api, Failure, job_path, short_id, table, typed};
use drover_core::periodic::Calendar as _;

/// `job periodic force [-detach] <job>`.
pub(super) fn force(api: &Api, id: &str, detach: bool) -> Result<(), Failure> {
    let path = format!("{}/periodic/force", job_path(id));
    let reply: api::PeriodicForceResponse = typed(&path, &api.job_call("PUT", &path, None, id)?)?;
    if detach {
        println!("Force periodic successful");
        println!("Evaluation ID: {}", reply.eval_id);
        return Ok(());
    }
    println!("==> Monitoring evaluation {:?}", short_id(&reply.eval_id));
    super::job::monitor(api, &reply.eval_id, reply.eval_create_index)
}

/// The job's periodic block as the core reads it (None unless enabled).
fn config(job: &ApiJob) -> Option<drover_core::structs::PeriodicConfig> {
    let periodic = job.periodic.as_ref()?;
    let job_type = drover_core::structs::JobType::parse(&job.job_type)?;
    let config = periodic.to_config(job_type, &mut Vec::new());
    config.enabled.then_some(config)
}

/// When the job launches next, from now: `2026-11-28T06:00:00Z (4m10s from now)`.
pub(super) fn next_launch(job: &ApiJob) -> Option<String> {
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
pub(super) fn is_parent(job: &ApiJob) -> bool {
    job.periodic.is_some() || parameterized_parent(job)
}

/// Whether the job is a parameterized parent (not one of its dispatched children).
fn parameterized_parent(job: &ApiJob) -> bool {
    job.parameterized_job.is_some() && !job.dispatched
}

/// The rows of `job status` a parent adds to the job's own.
pub(super) fn status_rows(job: &ApiJob) -> Vec<Vec<String>> {
    let mut rows = vec![
        vec!["Periodic".into(), "=".into(), job.periodic.is_some().to_string()],
        vec![
            "Parameterized".into(),
            "=".into(),
            parameterized_parent(job).to_string(),
        ],
    ];
    if let Some(next) = next_launch(job) {
        rows.push(vec!["Next Periodic Launch".into(), "=".into(), next]);
    }
    rows
}

/// A parent's children, in place of allocations: their summary and the launched jobs.
pub(super) fn children_sections(api: &Api, job: &ApiJob, summary: &api::JobSummary) -> Result<String, Failure> {
    let children = &summary.children;
    let mut out = String::from("Children Job Summary\n");
    out.push_str(&table(&[
        vec!["Pending".into(), "Running".into(), "Dead".into()],
        vec![
            children.pending.to_string(),
            children.running.to_string(),
            children.dead.to_string(),
        ],
    ]));
    let prefix = format!("{}/", job.id);
    let jobs: Vec<api::JobListStub> = api.get_as(&format!("/v1/jobs?prefix={}", super::escape(&prefix)))?;
    let mut rows = vec![vec!["ID".into(), "Status".into()]];
    for child in jobs.into_iter().filter(|child| child.parent_id == job.id) {
        rows.push(vec![child.id, child.status]);
    }
    out.push_str("\n\nPreviously Launched Jobs\n");
    if rows.len() == 1 {
        out.push_str("No previously launched jobs");
    } else {
        out.push_str(&table(&rows));
    }
    Ok(out)
}
