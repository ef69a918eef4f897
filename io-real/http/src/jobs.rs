//! Jobs and evaluations: `/v1/jobs`, `/v1/job/:id` (+ `/allocations`, `/evaluations`,
//! `/versions`), `/v1/evaluations`, `/v1/evaluation/:id`, in Nomad's JSON shapes. A
//! register returns the evaluation it created; a bad job is refused with every problem.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::JobSummary;
use drover_core::fsm::{ServerState, Table};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{AllocMetric, Allocation, Evaluation, Job};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, QueryOptions, api, namespace, parse_body, parse_job_write, query_headers, render};
use drover_io_real::driver::AgentHandle;
use drover_io_real::jobs::ApiJob;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RegisterBody {
    job: Option<ApiJob>,
    /// `job run -check-index`: register only if the stored job's modify index is
    /// `JobModifyIndex` (0: only if there is none).
    #[serde(default)]
    enforce_index: bool,
    #[serde(default)]
    job_modify_index: u64,
}

/// Nomad's `JobSummary`: allocations per task group by client status, kept by the state
/// store on apply (`fsm::summary`); queued counts come from the job's blocked evaluations.
fn summary(state: &ServerState, job: &Job, kept: &JobSummary) -> api::JobSummary {
    let groups = job
        .task_groups
        .iter()
        .map(|group| {
            let counts = kept.group(&group.name);
            let queued: u32 = state
                .job_blocked_evals(&job.namespace, &job.id)
                .filter_map(|eval| eval.queued_allocations.get(&group.name))
                .sum();
            let counts = api::TaskGroupSummary {
                queued,
                complete: counts.complete,
                failed: counts.failed,
                running: counts.running,
                starting: counts.starting,
                lost: counts.lost,
                unknown: 0,
            };
            (group.name.clone(), counts)
        })
        .collect();
    let (pending, running, dead) = state.children_summary(&job.namespace, &job.id);
    api::JobSummary {
        job_id: job.id.clone(),
        namespace: job.namespace.clone(),
        summary: groups,
        children: api::JobChildrenSummary { pending, running, dead },
        create_index: job.create_index,
        modify_index: job.modify_index,
    }
}

/// Nomad's `JobRegisterResponse` (with its `QueryMeta`), as a register, a revert or a scale
/// answers. A periodic parent is registered without an evaluation: `EvalCreateIndex` 0.
pub(super) fn register_response(index: u64, eval_id: &str, job_modify_index: u64) -> api::JobRegisterResponse {
    api::JobRegisterResponse {
        eval_id: eval_id.into(),
        eval_create_index: if eval_id.is_empty() { 0 } else { index },
        job_modify_index,
        warnings: String::new(),
        index,
        last_contact: 0,
        known_leader: true,
        next_token: String::new(),
    }
}

/// The job's status (Nomad's), from its kept summary.
pub(crate) fn status(state: &ServerState, job: &Job) -> &'static str {
    state.job_summary(&job.namespace, &job.id).status(job)
}

fn job_stub(state: &ServerState, job: &Job) -> Value {
    let kept = state.job_summary(&job.namespace, &job.id);
    let stub = crate::api::JobListStub {
        id: job.id.clone(),
        parent_id: job.parent_id.clone(),
        name: job.name.clone(),
        namespace: job.namespace.clone(),
        datacenters: job.datacenters.clone(),
        job_type: job.job_type.as_str().into(),
        priority: job.priority,
        periodic: job.is_periodic(),
        parameterized_job: job.is_parameterized(),
        stop: job.stop,
        status: kept.status(job).into(),
        status_description: String::new(),
        job_summary: summary(state, job, &kept),
        create_index: job.create_index,
        modify_index: job.modify_index,
        job_modify_index: job.job_modify_index,
        submit_time: (job.submit_time_ms as i64).saturating_mul(1_000_000),
    };
    serde_json::to_value(stub).expect("a job stub serializes")
}

pub fn metric(metric: &AllocMetric) -> api::AllocMetric {
    api::AllocMetric {
        nodes_evaluated: metric.nodes_evaluated,
        nodes_filtered: metric.nodes_filtered,
        nodes_in_pool: metric.nodes_evaluated,
        nodes_available: metric.nodes_available.clone(),
        class_filtered: Default::default(),
        constraint_filtered: metric.constraint_filtered.clone(),
        nodes_exhausted: metric.nodes_exhausted,
        class_exhausted: Default::default(),
        dimension_exhausted: metric.dimension_exhausted.clone(),
        quota_exhausted: Vec::new(),
        score_meta_data: Vec::new(),
        allocation_time: 0,
        coalesced_failures: metric.coalesced_failures,
    }
}

pub fn eval(eval: &Evaluation) -> Value {
    let rendered = crate::api::Evaluation {
        id: eval.id.clone(),
        namespace: eval.namespace.clone(),
        priority: eval.priority,
        eval_type: eval.eval_type.as_str().into(),
        triggered_by: eval.triggered_by.as_str().into(),
        job_id: eval.job_id.clone(),
        job_modify_index: eval.job_modify_index,
        node_id: eval.node_id.clone(),
        node_modify_index: 0,
        deployment_id: String::new(),
        status: eval.status.as_str().into(),
        status_description: eval.status_description.clone(),
        wait: eval.wait_ms.saturating_mul(1_000_000),
        wait_until: "0001-01-01T00:00:00Z".into(),
        next_eval: eval.next_eval.clone(),
        related_evals: Value::Null,
        class_eligibility: Value::Null,
        escaped_computed_class: false,
        quota_limit_reached: String::new(),
        annotate_plan: false,
        failed_tg_allocs: (!eval.failed_tg_allocs.is_empty()).then(|| {
            eval.failed_tg_allocs
                .iter()
                .map(|(group, m)| (group.clone(), metric(m)))
                .collect()
        }),
        queued_allocations: eval.queued_allocations.clone(),
        blocked_eval: eval.blocked_eval.clone(),
        previous_eval: eval.previous_eval.clone(),
        snapshot_index: eval.snapshot_index,
        create_index: eval.create_index,
        modify_index: eval.modify_index,
        create_time: (eval.create_time_ms as i64).saturating_mul(1_000_000),
        modify_time: (eval.modify_time_ms as i64).saturating_mul(1_000_000),
    };
    serde_json::to_value(rendered).expect("an evaluation serializes")
}

fn reply_error(reply: ServerReply) -> ApiError {
    match reply {
        ServerReply::Error(error) => error.into(),
        other => ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("unexpected reply {other:?}")),
    }
}

/// `PUT /v1/jobs` (or `/v1/job/:id`) body into the validated job it registers.
pub fn decode_register(body: &[u8], path_id: Option<&str>) -> Result<Job, ApiError> {
    // Nomad's Go client sends unset slices and maps as `null`: read as absent.
    let body: RegisterBody = parse_job_write(body, "job")?;
    let Some(api) = body.job else {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job must be specified".into()));
    };
    if let Some(id) = path_id
        && api.id != id
    {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job ID does not match name".into()));
    }
    api.to_job()
        .map_err(|problems| ApiError(StatusCode::BAD_REQUEST, drover_core::jobspec::format_errors(&problems)))
}

async fn register(
    handle: &AgentHandle,
    body: &[u8],
    path_id: Option<&str>,
) -> Result<axum::response::Response, ApiError> {
    let job = decode_register(body, path_id)?;
    let checked: RegisterBody = parse_body(body, "job")?;
    let enforce_index = checked.enforce_index.then_some(checked.job_modify_index);
    match handle
        .request_applied(ServerRequest::JobRegister {
            job: Box::new(job),
            enforce_index,
        })
        .await
    {
        ServerReply::JobRegistered {
            index,
            eval_id,
            job_modify_index,
        } => Ok((
            query_headers(handle, index),
            axum::Json(register_response(index, &eval_id, job_modify_index)),
        )
            .into_response()),
        other => Err(reply_error(other)),
    }
}

pub async fn register_jobs(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    register(&handle, &body, None).await
}

pub async fn register_job(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    register(&handle, &body, Some(&id)).await
}

pub async fn list_jobs(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = super::page::ItemFilter::of(&options)?;
    super::blocking_page(&handle, Table::Jobs, options, move |state, options| {
        let listed = list_page(state, options, &filter);
        filter.finish(listed)
    })
    .await
}

/// The page of job stubs `options` asks for, and the next page's token (`GET /v1/jobs`).
pub(super) fn list_page(
    state: &ServerState,
    options: &QueryOptions,
    filter: &super::page::ItemFilter,
) -> (Vec<Value>, Option<String>) {
    let every_namespace = options.namespace.as_deref() == Some("*");
    let matching = state
        .jobs()
        .filter(|job| {
            options
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == "*" || *ns == job.namespace)
        })
        .filter(|job| options.prefix.as_ref().is_none_or(|prefix| job.id.starts_with(prefix)))
        .filter(|job| {
            filter.keeps(|| serde_json::to_value(ApiJob::from_job(job, status(state, job))).expect("serializes"))
        })
        .map(|job| {
            let token = if every_namespace {
                format!("{}.{}", job.namespace, job.id)
            } else {
                job.id.clone()
            };
            (token, job)
        });
    let (jobs, next) = if every_namespace {
        super::page::namespaced_page(matching, options)
    } else {
        super::page::page(matching, options)
    };
    let with_meta = options.meta.unwrap_or(false);
    let stubs = jobs
        .into_iter()
        .map(|job| {
            let mut stub = job_stub(state, job);
            // `?meta=true`: each job's meta too (Nomad 1.5's `Meta`, left out otherwise).
            if with_meta {
                stub["Meta"] = json!(job.meta);
            }
            stub
        })
        .collect();
    (stubs, next)
}

pub async fn get_job(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_one(&handle, Table::Jobs, &options, "job not found", |state| {
        state
            .job(&namespace, &id)
            .map(|job| serde_json::to_value(ApiJob::from_job(job, status(state, job))).expect("serializes"))
    })
    .await
}

/// `GET /v1/job/:id/summary`: Nomad's `JobSummary`, allocations per task group by client
/// status.
pub async fn job_summary(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_one(&handle, Table::Allocs, &options, "job not found", |state| {
        state
            .job(&namespace, &id)
            .map(|job| summary(state, job, &state.job_summary(&namespace, &id)))
    })
    .await
}

#[derive(Debug, Default, Deserialize)]
pub struct DeregisterOptions {
    #[serde(default, deserialize_with = "super::go_bool")]
    purge: Option<bool>,
    namespace: Option<String>,
}

pub async fn deregister_job(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<DeregisterOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let request = ServerRequest::JobStop {
        namespace: options.namespace.unwrap_or_else(|| "default".into()),
        job_id: id,
        purge: options.purge.unwrap_or(false),
    };
    match handle.request_applied(request).await {
        ServerReply::JobRegistered {
            index,
            eval_id,
            job_modify_index,
        } => Ok((
            query_headers(&handle, index),
            axum::Json(api::JobDeregisterResponse {
                eval_id,
                eval_create_index: index,
                job_modify_index,
                index,
                last_contact: 0,
                known_leader: true,
            }),
        )),
        other => Err(reply_error(other)),
    }
}

pub async fn job_allocations(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_list(&handle, Table::Allocs, &options, |state| {
        // `all=true` includes the allocations of purged jobs of the same ID (Nomad's
        // `anyCreateIndex`).
        let all = options.all.as_deref().and_then(super::parse_bool).unwrap_or(false);
        let allocs: Vec<&Allocation> = if all {
            state
                .allocs()
                .filter(|alloc| alloc.namespace == namespace && alloc.job_id == id)
                .collect()
        } else {
            state.job_allocs(&namespace, &id).collect()
        };
        allocs
            .into_iter()
            .map(|alloc| render::alloc_stub(alloc, state))
            .collect()
    })
    .await
}

pub async fn job_evaluations(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_list(&handle, Table::Evals, &options, |state| {
        state.job_evals(&namespace, &id).map(eval).collect()
    })
    .await
}

pub async fn job_versions(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_one(&handle, Table::Jobs, &options, "job versions not found", |state| {
        let versions = state.job_versions(&namespace, &id);
        (!versions.is_empty()).then(|| {
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|job| serde_json::to_value(ApiJob::from_job(job, status(state, job))).expect("serializes"))
                .collect();
            json!({ "Versions": versions, "Diffs": Value::Null })
        })
    })
    .await
}

pub async fn list_evaluations(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = super::page::ItemFilter::of(&options)?;
    let namespace = super::namespace(&options);
    super::blocking_page(&handle, Table::Evals, options, move |state, options| {
        let matching = state
            .evals()
            .filter(|e| super::in_namespace(&namespace, &e.namespace))
            .filter(|e| options.prefix.as_ref().is_none_or(|prefix| e.id.starts_with(prefix)))
            .filter(|e| filter.keeps(|| eval(e)))
            .map(|e| (e.id.clone(), e));
        let (evals, next) = super::page::page(matching, options);
        filter.finish((evals.into_iter().map(eval).collect(), next))
    })
    .await
}

pub async fn get_evaluation(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_one(&handle, Table::Evals, &options, "eval not found", |state| {
        state.eval(&id).map(eval)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_core::structs::{EvalStatus, EvalTrigger};

    /// An evaluation renders through the shared API type and reads back unchanged (the CLI
    /// reads it so), in Nomad's words: its status, trigger and type as Nomad writes them.
    #[test]
    fn an_evaluation_renders_through_the_shared_type_in_nomads_words() {
        let mut evaluation = Evaluation {
            id: "e1".into(),
            job_id: "web".into(),
            status: EvalStatus::Blocked,
            triggered_by: EvalTrigger::QueuedAllocs,
            ..Evaluation::default()
        };
        evaluation.failed_tg_allocs.insert("g".into(), AllocMetric::default());
        evaluation.queued_allocations.insert("g".into(), 2);
        let rendered = eval(&evaluation);
        assert_eq!(rendered["Status"], "blocked");
        assert_eq!(rendered["TriggeredBy"], "queued-allocs");
        assert_eq!(rendered["Type"], "service");
        assert!(rendered["FailedTGAllocs"]["g"].is_object());
        let typed: crate::api::Evaluation = crate::api::read(&rendered).unwrap();
        assert_eq!(serde_json::to_value(typed).unwrap(), rendered);
        assert!(eval(&Evaluation::default())["FailedTGAllocs"].is_null());
    }

    /// A job stub renders through the shared API type and reads back unchanged.
    #[test]
    fn a_job_stub_renders_through_the_shared_type() {
        let state = ServerState::default();
        let job = drover_core::testkit::job("web", drover_core::structs::JobType::Batch);
        let rendered = job_stub(&state, &job);
        assert_eq!(rendered["Type"], "batch");
        let typed: crate::api::JobListStub = crate::api::read(&rendered).unwrap();
        assert_eq!(serde_json::to_value(typed).unwrap(), rendered);
    }
}
