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

use alloc::collections::{BTreeMap, VecDeque};
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::csi::routing::{self, ControllerTarget};
use crate::csi::unpublish::{self, ControllerDetachRequest, NodeDetachRequest, Step};
use crate::csi::watcher::{GcConfig, VolumeWatcher, WatcherAction};
use crate::drainer::Drainer;
pub use crate::error::ErrorKind;
use crate::fsm::{Command, Response, ServerState};
use crate::heartbeat::{HeartbeatConfig, Heartbeats};
use crate::op::{OpId, OpIds};
use crate::scheduler::worker::Worker;
use crate::structs::{
    AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, ClientStatus, CsiCapability, CsiInfo,
    CsiMountOptions, CsiVolume, CsiVolumeClaim, DrainStrategy, DriverInfo, Evaluation, Job, JobType, Node, NodeEvent,
    NodeStatus, SchedulingEligibility,
};
use crate::time::Instant;

/// Correlates a request with its reply; chosen by the driver.
pub type ReqId = u64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerRequest {
    NodeRegister {
        node: alloc::boxed::Box<Node>,
    },
    NodeUpdateStatus {
        node_id: String,
        status: NodeStatus,
    },
    NodeUpdateCsiInfo {
        node_id: String,
        controllers: BTreeMap<String, CsiInfo>,
        nodes: BTreeMap<String, CsiInfo>,
    },
    NodeUpdateDrivers {
        node_id: String,
        drivers: BTreeMap<String, DriverInfo>,
    },
    NodeEmitEvents {
        node_id: String,
        events: Vec<NodeEvent>,
    },
    NodeDeregister {
        node_id: String,
    },
    /// `Node.UpdateDrain`: `strategy` starts or changes a drain, `None` cancels it.
    NodeUpdateDrain {
        node_id: String,
        strategy: Option<DrainStrategy>,
        mark_eligible: bool,
    },
    /// `Node.UpdateEligibility`.
    NodeUpdateEligibility {
        node_id: String,
        eligibility: SchedulingEligibility,
    },
    JobUpsert {
        job: Job,
    },
    JobDeregister {
        namespace: String,
        job_id: String,
    },
    AllocUpsert {
        allocs: Vec<Allocation>,
    },
    AllocClientUpdate {
        alloc_id: String,
        client_status: ClientStatus,
    },
    AllocDelete {
        alloc_ids: Vec<String>,
    },
    VolumeRegister {
        volumes: Vec<CsiVolume>,
    },
    VolumeDeregister {
        namespace: String,
        volume_ids: Vec<String>,
        force: bool,
    },
    VolumeClaim {
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
    },
    VolumeUnpublish {
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
    },
    VolumeDetach {
        namespace: String,
        volume_id: String,
        node_id: String,
    },
    PluginDelete {
        plugin_id: String,
    },
    /// `Job.Register`: validated, stored (a new version when the spec changed) with an
    /// evaluation; replies `JobRegistered`.
    JobRegister {
        job: alloc::boxed::Box<Job>,
    },
    /// `Job.Deregister`: stop the job (or, with `purge`, remove it) with an evaluation.
    JobStop {
        namespace: String,
        job_id: String,
        purge: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcError {
    /// What kind of failure this is (absent in replies of builds before it existed).
    #[serde(default)]
    pub kind: ErrorKind,
    pub message: String,
    /// The caller may retry (no leader, leadership lost, a retryable plugin error).
    pub retryable: bool,
}

impl RpcError {
    pub fn new(kind: ErrorKind, message: impl Into<String>, retryable: bool) -> Self {
        RpcError {
            kind,
            message: message.into(),
            retryable,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::NotFound, message, false)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::Invalid, message, false)
    }

    pub fn refused(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::Refused, message, false)
    }

    /// No leader, a lost leadership, an unreachable peer: retryable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::Unavailable, message, true)
    }

    /// A plugin's or controller's failure, retryable or not as the plugin said.
    pub fn from_plugin(message: impl Into<String>, retryable: bool) -> Self {
        let kind = if retryable {
            ErrorKind::Unavailable
        } else {
            ErrorKind::Refused
        };
        RpcError::new(kind, message, retryable)
    }
}

/// `Node.GetClientAllocs`: the allocations placed on `node_id`, as a blocking query — the
/// server answers once its applied index passes `min_index` or after `max_wait_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocsRequest {
    pub node_id: String,
    pub min_index: u64,
    pub max_wait_ms: u64,
}

/// The allocations of one node with their jobs, as of the server's applied `index`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocsReply {
    pub index: u64,
    pub allocs: Vec<(Allocation, Job)>,
    /// Allocations on other nodes that these wait for and that have finished
    /// ([`ServerState::node_allocs`]).
    pub finished_elsewhere: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerReply {
    Done {
        index: u64,
    },
    Claimed {
        index: u64,
        volume: alloc::boxed::Box<CsiVolume>,
        publish_context: BTreeMap<String, String>,
    },
    Error(RpcError),
    /// A node registration or status update (a heartbeat): the client calls in again within
    /// `heartbeat_ttl_ms` or the leader marks the node down.
    Heartbeat {
        index: u64,
        heartbeat_ttl_ms: u64,
    },
    /// A job write: the evaluation it created and the job's modify index after it.
    JobRegistered {
        index: u64,
        eval_id: String,
        job_modify_index: u64,
    },
}

impl ServerReply {
    /// The Raft index the write was applied at; `None` for an error.
    pub fn index(&self) -> Option<u64> {
        match self {
            ServerReply::Done { index }
            | ServerReply::Claimed { index, .. }
            | ServerReply::Heartbeat { index, .. }
            | ServerReply::JobRegistered { index, .. } => Some(*index),
            ServerReply::Error(_) => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerAttachRequest {
    pub plugin_id: String,
    pub volume_id: String,
    pub client_csi_node_id: String,
    pub attachment_mode: AttachmentMode,
    pub access_mode: AccessMode,
    pub mount_options: Option<CsiMountOptions>,
    pub read_only: bool,
    pub secrets: BTreeMap<String, String>,
    pub volume_context: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerValidateRequest {
    pub plugin_id: String,
    pub volume_id: String,
    pub capabilities: Vec<CsiCapability>,
    pub parameters: BTreeMap<String, String>,
    pub context: BTreeMap<String, String>,
    pub secrets: BTreeMap<String, String>,
}

/// `ClientCSI.*`: calls a server makes to a client's CSI plugins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientCsiRequest {
    ControllerAttach(ControllerAttachRequest),
    ControllerDetach(ControllerDetachRequest),
    ControllerValidate(ControllerValidateRequest),
    NodeDetach(NodeDetachRequest),
}

impl ClientCsiRequest {
    pub fn plugin_id(&self) -> &str {
        match self {
            ClientCsiRequest::ControllerAttach(request) => &request.plugin_id,
            ClientCsiRequest::ControllerDetach(request) => &request.plugin_id,
            ClientCsiRequest::ControllerValidate(request) => &request.plugin_id,
            ClientCsiRequest::NodeDetach(request) => &request.plugin_id,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientCsiReply {
    Done,
    Attached { publish_context: BTreeMap<String, String> },
}

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

    fn request(&mut self, now: Instant, req: ReqId, request: ServerRequest, state: &ServerState) {
        if !self.leader {
            self.reply(req, ServerReply::Error(RpcError::unavailable("No cluster leader")));
            return;
        }
        let simple = |command| Some(command);
        let command = match request {
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
                    return;
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
                    return;
                };
                if node.drain_strategy.is_some() && eligibility == SchedulingEligibility::Eligible {
                    self.reply(
                        req,
                        ServerReply::Error(RpcError::refused(crate::fsm::DRAINING_NOT_ELIGIBLE)),
                    );
                    return;
                }
                simple(Command::NodeUpdateEligibility { node_id, eligibility })
            }
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
                    return;
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
                    return;
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
        };
        if let Some(command) = command {
            let job = self.new_job(Flow::Simple { req });
            self.propose(job, command);
        }
    }

    /// `Node.UpdateStatus`, which is also the client's heartbeat: the deadline moves on, and
    /// only a change of status goes through Raft (a down node that calls in is ready again).
    fn update_status(&mut self, now: Instant, req: ReqId, node_id: String, status: NodeStatus, state: &ServerState) {
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

    fn register(&mut self, now: Instant, req: ReqId, volumes: Vec<CsiVolume>, state: &ServerState) {
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

    fn detach(
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

    fn start_unpublish(
        &mut self,
        now: Instant,
        waiter: Waiter,
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
        state: &ServerState,
    ) {
        let key = (namespace.clone(), volume_id.clone(), claim.allocation_id.clone());
        if let Some(job) = self.unpublishing.get(&key).copied()
            && let Some(Flow::Unpublish { waiters, .. }) = self.jobs.get_mut(&job)
        {
            waiters.push(waiter);
            return;
        }
        if state.volume(&namespace, &volume_id).is_none() {
            self.finish_waiter(now, waiter, Err(RpcError::not_found("volume not found")), state);
            return;
        }
        let mut claim = claim;
        if claim.state == ClaimState::Taken {
            claim.state = ClaimState::Unpublishing;
        }
        let job = self.new_job(Flow::Unpublish {
            key: key.clone(),
            claim: claim.clone(),
            waiters: vec![waiter],
        });
        self.unpublishing.insert(key, job);
        // Checkpoint the claim as given before any external call.
        self.propose(
            job,
            Command::CsiVolumeClaim {
                namespace,
                volume_id,
                claim,
            },
        );
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
                let reply = match outcome {
                    Ok((index, _)) => {
                        let live = state.node(&node_id).is_some_and(|node| node.status != NodeStatus::Down);
                        let ttl = if live {
                            self.heartbeats.reset(now, &node_id, state)
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
            Flow::Claim {
                req,
                claim,
                index,
                volume,
                namespace,
                volume_id,
            } => {
                let req = *req;
                let (new_index, response) = match outcome {
                    Ok(done) => done,
                    Err(error) => {
                        self.jobs.remove(&job_id);
                        self.reply(req, ServerReply::Error(error));
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
                self.publish(now, job_id, req, new_index, claim, stored, state);
            }
            Flow::Unpublish { .. } => match outcome {
                Ok(_) => self.unpublish_continue(now, job_id, state),
                Err(error) => self.finish_unpublish(now, job_id, Err(error), state),
            },
            Flow::Detach { .. } => unreachable!("detach jobs propose nothing"),
        }
    }

    /// After a claim commits: controller-publish new claims on plugins with attach/detach.
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &mut self,
        now: Instant,
        job: JobId,
        req: ReqId,
        index: u64,
        claim: CsiVolumeClaim,
        volume: CsiVolume,
        state: &ServerState,
    ) {
        let needs_publish = claim.state == ClaimState::Taken
            && claim.mode != ClaimMode::Gc
            && volume.plugin_health.controller_required
            && state
                .plugin(&volume.plugin_id)
                .is_some_and(|plugin| plugin.supports_attach_detach());
        if !needs_publish {
            self.jobs.remove(&job);
            self.reply(
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
            self.reply(req, ServerReply::Error(RpcError::unavailable(message)));
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
        self.enqueue_controller(now, job, request, state);
    }

    fn unpublish_continue(&mut self, now: Instant, job_id: JobId, state: &ServerState) {
        let Some(Flow::Unpublish { key, claim, .. }) = self.jobs.get(&job_id) else {
            return;
        };
        let (namespace, volume_id, _) = key.clone();
        let claim = claim.clone();
        let Some(volume) = state.volume(&namespace, &volume_id) else {
            // The volume is gone (force-deregistered): nothing left to release.
            self.finish_unpublish(now, job_id, Ok(()), state);
            return;
        };
        match unpublish::next_step_with(state, &volume, &claim, self.faults.node_detach_on_down_node) {
            Step::Done => self.finish_unpublish(now, job_id, Ok(()), state),
            Step::Checkpoint(next) => {
                if claim.state == ClaimState::ReadyToFree
                    && next.state == ClaimState::ReadyToFree
                    && self.committed_free(&volume, &claim)
                {
                    self.finish_unpublish(now, job_id, Ok(()), state);
                    return;
                }
                self.set_claim(job_id, next.clone());
                self.propose(
                    job_id,
                    Command::CsiVolumeClaim {
                        namespace,
                        volume_id,
                        claim: next,
                    },
                );
            }
            Step::NodeDetach(request) => {
                let Some(node) = state.node(&request.node_id) else {
                    let mut next = claim.clone();
                    next.state = ClaimState::NodeDetached;
                    self.set_claim(job_id, next.clone());
                    self.propose(
                        job_id,
                        Command::CsiVolumeClaim {
                            namespace,
                            volume_id,
                            claim: next,
                        },
                    );
                    return;
                };
                let op = self.ops.allocate();
                self.client_ops
                    .insert(op, (ClientOp::Node { job: job_id }, now + self.client_timeout));
                self.actions.push_back(Action::CallClient {
                    op,
                    node_id: request.node_id.clone(),
                    rpc_addr: node.rpc_addr.clone(),
                    request: ClientCsiRequest::NodeDetach(request),
                });
            }
            Step::ControllerDetach(request) => {
                self.enqueue_controller(now, job_id, ClientCsiRequest::ControllerDetach(request), state);
            }
        }
    }

    fn committed_free(&self, volume: &CsiVolume, claim: &CsiVolumeClaim) -> bool {
        !volume.past_claims.contains_key(&claim.allocation_id)
            && !volume.read_claims.contains_key(&claim.allocation_id)
            && !volume.write_claims.contains_key(&claim.allocation_id)
    }

    fn set_claim(&mut self, job_id: JobId, next: CsiVolumeClaim) {
        if let Some(Flow::Unpublish { claim, .. }) = self.jobs.get_mut(&job_id) {
            *claim = next;
        }
    }

    fn finish_unpublish(&mut self, now: Instant, job_id: JobId, result: Result<(), RpcError>, state: &ServerState) {
        let Some(Flow::Unpublish { key, waiters, .. }) = self.jobs.remove(&job_id) else {
            return;
        };
        self.unpublishing.remove(&key);
        if result.is_err() && self.faults.abandon_failed_unpublish {
            self.abandoned.insert(key.clone());
        }
        for waiter in waiters {
            self.finish_waiter(now, waiter, result.clone(), state);
        }
    }

    fn finish_waiter(&mut self, _now: Instant, waiter: Waiter, result: Result<(), RpcError>, state: &ServerState) {
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
                self.reply(req, reply);
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
                    self.reply(req, reply);
                }
            }
        }
    }

    fn enqueue_controller(&mut self, now: Instant, job: JobId, request: ClientCsiRequest, state: &ServerState) {
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
    fn dispatch(&mut self, now: Instant, plugin_id: &str, state: &ServerState) {
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

    fn send_controller(&mut self, now: Instant, plugin_id: &str, call: ControllerCall) {
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

    fn client_replied(
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
                    let Some(Flow::Unpublish { key, claim, .. }) = self.jobs.get(&job) else {
                        return;
                    };
                    let (namespace, volume_id, _) = key.clone();
                    let mut next = claim.clone();
                    next.state = ClaimState::NodeDetached;
                    self.set_claim(job, next.clone());
                    self.propose(
                        job,
                        Command::CsiVolumeClaim {
                            namespace,
                            volume_id,
                            claim: next,
                        },
                    );
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
    fn controller_done(
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
            Flow::Unpublish { key, claim, .. } => match result {
                Ok(_) => {
                    let (namespace, volume_id, _) = key.clone();
                    let mut next = claim.clone();
                    next.state = ClaimState::ReadyToFree;
                    self.set_claim(job_id, next.clone());
                    self.propose(
                        job_id,
                        Command::CsiVolumeClaim {
                            namespace,
                            volume_id,
                            claim: next,
                        },
                    );
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

    fn fail_everything(&mut self, why: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::csi::tests::{Fixture, alloc, claim, node, volume};

    struct Harness {
        fx: Fixture,
        machine: RpcEndpoints,
        now: Instant,
        calls: Vec<(OpId, String, ClientCsiRequest)>,
        replies: Vec<(ReqId, ServerReply)>,
        log: Vec<String>,
    }

    impl Harness {
        fn new() -> Self {
            let mut fx = Fixture::new();
            fx.ok(Command::NodeRegister { node: node("n1", true) });
            fx.ok(Command::NodeRegister { node: node("n2", true) });
            fx.ok(Command::CsiVolumeRegister {
                volumes: vec![volume("v"), volume("w")],
            });
            fx.ok(Command::AllocUpsert {
                allocs: vec![alloc("a1", "n1"), alloc("a2", "n2")],
            });
            let mut machine = RpcEndpoints::new(
                Duration::from_secs(10),
                GcConfig::default(),
                HeartbeatConfig::default(),
                crate::config::CsiFaults::default(),
                7,
            );
            machine.handle(Instant::ZERO, Input::Leadership { leader: true }, &fx.state);
            Harness {
                fx,
                machine,
                now: Instant::ZERO,
                calls: Vec::new(),
                replies: Vec::new(),
                log: Vec::new(),
            }
        }

        /// Drains actions; proposals are committed at once, client calls are recorded.
        fn pump(&mut self) {
            while let Some(action) = self.machine.poll_action() {
                match action {
                    Action::Propose { op, command } => {
                        if let Command::CsiVolumeClaim { claim, .. } = &*command {
                            self.log.push(format!("checkpoint {:?}", claim.state));
                        }
                        let response = self.fx.apply(*command);
                        let index = self.fx.index;
                        self.machine.handle(
                            self.now,
                            Input::Proposed {
                                op,
                                result: Ok((index, response)),
                            },
                            &self.fx.state,
                        );
                    }
                    Action::CallClient {
                        op, node_id, request, ..
                    } => {
                        self.log.push(format!("call {node_id} {}", kind(&request)));
                        self.calls.push((op, node_id, request));
                    }
                    Action::Reply { req, reply } => self.replies.push((req, reply)),
                    Action::CancelClientCall { op } => self.log.push(format!("cancel {op}")),
                }
            }
        }

        fn request(&mut self, req: ReqId, request: ServerRequest) {
            self.machine
                .handle(self.now, Input::Request { req, request }, &self.fx.state);
            self.pump();
        }

        fn answer(&mut self, index: usize, result: Result<ClientCsiReply, String>) {
            let (op, _, _) = self.calls.remove(index);
            self.machine
                .handle(self.now, Input::ClientReplied { op, result }, &self.fx.state);
            self.pump();
        }
    }

    fn kind(request: &ClientCsiRequest) -> &'static str {
        match request {
            ClientCsiRequest::ControllerAttach(_) => "controller-attach",
            ClientCsiRequest::ControllerDetach(_) => "controller-detach",
            ClientCsiRequest::ControllerValidate(_) => "controller-validate",
            ClientCsiRequest::NodeDetach(_) => "node-detach",
        }
    }

    fn take(alloc: &str, node: &str) -> ServerRequest {
        ServerRequest::VolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim(alloc, node, ClaimMode::Write, ClaimState::Taken),
        }
    }

    #[test]
    fn a_new_claim_is_committed_then_controller_published() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        assert_eq!(h.log, ["checkpoint Taken", "call n1 controller-attach"]);
        let ClientCsiRequest::ControllerAttach(attach) = &h.calls[0].2 else {
            panic!()
        };
        assert_eq!(attach.client_csi_node_id, "ext-plug-n1");
        assert!(
            h.fx.state
                .volume("default", "v")
                .unwrap()
                .write_claims
                .contains_key("a1"),
            "committed before the call"
        );
        h.answer(
            0,
            Ok(ClientCsiReply::Attached {
                publish_context: [("dev".into(), "/dev/x".into())].into(),
            }),
        );
        let (req, ServerReply::Claimed { publish_context, .. }) = &h.replies[0] else {
            panic!("{:?}", h.replies)
        };
        assert_eq!((*req, publish_context["dev"].as_str()), (1, "/dev/x"));
    }

    #[test]
    fn controller_calls_are_serialised_per_plugin() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.request(
            2,
            ServerRequest::VolumeClaim {
                namespace: "default".into(),
                volume_id: "w".into(),
                claim: claim("a2", "n2", ClaimMode::Write, ClaimState::Taken),
            },
        );
        assert_eq!(h.calls.len(), 1, "the second publish waits for the first");
        h.answer(0, Ok(ClientCsiReply::Done));
        assert_eq!(h.calls.len(), 1);
        h.answer(0, Ok(ClientCsiReply::Done));
        assert_eq!(h.replies.len(), 2);
    }

    #[test]
    fn retryable_controller_errors_move_to_the_next_controller_in_sorted_order() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        assert_eq!(h.calls[0].1, "n1");
        h.answer(0, Err(format!("{RETRYABLE_PREFIX}: plugin not ready")));
        assert_eq!(h.calls[0].1, "n2");
        h.answer(0, Err("rpc error: code = FailedPrecondition desc = busy".into()));
        let ServerReply::Error(failure) = &h.replies[0].1 else {
            panic!()
        };
        assert!(
            failure.retryable && failure.message.starts_with(RETRYABLE_PREFIX),
            "{failure:?}"
        );
    }

    #[test]
    fn unpublish_walks_node_then_controller_committing_each_step() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.answer(0, Ok(ClientCsiReply::Done));
        h.log.clear();
        h.request(
            2,
            ServerRequest::VolumeUnpublish {
                namespace: "default".into(),
                volume_id: "v".into(),
                claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
            },
        );
        h.answer(0, Ok(ClientCsiReply::Done));
        h.answer(0, Ok(ClientCsiReply::Done));
        assert_eq!(
            h.log,
            [
                "checkpoint Unpublishing",
                "call n1 node-detach",
                "checkpoint NodeDetached",
                "call n1 controller-detach",
                "checkpoint ReadyToFree",
            ]
        );
        assert!(matches!(h.replies.last(), Some((2, ServerReply::Done { .. }))));
        let vol = h.fx.state.volume("default", "v").unwrap();
        assert!(vol.write_claims.is_empty() && vol.past_claims.is_empty());
    }

    #[test]
    fn a_client_that_never_answers_fails_the_walk_at_the_deadline_and_the_watcher_resumes_it() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.answer(0, Ok(ClientCsiReply::Done));
        let unpublish = || ServerRequest::VolumeUnpublish {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
        };
        h.request(2, unpublish());
        assert_eq!(h.calls.len(), 1);
        h.now = Instant::ZERO + Duration::from_secs(10);
        h.machine.handle_timeout(h.now, &h.fx.state);
        h.pump();
        let ServerReply::Error(failure) = &h.replies.last().unwrap().1 else {
            panic!()
        };
        assert!(
            failure.retryable && failure.message.contains("timed out"),
            "{failure:?}"
        );
        assert_eq!(
            h.fx.state.volume("default", "v").unwrap().past_claims["a1"].state,
            ClaimState::Unpublishing
        );
        // The watcher picks the checkpointed claim up again at once (the late answer to the
        // first call is ignored) and a new request joins its walk.
        assert_eq!(h.calls.len(), 2, "{:?}", h.log);
        let (stale, _, _) = h.calls.remove(0);
        h.machine.handle(
            h.now,
            Input::ClientReplied {
                op: stale,
                result: Ok(ClientCsiReply::Done),
            },
            &h.fx.state,
        );
        h.pump();
        assert_eq!(kind(&h.calls[0].2), "node-detach");
        h.request(3, unpublish());
        assert_eq!(h.calls.len(), 1, "shared walk, no second call");
        h.answer(0, Ok(ClientCsiReply::Done));
        h.answer(0, Ok(ClientCsiReply::Done));
        assert!(matches!(h.replies.last(), Some((3, ServerReply::Done { .. }))));
        assert!(h.fx.state.volume("default", "v").unwrap().past_claims.is_empty());
    }

    #[test]
    fn the_watcher_releases_terminal_allocs_claims_rate_limited_and_stops_when_leadership_is_lost() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.answer(0, Ok(ClientCsiReply::Done));
        h.log.clear();
        // The alloc finishes: nobody asks, the watcher releases its claim.
        h.fx.ok(Command::AllocClientUpdate {
            alloc_id: "a1".into(),
            client_status: ClientStatus::Complete,
        });
        h.machine.handle_timeout(h.now, &h.fx.state);
        h.pump();
        assert_eq!(h.log, ["checkpoint Unpublishing", "call n1 node-detach"]);
        assert_eq!(h.machine.watcher().workers(), 1);
        // A failing node: every pass re-drives, at most once a second after the burst.
        let mut passes = 0;
        for second in 1..=10 {
            h.answer(0, Err("connection refused".into()));
            h.now = Instant::ZERO + Duration::from_secs(second);
            h.machine.handle_timeout(h.now, &h.fx.state);
            h.pump();
            passes += h.calls.len();
        }
        assert_eq!(passes, 10, "one retry per second");
        h.machine
            .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
        h.pump();
        assert_eq!(h.machine.watcher().workers(), 0);
        assert_eq!(h.machine.poll_timeout(), None);
    }

    #[test]
    fn claim_gc_bumps_old_volumes_with_past_claims() {
        let mut h = Harness::new();
        h.fx.ok(Command::AllocUpsert {
            allocs: vec![alloc("gone", "n1")],
        });
        h.fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "w".into(),
            claim: claim("gone", "n1", ClaimMode::Write, ClaimState::Taken),
        });
        h.fx.ok(Command::AllocDelete {
            alloc_ids: vec!["gone".into()],
        });
        let before = h.fx.state.volume("default", "w").unwrap().modify_index;
        // Advance the cluster clock past the 5 minute threshold with an unrelated write.
        for _ in 0..400 {
            h.fx.ok(Command::EvalUpsert { evals: vec![] });
        }
        h.now = Instant::ZERO + Duration::from_secs(300);
        h.machine.handle_timeout(h.now, &h.fx.state);
        h.pump();
        assert!(
            h.fx.state.volume("default", "w").unwrap().modify_index > before,
            "GC claim bumped the volume"
        );
    }

    #[test]
    fn a_down_node_is_skipped_and_concurrent_unpublishes_share_one_walk() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.answer(0, Ok(ClientCsiReply::Done));
        h.fx.ok(Command::NodeUpdateStatus {
            node_id: "n1".into(),
            status: NodeStatus::Down,
            event: None,
        });
        h.log.clear();
        let unpublish = ServerRequest::VolumeUnpublish {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
        };
        h.request(2, unpublish.clone());
        h.request(3, unpublish);
        // No node call at all; the controller call is the only external step, and it is shared.
        assert_eq!(
            h.log,
            [
                "checkpoint Unpublishing",
                "checkpoint NodeDetached",
                "call n2 controller-detach"
            ]
        );
        h.answer(0, Ok(ClientCsiReply::Done));
        assert_eq!(
            h.replies
                .iter()
                .filter(|(_, reply)| matches!(reply, ServerReply::Done { .. }))
                .count(),
            2
        );
    }

    #[test]
    fn losing_leadership_fails_everything_in_flight_as_retryable() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.machine
            .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
        h.pump();
        let ServerReply::Error(failure) = &h.replies[0].1 else {
            panic!()
        };
        assert!(failure.retryable);
        h.request(2, take("a2", "n2"));
        let ServerReply::Error(failure) = &h.replies[1].1 else {
            panic!()
        };
        assert_eq!(failure.message, "No cluster leader");
        assert_eq!(h.machine.poll_timeout(), None);
    }

    #[test]
    fn register_validates_with_a_controller_first() {
        let mut h = Harness::new();
        let mut new = volume("x");
        new.external_id = "vol-123".into();
        h.request(
            1,
            ServerRequest::VolumeRegister {
                volumes: vec![new.clone()],
            },
        );
        let ClientCsiRequest::ControllerValidate(validate) = &h.calls[0].2 else {
            panic!()
        };
        assert_eq!(validate.volume_id, "vol-123");
        assert!(
            h.fx.state.volume("default", "x").is_none(),
            "not stored before validation"
        );
        h.answer(0, Ok(ClientCsiReply::Done));
        assert!(h.fx.state.volume("default", "x").is_some());
        h.request(
            2,
            ServerRequest::VolumeRegister {
                volumes: vec![volume("y")],
            },
        );
        h.answer(0, Err("rpc error: code = InvalidArgument desc = no such volume".into()));
        let ServerReply::Error(failure) = &h.replies[1].1 else {
            panic!()
        };
        assert!(
            failure.message.starts_with("controller validate volume:"),
            "{failure:?}"
        );
        assert!(h.fx.state.volume("default", "y").is_none());
    }

    #[test]
    fn detach_releases_every_claim_of_the_volume_on_the_node() {
        let mut h = Harness::new();
        h.request(1, take("a1", "n1"));
        h.answer(0, Ok(ClientCsiReply::Done));
        h.request(
            2,
            ServerRequest::VolumeDetach {
                namespace: "default".into(),
                volume_id: "v".into(),
                node_id: "n1".into(),
            },
        );
        h.answer(0, Ok(ClientCsiReply::Done));
        h.answer(0, Ok(ClientCsiReply::Done));
        assert!(matches!(h.replies.last(), Some((2, ServerReply::Done { .. }))));
        assert!(h.fx.state.volume("default", "v").unwrap().write_claims.is_empty());
    }

    impl Harness {
        fn advance(&mut self, by: Duration) {
            self.now = self.now + by;
            self.machine.handle_timeout(self.now, &self.fx.state);
            self.pump();
        }

        fn status(&self, node: &str) -> NodeStatus {
            self.fx.state.node(node).unwrap().status
        }

        fn heartbeat(&mut self, req: ReqId, node: &str) -> ServerReply {
            self.request(
                req,
                ServerRequest::NodeUpdateStatus {
                    node_id: node.into(),
                    status: NodeStatus::Ready,
                },
            );
            self.replies.last().unwrap().1.clone()
        }
    }

    fn ttl_of(reply: &ServerReply) -> Duration {
        let ServerReply::Heartbeat { heartbeat_ttl_ms, .. } = reply else {
            panic!("not a heartbeat reply: {reply:?}")
        };
        Duration::from_millis(*heartbeat_ttl_ms)
    }

    #[test]
    fn a_node_that_stops_heartbeating_is_marked_down_after_its_ttl_and_grace() {
        let mut h = Harness::new();
        let grace = HeartbeatConfig::default().grace;
        let index = h.fx.index;
        let ttl = ttl_of(&h.heartbeat(1, "n1"));
        // Nomad's TTL: at least 10 s, staggered by up to another TTL.
        assert!(
            ttl >= Duration::from_secs(10) && ttl < Duration::from_secs(20),
            "{ttl:?}"
        );
        assert_eq!(h.fx.index, index, "an unchanged status is not written through Raft");
        h.advance(ttl + grace - Duration::from_millis(1));
        assert_eq!(h.status("n1"), NodeStatus::Ready);
        // A heartbeat in time moves the deadline on.
        let ttl = ttl_of(&h.heartbeat(2, "n1"));
        h.advance(ttl + grace - Duration::from_millis(1));
        assert_eq!(h.status("n1"), NodeStatus::Ready);
        h.advance(Duration::from_millis(1));
        assert_eq!(h.status("n1"), NodeStatus::Down);
        let event = h.fx.state.node("n1").unwrap().events.last().cloned().unwrap();
        assert_eq!(
            (event.subsystem.as_str(), event.message.as_str()),
            ("Cluster", "Node heartbeat missed")
        );
        assert_eq!(h.machine.heartbeats().deadline("n1"), None, "a down node is not timed");
        // n2 never heartbeated to this leader: it still has the failover TTL.
        assert_eq!(h.status("n2"), NodeStatus::Ready);
    }

    #[test]
    fn a_new_leader_gives_every_live_node_the_failover_ttl() {
        let mut h = Harness::new();
        let failover = HeartbeatConfig::default().failover_ttl;
        assert_eq!(h.machine.heartbeats().deadline("n1"), Some(Instant::ZERO + failover));
        h.advance(failover - Duration::from_secs(1));
        assert_eq!((h.status("n1"), h.status("n2")), (NodeStatus::Ready, NodeStatus::Ready));
        ttl_of(&h.heartbeat(1, "n2"));
        h.advance(Duration::from_secs(1));
        assert_eq!((h.status("n1"), h.status("n2")), (NodeStatus::Down, NodeStatus::Ready));
        // Leadership lost and regained: the clock starts again from the failover TTL.
        h.machine
            .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
        h.machine.handle(h.now, Input::Leadership { leader: true }, &h.fx.state);
        assert_eq!(h.machine.heartbeats().deadline("n2"), Some(h.now + failover));
        assert_eq!(h.machine.heartbeats().deadline("n1"), None);
    }

    #[test]
    fn a_down_node_that_heartbeats_is_ready_again_and_unknown_nodes_are_told_so() {
        let mut h = Harness::new();
        h.advance(HeartbeatConfig::default().failover_ttl);
        assert_eq!(h.status("n1"), NodeStatus::Down);
        let index = h.fx.index;
        let reply = h.heartbeat(1, "n1");
        assert!(ttl_of(&reply) >= Duration::from_secs(10));
        assert!(h.fx.index > index, "a status change is written through Raft");
        assert_eq!(h.status("n1"), NodeStatus::Ready);
        let event = h.fx.state.node("n1").unwrap().events.last().cloned().unwrap();
        assert_eq!(event.message, "Node reregistered by heartbeat");
        assert!(h.machine.heartbeats().deadline("n1").is_some());
        let ServerReply::Error(failure) = h.heartbeat(2, "n9") else {
            panic!()
        };
        assert!(
            !failure.retryable && failure.message.contains("node not found"),
            "{failure:?}"
        );
    }

    #[test]
    fn the_ttl_grows_with_the_cluster_past_the_heartbeat_rate() {
        let mut h = Harness::new();
        for i in 0..1_000 {
            h.fx.ok(Command::NodeRegister {
                node: node(&format!("m{i:04}"), true),
            });
        }
        // 1,002 nodes at 50 heartbeats a second: 20.04 s, staggered by up to as much again.
        for req in 0..20 {
            let ttl = ttl_of(&h.heartbeat(req, "n1"));
            assert!(
                ttl >= Duration::from_millis(20_040) && ttl < Duration::from_millis(40_080),
                "{ttl:?}"
            );
        }
    }
}
