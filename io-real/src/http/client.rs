//! `GET /v1/client/allocation/:id/stats` (Nomad's `AllocResourceUsage`, with what the client
//! measures — RSS and CPU per task from its driver, device stats — and task states), served by
//! the client that runs the allocation and relayed to it from any other agent.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::client::{ClientView, TaskUsage};
use crate::devices::DeviceStats;
use crate::drivers::TaskResourceUsage;
use crate::service::{NodeCall, NodeCallKind};

/// Nomad's `DeviceGroupStats`: one entry per device group, instances by id.
fn device_groups(stats: &[DeviceStats]) -> Vec<Value> {
    let mut groups: BTreeMap<&str, Vec<&DeviceStats>> = BTreeMap::new();
    for stat in stats {
        groups.entry(&stat.device).or_default().push(stat);
    }
    groups
        .into_iter()
        .map(|(device, instances)| {
            let mut parts = device.splitn(3, '/');
            let (vendor, kind, name) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            let instance_stats: serde_json::Map<String, Value> = instances
                .iter()
                .map(|stat| {
                    (
                        stat.id.clone(),
                        json!({
                            "Summary": {
                                "FloatNumeratorVal": stat.utilization_percent,
                                "Unit": "%",
                                "Desc": stat.summary,
                            },
                            "Stats": {
                                "Attributes": {
                                    "memory_used": {"IntNumeratorVal": stat.memory_used_mib, "Unit": "MiB"}
                                }
                            },
                        }),
                    )
                })
                .collect();
            json!({"Vendor": vendor, "Type": kind, "Name": name, "InstanceStats": instance_stats})
        })
        .collect()
}

/// Nomad's `ResourceUsage`: what is measured is listed in `Measured` — RSS and CPU percent
/// in user and system mode from the task's processes, and with a cgroup what its controllers
/// account (usage, peak, cache, swap, CFS throttling), under Nomad's names; `TotalTicks` is
/// the percent in MHz of this node's cores, as Nomad computes it; the rest stays 0.
fn usage(view: &ClientView, resources: Option<&TaskResourceUsage>, devices: &[DeviceStats]) -> Value {
    let usage = resources.cloned().unwrap_or_default();
    let mut memory_measured: Vec<&str> = Vec::new();
    let mut cpu_measured: Vec<&str> = Vec::new();
    if resources.is_some() {
        memory_measured.push("RSS");
        cpu_measured.extend(["System Mode", "User Mode", "Percent"]);
    }
    let cgroup = usage.cgroup.unwrap_or_default();
    let measured = |list: &mut Vec<&'static str>, name: &'static str, value: Option<u64>| {
        if value.is_some() {
            list.push(name);
        }
        value.unwrap_or(0)
    };
    let memory = json!({
        "RSS": usage.rss_bytes,
        "Cache": measured(&mut memory_measured, "Cache", cgroup.cache_bytes),
        "Swap": measured(&mut memory_measured, "Swap", cgroup.swap_bytes),
        "Usage": measured(&mut memory_measured, "Usage", cgroup.usage_bytes),
        "MaxUsage": measured(&mut memory_measured, "Max Usage", cgroup.max_usage_bytes),
        "Measured": memory_measured,
    });
    let throttled_periods = measured(&mut cpu_measured, "Throttled Periods", cgroup.throttled_periods);
    let throttled_time = measured(&mut cpu_measured, "Throttled Time", cgroup.throttled_time_ns);
    json!({
        "MemoryStats": memory,
        "CpuStats": {
            "SystemMode": usage.system_percent,
            "UserMode": usage.user_percent,
            "ThrottledPeriods": throttled_periods,
            "ThrottledTime": throttled_time,
            "TotalTicks": view.ticks_consumed(usage.system_percent + usage.user_percent),
            "Percent": usage.system_percent + usage.user_percent,
            "Measured": cpu_measured,
        },
        "DeviceStats": device_groups(devices),
    })
}

/// The allocation's total: the sum over its measured tasks.
fn total(tasks: &BTreeMap<String, TaskUsage>) -> Option<TaskResourceUsage> {
    let measured: Vec<&TaskResourceUsage> = tasks.values().filter_map(|task| task.resources.as_ref()).collect();
    if measured.is_empty() {
        return None;
    }
    Some(TaskResourceUsage {
        rss_bytes: measured.iter().map(|usage| usage.rss_bytes).sum(),
        user_percent: measured.iter().map(|usage| usage.user_percent).sum(),
        system_percent: measured.iter().map(|usage| usage.system_percent).sum(),
        pids: measured.iter().flat_map(|usage| usage.pids.clone()).collect(),
        cgroup: measured
            .iter()
            .filter_map(|usage| usage.cgroup)
            .reduce(crate::drivers::cgroup::CgroupUsage::plus),
    })
}

/// `GET /v1/client/allocation/:id/stats` from any agent: this agent's client, or relayed to
/// the one that runs the allocation.
pub async fn alloc_stats(State(handle): State<crate::driver::AgentHandle>, Path(id): Path<String>) -> Response {
    match handle.client_stats(id).await {
        Ok(stats) => Json(stats).into_response(),
        Err(error) => super::ApiError::from(error).into_response(),
    }
}

/// `?node_id=` of the node endpoints: the node to ask (none: this agent's own client).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeQuery {
    #[serde(default)]
    node_id: String,
    // The query options every endpoint takes.
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

fn node_call(query: Result<Query<NodeQuery>, QueryRejection>, kind: NodeCallKind) -> Result<NodeCall, super::ApiError> {
    let Query(query) = query.map_err(|rejection| super::ApiError(StatusCode::BAD_REQUEST, rejection.body_text()))?;
    let _ = (query.region, query.namespace);
    Ok(NodeCall {
        node_id: query.node_id,
        kind,
    })
}

/// `GET /v1/client/stats[?node_id=]`: Nomad's `HostStats` of this agent's client, or of the
/// node named, relayed to it.
pub async fn host_stats(
    State(handle): State<crate::driver::AgentHandle>,
    query: Result<Query<NodeQuery>, QueryRejection>,
) -> Response {
    let call = match node_call(query, NodeCallKind::HostStats) {
        Ok(call) => call,
        Err(error) => return error.into_response(),
    };
    match handle.node_call(call).await {
        Ok(stats) => Json(stats).into_response(),
        Err(error) => super::ApiError::from(error).into_response(),
    }
}

/// `GET|PUT /v1/client/gc[?node_id=]`: the client destroys its finished allocations (those
/// the servers list as finished and that are done here); an empty answer, as Nomad's.
pub async fn node_gc(
    State(handle): State<crate::driver::AgentHandle>,
    query: Result<Query<NodeQuery>, QueryRejection>,
) -> Response {
    let call = match node_call(query, NodeCallKind::Gc) {
        Ok(call) => call,
        Err(error) => return error.into_response(),
    };
    match handle.node_call(call).await {
        Ok(_) => StatusCode::OK.into_response(),
        Err(error) => super::ApiError::from(error).into_response(),
    }
}

/// `GET|PUT /v1/client/allocation/:id/gc`: one finished allocation destroyed by its client.
pub async fn alloc_gc(State(handle): State<crate::driver::AgentHandle>, Path(id): Path<String>) -> Response {
    let known = handle.read_state(|state| state.alloc(&id).is_some());
    match handle.client_gc(id).await {
        Ok(Ok(_)) => StatusCode::OK.into_response(),
        Ok(Err(error)) => super::ApiError::from(error).into_response(),
        // The relay failed: an allocation the servers do not hold is unknown (404); one they
        // hold whose client could not be reached is a failure (500).
        Err(error) if known == Some(true) => (StatusCode::INTERNAL_SERVER_ERROR, error.message).into_response(),
        Err(error) => (StatusCode::NOT_FOUND, error.message).into_response(),
    }
}

/// Nomad's `AllocResourceUsage` of an allocation this client runs.
pub fn alloc_stats_json(view: &ClientView, id: &str) -> Result<Value, drover_core::error::AllocCallError> {
    let Some(tasks) = view.alloc_usage(id) else {
        return Err(drover_core::error::AllocCallError::unknown_alloc(id));
    };
    let view = view.clone();
    let all: Vec<DeviceStats> = tasks.values().flat_map(|task| task.devices.clone()).collect();
    let rendered: serde_json::Map<String, Value> = tasks
        .iter()
        .map(|(name, task)| {
            let state = &task.state.state;
            (
                name.clone(),
                json!({
                    "ResourceUsage": usage(&view, task.resources.as_ref(), &task.devices),
                    "State": state.state.as_str(),
                    "Failed": state.failed,
                    "Restarts": state.restarts,
                    "Pids": task.resources.as_ref().map(|usage| {
                        usage.pids.iter().map(|pid| (pid.to_string(), json!({}))).collect::<serde_json::Map<_, _>>()
                    }),
                }),
            )
        })
        .collect();
    Ok(json!({"ResourceUsage": usage(&view, total(&tasks).as_ref(), &all), "Tasks": rendered}))
}
