//! Controller and node calls to clients: serialised per plugin, tried in sorted order over
//! healthy controllers, each with a deadline owned here; losing leadership fails them all.

#[allow(unused_imports)]
use crate::prelude::*;

use super::*;
use alloc::collections::BTreeMap;

use crate::csi::routing::{self};
use crate::error::{CsiCallError, CsiCallFailure};
use crate::fsm::{Command, ServerState};
use crate::op::OpId;
use crate::structs::ClaimState;
use crate::time::Instant;

impl CsiEndpoints {
    pub(super) fn enqueue_controller(
        &mut self,
        now: Instant,
        job: JobId,
        request: ClientCsiRequest,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let key = self.queue_key(&request);
        self.queues
            .entry(key.clone())
            .or_default()
            .waiting
            .push_back(ControllerCall {
                job,
                request,
                candidates: Vec::new(),
                next: 0,
                errors: Vec::new(),
            });
        self.dispatch(now, &key, state, out);
    }

    /// The queue a controller call waits in: its plugin's, so one call at a time reaches a
    /// plugin (#8336), or, with the regression switch, its volume's.
    fn queue_key(&self, request: &ClientCsiRequest) -> String {
        match request {
            ClientCsiRequest::ControllerAttach(r) if self.faults.serialize_per_volume => {
                format!("{}/{}", r.plugin_id, r.volume_id)
            }
            ClientCsiRequest::ControllerDetach(r) if self.faults.serialize_per_volume => {
                format!("{}/{}", r.plugin_id, r.volume_id)
            }
            request => request.plugin_id().to_string(),
        }
    }

    /// Starts the next controller call of queue `key` (a plugin id) if none is in flight.
    pub(super) fn dispatch(&mut self, now: Instant, key: &str, state: &ServerState, out: &mut Outbox) {
        loop {
            let queue = self.queues.entry(key.to_string()).or_default();
            if queue.in_flight.is_some() {
                return;
            }
            let Some(mut call) = queue.waiting.pop_front() else {
                self.queues.remove(key);
                return;
            };
            let plugin_id = call.request.plugin_id().to_string();
            call.candidates = routing::controller_candidates(state, &plugin_id);
            if call.candidates.is_empty() {
                let message = format!("failed to find clients running controller plugin {plugin_id:?}");
                self.controller_done(now, call, Err(RpcError::unavailable(message)), state, out);
                continue;
            }
            self.send_controller(now, key, call, out);
            return;
        }
    }

    pub(super) fn send_controller(&mut self, now: Instant, plugin_id: &str, call: ControllerCall, out: &mut Outbox) {
        debug_assert!(
            self.queues.get(plugin_id).is_none_or(|queue| queue.in_flight.is_none()),
            "a second controller call for plugin {plugin_id} while one is in flight"
        );
        let target = call.candidates[call.next].clone();
        let op = out.allocate();
        self.client_ops.insert(
            op,
            (
                ClientOp::Controller {
                    plugin_id: plugin_id.to_string(),
                },
                now + self.client_timeout,
            ),
        );
        out.push(Action::CallClient {
            op,
            node_id: target.node_id,
            rpc_addr: target.rpc_addr,
            request: call.request.clone(),
        });
        self.queues.entry(plugin_id.to_string()).or_default().in_flight = Some((op, call));
    }

    pub(super) fn client_replied(
        &mut self,
        now: Instant,
        op: OpId,
        client_op: ClientOp,
        result: Result<ClientCsiReply, CsiCallError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        match client_op {
            ClientOp::Node { job } if matches!(self.jobs.get(&job), Some(Flow::Create { .. })) => {
                self.node_expanded(job, result, out);
            }
            ClientOp::Node { job } => {
                let detached = match &result {
                    Ok(_) => true,
                    Err(error) => error.kind == CsiCallFailure::UnknownNode,
                };
                if detached {
                    let Some(Flow::Unpublish { claim, .. }) = self.jobs.get(&job) else {
                        return;
                    };
                    let mut next = claim.clone();
                    next.state = ClaimState::NodeDetached;
                    self.checkpoint_claim(job, next, out);
                } else {
                    let message = format!("could not detach from node: {}", result.expect_err("failed").message);
                    self.finish_unpublish(now, job, Err(RpcError::unavailable(message)), state, out);
                }
            }
            ClientOp::Controller { plugin_id } => {
                let Some(queue) = self.queues.get_mut(&plugin_id) else {
                    return;
                };
                let Some((in_flight, mut call)) = queue.in_flight.take() else {
                    return;
                };
                assert_eq!(in_flight, op, "one controller call in flight per plugin");
                match result {
                    Err(error) if error.next_candidate() && call.next + 1 < call.candidates.len() => {
                        call.errors.push(error.message);
                        call.next += 1;
                        self.send_controller(now, &plugin_id, call, out);
                    }
                    Err(error) => {
                        let retryable = error.retryable();
                        let message = if error.kind == CsiCallFailure::FailedPrecondition {
                            format!("{RETRYABLE_PREFIX}: {}", error.message)
                        } else {
                            error.message
                        };
                        self.controller_done(now, call, Err(RpcError::from_plugin(message, retryable)), state, out);
                        self.dispatch(now, &plugin_id, state, out);
                    }
                    Ok(reply) => {
                        self.controller_done(now, call, Ok(reply), state, out);
                        self.dispatch(now, &plugin_id, state, out);
                    }
                }
            }
        }
    }

    /// A controller call finished (successfully, or for good): continue its job.
    pub(super) fn controller_done(
        &mut self,
        now: Instant,
        call: ControllerCall,
        result: Result<ClientCsiReply, RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let job_id = call.job;
        match self.jobs.get(&job_id) {
            Some(Flow::Create { .. }) => return self.create_done(now, job_id, &call.request, result, state, out),
            Some(Flow::Delete { .. }) => return self.delete_done(job_id, result, out),
            Some(Flow::Snapshots { .. }) => return self.snapshot_done(job_id, &call.request, result, state, out),
            Some(Flow::Listing { .. }) => return self.listing_done(job_id, &call.request, result, state, out),
            _ => {}
        }
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        match job {
            Flow::Register {
                req,
                volumes,
                validations_left,
            } => match result {
                Ok(_) => {
                    *validations_left -= 1;
                    if *validations_left == 0 {
                        let volumes = volumes.clone();
                        out.propose(job_id, Owner::Csi, Command::CsiVolumeRegister { volumes });
                    }
                }
                Err(failure) => {
                    let req = *req;
                    self.jobs.remove(&job_id);
                    let message = format!("controller validate volume: {}", failure.message);
                    out.reply(
                        req,
                        ServerReply::Error(RpcError::from_plugin(message, failure.retryable)),
                    );
                }
            },
            Flow::Claim { req, index, volume, .. } => {
                let (req, index) = (*req, *index);
                let volume = volume.take().unwrap_or_default();
                self.jobs.remove(&job_id);
                let reply = match result {
                    Ok(ClientCsiReply::Attached { publish_context }) => ServerReply::Claimed {
                        index,
                        volume,
                        publish_context,
                    },
                    Ok(_) => ServerReply::Claimed {
                        index,
                        volume,
                        publish_context: BTreeMap::new(),
                    },
                    Err(failure) => ServerReply::Error(failure),
                };
                out.reply(req, reply);
            }
            Flow::Unpublish { claim, .. } => match result {
                Ok(_) => {
                    let mut next = claim.clone();
                    next.state = ClaimState::ReadyToFree;
                    self.checkpoint_claim(job_id, next, out);
                }
                Err(failure) => {
                    let failure =
                        RpcError::unavailable(format!("could not detach from controller: {}", failure.message));
                    self.finish_unpublish(now, job_id, Err(failure), state, out);
                }
            },
            Flow::Detach { .. }
            | Flow::Internal
            | Flow::Create { .. }
            | Flow::Delete { .. }
            | Flow::Snapshots { .. }
            | Flow::Listing { .. } => {}
        }
    }

    /// Leadership is lost: every flow ends. Returns the requests still waiting, by job, for
    /// the composer to fail in order; [`Self::abandon_calls`] then cancels the client calls.
    pub(in crate::rpc) fn fail_everything(&mut self) -> Vec<(JobId, ReqId)> {
        let mut waiting = Vec::new();
        for (job, flow) in core::mem::take(&mut self.jobs) {
            match flow {
                Flow::Register { req, .. }
                | Flow::Claim { req, .. }
                | Flow::Detach { req, .. }
                | Flow::Create { req, .. }
                | Flow::Delete { req, .. }
                | Flow::Snapshots { req, .. }
                | Flow::Listing { req } => {
                    waiting.push((job, req));
                }
                Flow::Unpublish { waiters, .. } => {
                    waiting.extend(waiters.into_iter().filter_map(|waiter| match waiter {
                        Waiter::Request(req) => Some((job, req)),
                        Waiter::Detach(_) | Waiter::Watcher => None,
                    }));
                }
                Flow::Internal => {}
            }
        }
        self.queues.clear();
        self.unpublishing.clear();
        waiting
    }

    /// Stops waiting for every client call in flight (leadership lost).
    pub(in crate::rpc) fn abandon_calls(&mut self, out: &mut Outbox) {
        for op in core::mem::take(&mut self.client_ops).into_keys() {
            out.push(Action::CancelClientCall { op });
        }
    }
}
