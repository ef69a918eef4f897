//! `/v1/acl/role(s)` and `/v1/acl/token/onetime(/exchange)`, in Nomad's shapes. The checks
//! that need the state (unique names, existing policies, an unspent one-time token) are the
//! state machine's (`fsm/acl/roles.rs`); this side draws IDs and shapes the JSON.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use drover_core::acl::roles::ONE_TIME_TOKEN_TTL_MS;
use drover_core::acl::{AclRole, OneTimeToken, PERMISSION_DENIED, TokenType};
use drover_core::fsm::acl::AclCommand;
use drover_core::fsm::{ServerState, Table};
use serde::Deserialize;
use serde_json::{Value, json};

use super::endpoints::{apply, enabled, read, requester, token_json};
use crate::{ApiError, api, query_headers, rfc3339};
use drover_io_real::driver::AgentHandle;

fn bad(text: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, text.into())
}

fn denied() -> ApiError {
    ApiError(StatusCode::FORBIDDEN, PERMISSION_DENIED.into())
}

fn role_json(role: &AclRole) -> Value {
    let shown = api::AclRole {
        id: role.id.clone(),
        name: role.name.clone(),
        description: role.description.clone(),
        policies: role
            .policies
            .iter()
            .map(|name| api::AclRolePolicyLink { name: name.clone() })
            .collect(),
        create_index: role.create_index,
        modify_index: role.modify_index,
    };
    serde_json::to_value(shown).expect("a role serializes")
}

/// Whether the request's token may read `role`: a management token, or one linking it.
fn may_read(state: &ServerState, headers: &HeaderMap, role: &AclRole) -> bool {
    requester(state, headers)
        .is_some_and(|token| token.token_type == TokenType::Management || token.roles.contains(&role.id))
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct ListQuery {
    prefix: String,
}

pub(crate) async fn list_roles(
    State(handle): State<AgentHandle>,
    Query(query): Query<ListQuery>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, roles) = read(&handle, |state| {
        let roles: Vec<Value> = state
            .acl()
            .roles()
            .filter(|role| role.name.starts_with(&query.prefix) && may_read(state, &headers, role))
            .map(role_json)
            .collect();
        (state.table_index(Table::AclRoles), roles)
    })?;
    Ok((query_headers(&handle, index), axum::Json(roles)))
}

fn found_role(
    handle: &AgentHandle,
    headers: &HeaderMap,
    find: impl FnOnce(&ServerState) -> Option<&AclRole>,
) -> Result<(HeaderMap, axum::Json<Value>), ApiError> {
    let found = read(handle, |state| {
        find(state).map(|role| (may_read(state, headers, role), role.modify_index, role_json(role)))
    })?;
    match found {
        Some((true, index, role)) => Ok((query_headers(handle, index), axum::Json(role))),
        Some((false, ..)) => Err(denied()),
        None => Err(ApiError(StatusCode::NOT_FOUND, "ACL role not found".into())),
    }
}

pub(crate) async fn get_role(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    found_role(&handle, &headers, |state| state.acl().role(&id))
}

pub(crate) async fn get_role_by_name(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    found_role(&handle, &headers, |state| state.acl().role_by_name(&name))
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RoleBody {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Description")]
    description: String,
    #[serde(rename = "Policies")]
    policies: Vec<PolicyLink>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct PolicyLink {
    #[serde(rename = "Name")]
    name: String,
}

impl RoleBody {
    fn parse(bytes: &[u8]) -> Result<RoleBody, ApiError> {
        serde_json::from_slice(bytes).map_err(|error| bad(format!("failed to parse the ACL role: {error}")))
    }

    fn into_role(self, id: String) -> Result<AclRole, ApiError> {
        let role = AclRole {
            id,
            name: self.name,
            description: self.description,
            policies: self.policies.into_iter().map(|link| link.name).collect(),
            create_index: 0,
            modify_index: 0,
        };
        role.validate()
            .map_err(|error| bad(format!("role 0 invalid: {error}")))?;
        Ok(role.deduplicated())
    }
}

/// Writes `role` and answers it as stored.
async fn upsert(handle: &AgentHandle, role: AclRole) -> Result<(HeaderMap, axum::Json<Value>), ApiError> {
    let id = role.id.clone();
    let index = apply(handle, AclCommand::RolesUpsert { roles: vec![role] }).await?;
    let role = read(handle, |state| state.acl().role(&id).map(role_json))?.ok_or_else(|| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ACL role lookup failed: no entry found".into(),
        )
    })?;
    Ok((query_headers(handle, index), axum::Json(role)))
}

pub(crate) async fn create_role(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body = RoleBody::parse(&body)?;
    if !body.id.is_empty() {
        return Err(bad("ACL role ID must not be set when creating a role"));
    }
    let role = body.into_role(drover_io_real::runtime::random_uuid())?;
    upsert(&handle, role).await
}

pub(crate) async fn update_role(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body = RoleBody::parse(&body)?;
    if !body.id.is_empty() && body.id != id {
        return Err(bad("ACL role ID in URL does not match ID in request body"));
    }
    if read(&handle, |state| state.acl().role(&id).is_none())? {
        return Err(bad(format!("cannot find role {id}")));
    }
    let role = body.into_role(id)?;
    upsert(&handle, role).await
}

pub(crate) async fn delete_role(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let index = apply(&handle, AclCommand::RolesDelete { ids: vec![id] }).await?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

fn one_time_json(token: &OneTimeToken) -> Value {
    json!({
        "OneTimeSecretID": token.one_time_secret_id,
        "AccessorID": token.accessor_id,
        "ExpiresAt": rfc3339(token.expires_at_ms),
        "CreateIndex": token.create_index,
        "ModifyIndex": token.modify_index,
    })
}

/// A one-time token for the request's own ACL token (no capability needed: only your own).
pub(crate) async fn one_time(
    State(handle): State<AgentHandle>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let token = read(&handle, |state| requester(state, &headers))?.ok_or_else(denied)?;
    let secret = drover_io_real::runtime::random_uuid();
    let command = AclCommand::OneTimeUpsert {
        token: OneTimeToken {
            one_time_secret_id: secret.clone(),
            accessor_id: token.accessor_id,
            expires_at_ms: drover_io_real::clock::unix_millis() + ONE_TIME_TOKEN_TTL_MS,
            create_index: 0,
            modify_index: 0,
        },
    };
    let index = apply(&handle, command).await?;
    let stored = read(&handle, |state| state.acl().one_time_token(&secret).map(one_time_json))?.ok_or_else(denied)?;
    Ok((
        query_headers(&handle, index),
        axum::Json(json!({ "OneTimeToken": stored })),
    ))
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ExchangeBody {
    #[serde(rename = "OneTimeSecretID")]
    one_time_secret_id: String,
}

pub(crate) async fn exchange(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: ExchangeBody =
        serde_json::from_slice(&body).map_err(|error| bad(format!("failed to parse the exchange request: {error}")))?;
    let secret = body.one_time_secret_id;
    let accessor = read(&handle, |state| {
        state.acl().one_time_token(&secret).map(|held| held.accessor_id.clone())
    })?
    .ok_or_else(denied)?;
    let index = apply(
        &handle,
        AclCommand::OneTimeExchange {
            secret: drover_core::structs::SecretText(secret),
        },
    )
    .await?;
    let token = read(&handle, |state| {
        state.acl().token(&accessor).map(|token| token_json(state, token, true))
    })?
    .ok_or_else(denied)?;
    Ok((query_headers(&handle, index), axum::Json(json!({ "Token": token }))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::assert_round_trips;

    #[test]
    fn roles_render_as_the_shared_api_type() {
        let role = AclRole {
            id: "r1".into(),
            name: "ops".into(),
            description: String::new(),
            policies: vec!["readonly".into()],
            create_index: 7,
            modify_index: 8,
        };
        assert_round_trips::<api::AclRole>(role_json(&role));
    }
}
