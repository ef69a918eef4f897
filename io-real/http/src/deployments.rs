//! Deployments over HTTP, in Nomad's paths and shapes: `GET /v1/deployments`,
//! `/v1/deployment/:id`, `/v1/deployment/allocations/:id`, `/v1/job/:id/deployments`,
//! `/v1/job/:id/deployment`; and the writes `PUT /v1/deployment/{fail,pause,promote,
//! allocation-health}/:id`, `/v1/job/:id/revert`, `/v1/job/:id/stable`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use drover_core::fsm::Table;
use drover_core::rpc::{DeploymentRequest, ServerReply, ServerRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, QueryOptions, block_on_table, namespace, parse_body_or_default, query_headers, render};
use drover_io_real::driver::AgentHandle;

/// `GET /v1/deployments` (`?prefix=`, paginated), newest first within the page order of IDs.
pub async fn list(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = super::page::ItemFilter::of(&options)?;
    let namespace = namespace(&options);
    super::blocking_page(&handle, Table::Deployments, options, move |state, options| {
        let matching = state
            .deployments()
            .filter(|d| namespace == "*" || d.namespace == namespace)
            .filter(|d| options.prefix.as_ref().is_none_or(|prefix| d.id.starts_with(prefix)))
            .filter(|d| filter.keeps(|| render::deployment(d)))
            .map(|d| (d.id.clone(), d));
        let (found, next) = super::page::page(matching, options);
        filter.finish((found.into_iter().map(render::deployment).collect(), next))
    })
    .await
}

/// `GET /v1/deployment/:id`.
pub async fn get(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_one(&handle, Table::Deployments, &options, "deployment not found", |state| {
        state.deployment(&id).map(render::deployment)
    })
    .await
}

/// `GET /v1/deployment/allocations/:id`: the stubs of the deployment's allocations.
pub async fn allocations(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    super::blocking_list(&handle, Table::Allocs, &options, |state| {
        let Some(deployment) = state.deployment(&id) else {
            return Vec::new();
        };
        state
            .job_allocs(&deployment.namespace, &deployment.job_id)
            .filter(|alloc| alloc.deployment_id == id)
            .map(|alloc| render::alloc_stub(alloc, state))
            .collect()
    })
    .await
}

/// `GET /v1/job/:id/deployments`, newest first.
pub async fn of_job(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let namespace = namespace(&options);
    super::blocking_list(&handle, Table::Deployments, &options, |state| {
        state
            .job_deployments(&namespace, &id)
            .into_iter()
            .map(render::deployment)
            .collect()
    })
    .await
}

/// `GET /v1/job/:id/deployment`: the newest, or `null`.
pub async fn latest_of_job(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let index = block_on_table(&handle, Table::Deployments, &options).await?;
    let namespace = namespace(&options);
    let found = handle
        .read_state(|state| state.latest_deployment(&namespace, &id).map(render::deployment))
        .flatten()
        .unwrap_or(Value::Null);
    Ok((query_headers(&handle, index), axum::Json(found)))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct PauseBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
    pause: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct PromoteBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
    all: bool,
    groups: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct HealthBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
    #[serde(rename = "HealthyAllocationIDs")]
    healthy: Vec<String>,
    #[serde(rename = "UnhealthyAllocationIDs")]
    unhealthy: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct RevertBody {
    #[serde(rename = "JobID")]
    job_id: String,
    job_version: u64,
    enforce_prior_version: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct StableBody {
    #[serde(rename = "JobID")]
    job_id: String,
    job_version: u64,
    stable: bool,
}

/// The body's ID must be the path's, when given.
fn same_id(path: &str, body: &str, what: &str) -> Result<(), ApiError> {
    if body.is_empty() || body == path {
        Ok(())
    } else {
        Err(ApiError(StatusCode::BAD_REQUEST, format!("{what} ID does not match")))
    }
}

/// Which of Nomad's responses a deployment request is answered with.
#[derive(Clone, Copy)]
enum Answer {
    /// `DeploymentUpdateResponse`.
    Deployment,
    /// `JobRegisterResponse` (a revert).
    Job,
    /// `{"Index"}` (`Job.Stable`).
    Index,
}

/// Sends a deployment request and answers it in the shape `answer` names.
async fn update(
    handle: AgentHandle,
    request: DeploymentRequest,
    answer: Answer,
) -> Result<axum::response::Response, ApiError> {
    let (index, eval_id, job_modify_index) = match handle.request_applied(ServerRequest::Deployment(request)).await {
        ServerReply::JobRegistered {
            index,
            eval_id,
            job_modify_index,
        } => (index, eval_id, job_modify_index),
        ServerReply::Error(error) => return Err(error.into()),
        other => {
            return Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("unexpected reply {other:?}"),
            ));
        }
    };
    let body = match answer {
        Answer::Deployment => json!({
            "EvalID": eval_id,
            "EvalCreateIndex": index,
            "DeploymentModifyIndex": index,
            "Index": index,
        }),
        Answer::Job => json!({
            "EvalID": eval_id,
            "EvalCreateIndex": index,
            "JobModifyIndex": job_modify_index,
            "Warnings": "",
            "Index": index,
        }),
        Answer::Index => json!({ "Index": index }),
    };
    Ok((query_headers(&handle, index), axum::Json(body)).into_response())
}

/// `PUT /v1/deployment/fail/:id`.
pub async fn fail(State(handle): State<AgentHandle>, Path(id): Path<String>) -> Result<impl IntoResponse, ApiError> {
    update(
        handle,
        DeploymentRequest::Fail { deployment_id: id },
        Answer::Deployment,
    )
    .await
}

/// `PUT /v1/deployment/pause/:id` (`{"Pause": true|false}`).
pub async fn pause(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: PauseBody = parse_body_or_default(&body, "pause request")?;
    same_id(&id, &body.deployment_id, "Deployment")?;
    let request = DeploymentRequest::Pause {
        deployment_id: id,
        pause: body.pause,
    };
    update(handle, request, Answer::Deployment).await
}

/// `PUT /v1/deployment/promote/:id` (`{"All": true}` or `{"Groups": [...]}`).
pub async fn promote(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: PromoteBody = parse_body_or_default(&body, "promote request")?;
    same_id(&id, &body.deployment_id, "Deployment")?;
    if body.all && !body.groups.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "Can not specify both all and groups to promote".into(),
        ));
    }
    let groups = if body.all { Vec::new() } else { body.groups };
    let request = DeploymentRequest::Promote {
        deployment_id: id,
        groups,
    };
    update(handle, request, Answer::Deployment).await
}

/// `PUT /v1/deployment/allocation-health/:id`.
pub async fn allocation_health(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: HealthBody = parse_body_or_default(&body, "allocation health request")?;
    same_id(&id, &body.deployment_id, "Deployment")?;
    let request = DeploymentRequest::AllocHealth {
        deployment_id: id,
        healthy: body.healthy,
        unhealthy: body.unhealthy,
    };
    update(handle, request, Answer::Deployment).await
}

/// `PUT /v1/job/:id/revert` (`{"JobVersion": n, "EnforcePriorVersion": m}`).
pub async fn revert(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: RevertBody = parse_body_or_default(&body, "revert request")?;
    same_id(&id, &body.job_id, "Job")?;
    let request = DeploymentRequest::Revert {
        namespace: namespace(&options),
        job_id: id,
        version: body.job_version,
        enforce_prior_version: body.enforce_prior_version,
    };
    update(handle, request, Answer::Job).await
}

/// `PUT /v1/job/:id/stable` (`{"JobVersion": n, "Stable": bool}`), answered `{"Index"}`.
pub async fn stable(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    Query(options): Query<QueryOptions>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let body: StableBody = parse_body_or_default(&body, "stable request")?;
    same_id(&id, &body.job_id, "Job")?;
    let request = DeploymentRequest::Stable {
        namespace: namespace(&options),
        job_id: id,
        version: body.job_version,
        stable: body.stable,
    };
    update(handle, request, Answer::Index).await
}
