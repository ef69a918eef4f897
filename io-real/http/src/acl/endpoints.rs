//! `/v1/acl/*`: the one-time bootstrap, policies and tokens, in Nomad's shapes. Writes are
//! ACL commands through Raft (`fsm/acl.rs`); a token's IDs are drawn here from the runtime's
//! generator (`runtime::random_uuid`: the operating system's randomness in production), never
//! from the core's seeded ones.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use drover_core::acl::{AclPolicy, AclToken, TokenType};
use drover_core::fsm::acl::AclCommand;
use drover_core::fsm::{Command, Response as FsmResponse, ServerState, Table};
use drover_core::rpc::RpcError;
use serde::Deserialize;
use serde_json::Value;

use super::gate::token_of;
use crate::{ApiError, api, query_headers, rfc3339};
use drover_io_real::driver::AgentHandle;

/// Nomad's reset file: holding the index of the last bootstrap lets it be done again.
pub const BOOTSTRAP_RESET_FILE: &str = "acl-bootstrap-reset";

pub(super) fn enabled(handle: &AgentHandle) -> Result<(), ApiError> {
    if handle.config().acl.enabled {
        Ok(())
    } else {
        Err(ApiError(StatusCode::BAD_REQUEST, "ACL support disabled".into()))
    }
}

pub(super) fn read<R>(handle: &AgentHandle, read: impl FnOnce(&ServerState) -> R) -> Result<R, ApiError> {
    handle
        .read_state(read)
        .ok_or_else(|| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "this agent is not a server".into()))
}

/// Proposes an ACL command; the state machine's refusal becomes the HTTP error by its kind.
pub(super) async fn apply(handle: &AgentHandle, command: AclCommand) -> Result<u64, ApiError> {
    let (index, response) = handle.apply(Command::Acl(command)).await?;
    match response {
        FsmResponse::Error(kind, text) => Err(RpcError::new(kind, text, false).into()),
        _ => Ok(index),
    }
}

/// A token as Nomad shows it; its role links carry the roles' current names.
pub(super) fn token_json(state: &ServerState, token: &AclToken, with_secret: bool) -> Value {
    let shown = api::AclToken {
        accessor_id: token.accessor_id.clone(),
        secret_id: with_secret.then(|| token.secret_id.clone()),
        name: token.name.clone(),
        token_type: token.token_type.as_str().into(),
        policies: token.policies.clone(),
        roles: token
            .roles
            .iter()
            .map(|id| api::AclTokenRoleLink {
                id: id.clone(),
                name: state.acl().role(id).map(|role| role.name.clone()).unwrap_or_default(),
            })
            .collect(),
        global: token.global,
        create_time: rfc3339(token.create_time_ms),
        expiration_time: token.expiration_time_ms.map(rfc3339),
        create_index: token.create_index,
        modify_index: token.modify_index,
    };
    serde_json::to_value(shown).expect("a token serializes")
}

fn policy_json(policy: &AclPolicy, with_rules: bool) -> Value {
    let shown = api::AclPolicy {
        name: policy.name.clone(),
        description: policy.description.clone(),
        rules: with_rules.then(|| policy.rules.clone()),
        create_index: policy.create_index,
        modify_index: policy.modify_index,
    };
    serde_json::to_value(shown).expect("a policy serializes")
}

pub(crate) async fn bootstrap(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let reset_index = match &handle.config().data_dir {
        Some(dir) => match std::fs::read_to_string(std::path::Path::new(dir).join(BOOTSTRAP_RESET_FILE)) {
            Ok(text) => text.trim().parse::<u64>().map_err(|_| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("invalid reset index in {BOOTSTRAP_RESET_FILE}: {:?}", text.trim()),
                )
            })?,
            Err(_) => 0,
        },
        None => 0,
    };
    let token = AclToken {
        accessor_id: drover_io_real::runtime::random_uuid(),
        secret_id: drover_io_real::runtime::random_uuid(),
        name: "Bootstrap Token".into(),
        token_type: TokenType::Management,
        policies: Vec::new(),
        roles: Vec::new(),
        global: true,
        create_time_ms: drover_io_real::clock::unix_millis(),
        expiration_time_ms: None,
        create_index: 0,
        modify_index: 0,
    };
    let accessor = token.accessor_id.clone();
    let index = apply(&handle, AclCommand::Bootstrap { token, reset_index }).await?;
    stored_token(&handle, &accessor, index, true)
}

pub(super) fn stored_token(
    handle: &AgentHandle,
    accessor: &str,
    index: u64,
    with_secret: bool,
) -> Result<(HeaderMap, axum::Json<Value>), ApiError> {
    let token = read(handle, |state| {
        state
            .acl()
            .token(accessor)
            .map(|token| token_json(state, token, with_secret))
    })?
    .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "ACL token not found".into()))?;
    Ok((query_headers(handle, index), axum::Json(token)))
}

/// The token of the request, if any (`None`: no token or an unknown one).
pub(super) fn requester(state: &ServerState, headers: &HeaderMap) -> Option<AclToken> {
    let secret = token_of(headers);
    state.acl().token_by_secret(&secret).cloned()
}

pub(crate) async fn list_policies(
    State(handle): State<AgentHandle>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, policies) = read(&handle, |state| {
        let token = requester(state, &headers);
        let management = token
            .as_ref()
            .is_some_and(|token| token.token_type == TokenType::Management);
        let held: Vec<String> = token.map_or_else(
            || vec![drover_core::acl::ANONYMOUS_POLICY.to_string()],
            |token| state.acl().token_policy_names(&token),
        );
        let policies: Vec<Value> = state
            .acl()
            .policies()
            .filter(|policy| management || held.contains(&policy.name))
            .map(|policy| policy_json(policy, false))
            .collect();
        (state.table_index(Table::AclPolicies), policies)
    })?;
    Ok((query_headers(&handle, index), axum::Json(policies)))
}

pub(crate) async fn get_policy(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, found) = read(&handle, |state| {
        let token = requester(state, &headers);
        let allowed = token.as_ref().is_some_and(|token| {
            token.token_type == TokenType::Management || state.acl().token_policy_names(token).contains(&name)
        });
        let found = state
            .acl()
            .policy(&name)
            .map(|policy| (allowed, policy_json(policy, true)));
        (state.table_index(Table::AclPolicies), found)
    })?;
    match found {
        Some((true, policy)) => Ok((query_headers(&handle, index), axum::Json(policy))),
        Some((false, _)) => Err(ApiError(
            StatusCode::FORBIDDEN,
            drover_core::acl::PERMISSION_DENIED.into(),
        )),
        None => Err(ApiError(StatusCode::NOT_FOUND, "ACL policy not found".into())),
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct PolicyBody {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Description")]
    description: String,
    #[serde(rename = "Rules")]
    rules: String,
}

pub(crate) async fn put_policy(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: PolicyBody = serde_json::from_slice(&body)
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, format!("failed to parse the policy: {error}")))?;
    if !body.name.is_empty() && body.name != name {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "Policy name does not match request path".into(),
        ));
    }
    drover_core::acl::validate_policy_name(&name).map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    let rules = body.rules.clone();
    let parsed = crate::hcl_guard::parse("policy", move || drover_host::acl_policy::parse(&rules))
        .await?
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    let policy = AclPolicy {
        name,
        description: body.description,
        rules: body.rules,
        parsed,
        create_index: 0,
        modify_index: 0,
    };
    let index = apply(&handle, AclCommand::PoliciesUpsert { policies: vec![policy] }).await?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

pub(crate) async fn delete_policy(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let index = apply(&handle, AclCommand::PoliciesDelete { names: vec![name] }).await?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub(crate) struct TokenListQuery {
    prefix: String,
    global: Option<String>,
}

/// Every token (`?prefix=` on the accessor, `?global=true` only global ones), without secrets.
pub(crate) async fn list_tokens(
    State(handle): State<AgentHandle>,
    axum::extract::Query(query): axum::extract::Query<TokenListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let global_only = match query.global.as_deref() {
        None | Some("") => false,
        Some(text) => crate::parse_bool(text)
            .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("invalid global value {text:?}")))?,
    };
    let (index, tokens) = read(&handle, |state| {
        let tokens: Vec<Value> = state
            .acl()
            .tokens()
            .filter(|token| token.accessor_id.starts_with(&query.prefix) && (!global_only || token.global))
            .map(|token| token_json(state, token, false))
            .collect();
        (state.table_index(Table::AclTokens), tokens)
    })?;
    Ok((query_headers(&handle, index), axum::Json(tokens)))
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct TokenBody {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Type")]
    token_type: String,
    #[serde(rename = "Policies")]
    policies: Option<Vec<String>>,
    #[serde(rename = "Roles")]
    roles: Option<Vec<RoleLink>>,
    #[serde(rename = "Global")]
    global: bool,
    #[serde(rename = "ExpirationTTL")]
    expiration_ttl: Option<String>,
}

/// A token's link to a role, by ID or by name (Nomad's `ACLTokenRoleLink`).
#[derive(Default, Deserialize)]
#[serde(default)]
struct RoleLink {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name")]
    name: String,
}

impl TokenBody {
    /// The role IDs the links name, each found (by ID, else by name), deduplicated.
    fn role_ids(&self, handle: &AgentHandle) -> Result<Vec<String>, ApiError> {
        let links = self.roles.as_deref().unwrap_or_default();
        let found = read(handle, |state| {
            let mut ids: Vec<String> = Vec::new();
            for link in links {
                let role = if link.id.is_empty() {
                    state.acl().role_by_name(&link.name)
                } else {
                    state.acl().role(&link.id)
                };
                let named = if link.id.is_empty() { &link.name } else { &link.id };
                let role = role.ok_or_else(|| format!("cannot find role {named}"))?;
                if !ids.contains(&role.id) {
                    ids.push(role.id.clone());
                }
            }
            Ok::<_, String>(ids)
        })?;
        found.map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))
    }

    fn parse(bytes: &[u8]) -> Result<TokenBody, ApiError> {
        serde_json::from_slice(bytes)
            .map_err(|error| ApiError(StatusCode::BAD_REQUEST, format!("failed to parse the token: {error}")))
    }

    fn token_type(&self) -> Result<TokenType, ApiError> {
        match self.token_type.as_str() {
            "" | "client" => Ok(TokenType::Client),
            "management" => Ok(TokenType::Management),
            other => Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("token type must be client or management, not {other:?}"),
            )),
        }
    }
}

pub(crate) async fn create_token(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body = TokenBody::parse(&body)?;
    let now = drover_io_real::clock::unix_millis();
    let expiration_time_ms = match &body.expiration_ttl {
        Some(ttl) if !ttl.is_empty() => {
            let ttl = drover_core::goduration::parse(ttl).map_err(|error| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("invalid ExpirationTTL {ttl:?}: {error}"),
                )
            })?;
            let acl = handle.config().acl;
            let shown = drover_core::client::restarts::go_duration;
            if ttl > acl.token_max_expiration_ttl {
                return Err(ApiError(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "expiration time cannot be more than {} in the future (was {})",
                        shown(acl.token_max_expiration_ttl),
                        shown(ttl)
                    ),
                ));
            }
            if ttl < acl.token_min_expiration_ttl {
                return Err(ApiError(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "expiration time cannot be less than {} in the future (was {})",
                        shown(acl.token_min_expiration_ttl),
                        shown(ttl)
                    ),
                ));
            }
            Some(now + ttl.as_millis() as u64)
        }
        _ => None,
    };
    let token = AclToken {
        accessor_id: drover_io_real::runtime::random_uuid(),
        secret_id: drover_io_real::runtime::random_uuid(),
        name: body.name.clone(),
        token_type: body.token_type()?,
        policies: body.policies.clone().unwrap_or_default(),
        roles: body.role_ids(&handle)?,
        global: body.global,
        create_time_ms: now,
        expiration_time_ms,
        create_index: 0,
        modify_index: 0,
    };
    token
        .validate()
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    let accessor = token.accessor_id.clone();
    let index = apply(&handle, AclCommand::TokensUpsert { tokens: vec![token] }).await?;
    stored_token(&handle, &accessor, index, true)
}

pub(crate) async fn update_token(
    State(handle): State<AgentHandle>,
    Path(accessor): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body = TokenBody::parse(&body)?;
    let mut token = read(&handle, |state| state.acl().token(&accessor).cloned())?
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "ACL token not found".into()))?;
    token.name = body.name.clone();
    token.token_type = body.token_type()?;
    token.policies = body.policies.clone().unwrap_or_default();
    token.roles = body.role_ids(&handle)?;
    token
        .validate()
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, error))?;
    let index = apply(&handle, AclCommand::TokensUpsert { tokens: vec![token] }).await?;
    stored_token(&handle, &accessor, index, true)
}

/// A token by accessor: to a management token, or to the token itself (Nomad's `GetToken`).
pub(crate) async fn get_token(
    State(handle): State<AgentHandle>,
    Path(accessor): Path<String>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, allowed) = read(&handle, |state| {
        let allowed = requester(state, &headers)
            .is_some_and(|token| token.token_type == TokenType::Management || token.accessor_id == accessor);
        (state.table_index(Table::AclTokens), allowed)
    })?;
    if !allowed {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            drover_core::acl::PERMISSION_DENIED.into(),
        ));
    }
    stored_token(&handle, &accessor, index, true)
}

pub(crate) async fn token_self(
    State(handle): State<AgentHandle>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, token) = read(&handle, |state| {
        let token = requester(state, &headers).map(|token| token_json(state, &token, true));
        (state.table_index(Table::AclTokens), token)
    })?;
    let token = token.ok_or_else(|| ApiError(StatusCode::FORBIDDEN, drover_core::acl::TOKEN_NOT_FOUND.into()))?;
    Ok((query_headers(&handle, index), axum::Json(token)))
}

pub(crate) async fn delete_token(
    State(handle): State<AgentHandle>,
    Path(accessor): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let index = apply(
        &handle,
        AclCommand::TokensDelete {
            accessor_ids: vec![accessor],
        },
    )
    .await?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::assert_round_trips;

    #[test]
    fn tokens_and_policies_render_as_the_shared_api_types() {
        let state = ServerState::default();
        let token = AclToken {
            accessor_id: "a".into(),
            secret_id: "s".into(),
            name: "ci".into(),
            token_type: TokenType::Client,
            policies: vec!["readonly".into()],
            roles: vec!["r1".into()],
            global: false,
            create_time_ms: 1_790_000_000_000,
            expiration_time_ms: Some(1_800_000_000_000),
            create_index: 3,
            modify_index: 4,
        };
        assert_round_trips::<api::AclToken>(token_json(&state, &token, true));
        assert_round_trips::<api::AclToken>(token_json(&state, &token, false));
        let policy = AclPolicy {
            name: "readonly".into(),
            description: "reads".into(),
            rules: "namespace \"default\" { policy = \"read\" }".into(),
            parsed: Default::default(),
            create_index: 5,
            modify_index: 6,
        };
        assert_round_trips::<api::AclPolicy>(policy_json(&policy, true));
        assert_round_trips::<api::AclPolicy>(policy_json(&policy, false));
    }
}
