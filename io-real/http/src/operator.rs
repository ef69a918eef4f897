//! The cluster's shape as an operator changes it (Nomad's shapes and texts):
//! `PUT /v1/agent/join`, `PUT /v1/agent/force-leave`, `DELETE /v1/operator/raft/peer`, and
//! autopilot's `/v1/operator/autopilot/configuration` (GET, PUT) and `/health`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use drover_core::autopilot::{AutopilotConfig, failure_tolerance};
use drover_core::goduration;
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::server::OperatorRequest;
use serde_json::{Value, json};

use super::{ApiError, parse_bool};
use drover_io_real::driver::AgentHandle;

/// Nomad's answer on an agent without the part an endpoint needs.
fn invalid_method() -> ApiError {
    ApiError(StatusCode::NOT_IMPLEMENTED, "Invalid method".into())
}

fn bad(text: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, text.into())
}

/// Every value of `key` in the query string.
fn params(query: &Option<String>, key: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_deref().unwrap_or_default().as_bytes())
        .filter(|(name, _)| name == key)
        .map(|(_, value)| value.into_owned())
        .collect()
}

/// `PUT /v1/agent/join?address=ip[:port]&...`: this server announces itself to each address
/// (the serf port when none is given). `num_joined` counts the addresses announced to; the
/// members that answer show in `server members`.
pub async fn join(State(handle): State<AgentHandle>, RawQuery(query): RawQuery) -> Result<impl IntoResponse, ApiError> {
    if !handle.is_server() {
        return Err(invalid_method());
    }
    let targets = params(&query, "address");
    if targets.is_empty() {
        return Err(bad("missing address to join"));
    }
    let serf_port = handle.config().ports.serf;
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for target in &targets {
        match target.parse::<SocketAddr>() {
            Ok(addr) => addrs.push(addr),
            Err(_) => match target.parse::<IpAddr>() {
                Ok(ip) => addrs.push(SocketAddr::new(ip, serf_port)),
                Err(_) => errors.push(format!("{target:?} is not an address (ip or ip:port)")),
            },
        }
    }
    let joined = if addrs.is_empty() || handle.gossip_join(addrs.clone()) {
        addrs.len()
    } else {
        errors.push("the agent is shutting down".into());
        0
    };
    Ok(axum::Json(json!({"num_joined": joined, "error": errors.join("; ")})))
}

/// `PUT /v1/agent/force-leave?node=<name>[&prune=true]`: a failed server is marked left and
/// removed from the Raft configuration by the leader.
pub async fn force_leave(
    State(handle): State<AgentHandle>,
    RawQuery(query): RawQuery,
) -> Result<impl IntoResponse, ApiError> {
    if !handle.is_server() {
        return Err(invalid_method());
    }
    let Some(node) = params(&query, "node")
        .into_iter()
        .next()
        .filter(|node| !node.is_empty())
    else {
        return Err(bad("missing node to force leave"));
    };
    let prune = match params(&query, "prune").first() {
        None => false,
        Some(text) => {
            parse_bool(text).ok_or_else(|| bad(format!("strconv.ParseBool: parsing {text:?}: invalid syntax")))?
        }
    };
    let request = ServerRequest::Operator(OperatorRequest::ForceLeave { node, prune });
    done(handle.request(request).await)
}

/// `DELETE /v1/operator/raft/peer?id=<id>` or `?address=<ip:port>`.
pub async fn remove_peer(
    State(handle): State<AgentHandle>,
    RawQuery(query): RawQuery,
) -> Result<impl IntoResponse, ApiError> {
    let (ids, addresses) = (params(&query, "id"), params(&query, "address"));
    if ids.is_empty() && addresses.is_empty() {
        return Err(bad(
            "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove",
        ));
    }
    if !ids.is_empty() && !addresses.is_empty() {
        return Err(bad("Must specify only one of ?id or ?address"));
    }
    let peers = handle.status().raft.map(|raft| raft.peers).unwrap_or_default();
    let id = match (ids.first(), addresses.first()) {
        (Some(id), _) => id
            .parse::<u64>()
            .ok()
            .filter(|id| peers.contains_key(id))
            .ok_or_else(|| not_in_configuration("id", id))?,
        (None, Some(address)) => peers
            .iter()
            .find(|(_, (node, _))| node.rpc_addr == *address)
            .map(|(id, _)| *id)
            .ok_or_else(|| not_in_configuration("address", address))?,
        (None, None) => unreachable!("checked above"),
    };
    done(
        handle
            .request(ServerRequest::Operator(OperatorRequest::RemovePeer { id }))
            .await,
    )
}

fn not_in_configuration(what: &str, value: &str) -> ApiError {
    ApiError(
        StatusCode::NOT_FOUND,
        format!("{what} {value:?} was not found in the Raft configuration"),
    )
}

fn done(reply: ServerReply) -> Result<Response, ApiError> {
    match reply {
        ServerReply::Error(error) => Err(error.into()),
        _ => Ok(axum::Json(Value::Null).into_response()),
    }
}

/// The autopilot settings in force on this server: the cluster's once set, else its own.
fn current_config(handle: &AgentHandle) -> AutopilotConfig {
    handle
        .read_state(|state| state.autopilot_config().copied())
        .flatten()
        .unwrap_or(handle.config().server.autopilot)
}

/// Nomad's `api.AutopilotConfiguration`: durations as Go duration strings.
pub fn config_json(config: &AutopilotConfig) -> Value {
    json!({
        "CleanupDeadServers": config.cleanup_dead_servers,
        "LastContactThreshold": goduration::format(config.last_contact_threshold),
        "MaxTrailingLogs": config.max_trailing_logs,
        "MinQuorum": config.min_quorum,
        "ServerStabilizationTime": goduration::format(config.server_stabilization_time),
        "EnableRedundancyZones": config.enable_redundancy_zones,
        "DisableUpgradeMigration": config.disable_upgrade_migration,
        "EnableCustomUpgrades": config.enable_custom_upgrades,
        "CreateIndex": config.create_index,
        "ModifyIndex": config.modify_index,
    })
}

/// `GET /v1/operator/autopilot/configuration`.
pub async fn get_config(State(handle): State<AgentHandle>) -> Result<impl IntoResponse, ApiError> {
    if !handle.is_server() {
        return Err(invalid_method());
    }
    Ok(axum::Json(config_json(&current_config(&handle))))
}

/// Reads an `api.AutopilotConfiguration` body over `base`: the fields it names replace
/// those of `base` (Nomad's CLI sends every field; a partial body changes only what it
/// names rather than zeroing the rest).
pub fn merge_config(base: AutopilotConfig, body: &[u8]) -> Result<AutopilotConfig, String> {
    let value: Value = serde_json::from_slice(body).map_err(|error| error.to_string())?;
    let Value::Object(fields) = value else {
        return Err("expected a JSON object".into());
    };
    let mut config = base;
    for (name, value) in &fields {
        let wrong = || format!("{name}: unexpected value {value}");
        match name.as_str() {
            "CleanupDeadServers" => config.cleanup_dead_servers = value.as_bool().ok_or_else(wrong)?,
            "EnableRedundancyZones" => config.enable_redundancy_zones = value.as_bool().ok_or_else(wrong)?,
            "DisableUpgradeMigration" => config.disable_upgrade_migration = value.as_bool().ok_or_else(wrong)?,
            "EnableCustomUpgrades" => config.enable_custom_upgrades = value.as_bool().ok_or_else(wrong)?,
            "MaxTrailingLogs" => config.max_trailing_logs = value.as_u64().ok_or_else(wrong)?,
            "MinQuorum" => {
                config.min_quorum = value
                    .as_u64()
                    .and_then(|quorum| u32::try_from(quorum).ok())
                    .ok_or_else(wrong)?
            }
            "LastContactThreshold" => config.last_contact_threshold = duration(name, value)?,
            "ServerStabilizationTime" => config.server_stabilization_time = duration(name, value)?,
            // Set by the state store, whatever the caller says.
            "CreateIndex" | "ModifyIndex" => {}
            other => return Err(format!("unknown field {other:?}")),
        }
    }
    Ok(config)
}

/// A duration as a Go duration string, or nanoseconds.
fn duration(name: &str, value: &Value) -> Result<Duration, String> {
    match value {
        Value::String(text) => goduration::parse(text).map_err(|error| format!("{name}: {error}")),
        Value::Number(number) => number
            .as_u64()
            .map(Duration::from_nanos)
            .ok_or_else(|| format!("{name}: a duration cannot be negative")),
        other => Err(format!("{name}: unexpected value {other}")),
    }
}

/// `PUT /v1/operator/autopilot/configuration[?cas=<index>]`: answers `true`, or `false` when
/// the check-and-set found the settings modified since.
pub async fn set_config(
    State(handle): State<AgentHandle>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    if !handle.is_server() {
        return Err(invalid_method());
    }
    let cas = match params(&query, "cas").first() {
        None => None,
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|error| bad(format!("Error parsing cas value: {error}")))?,
        ),
    };
    let config = merge_config(current_config(&handle), &body)
        .map_err(|error| bad(format!("Error parsing autopilot config: {error}")))?;
    match handle
        .request_applied(ServerRequest::AutopilotSetConfig { config, cas })
        .await
    {
        ServerReply::Error(error) if error.kind == drover_core::error::ErrorKind::Conflict => Ok(axum::Json(false)),
        ServerReply::Error(error) => Err(error.into()),
        _ => Ok(axum::Json(true)),
    }
}

/// When the leader first saw each server in its present health, for `StableSince`.
static STABLE_SINCE: Mutex<BTreeMap<u64, (bool, SystemTime)>> = Mutex::new(BTreeMap::new());

/// `GET /v1/operator/autopilot/health`: the leader's view (asked of the leader when this
/// server does not lead).
pub async fn health(State(handle): State<AgentHandle>) -> Result<Response, ApiError> {
    if !handle.is_server() {
        return Err(invalid_method());
    }
    let status = handle.status();
    let raft = status
        .raft
        .clone()
        .ok_or_else(|| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "No cluster leader".into()))?;
    match &raft.leader {
        Some((leader, _)) if *leader == handle.node_id() => Ok(axum::Json(leader_health(&handle)).into_response()),
        Some((_, node)) => {
            let addr: SocketAddr = node
                .rpc_addr
                .parse()
                .map_err(|_| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "No cluster leader".into()))?;
            let forward = drover_io_real::service::HttpForward {
                method: "GET".into(),
                uri: "/v1/operator/autopilot/health".into(),
                body: Vec::new(),
                token: String::new(),
                to_leader: false,
            };
            let answer = handle
                .forward_http_to(addr, forward)
                .await
                .map_err(|error| ApiError(StatusCode::INTERNAL_SERVER_ERROR, error))?;
            Ok(super::forward::response_of(answer))
        }
        None => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "No cluster leader".into())),
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// Nomad's `OperatorHealthReply`, computed on the leader.
fn leader_health(handle: &AgentHandle) -> Value {
    let status = handle.status();
    let raft = status.raft.clone().unwrap_or_default();
    let config = current_config(handle);
    let me = handle.node_id();
    let last_index = raft.last_log_index.unwrap_or(0);
    let replication = handle.replication().unwrap_or_default();
    let members: BTreeMap<u64, (&'static str, String)> = status
        .server
        .as_ref()
        .map(|server| {
            server
                .members
                .iter()
                .filter_map(|member| {
                    let tags = member.id.tags.as_ref()?;
                    Some((tags.id, (member.status.as_serf_str(), tags.build.clone())))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut stable = STABLE_SINCE.lock().expect("stable-since lock");
    let now = SystemTime::now();
    let mut servers = Vec::new();
    let (mut voters, mut healthy_voters, mut all_healthy) = (Vec::new(), 0, true);
    for (id, (node, voter)) in raft.peers.iter() {
        let (serf, version) = members.get(id).cloned().unwrap_or(("none", String::new()));
        let (matched, contact) = if *id == me {
            (Some(last_index), Some(Duration::ZERO))
        } else {
            replication.get(id).copied().unwrap_or((None, None))
        };
        let healthy = serf == "alive"
            && contact.is_some_and(|contact| contact <= config.last_contact_threshold)
            && matched.is_some_and(|matched| last_index.saturating_sub(matched) <= config.max_trailing_logs);
        let since = match stable.get(id) {
            Some((was, since)) if *was == healthy => *since,
            _ => now,
        };
        stable.insert(*id, (healthy, since));
        all_healthy &= healthy;
        if *voter {
            voters.push(id.to_string());
            healthy_voters += usize::from(healthy);
        }
        servers.push(json!({
            "ID": id.to_string(),
            "Name": node.name,
            "Address": node.rpc_addr,
            "SerfStatus": serf,
            "Version": version,
            "Leader": *id == me,
            "Voter": voter,
            "LastContact": contact.map_or_else(|| "-1ns".to_string(), goduration::format),
            "LastTerm": raft.term,
            "LastIndex": matched.unwrap_or(0),
            "Healthy": healthy,
            "StableSince": super::rfc3339(unix_ms(since)),
        }));
    }
    json!({
        "Healthy": all_healthy,
        "FailureTolerance": failure_tolerance(voters.len(), healthy_voters),
        "Leader": me.to_string(),
        "Voters": voters,
        "Servers": servers,
    })
}
