//! `PUT /v1/job/:id/plan` (Nomad's `Job.Plan`): the job admitted as a register would admit it,
//! then scheduled as a dry run on this server's state once it has caught up with the leader
//! (`scheduler::dry_run`), answered with Nomad's `JobPlanResponse` — the per-group
//! `DesiredTGUpdates`, what could not be placed, the stored job's `JobModifyIndex` for
//! `job run -check-index`, and with `"Diff": true` the job diff (`jobs::diff`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::Table;
use drover_core::scheduler::dry_run::{DesiredUpdates, DryRun, dry_run};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, api, parse_job_write, query_headers};
use drover_io_real::driver::AgentHandle;
use drover_io_real::jobs::ApiJob;
use drover_io_real::jobs::diff::{GroupUpdates, job_diff};

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct PlanBody {
    job: Option<ApiJob>,
    diff: bool,
    // `PolicyOverride` (Sentinel) is accepted and means nothing here: there are no Sentinel
    // policies.
}

fn desired(updates: &DesiredUpdates) -> api::DesiredUpdates {
    api::DesiredUpdates {
        ignore: updates.ignore,
        place: updates.place,
        migrate: updates.migrate,
        stop: updates.stop,
        in_place_update: updates.in_place_update,
        destructive_update: updates.destructive_update,
        canary: updates.canary,
        preemptions: updates.preemptions,
    }
}

/// What the plan does to a group, in the diff's words.
fn group_updates(run: &DryRun, group: &str) -> GroupUpdates {
    let Some(updates) = run.desired.get(group) else {
        return GroupUpdates::default();
    };
    let counts = [
        ("create", updates.place),
        ("destroy", updates.stop),
        ("migrate", updates.migrate),
        ("in-place update", updates.in_place_update),
        ("create/destroy update", updates.destructive_update),
        ("canary", updates.canary),
        ("ignore", updates.ignore),
    ];
    GroupUpdates {
        updates: counts.into_iter().filter(|(_, count)| *count > 0).collect(),
        destructive: updates.destructive_update > 0 || updates.canary > 0,
        in_place: updates.in_place_update > 0,
    }
}

pub async fn plan(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: PlanBody = parse_job_write(&body, "plan request")?;
    let Some(api) = body.job else {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job must be specified".into()));
    };
    if api.id != id {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job ID does not match".into()));
    }
    let mut job = api
        .to_job()
        .map_err(|problems| ApiError(StatusCode::BAD_REQUEST, drover_core::jobspec::format_errors(&problems)))?;
    let limits = handle.config().server.job_limits;
    let errors = drover_core::jobspec::admit(&mut job, &limits);
    if !errors.is_empty() {
        return Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            drover_core::jobspec::format_errors(&errors),
        ));
    }
    if handle.is_server() {
        handle
            .read_barrier()
            .await
            .map_err(|error| ApiError(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?;
    }
    let want_diff = body.diff;
    let answer = handle.read_state(move |state| {
        let index = state.table_index(Table::Jobs);
        let stored = state.job(&job.namespace, &job.id).cloned();
        dry_run(state, &job, &limits).map(|run| (index, stored, run))
    });
    let (index, stored, run) = match answer {
        Some(Ok(found)) => found,
        Some(Err(text)) => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, text)),
        None => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "No cluster leader".into())),
    };
    let diff = if want_diff {
        let old = stored.as_ref().map(|job| ApiJob::from_job(job, ""));
        let new = ApiJob::from_job(&run.job, "");
        job_diff(old.as_ref(), &new, &|group| group_updates(&run, group))
    } else {
        Value::Null
    };
    let failed: std::collections::BTreeMap<String, api::AllocMetric> = run
        .failed
        .iter()
        .map(|(group, metric)| (group.clone(), super::jobs_metric(metric)))
        .collect();
    let answer = api::JobPlanResponse {
        annotations: api::PlanAnnotations {
            desired_tg_updates: run
                .desired
                .iter()
                .map(|(group, updates)| (group.clone(), desired(updates)))
                .collect(),
            preempted_allocs: Value::Null,
        },
        failed_tg_allocs: (!failed.is_empty()).then_some(failed),
        job_modify_index: run.job_modify_index,
        created_evals: Value::Null,
        diff,
        next_periodic_launch: next_launch(&run.job),
        warnings: String::new(),
        index,
    };
    Ok((query_headers(&handle, index), axum::Json(answer)))
}

/// When a periodic job would launch next from now (Go's zero time for any other job), as
/// RFC 3339.
fn next_launch(job: &drover_core::structs::Job) -> String {
    use drover_core::periodic::Calendar as _;
    job.periodic
        .as_ref()
        .filter(|periodic| periodic.enabled)
        .and_then(|periodic| {
            drover_io_real::periodic::CronCalendar.next_after(periodic, drover_io_real::clock::unix_millis())
        })
        .and_then(|ms| chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64))
        .map_or_else(
            || "0001-01-01T00:00:00Z".to_string(),
            |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
}
