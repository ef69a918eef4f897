//! `CSIVolume.Create` and `CSIVolume.Delete`: volumes made and removed by the plugin's
//! controller through a client, then registered or deregistered through Raft.
//!
//! A create names the plugin's volume after the volume's name (Nomad's), the CSI idempotency
//! key: a leader that dies between `ControllerCreateVolume` and the Raft commit leaves a
//! volume in the plugin but none in the state, and the operator's retry (or the CLI's) gets
//! that same volume back from the plugin, never a second one.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{CsiEndpoints, Flow, expand};
use crate::fsm::{Command, ServerState, Table};
use crate::rpc::outbox::{JobId, Outbox, Owner};
use crate::rpc::{
    ClientCsiReply, ClientCsiRequest, ControllerCreateRequest, ControllerDeleteRequest, ReqId, RpcError, ServerReply,
};
use crate::structs::{CsiVolume, Secrets};
use crate::time::Instant;

/// Whether `plugin_id` has a controller that creates and deletes volumes, or why not.
fn creates_volumes(state: &ServerState, plugin_id: &str) -> Result<(), RpcError> {
    let plugin = state
        .plugin(plugin_id)
        .ok_or_else(|| RpcError::not_found(format!("CSI plugin {plugin_id:?} not found")))?;
    if !plugin.controller_required {
        return Err(RpcError::invalid(format!(
            "CSI plugin {plugin_id:?} has no controller to create or delete volumes"
        )));
    }
    let supports = plugin
        .controllers
        .values()
        .any(|info| info.controller_info.as_ref().is_some_and(|c| c.supports_create_delete));
    if supports {
        Ok(())
    } else {
        Err(RpcError::invalid(format!(
            "CSI plugin {plugin_id:?} does not support creating or deleting volumes (CREATE_DELETE_VOLUME)"
        )))
    }
}

/// The name the plugin's volume is asked for: the volume's name, the idempotency key; with the
/// regression switch, the request's time too.
fn plugin_volume_name(volume: &CsiVolume, name_per_request: Option<Instant>) -> String {
    match name_per_request {
        Some(now) => format!("{}-{}", volume.name, now.as_nanos()),
        None => volume.name.clone(),
    }
}

fn create_request(volume: &CsiVolume, name: String) -> ClientCsiRequest {
    ClientCsiRequest::ControllerCreate(alloc::boxed::Box::new(ControllerCreateRequest {
        plugin_id: volume.plugin_id.clone(),
        name,
        capacity_min: volume.requested_capacity_min,
        capacity_max: volume.requested_capacity_max,
        capabilities: volume.requested_capabilities.clone(),
        mount_options: volume.mount_options.clone(),
        parameters: volume.parameters.clone(),
        secrets: volume.secrets.clone(),
        snapshot_id: volume.snapshot_id.clone(),
        clone_id: volume.clone_id.clone(),
        topology: volume.requested_topologies.clone(),
    }))
}

impl CsiEndpoints {
    pub(super) fn create(
        &mut self,
        now: Instant,
        req: ReqId,
        volumes: Vec<CsiVolume>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let checked = volumes.iter().try_for_each(|volume| {
            if volume.requested_capabilities.is_empty() {
                return Err(RpcError::invalid(format!(
                    "volume {:?}: at least one capability is required to create a volume",
                    volume.id
                )));
            }
            if !volume.snapshot_id.is_empty() && !volume.clone_id.is_empty() {
                return Err(RpcError::invalid(format!(
                    "volume {:?}: only one of snapshot_id and clone_id may be set",
                    volume.id
                )));
            }
            if volume.requested_capacity_max != 0 && volume.requested_capacity_max < volume.requested_capacity_min {
                return Err(RpcError::invalid(format!(
                    "volume {:?}: capacity_max is less than capacity_min",
                    volume.id
                )));
            }
            creates_volumes(state, &volume.plugin_id)
        });
        if let Err(error) = checked {
            out.reply(req, ServerReply::Error(error));
            return;
        }
        let per_request = self.faults.create_name_per_request.then_some(now);
        let mut wanted: Vec<(String, CsiVolume)> = Vec::new();
        let mut requests: Vec<ClientCsiRequest> = Vec::new();
        for volume in volumes {
            // A registered volume is not made again: re-running `volume create` updates it,
            // and expands it when its new minimum is above its capacity.
            if let Some(existing) = state.volume(&volume.namespace, &volume.id) {
                let (merged, expand) = match expand::reconcile(&existing, &volume) {
                    Ok(done) => done,
                    Err(error) => return out.reply(req, ServerReply::Error(error)),
                };
                if expand {
                    if let Err(error) = expand::can_expand(state, &merged.plugin_id) {
                        return out.reply(req, ServerReply::Error(error));
                    }
                    requests.push(expand::expand_request(&merged));
                }
                if merged != existing {
                    wanted.push((merged.name.clone(), merged));
                }
                continue;
            }
            let name = plugin_volume_name(&volume, per_request);
            requests.push(create_request(&volume, name.clone()));
            wanted.push((name, volume));
        }
        if wanted.is_empty() {
            let index = state.table_index(Table::CsiVolumes);
            out.reply(req, ServerReply::Done { index });
            return;
        }
        let job = self.new_job(
            out,
            Flow::Create {
                req,
                volumes: wanted,
                left: requests.len(),
                failure: None,
            },
        );
        if requests.is_empty() {
            self.register_created(job, out);
        }
        for request in requests {
            self.enqueue_controller(now, job, request, state, out);
        }
    }

    pub(super) fn delete(
        &mut self,
        now: Instant,
        req: ReqId,
        (namespace, volume_id): (String, String),
        secrets: Secrets,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(volume) = state.volume(&namespace, &volume_id) else {
            out.reply(
                req,
                ServerReply::Error(RpcError::not_found(format!("volume not found: {volume_id}"))),
            );
            return;
        };
        if !volume.claimed_allocs().is_empty() {
            out.reply(
                req,
                ServerReply::Error(RpcError::invalid(format!(
                    "volume in use: {volume_id} is claimed by {} allocations",
                    volume.claimed_allocs().len()
                ))),
            );
            return;
        }
        if let Err(error) = creates_volumes(state, &volume.plugin_id) {
            out.reply(req, ServerReply::Error(error));
            return;
        }
        let request = ClientCsiRequest::ControllerDelete(ControllerDeleteRequest {
            plugin_id: volume.plugin_id.clone(),
            external_id: volume.remote_id().to_string(),
            secrets: if secrets.is_empty() {
                volume.secrets.clone()
            } else {
                secrets
            },
        });
        let job = self.new_job(
            out,
            Flow::Delete {
                req,
                namespace,
                volume_id,
            },
        );
        self.enqueue_controller(now, job, request, state, out);
    }

    /// One controller call of a create job answered (`ControllerCreateVolume`: the volume
    /// takes what the plugin made; `ControllerExpandVolume`: its new capacity, and maybe node
    /// calls). Once all are answered the volumes are registered in one Raft entry.
    pub(super) fn create_done(
        &mut self,
        now: Instant,
        job_id: JobId,
        request: &ClientCsiRequest,
        result: Result<ClientCsiReply, RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(Flow::Create { volumes, .. }) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let failure = match (request, result) {
            (
                ClientCsiRequest::ControllerCreate(asked),
                Ok(ClientCsiReply::Created {
                    external_id,
                    capacity,
                    context,
                    topologies,
                }),
            ) => {
                for (_, volume) in volumes
                    .iter_mut()
                    .filter(|(name, v)| *name == asked.name && v.plugin_id == asked.plugin_id)
                {
                    volume.external_id.clone_from(&external_id);
                    volume.capacity = capacity;
                    volume.context.clone_from(&context);
                    volume.topologies.clone_from(&topologies);
                }
                None
            }
            (
                ClientCsiRequest::ControllerExpand(asked),
                Ok(ClientCsiReply::Expanded {
                    capacity,
                    node_expansion_required,
                }),
            ) => {
                self.controller_expanded(now, job_id, asked, (capacity, node_expansion_required), state, out);
                None
            }
            (ClientCsiRequest::ControllerExpand(_), Err(error)) => Some(RpcError::from_plugin(
                format!("unable to update volume: unable to expand volume: {}", error.message),
                error.retryable,
            )),
            (_, Err(error)) => Some(RpcError::from_plugin(
                format!("controller create volume: {}", error.message),
                error.retryable,
            )),
            (_, Ok(other)) => Some(RpcError::unavailable(format!(
                "controller create volume: unexpected answer {other:?}"
            ))),
        };
        self.create_step_done(job_id, failure, out);
    }

    /// One call of a create job is over (`failure` when it failed): when none is left, the
    /// caller gets the first failure, or the volumes are registered.
    pub(super) fn create_step_done(&mut self, job_id: JobId, failure: Option<RpcError>, out: &mut Outbox) {
        let Some(Flow::Create {
            req,
            left,
            failure: first,
            ..
        }) = self.jobs.get_mut(&job_id)
        else {
            return;
        };
        *left -= 1;
        if let Some(failure) = failure {
            first.get_or_insert(failure);
        }
        if *left > 0 {
            return;
        }
        let req = *req;
        if let Some(error) = first.take() {
            self.jobs.remove(&job_id);
            out.reply(req, ServerReply::Error(error));
            return;
        }
        self.register_created(job_id, out);
    }

    /// Every plugin call of a create job succeeded: its volumes go to Raft.
    fn register_created(&mut self, job_id: JobId, out: &mut Outbox) {
        let Some(Flow::Create { volumes, .. }) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let mut volumes: Vec<CsiVolume> = core::mem::take(volumes).into_iter().map(|(_, volume)| volume).collect();
        if self.faults.create_drops_topology {
            for volume in &mut volumes {
                volume.topologies.clear();
                volume.requested_topologies = None;
            }
        }
        out.propose(job_id, Owner::Csi, Command::CsiVolumeRegister { volumes });
    }

    /// `ControllerDeleteVolume` answered: the volume is deregistered.
    pub(super) fn delete_done(&mut self, job_id: JobId, result: Result<ClientCsiReply, RpcError>, out: &mut Outbox) {
        let Some(Flow::Delete {
            req,
            namespace,
            volume_id,
        }) = self.jobs.get(&job_id)
        else {
            return;
        };
        match result {
            Ok(_) => {
                let command = Command::CsiVolumeDeregister {
                    namespace: namespace.clone(),
                    volume_ids: vec![volume_id.clone()],
                    force: false,
                };
                out.propose(job_id, Owner::Csi, command);
            }
            Err(error) => {
                let req = *req;
                self.jobs.remove(&job_id);
                let error =
                    RpcError::from_plugin(format!("controller delete volume: {}", error.message), error.retryable);
                out.reply(req, ServerReply::Error(error));
            }
        }
    }
}
