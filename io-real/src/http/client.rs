//! Client endpoints: `GET /v1/client/allocation/:id/stats` (Nomad's `AllocResourceUsage`, with
//! what this client measures — device stats per task — and task states).

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

/// CPU and memory are not measured by this client yet: empty `Measured` lists say so.
fn usage(devices: &[DeviceStats]) -> Value {
    json!({
        "MemoryStats": {"RSS": 0, "Cache": 0, "Swap": 0, "Usage": 0, "MaxUsage": 0, "Measured": []},
        "CpuStats": {"SystemMode": 0.0, "UserMode": 0.0, "TotalTicks": 0.0, "Percent": 0.0, "Measured": []},
        "DeviceStats": device_groups(devices),
    })
}

async fn alloc_stats(State(view): State<ClientView>, Path(id): Path<String>) -> Response {
    let Some(tasks) = view.alloc_usage(&id) else {
        return (StatusCode::NOT_FOUND, format!("Unknown allocation \"{id}\"")).into_response();
    };
    let all: Vec<DeviceStats> = tasks.values().flat_map(|task| task.devices.clone()).collect();
    let rendered: serde_json::Map<String, Value> = tasks
        .iter()
        .map(|(name, TaskUsage { state, devices })| {
            (
                name.clone(),
                json!({
                    "ResourceUsage": usage(devices),
                    "State": state.state.state.as_str(),
                    "Failed": state.state.failed,
                    "Restarts": state.state.restarts,
                    "Pids": Value::Null,
                }),
            )
        })
        .collect();
    Json(json!({"ResourceUsage": usage(&all), "Tasks": rendered})).into_response()
}
