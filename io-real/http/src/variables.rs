//! `/v1/vars` and `/v1/var/:path`: Nomad Variables, with their check-and-set index (`?cas=`)
//! and their locks (`?lock-acquire`, `?lock-renew`, `?lock-release`).
//!
//! Values are sealed with the keyring before they reach Raft and opened only for the answer.
//! A lock's ID is shown only to whoever acquired it (the acquire's answer): reads and conflict
//! answers show that a variable is locked and for how long, never the ID that would let
//! another caller renew, write or release it.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use drover_core::fsm::variables::{DEFAULT_LOCK_DELAY_MS, DEFAULT_LOCK_TTL_MS};
use drover_core::fsm::{Command, Response as FsmResponse, Table, Variable, VariableLockCommand};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, QueryOptions, api, block_on_table, page, parse_body, query_headers, read_list, root_key_error};
use drover_io_real::driver::AgentHandle;

/// A variable as Nomad's API shows it. `lock_id` only for the holder's own answers.
fn variable_json(variable: &Variable, show_lock_id: bool) -> Value {
    let shown = api::Variable {
        namespace: "default".into(),
        path: variable.path.clone(),
        items: variable.items.0.clone(),
        create_index: variable.create_index,
        modify_index: variable.modify_index,
        create_time: unix_nanos(variable.create_time_unix_ms),
        modify_time: unix_nanos(variable.modify_time_unix_ms),
        lock: lock(variable, show_lock_id),
    };
    serde_json::to_value(shown).expect("a variable serializes")
}

/// A variable without its items, as the list shows it (a lock's ID never shown).
fn metadata(variable: &Variable) -> api::VariableMetadata {
    api::VariableMetadata {
        namespace: "default".into(),
        path: variable.path.clone(),
        create_index: variable.create_index,
        modify_index: variable.modify_index,
        create_time: unix_nanos(variable.create_time_unix_ms),
        modify_time: unix_nanos(variable.modify_time_unix_ms),
        lock: lock(variable, false),
    }
}

fn lock(variable: &Variable, show_lock_id: bool) -> Option<api::VariableLock> {
    variable.lock.as_ref().map(|lock| api::VariableLock {
        id: if show_lock_id { lock.id.clone() } else { String::new() },
        ttl: drover_core::goduration::format(Duration::from_millis(lock.ttl_ms)),
        lock_delay: drover_core::goduration::format(Duration::from_millis(lock.lock_delay_ms)),
    })
}

fn unix_nanos(ms: u64) -> i64 {
    i64::try_from(u128::from(ms) * 1_000_000).unwrap_or(i64::MAX)
}

fn validate_path(path: &str) -> Result<(), ApiError> {
    drover_core::fsm::validate_variable_path(path).map_err(|error| ApiError(StatusCode::BAD_REQUEST, error.to_string()))
}

pub(super) async fn list(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    let index = block_on_table(&handle, Table::Variables, &options).await?;
    let (list, next): (Vec<api::VariableMetadata>, Option<String>) = read_list(&handle, move |state| {
        let prefix = options.prefix.clone().unwrap_or_default();
        let matching = state
            .variables()
            .filter(|variable| variable.path.starts_with(&prefix))
            .map(|variable| (variable.path.clone(), variable));
        let (variables, next) = page::page(matching, &options);
        let list = variables.into_iter().map(metadata).collect::<Vec<_>>();
        (list, next)
    })
    .await
    .unwrap_or_default();
    let mut headers = query_headers(&handle, index);
    page::next_token_header(&mut headers, next);
    Ok((headers, axum::Json(list)))
}

pub(super) async fn get(
    State(handle): State<AgentHandle>,
    Path(path): Path<String>,
    Query(options): Query<QueryOptions>,
) -> Result<impl IntoResponse, ApiError> {
    validate_path(&path)?;
    let index = block_on_table(&handle, Table::Variables, &options).await?;
    let variable = handle.read_state(|state| state.variable(&path).cloned()).flatten();
    match variable {
        Some(mut variable) => {
            variable.items = handle.open_secrets(&variable.items).await.map_err(root_key_error)?;
            Ok((
                query_headers(&handle, index),
                axum::Json(variable_json(&variable, false)),
            ))
        }
        None => Err(ApiError(StatusCode::NOT_FOUND, "variable not found".into())),
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LockBody {
    #[serde(default, rename = "ID")]
    id: String,
    #[serde(default, rename = "TTL")]
    ttl: String,
    #[serde(default)]
    lock_delay: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VariableBody {
    #[serde(default)]
    items: BTreeMap<String, String>,
    #[serde(default)]
    lock: Option<LockBody>,
}

/// What a `PUT /v1/var/:path` asks.
#[derive(Debug, PartialEq, Eq)]
pub enum Put {
    /// A write of the items (by the lock's holder when `lock_id` is given).
    Write {
        items: BTreeMap<String, String>,
        lock_id: Option<String>,
    },
    Acquire {
        items: BTreeMap<String, String>,
        ttl_ms: u64,
        lock_delay_ms: u64,
    },
    Renew {
        lock_id: String,
    },
    Release {
        lock_id: String,
    },
}

/// The lock operation a write's query names (at most one).
#[derive(Default, Deserialize)]
pub struct WriteQuery {
    cas: Option<String>,
    #[serde(rename = "lock-acquire")]
    acquire: Option<String>,
    #[serde(rename = "lock-renew")]
    renew: Option<String>,
    #[serde(rename = "lock-release")]
    release: Option<String>,
}

impl WriteQuery {
    fn cas(&self) -> Result<Option<u64>, ApiError> {
        self.cas
            .as_deref()
            .map(|cas| {
                cas.parse::<u64>()
                    .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("failed to parse cas index {cas:?}")))
            })
            .transpose()
    }

    fn operation(&self) -> Result<Option<&'static str>, ApiError> {
        let named: Vec<&'static str> = [
            (self.acquire.is_some(), "lock-acquire"),
            (self.renew.is_some(), "lock-renew"),
            (self.release.is_some(), "lock-release"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect();
        match named.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one)),
            _ => Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("multiple lock operations: {}", named.join(", ")),
            )),
        }
    }
}

fn lock_duration(text: &str, default_ms: u64, what: &str) -> Result<u64, ApiError> {
    if text.is_empty() {
        return Ok(default_ms);
    }
    drover_core::goduration::parse(text)
        .map(|duration| duration.as_millis() as u64)
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("invalid lock {what} {text:?}")))
}

/// A `PUT /v1/var/:path` body (and its lock operation) into what it asks, checked.
pub fn decode_put(path: &str, operation: Option<&str>, body: &[u8]) -> Result<Put, ApiError> {
    validate_path(path)?;
    let body: VariableBody = parse_body(body, "variable body")?;
    drover_core::structs::check_secret_keys("variable items", body.items.keys())
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    let lock = body.lock.unwrap_or_default();
    let lock_id = || {
        if lock.id.is_empty() {
            Err(ApiError(StatusCode::BAD_REQUEST, "missing lock ID".into()))
        } else {
            Ok(lock.id.clone())
        }
    };
    match operation {
        None => {
            if body.items.is_empty() {
                return Err(ApiError(
                    StatusCode::BAD_REQUEST,
                    "variable must contain at least one item".into(),
                ));
            }
            Ok(Put::Write {
                lock_id: (!lock.id.is_empty()).then(|| lock.id.clone()),
                items: body.items,
            })
        }
        Some("lock-acquire") => Ok(Put::Acquire {
            ttl_ms: lock_duration(&lock.ttl, DEFAULT_LOCK_TTL_MS, "TTL")?,
            lock_delay_ms: lock_duration(&lock.lock_delay, DEFAULT_LOCK_DELAY_MS, "delay")?,
            items: body.items,
        }),
        Some("lock-renew") => Ok(Put::Renew { lock_id: lock_id()? }),
        Some(_) => Ok(Put::Release { lock_id: lock_id()? }),
    }
}

/// Nomad's answer to a write that met a conflict (a check-and-set index that did not hold, or
/// a lock the caller does not hold): 409 with the variable as it is (its values opened, its
/// lock's ID hidden), or an empty one of that path when there is none.
async fn conflict(
    handle: &AgentHandle,
    path: String,
    current: Option<Variable>,
    index: u64,
) -> Result<Response, ApiError> {
    let variable = match current {
        Some(mut variable) => {
            variable.items = handle.open_secrets(&variable.items).await.map_err(root_key_error)?;
            variable
        }
        None => Variable {
            path,
            items: Default::default(),
            create_index: 0,
            modify_index: 0,
            create_time_unix_ms: 0,
            modify_time_unix_ms: 0,
            lock: None,
            lock_free_unix_ms: 0,
        },
    };
    Ok((
        StatusCode::CONFLICT,
        query_headers(handle, index),
        axum::Json(variable_json(&variable, false)),
    )
        .into_response())
}

pub(super) async fn put(
    State(handle): State<AgentHandle>,
    Path(path): Path<String>,
    Query(query): Query<WriteQuery>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let cas = query.cas()?;
    let operation = query.operation()?;
    let put = decode_put(&path, operation, &body)?;
    if cas.is_some() && !matches!(put, Put::Write { .. }) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "cas cannot be combined with a lock operation".into(),
        ));
    }
    // Sealed before Raft: the log and the snapshots never hold the values.
    let seal = |items: BTreeMap<String, String>| {
        let handle = handle.clone();
        async move {
            let items: drover_core::structs::Secrets = items.into();
            let sealed = handle.seal_secrets(&items).await.map_err(root_key_error)?;
            Ok::<_, ApiError>((items, sealed))
        }
    };
    let mut opened = None;
    let mut show_lock_id = false;
    let command = match put {
        Put::Write { items, lock_id } => {
            let (items, sealed) = seal(items).await?;
            opened = Some(items);
            Command::VariableUpsert {
                path: path.clone(),
                items: sealed,
                cas,
                lock_id,
            }
        }
        Put::Acquire {
            items,
            ttl_ms,
            lock_delay_ms,
        } => {
            show_lock_id = true;
            let items = if items.is_empty() {
                None
            } else {
                let (items, sealed) = seal(items).await?;
                opened = Some(items);
                Some(sealed)
            };
            Command::VariableLock(VariableLockCommand::Acquire {
                path: path.clone(),
                items,
                lock_id: drover_io_real::runtime::random_uuid(),
                ttl_ms,
                lock_delay_ms,
            })
        }
        Put::Renew { lock_id } => {
            show_lock_id = true;
            Command::VariableLock(VariableLockCommand::Renew {
                path: path.clone(),
                lock_id,
            })
        }
        Put::Release { lock_id } => Command::VariableLock(VariableLockCommand::Release {
            path: path.clone(),
            lock_id,
        }),
    };
    let (index, response) = handle.apply(command).await?;
    match response {
        FsmResponse::Variable(mut variable) => {
            variable.items = match opened {
                Some(items) => items,
                None => handle.open_secrets(&variable.items).await.map_err(root_key_error)?,
            };
            Ok((
                query_headers(&handle, index),
                axum::Json(variable_json(&variable, show_lock_id)),
            )
                .into_response())
        }
        FsmResponse::VariableConflict(current) => conflict(&handle, path, current, index).await,
        FsmResponse::NotFound => Err(ApiError(StatusCode::NOT_FOUND, "variable not found".into())),
        other => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected result {other:?}"),
        )),
    }
}

pub(super) async fn delete(
    State(handle): State<AgentHandle>,
    Path(path): Path<String>,
    Query(query): Query<WriteQuery>,
) -> Result<Response, ApiError> {
    let cas = query.cas()?;
    if query.operation()?.is_some() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "lock operations are made with PUT".into(),
        ));
    }
    validate_path(&path)?;
    let command = Command::VariableDelete {
        path: path.clone(),
        cas,
        lock_id: None,
    };
    match handle.apply(command).await? {
        (index, FsmResponse::VariableConflict(current)) => conflict(&handle, path, current, index).await,
        (index, _) => Ok((query_headers(&handle, index), StatusCode::OK).into_response()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_paths_are_validated() {
        assert!(validate_path("nomad/jobs/a-b_c~d").is_ok());
        for bad in ["", "a/../b", "a//b", "/a", "a b", "a\u{7}", &"x".repeat(129)] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_put_names_what_it_asks() {
        let write = br#"{"Items":{"k":"v"},"Lock":{"ID":"l1"}}"#;
        assert_eq!(
            decode_put("a", None, write).unwrap(),
            Put::Write {
                items: [("k".to_string(), "v".to_string())].into(),
                lock_id: Some("l1".into())
            }
        );
        assert_eq!(
            decode_put("a", Some("lock-acquire"), br#"{"Lock":{"TTL":"20s","LockDelay":"1m"}}"#).unwrap(),
            Put::Acquire {
                items: BTreeMap::new(),
                ttl_ms: 20_000,
                lock_delay_ms: 60_000
            }
        );
        assert_eq!(
            decode_put("a", Some("lock-acquire"), b"{}").unwrap(),
            Put::Acquire {
                items: BTreeMap::new(),
                ttl_ms: DEFAULT_LOCK_TTL_MS,
                lock_delay_ms: DEFAULT_LOCK_DELAY_MS
            }
        );
        let refused = |operation, body: &[u8]| decode_put("a", operation, body).unwrap_err().1;
        assert_eq!(refused(Some("lock-renew"), b"{}"), "missing lock ID");
        assert_eq!(refused(Some("lock-release"), br#"{"Lock":{}}"#), "missing lock ID");
        assert_eq!(
            refused(Some("lock-acquire"), br#"{"Lock":{"TTL":"soon"}}"#),
            "invalid lock TTL \"soon\""
        );
        assert_eq!(refused(None, b"{}"), "variable must contain at least one item");
    }
}
