//! Nomad's `AllocResourceUsage` of an allocation this client runs: what the client measures
//! (RSS and CPU per task from its driver, what a task's cgroup accounts, device stats) and the
//! task states, as `GET /v1/client/allocation/:id/stats` answers it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{ClientView, TaskUsage};
use crate::devices::DeviceStats;
use crate::drivers::{CgroupUsage, TaskResourceUsage};

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
            .reduce(CgroupUsage::plus),
    })
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
