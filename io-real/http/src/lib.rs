//! The HTTP API, in Nomad's shapes (reference §7): status, agent, variables, CSI volumes and
//! plugins, and nodes. Reads answer from the agent's published status and applied state
//! (blocking queries on a table's index); writes go through Raft.

mod acl;
mod allocs;
pub mod api;
mod hcl_guard;
mod job_parse;
mod job_plan;
mod jobs;
mod keyring;
mod linger;
mod rootkeys;

pub(crate) use jobs::metric as jobs_metric;
pub use render::rfc3339;
mod blocking;
pub(crate) mod client;
mod cluster;
mod csi;
mod csi_snapshots;
mod deployments;
mod dispatch;
mod evaluate;
mod events;
mod exec;
mod forward;
mod fs;
mod fuzzy;
mod metrics;
mod monitor;
mod namespaces;
mod nodes;
mod operator;
mod page;
mod periodic;
mod query;
mod reads;
mod render;
mod routes;
mod scaling;
mod search;
mod server;
mod system;
mod variables;

pub(crate) use blocking::{block_on_table, blocking_list, blocking_one, blocking_page, query_headers};
pub use server::HttpLimits;

/// Every write endpoint's body decoded and validated into what the endpoint sends on, with no
/// agent: what the handlers call first, and what the fuzz targets (`io-real/http/fuzz`) drive.
pub mod decode {
    pub use super::allocs::{decode_restart as alloc_restart, decode_signal as alloc_signal};
    pub use super::csi::decode_register as volume_register;
    pub use super::jobs::decode_register as job_register;
    pub use super::nodes::{decode_drain as node_drain, decode_eligibility as node_eligibility};
    pub use super::variables::decode_put as variable_put;
}

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use drover_core::rpc::{ErrorKind, RpcError, ServerReply};
use serde::Deserialize;
use serde_json::{Value, json};

use drover_io_real::driver::{AgentHandle, AgentStatus, ApplyError};

/// Blocking queries wait this long when `wait` is not given, and at most `WAIT_MAX` (Nomad:
/// 5 and 10 minutes).
const WAIT_DEFAULT: Duration = Duration::from_secs(300);
const WAIT_MAX: Duration = Duration::from_secs(600);

/// Binds the HTTP API on `addr` and serves it in a background task, within `limits`.
pub async fn serve(handle: AgentHandle, addr: SocketAddr, limits: HttpLimits) -> std::io::Result<SocketAddr> {
    serve_with(&drover_host::sockets::TokioSockets, handle, addr, limits).await
}

/// [`serve`] on `sockets` (the host's, or a simulated network's).
pub async fn serve_with<S: drover_host::sockets::Sockets>(
    sockets: &S,
    handle: AgentHandle,
    addr: SocketAddr,
    limits: HttpLimits,
) -> std::io::Result<SocketAddr> {
    serve_tls(sockets, handle, addr, limits, None).await
}

/// [`serve_with`], as HTTPS when `tls` is given (`tls { http = true }`).
pub async fn serve_tls<S: drover_host::sockets::Sockets>(
    sockets: &S,
    handle: AgentHandle,
    addr: SocketAddr,
    limits: HttpLimits,
    tls: Option<std::sync::Arc<drover_host::tls::agent::AgentTls>>,
) -> std::io::Result<SocketAddr> {
    let listener = sockets.listen(addr).await?;
    let bound = S::local_addr(&listener)?;
    // The client endpoints reach this agent's client (if any) through the agent itself.
    let app = server::with_body_limit(router(handle.clone()), limits);
    // Requests client-only agents hand on are answered by this same API.
    let forwarded_app = app.clone();
    handle.serve_forwarded_http(std::sync::Arc::new(move |request| {
        let app = forwarded_app.clone();
        Box::pin(forward::answer(app, request))
    }));
    tokio::spawn(server::accept_loop::<S>(listener, app, limits, tls));
    Ok(bound)
}

pub fn router(handle: AgentHandle) -> Router {
    let (routes, rules) = routes::router_and_rules();
    routes
        // Each matched request's time, by route (`metrics.rs`).
        .route_layer(axum::middleware::from_fn_with_state(handle.clone(), metrics::measure))
        // Reads of cluster state wait for the Raft read barrier unless `?stale` (`reads.rs`).
        .layer(axum::middleware::from_fn_with_state(handle.clone(), reads::consistent))
        // A follower hands what only the leader may answer to it (`forward.rs`).
        .layer(axum::middleware::from_fn_with_state(handle.clone(), forward::to_leader))
        // A client-only agent hands cluster requests to a server (`forward.rs`).
        .layer(axum::middleware::from_fn_with_state(
            handle.clone(),
            forward::to_servers,
        ))
        // Every request's token against its route's rule (`acl/gate.rs`).
        .layer(axum::middleware::from_fn_with_state(
            acl::gate::Gate {
                handle: handle.clone(),
                rules: std::sync::Arc::new(rules),
                cache: std::sync::Arc::default(),
                remote: std::sync::Arc::default(),
            },
            acl::gate::enforce,
        ))
        // The query parameters every endpoint shares, read or refused (`query.rs`).
        .layer(axum::middleware::from_fn_with_state(handle.clone(), query::checked))
        // Outermost: the token goes along with every server request a handler makes, and the
        // servers check it again (`service/auth.rs`).
        .layer(axum::middleware::from_fn(caller_token))
        .with_state(handle)
}

/// Serves `request` with its token as the caller's, for the server requests it makes.
async fn caller_token(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let token = acl::gate::token_of(request.headers());
    drover_io_real::service::auth::with_token(token, next.run(request)).await
}

/// An endpoint's refusal: its HTTP status and message.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

impl From<ApplyError> for ApiError {
    fn from(error: ApplyError) -> Self {
        let status = match error {
            ApplyError::Invalid(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, error.to_string())
    }
}

/// A client's answer about one of its allocations, as Nomad's HTTP API answers it: an
/// unknown allocation, task or file 404, a request not servable as asked 400, the rest 500.
impl From<drover_core::error::AllocCallError> for ApiError {
    fn from(error: drover_core::error::AllocCallError) -> Self {
        use drover_core::error::AllocCallFailure;
        let status = match error.kind {
            AllocCallFailure::UnknownAlloc | AllocCallFailure::UnknownTask | AllocCallFailure::NoSuchFile => {
                StatusCode::NOT_FOUND
            }
            AllocCallFailure::Invalid => StatusCode::BAD_REQUEST,
            AllocCallFailure::Failed => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, error.message)
    }
}

/// The one place an endpoint's failure becomes an HTTP status, by its kind: not found 404,
/// invalid 400, everything else 500, a non-retryable refusal with Nomad's `rpc error: ` prefix.
impl From<RpcError> for ApiError {
    fn from(error: RpcError) -> Self {
        let status = match error.kind {
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Refused | ErrorKind::Busy | ErrorKind::Unavailable => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let refused = (error.kind == ErrorKind::Refused && !error.retryable) || error.kind == ErrorKind::Busy;
        let message = if refused {
            format!("rpc error: {}", error.message)
        } else {
            error.message
        };
        ApiError(status, message)
    }
}

/// A write endpoint's reply: the index it was applied at, or its error as HTTP.
fn reply_index(reply: ServerReply) -> Result<u64, ApiError> {
    match reply {
        ServerReply::Error(error) => Err(error.into()),
        other => Ok(other.index().expect("every reply but an error has an index")),
    }
}

fn leader_addr(status: &AgentStatus) -> String {
    status
        .raft
        .as_ref()
        .and_then(|raft| raft.leader.as_ref())
        .map(|(_, node)| node.rpc_addr.clone())
        .unwrap_or_default()
}

/// The leader's RPC address, or 500 `No cluster leader` when this server knows none (or has
/// not heard from the one it knew for an election timeout), as Nomad answers.
async fn status_leader(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    let (known, _) = handle.leader_contact();
    let leader = leader_addr(&handle.status());
    if !known || leader.is_empty() {
        return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "No cluster leader".into()));
    }
    Ok(axum::Json(json!(leader)))
}

async fn status_peers(State(handle): State<AgentHandle>) -> impl IntoResponse {
    let status = handle.status();
    let peers: Vec<String> = status
        .raft
        .iter()
        .flat_map(|raft| raft.peers.values().map(|(node, _)| node.rpc_addr.clone()))
        .collect();
    axum::Json(json!(peers))
}

fn member(view: &drover_core::membership::MemberView) -> api::AgentMember {
    api::AgentMember {
        name: view.id.name.clone(),
        addr: view.id.addr.ip().to_string(),
        port: view.id.addr.port(),
        tags: view.id.tags.as_ref().map(|tags| tags.to_map()).unwrap_or_default(),
        status: view.status.as_serf_str().into(),
        protocol_min: 1,
        protocol_max: 5,
        protocol_cur: 2,
        delegate_min: 2,
        delegate_max: 5,
        delegate_cur: 4,
    }
}

fn member_json(view: &drover_core::membership::MemberView) -> Value {
    serde_json::to_value(member(view)).expect("a member serializes")
}

async fn agent_members(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    let status = handle.status();
    let server = status
        .server
        .as_ref()
        .ok_or_else(|| ApiError(StatusCode::NOT_IMPLEMENTED, "Nomad agent is not a server".into()))?;
    let config = handle.config();
    Ok(axum::Json(api::ServerMembers {
        server_name: format!("{}.{}", config.name, config.region),
        server_region: config.region.clone(),
        server_dc: config.datacenter.clone(),
        members: server.members.iter().map(member).collect(),
    }))
}

async fn agent_self(State(handle): State<AgentHandle>) -> impl IntoResponse {
    let status = handle.status();
    let config = handle.config();
    let member = status.server.as_ref().and_then(|server| {
        server
            .members
            .iter()
            .find(|member| member.id.tags.as_ref().is_some_and(|tags| tags.id == server.node_id))
            .map(member_json)
    });
    let mut stats = serde_json::Map::new();
    if let Some(server) = &status.server {
        let raft = status.raft.clone().unwrap_or_default();
        let is_leader = raft.role == Some(drover_core::server::RaftRole::Leader);
        stats.insert(
            "nomad".into(),
            json!({
                "server": "true",
                "leader": is_leader.to_string(),
                "leader_addr": leader_addr(&status),
                "bootstrap": (server.bootstrap_expect == 1).to_string(),
                "bootstrap_expect": server.bootstrap_expect.to_string(),
                "bootstrapped": server.bootstrapped.to_string(),
                "known_regions": "1",
            }),
        );
        stats.insert(
            "raft".into(),
            json!({
                "state": raft.role.map(|role| format!("{role:?}")).unwrap_or_default(),
                "term": raft.term.to_string(),
                "last_log_index": raft.last_log_index.map(|index| index.to_string()).unwrap_or_default(),
                "applied_index": raft.last_applied.map(|index| index.to_string()).unwrap_or_default(),
                "num_peers": raft.peers.len().saturating_sub(1).to_string(),
                "latest_configuration": format!("{:?}", raft.peers.values().map(|(node, voter)| (node.rpc_addr.clone(), *voter)).collect::<Vec<_>>()),
            }),
        );
    }
    stats.insert("agent".into(), json!({ "node_id": handle.node_id().to_string() }));
    axum::Json(json!({
        "config": {
            "Region": config.region,
            "Datacenter": config.datacenter,
            "NodeName": config.name,
            "DataDir": config.data_dir.clone().unwrap_or_default(),
            "BindAddr": config.bind_addr.to_string(),
            "DevMode": config.dev_mode,
            "Ports": { "HTTP": config.ports.http, "RPC": config.ports.rpc, "Serf": config.ports.serf },
            "AdvertiseAddrs": {
                "HTTP": config.advertise.http.to_string(),
                "RPC": config.advertise.rpc.to_string(),
                "Serf": config.advertise.serf.to_string(),
            },
            "Server": {
                "Enabled": config.server.enabled || config.dev_mode,
                "BootstrapExpect": config.server.bootstrap_expect,
                "NonVotingServer": config.server.non_voting_server,
                "ServerJoin": {
                    "RetryJoin": config.server.retry_join,
                    "RetryInterval": config.server.retry_interval.as_nanos() as u64,
                    "RetryMaxAttempts": config.server.retry_max,
                },
            },
            "Client": { "Enabled": config.client.enabled || config.dev_mode },
            "Consul": {
                "Addr": config.consul.address.clone().unwrap_or_default(),
                "ServerServiceName": config.consul.server_service_name,
                "ServerAutoJoin": config.consul.server_auto_join,
            },
        },
        "member": member,
        "stats": stats,
    }))
}

/// The request's namespace (`?namespace=`), Nomad's `default` when absent.
/// Whether an object in `namespace` is listed for a request of `asked` (`*`: every one; an
/// object stored without a namespace is in the default one).
fn in_namespace(asked: &str, namespace: &str) -> bool {
    asked == "*" || asked == namespace || (namespace.is_empty() && asked == drover_core::structs::DEFAULT_NAMESPACE)
}

fn namespace(options: &QueryOptions) -> String {
    options
        .namespace
        .clone()
        .unwrap_or_else(|| drover_core::structs::DEFAULT_NAMESPACE.to_string())
}

/// A JSON request body, with the `null`s Nomad's Go client sends for unset fields read as
/// absent; a 400 naming `what` when it does not parse.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice::<Value>(body)
        .map(drover_io_real::jobs::without_nulls)
        .and_then(serde_json::from_value)
        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, format!("failed to parse {what}: {error}")))
}

/// A body carrying a job (`{"Job": {...}}`): [`parse_body`], with the job's fields Drover does
/// not take listed (`drover_io_real::jobs::strict`) rather than dropped.
fn parse_job_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<(T, Vec<String>), ApiError> {
    let parse_error =
        |error: serde_json::Error| ApiError(StatusCode::BAD_REQUEST, format!("failed to parse {what}: {error}"));
    let value = serde_json::from_slice::<Value>(body)
        .map(drover_io_real::jobs::without_nulls)
        .map_err(parse_error)?;
    drover_io_real::jobs::strict::decode::<T>(value, 1).map_err(parse_error)
}

/// [`parse_job_body`] for a write: any field Drover does not take refuses the request.
fn parse_job_write<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    let (decoded, problems) = parse_job_body(body, what)?;
    if problems.is_empty() {
        Ok(decoded)
    } else {
        Err(ApiError(
            StatusCode::BAD_REQUEST,
            drover_core::jobspec::format_errors(&problems),
        ))
    }
}

/// [`parse_body`], where an empty body means every field's default.
fn parse_body_or_default<T: serde::de::DeserializeOwned + Default>(body: &[u8], what: &str) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_body(body, what)
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct QueryOptions {
    index: Option<u64>,
    wait: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    prefix: Option<String>,
    namespace: Option<String>,
    plugin_id: Option<String>,
    node_id: Option<String>,
    node: Option<String>,
    #[serde(default, deserialize_with = "go_bool")]
    force: Option<bool>,
    /// `?resources=true`: list stubs carry their resources (nodes, allocations).
    #[serde(default, deserialize_with = "go_bool")]
    resources: Option<bool>,
    all: Option<String>,
    /// Pagination (`page.rs`).
    per_page: Option<String>,
    next_token: Option<String>,
    /// go-bexpr over each listed item's full object, before paging (`page::ItemFilter`).
    filter: Option<String>,
    /// `GET /v1/jobs?meta=true`: each stub carries its job's meta.
    #[serde(default, deserialize_with = "go_bool")]
    meta: Option<bool>,
    /// `GET /v1/nodes?os=true`: each stub carries its node's `os.name` attribute.
    #[serde(default, deserialize_with = "go_bool")]
    os: Option<bool>,
    /// `GET /v1/allocations?task_states=false`: stubs without their task states.
    #[serde(default, deserialize_with = "go_bool")]
    task_states: Option<bool>,
}

/// Runs a list read on the blocking pool, against the state version current now: a list of
/// the whole state (no `per_page`) takes as long as the state is big, and on a runtime worker
/// it would hold up whatever else runs there, Raft heartbeats included (issue 19 §4).
pub(crate) async fn read_list<R: Send + 'static>(
    handle: &AgentHandle,
    read: impl FnOnce(&drover_core::fsm::ServerState) -> R + Send + 'static,
) -> Option<R> {
    let version = handle.state_version()?;
    drover_io_real::runtime::blocking(move || read(&version.state)).await
}

/// `GET /v1/jobs?<query>` answered from `state` without a server around it: what the handler
/// computes, for benches that measure a list against the size of the state.
pub fn jobs_list(state: &drover_core::fsm::ServerState, query: &str) -> Result<(Vec<Value>, Option<String>), String> {
    let uri: axum::http::Uri = format!("/v1/jobs?{query}").parse().map_err(|e| format!("{e}"))?;
    let Query(options) = Query::<QueryOptions>::try_from_uri(&uri).map_err(|e| e.body_text())?;
    let filter = page::ItemFilter::of(&options).map_err(|error| error.1)?;
    let listed = jobs::list_page(state, &options, &filter);
    filter.finish(listed).map_err(|error| error.1)
}

/// A query boolean as Go's `strconv.ParseBool` reads it, which Nomad's handlers use.
pub(crate) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A query boolean field (`?purge=True`) read by [`parse_bool`]; anything else is refused with
/// Go's text.
pub(crate) fn go_bool<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<bool>, D::Error> {
    let text: Option<String> = serde::Deserialize::deserialize(deserializer)?;
    match text {
        None => Ok(None),
        Some(text) => parse_bool(&text)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("strconv.ParseBool: parsing {text:?}: invalid syntax"))),
    }
}

/// Parses Go durations as Nomad accepts them for `wait` ("5s", "1m", "250ms", "1m30s").
fn parse_go_duration(text: &str) -> Option<Duration> {
    drover_core::goduration::parse(text.trim()).ok()
}

/// A sealing or opening failure: the server's fault, never the request's.
pub(crate) fn root_key_error(error: drover_io_real::rootkeys::RootKeyError) -> ApiError {
    tracing::error!(%error, "root keyring");
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("abc"), None);
    }

    /// A job's `config` nested past `CONFIG_DEPTH_MAX` is refused over JSON as it is from HCL
    /// (io-real's jobs tests take the HCL side): the fuzzer's jobspec nesting `config` blocks
    /// 60 deep was once taken from HCL and refused over JSON.
    #[test]
    fn a_config_nested_too_deep_is_refused_over_json() {
        use drover_io_real::jobs::CONFIG_DEPTH_MAX;
        let job = |depth: usize| {
            let mut deep = json!("leaf");
            for _ in 1..depth {
                deep = json!({ "f": deep });
            }
            json!({"Job": {"ID":"web","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec",
                "Config":{"command":"/bin/true","deep":deep}}]}]}})
        };
        let body = |depth| serde_json::to_vec(&job(depth)).unwrap();
        assert!(decode::job_register(&body(CONFIG_DEPTH_MAX), None).is_ok());
        for depth in [CONFIG_DEPTH_MAX + 1, 200] {
            assert!(
                decode::job_register(&body(depth), None).is_err(),
                "{depth} levels over JSON"
            );
        }
    }
}
