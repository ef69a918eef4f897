//! Nomad's JSON shapes (reference §7.3) rendered from the state store's records. Secrets are
//! never rendered; mount flags show as `["[REDACTED]"]`, as Nomad's encoder does.

use std::collections::BTreeMap;

use drover_core::fsm::ServerState;
use drover_core::structs::{
    Allocation, CsiInfo, CsiPlugin, CsiTopology, CsiVolume, CsiVolumeClaim, Deployment, Node, NodeEvent,
};
use serde_json::{Map, Value, json};

use crate::api;

/// Milliseconds since the epoch as RFC 3339 (UTC, millisecond precision).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60,
        ms % 1000
    )
}

/// Go's `time.Time` as int64 nanoseconds, as Nomad's volume and plugin times are.
pub fn nanos(ms: u64) -> i128 {
    i128::from(ms) * 1_000_000
}

fn topology(topology: &CsiTopology) -> api::CsiTopology {
    api::CsiTopology {
        segments: topology.segments.clone(),
    }
}

pub fn csi_info(info: &CsiInfo) -> Value {
    serde_json::to_value(typed_csi_info(info)).expect("a CSI fingerprint serializes")
}

fn typed_csi_info(info: &CsiInfo) -> api::CsiInfo {
    api::CsiInfo {
        plugin_id: info.plugin_id.clone(),
        alloc_id: info.alloc_id.clone(),
        healthy: info.healthy,
        health_description: info.health_description.clone(),
        update_time: rfc3339(info.update_time_ms),
        provider: info.provider.clone(),
        provider_version: info.provider_version.clone(),
        requires_controller_plugin: info.requires_controller_plugin,
        requires_topologies: info.requires_topologies,
        controller_info: info.controller_info.as_ref().map(|controller| api::CsiControllerInfo {
            supports_read_only_attach: controller.supports_read_only_attach,
            supports_attach_detach: controller.supports_attach_detach,
            supports_list_volumes: controller.supports_list_volumes,
            supports_get_capacity: controller.supports_get_capacity,
            supports_create_delete: controller.supports_create_delete,
            supports_create_delete_snapshot: controller.supports_create_delete_snapshot,
            supports_list_snapshots: controller.supports_list_snapshots,
            supports_clone: controller.supports_clone,
            supports_expand: controller.supports_expand,
            supports_list_volumes_attached_nodes: controller.supports_list_volumes_attached_nodes,
            supports_condition: controller.supports_condition,
            supports_get: controller.supports_get,
        }),
        node_info: info.node_info.as_ref().map(|node| api::CsiNodeInfo {
            id: node.id.clone(),
            max_volumes: node.max_volumes,
            accessible_topology: node.accessible_topology.as_ref().map(topology),
            requires_node_stage_volume: node.requires_node_stage_volume,
            supports_stats: node.supports_stats,
            supports_expand: node.supports_expand,
            supports_condition: node.supports_condition,
        }),
    }
}

pub fn alloc_stub(alloc: &Allocation, state: &ServerState) -> Value {
    serde_json::to_value(typed_alloc_stub(alloc, state)).expect("an allocation stub serializes")
}

fn typed_alloc_stub(alloc: &Allocation, state: &ServerState) -> api::AllocListStub {
    let node_name = state
        .node(&alloc.node_id)
        .map(|node| node.name.clone())
        .unwrap_or_default();
    let job_type = state
        .job(&alloc.namespace, &alloc.job_id)
        .map(|job| format!("{:?}", job.job_type).to_lowercase())
        .unwrap_or_default();
    api::AllocListStub {
        id: alloc.id.clone(),
        eval_id: alloc.eval_id.clone(),
        name: alloc.name.clone(),
        namespace: alloc.namespace.clone(),
        node_id: alloc.node_id.clone(),
        node_name,
        job_id: alloc.job_id.clone(),
        job_type,
        job_version: alloc.job_version,
        task_group: alloc.task_group.clone(),
        desired_status: format!("{:?}", alloc.desired_status).to_lowercase(),
        desired_description: alloc.desired_description.clone(),
        client_status: format!("{:?}", alloc.client_status).to_lowercase(),
        client_description: alloc.client_description.clone(),
        task_states: typed_task_states(alloc),
        deployment_status: alloc_deployment_status(alloc),
        followup_eval_id: String::new(),
        next_allocation: state.next_allocation(&alloc.id).unwrap_or_default().to_string(),
        reschedule_tracker: Value::Null,
        preempted_allocations: json!(alloc.preempted_allocations),
        preempted_by_allocation: String::new(),
        create_index: alloc.create_index,
        modify_index: alloc.modify_index,
        create_time: nanos_i64(alloc.create_time_ms),
        modify_time: nanos_i64(alloc.modify_time_ms),
    }
}

/// Nomad's `AllocDeploymentStatus` (null for an allocation no deployment placed).
fn alloc_deployment_status(alloc: &Allocation) -> Value {
    match &alloc.deployment_status {
        None => Value::Null,
        Some(status) => json!({
            "Healthy": status.healthy,
            "Timestamp": go_time((status.timestamp_ms as i64).saturating_mul(1_000_000)),
            "Canary": status.canary,
            "ModifyIndex": status.modify_index,
        }),
    }
}

/// Nomad's `Deployment`: durations in nanoseconds, `RequireProgressBy` a time.
pub fn deployment(deployment: &Deployment) -> Value {
    let task_groups = deployment
        .task_groups
        .iter()
        .map(|(name, state)| {
            let state = crate::api::DeploymentState {
                auto_revert: state.auto_revert,
                auto_promote: state.auto_promote,
                progress_deadline: state.progress_deadline.as_nanos() as u64,
                require_progress_by: go_time((state.require_progress_by_ms as i64).saturating_mul(1_000_000)),
                promoted: state.promoted,
                placed_canaries: (!state.placed_canaries.is_empty()).then(|| state.placed_canaries.clone()),
                desired_canaries: state.desired_canaries,
                desired_total: state.desired_total,
                placed_allocs: state.placed_allocs,
                healthy_allocs: state.healthy_allocs,
                unhealthy_allocs: state.unhealthy_allocs,
            };
            (name.clone(), state)
        })
        .collect();
    let rendered = crate::api::Deployment {
        id: deployment.id.clone(),
        namespace: deployment.namespace.clone(),
        job_id: deployment.job_id.clone(),
        job_version: deployment.job_version,
        job_modify_index: deployment.job_modify_index,
        job_spec_modify_index: deployment.job_modify_index,
        job_create_index: deployment.job_create_index,
        is_multiregion: false,
        task_groups,
        status: deployment.status.as_str().to_string(),
        status_description: deployment.status_description.clone(),
        eval_priority: deployment.eval_priority,
        create_index: deployment.create_index,
        modify_index: deployment.modify_index,
        create_time: nanos_i64(deployment.create_time_ms),
        modify_time: nanos_i64(deployment.modify_time_ms),
    };
    serde_json::to_value(rendered).expect("a deployment serializes")
}

/// Unix milliseconds as the API's Unix nanoseconds (in range until the year 2262).
fn nanos_i64(ms: u64) -> i64 {
    i64::try_from(nanos(ms)).unwrap_or(i64::MAX)
}

/// A Go `time.Time` from Unix nanoseconds; 0 is Go's zero time.
fn go_time(unix_nanos: i64) -> String {
    if unix_nanos <= 0 {
        return ZERO_TIME.to_string();
    }
    rfc3339((unix_nanos / 1_000_000) as u64)
}

/// Nomad's `TaskStates` (null until the client reported any).
#[cfg(test)]
pub fn task_states(alloc: &Allocation) -> Value {
    serde_json::to_value(typed_task_states(alloc)).expect("task states serialize")
}

/// [`task_states`] as the shared API type (`None` until the client reported).
fn typed_task_states(alloc: &Allocation) -> Option<BTreeMap<String, crate::api::TaskState>> {
    if alloc.task_states.is_empty() {
        return None;
    }
    let states = alloc
        .task_states
        .iter()
        .map(|(task, state)| {
            let state = crate::api::TaskState {
                state: state.state.as_str().into(),
                failed: state.failed,
                restarts: state.restarts,
                last_restart: go_time(state.last_restart),
                started_at: go_time(state.started_at),
                finished_at: go_time(state.finished_at),
                events: state.events.iter().map(task_event).collect(),
            };
            (task.clone(), state)
        })
        .collect();
    Some(states)
}

fn task_event(event: &drover_core::structs::TaskEvent) -> crate::api::TaskEvent {
    let detail = |key: &str| event.details.get(key).cloned().unwrap_or_default();
    let number = |key: &str| event.details.get(key).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    crate::api::TaskEvent {
        kind: event.kind.clone(),
        time: event.time,
        message: String::new(),
        display_message: event.message.clone(),
        details: event.details.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        fails_task: event.fails_task(),
        restart_reason: detail("restart_reason"),
        setup_error: detail("setup_error"),
        driver_error: detail("driver_error"),
        driver_message: detail("driver_message"),
        exit_code: number("exit_code"),
        signal: number("signal"),
        kill_error: detail("kill_error"),
        kill_reason: detail("kill_reason"),
        kill_timeout: event
            .details
            .get("kill_timeout")
            .and_then(|text| drover_core::goduration::parse_nanos(text).ok())
            .unwrap_or(0),
        start_delay: number("start_delay"),
        failed_sibling: detail("failed_sibling"),
        task_signal: detail("task_signal"),
        task_signal_reason: detail("task_signal_reason"),
        validation_error: detail("validation_error"),
        download_error: String::new(),
        vault_error: String::new(),
        disk_limit: 0,
        disk_size: 0,
        generic_source: String::new(),
    }
}

/// One allocation in full (`GET /v1/allocation/:id`), Nomad's `Allocation`, with the job as
/// it was placed (the version it runs).
pub fn alloc(alloc: &Allocation, state: &ServerState) -> Value {
    let job = state
        .job_version(&alloc.namespace, &alloc.job_id, alloc.job_version)
        .or_else(|| state.job(&alloc.namespace, &alloc.job_id))
        .map_or(Value::Null, |job| {
            let status = crate::jobs::status(state, job);
            serde_json::to_value(drover_io_real::jobs::ApiJob::from_job(job, status)).expect("a job serializes")
        });
    alloc_with_job(alloc, state, job)
}

/// [`alloc`] with `Job` null, as Nomad's allocation events carry it (to keep them small).
pub fn alloc_without_job(alloc: &Allocation, state: &ServerState) -> Value {
    alloc_with_job(alloc, state, Value::Null)
}

/// The stub's fields but the job's type and version, what only the full object carries, and
/// `job`.
fn alloc_with_job(alloc: &Allocation, state: &ServerState, job: Value) -> Value {
    let mut value = alloc_stub(alloc, state);
    if let Value::Object(map) = &mut value {
        map.remove("JobType");
        map.remove("JobVersion");
        let fields = [
            ("Job", job),
            ("Resources", Value::Null),
            ("TaskResources", Value::Null),
            ("AllocatedResources", allocated_resources(alloc, state)),
            ("Services", Value::Null),
            (
                "Metrics",
                alloc
                    .metrics
                    .as_ref()
                    .map_or(Value::Null, |metric| json!(crate::jobs_metric(metric))),
            ),
            (
                "DesiredTransition",
                json!({
                    "Migrate": alloc.desired_transition.migrate.then_some(true),
                    "Reschedule": Value::Null,
                    "ForceReschedule": Value::Null,
                }),
            ),
            ("DeploymentID", json!(alloc.deployment_id)),
            (
                "PreviousAllocation",
                Value::String(alloc.previous_allocation.clone().unwrap_or_default()),
            ),
            ("NetworkStatus", Value::Null),
            ("AllocModifyIndex", json!(alloc.modify_index)),
        ];
        for (key, field) in fields {
            map.insert(key.into(), field);
        }
    }
    value
}

/// Nomad's `AllocatedResources`: per task CPU, memory and own networks; the group network's
/// ports under `Shared`; the sums under `Total`.
pub fn allocated_resources(alloc: &Allocation, state: &ServerState) -> Value {
    use drover_io_real::jobs::{ApiNetworkResource, ApiPortMapping};
    // The job version the allocation runs: its ports were assigned from that one's networks.
    let job = state
        .job_versions(&alloc.namespace, &alloc.job_id)
        .into_iter()
        .find(|job| job.version == alloc.job_version)
        .or_else(|| state.job(&alloc.namespace, &alloc.job_id));
    let group = job.and_then(|job| job.task_groups.iter().find(|group| group.name == alloc.task_group));
    let tasks: Map<String, Value> =
        group
            .map(|group| {
                group
                .tasks
                .iter()
                .map(|task| {
                    let ports = alloc.resources.task_ports.get(&task.name).map_or(&[][..], Vec::as_slice);
                    let cores = alloc.resources.task_cores.get(&task.name).map_or(&[][..], Vec::as_slice);
                    // Reserved cores are their share of the node's MHz, as the scheduler counted.
                    let shares = match state.node(&alloc.node_id) {
                        Some(node) if !cores.is_empty() => {
                            cores.len() as u64 * node.mhz_per_core()
                        }
                        _ => u64::from(task.resources.cpu),
                    };
                    let value = json!({
                        "Cpu": {"CpuShares": shares, "ReservedCores": cores},
                        "Memory": {"MemoryMB": task.resources.memory_mb, "MemoryMaxMB": task.resources.memory_max_mb},
                        "Networks": ApiNetworkResource::allocated(&task.resources.networks, ports),
                    });
                    (task.name.clone(), value)
                })
                .collect()
            })
            .unwrap_or_default();
    let shared_networks = group.map_or_else(Vec::new, |group| {
        ApiNetworkResource::allocated(&group.networks, &alloc.resources.ports)
    });
    json!({
        "Shared": {
            "Ports": alloc.resources.ports.iter().map(ApiPortMapping::from_port).collect::<Vec<_>>(),
            "Networks": shared_networks,
            "DiskMB": alloc.resources.disk_mb,
        },
        "Tasks": tasks,
        "Total": {
            "Cpu": {"CpuShares": alloc.resources.cpu},
            "Memory": {"MemoryMB": alloc.resources.memory_mb},
        },
    })
}

fn claim(claim: &CsiVolumeClaim) -> api::CsiVolumeClaim {
    api::CsiVolumeClaim {
        allocation_id: claim.allocation_id.clone(),
        node_id: claim.node_id.clone(),
        external_node_id: claim.external_node_id.clone(),
        mode: claim.mode.as_int(),
        access_mode: claim.access_mode.as_str().into(),
        attachment_mode: claim.attachment_mode.as_str().into(),
        state: claim.state.as_int(),
    }
}

fn claims(claims: &BTreeMap<String, CsiVolumeClaim>) -> BTreeMap<String, api::CsiVolumeClaim> {
    claims
        .iter()
        .map(|(alloc, held)| (alloc.clone(), claim(held)))
        .collect()
}

pub fn volume_stub(volume: &CsiVolume) -> Value {
    let health = &volume.plugin_health;
    // Nomad's list stub names the provider but not its version.
    let stub = api::CsiVolumeListStub {
        id: volume.id.clone(),
        namespace: volume.namespace.clone(),
        name: volume.name.clone(),
        external_id: volume.external_id.clone(),
        topologies: volume.topologies.iter().map(topology).collect(),
        access_mode: volume.access_mode.as_str().into(),
        attachment_mode: volume.attachment_mode.as_str().into(),
        current_readers: volume.read_claims.len() as u64,
        current_writers: volume.write_claims.len() as u64,
        schedulable: health.schedulable,
        plugin_id: volume.plugin_id.clone(),
        provider: health.provider.clone(),
        controller_required: health.controller_required,
        controllers_healthy: health.controllers_healthy,
        controllers_expected: health.controllers_expected,
        nodes_healthy: health.nodes_healthy,
        nodes_expected: health.nodes_expected,
        // Go's zero time: exhaustion is not tracked.
        resource_exhausted: ZERO_TIME.into(),
        create_index: volume.create_index,
        modify_index: volume.modify_index,
        create_time: nanos_i64(volume.create_time_ms),
        modify_time: nanos_i64(volume.modify_time_ms),
    };
    serde_json::to_value(stub).expect("a volume stub serializes")
}

/// The full volume (`GET /v1/volume/csi/:id`), denormalised, secrets removed.
pub fn volume(volume: &CsiVolume, state: &ServerState) -> Value {
    let health = &volume.plugin_health;
    let allocs = |claims: &BTreeMap<String, CsiVolumeClaim>| claims.keys().map(|alloc| (alloc.clone(), ())).collect();
    let full = api::CsiVolume {
        id: volume.id.clone(),
        name: volume.name.clone(),
        external_id: volume.external_id.clone(),
        namespace: volume.namespace.clone(),
        plugin_id: volume.plugin_id.clone(),
        access_mode: volume.access_mode.as_str().into(),
        attachment_mode: volume.attachment_mode.as_str().into(),
        requested_capabilities: volume
            .requested_capabilities
            .iter()
            .map(|cap| api::CsiCapability {
                access_mode: cap.access_mode.as_str().into(),
                attachment_mode: cap.attachment_mode.as_str().into(),
            })
            .collect(),
        mount_options: volume.mount_options.as_ref().map(|options| api::CsiMountOptions {
            fs_type: options.fs_type.clone(),
            mount_flags: if options.mount_flags.is_empty() {
                Vec::new()
            } else {
                vec!["[REDACTED]".into()]
            },
        }),
        parameters: volume.parameters.clone(),
        context: volume.context.clone(),
        topologies: volume.topologies.iter().map(topology).collect(),
        requested_topologies: volume
            .requested_topologies
            .as_ref()
            .map(|request| api::CsiTopologyRequest {
                required: request.required.iter().map(topology).collect(),
                preferred: request.preferred.iter().map(topology).collect(),
            }),
        capacity: volume.capacity,
        requested_capacity_min: volume.requested_capacity_min,
        requested_capacity_max: volume.requested_capacity_max,
        snapshot_id: volume.snapshot_id.clone(),
        clone_id: volume.clone_id.clone(),
        read_allocs: allocs(&volume.read_claims),
        write_allocs: allocs(&volume.write_claims),
        read_claims: claims(&volume.read_claims),
        write_claims: claims(&volume.write_claims),
        past_claims: claims(&volume.past_claims),
        allocations: volume
            .read_claims
            .keys()
            .chain(volume.write_claims.keys())
            .filter_map(|id| state.alloc(id))
            .map(|alloc| typed_alloc_stub(alloc, state))
            .collect(),
        schedulable: health.schedulable,
        provider: health.provider.clone(),
        provider_version: health.provider_version.clone(),
        controller_required: health.controller_required,
        controllers_healthy: health.controllers_healthy,
        controllers_expected: health.controllers_expected,
        nodes_healthy: health.nodes_healthy,
        nodes_expected: health.nodes_expected,
        // Go's zero time: exhaustion is not tracked.
        resource_exhausted: ZERO_TIME.into(),
        create_index: volume.create_index,
        modify_index: volume.modify_index,
        create_time: nanos_i64(volume.create_time_ms),
        modify_time: nanos_i64(volume.modify_time_ms),
    };
    serde_json::to_value(full).expect("a volume serializes")
}

pub fn plugin_stub(plugin: &CsiPlugin) -> Value {
    let stub = api::CsiPluginListStub {
        id: plugin.id.clone(),
        provider: plugin.provider.clone(),
        controller_required: plugin.controller_required,
        controllers_healthy: plugin.controllers_healthy,
        controllers_expected: plugin.controllers_expected(),
        nodes_healthy: plugin.nodes_healthy,
        nodes_expected: plugin.nodes_expected(),
        create_index: plugin.create_index,
        modify_index: plugin.modify_index,
    };
    serde_json::to_value(stub).expect("a plugin stub serializes")
}

pub fn plugin(plugin: &CsiPlugin, state: &ServerState) -> Value {
    let instances = |by_node: &BTreeMap<String, CsiInfo>| {
        by_node
            .iter()
            .map(|(node, info)| (node.clone(), typed_csi_info(info)))
            .collect()
    };
    let full = api::CsiPlugin {
        id: plugin.id.clone(),
        provider: plugin.provider.clone(),
        version: plugin.version.clone(),
        controller_required: plugin.controller_required,
        controllers: instances(&plugin.controllers),
        nodes: instances(&plugin.nodes),
        allocations: plugin
            .controllers
            .values()
            .chain(plugin.nodes.values())
            .map(|info| info.alloc_id.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .iter()
            .filter_map(|id| state.alloc(id))
            .map(|alloc| typed_alloc_stub(alloc, state))
            .collect(),
        controllers_healthy: plugin.controllers_healthy,
        controllers_expected: plugin.controllers_expected(),
        nodes_healthy: plugin.nodes_healthy,
        nodes_expected: plugin.nodes_expected(),
        create_index: plugin.create_index,
        modify_index: plugin.modify_index,
        create_time: nanos_i64(plugin.create_time_ms),
        modify_time: nanos_i64(plugin.modify_time_ms),
    };
    serde_json::to_value(full).expect("a plugin serializes")
}

fn event(event: &NodeEvent) -> Value {
    json!({
        "Message": event.message,
        "Subsystem": event.subsystem,
        "Details": event.details,
        "Timestamp": rfc3339(event.timestamp_ms),
        "CreateIndex": event.create_index,
    })
}

fn drivers(node: &Node) -> BTreeMap<String, crate::api::DriverInfo> {
    node.drivers
        .iter()
        .map(|(name, info)| {
            let info = crate::api::DriverInfo {
                attributes: info.attributes.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                detected: info.detected,
                healthy: info.healthy,
                health_description: info.health_description.clone(),
                // When the servers last saw its fingerprint change (Go's zero time for a
                // node stored before that was kept).
                update_time: if info.update_time_ms == 0 {
                    ZERO_TIME.to_string()
                } else {
                    rfc3339(info.update_time_ms)
                },
            };
            (name.clone(), info)
        })
        .collect()
}

fn host_volumes(node: &Node) -> Map<String, Value> {
    node.host_volumes
        .iter()
        .map(|(name, volume)| {
            (
                name.clone(),
                json!({ "Name": name, "Path": volume.path, "ReadOnly": volume.read_only }),
            )
        })
        .collect()
}

/// Go's zero `time.Time`, which Nomad renders for an unset deadline.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

fn drain_strategy(node: &Node) -> Value {
    let Some(strategy) = &node.drain_strategy else {
        return Value::Null;
    };
    json!({
        "DrainSpec": {
            "Deadline": strategy.deadline_ns,
            "IgnoreSystemJobs": strategy.ignore_system_jobs,
        },
        "ForceDeadline": strategy.force_deadline_ms.map_or(ZERO_TIME.to_string(), rfc3339),
        "StartedAt": rfc3339(strategy.started_at_ms),
    })
}

fn last_drain(node: &Node) -> Option<crate::api::DrainMetadata> {
    let last = node.last_drain.as_ref()?;
    Some(crate::api::DrainMetadata {
        started_at: rfc3339(last.started_at_ms),
        updated_at: rfc3339(last.updated_at_ms),
        status: last.status.as_str().to_string(),
        accessor_id: String::new(),
        meta: Value::Null,
    })
}

pub fn node_stub(node: &Node) -> Value {
    let stub = crate::api::NodeListStub {
        id: node.id.clone(),
        datacenter: node.datacenter.clone(),
        name: node.name.clone(),
        node_class: node.node_class.clone(),
        node_pool: "default".into(),
        // Nomad's stub carries the node's agent version, its `nomad.version` attribute.
        version: node.attributes.get("nomad.version").cloned().unwrap_or_default(),
        drain: node.drain_strategy.is_some(),
        scheduling_eligibility: node.scheduling_eligibility.as_str().into(),
        status: node.status.as_str().into(),
        status_description: node.status_description.clone(),
        last_drain: last_drain(node),
        drivers: drivers(node),
        host_volumes: Value::Object(host_volumes(node)),
        address: node.http_addr.split(':').next().unwrap_or_default().into(),
        create_index: node.create_index,
        modify_index: node.modify_index,
    };
    serde_json::to_value(stub).expect("a node stub serializes")
}

/// [`node_stub`] with the node's resources (`?resources=true`), as Nomad's stub carries them.
pub fn node_stub_with_resources(node: &Node) -> Value {
    let mut stub = node_stub(node);
    let full = self::node(node);
    stub["NodeResources"] = full["NodeResources"].clone();
    stub["ReservedResources"] = full["ReservedResources"].clone();
    stub
}

pub fn node(node: &Node) -> Value {
    json!({
        "ID": node.id,
        "Datacenter": node.datacenter,
        "Name": node.name,
        "HTTPAddr": node.http_addr,
        "TLSEnabled": false,
        "Attributes": node.attributes,
        "Meta": node.meta,
        "Links": Value::Null,
        "CgroupParent": drover_host::drivers::cgroup::PARENT,
        "HostNetworks": Value::Null,
        "NodeResources": {
            "Cpu": {"CpuShares": node.resources.cpu},
            "Memory": {"MemoryMB": node.resources.memory_mb},
            "Disk": {"DiskMB": node.resources.disk_mb},
            "Networks": node.resources.networks.iter().map(drover_io_real::jobs::ApiNetworkResource::node).collect::<Vec<_>>(),
            "MinDynamicPort": *node.resources.dynamic_range().start(),
            "MaxDynamicPort": *node.resources.dynamic_range().end(),
        },
        "ReservedResources": {
            "Networks": {
                "ReservedHostPorts": drover_core::structs::format_port_ranges(&node.resources.reserved_ports),
            },
        },
        "NodeClass": node.node_class,
        "NodePool": "default",
        "Drain": node.drain_strategy.is_some(),
        "DrainStrategy": drain_strategy(node),
        "LastDrain": last_drain(node),
        "SchedulingEligibility": node.scheduling_eligibility.as_str(),
        "Status": node.status.as_str(),
        "StatusDescription": node.status_description,
        "StatusUpdatedAt": node.status_updated_at_ms / 1000,
        "Events": node.events.iter().map(event).collect::<Vec<_>>(),
        "Drivers": drivers(node),
        "HostVolumes": host_volumes(node),
        "CSIControllerPlugins": node.csi_controller_plugins.iter().map(|(id, info)| (id.clone(), csi_info(info))).collect::<Map<_, _>>(),
        "CSINodePlugins": node.csi_node_plugins.iter().map(|(id, info)| (id.clone(), csi_info(info))).collect::<Map<_, _>>(),
        "CreateIndex": node.create_index,
        "ModifyIndex": node.modify_index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server renders is what the shared API types read back, field for field (the
    /// CLI reads these types): nothing a render adds is lost to the type, nothing is renamed.
    #[test]
    fn rendered_stubs_round_trip_through_the_shared_api_types() {
        use crate::api::assert_round_trips as round_trips;
        let state = ServerState::default();
        let mut alloc = Allocation {
            id: "a1".into(),
            job_id: "web".into(),
            create_time_ms: 1_795_309_296_985,
            ..Allocation::default()
        };
        alloc.preempted_allocations = vec!["a0".into()];
        round_trips::<crate::api::AllocListStub>(alloc_stub(&alloc, &state));
        let mut node = Node {
            id: "n1".into(),
            http_addr: "10.0.0.1:4646".into(),
            ..Node::default()
        };
        node.drivers.insert("raw_exec".into(), Default::default());
        node.last_drain = Some(Default::default());
        round_trips::<crate::api::NodeListStub>(node_stub(&node));
        let mut deployment = Deployment {
            id: "d1".into(),
            ..Deployment::default()
        };
        deployment.task_groups.insert("g".into(), Default::default());
        round_trips::<crate::api::Deployment>(self::deployment(&deployment));

        let claim = CsiVolumeClaim {
            allocation_id: "a1".into(),
            node_id: "n1".into(),
            external_node_id: "host-1".into(),
            mode: drover_core::structs::ClaimMode::Write,
            access_mode: drover_core::structs::AccessMode::SingleNodeWriter,
            attachment_mode: drover_core::structs::AttachmentMode::FileSystem,
            state: drover_core::structs::ClaimState::Taken,
        };
        let rack = CsiTopology {
            segments: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
        };
        let mut volume = CsiVolume {
            id: "v1".into(),
            mount_options: Some(drover_core::structs::CsiMountOptions {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
            }),
            topologies: vec![rack.clone()],
            requested_topologies: Some(drover_core::structs::CsiTopologyRequest {
                required: vec![rack.clone()],
                preferred: Vec::new(),
            }),
            ..CsiVolume::default()
        };
        volume.write_claims.insert("a1".into(), claim.clone());
        volume.past_claims.insert("a0".into(), claim);
        round_trips::<crate::api::CsiVolumeListStub>(volume_stub(&volume));
        round_trips::<crate::api::CsiVolume>(self::volume(&volume, &state));
        let mut plugin = CsiPlugin {
            id: "hostpath".into(),
            controller_required: true,
            ..CsiPlugin::default()
        };
        plugin.controllers.insert(
            "n1".into(),
            CsiInfo {
                controller_info: Some(Default::default()),
                ..CsiInfo::default()
            },
        );
        plugin.nodes.insert(
            "n1".into(),
            CsiInfo {
                node_info: Some(drover_core::structs::CsiNodeInfo {
                    accessible_topology: Some(rack),
                    ..Default::default()
                }),
                ..CsiInfo::default()
            },
        );
        round_trips::<crate::api::CsiPluginListStub>(plugin_stub(&plugin));
        round_trips::<crate::api::CsiPlugin>(self::plugin(&plugin, &state));
    }

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_309_296_985), "2026-11-22T01:01:36.985Z");
    }

    #[test]
    fn task_states_render_in_nomads_shape() {
        use drover_core::structs::{TaskEvent, TaskState, TaskStatus};
        let mut alloc = Allocation::default();
        assert_eq!(task_states(&alloc), Value::Null, "null until the client reported");
        let exited = TaskEvent {
            kind: "Terminated".into(),
            message: "Exit Code: 3".into(),
            time: 1_795_309_296_985_000_000,
            details: [("exit_code", "3"), ("signal", "0"), ("oom_killed", "false")]
                .into_iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
        };
        alloc.task_states.insert(
            "web".into(),
            TaskState {
                state: TaskStatus::Dead,
                failed: true,
                restarts: 2,
                started_at: 1_795_309_290_000_000_000,
                finished_at: 1_795_309_296_985_000_000,
                events: vec![exited],
                ..TaskState::default()
            },
        );
        let web = &task_states(&alloc)["web"];
        assert_eq!(web["State"], "dead");
        assert_eq!(web["Failed"], true);
        assert_eq!(web["Restarts"], 2);
        assert_eq!(web["StartedAt"], "2026-11-22T01:01:30.000Z");
        assert_eq!(web["FinishedAt"], "2026-11-22T01:01:36.985Z");
        assert_eq!(web["LastRestart"], ZERO_TIME, "Go's zero time, never 1970");
        let event = &web["Events"][0];
        assert_eq!(event["Type"], "Terminated");
        assert_eq!(event["Time"], 1_795_309_296_985_000_000i64);
        assert_eq!(event["DisplayMessage"], "Exit Code: 3");
        assert_eq!(event["Details"]["exit_code"], "3");
        assert_eq!(event["ExitCode"], 3, "the flat field Nomad fills from the detail");
        assert_eq!(event["FailsTask"], false);
    }
}
