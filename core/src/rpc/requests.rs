//! The endpoints' requests: checked, turned into commands or flows, and proposed.

#[allow(unused_imports)]
use crate::prelude::*;

use super::*;
use alloc::collections::BTreeMap;

use crate::fsm::{Command, ServerState};
use crate::structs::{ClaimState, CsiVolume, CsiVolumeClaim, NodeEvent, NodeStatus, SchedulingEligibility};
use crate::time::Instant;

impl RpcEndpoints {
    pub(super) fn request(&mut self, now: Instant, req: ReqId, request: ServerRequest, state: &ServerState) {
        if !self.leader {
            self.reply(req, ServerReply::Error(RpcError::unavailable("No cluster leader")));
            return;
        }
        use ServerRequest as R;
        let command = match request {
            request @ (R::NodeRegister { .. }
            | R::NodeUpdateStatus { .. }
            | R::NodeUpdateCsiInfo { .. }
            | R::NodeUpdateDrivers { .. }
            | R::NodeEmitEvents { .. }
            | R::NodeDeregister { .. }
            | R::NodeUpdateDrain { .. }
            | R::NodeUpdateEligibility { .. }) => self.node_request(now, req, request, state),
            request @ (R::JobUpsert { .. }
            | R::JobDeregister { .. }
            | R::JobRegister { .. }
            | R::JobStop { .. }
            | R::AllocUpsert { .. }
            | R::AllocClientUpdate { .. }
            | R::AllocDelete { .. }) => self.job_request(req, request, state),
            request => self.csi_request(now, req, request, state),
        };
        if let Some(command) = command {
            let job = self.new_job(Flow::Simple { req });
            self.propose(job, command);
        }
    }

    /// `Node.*`: the command to propose as it is, or `None` when handled here (answered, or a
    /// flow of its own).
    fn node_request(
        &mut self,
        now: Instant,
        req: ReqId,
        request: ServerRequest,
        state: &ServerState,
    ) -> Option<Command> {
        let simple = Some;
        match request {
            ServerRequest::NodeRegister { node } => {
                let job = self.new_job(Flow::NodeWrite {
                    req,
                    node_id: node.id.clone(),
                });
                self.propose(job, Command::NodeRegister { node: *node });
                None
            }
            ServerRequest::NodeUpdateStatus { node_id, status } => {
                self.update_status(now, req, node_id, status, state);
                None
            }
            ServerRequest::NodeUpdateCsiInfo {
                node_id,
                controllers,
                nodes,
            } => simple(Command::NodeUpdateCsiInfo {
                node_id,
                controllers,
                nodes,
            }),
            ServerRequest::NodeUpdateDrivers { node_id, drivers } => {
                simple(Command::NodeUpdateDrivers { node_id, drivers })
            }
            ServerRequest::NodeEmitEvents { node_id, events } => simple(Command::NodeEmitEvents { node_id, events }),
            ServerRequest::NodeDeregister { node_id } => simple(Command::NodeDeregister { node_id }),
            ServerRequest::NodeUpdateDrain {
                node_id,
                strategy,
                mark_eligible,
            } => {
                if state.node(&node_id).is_none() {
                    self.reply(req, ServerReply::Error(RpcError::not_found("node not found")));
                    return None;
                }
                simple(Command::NodeUpdateDrain {
                    node_id,
                    strategy,
                    mark_eligible,
                    complete: false,
                })
            }
            ServerRequest::NodeUpdateEligibility { node_id, eligibility } => {
                let Some(node) = state.node(&node_id) else {
                    self.reply(req, ServerReply::Error(RpcError::not_found("node not found")));
                    return None;
                };
                if node.drain_strategy.is_some() && eligibility == SchedulingEligibility::Eligible {
                    self.reply(
                        req,
                        ServerReply::Error(RpcError::refused(crate::fsm::DRAINING_NOT_ELIGIBLE)),
                    );
                    return None;
                }
                simple(Command::NodeUpdateEligibility { node_id, eligibility })
            }
            other => unreachable!("not a node request: {other:?}"),
        }
    }

    /// `Job.*` and `Alloc.*`.
    fn job_request(&mut self, req: ReqId, request: ServerRequest, state: &ServerState) -> Option<Command> {
        let simple = Some;
        match request {
            ServerRequest::JobUpsert { job } => simple(Command::JobUpsert { job }),
            ServerRequest::JobDeregister { namespace, job_id } => simple(Command::JobDeregister { namespace, job_id }),
            ServerRequest::JobRegister { job } => {
                let mut job = *job;
                if job.name.is_empty() {
                    job.name = job.id.clone();
                }
                let errors = crate::jobspec::validate(&job);
                if !errors.is_empty() {
                    self.reply(
                        req,
                        ServerReply::Error(RpcError::invalid(crate::jobspec::format_errors(&errors))),
                    );
                    return None;
                }
                let eval = self.new_eval(&job.namespace, &job.id, job.job_type, job.priority, "job-register");
                let flow = Flow::JobWrite {
                    req,
                    eval_id: eval.id.clone(),
                    namespace: job.namespace.clone(),
                    job_id: job.id.clone(),
                };
                let id = self.new_job(flow);
                self.propose(id, Command::JobRegister { job, eval });
                None
            }
            ServerRequest::JobStop {
                namespace,
                job_id,
                purge,
            } => {
                let Some(job) = state.job(&namespace, &job_id) else {
                    self.reply(req, ServerReply::Error(RpcError::not_found("job not found")));
                    return None;
                };
                let eval = self.new_eval(&namespace, &job_id, job.job_type, job.priority, "job-deregister");
                let flow = Flow::JobWrite {
                    req,
                    eval_id: eval.id.clone(),
                    namespace: namespace.clone(),
                    job_id: job_id.clone(),
                };
                let id = self.new_job(flow);
                self.propose(
                    id,
                    Command::JobStop {
                        namespace,
                        job_id,
                        purge,
                        eval,
                    },
                );
                None
            }
            ServerRequest::AllocUpsert { allocs } => simple(Command::AllocUpsert { allocs }),
            ServerRequest::AllocClientUpdate {
                alloc_id,
                client_status,
            } => simple(Command::AllocClientUpdate {
                alloc_id,
                client_status,
            }),
            ServerRequest::AllocDelete { alloc_ids } => simple(Command::AllocDelete { alloc_ids }),
            other => unreachable!("not a job request: {other:?}"),
        }
    }

    /// `CSIVolume.*` and `CSIPlugin.*`.
    fn csi_request(
        &mut self,
        now: Instant,
        req: ReqId,
        request: ServerRequest,
        state: &ServerState,
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
            ServerRequest::VolumeRegister { volumes } => {
                self.register(now, req, volumes, state);
                None
            }
            ServerRequest::VolumeClaim {
                namespace,
                volume_id,
                claim,
            } => {
                let job = self.new_job(Flow::Claim {
                    req,
                    namespace: namespace.clone(),
                    volume_id: volume_id.clone(),
                    claim: claim.clone(),
                    index: 0,
                    volume: None,
                });
                self.propose(
                    job,
                    Command::CsiVolumeClaim {
                        namespace,
                        volume_id,
                        claim,
                    },
                );
                None
            }
            ServerRequest::VolumeUnpublish {
                namespace,
                volume_id,
                claim,
            } => {
                self.start_unpublish(now, Waiter::Request(req), namespace, volume_id, claim, state);
                None
            }
            ServerRequest::VolumeDetach {
                namespace,
                volume_id,
                node_id,
            } => {
                self.detach(now, req, namespace, volume_id, node_id, state);
                None
            }
            other => unreachable!("not a CSI request: {other:?}"),
        }
    }

    /// A node registration or status change was applied: answered with the heartbeat TTL the
    /// node is now held to (none for a node that is down).
    pub(super) fn node_written(
        &mut self,
        now: Instant,
        req: ReqId,
        node_id: &str,
        outcome: Result<(u64, Response), RpcError>,
        state: &ServerState,
    ) {
        let reply = match outcome {
            Ok((index, _)) => {
                let live = state.node(node_id).is_some_and(|node| node.status != NodeStatus::Down);
                let ttl = if live {
                    self.heartbeats.reset(now, node_id, state)
                } else {
                    Duration::ZERO
                };
                ServerReply::Heartbeat {
                    index,
                    heartbeat_ttl_ms: ttl.as_millis() as u64,
                }
            }
            Err(error) => ServerReply::Error(error),
        };
        self.reply(req, reply);
    }

    /// `Node.UpdateStatus`, which is also the client's heartbeat: the deadline moves on, and
    /// only a change of status goes through Raft (a down node that calls in is ready again).
    pub(super) fn update_status(
        &mut self,
        now: Instant,
        req: ReqId,
        node_id: String,
        status: NodeStatus,
        state: &ServerState,
    ) {
        let Some(node) = state.node(&node_id) else {
            self.reply(
                req,
                ServerReply::Error(RpcError::not_found(format!("node not found: {node_id}"))),
            );
            return;
        };
        if node.status == status {
            let heartbeat_ttl_ms = if status == NodeStatus::Down {
                0
            } else {
                self.heartbeats.reset(now, &node_id, state).as_millis() as u64
            };
            let index = node.modify_index;
            self.reply(
                req,
                ServerReply::Heartbeat {
                    index,
                    heartbeat_ttl_ms,
                },
            );
            return;
        }
        let event = (node.status == NodeStatus::Down && status == NodeStatus::Ready).then(|| NodeEvent {
            message: crate::heartbeat::REREGISTERED.into(),
            subsystem: "Cluster".into(),
            ..NodeEvent::default()
        });
        let job = self.new_job(Flow::NodeWrite {
            req,
            node_id: node_id.clone(),
        });
        self.propose(job, Command::NodeUpdateStatus { node_id, status, event });
    }

    pub(super) fn register(&mut self, now: Instant, req: ReqId, volumes: Vec<CsiVolume>, state: &ServerState) {
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
        let job = self.new_job(Flow::Register {
            req,
            volumes: volumes.clone(),
            validations_left: validations.len(),
        });
        if validations.is_empty() {
            self.propose(job, Command::CsiVolumeRegister { volumes });
            return;
        }
        for request in validations {
            self.enqueue_controller(now, job, request, state);
        }
    }

    pub(super) fn detach(
        &mut self,
        now: Instant,
        req: ReqId,
        namespace: String,
        volume_id: String,
        node_id: String,
        state: &ServerState,
    ) {
        let Some(volume) = state.volume(&namespace, &volume_id) else {
            self.reply(req, ServerReply::Error(RpcError::not_found("volume not found")));
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
            self.reply(
                req,
                ServerReply::Done {
                    index: state.last_applied().unwrap_or(0),
                },
            );
            return;
        }
        let job = self.new_job(Flow::Detach {
            req,
            left: claims.len(),
            error: None,
        });
        for claim in claims.into_values() {
            self.start_unpublish(
                now,
                Waiter::Detach(job),
                namespace.clone(),
                volume_id.clone(),
                claim,
                state,
            );
        }
    }
}
