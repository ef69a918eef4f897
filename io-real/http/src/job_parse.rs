//! `/v1/jobs/parse` and `/v1/validate/job`: a jobspec turned into Nomad's JSON through the same
//! parser as `agent job run`, and a job checked as a register would check it, nothing stored.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, parse_body, parse_job_body};
use drover_io_real::driver::AgentHandle;
use drover_io_real::jobs::ApiJob;

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ParseBody {
    #[serde(rename = "JobHCL")]
    job_hcl: String,
    canonicalize: bool,
}

/// `POST /v1/jobs/parse` `{"JobHCL": "...", "Canonicalize": true}`: the job as Nomad's API
/// writes it; canonicalized, with every default filled in as registering would.
pub async fn parse_job(body: axum::body::Bytes) -> Result<axum::Json<Value>, ApiError> {
    let body: ParseBody = parse_body(&body, "parse request")?;
    if body.job_hcl.trim().is_empty() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job spec is empty".into()));
    }
    let source = body.job_hcl;
    let api = super::hcl_guard::parse("job spec", move || drover_io_real::jobspec::parse(&source))
        .await?
        .map_err(|problems| ApiError(StatusCode::BAD_REQUEST, problems.join("\n")))?;
    if !body.canonicalize {
        return Ok(axum::Json(serde_json::to_value(&api).expect("serializes")));
    }
    let job = api
        .to_job()
        .map_err(|problems| ApiError(StatusCode::BAD_REQUEST, drover_core::jobspec::format_errors(&problems)))?;
    Ok(axum::Json(
        serde_json::to_value(ApiJob::from_job(&job, "pending")).expect("serializes"),
    ))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct ValidateBody {
    job: Option<ApiJob>,
}

/// `PUT /v1/validate/job` `{"Job": {...}}`: the register's checks, answered with Nomad's
/// `JobValidateResponse` (errors listed, and joined as its multierror text).
pub async fn validate_job(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<axum::Json<crate::api::JobValidateResponse>, ApiError> {
    let (body, mut problems): (ValidateBody, _) = parse_job_body(&body, "job")?;
    let Some(api) = body.job else {
        return Err(ApiError(StatusCode::BAD_REQUEST, "Job must be specified".into()));
    };
    // What the register's admission would say, under this agent's job limits.
    problems.extend(match api.to_job() {
        Ok(mut job) => drover_core::jobspec::admit(&mut job, &handle.config().server.job_limits),
        Err(problems) => problems,
    });
    let error = if problems.is_empty() {
        String::new()
    } else {
        drover_core::jobspec::format_errors(&problems)
    };
    Ok(axum::Json(crate::api::JobValidateResponse {
        driver_config_validated: true,
        validation_errors: problems,
        error,
        warnings: String::new(),
    }))
}
