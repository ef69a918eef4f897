//! Controller and node calls to clients: serialised per plugin, tried in sorted order over
//! healthy controllers, each with a deadline owned here; losing leadership fails them all.

#[allow(unused_imports)]
use crate::prelude::*;

use super::*;
use alloc::collections::BTreeMap;

use crate::csi::routing::{self};
use crate::fsm::{Command, ServerState};
use crate::op::OpId;
use crate::structs::ClaimState;
use crate::time::Instant;

impl RpcEndpoints {
    pub(super) fn enqueue_controller(
        &mut self,
        now: Instant,
        job: JobId,
        request: ClientCsiRequest,
        state: &ServerState,
    ) {
        let plugin_id = request.plugin_id().to_string();
        self.queues
            .entry(plugin_id.clone())
            .or_default()
            .waiting
            .push_back(ControllerCall {
                job,
                request,
                candidates: Vec::new(),
                next: 0,
                errors: Vec::new(),
            });
        self.dispatch(now, &plugin_id, state);
    }

    /// Starts the next controller call of `plugin_id` if none is in flight.
    pub(super) fn dispatch(&mut self, now: Instant, plugin_id: &str, state: &ServerState) {
        loop {
            let queue = self.queues.entry(plugin_id.to_string()).or_default();
            if queue.in_flight.is_some() {
                return;
            }
            let Some(mut call) = queue.waiting.pop_front() else {
                self.queues.remove(plugin_id);
                return;
            };
            call.candidates = routing::controller_candidates(state, plugin_id);
            if call.candidates.is_empty() {
                let message = format!("failed to find clients running controller plugin {plugin_id:?}");
                self.controller_done(now, call, Err(RpcError::unavailable(message)), state);
                continue;
            }
            self.send_controller(now, plugin_id, call);
            return;
        }
    }

    pub(super) fn send_controller(&mut self, now: Instant, plugin_id: &str, call: ControllerCall) {
        let target = call.candidates[call.next].clone();
        let op = self.ops.allocate();
        self.client_ops.insert(
            op,
            (
                ClientOp::Controller {
                    plugin_id: plugin_id.to_string(),
                },
                now + self.client_timeout,
            ),
        );
        self.actions.push_back(Action::CallClient {
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
        result: Result<ClientCsiReply, String>,
        state: &ServerState,
    ) {
        match client_op {
            ClientOp::Node { job } => {
                let detached = match &result {
                    Ok(_) => true,
                    Err(message) => message.contains("Unknown node"),
                };
                if detached {
                    let Some(Flow::Unpublish { claim, .. }) = self.jobs.get(&job) else {
                        return;
                    };
                    let mut next = claim.clone();
                    next.state = ClaimState::NodeDetached;
                    self.checkpoint_claim(job, next);
                } else {
                    let message = format!("could not detach from node: {}", result.expect_err("failed"));
                    self.finish_unpublish(now, job, Err(RpcError::unavailable(message)), state);
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
                    Err(message) if routing::is_retryable(&message) && call.next + 1 < call.candidates.len() => {
                        call.errors.push(message);
                        call.next += 1;
                        self.send_controller(now, &plugin_id, call);
                    }
                    Err(message) => {
                        let retryable = message.contains("FailedPrecondition") || routing::is_retryable(&message);
                        let message =
                            if message.contains("FailedPrecondition") && !message.starts_with(RETRYABLE_PREFIX) {
                                format!("{RETRYABLE_PREFIX}: {message}")
                            } else {
                                message
                            };
                        self.controller_done(now, call, Err(RpcError::from_plugin(message, retryable)), state);
                        self.dispatch(now, &plugin_id, state);
                    }
                    Ok(reply) => {
                        self.controller_done(now, call, Ok(reply), state);
                        self.dispatch(now, &plugin_id, state);
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
    ) {
        let job_id = call.job;
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
                        self.propose(job_id, Command::CsiVolumeRegister { volumes });
                    }
                }
                Err(failure) => {
                    let req = *req;
                    self.jobs.remove(&job_id);
                    let message = format!("controller validate volume: {}", failure.message);
                    self.reply(
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
                    Ok(ClientCsiReply::Done) => ServerReply::Claimed {
                        index,
                        volume,
                        publish_context: BTreeMap::new(),
                    },
                    Err(failure) => ServerReply::Error(failure),
                };
                self.reply(req, reply);
            }
            Flow::Unpublish { claim, .. } => match result {
                Ok(_) => {
                    let mut next = claim.clone();
                    next.state = ClaimState::ReadyToFree;
                    self.checkpoint_claim(job_id, next);
                }
                Err(failure) => {
                    let failure =
                        RpcError::unavailable(format!("could not detach from controller: {}", failure.message));
                    self.finish_unpublish(now, job_id, Err(failure), state);
                }
            },
            Flow::Simple { .. }
            | Flow::Detach { .. }
            | Flow::Internal
            | Flow::JobWrite { .. }
            | Flow::Schedule
            | Flow::Drain
            | Flow::NodeWrite { .. }
            | Flow::HeartbeatMissed { .. } => {}
        }
    }

    pub(super) fn fail_everything(&mut self, why: &str) {
        let jobs = core::mem::take(&mut self.jobs);
        for (_, job) in jobs {
            let failure = ServerReply::Error(RpcError::unavailable(why));
            match job {
                Flow::Simple { req }
                | Flow::Register { req, .. }
                | Flow::Claim { req, .. }
                | Flow::Detach { req, .. }
                | Flow::JobWrite { req, .. }
                | Flow::NodeWrite { req, .. } => self.reply(req, failure),
                Flow::HeartbeatMissed { .. } => {}
                Flow::Schedule => self.scheduler.proposed(),
                Flow::Drain => self.drainer.proposed(),
                Flow::Unpublish { waiters, .. } => {
                    for waiter in waiters {
                        if let Waiter::Request(req) = waiter {
                            self.reply(req, failure.clone());
                        }
                    }
                }
                Flow::Internal => {}
            }
        }
        self.proposals.clear();
        for op in core::mem::take(&mut self.client_ops).into_keys() {
            self.actions.push_back(Action::CancelClientCall { op });
        }
        self.queues.clear();
        self.unpublishing.clear();
    }
}
