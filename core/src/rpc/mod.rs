//! The server's write endpoints (`Node.*`, `Alloc.*`, `Job.*`, `CSIVolume.*`, `CSIPlugin.*`) as
//! one leader-side machine.
//!
//! Simple writes are proposed through Raft and answered when applied. The CSI flows add
//! external calls to clients, each started only after the step before it is committed:
//! - `VolumeRegister`: `ControllerValidateVolume` for plugins with a controller, then commit.
//! - `VolumeClaim`: commit the claim, then for a new claim on a plugin with attach/detach,
//!   `ControllerAttachVolume` and answer with the publish context.
//! - `VolumeUnpublish`: the checkpointed walk of [`crate::csi::unpublish`]; concurrent requests
//!   for the same claim share one walk.
//! - `VolumeDetach`: unpublish every claim of the volume on one node.
//!
//! Controller RPCs are serialised per plugin (at most one in flight) and try healthy
//! controllers in sorted order, moving on after retryable errors (§3.7). Every client call has
//! a deadline owned here; losing leadership fails every request in flight as retryable.
//!
//! Reads of the state store come in as `&ServerState`; the machine never writes it.

#[allow(unused_imports)]
use crate::prelude::*;

mod controllers;
mod csi_flows;
mod messages;
mod requests;
#[cfg(test)]
mod tests;

pub use messages::*;

use alloc::collections::{BTreeMap, VecDeque};
use core::time::Duration;

use crate::csi::routing::ControllerTarget;
use crate::csi::watcher::{GcConfig, VolumeWatcher, WatcherAction};
use crate::drainer::Drainer;
use crate::fsm::{Command, Response, ServerState};
use crate::heartbeat::{HeartbeatConfig, Heartbeats};
use crate::op::{OpId, OpIds};
use crate::scheduler::worker::Worker;
use crate::structs::{
    AccessMode, AttachmentMode, ClaimMode, ClaimState, CsiVolume, CsiVolumeClaim, Evaluation, JobType, NodeEvent,
    NodeStatus,
};
use crate::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Request {
        req: ReqId,
        request: ServerRequest,
    },
    Proposed {
        op: OpId,
        result: Result<(u64, Response), String>,
    },
    ClientReplied {
        op: OpId,
        result: Result<ClientCsiReply, String>,
    },
    Leadership {
        leader: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Propose {
        op: OpId,
        command: alloc::boxed::Box<Command>,
    },
    CallClient {
        op: OpId,
        node_id: String,
        rpc_addr: String,
        request: ClientCsiRequest,
    },
    /// Abandon a `CallClient` whose outcome no longer matters (deadline passed, leadership
    /// lost): the driver stops waiting so nothing stays in flight behind the core's back.
    CancelClientCall {
        op: OpId,
    },
    Reply {
        req: ReqId,
        reply: ServerReply,
    },
}

/// Nomad wraps plugin `FailedPrecondition` errors so callers retry.
pub const RETRYABLE_PREFIX: &str = "CSI client error (retryable)";

type JobId = u64;
type ClaimKey = (String, String, String);

#[derive(Debug)]
enum Flow {
    /// Propose one command and answer.
    Simple { req: ReqId },
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
    /// A job register or deregister: answered with its evaluation.
    JobWrite {
        req: ReqId,
        eval_id: String,
        namespace: String,
        job_id: String,
    },
    /// A scheduler worker proposal.
    Schedule,
    /// A proposal of the node drainer.
    Drain,
    /// A node registration or status change: answered with the heartbeat TTL once applied.
    NodeWrite { req: ReqId, node_id: String },
    /// A node marked down because its heartbeat deadline passed.
    HeartbeatMissed { node_id: String },
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
pub struct RpcEndpoints {
    leader: bool,
    client_timeout: Duration,
    ops: OpIds,
    next_job: JobId,
    jobs: BTreeMap<JobId, Flow>,
    proposals: BTreeMap<OpId, JobId>,
    client_ops: BTreeMap<OpId, (ClientOp, Instant)>,
    queues: BTreeMap<String, PluginQueue>,
    unpublishing: BTreeMap<ClaimKey, JobId>,
    watcher: VolumeWatcher,
    faults: crate::config::CsiFaults,
    /// Claims given up after a failed release (only with the #10927 fault switched on).
    abandoned: alloc::collections::BTreeSet<ClaimKey>,
    scheduler: Worker,
    heartbeats: Heartbeats,
    drainer: Drainer,
    actions: VecDeque<Action>,
}

impl RpcEndpoints {
    pub fn new(
        client_timeout: Duration,
        gc: GcConfig,
        heartbeat: HeartbeatConfig,
        faults: crate::config::CsiFaults,
        seed: u64,
    ) -> Self {
        RpcEndpoints {
            leader: false,
            client_timeout,
            ops: OpIds::default(),
            next_job: 0,
            jobs: BTreeMap::new(),
            proposals: BTreeMap::new(),
            client_ops: BTreeMap::new(),
            queues: BTreeMap::new(),
            unpublishing: BTreeMap::new(),
            watcher: VolumeWatcher::new(gc),
            faults,
            abandoned: alloc::collections::BTreeSet::new(),
            scheduler: Worker::new(seed),
            heartbeats: Heartbeats::new(heartbeat, seed ^ 0x4ea7),
            drainer: Drainer::new(),
            actions: VecDeque::new(),
        }
    }

    pub fn watcher(&self) -> &VolumeWatcher {
        &self.watcher
    }

    pub fn is_leader(&self) -> bool {
        self.leader
    }

    pub fn heartbeats(&self) -> &Heartbeats {
        &self.heartbeats
    }

    /// Releases in flight, by (namespace, volume, allocation).
    pub fn unpublishing(&self) -> impl Iterator<Item = &ClaimKey> {
        self.unpublishing.keys()
    }

    pub fn handle(&mut self, now: Instant, input: Input, state: &ServerState) {
        match input {
            Input::Request { req, request } => self.request(now, req, request, state),
            Input::Proposed { op, result } => {
                if let Some(job) = self.proposals.remove(&op) {
                    self.proposed(now, job, result, state);
                }
            }
            Input::ClientReplied { op, result } => {
                if let Some((client_op, _)) = self.client_ops.remove(&op) {
                    self.client_replied(now, op, client_op, result, state);
                }
            }
            Input::Leadership { leader } => {
                if self.leader && !leader {
                    self.fail_everything("leadership lost");
                }
                self.leader = leader;
                self.watcher.set_enabled(now, leader);
                self.scheduler.set_enabled(now, leader);
                self.heartbeats.set_enabled(leader);
                self.drainer.set_enabled(leader);
            }
        }
        self.run_heartbeats(now, state);
        self.run_watcher(now, state);
        self.run_drainer(now, state);
        self.run_scheduler(now, state);
    }

    fn run_drainer(&mut self, now: Instant, state: &ServerState) {
        let scheduler = &mut self.scheduler;
        if let Some(command) = self.drainer.run(now, state, &mut || scheduler.new_id()) {
            let job = self.new_job(Flow::Drain);
            self.propose(job, command);
        }
    }

    /// Marks down every node whose heartbeat deadline passed.
    fn run_heartbeats(&mut self, now: Instant, state: &ServerState) {
        self.heartbeats.reconcile(now, state);
        for node_id in self.heartbeats.expired(now) {
            tracing::warn!(node = %node_id, "node heartbeat missed; marking it down");
            let job = self.new_job(Flow::HeartbeatMissed {
                node_id: node_id.clone(),
            });
            let event = NodeEvent {
                message: crate::heartbeat::HEARTBEAT_MISSED.into(),
                subsystem: "Cluster".into(),
                ..NodeEvent::default()
            };
            self.propose(
                job,
                Command::NodeUpdateStatus {
                    node_id,
                    status: NodeStatus::Down,
                    event: Some(event),
                },
            );
        }
    }

    fn run_scheduler(&mut self, now: Instant, state: &ServerState) {
        if let Some(command) = self.scheduler.run(now, state) {
            let job = self.new_job(Flow::Schedule);
            self.propose(job, command);
        }
    }

    fn run_watcher(&mut self, now: Instant, state: &ServerState) {
        let releasing: alloc::collections::BTreeSet<ClaimKey> =
            self.unpublishing.keys().chain(self.abandoned.iter()).cloned().collect();
        for action in self.watcher.run(now, state, &releasing) {
            match action {
                WatcherAction::Unpublish {
                    namespace,
                    volume_id,
                    claim,
                } => {
                    self.start_unpublish(now, Waiter::Watcher, namespace, volume_id, claim, state);
                }
                WatcherAction::ClaimGc { namespace, volume_id } => {
                    let job = self.new_job(Flow::Internal);
                    let claim = CsiVolumeClaim {
                        allocation_id: String::new(),
                        node_id: String::new(),
                        external_node_id: String::new(),
                        mode: ClaimMode::Gc,
                        access_mode: AccessMode::Unknown,
                        attachment_mode: AttachmentMode::Unknown,
                        state: ClaimState::Unpublishing,
                    };
                    self.propose(
                        job,
                        Command::CsiVolumeClaim {
                            namespace,
                            volume_id,
                            claim,
                        },
                    );
                }
                WatcherAction::DeletePlugin { plugin_id } => {
                    let job = self.new_job(Flow::Internal);
                    self.propose(job, Command::CsiPluginDelete { plugin_id });
                }
            }
        }
    }

    pub fn handle_timeout(&mut self, now: Instant, state: &ServerState) {
        let expired: Vec<OpId> = self
            .client_ops
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(op, _)| *op)
            .collect();
        for op in expired {
            let (client_op, _) = self.client_ops.remove(&op).expect("present");
            self.actions.push_back(Action::CancelClientCall { op });
            let message = format!("CSI call timed out after {:?}", self.client_timeout);
            self.client_replied(now, op, client_op, Err(message), state);
        }
        self.run_heartbeats(now, state);
        self.run_watcher(now, state);
        self.run_drainer(now, state);
        self.run_scheduler(now, state);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.client_ops.values().map(|(_, deadline)| *deadline).min(),
            self.watcher.poll_timeout(),
            self.scheduler.poll_timeout(),
            self.heartbeats.poll_timeout(),
            self.drainer.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn new_eval(
        &mut self,
        namespace: &str,
        job_id: &str,
        job_type: JobType,
        priority: u32,
        trigger: &str,
    ) -> Evaluation {
        Evaluation {
            id: self.scheduler.new_id(),
            namespace: namespace.to_string(),
            priority,
            eval_type: job_type.as_str().to_string(),
            triggered_by: trigger.to_string(),
            job_id: job_id.to_string(),
            status: crate::structs::EVAL_PENDING.into(),
            ..Evaluation::default()
        }
    }

    fn new_job(&mut self, job: Flow) -> JobId {
        self.next_job += 1;
        self.jobs.insert(self.next_job, job);
        self.next_job
    }

    fn propose(&mut self, job: JobId, command: Command) {
        let op = self.ops.allocate();
        self.proposals.insert(op, job);
        self.actions.push_back(Action::Propose {
            op,
            command: alloc::boxed::Box::new(command),
        });
    }

    fn reply(&mut self, req: ReqId, reply: ServerReply) {
        self.actions.push_back(Action::Reply { req, reply });
    }

    fn proposed(&mut self, now: Instant, job_id: JobId, result: Result<(u64, Response), String>, state: &ServerState) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let outcome = match result {
            Ok((_, Response::Error(kind, message))) => Err(RpcError::new(kind, message, false)),
            Ok((index, response)) => Ok((index, response)),
            Err(message) => Err(RpcError::unavailable(message)),
        };
        match job {
            Flow::Internal => {
                self.jobs.remove(&job_id);
                if let Err(failure) = outcome {
                    tracing::debug!(error = %failure.message, "CSI garbage collection proposal failed");
                }
            }
            Flow::Schedule => {
                self.jobs.remove(&job_id);
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "scheduler proposal failed");
                }
                self.scheduler.proposed();
            }
            Flow::Drain => {
                self.jobs.remove(&job_id);
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "drainer proposal failed");
                }
                self.drainer.proposed();
            }
            Flow::NodeWrite { req, node_id } => {
                let (req, node_id) = (*req, node_id.clone());
                self.jobs.remove(&job_id);
                self.node_written(now, req, &node_id, outcome, state);
            }
            Flow::HeartbeatMissed { node_id } => {
                let node_id = node_id.clone();
                self.jobs.remove(&job_id);
                if let Err(failure) = outcome {
                    tracing::warn!(node = %node_id, error = %failure.message, "marking a node down failed");
                }
                self.heartbeats.marked(&node_id);
            }
            Flow::JobWrite {
                req,
                eval_id,
                namespace,
                job_id: id,
            } => {
                let (req, eval_id) = (*req, eval_id.clone());
                let job_modify_index = state.job(namespace, id).map_or(0, |job| job.job_modify_index);
                self.jobs.remove(&job_id);
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::JobRegistered {
                        index,
                        eval_id,
                        job_modify_index,
                    },
                    Err(error) => ServerReply::Error(error),
                };
                self.reply(req, reply);
            }
            Flow::Simple { req } | Flow::Register { req, .. } => {
                let req = *req;
                self.jobs.remove(&job_id);
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::Done { index },
                    Err(error) => ServerReply::Error(error),
                };
                self.reply(req, reply);
            }
            Flow::Claim { .. } => self.claim_committed(now, job_id, outcome, state),
            Flow::Unpublish { .. } => match outcome {
                Ok(_) => self.unpublish_continue(now, job_id, state),
                Err(error) => self.finish_unpublish(now, job_id, Err(error), state),
            },
            Flow::Detach { .. } => unreachable!("detach jobs propose nothing"),
        }
    }
}
