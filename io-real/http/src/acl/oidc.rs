//! `/v1/acl/oidc/auth-url` and `/v1/acl/oidc/complete-auth`: Nomad's OIDC login, the
//! authorization-code flow. The CLI (or UI) asks for the provider's URL with a nonce of its
//! own, sends the user there, and hands back the code and state the provider redirected with;
//! the server exchanges the code, verifies the ID token (signature from the provider's JWKS,
//! issuer, audience = client ID, the caller's nonce), adds the user-info claims, and issues a
//! token through the auth method's binding rules.
//!
//! Servers keep nothing between the two calls (as Nomad's): the nonce travels with the caller.
//! With `OIDCEnablePKCE` the code verifier is derived from the caller's nonce and the state,
//! so whoever intercepts the redirect (code and state) cannot redeem it without the nonce.

use axum::extract::State;
use axum::response::IntoResponse;
use base64::Engine;
use drover_core::acl::auth::{AuthMethod, AuthMethodType};
use serde::Deserialize;
use serde_json::{Value, json};

use super::endpoints::enabled;
use super::idp::{self, Discovery, Provider};
use super::login::{bad, issue_token, login_method};
use crate::ApiError;
use drover_io_real::driver::AgentHandle;

#[derive(Default, Deserialize)]
#[serde(default)]
struct AuthUrlBody {
    #[serde(rename = "AuthMethodName")]
    auth_method_name: String,
    #[serde(rename = "RedirectURI")]
    redirect_uri: String,
    #[serde(rename = "ClientNonce")]
    client_nonce: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct CompleteBody {
    #[serde(rename = "AuthMethodName")]
    auth_method_name: String,
    #[serde(rename = "ClientNonce")]
    client_nonce: String,
    #[serde(rename = "State")]
    state: String,
    #[serde(rename = "Code")]
    code: String,
    #[serde(rename = "RedirectURI")]
    redirect_uri: String,
}

fn missing(request: &str, fields: &[(&str, &str)]) -> Result<(), ApiError> {
    match fields.iter().find(|(_, value)| value.is_empty()) {
        Some((name, _)) => Err(bad(format!("invalid OIDC {request} request: missing {name}"))),
        None => Ok(()),
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The PKCE code verifier of a login (see the module's note).
fn code_verifier(nonce: &str, state: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("drover-oidc-pkce\0{nonce}\0{state}").as_bytes(),
    );
    b64url(digest.as_ref())
}

/// The method's provider and its discovery document.
async fn provider(method: &AuthMethod) -> Result<(Provider, Discovery), ApiError> {
    let failed = |error: String| bad(format!("failed to generate OIDC provider: {error}"));
    let provider = Provider::new(&method.config.discovery_ca_pem).map_err(failed)?;
    let discovery = provider
        .discover(&method.config.oidc_discovery_url)
        .await
        .map_err(failed)?;
    Ok((provider, discovery))
}

fn check_redirect(method: &AuthMethod, uri: &str) -> Result<(), ApiError> {
    if method.config.allowed_redirect_uris.iter().any(|allowed| allowed == uri) {
        Ok(())
    } else {
        Err(bad(format!("unauthorized redirect_uri: {uri}")))
    }
}

pub(crate) async fn auth_url(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: AuthUrlBody =
        serde_json::from_slice(&body).map_err(|error| bad(format!("failed to parse the request: {error}")))?;
    missing(
        "auth-url",
        &[
            ("auth-method name", &body.auth_method_name),
            ("redirect URI", &body.redirect_uri),
            ("client nonce", &body.client_nonce),
        ],
    )?;
    let method = login_method(&handle, &body.auth_method_name, AuthMethodType::Oidc)?;
    check_redirect(&method, &body.redirect_uri)?;
    let (_, discovery) = provider(&method).await?;
    if discovery.authorization_endpoint.is_empty() {
        return Err(bad(
            "failed to generate auth URL: the provider has no authorization_endpoint",
        ));
    }
    let state = drover_io_real::runtime::random_uuid();
    let mut scopes = vec!["openid".to_string()];
    scopes.extend(
        method
            .config
            .oidc_scopes
            .iter()
            .filter(|scope| *scope != "openid")
            .cloned(),
    );
    let scope = scopes.join(" ");
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("client_id", &method.config.oidc_client_id)
        .append_pair("nonce", &body.client_nonce)
        .append_pair("redirect_uri", &body.redirect_uri)
        .append_pair("response_type", "code")
        .append_pair("scope", &scope)
        .append_pair("state", &state);
    if method.config.oidc_enable_pkce {
        let verifier = code_verifier(&body.client_nonce, &state);
        let challenge = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
        query
            .append_pair("code_challenge", &b64url(challenge.as_ref()))
            .append_pair("code_challenge_method", "S256");
    }
    let separator = if discovery.authorization_endpoint.contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!("{}{separator}{}", discovery.authorization_endpoint, query.finish());
    Ok(axum::Json(json!({ "AuthURL": url })))
}

pub(crate) async fn complete_auth(
    State(handle): State<AgentHandle>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    enabled(&handle)?;
    let body: CompleteBody =
        serde_json::from_slice(&body).map_err(|error| bad(format!("failed to parse the request: {error}")))?;
    missing(
        "complete-auth",
        &[
            ("auth-method name", &body.auth_method_name),
            ("client nonce", &body.client_nonce),
            ("state", &body.state),
            ("code", &body.code),
            ("redirect URI", &body.redirect_uri),
        ],
    )?;
    let method = login_method(&handle, &body.auth_method_name, AuthMethodType::Oidc)?;
    check_redirect(&method, &body.redirect_uri)?;
    let (provider, discovery) = provider(&method).await?;
    let config = &method.config;
    let verifier = code_verifier(&body.client_nonce, &body.state);
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", body.code.as_str()),
        ("redirect_uri", body.redirect_uri.as_str()),
        ("client_id", config.oidc_client_id.as_str()),
    ];
    if !config.oidc_client_secret.is_empty() {
        form.push(("client_secret", config.oidc_client_secret.as_str()));
    }
    if config.oidc_enable_pkce {
        form.push(("code_verifier", verifier.as_str()));
    }
    let exchanged = provider
        .post_form(&discovery.token_endpoint, &form)
        .await
        .map_err(|error| bad(format!("failed to exchange token with provider: {error}")))?;
    let id_token = exchanged["id_token"]
        .as_str()
        .ok_or_else(|| bad("exchanged token is not valid; potentially expired or empty"))?;
    let keys = idp::Keys::Jwks(
        provider
            .jwks(&discovery.jwks_uri)
            .await
            .map_err(|error| bad(format!("failed to verify the ID token: {error}")))?,
    );
    let expect = idp::Expect {
        algs: &config.signing_algs,
        audiences: std::slice::from_ref(&config.oidc_client_id),
        issuers: std::slice::from_ref(&discovery.issuer),
        config,
    };
    let mut claims = idp::verify(id_token, &keys, &expect)
        .map_err(|error| bad(format!("failed to verify the ID token: {error}")))?;
    check_claims(config, &claims, &body.client_nonce)?;
    let access_token = exchanged["access_token"].as_str().unwrap_or_default();
    if !config.oidc_disable_userinfo && !discovery.userinfo_endpoint.is_empty() && !access_token.is_empty() {
        let info = provider
            .get_json(&discovery.userinfo_endpoint, Some(access_token))
            .await
            .map_err(|error| bad(format!("failed to retrieve the user info claims: {error}")))?;
        merge_user_info(&mut claims, &info)?;
    }
    issue_token(&handle, &method, &claims).await
}

/// The ID token is for this login (its nonce) and, when the method bounds audiences, for one
/// of them.
fn check_claims(
    config: &drover_core::acl::auth::AuthMethodConfig,
    claims: &Value,
    nonce: &str,
) -> Result<(), ApiError> {
    if claims["nonce"].as_str() != Some(nonce) {
        return Err(bad("failed to verify the ID token: invalid id_token nonce"));
    }
    if config.bound_audiences.is_empty() {
        return Ok(());
    }
    let audiences: Vec<&str> = match &claims["aud"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if config
        .bound_audiences
        .iter()
        .any(|bound| audiences.contains(&bound.as_str()))
    {
        Ok(())
    } else {
        Err(bad("failed to verify the ID token: invalid audience (aud) claim"))
    }
}

/// User-info claims added to the ID token's, which keep their `iss` and `sub`; the user
/// info must be about the same subject (OIDC Core 5.3.2).
fn merge_user_info(claims: &mut Value, info: &Value) -> Result<(), ApiError> {
    let (Some(target), Some(info)) = (claims.as_object_mut(), info.as_object()) else {
        return Err(bad("failed to retrieve the user info claims: not a JSON object"));
    };
    if info.get("sub").is_some_and(|sub| Some(sub) != target.get("sub")) {
        return Err(bad("failed to retrieve the user info claims: subject mismatch"));
    }
    for (name, value) in info {
        if name != "iss" && name != "sub" {
            target.insert(name.clone(), value.clone());
        }
    }
    Ok(())
}
