//! `Node.*` on the leader, and the heartbeats that mark silent nodes down.
//!
//! A registration or status change is answered once applied, with the heartbeat TTL the node
//! is now held to; `Node.UpdateStatus` with an unchanged status is the client's heartbeat and
//! only moves its deadline. Nodes whose deadline passes are marked down through Raft.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

use super::outbox::{Outbox, Owner};
use super::{ReqId, RpcError, ServerReply, ServerRequest};
use crate::fsm::{Command, Response, ServerState};
use crate::heartbeat::{HeartbeatConfig, Heartbeats};
use crate::structs::{NodeEvent, NodeStatus, SchedulingEligibility};
use crate::time::Instant;

/// A proposal of this machine in flight.
#[derive(Debug)]
pub(super) enum NodeFlow {
    /// A registration or status change: answered with the heartbeat TTL once applied.
    Write { req: ReqId, node_id: String },
    /// A node marked down because its heartbeat deadline passed.
    HeartbeatMissed { node_id: String },
}

#[derive(Debug)]
pub(super) struct NodeEndpoints {
    heartbeats: Heartbeats,
}

impl NodeEndpoints {
    pub fn new(config: HeartbeatConfig, seed: u64) -> Self {
        NodeEndpoints {
            heartbeats: Heartbeats::new(config, seed),
        }
    }

    pub fn heartbeats(&self) -> &Heartbeats {
        &self.heartbeats
    }

    pub fn set_enabled(&mut self, leader: bool) {
        self.heartbeats.set_enabled(leader);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.heartbeats.poll_timeout()
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
            ServerRequest::NodeRegister { node } => {
                let flow = NodeFlow::Write {
                    req,
                    node_id: node.id.clone(),
                };
                out.propose_new(Owner::Nodes(flow), Command::NodeRegister { node: *node });
                None
            }
            ServerRequest::NodeUpdateStatus { node_id, status, .. } => {
                self.update_status(now, req, node_id, status, state, out);
                None
            }
            ServerRequest::NodeUpdateCsiInfo {
                node_id,
                controllers,
                nodes,
                ..
            } => simple(Command::NodeUpdateCsiInfo {
                node_id,
                controllers,
                nodes,
            }),
            ServerRequest::NodeUpdateDrivers { node_id, drivers, .. } => {
                simple(Command::NodeUpdateDrivers { node_id, drivers })
            }
            ServerRequest::NodeEmitEvents { node_id, events, .. } => {
                simple(Command::NodeEmitEvents { node_id, events })
            }
            ServerRequest::NodeDeregister { node_id } => simple(Command::NodeDeregister { node_id }),
            ServerRequest::NodeUpdateDrain {
                node_id,
                strategy,
                mark_eligible,
            } => {
                if state.node(&node_id).is_none() {
                    out.reply(req, ServerReply::Error(RpcError::not_found("node not found")));
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
                    out.reply(req, ServerReply::Error(RpcError::not_found("node not found")));
                    return None;
                };
                if node.drain_strategy.is_some() && eligibility == SchedulingEligibility::Eligible {
                    out.reply(
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

    /// `Node.UpdateStatus`, which is also the client's heartbeat: the deadline moves on, and
    /// only a change of status goes through Raft (a down node that calls in is ready again).
    fn update_status(
        &mut self,
        now: Instant,
        req: ReqId,
        node_id: String,
        status: NodeStatus,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(node) = state.node(&node_id) else {
            out.reply(
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
            out.reply(
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
        let flow = NodeFlow::Write {
            req,
            node_id: node_id.clone(),
        };
        out.propose_new(Owner::Nodes(flow), Command::NodeUpdateStatus { node_id, status, event });
    }

    /// A proposal of this machine came back.
    pub fn proposed(
        &mut self,
        now: Instant,
        flow: NodeFlow,
        outcome: Result<(u64, Response), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        match flow {
            NodeFlow::Write { req, node_id } => self.written(now, req, &node_id, outcome, state, out),
            NodeFlow::HeartbeatMissed { node_id } => {
                if let Err(failure) = outcome {
                    tracing::warn!(node = %node_id, error = %failure.message, "marking a node down failed");
                }
                self.heartbeats.marked(&node_id);
            }
        }
    }

    /// A node registration or status change was applied: answered with the heartbeat TTL the
    /// node is now held to (none for a node that is down).
    fn written(
        &mut self,
        now: Instant,
        req: ReqId,
        node_id: &str,
        outcome: Result<(u64, Response), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
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
        out.reply(req, reply);
    }

    /// Marks down every node whose heartbeat deadline passed.
    pub fn run(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        self.heartbeats.reconcile(now, state);
        for node_id in self.heartbeats.expired(now) {
            tracing::warn!(node = %node_id, "node heartbeat missed; marking it down");
            let flow = NodeFlow::HeartbeatMissed {
                node_id: node_id.clone(),
            };
            let event = NodeEvent {
                message: crate::heartbeat::HEARTBEAT_MISSED.into(),
                subsystem: "Cluster".into(),
                ..NodeEvent::default()
            };
            out.propose_new(
                Owner::Nodes(flow),
                Command::NodeUpdateStatus {
                    node_id,
                    status: NodeStatus::Down,
                    event: Some(event),
                },
            );
        }
    }
}
