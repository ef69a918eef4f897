//! Every request checked against its token's ACL before it reaches an endpoint (when
//! `acl { enabled = true }`): the capability Nomad's endpoint checks, by method and route,
//! with Nomad's `403 Permission denied`. Each route's rule sits beside its handlers in the
//! one route table (`routes.rs`); a path no route matches needs a management token.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use drover_core::acl::policy::cap;
use drover_core::acl::{Acl, PERMISSION_DENIED, ResolveError};
use drover_core::fsm::Table;

use drover_io_real::driver::AgentHandle;

/// The largest body the gate reads to learn a write's namespaces (the body limit's).
const BODY_PEEK_MAX: usize = 64 << 20;
/// Resolved tokens kept; the cache is emptied when full.
const CACHE_MAX: usize = 4_096;

/// What a request needs from its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    Nothing,
    /// Any valid token (the endpoint decides the rest: `token/self`, policies it holds).
    Token,
    Management,
    Namespace(&'static str),
    /// Any one of these capabilities in the namespace.
    NamespaceAny(&'static [&'static str]),
    Node {
        write: bool,
    },
    Agent {
        write: bool,
    },
    Operator {
        write: bool,
    },
    Plugin {
        read: bool,
    },
    Variable {
        path: String,
        capability: &'static str,
    },
}

impl Need {
    fn allowed(&self, acl: &Acl, namespaces: &[String]) -> bool {
        match self {
            Need::Nothing | Need::Token => true,
            Need::Management => acl.is_management(),
            Need::Namespace(capability) => namespaces.iter().all(|ns| acl.allows_namespace(ns, capability)),
            Need::NamespaceAny(capabilities) => namespaces.iter().all(|ns| acl.allows_namespace_any(ns, capabilities)),
            Need::Node { write } => acl.allows_node(*write),
            Need::Agent { write } => acl.allows_agent(*write),
            Need::Operator { write } => acl.allows_operator(*write),
            Need::Plugin { read } => acl.allows_plugin(*read),
            Need::Variable { path, capability } => {
                namespaces.iter().all(|ns| acl.allows_variable(ns, path, capability))
            }
        }
    }
}

pub(crate) fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// The request's secret: `X-Nomad-Token`, else `Authorization: Bearer <secret>`.
pub fn token_of(headers: &HeaderMap) -> String {
    if let Some(token) = headers.get("X-Nomad-Token").and_then(|value| value.to_str().ok()) {
        return token.trim().to_string();
    }
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|token| token.trim().to_string())
        .unwrap_or_default()
}

/// Resolved ACLs by secret, each with the ACL tables' index it was resolved at: a write to
/// the tokens, policies or roles makes every entry stale.
#[derive(Default)]
pub struct Cache(Mutex<BTreeMap<String, Cached>>);

/// One resolved secret: the ACL tables' index then, the token's expiry, and the outcome.
struct Cached {
    index: u64,
    expires: Option<u64>,
    resolved: Result<Acl, ResolveError>,
}

impl Cache {
    /// The ACL of `secret` on `handle`'s state; `None` on an agent without one (client-only).
    pub fn resolve(&self, handle: &AgentHandle, secret: &str) -> Option<Result<Acl, ResolveError>> {
        handle.read_state(|state| {
            let index = [Table::AclTokens, Table::AclPolicies, Table::AclRoles]
                .into_iter()
                .map(|table| state.table_index(table))
                .max()
                .unwrap_or_default();
            // Expiry is wall-clock time, as Nomad's: an idle cluster's applied time stands still.
            let now = drover_io_real::clock::unix_millis().max(state.last_applied_time_ms());
            let mut held = self.0.lock().expect("ACL cache");
            if let Some(cached) = held.get(secret)
                && cached.index == index
                && cached.expires.is_none_or(|expires| now < expires)
            {
                return cached.resolved.clone();
            }
            let resolved = state.acl().resolve(secret, now);
            let expires = state
                .acl()
                .token_by_secret(secret)
                .and_then(|token| token.expiration_time_ms);
            if held.len() >= CACHE_MAX {
                held.clear();
            }
            held.insert(
                secret.to_string(),
                Cached {
                    index,
                    expires,
                    resolved: resolved.clone(),
                },
            );
            resolved
        })
    }
}

/// Tokens a client-only agent had a server resolve, each kept `acl { token_ttl }` (Nomad's
/// client agents cache the same way): a token deleted on the servers stops working here
/// within that long, an expired one at once.
#[derive(Default)]
pub struct RemoteCache(Mutex<BTreeMap<String, (tokio::time::Instant, drover_core::acl::ResolvedToken)>>);

impl RemoteCache {
    /// The ACL of `secret`, asked of a server unless held fresh; `Err` when no server answered.
    pub async fn resolve(&self, handle: &AgentHandle, secret: &str) -> Result<Result<Acl, ResolveError>, String> {
        let ttl = handle.config().acl.token_ttl;
        let now = tokio::time::Instant::now();
        let held = self.0.lock().expect("ACL cache").get(secret).cloned();
        let token = match held {
            Some((at, token)) if now.saturating_duration_since(at) < ttl => token,
            _ => match handle.acl_resolve(secret).await? {
                Ok(token) => {
                    let mut held = self.0.lock().expect("ACL cache");
                    if held.len() >= CACHE_MAX {
                        held.clear();
                    }
                    held.insert(secret.to_string(), (now, token.clone()));
                    token
                }
                Err(error) => return Ok(Err(error)),
            },
        };
        if token
            .expires_ms
            .is_some_and(|expires| drover_io_real::clock::unix_millis() >= expires)
        {
            return Ok(Err(ResolveError::Expired));
        }
        Ok(Ok(token.acl()))
    }
}

/// The gate's state: the agent and its caches.
#[derive(Clone)]
pub struct Gate {
    pub handle: AgentHandle,
    /// Every route's rule (`routes.rs`, the table the router is built from).
    pub rules: Arc<crate::routes::Rules>,
    pub cache: Arc<Cache>,
    pub remote: Arc<RemoteCache>,
}

fn denied(text: &str) -> Response {
    (StatusCode::FORBIDDEN, text.to_string()).into_response()
}

/// Middleware: the request's token must allow what its route needs.
pub async fn enforce(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    if !gate.handle.config().acl.enabled {
        return next.run(request).await;
    }
    let path = request.uri().path().to_string();
    let need = gate.rules.need(request.method(), &path, request.uri().query());
    if need == Need::Nothing {
        return next.run(request).await;
    }
    let secret = token_of(request.headers());
    let resolved = match gate.cache.resolve(&gate.handle, &secret) {
        Some(resolved) => resolved,
        // A client-only agent holds no ACLs: what it hands to a server is checked there (the
        // token goes along); what it answers itself is checked here, the token resolved by a
        // server.
        None if path.starts_with("/v1/client/") || path == "/v1/metrics" => {
            match gate.remote.resolve(&gate.handle, &secret).await {
                Ok(resolved) => resolved,
                Err(error) => {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot resolve the ACL token: no server answered: {error}"),
                    )
                        .into_response();
                }
            }
        }
        None => return next.run(request).await,
    };
    let acl = match resolved {
        Ok(acl) => acl,
        Err(error) => return denied(&error.to_string()),
    };
    if every_namespace(&request, &need) && !acl.is_management() {
        // `?namespace=*`: refused when no namespace allows the read, as Nomad's `AllowNsOp`
        // on `*` is; else the list, less what the token may not see, item by item.
        let some = match &need {
            Need::Namespace(capability) => acl.allows_some_namespace(capability),
            Need::NamespaceAny(capabilities) => capabilities.iter().any(|c| acl.allows_some_namespace(c)),
            _ => true,
        };
        if !some {
            return denied(PERMISSION_DENIED);
        }
        let response = next.run(request).await;
        return only_allowed_namespaces(response, |namespace| need.allowed(&acl, &[namespace.to_string()])).await;
    }
    let request = scoped_to_default(request, &need);
    let (mut request, namespaces) = match namespaces_of(request, &need).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    if need.allowed(&acl, &namespaces) {
        // Handlers that show only part of what they find (search) read the ACL from here.
        request.extensions_mut().insert(acl);
        next.run(request).await
    } else {
        denied(PERMISSION_DENIED)
    }
}

/// A namespaced read of every namespace (`GET ...?namespace=*`).
fn every_namespace(request: &Request, need: &Need) -> bool {
    *request.method() == Method::GET
        && matches!(need, Need::Namespace(_) | Need::NamespaceAny(_))
        && query_param(request.uri().query(), "namespace").as_deref() == Some("*")
}

/// The largest list body the gate filters (a bigger one is refused rather than shown whole).
const LIST_FILTER_MAX: usize = 256 << 20;

/// `response`'s JSON list without the items in namespaces `allowed` refuses (an item without a
/// `Namespace` is in `default`); anything but a JSON list passes as it is.
async fn only_allowed_namespaces(response: Response, allowed: impl Fn(&str) -> bool) -> Response {
    if response.status() != StatusCode::OK {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, LIST_FILTER_MAX).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the list is too large to filter by namespace",
        )
            .into_response();
    };
    let Ok(serde_json::Value::Array(items)) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    let kept: Vec<serde_json::Value> = items
        .into_iter()
        .filter(|item| allowed(item.get("Namespace").and_then(|ns| ns.as_str()).unwrap_or("default")))
        .collect();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let body = serde_json::to_vec(&kept).expect("a JSON list serializes");
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// A namespaced read without `?namespace=` is Nomad's `default` namespace, and is made so
/// here: the API lists every namespace when none is named, which would show a token what it
/// may read in `default` from every other namespace too.
fn scoped_to_default(mut request: Request, need: &Need) -> Request {
    let namespaced = matches!(need, Need::Namespace(_) | Need::NamespaceAny(_) | Need::Variable { .. });
    if *request.method() != Method::GET || !namespaced || query_param(request.uri().query(), "namespace").is_some() {
        return request;
    }
    let path_and_query = match request.uri().query() {
        Some(query) if !query.is_empty() => format!("{}?{query}&namespace=default", request.uri().path()),
        _ => format!("{}?namespace=default", request.uri().path()),
    };
    if let Ok(uri) = path_and_query.parse() {
        *request.uri_mut() = uri;
    }
    request
}

/// The namespaces a request acts in: `?namespace=` (Nomad's `default`), and for a job or volume
/// write every namespace its body names, so a token for one cannot write into another.
async fn namespaces_of(request: Request, need: &Need) -> Result<(Request, Vec<String>), Response> {
    let mut namespaces = vec![query_param(request.uri().query(), "namespace").unwrap_or_else(|| "default".into())];
    let writes_body = matches!(need, Need::Namespace(cap::SUBMIT_JOB | cap::CSI_WRITE_VOLUME))
        && matches!(*request.method(), Method::PUT | Method::POST);
    if !writes_body {
        return Ok((request, namespaces));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_PEEK_MAX)
        .await
        .map_err(|error| (StatusCode::BAD_REQUEST, format!("failed to read the request: {error}")).into_response())?;
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        let mut named = Vec::new();
        if let Some(ns) = value.pointer("/Job/Namespace").and_then(|ns| ns.as_str()) {
            named.push(ns.to_string());
        }
        for volume in value
            .get("Volumes")
            .and_then(|volumes| volumes.as_array())
            .into_iter()
            .flatten()
        {
            if let Some(ns) = volume.get("Namespace").and_then(|ns| ns.as_str()) {
                named.push(ns.to_string());
            }
        }
        namespaces.extend(named.into_iter().filter(|ns| !ns.is_empty()));
    }
    Ok((Request::from_parts(parts, axum::body::Body::from(bytes)), namespaces))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(method: &Method, path: &str, query: Option<&str>) -> Need {
        crate::routes::rules().need(method, path, query)
    }

    #[test]
    fn every_route_family_has_nomads_rule_and_unknown_routes_need_management() {
        let get = Method::GET;
        let put = Method::PUT;
        assert_eq!(need(&get, "/v1/status/leader", None), Need::Nothing);
        assert_eq!(need(&get, "/v1/jobs", None), Need::Namespace("list-jobs"));
        assert_eq!(need(&put, "/v1/jobs", None), Need::Namespace("submit-job"));
        assert_eq!(
            need(&Method::DELETE, "/v1/job/web", None),
            Need::Namespace("submit-job")
        );
        assert_eq!(need(&get, "/v1/job/web/allocations", None), Need::Namespace("read-job"));
        assert_eq!(need(&put, "/v1/job/web/revert", None), Need::Namespace("submit-job"));
        assert_eq!(need(&put, "/v1/job/web/stable", None), Need::Namespace("submit-job"));
        assert_eq!(need(&put, "/v1/job/web/plan", None), Need::Namespace("submit-job"));
        assert_eq!(
            need(&put, "/v1/job/web/periodic/force", None),
            Need::Namespace("submit-job")
        );
        assert_eq!(
            need(&put, "/v1/job/web/dispatch", None),
            Need::Namespace("dispatch-job")
        );
        assert_eq!(need(&get, "/v1/job/web/deployments", None), Need::Namespace("read-job"));
        assert_eq!(need(&get, "/v1/deployments", None), Need::Namespace("read-job"));
        assert_eq!(need(&get, "/v1/deployment/d1", None), Need::Namespace("read-job"));
        assert_eq!(
            need(&get, "/v1/deployment/allocations/d1", None),
            Need::Namespace("read-job")
        );
        for verb in ["fail", "pause", "promote", "allocation-health"] {
            let path = format!("/v1/deployment/{verb}/d1");
            assert_eq!(need(&put, &path, None), Need::Namespace("submit-job"), "{path}");
        }
        assert_eq!(
            need(&get, "/v1/volume/csi/v1", None),
            Need::Namespace("csi-read-volume")
        );
        assert_eq!(
            need(&put, "/v1/volume/csi/v1", None),
            Need::Namespace("csi-write-volume")
        );
        assert_eq!(need(&get, "/v1/client/fs/logs/a1", None), Need::Namespace("read-logs"));
        assert_eq!(need(&get, "/v1/client/fs/cat/a1", None), Need::Namespace("read-fs"));
        assert_eq!(need(&get, "/v1/client/stats", None), Need::Node { write: false });
        assert_eq!(need(&get, "/v1/namespaces", None), Need::Token);
        assert_eq!(need(&get, "/v1/namespace/prod", None), Need::Token);
        assert_eq!(need(&Method::PUT, "/v1/namespace/prod", None), Need::Management);
        assert_eq!(need(&Method::DELETE, "/v1/namespace/prod", None), Need::Management);
        assert_eq!(need(&get, "/v1/client/gc", None), Need::Node { write: true });
        assert_eq!(
            need(&get, "/v1/client/allocation/a1/gc", None),
            Need::Namespace("submit-job")
        );
        assert_eq!(
            need(&get, "/v1/client/allocation/a1/exec", None),
            Need::Namespace("alloc-exec")
        );
        assert_eq!(need(&put, "/v1/node/n1/drain", None), Need::Node { write: true });
        assert_eq!(need(&get, "/v1/nodes", None), Need::Node { write: false });
        assert_eq!(need(&get, "/v1/plugins", None), Need::Plugin { read: false });
        assert_eq!(
            need(&Method::DELETE, "/v1/var/a/b", None),
            Need::Variable {
                path: "a/b".into(),
                capability: "destroy"
            }
        );
        assert_eq!(
            need(&get, "/v1/vars", Some("prefix=nomad%2Fjobs")),
            Need::Variable {
                path: "nomad/jobs".into(),
                capability: "list"
            }
        );
        assert_eq!(need(&put, "/v1/acl/policy/p", None), Need::Management);
        assert_eq!(need(&get, "/v1/acl/token/self", None), Need::Token);
        assert_eq!(need(&get, "/v1/acl/roles", None), Need::Token);
        assert_eq!(need(&get, "/v1/acl/role/name/ops", None), Need::Token);
        assert_eq!(need(&put, "/v1/acl/role/r1", None), Need::Management);
        assert_eq!(need(&put, "/v1/acl/token/onetime", None), Need::Token);
        assert_eq!(need(&put, "/v1/acl/token/onetime/exchange", None), Need::Nothing);
        assert_eq!(need(&put, "/v1/acl/login", None), Need::Nothing);
        assert_eq!(need(&put, "/v1/acl/oidc/complete-auth", None), Need::Nothing);
        assert_eq!(need(&get, "/v1/acl/auth-methods", None), Need::Nothing);
        assert_eq!(need(&get, "/v1/acl/auth-method/sso", None), Need::Management);
        assert_eq!(need(&get, "/v1/acl/binding-rules", None), Need::Management);
        assert_eq!(need(&get, "/v1/some/new/endpoint", None), Need::Management);
    }

    #[test]
    fn the_token_comes_from_either_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(token_of(&headers), "");
        headers.insert("Authorization", "Bearer abc".parse().unwrap());
        assert_eq!(token_of(&headers), "abc");
        headers.insert("X-Nomad-Token", "xyz".parse().unwrap());
        assert_eq!(token_of(&headers), "xyz");
    }
}
