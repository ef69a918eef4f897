//! Client endpoints: `GET /v1/client/allocation/:id/stats` (Nomad's `AllocResourceUsage`, with
//! what this client measures — RSS and CPU per task from its driver, device stats — and task
//! states).

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::client::{ClientView, TaskUsage};
use crate::devices::DeviceStats;
use crate::drivers::TaskResourceUsage;

pub fn router(view: ClientView) -> Router {
    Router::new()
        .route("/v1/client/allocation/{id}/stats", get(alloc_stats))
        .with_state(view)
}

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

/// Nomad's `ResourceUsage`: what is measured is listed in `Measured` (the executor-based
/// drivers measure RSS and CPU percent in user and system mode; the rest stays 0).
fn usage(resources: Option<&TaskResourceUsage>, devices: &[DeviceStats]) -> Value {
    let (memory_measured, cpu_measured) = if resources.is_some() {
        (json!(["RSS"]), json!(["System Mode", "User Mode", "Percent"]))
    } else {
        (json!([]), json!([]))
    };
    let usage = resources.cloned().unwrap_or_default();
    json!({
        "MemoryStats": {
            "RSS": usage.rss_bytes, "Cache": 0, "Swap": 0, "Usage": 0, "MaxUsage": 0,
            "Measured": memory_measured,
        },
        "CpuStats": {
            "SystemMode": usage.system_percent,
            "UserMode": usage.user_percent,
            "TotalTicks": 0.0,
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
    })
}

async fn alloc_stats(State(view): State<ClientView>, Path(id): Path<String>) -> Response {
    let Some(tasks) = view.alloc_usage(&id) else {
        return (StatusCode::NOT_FOUND, format!("Unknown allocation \"{id}\"")).into_response();
    };
    let all: Vec<DeviceStats> = tasks.values().flat_map(|task| task.devices.clone()).collect();
    let rendered: serde_json::Map<String, Value> = tasks
        .iter()
        .map(|(name, task)| {
            let state = &task.state.state;
            (
                name.clone(),
                json!({
                    "ResourceUsage": usage(task.resources.as_ref(), &task.devices),
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
    Json(json!({"ResourceUsage": usage(total(&tasks).as_ref(), &all), "Tasks": rendered})).into_response()
}
