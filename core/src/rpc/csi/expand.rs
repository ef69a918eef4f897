//! Re-running `volume create` on a registered volume updates it (Nomad's reconcile): the
//! capabilities, mount options, secrets and topology request it names, and its capacity
//! request. A minimum above the volume's capacity expands it in the plugin first:
//! `ControllerExpandVolume`, then, when the controller says nodes must expand too,
//! `NodeExpandVolume` for every claim on its node. Capacity only grows.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{CsiEndpoints, Flow};
use crate::fsm::ServerState;
use crate::humanize;
use crate::rpc::outbox::{JobId, Outbox};
use crate::rpc::{ClaimUsage, ClientCsiReply, ClientCsiRequest, ControllerExpandRequest, NodeExpandRequest, RpcError};
use crate::structs::{AccessMode, ClaimMode, CsiCapability, CsiVolume};
use crate::time::Instant;

/// The registered volume `existing` as `update` asks it to be, and whether the plugin must
/// expand it first. Fields the plugin made (external id, context, topologies) are kept.
pub(super) fn reconcile(existing: &CsiVolume, update: &CsiVolume) -> Result<(CsiVolume, bool), RpcError> {
    let immutable = [
        ("plugin ID", existing.plugin_id != update.plugin_id),
        ("name", !update.name.is_empty() && existing.name != update.name),
        ("snapshot ID", existing.snapshot_id != update.snapshot_id),
        ("clone ID", existing.clone_id != update.clone_id),
        (
            "parameters",
            !update.parameters.is_empty() && existing.parameters != update.parameters,
        ),
    ];
    if let Some((field, _)) = immutable.iter().find(|(_, changed)| *changed) {
        return Err(RpcError::invalid(format!(
            "unable to update volume: volume {field} cannot be updated"
        )));
    }
    let mut merged = existing.clone();
    merged.requested_capabilities.clone_from(&update.requested_capabilities);
    if update.mount_options.is_some() {
        merged.mount_options.clone_from(&update.mount_options);
    }
    if !update.secrets.is_empty() {
        merged.secrets.clone_from(&update.secrets);
    }
    if update.requested_topologies.is_some() {
        merged.requested_topologies.clone_from(&update.requested_topologies);
    }
    let (min, max) = (update.requested_capacity_min, update.requested_capacity_max);
    let unchanged = min == existing.requested_capacity_min && max == existing.requested_capacity_max;
    if (min == 0 && max == 0) || unchanged {
        return Ok((merged, false));
    }
    if max > 0 {
        if max < min {
            return Err(RpcError::invalid(format!(
                "unable to update volume: max requested capacity ({}) less than or equal to min ({})",
                humanize::bytes(max),
                humanize::bytes(min)
            )));
        }
        if max < existing.capacity {
            return Err(RpcError::invalid(format!(
                "unable to update volume: max requested capacity ({}) less than or equal to current ({})",
                humanize::bytes(max),
                humanize::bytes(existing.capacity)
            )));
        }
    }
    merged.requested_capacity_min = min;
    merged.requested_capacity_max = max;
    Ok((merged, min > existing.capacity))
}

/// Whether `plugin_id`'s controllers can expand volumes (Nomad's text when not).
pub(super) fn can_expand(state: &ServerState, plugin_id: &str) -> Result<(), RpcError> {
    let expands = state.plugin(plugin_id).is_some_and(|plugin| {
        plugin
            .controllers
            .values()
            .any(|info| info.controller_info.as_ref().is_some_and(|c| c.supports_expand))
    });
    if expands {
        Ok(())
    } else {
        Err(RpcError::invalid(
            "unable to update volume: expand is not implemented by this controller plugin",
        ))
    }
}

pub(super) fn expand_request(volume: &CsiVolume) -> ClientCsiRequest {
    let capability = (volume.access_mode != AccessMode::Unknown).then_some(CsiCapability {
        access_mode: volume.access_mode,
        attachment_mode: volume.attachment_mode,
    });
    ClientCsiRequest::ControllerExpand(ControllerExpandRequest {
        plugin_id: volume.plugin_id.clone(),
        external_id: volume.remote_id().to_string(),
        capacity_min: volume.requested_capacity_min,
        capacity_max: volume.requested_capacity_max,
        capability,
        secrets: volume.secrets.clone(),
    })
}

/// `NodeExpandVolume` for every live claim of `volume`, one per allocation, each to the
/// claim's node.
fn node_expand_requests(volume: &CsiVolume) -> Vec<NodeExpandRequest> {
    let claims = volume.read_claims.values().chain(volume.write_claims.values());
    claims
        .map(|claim| NodeExpandRequest {
            plugin_id: volume.plugin_id.clone(),
            node_id: claim.node_id.clone(),
            namespace: volume.namespace.clone(),
            volume_id: volume.id.clone(),
            external_id: volume.remote_id().to_string(),
            alloc_id: claim.allocation_id.clone(),
            claim: ClaimUsage {
                access_mode: claim.access_mode,
                attachment_mode: claim.attachment_mode,
                read_only: claim.mode == ClaimMode::Read,
            },
            capacity_min: volume.requested_capacity_min,
            capacity_max: volume.requested_capacity_max,
        })
        .collect()
}

impl CsiEndpoints {
    /// `ControllerExpandVolume` answered for one volume of a create job: its capacity is what
    /// the plugin says; then its nodes expand it too if the plugin needs that.
    pub(super) fn controller_expanded(
        &mut self,
        now: Instant,
        job_id: JobId,
        asked: &ControllerExpandRequest,
        (capacity, node_expansion_required): (u64, bool),
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(Flow::Create { volumes, left, .. }) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let mut node_calls = Vec::new();
        for (_, volume) in volumes
            .iter_mut()
            .filter(|(_, v)| v.plugin_id == asked.plugin_id && v.remote_id() == asked.external_id)
        {
            volume.capacity = volume.capacity.max(capacity);
            if node_expansion_required {
                node_calls.extend(node_expand_requests(volume));
            }
        }
        // A node the state no longer has holds nothing to expand.
        let calls: Vec<((String, String), NodeExpandRequest)> = node_calls
            .into_iter()
            .filter_map(|request| {
                let node = state.node(&request.node_id)?;
                Some(((request.node_id.clone(), node.rpc_addr.clone()), request))
            })
            .collect();
        *left += calls.len();
        for (target, request) in calls {
            self.call_node(now, job_id, target, ClientCsiRequest::NodeExpand(request), out);
        }
    }

    /// A node call of a create job answered (`NodeExpandVolume`).
    pub(super) fn node_expanded(
        &mut self,
        job_id: JobId,
        result: Result<ClientCsiReply, crate::error::CsiCallError>,
        out: &mut Outbox,
    ) {
        let failure = result
            .err()
            .map(|message| RpcError::unavailable(format!("unable to expand volume on node: {message}")));
        self.create_step_done(job_id, failure, out);
    }
}
