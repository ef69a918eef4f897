//! `/v1/search` (Nomad's `Search.PrefixSearch`): IDs starting with a prefix, per context
//! (`allocs`, `deployment`, `evals`, `jobs`, `namespaces`, `nodes`, `plugins`,
//! `scaling_policy`, `vars`, `volumes`, or `all`), at most 20 per context with `Truncations`
//! saying where more matched. With ACLs, a context the caller's token may not read is left
//! out (Nomad's filtered contexts), and asking for that context alone is refused.

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use drover_core::acl::Acl;
use drover_core::acl::policy::{cap, var_cap};
use drover_core::fsm::ServerState;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{ApiError, QueryOptions, parse_body, query_headers};
use drover_io_real::driver::AgentHandle;

/// Matches returned per context at most (Nomad's `truncateLimit`).
pub const TRUNCATE_LIMIT: usize = 20;

/// Every context `all` searches, in Nomad's names.
const CONTEXTS: [&str; 10] = [
    "allocs",
    "deployment",
    "evals",
    "jobs",
    "namespaces",
    "nodes",
    "plugins",
    "scaling_policy",
    "vars",
    "volumes",
];

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct SearchBody {
    prefix: String,
    context: String,
    namespace: Option<String>,
}

/// Whether `acl` (none: ACLs off) lets the caller read `context` in `namespace`.
fn may_read(acl: Option<&Acl>, context: &str, namespace: &str) -> bool {
    let Some(acl) = acl else { return true };
    match context {
        "nodes" => acl.allows_node(false),
        "plugins" => acl.allows_plugin(true),
        "vars" => acl.allows_variable(namespace, "", var_cap::LIST),
        "volumes" => acl.allows_namespace_any(namespace, &[cap::CSI_LIST_VOLUME, cap::CSI_READ_VOLUME, cap::READ_JOB]),
        "namespaces" => acl.allows_namespace_any(namespace, &[cap::READ_JOB, cap::LIST_JOBS]),
        _ => acl.allows_namespace(namespace, cap::READ_JOB),
    }
}

/// The IDs of `context` in `namespace` (`*`: every one) starting with `prefix`, in order:
/// the first [`TRUNCATE_LIMIT`], and whether more matched.
fn matches(state: &ServerState, context: &str, namespace: &str, prefix: &str) -> (Vec<String>, bool) {
    let in_namespace = |ns: &str| namespace == "*" || ns == namespace;
    let ids: Box<dyn Iterator<Item = String> + '_> = match context {
        "allocs" => Box::new(
            state
                .allocs()
                .filter(|a| in_namespace(&a.namespace))
                .map(|a| a.id.clone()),
        ),
        "evals" => Box::new(
            state
                .evals()
                .filter(|e| in_namespace(&e.namespace))
                .map(|e| e.id.clone()),
        ),
        "jobs" => Box::new(
            state
                .jobs()
                .filter(|j| in_namespace(&j.namespace))
                .map(|j| j.id.clone()),
        ),
        "nodes" => Box::new(state.nodes().map(|n| n.id.clone())),
        "plugins" => Box::new(state.plugins().map(|p| p.id.clone())),
        "volumes" => Box::new(
            state
                .volume_keys()
                .filter(|(ns, _)| in_namespace(ns))
                .map(|(_, id)| id.clone()),
        ),
        // Variables live in the one namespace Drover has.
        "vars" => Box::new(
            state
                .variables()
                .filter(|_| in_namespace(drover_core::structs::DEFAULT_NAMESPACE))
                .map(|v| v.path.clone()),
        ),
        // The one namespace Drover has.
        "namespaces" => Box::new(std::iter::once(drover_core::structs::DEFAULT_NAMESPACE.to_string())),
        // Deployments and scaling policies do not exist here yet: nothing matches.
        _ => Box::new(std::iter::empty()),
    };
    let mut found: Vec<String> = ids.filter(|id| id.starts_with(prefix)).collect();
    found.sort();
    found.dedup();
    let truncated = found.len() > TRUNCATE_LIMIT;
    found.truncate(TRUNCATE_LIMIT);
    (found, truncated)
}

/// `POST /v1/search` `{"Prefix": "...", "Context": "all"}`.
pub async fn prefix_search(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
    acl: Option<Extension<Acl>>,
    body: axum::body::Bytes,
) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let body: SearchBody = parse_body(&body, "search request")?;
    let context = if body.context.is_empty() {
        "all"
    } else {
        body.context.as_str()
    };
    let asked: Vec<&'static str> = match context {
        "all" => CONTEXTS.to_vec(),
        one if CONTEXTS.contains(&one) => CONTEXTS.into_iter().filter(|known| *known == one).collect(),
        other => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!(
                    "invalid search context {other:?}: want one of all, {}",
                    CONTEXTS.join(", ")
                ),
            ));
        }
    };
    let namespace = body
        .namespace
        .or_else(|| options.namespace.clone())
        .unwrap_or_else(|| drover_core::structs::DEFAULT_NAMESPACE.to_string());
    let acl = acl.map(|Extension(acl)| acl);
    let allowed: Vec<&'static str> = asked
        .into_iter()
        .filter(|context| may_read(acl.as_ref(), context, &namespace))
        .collect();
    if allowed.is_empty() {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            drover_core::acl::PERMISSION_DENIED.into(),
        ));
    }
    let prefix = body.prefix;
    let read = super::read_list(&handle, move |state| {
        let mut found = Map::new();
        let mut truncations = Map::new();
        for context in allowed {
            let (ids, truncated) = matches(state, context, &namespace, &prefix);
            found.insert(context.to_string(), json!(ids));
            truncations.insert(context.to_string(), json!(truncated));
        }
        (state.last_applied().unwrap_or(0), found, truncations)
    })
    .await;
    let Some((index, found, truncations)) = read else {
        return Err(ApiError(StatusCode::NOT_IMPLEMENTED, "search needs a server".into()));
    };
    Ok((
        query_headers(&handle, index),
        axum::Json(json!({ "Matches": found, "Truncations": truncations, "Index": index })),
    ))
}
