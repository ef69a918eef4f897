//! `CSIVolume.*` and `CSIPlugin.*` on the leader: the flows that call clients, their
//! controller queues, and the volume watcher that releases claims nobody released.
//!
//! - `VolumeRegister`: `ControllerValidateVolume` for plugins with a controller, then commit.
//! - `VolumeClaim`: commit the claim, then for a new claim on a plugin with attach/detach,
//!   `ControllerAttachVolume` and answer with the publish context.
//! - `VolumeUnpublish`: the checkpointed walk of [`crate::csi::unpublish`]; concurrent requests
//!   for the same claim share one walk.
//! - `VolumeDetach`: unpublish every claim of the volume on one node.
//!
//! Controller RPCs are serialised per plugin (at most one in flight) and try healthy
//! controllers in sorted order, moving on after retryable errors (§3.7). Every client call has
//! a deadline owned here.

#[allow(unused_imports)]
use crate::prelude::*;

mod controllers;
mod create;
mod expand;
mod flows;
mod snapshots;

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use core::time::Duration;

use super::outbox::{JobId, Outbox, Owner};
use super::{
    Action, ClientCsiReply, ClientCsiRequest, ControllerAttachRequest, ControllerValidateRequest, RETRYABLE_PREFIX,
    ReqId, RpcError, ServerReply, ServerRequest,
};
use crate::csi::routing::ControllerTarget;
use crate::csi::watcher::{GcConfig, VolumeWatcher, WatcherAction};
use crate::fsm::{Command, Response, ServerState};
use crate::op::OpId;
use crate::structs::{AccessMode, AttachmentMode, ClaimMode, ClaimState, CsiVolume, CsiVolumeClaim};
use crate::time::Instant;

pub(super) type ClaimKey = (String, String, String);

#[derive(Debug)]
enum Flow {
    /// Propose one command nobody waits for (GC jobs).
    Internal,
    Register {
        req: ReqId,
        volumes: Vec<CsiVolume>,
        validations_left: usize,
    },
    Claim {
        req: ReqId,
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
        index: u64,
        volume: Option<alloc::boxed::Box<CsiVolume>>,
    },
    Unpublish {
        key: ClaimKey,
        claim: CsiVolumeClaim,
        waiters: Vec<Waiter>,
    },
    Detach {
        req: ReqId,
        left: usize,
        error: Option<RpcError>,
    },
    /// `ControllerCreateVolume` per volume (`left` to answer), then one register. Each volume
    /// with the name its plugin volume was asked for.
    Create {
        req: ReqId,
        volumes: Vec<(String, CsiVolume)>,
        left: usize,
        failure: Option<RpcError>,
    },
    /// `ControllerDeleteVolume`, then the deregister.
    Delete {
        req: ReqId,
        namespace: String,
        volume_id: String,
    },
    /// Snapshot creates or deletes (`left` to answer), answered together.
    Snapshots {
        req: ReqId,
        left: usize,
        made: Vec<crate::structs::CsiSnapshot>,
        errors: Vec<String>,
    },
    /// One page of a plugin's listing, answered as it comes.
    Listing { req: ReqId },
}

/// Who waits for an unpublish walk: a request, or a detach job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    Request(ReqId),
    Detach(JobId),
    /// The volume watcher; it retries on its own schedule.
    Watcher,
}

#[derive(Debug)]
struct ControllerCall {
    job: JobId,
    request: ClientCsiRequest,
    candidates: Vec<ControllerTarget>,
    next: usize,
    errors: Vec<String>,
}

#[derive(Debug, Default)]
struct PluginQueue {
    in_flight: Option<(OpId, ControllerCall)>,
    waiting: VecDeque<ControllerCall>,
}

#[derive(Debug)]
enum ClientOp {
    /// A node call owned by a job.
    Node { job: JobId },
    /// The in-flight controller call of a plugin queue.
    Controller { plugin_id: String },
}

#[derive(Debug)]
pub(super) struct CsiEndpoints {
    client_timeout: Duration,
    jobs: BTreeMap<JobId, Flow>,
    client_ops: BTreeMap<OpId, (ClientOp, Instant)>,
    queues: BTreeMap<String, PluginQueue>,
    unpublishing: BTreeMap<ClaimKey, JobId>,
    watcher: VolumeWatcher,
    faults: crate::config::CsiFaults,
    /// Claims given up after a failed release (only with the #10927 fault switched on).
    abandoned: BTreeSet<ClaimKey>,
}

impl CsiEndpoints {
    pub fn new(client_timeout: Duration, gc: GcConfig, faults: crate::config::CsiFaults) -> Self {
        CsiEndpoints {
            client_timeout,
            jobs: BTreeMap::new(),
            client_ops: BTreeMap::new(),
            queues: BTreeMap::new(),
            unpublishing: BTreeMap::new(),
            watcher: VolumeWatcher::new(gc),
            faults,
            abandoned: BTreeSet::new(),
        }
    }

    pub fn watcher(&self) -> &VolumeWatcher {
        &self.watcher
    }

    pub fn unpublishing(&self) -> impl Iterator<Item = &ClaimKey> {
        self.unpublishing.keys()
    }

    pub fn set_enabled(&mut self, now: Instant, leader: bool) {
        self.watcher.set_enabled(now, leader);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let calls = self.client_ops.values().map(|(_, deadline)| *deadline).min();
        [calls, self.watcher.poll_timeout()].into_iter().flatten().min()
    }

    /// A node call of `job` to the client at `(node_id, rpc_addr)`, under the core's deadline.
    fn call_node(
        &mut self,
        now: Instant,
        job: JobId,
        (node_id, rpc_addr): (String, String),
        request: ClientCsiRequest,
        out: &mut Outbox,
    ) {
        let op = out.allocate();
        self.client_ops
            .insert(op, (ClientOp::Node { job }, now + self.client_timeout));
        out.push(Action::CallClient {
            op,
            node_id,
            rpc_addr,
            request,
        });
    }

    fn new_job(&mut self, out: &mut Outbox, flow: Flow) -> JobId {
        let job = out.new_job();
        self.jobs.insert(job, flow);
        job
    }

    /// The command to propose as it is, or `None` when handled here (answered, or a flow of
    /// its own).
    pub fn request(
        &mut self,
        now: Instant,
        req: ReqId,
        request: ServerRequest,
        state: &ServerState,
        out: &mut Outbox,
    ) -> Option<Command> {
        let simple = Some;
        match request {
            ServerRequest::VolumeDeregister {
                namespace,
                volume_ids,
                force,
            } => simple(Command::CsiVolumeDeregister {
                namespace,
                volume_ids,
                force,
            }),
            ServerRequest::PluginDelete { plugin_id } => simple(Command::CsiPluginDelete { plugin_id }),
            ServerRequest::VolumeRegister { volumes } | ServerRequest::VolumeCreate { volumes }
                if let Some(error) = volumes
                    .iter()
                    .filter(|volume| !volume.namespace.is_empty())
                    .find_map(|volume| crate::structs::check_namespace(&volume.namespace).err()) =>
            {
                out.reply(req, ServerReply::Error(RpcError::invalid(error)));
                None
            }
            ServerRequest::VolumeRegister { volumes } => {
                self.register(now, req, volumes, state, out);
                None
            }
            ServerRequest::VolumeCreate { volumes } => {
                self.create(now, req, volumes, state, out);
                None
            }
            ServerRequest::VolumeDelete {
                namespace,
                volume_id,
                secrets,
            } => {
                self.delete(now, req, (namespace, volume_id), secrets, state, out);
                None
            }
            ServerRequest::SnapshotCreate { namespace, snapshots } => {
                self.snapshot_create(now, req, (namespace, snapshots), state, out);
                None
            }
            ServerRequest::SnapshotDelete { snapshots } => {
                self.snapshot_delete(now, req, snapshots, state, out);
                None
            }
            ServerRequest::SnapshotList {
                plugin_id,
                page,
                secrets,
            } => {
                let listing = (plugin_id, page, secrets);
                self.listing(now, req, listing, snapshots::Needs::ListSnapshots, state, out);
                None
            }
            ServerRequest::VolumeListExternal { plugin_id, page } => {
                let listing = (plugin_id, page, Default::default());
                self.listing(now, req, listing, snapshots::Needs::ListVolumes, state, out);
                None
            }
            ServerRequest::VolumeClaim {
                namespace,
                volume_id,
                claim,
                ..
            } => {
                if self.faults.claims_not_idempotent && holds_claim(state, &namespace, &volume_id, &claim) {
                    let full = crate::csi::claims::ClaimError::MaxClaimsReached;
                    let refused = RpcError::new(full.kind(), full.to_string(), true);
                    out.reply(req, ServerReply::Error(refused));
                    return None;
                }
                let flow = Flow::Claim {
                    req,
                    namespace: namespace.clone(),
                    volume_id: volume_id.clone(),
                    claim: claim.clone(),
                    index: 0,
                    volume: None,
                };
                let job = self.new_job(out, flow);
                let command = Command::CsiVolumeClaim {
                    namespace,
                    volume_id,
                    claim,
                };
                out.propose(job, Owner::Csi, command);
                None
            }
            ServerRequest::VolumeUnpublish {
                namespace,
                volume_id,
                claim,
                ..
            } => {
                self.start_unpublish(now, Waiter::Request(req), (namespace, volume_id), claim, state, out);
                None
            }
            ServerRequest::VolumeDetach {
                namespace,
                volume_id,
                node_id,
            } => {
                self.detach(now, req, namespace, volume_id, node_id, state, out);
                None
            }
            other => unreachable!("not a CSI request: {other:?}"),
        }
    }

    fn register(&mut self, now: Instant, req: ReqId, volumes: Vec<CsiVolume>, state: &ServerState, out: &mut Outbox) {
        let validations: Vec<ClientCsiRequest> = volumes
            .iter()
            .filter(|volume| {
                state
                    .plugin(&volume.plugin_id)
                    .is_some_and(|plugin| plugin.controller_required)
            })
            .map(|volume| {
                ClientCsiRequest::ControllerValidate(ControllerValidateRequest {
                    plugin_id: volume.plugin_id.clone(),
                    volume_id: volume.remote_id().to_string(),
                    capabilities: volume.requested_capabilities.clone(),
                    parameters: volume.parameters.clone(),
                    context: volume.context.clone(),
                    secrets: volume.secrets.clone(),
                })
            })
            .collect();
        let flow = Flow::Register {
            req,
            volumes: volumes.clone(),
            validations_left: validations.len(),
        };
        let job = self.new_job(out, flow);
        if validations.is_empty() {
            out.propose(job, Owner::Csi, Command::CsiVolumeRegister { volumes });
            return;
        }
        for request in validations {
            self.enqueue_controller(now, job, request, state, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn detach(
        &mut self,
        now: Instant,
        req: ReqId,
        namespace: String,
        volume_id: String,
        node_id: String,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(volume) = state.volume(&namespace, &volume_id) else {
            out.reply(req, ServerReply::Error(RpcError::not_found("volume not found")));
            return;
        };
        let mut claims: BTreeMap<String, CsiVolumeClaim> = BTreeMap::new();
        for claim in volume
            .read_claims
            .values()
            .chain(volume.write_claims.values())
            .chain(volume.past_claims.values())
        {
            if claim.node_id == node_id {
                let mut claim = claim.clone();
                if claim.state == ClaimState::Taken {
                    claim.state = ClaimState::Unpublishing;
                }
                let keep = claims
                    .get(&claim.allocation_id)
                    .is_none_or(|known| known.state == ClaimState::Taken);
                if keep {
                    claims.insert(claim.allocation_id.clone(), claim);
                }
            }
        }
        if claims.is_empty() {
            let index = state.last_applied().unwrap_or(0);
            out.reply(req, ServerReply::Done { index });
            return;
        }
        let flow = Flow::Detach {
            req,
            left: claims.len(),
            error: None,
        };
        let job = self.new_job(out, flow);
        for claim in claims.into_values() {
            let waiter = Waiter::Detach(job);
            self.start_unpublish(now, waiter, (namespace.clone(), volume_id.clone()), claim, state, out);
        }
    }

    /// A proposal of a CSI flow came back.
    pub fn proposed(
        &mut self,
        now: Instant,
        job_id: JobId,
        outcome: Result<(u64, Response), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        match job {
            Flow::Internal => {
                self.jobs.remove(&job_id);
                if let Err(failure) = outcome {
                    tracing::debug!(error = %failure.message, "CSI garbage collection proposal failed");
                }
            }
            Flow::Register { req, .. } | Flow::Create { req, .. } | Flow::Delete { req, .. } => {
                let req = *req;
                self.jobs.remove(&job_id);
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::Done { index },
                    Err(error) => ServerReply::Error(error),
                };
                out.reply(req, reply);
            }
            Flow::Claim { .. } => self.claim_committed(now, job_id, outcome, state, out),
            Flow::Unpublish { .. } => match outcome {
                Ok(_) => self.unpublish_continue(now, job_id, state, out),
                Err(error) => self.finish_unpublish(now, job_id, Err(error), state, out),
            },
            Flow::Detach { .. } | Flow::Snapshots { .. } | Flow::Listing { .. } => {
                unreachable!("detach, snapshot and listing jobs propose nothing")
            }
        }
    }

    /// A client answered a call of ours (late answers to abandoned calls are dropped).
    pub fn client_answered(
        &mut self,
        now: Instant,
        op: OpId,
        result: Result<ClientCsiReply, crate::error::CsiCallError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        if let Some((client_op, _)) = self.client_ops.remove(&op) {
            self.client_replied(now, op, client_op, result, state, out);
        }
    }

    /// Client calls whose deadline passed fail as timed out.
    pub fn handle_timeout(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        let expired: Vec<OpId> = self
            .client_ops
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(op, _)| *op)
            .collect();
        for op in expired {
            let (client_op, _) = self.client_ops.remove(&op).expect("present");
            out.push(Action::CancelClientCall { op });
            let message = format!("CSI call timed out after {:?}", self.client_timeout);
            self.client_replied(
                now,
                op,
                client_op,
                Err(crate::error::CsiCallError::other(message)),
                state,
                out,
            );
        }
    }

    /// The volume watcher's releases and garbage collection.
    pub fn run_watcher(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        let releasing: BTreeSet<ClaimKey> = self.unpublishing.keys().chain(self.abandoned.iter()).cloned().collect();
        for action in self.watcher.run(now, state, &releasing) {
            match action {
                WatcherAction::Unpublish {
                    namespace,
                    volume_id,
                    claim,
                } => {
                    self.start_unpublish(now, Waiter::Watcher, (namespace, volume_id), claim, state, out);
                }
                WatcherAction::ClaimGc { namespace, volume_id } => {
                    let job = self.new_job(out, Flow::Internal);
                    let claim = CsiVolumeClaim {
                        allocation_id: String::new(),
                        node_id: String::new(),
                        external_node_id: String::new(),
                        mode: ClaimMode::Gc,
                        access_mode: AccessMode::Unknown,
                        attachment_mode: AttachmentMode::Unknown,
                        state: ClaimState::Unpublishing,
                    };
                    let command = Command::CsiVolumeClaim {
                        namespace,
                        volume_id,
                        claim,
                    };
                    out.propose(job, Owner::Csi, command);
                }
                WatcherAction::DeletePlugin { plugin_id } => {
                    let job = self.new_job(out, Flow::Internal);
                    out.propose(job, Owner::Csi, Command::CsiPluginDelete { plugin_id });
                }
            }
        }
    }
}

/// Whether the allocation of `claim` already holds a live claim on the volume
/// (`CsiFaults::claims_not_idempotent`).
fn holds_claim(state: &ServerState, namespace: &str, volume_id: &str, claim: &CsiVolumeClaim) -> bool {
    if claim.state != crate::structs::ClaimState::Taken {
        return false;
    }
    state.volume(namespace, volume_id).is_some_and(|volume| {
        !volume.past_claims.contains_key(&claim.allocation_id)
            && (volume.read_claims.contains_key(&claim.allocation_id)
                || volume.write_claims.contains_key(&claim.allocation_id))
    })
}
