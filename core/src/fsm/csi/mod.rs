//! CSI tables of the state store: volumes, claims and plugins, and the derivations that keep
//! them in line with nodes, jobs and allocations (reference §3.2–§3.4); `apply_cluster` routes
//! every cluster command to its table's file (`nodes.rs`, `jobs.rs`, `allocs.rs`, here).

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};

use super::{Command, Response, ServerState, Table};
use crate::error::ErrorKind;
use crate::structs::{
    AccessMode, Allocation, ClaimState, CsiInfo, CsiPlugin, CsiVolume, CsiVolumeClaim, Job, JobType, Node,
};

/// Which half of a plugin an instance is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    Controller,
    Node,
}

impl ServerState {
    /// Applies a command to the cluster tables, routed by the table it writes.
    pub(super) fn apply_cluster(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        match command {
            Command::NodeRegister { .. }
            | Command::NodeUpdateStatus { .. }
            | Command::NodeUpdateCsiInfo { .. }
            | Command::NodeUpdateDrivers { .. }
            | Command::NodeEmitEvents { .. }
            | Command::NodeDeregister { .. }
            | Command::NodeUpdateDrain { .. }
            | Command::NodeUpdateEligibility { .. } => self.apply_node(index, at_ms, command),
            Command::JobUpsert { .. }
            | Command::JobDeregister { .. }
            | Command::JobRegister { .. }
            | Command::JobStop { .. } => self.apply_job(index, at_ms, command),
            Command::AllocUpsert { .. }
            | Command::AllocUpdateDesiredTransition { .. }
            | Command::AllocClientUpdate { .. }
            | Command::AllocClientUpdates { .. }
            | Command::AllocDelete { .. }
            | Command::PlanApply { .. }
            | Command::EvalUpsert { .. } => self.apply_alloc(index, at_ms, command),
            Command::DeploymentStatus { .. }
            | Command::DeploymentPromote { .. }
            | Command::DeploymentAllocHealth { .. }
            | Command::JobStability { .. } => self.apply_deployment(index, at_ms, command),
            Command::PeriodicLaunch { .. } => self.apply_periodic_launch(index, at_ms, command),
            Command::JobScale { .. } => self.apply_job_scale(index, at_ms, command),
            Command::SystemGc { garbage } => self.apply_gc(index, at_ms, garbage),
            Command::ReconcileSummaries => self.reconcile_summaries(index),
            Command::CsiVolumeRegister { .. }
            | Command::CsiVolumeDeregister { .. }
            | Command::CsiVolumeClaim { .. }
            | Command::CsiPluginDelete { .. } => self.apply_csi(index, at_ms, command),
            Command::SiAccessorsUpsert { .. } | Command::SiAccessorsDelete { .. } => {
                self.apply_si_accessors(index, command)
            }
            Command::Batch(_)
            | Command::LeadershipEstablished { .. }
            | Command::VariableUpsert { .. }
            | Command::VariableDelete { .. }
            | Command::VariableLock(_)
            | Command::Acl(_)
            | Command::RootKey(_)
            | Command::Namespace(_)
            | Command::AutopilotSetConfig { .. } => unreachable!("handled by apply"),
        }
    }

    /// CSI volume and plugin commands.
    pub(super) fn apply_csi(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        match command {
            Command::CsiVolumeRegister { volumes } => self.register_volumes(index, at_ms, volumes),
            Command::CsiVolumeDeregister {
                namespace,
                volume_ids,
                force,
            } => self.deregister_volumes(index, namespace, volume_ids, *force),
            Command::CsiVolumeClaim {
                namespace,
                volume_id,
                claim,
            } => self.claim_volume(index, at_ms, namespace, volume_id, claim),
            Command::CsiPluginDelete { plugin_id } => match self.plugins.get(plugin_id) {
                None => Response::Error(ErrorKind::NotFound, format!("plugin not found: {plugin_id}")),
                Some(plugin) if !plugin.is_empty() => Response::Error(ErrorKind::Refused, "plugin in use".to_string()),
                Some(_) => {
                    self.plugins.delete(plugin_id);
                    self.touch(Table::CsiPlugins, index);
                    self.touch(Table::CsiVolumes, index);
                    Response::Done
                }
            },
            other => unreachable!("{} is not routed here", other.name()),
        }
    }

    /// The volume as the API and the claim logic see it: plugin health copied from the plugin,
    /// and every current claim whose allocation is gone or client-terminal read as a past claim
    /// in state `Unpublishing` (what makes volume reaping self-healing, #10052).
    pub fn volume(&self, namespace: &str, id: &str) -> Option<CsiVolume> {
        let mut volume = self.volume_raw(namespace, id)?.clone();
        volume.plugin_health = self
            .plugins
            .get(&volume.plugin_id)
            .map(CsiPlugin::health)
            .unwrap_or_default();
        let current: Vec<CsiVolumeClaim> = volume
            .read_claims
            .values()
            .chain(volume.write_claims.values())
            .cloned()
            .collect();
        for claim in current {
            if volume.past_claims.contains_key(&claim.allocation_id) {
                continue;
            }
            let gone = self
                .allocs
                .get(&claim.allocation_id)
                .is_none_or(Allocation::client_terminal);
            if gone {
                let mut past = claim;
                past.state = ClaimState::Unpublishing;
                volume.past_claims.insert(past.allocation_id.clone(), past);
            }
        }
        Some(volume)
    }

    fn register_volumes(&mut self, index: u64, at_ms: u64, volumes: &[CsiVolume]) -> Response {
        let mut merged = Vec::new();
        for volume in volumes {
            if let Err(error) = validate_volume(volume) {
                return Response::Error(ErrorKind::Invalid, error);
            }
            if !self.plugins.contains_key(&volume.plugin_id) {
                return Response::Error(
                    ErrorKind::Invalid,
                    format!("no CSI plugin named: {} could be found", volume.plugin_id),
                );
            }
            let key = volume.key();
            let result = match self.volumes.get(&key) {
                None => {
                    let mut new = volume.clone();
                    new.read_claims.clear();
                    new.write_claims.clear();
                    new.past_claims.clear();
                    new.access_mode = AccessMode::Unknown;
                    new.attachment_mode = crate::structs::AttachmentMode::Unknown;
                    if new.topologies.is_empty() {
                        new.topologies = new
                            .requested_topologies
                            .as_ref()
                            .map(|t| t.required.clone())
                            .unwrap_or_default();
                    }
                    new.create_index = index;
                    new.create_time_ms = at_ms;
                    Ok(new)
                }
                Some(existing) => merge_volume(existing, volume),
            };
            match result {
                Ok(mut volume) => {
                    volume.modify_index = index;
                    volume.modify_time_ms = at_ms;
                    merged.push(volume);
                }
                Err(error) => return Response::Error(ErrorKind::Refused, error),
            }
        }
        for volume in merged {
            self.volumes_by_plugin
                .get_or_insert_with(volume.plugin_id.clone(), BTreeSet::new)
                .insert(volume.key());
            let old = self.volumes.get(&volume.key()).cloned();
            self.index_volume(old.as_ref(), Some(&volume));
            self.volumes.insert(volume.key(), volume);
        }
        self.touch(Table::CsiVolumes, index);
        Response::Done
    }

    fn deregister_volumes(&mut self, index: u64, namespace: &str, ids: &[String], force: bool) -> Response {
        for id in ids {
            let Some(volume) = self.volume(namespace, id) else {
                return Response::Error(ErrorKind::NotFound, "volume not found".to_string());
            };
            let recorded: BTreeSet<String> = volume
                .claimed_allocs()
                .into_iter()
                .chain(volume.past_claims.keys().cloned())
                .collect();
            if recorded.is_empty() {
                continue;
            }
            let all_terminal = recorded.iter().all(|alloc| {
                self.allocs
                    .get(alloc)
                    .is_none_or(|alloc| alloc.server_terminal() && alloc.client_terminal())
            });
            if !force || !all_terminal {
                return Response::Error(ErrorKind::Refused, format!("volume in use: {id}"));
            }
        }
        for id in ids {
            let key = (namespace.to_string(), id.clone());
            let Some(volume) = self.volumes.remove(&key) else {
                continue;
            };
            self.index_volume(Some(&volume), None);
            if let Some(keys) = self.volumes_by_plugin.get_mut(&volume.plugin_id) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.volumes_by_plugin.remove(&volume.plugin_id);
                }
            }
        }
        self.touch(Table::CsiVolumes, index);
        Response::Done
    }

    fn claim_volume(&mut self, index: u64, at_ms: u64, namespace: &str, id: &str, claim: &CsiVolumeClaim) -> Response {
        let Some(mut volume) = self.volume(namespace, id) else {
            return Response::Error(ErrorKind::NotFound, "volume not found".to_string());
        };
        let alloc = self.allocs.get(&claim.allocation_id);
        if let Err(error) = volume.claim(claim.clone(), alloc) {
            return Response::Error(error.kind(), error.to_string());
        }
        // Store only what is stored: synthesised past claims stay derived.
        let old = self.volume_raw(namespace, id).cloned();
        let stored = self
            .volumes
            .get_mut(&(namespace.to_string(), id.to_string()))
            .expect("volume exists");
        stored.access_mode = volume.access_mode;
        stored.attachment_mode = volume.attachment_mode;
        stored.read_claims = volume.read_claims.clone();
        stored.write_claims = volume.write_claims.clone();
        stored.past_claims = volume
            .past_claims
            .iter()
            .filter(|(alloc, past)| {
                past.state != ClaimState::Unpublishing
                    || stored.past_claims.contains_key(*alloc)
                    || **alloc == claim.allocation_id
            })
            .map(|(alloc, past)| (alloc.clone(), past.clone()))
            .collect();
        stored.modify_index = index;
        stored.modify_time_ms = at_ms;
        debug_assert!(
            stored.writers_max().is_none_or(|max| stored.write_claims.len() <= max),
            "volume {id} has {} writers under {:?}",
            stored.write_claims.len(),
            stored.access_mode
        );
        debug_assert!(
            stored
                .read_claims
                .keys()
                .all(|alloc| !stored.write_claims.contains_key(alloc)),
            "volume {id}: an allocation holds both a read and a write claim"
        );
        let new = self.volume_raw(namespace, id).cloned();
        self.index_volume(old.as_ref(), new.as_ref());
        self.touch(Table::CsiVolumes, index);
        let volume = self.volume(namespace, id).expect("volume exists");
        Response::Volume(Box::new(volume))
    }

    pub(super) fn alloc_changed(&mut self, index: u64, at_ms: u64, alloc: &Allocation) {
        if !alloc.server_terminal() {
            return;
        }
        // A stopped plugin allocation no longer provides its plugin on that node.
        let mut changed = false;
        let provided_here = |plugin: &CsiPlugin| {
            [&plugin.controllers, &plugin.nodes]
                .iter()
                .any(|map| map.get(&alloc.node_id).is_some_and(|info| info.alloc_id == alloc.id))
        };
        self.plugins.update_where(
            |_, plugin| provided_here(plugin),
            |_, plugin| {
                for half in [Half::Controller, Half::Node] {
                    let instances = match half {
                        Half::Controller => &plugin.controllers,
                        Half::Node => &plugin.nodes,
                    };
                    let this_alloc = instances
                        .get(&alloc.node_id)
                        .is_some_and(|info| info.alloc_id == alloc.id);
                    if this_alloc && remove_instance(plugin, half, &alloc.node_id) {
                        plugin.modify_index = index;
                        plugin.modify_time_ms = at_ms;
                        changed = true;
                    }
                }
            },
        );
        if changed {
            self.plugins.retain(|_, plugin| !plugin.is_empty());
            self.touch(Table::CsiPlugins, index);
        }
    }

    /// Nomad's `upsertCSIPluginsForNode` and node-deletion cleanup (§3.3).
    pub(super) fn update_node_plugins(&mut self, index: u64, at_ms: u64, old: Option<&Node>, new: Option<&Node>) {
        let node_id = new.or(old).map(|node| node.id.clone()).expect("a node");
        let mut changed = false;
        for half in [Half::Controller, Half::Node] {
            let pick = |node: &Node| match half {
                Half::Controller => node.csi_controller_plugins.clone(),
                Half::Node => node.csi_node_plugins.clone(),
            };
            let new_infos = new.map(pick).unwrap_or_default();
            for (plugin_id, info) in &new_infos {
                if !self.plugins.contains_key(plugin_id) {
                    if !info.healthy {
                        continue;
                    }
                    self.plugins.insert(
                        plugin_id.clone(),
                        CsiPlugin {
                            id: plugin_id.clone(),
                            create_index: index,
                            create_time_ms: at_ms,
                            ..CsiPlugin::default()
                        },
                    );
                }
                let plugin = self.plugins.get_mut(plugin_id).expect("present");
                if add_instance(plugin, half, &node_id, info) {
                    plugin.modify_index = index;
                    plugin.modify_time_ms = at_ms;
                    changed = true;
                }
            }
            let listed_here = |plugin: &CsiPlugin| {
                !new_infos.contains_key(&plugin.id)
                    && match half {
                        Half::Controller => plugin.controllers.contains_key(&node_id),
                        Half::Node => plugin.nodes.contains_key(&node_id),
                    }
            };
            self.plugins.update_where(
                |_, plugin| listed_here(plugin),
                |_, plugin| {
                    if remove_instance(plugin, half, &node_id) {
                        plugin.modify_index = index;
                        plugin.modify_time_ms = at_ms;
                        changed = true;
                    }
                },
            );
        }
        if changed {
            self.plugins.retain(|_, plugin| !plugin.is_empty());
            self.touch(Table::CsiPlugins, index);
            self.touch(Table::CsiVolumes, index);
        }
    }

    /// Expected plugin instances from one job (HEAD behaviour, §3.3): service/batch groups
    /// count their `count`; system jobs count their live allocations.
    pub(super) fn recompute_job_plugins(&mut self, index: u64, at_ms: u64, key: &(String, String)) {
        let mut expected: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        if let Some(job) = self.jobs.get(key).filter(|job| !job.stop) {
            for group in &job.task_groups {
                let count = match job.job_type {
                    JobType::Service | JobType::Batch => group.count,
                    JobType::System => self.live_allocs(job, &group.name),
                };
                for task in &group.tasks {
                    let Some(plugin) = &task.csi_plugin else {
                        continue;
                    };
                    let entry = expected.entry(plugin.id.clone()).or_default();
                    if plugin.plugin_type.is_controller() {
                        entry.0 += count;
                    }
                    if plugin.plugin_type.is_node() {
                        entry.1 += count;
                    }
                }
            }
        }
        let mut changed = false;
        self.plugins.update_where(
            |_, plugin| plugin.controller_jobs.contains_key(key) || plugin.node_jobs.contains_key(key),
            |_, plugin| {
                let had = plugin.controller_jobs.remove(key).is_some() | plugin.node_jobs.remove(key).is_some();
                changed |= had && !expected.contains_key(&plugin.id);
            },
        );
        for (plugin_id, (controllers, nodes)) in expected {
            let plugin = self.plugins.get_or_insert_with(plugin_id.clone(), || CsiPlugin {
                id: plugin_id.clone(),
                create_index: index,
                create_time_ms: at_ms,
                ..CsiPlugin::default()
            });
            if controllers > 0 {
                plugin.controller_jobs.insert(key.clone(), controllers);
            }
            if nodes > 0 {
                plugin.node_jobs.insert(key.clone(), nodes);
            }
            plugin.modify_index = index;
            plugin.modify_time_ms = at_ms;
            changed = true;
        }
        if changed {
            self.plugins.retain(|_, plugin| !plugin.is_empty());
            self.touch(Table::CsiPlugins, index);
            self.touch(Table::CsiVolumes, index);
        }
    }

    fn live_allocs(&self, job: &Job, group: &str) -> u32 {
        self.job_summary(&job.namespace, &job.id).group(group).live
    }
}

/// Nomad's `AddPlugin`: returns whether anything changed.
fn add_instance(plugin: &mut CsiPlugin, half: Half, node_id: &str, info: &CsiInfo) -> bool {
    let (map, healthy) = match half {
        Half::Controller => (&mut plugin.controllers, &mut plugin.controllers_healthy),
        Half::Node => (&mut plugin.nodes, &mut plugin.nodes_healthy),
    };
    let previous = map.get(node_id).cloned();
    if previous.as_ref().is_some_and(|prev| prev == info) {
        return false;
    }
    if previous.as_ref().is_some_and(|prev| prev.healthy) {
        *healthy -= 1;
    }
    if previous.is_some() || info.healthy {
        map.insert(node_id.to_string(), info.clone());
    }
    if info.healthy {
        *healthy += 1;
    }
    if !info.provider.is_empty() {
        plugin.provider = info.provider.clone();
        plugin.version = info.provider_version.clone();
    }
    if half == Half::Controller || info.requires_controller_plugin {
        plugin.controller_required = info.requires_controller_plugin;
    }
    true
}

/// Takes the plugin's instance on `node_id` out of `half`, with its health count; whether
/// there was one.
fn remove_instance(plugin: &mut CsiPlugin, half: Half, node_id: &str) -> bool {
    let (map, healthy) = match half {
        Half::Controller => (&mut plugin.controllers, &mut plugin.controllers_healthy),
        Half::Node => (&mut plugin.nodes, &mut plugin.nodes_healthy),
    };
    let Some(info) = map.remove(node_id) else {
        return false;
    };
    if info.healthy {
        *healthy -= 1;
    }
    true
}

/// Nomad's `CSIVolume.Validate`, every problem listed.
fn validate_volume(volume: &CsiVolume) -> Result<(), String> {
    let mut problems = Vec::new();
    if volume.id.is_empty() {
        problems.push("missing volume ID");
    }
    if volume.plugin_id.is_empty() {
        problems.push("missing plugin ID");
    }
    if volume.namespace.is_empty() {
        problems.push("missing namespace");
    }
    if volume.requested_capabilities.is_empty() {
        problems.push("must include at least one capability block");
    }
    if !volume.snapshot_id.is_empty() && !volume.clone_id.is_empty() {
        problems.push("only one of snapshot_id and clone_id is allowed");
    }
    let empty_segments = volume
        .requested_topologies
        .iter()
        .flat_map(|request| request.required.iter().chain(request.preferred.iter()))
        .any(|topology| topology.segments.is_empty());
    if empty_segments {
        problems.push("CSI Topology cannot be empty");
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("validation: {}", problems.join("; ")))
    }
}

/// Registration onto an existing volume (HEAD merge rules, §3.4).
fn merge_volume(existing: &CsiVolume, update: &CsiVolume) -> Result<CsiVolume, String> {
    let immutable = [
        ("name", existing.name != update.name && !update.name.is_empty()),
        ("external ID", existing.external_id != update.external_id),
        ("plugin ID", existing.plugin_id != update.plugin_id),
        ("clone ID", existing.clone_id != update.clone_id),
        ("snapshot ID", existing.snapshot_id != update.snapshot_id),
        (
            "parameters",
            existing.parameters != update.parameters && !update.parameters.is_empty(),
        ),
    ];
    if let Some((field, _)) = immutable.iter().find(|(_, changed)| *changed) {
        return Err(format!("volume {field} cannot be updated"));
    }
    let in_use =
        !existing.read_claims.is_empty() || !existing.write_claims.is_empty() || !existing.past_claims.is_empty();
    if in_use {
        let keeps_current = update
            .requested_capabilities
            .iter()
            .any(|cap| cap.access_mode == existing.access_mode && cap.attachment_mode == existing.attachment_mode);
        if existing.access_mode != AccessMode::Unknown && !keeps_current {
            return Err("volume requested capabilities must keep the access and attachment modes in use".to_string());
        }
        if update.mount_options.is_some() && update.mount_options != existing.mount_options {
            return Err("volume mount options cannot be updated while the volume is in use".to_string());
        }
    }
    let mut merged = existing.clone();
    merged.requested_capabilities = update.requested_capabilities.clone();
    if update.mount_options.is_some() {
        merged.mount_options = update.mount_options.clone();
    }
    merged.secrets = update.secrets.clone();
    merged.context = update.context.clone();
    merged.requested_capacity_min = update.requested_capacity_min;
    merged.requested_capacity_max = update.requested_capacity_max;
    // Capacity only grows (an expansion the plugin made).
    merged.capacity = merged.capacity.max(update.capacity);
    if update.requested_topologies.is_some() {
        merged.requested_topologies = update.requested_topologies.clone();
    }
    Ok(merged)
}

#[cfg(test)]
pub(crate) mod tests;
