//! Nomad's blocking queries, in one place: a read waits until its table changed past the
//! request's `?index=` (at most `?wait=`), then answers with `X-Nomad-Index` and the leader
//! headers. [`blocking_one`], [`blocking_list`] and [`blocking_page`] are the whole shape
//! most reads take.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use drover_core::fsm::{ServerState, Table};
use serde::Serialize;
use serde_json::Value;

use super::{ApiError, QueryOptions, WAIT_DEFAULT, WAIT_MAX, parse_go_duration};
use drover_io_real::driver::AgentHandle;

/// One thing read from the state once `table` changed as the query asks: answered with the
/// query headers, or `404 missing` when `read` finds nothing (or this agent holds no state).
pub(crate) async fn blocking_one<T: Serialize>(
    handle: &AgentHandle,
    table: Table,
    options: &QueryOptions,
    missing: &'static str,
    read: impl FnOnce(&ServerState) -> Option<T>,
) -> Result<(HeaderMap, axum::Json<T>), ApiError> {
    let index = block_on_table(handle, table, options).await?;
    match handle.read_state(read).flatten() {
        Some(found) => Ok((query_headers(handle, index), axum::Json(found))),
        None => Err(ApiError(StatusCode::NOT_FOUND, missing.into())),
    }
}

/// A list read from the state once `table` changed as the query asks, with the query headers
/// (empty on an agent that holds no state).
pub(crate) async fn blocking_list<T: Serialize>(
    handle: &AgentHandle,
    table: Table,
    options: &QueryOptions,
    read: impl FnOnce(&ServerState) -> Vec<T>,
) -> Result<(HeaderMap, axum::Json<Vec<T>>), ApiError> {
    let index = block_on_table(handle, table, options).await?;
    let list = handle.read_state(read).unwrap_or_default();
    Ok((query_headers(handle, index), axum::Json(list)))
}

/// A page of a list once `table` changed as the query asks, read on the blocking pool from
/// the state version current then (a whole list takes as long as the state is big), answered
/// with the query headers and `X-Nomad-NextToken`.
pub(crate) async fn blocking_page(
    handle: &AgentHandle,
    table: Table,
    options: QueryOptions,
    read: impl FnOnce(&ServerState, &QueryOptions) -> Result<(Vec<Value>, Option<String>), ApiError> + Send + 'static,
) -> Result<(HeaderMap, axum::Json<Vec<Value>>), ApiError> {
    let index = block_on_table(handle, table, &options).await?;
    let (list, next) = super::read_list(handle, move |state| read(state, &options))
        .await
        .transpose()?
        .unwrap_or_default();
    let mut headers = query_headers(handle, index);
    super::page::next_token_header(&mut headers, next);
    Ok((headers, axum::Json(list)))
}

/// Waits until `table` changed after `index` (a blocking query), then returns its index.
pub(crate) async fn block_on_table(
    handle: &AgentHandle,
    table: Table,
    options: &QueryOptions,
) -> Result<u64, ApiError> {
    let current = || handle.read_state(|state| state.table_index(table)).unwrap_or(0);
    let Some(min_index) = options.index.filter(|index| *index > 0) else {
        return Ok(current());
    };
    let wait = match &options.wait {
        Some(text) => parse_go_duration(text)
            .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("Invalid wait time: {text:?}")))?,
        None => WAIT_DEFAULT,
    }
    .min(WAIT_MAX);
    let Some(changes) = handle.state_changes() else {
        return Ok(current());
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let seen = changes.count();
        let index = current();
        if index > min_index || !changes.changed_since(seen, deadline).await {
            return Ok(current());
        }
    }
}

pub(crate) fn query_headers(handle: &AgentHandle, index: u64) -> HeaderMap {
    let (known_leader, last_contact_ms) = handle.leader_contact();
    let mut headers = HeaderMap::new();
    headers.insert("X-Nomad-Index", HeaderValue::from(index.max(1)));
    headers.insert(
        "X-Nomad-KnownLeader",
        HeaderValue::from_static(if known_leader { "true" } else { "false" }),
    );
    headers.insert("X-Nomad-LastContact", HeaderValue::from(last_contact_ms));
    headers
}
