//! The CSI flows after a commit: controller publish of new claims, and the checkpointed
//! unpublish walk (node, then controller, committing each step) shared by its waiters.

#[allow(unused_imports)]
use crate::prelude::*;

use super::*;
use alloc::collections::BTreeMap;

use crate::csi::routing::{self};
use crate::csi::unpublish::{self, Step};
use crate::fsm::{Command, ServerState};
use crate::structs::{ClaimMode, ClaimState, CsiVolume, CsiVolumeClaim};
use crate::time::Instant;

impl CsiEndpoints {
    /// A claim's proposal came back: its error is the answer, else what was committed is
    /// controller-published (`publish`).
    pub(super) fn claim_committed(
        &mut self,
        now: Instant,
        job_id: JobId,
        outcome: Result<(u64, Response), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(Flow::Claim {
            req,
            claim,
            index,
            volume,
            namespace,
            volume_id,
        }) = self.jobs.get_mut(&job_id)
        else {
            return;
        };
        let req = *req;
        let (new_index, response) = match outcome {
            Ok(done) => done,
            Err(error) => {
                self.jobs.remove(&job_id);
                out.reply(req, ServerReply::Error(error));
                return;
            }
        };
        *index = new_index;
        let claim = claim.clone();
        let (namespace, volume_id) = (namespace.clone(), volume_id.clone());
        let stored = match response {
            Response::Volume(stored) => *stored,
            _ => state.volume(&namespace, &volume_id).unwrap_or_default(),
        };
        *volume = Some(alloc::boxed::Box::new(stored.clone()));
        self.publish(now, job_id, req, new_index, claim, stored, state, out);
    }

    pub(super) fn start_unpublish(
        &mut self,
        now: Instant,
        waiter: Waiter,
        (namespace, volume_id): (String, String),
        claim: CsiVolumeClaim,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let key = (namespace.clone(), volume_id.clone(), claim.allocation_id.clone());
        if let Some(job) = self.unpublishing.get(&key).copied()
            && let Some(Flow::Unpublish { waiters, .. }) = self.jobs.get_mut(&job)
        {
            waiters.push(waiter);
            return;
        }
        let Some(volume) = state.volume(&namespace, &volume_id) else {
            self.finish_waiter(now, waiter, Err(RpcError::not_found("volume not found")), state, out);
            return;
        };
        if self.committed_free(&volume, &claim) {
            // Nothing recorded for the allocation: its release already finished (a client's
            // retry after the watcher freed it). Reopening it would record a claim again and
            // call the plugins for nothing (found by csi_node_detach_hang, seed 8: the volume
            // read "in use" after every claim had been released).
            self.finish_waiter(now, waiter, Ok(()), state, out);
            return;
        }
        let mut claim = claim;
        if claim.state == ClaimState::Taken {
            claim.state = ClaimState::Unpublishing;
        }
        let job = self.new_job(
            out,
            Flow::Unpublish {
                key: key.clone(),
                claim: claim.clone(),
                waiters: vec![waiter],
            },
        );
        self.unpublishing.insert(key, job);
        // Checkpoint the claim as given before any external call.
        out.propose(
            job,
            Owner::Csi,
            Command::CsiVolumeClaim {
                namespace,
                volume_id,
                claim,
            },
        );
    }

    /// After a claim commits: controller-publish new claims on plugins with attach/detach.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish(
        &mut self,
        now: Instant,
        job: JobId,
        req: ReqId,
        index: u64,
        claim: CsiVolumeClaim,
        volume: CsiVolume,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let needs_publish = claim.state == ClaimState::Taken
            && claim.mode != ClaimMode::Gc
            && volume.plugin_health.controller_required
            && state
                .plugin(&volume.plugin_id)
                .is_some_and(|plugin| plugin.supports_attach_detach());
        if !needs_publish {
            self.jobs.remove(&job);
            out.reply(
                req,
                ServerReply::Claimed {
                    index,
                    volume: alloc::boxed::Box::new(volume),
                    publish_context: BTreeMap::new(),
                },
            );
            return;
        }
        let external_node_id = routing::external_node_id(state, &claim, &volume.plugin_id);
        if external_node_id.is_empty() {
            self.jobs.remove(&job);
            let message = format!(
                "node plugin {} is not running or has not fingerprinted on node {}",
                volume.plugin_id, claim.node_id
            );
            out.reply(req, ServerReply::Error(RpcError::unavailable(message)));
            return;
        }
        let request = ClientCsiRequest::ControllerAttach(ControllerAttachRequest {
            plugin_id: volume.plugin_id.clone(),
            volume_id: volume.remote_id().to_string(),
            client_csi_node_id: external_node_id,
            attachment_mode: claim.attachment_mode,
            access_mode: claim.access_mode,
            mount_options: volume.mount_options.clone(),
            read_only: claim.mode == ClaimMode::Read,
            secrets: volume.secrets.clone(),
            volume_context: volume.context.clone(),
        });
        self.enqueue_controller(now, job, request, state, out);
    }

    pub(super) fn unpublish_continue(&mut self, now: Instant, job_id: JobId, state: &ServerState, out: &mut Outbox) {
        let Some(Flow::Unpublish { key, claim, .. }) = self.jobs.get(&job_id) else {
            return;
        };
        let (namespace, volume_id, _) = key.clone();
        let claim = claim.clone();
        let Some(volume) = state.volume(&namespace, &volume_id) else {
            // The volume is gone (force-deregistered): nothing left to release.
            self.finish_unpublish(now, job_id, Ok(()), state, out);
            return;
        };
        match unpublish::next_step_with(state, &volume, &claim, &self.faults) {
            Step::Done => self.finish_unpublish(now, job_id, Ok(()), state, out),
            Step::Checkpoint(next) => {
                if claim.state == ClaimState::ReadyToFree
                    && next.state == ClaimState::ReadyToFree
                    && self.committed_free(&volume, &claim)
                {
                    self.finish_unpublish(now, job_id, Ok(()), state, out);
                    return;
                }
                self.checkpoint_claim(job_id, next, out);
            }
            Step::NodeDetach(request) => {
                let Some(node) = state.node(&request.node_id) else {
                    let mut next = claim.clone();
                    next.state = ClaimState::NodeDetached;
                    self.checkpoint_claim(job_id, next, out);
                    return;
                };
                let (node_id, rpc_addr) = (request.node_id.clone(), node.rpc_addr.clone());
                self.call_node(
                    now,
                    job_id,
                    (node_id, rpc_addr),
                    ClientCsiRequest::NodeDetach(request),
                    out,
                );
            }
            Step::ControllerDetach(request) => {
                self.enqueue_controller(now, job_id, ClientCsiRequest::ControllerDetach(request), state, out);
            }
        }
    }

    pub(super) fn committed_free(&self, volume: &CsiVolume, claim: &CsiVolumeClaim) -> bool {
        !volume.past_claims.contains_key(&claim.allocation_id)
            && !volume.read_claims.contains_key(&claim.allocation_id)
            && !volume.write_claims.contains_key(&claim.allocation_id)
    }

    /// The unpublish flow `job_id` moves on to `next`, checkpointed through Raft.
    pub(super) fn checkpoint_claim(&mut self, job_id: JobId, next: CsiVolumeClaim, out: &mut Outbox) {
        let Some(Flow::Unpublish { key, claim, .. }) = self.jobs.get_mut(&job_id) else {
            return;
        };
        debug_assert!(
            release_rank(next.state) >= release_rank(claim.state),
            "a release checkpoint went back from {:?} to {:?}",
            claim.state,
            next.state
        );
        *claim = next.clone();
        let (namespace, volume_id, _) = key.clone();
        out.propose(
            job_id,
            Owner::Csi,
            Command::CsiVolumeClaim {
                namespace,
                volume_id,
                claim: next,
            },
        );
    }

    pub(super) fn finish_unpublish(
        &mut self,
        now: Instant,
        job_id: JobId,
        result: Result<(), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(Flow::Unpublish { key, waiters, .. }) = self.jobs.remove(&job_id) else {
            return;
        };
        self.unpublishing.remove(&key);
        if result.is_err() && self.faults.abandon_failed_unpublish {
            self.abandoned.insert(key.clone());
        }
        for waiter in waiters {
            self.finish_waiter(now, waiter, result.clone(), state, out);
        }
    }

    pub(super) fn finish_waiter(
        &mut self,
        _now: Instant,
        waiter: Waiter,
        result: Result<(), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let index = state.last_applied().unwrap_or(0);
        match waiter {
            Waiter::Watcher => {
                if let Err(failure) = result {
                    tracing::debug!(error = %failure.message, "volume watcher: release failed; will retry");
                }
            }
            Waiter::Request(req) => {
                let reply = match result {
                    Ok(()) => ServerReply::Done { index },
                    Err(error) => ServerReply::Error(error),
                };
                out.reply(req, reply);
            }
            Waiter::Detach(job) => {
                let Some(Flow::Detach { req, left, error }) = self.jobs.get_mut(&job) else {
                    return;
                };
                *left -= 1;
                if let Err(failure) = result {
                    error.get_or_insert(failure);
                }
                if *left == 0 {
                    let req = *req;
                    let reply = match error.take() {
                        Some(error) => ServerReply::Error(error),
                        None => ServerReply::Done { index },
                    };
                    self.jobs.remove(&job);
                    out.reply(req, reply);
                }
            }
        }
    }
}

/// How far a release has come: checkpoints only ever move forward.
fn release_rank(state: ClaimState) -> u8 {
    match state {
        ClaimState::Taken => 0,
        ClaimState::Unpublishing => 1,
        ClaimState::NodeDetached => 2,
        ClaimState::ControllerDetached => 3,
        ClaimState::ReadyToFree => 4,
    }
}
