//! Single sign-on in the HTTP API, in Nomad's shapes: `/v1/acl/auth-method(s)`,
//! `/v1/acl/binding-rule(s)`, `/v1/acl/login` (a JWT auth method) and
//! `/v1/acl/oidc/{auth-url,complete-auth}` (an OIDC auth method, `oidc.rs`). A login's claims
//! are verified here (`idp.rs`); what they grant is the core's decision
//! (`drover_core::acl::auth`), and the token it makes goes through Raft like any other.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use drover_core::acl::auth::{self, AuthMethod, AuthMethodConfig, AuthMethodType, BindType, BindingRule, Claims};
use drover_core::acl::{AclToken, TokenType};
use drover_core::client::restarts::go_duration;
use drover_core::fsm::acl::AclCommand;
use drover_core::fsm::{ServerState, Table};
use serde::Deserialize;
use serde_json::Value;

use super::endpoints::{apply, enabled, read, stored_token};
use super::idp;
use crate::{ApiError, api, query_headers, rfc3339};
use drover_io_real::driver::AgentHandle;

pub(super) fn bad(text: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, text.into())
}

fn duration_text(ms: u64) -> String {
    if ms == 0 {
        String::new()
    } else {
        go_duration(Duration::from_millis(ms))
    }
}

/// A duration as Nomad's JSON carries it: Go's text, or nanoseconds.
fn duration_ms(value: &Value, field: &str) -> Result<u64, ApiError> {
    match value {
        Value::Null => Ok(0),
        Value::String(text) if text.is_empty() => Ok(0),
        Value::String(text) => drover_core::goduration::parse(text)
            .map(|duration| duration.as_millis() as u64)
            .map_err(|error| bad(format!("invalid {field} {text:?}: {error}"))),
        Value::Number(number) => number
            .as_u64()
            .map(|nanos| nanos / 1_000_000)
            .ok_or_else(|| bad(format!("invalid {field} {number}"))),
        other => Err(bad(format!("invalid {field} {other}"))),
    }
}

fn method_json(method: &AuthMethod) -> Value {
    let config = &method.config;
    let shown = api::AuthMethod {
        name: method.name.clone(),
        method_type: method.method_type.as_str().into(),
        token_locality: method.token_locality.clone(),
        token_name_format: method.token_name_format.clone(),
        max_token_ttl: duration_text(method.max_token_ttl_ms),
        default: method.default,
        config: api::AuthMethodConfig {
            jwt_validation_pub_keys: config.jwt_validation_pub_keys.clone(),
            jwks_url: config.jwks_url.clone(),
            jwks_ca_cert: config.jwks_ca_cert.clone(),
            oidc_discovery_url: config.oidc_discovery_url.clone(),
            oidc_client_id: config.oidc_client_id.clone(),
            oidc_client_secret: config.oidc_client_secret.clone(),
            oidc_enable_pkce: config.oidc_enable_pkce,
            oidc_disable_userinfo: config.oidc_disable_userinfo,
            oidc_scopes: config.oidc_scopes.clone(),
            bound_audiences: config.bound_audiences.clone(),
            bound_issuer: config.bound_issuer.clone(),
            allowed_redirect_uris: config.allowed_redirect_uris.clone(),
            discovery_ca_pem: config.discovery_ca_pem.clone(),
            signing_algs: config.signing_algs.clone(),
            expiration_leeway: duration_text(config.expiration_leeway_ms),
            not_before_leeway: duration_text(config.not_before_leeway_ms),
            clock_skew_leeway: duration_text(config.clock_skew_leeway_ms),
            claim_mappings: config.claim_mappings.clone(),
            list_claim_mappings: config.list_claim_mappings.clone(),
            verbose_logging: config.verbose_logging,
        },
        create_time: rfc3339(method.create_time_ms),
        modify_time: rfc3339(method.modify_time_ms),
        create_index: method.create_index,
        modify_index: method.modify_index,
    };
    serde_json::to_value(shown).expect("an auth method serializes")
}

fn method_stub(method: &AuthMethod) -> Value {
    let stub = api::AuthMethodListStub {
        name: method.name.clone(),
        method_type: method.method_type.as_str().into(),
        default: method.default,
        create_index: method.create_index,
        modify_index: method.modify_index,
    };
    serde_json::to_value(stub).expect("an auth method stub serializes")
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct MethodBody {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Type")]
    method_type: String,
    #[serde(rename = "TokenLocality")]
    token_locality: String,
    #[serde(rename = "TokenNameFormat")]
    token_name_format: String,
    #[serde(rename = "MaxTokenTTL")]
    max_token_ttl: Value,
    #[serde(rename = "Default")]
    default: bool,
    #[serde(rename = "Config")]
    config: Option<ConfigBody>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ConfigBody {
    #[serde(rename = "JWTValidationPubKeys")]
    jwt_validation_pub_keys: Vec<String>,
    #[serde(rename = "JWKSURL")]
    jwks_url: String,
    #[serde(rename = "JWKSCACert")]
    jwks_ca_cert: String,
    #[serde(rename = "OIDCDiscoveryURL")]
    oidc_discovery_url: String,
    #[serde(rename = "OIDCClientID")]
    oidc_client_id: String,
    #[serde(rename = "OIDCClientSecret")]
    oidc_client_secret: String,
    #[serde(rename = "OIDCEnablePKCE")]
    oidc_enable_pkce: bool,
    #[serde(rename = "OIDCDisableUserInfo")]
    oidc_disable_userinfo: bool,
    #[serde(rename = "OIDCScopes")]
    oidc_scopes: Vec<String>,
    #[serde(rename = "BoundAudiences")]
    bound_audiences: Vec<String>,
    #[serde(rename = "BoundIssuer")]
    bound_issuer: Vec<String>,
    #[serde(rename = "AllowedRedirectURIs")]
    allowed_redirect_uris: Vec<String>,
    #[serde(rename = "DiscoveryCaPem")]
    discovery_ca_pem: Vec<String>,
    #[serde(rename = "SigningAlgs")]
    signing_algs: Vec<String>,
    #[serde(rename = "ExpirationLeeway")]
    expiration_leeway: Value,
    #[serde(rename = "NotBeforeLeeway")]
    not_before_leeway: Value,
    #[serde(rename = "ClockSkewLeeway")]
    clock_skew_leeway: Value,
    #[serde(rename = "ClaimMappings")]
    claim_mappings: Option<BTreeMap<String, String>>,
    #[serde(rename = "ListClaimMappings")]
    list_claim_mappings: Option<BTreeMap<String, String>>,
    #[serde(rename = "VerboseLogging")]
    verbose_logging: bool,
}

impl ConfigBody {
    fn into_config(self) -> Result<AuthMethodConfig, ApiError> {
        Ok(AuthMethodConfig {
            expiration_leeway_ms: duration_ms(&self.expiration_leeway, "ExpirationLeeway")?,
            not_before_leeway_ms: duration_ms(&self.not_before_leeway, "NotBeforeLeeway")?,
            clock_skew_leeway_ms: duration_ms(&self.clock_skew_leeway, "ClockSkewLeeway")?,
            jwt_validation_pub_keys: self.jwt_validation_pub_keys,
            jwks_url: self.jwks_url,
            jwks_ca_cert: self.jwks_ca_cert,
            oidc_discovery_url: self.oidc_discovery_url,
            oidc_client_id: self.oidc_client_id,
            oidc_client_secret: self.oidc_client_secret,
            oidc_enable_pkce: self.oidc_enable_pkce,
            oidc_disable_userinfo: self.oidc_disable_userinfo,
            oidc_scopes: self.oidc_scopes,
            bound_audiences: self.bound_audiences,
            bound_issuer: self.bound_issuer,
            allowed_redirect_uris: self.allowed_redirect_uris,
            discovery_ca_pem: self.discovery_ca_pem,
            signing_algs: self.signing_algs,
            claim_mappings: self.claim_mappings.unwrap_or_default(),
            list_claim_mappings: self.list_claim_mappings.unwrap_or_default(),
            verbose_logging: self.verbose_logging,
        })
    }
}

/// `body` as the method to store: merged over `held` (Nomad's update keeps what is left out),
/// then checked against the cluster's token TTL bounds.
fn method_from(handle: &AgentHandle, body: MethodBody, held: Option<&AuthMethod>) -> Result<AuthMethod, ApiError> {
    let method_type = match (body.method_type.as_str(), held) {
        ("", Some(held)) => held.method_type,
        (text, _) => AuthMethodType::parse(text).map_err(|error| bad(format!("auth method 0 invalid: {error}")))?,
    };
    let config = match (body.config, held) {
        (Some(config), _) => config.into_config()?,
        (None, Some(held)) => held.config.clone(),
        (None, None) => AuthMethodConfig::default(),
    };
    for alg in &config.signing_algs {
        alg.parse::<jsonwebtoken::Algorithm>()
            .map_err(|_| bad(format!("auth method 0 invalid: unsupported signing algorithm {alg:?}")))?;
    }
    let now = drover_io_real::clock::unix_millis();
    let method = AuthMethod {
        name: body.name,
        method_type,
        token_locality: body.token_locality,
        token_name_format: body.token_name_format,
        max_token_ttl_ms: duration_ms(&body.max_token_ttl, "MaxTokenTTL")?,
        default: body.default,
        config,
        create_time_ms: now,
        modify_time_ms: now,
        create_index: 0,
        modify_index: 0,
    }
    .merged(held);
    let acl = handle.config().acl;
    method
        .validate(acl.token_min_expiration_ttl, acl.token_max_expiration_ttl)
        .map_err(|error| bad(format!("auth method 0 invalid: {error}")))?;
    Ok(method)
}

pub(crate) async fn list_methods(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, methods) = read(&handle, |state| {
        let methods: Vec<Value> = state.acl().auth_methods().map(method_stub).collect();
        (state.table_index(Table::AclAuthMethods), methods)
    })?;
    Ok((query_headers(&handle, index), axum::Json(methods)))
}

pub(crate) async fn get_method(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let found = read(&handle, |state| {
        state
            .acl()
            .auth_method(&name)
            .map(|method| (method.modify_index, method_json(method)))
    })?;
    let (index, method) = found.ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "ACL auth-method not found".into()))?;
    Ok((query_headers(&handle, index), axum::Json(method)))
}

async fn upsert_method(handle: &AgentHandle, method: AuthMethod) -> Result<(HeaderMap, axum::Json<Value>), ApiError> {
    let name = method.name.clone();
    let index = apply(handle, AclCommand::AuthMethodsUpsert { methods: vec![method] }).await?;
    let method = read(handle, |state| state.acl().auth_method(&name).map(method_json))?.ok_or_else(|| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ACL auth method lookup failed".into(),
        )
    })?;
    Ok((query_headers(handle, index), axum::Json(method)))
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| bad(format!("failed to parse the {what}: {error}")))
}

pub(crate) async fn create_method(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: MethodBody = parse(&body, "ACL auth method")?;
    let held = read(&handle, |state| state.acl().auth_method(&body.name).cloned())?;
    let method = method_from(&handle, body, held.as_ref())?;
    upsert_method(&handle, method).await
}

pub(crate) async fn update_method(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let mut body: MethodBody = parse(&body, "ACL auth method")?;
    if body.name.is_empty() {
        body.name.clone_from(&name);
    } else if body.name != name {
        return Err(bad("ACL auth method name does not match request path"));
    }
    let held = read(&handle, |state| state.acl().auth_method(&name).cloned())?
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "ACL auth-method not found".into()))?;
    let method = method_from(&handle, body, Some(&held))?;
    upsert_method(&handle, method).await
}

pub(crate) async fn delete_method(
    State(handle): State<AgentHandle>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let index = apply(&handle, AclCommand::AuthMethodsDelete { names: vec![name] }).await?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

fn rule_json(rule: &BindingRule) -> Value {
    let shown = api::BindingRule {
        id: rule.id.clone(),
        description: rule.description.clone(),
        auth_method: rule.auth_method.clone(),
        selector: rule.selector.clone(),
        bind_type: rule.bind_type.as_str().into(),
        bind_name: rule.bind_name.clone(),
        create_time: rfc3339(rule.create_time_ms),
        modify_time: rfc3339(rule.modify_time_ms),
        create_index: rule.create_index,
        modify_index: rule.modify_index,
    };
    serde_json::to_value(shown).expect("a binding rule serializes")
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RuleBody {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Description")]
    description: String,
    #[serde(rename = "AuthMethod")]
    auth_method: String,
    #[serde(rename = "Selector")]
    selector: String,
    #[serde(rename = "BindType")]
    bind_type: String,
    #[serde(rename = "BindName")]
    bind_name: String,
}

/// `body` as the rule to store with ID `id`, merged over `held` as Nomad's update does.
fn rule_from(body: RuleBody, id: String, held: Option<&BindingRule>) -> Result<BindingRule, ApiError> {
    let invalid = |error: String| bad(format!("binding rule 0 invalid: {error}"));
    let bind_type = match (body.bind_type.as_str(), held) {
        ("", Some(held)) => held.bind_type,
        (text, _) => BindType::parse(text).map_err(invalid)?,
    };
    let or_held = |given: String, held: Option<&String>| match (given.is_empty(), held) {
        (true, Some(held)) => held.clone(),
        _ => given,
    };
    let now = drover_io_real::clock::unix_millis();
    let rule = BindingRule {
        id,
        description: body.description,
        auth_method: or_held(body.auth_method, held.map(|held| &held.auth_method)),
        selector: body.selector,
        bind_type,
        bind_name: if bind_type == BindType::Management {
            body.bind_name
        } else {
            or_held(body.bind_name, held.map(|held| &held.bind_name))
        },
        create_time_ms: held.map_or(now, |held| held.create_time_ms),
        modify_time_ms: now,
        create_index: 0,
        modify_index: 0,
    };
    rule.validate().map_err(invalid)?;
    Ok(rule)
}

pub(crate) async fn list_rules(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let (index, rules) = read(&handle, |state| {
        let rules: Vec<Value> = state.acl().binding_rules().map(rule_json).collect();
        (state.table_index(Table::AclBindingRules), rules)
    })?;
    Ok((query_headers(&handle, index), axum::Json(rules)))
}

pub(crate) async fn get_rule(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let found = read(&handle, |state| {
        state
            .acl()
            .binding_rule(&id)
            .map(|rule| (rule.modify_index, rule_json(rule)))
    })?;
    let (index, rule) = found.ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "ACL binding rule not found".into()))?;
    Ok((query_headers(&handle, index), axum::Json(rule)))
}

async fn upsert_rule(handle: &AgentHandle, rule: BindingRule) -> Result<(HeaderMap, axum::Json<Value>), ApiError> {
    let id = rule.id.clone();
    let index = apply(handle, AclCommand::BindingRulesUpsert { rules: vec![rule] }).await?;
    let rule = read(handle, |state| state.acl().binding_rule(&id).map(rule_json))?.ok_or_else(|| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ACL binding rule lookup failed: no entry found".into(),
        )
    })?;
    Ok((query_headers(handle, index), axum::Json(rule)))
}

pub(crate) async fn create_rule(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: RuleBody = parse(&body, "ACL binding rule")?;
    if !body.id.is_empty() {
        return Err(bad("ACL binding rule ID must not be set when creating a rule"));
    }
    let rule = rule_from(body, drover_io_real::runtime::random_uuid(), None)?;
    upsert_rule(&handle, rule).await
}

pub(crate) async fn update_rule(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: RuleBody = parse(&body, "ACL binding rule")?;
    if !body.id.is_empty() && body.id != id {
        return Err(bad("ACL binding rule ID does not match request path"));
    }
    let held = read(&handle, |state| state.acl().binding_rule(&id).cloned())?
        .ok_or_else(|| bad(format!("cannot find binding rule {id}")))?;
    let rule = rule_from(body, id, Some(&held))?;
    upsert_rule(&handle, rule).await
}

pub(crate) async fn delete_rule(
    State(handle): State<AgentHandle>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let index = apply(&handle, AclCommand::BindingRulesDelete { ids: vec![id] }).await?;
    Ok((query_headers(&handle, index), StatusCode::OK))
}

/// The auth method a login names, or the default one; `wanted` its type.
pub(super) fn login_method(handle: &AgentHandle, name: &str, wanted: AuthMethodType) -> Result<AuthMethod, ApiError> {
    let method = read(handle, |state| {
        if name.is_empty() {
            state.acl().default_auth_method().cloned()
        } else {
            state.acl().auth_method(name).cloned()
        }
    })?;
    let method = method.ok_or_else(|| {
        if name.is_empty() {
            bad("no auth method named and no default auth method")
        } else {
            bad(format!("auth-method {name:?} not found"))
        }
    })?;
    if method.method_type != wanted {
        return Err(bad(format!(
            "unsupported auth-method type: {}",
            method.method_type.as_str()
        )));
    }
    Ok(method)
}

/// The token a login whose verified claims are `verified` earns from `method`: its roles,
/// policies or management as the binding rules say, `MaxTokenTTL` long.
pub(super) async fn issue_token(
    handle: &AgentHandle,
    method: &AuthMethod,
    verified: &Value,
) -> Result<(HeaderMap, axum::Json<Value>), ApiError> {
    let claims: Claims = auth::claims(&method.config, verified).map_err(bad)?;
    let decided = read(handle, |state: &ServerState| {
        let bindings = auth::bind(state.acl(), method, &claims)?;
        Ok::<_, String>((bindings, auth::token_name(method, &claims)?))
    })?;
    let (bindings, name) = decided.map_err(bad)?;
    if bindings.none() {
        return Err(bad("no role or policy bindings matched"));
    }
    let now = drover_io_real::clock::unix_millis();
    let token = AclToken {
        accessor_id: drover_io_real::runtime::random_uuid(),
        secret_id: drover_io_real::runtime::random_uuid(),
        name,
        token_type: if bindings.management {
            TokenType::Management
        } else {
            TokenType::Client
        },
        policies: bindings.policies,
        roles: bindings.roles,
        global: method.token_locality == "global",
        create_time_ms: now,
        expiration_time_ms: Some(now + method.max_token_ttl_ms),
        create_index: 0,
        modify_index: 0,
    };
    let accessor = token.accessor_id.clone();
    tracing::info!(method = %method.name, accessor = %accessor, "ACL login");
    let index = apply(handle, AclCommand::TokensUpsert { tokens: vec![token] }).await?;
    stored_token(handle, &accessor, index, true)
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct LoginBody {
    #[serde(rename = "AuthMethodName")]
    auth_method_name: String,
    #[serde(rename = "LoginToken")]
    login_token: String,
}

/// `POST /v1/acl/login`: a JWT from an identity provider for a Nomad token.
pub(crate) async fn login(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: LoginBody = parse(&body, "login request")?;
    if body.login_token.is_empty() {
        return Err(bad("invalid login request: missing login token"));
    }
    let method = login_method(&handle, &body.auth_method_name, AuthMethodType::Jwt)?;
    let unauthorized = |error: String| {
        ApiError(
            StatusCode::UNAUTHORIZED,
            format!("unable to validate provided token: {error}"),
        )
    };
    let keys = idp::keys(&method.config).await.map_err(unauthorized)?;
    let config = &method.config;
    let expect = idp::Expect {
        algs: &config.signing_algs,
        audiences: &config.bound_audiences,
        issuers: &config.bound_issuer,
        config,
    };
    let verified = idp::verify(&body.login_token, &keys, &expect).map_err(unauthorized)?;
    issue_token(&handle, &method, &verified).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::assert_round_trips;

    #[test]
    fn auth_methods_and_binding_rules_render_as_the_shared_api_types() {
        let mut method = AuthMethod {
            name: "sso".into(),
            max_token_ttl_ms: 3_600_000,
            ..AuthMethod::default()
        };
        method.config.bound_audiences = vec!["nomad".into()];
        method.config.claim_mappings.insert("email".into(), "email".into());
        assert_round_trips::<api::AuthMethod>(method_json(&method));
        assert_round_trips::<api::AuthMethodListStub>(method_stub(&method));
        let rule = BindingRule {
            id: "b1".into(),
            auth_method: "sso".into(),
            bind_name: "ops".into(),
            ..BindingRule::default()
        };
        assert_round_trips::<api::BindingRule>(rule_json(&rule));
    }
}
