//! Scaling (Nomad's shapes and texts): `GET /v1/scaling/policies` (`?job=`, `?type=`),
//! `GET /v1/scaling/policy/:id`, and a job's `GET|PUT|POST /v1/job/:id/scale` (its groups'
//! counts, and `Job.Scale`). Policies are the jobs' group `scaling` blocks, read from the
//! jobs as stored; a status's `Events` are the group's scaling events (`fsm/scaling.rs`).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::{ServerState, Table};
use drover_core::rpc::JobScaleRequest;
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{ClientStatus, DesiredStatus, Job, ScalingPolicy, scaling_policy_id};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{ApiError, QueryOptions, in_namespace, namespace, parse_body, query_headers};
use drover_io_real::driver::AgentHandle;
use drover_io_real::jobs::{policy_json, policy_stub};

/// Every (job, group name, policy) of a group with a scaling block, in job order.
fn policies<'a>(
    state: &'a ServerState,
    namespace: &'a str,
) -> impl Iterator<Item = (&'a Job, &'a str, &'a ScalingPolicy)> + 'a {
    state
        .jobs()
        .filter(move |job| in_namespace(namespace, &job.namespace))
        .flat_map(|job| {
            job.task_groups
                .iter()
                .filter_map(move |group| Some((job, group.name.as_str(), group.scaling.as_deref()?)))
        })
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct PolicyQuery {
    job: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// `GET /v1/scaling/policies`.
pub async fn list(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
    Query(query): Query<PolicyQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_list(&handle, Table::Jobs, &options, |state| {
        policies(state, &namespace)
            .filter(|(job, _, _)| query.job.as_ref().is_none_or(|id| *id == job.id))
            .filter(|_| query.kind.as_deref().is_none_or(|kind| kind == "horizontal"))
            .map(|(job, group, policy)| policy_stub(policy, job, group))
            .collect::<Vec<Value>>()
    })
    .await
}

/// `GET /v1/scaling/policy/:id`.
pub async fn get(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_one(&handle, Table::Jobs, &options, "scaling policy not found", |state| {
        policies(state, "*")
            .find(|(job, group, _)| scaling_policy_id(&job.namespace, &job.id, group) == id)
            .map(|(job, group, policy)| policy_json(policy, job, group))
    })
    .await
}

/// `GET /v1/job/:id/scale`: Nomad's `JobScaleStatusResponse`.
pub async fn status(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_one(&handle, Table::Allocs, &options, "job not found", |state| {
        let job = state.job(&namespace, &id)?;
        let mut groups = Map::new();
        for group in &job.task_groups {
            let allocs: Vec<_> = state
                .job_allocs(&namespace, &id)
                .filter(|alloc| alloc.task_group == group.name && alloc.desired_status == DesiredStatus::Run)
                .collect();
            let health = |healthy: bool| {
                allocs
                    .iter()
                    .filter(|alloc| alloc.deployment_status.as_ref().and_then(|status| status.healthy) == Some(healthy))
                    .count()
            };
            groups.insert(
                group.name.clone(),
                json!({
                    "Desired": group.count,
                    "Placed": allocs.len(),
                    "Running": allocs.iter().filter(|alloc| alloc.client_status == ClientStatus::Running).count(),
                    "Healthy": health(true),
                    "Unhealthy": health(false),
                    "Events": state
                        .scaling_events(&namespace, &id)
                        .and_then(|groups| groups.get(&group.name))
                        .map(|events| events.iter().map(scaling_event).collect::<Vec<_>>())
                        .unwrap_or_default(),
                }),
            );
        }
        Some(json!({
            "JobID": job.id,
            "Namespace": job.namespace,
            "JobCreateIndex": job.create_index,
            "JobModifyIndex": job.job_modify_index,
            "JobStopped": job.stop,
            "TaskGroups": groups,
        }))
    })
    .await
}

/// Nomad's `ScalingEvent`: times in Unix nanoseconds.
fn scaling_event(event: &drover_core::structs::ScalingEvent) -> serde_json::Value {
    json!({
        "Time": event.time_ms.saturating_mul(1_000_000),
        "Count": event.count,
        "PreviousCount": event.previous_count,
        "Message": event.message,
        "Error": event.error,
        "Meta": if event.meta.is_empty() { serde_json::Value::Null } else { json!(event.meta) },
        "EvalID": event.eval_id,
        "CreateIndex": event.create_index,
    })
}

/// Nomad's `api.ScalingRequest` (`PolicyOverride` is accepted and has nothing to override:
/// there are no Sentinel policies).
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ScalingBody {
    count: Option<i64>,
    target: std::collections::BTreeMap<String, String>,
    job_modify_index: u64,
    message: String,
    error: bool,
    meta: Option<std::collections::BTreeMap<String, serde_json::Value>>,
}

/// `PUT|POST /v1/job/:id/scale`: answered as a register is.
pub async fn scale(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: ScalingBody = parse_body(&body, "scaling request")?;
    let Some(group) = body.target.get("Group").filter(|group| !group.is_empty()) else {
        return Err(ApiError(StatusCode::BAD_REQUEST, "missing task group name".into()));
    };
    let request = JobScaleRequest {
        namespace: namespace(&options),
        job_id: id,
        group: group.clone(),
        count: body.count,
        job_modify_index: body.job_modify_index,
        message: body.message,
        error: body.error,
        meta: body.meta.unwrap_or_default(),
    };
    match handle.request_applied(ServerRequest::JobScale(Box::new(request))).await {
        ServerReply::JobRegistered {
            index,
            eval_id,
            job_modify_index,
        } => Ok((
            query_headers(&handle, index),
            axum::Json(super::jobs::register_response(index, &eval_id, job_modify_index)),
        )),
        ServerReply::Error(error) => Err(error.into()),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected reply {other:?}"),
        )),
    }
}
