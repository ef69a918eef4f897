//! The server's write endpoints (`Node.*`, `Alloc.*`, `Job.*`, `CSIVolume.*`, `CSIPlugin.*`)
//! and the leader's background machines, composed.
//!
//! Each concern is its own machine with its own module: [`nodes`] (node writes and the
//! heartbeats that mark silent nodes down), [`jobs`] (job and allocation writes, and the
//! scheduler worker), [`csi`] (the CSI flows that call clients, their controller queues, and
//! the volume watcher), and the node drainer ([`crate::drainer`]). They share one
//! [`outbox::Outbox`]: one op id space, one ordered action queue, and the proposals in flight
//! with the machine each belongs to. The composer here routes requests, proposal results,
//! client answers, leadership and time to them. Simple writes are proposed through Raft and
//! answered when applied; losing leadership fails every request in flight as retryable.
//!
//! Reads of the state store come in as `&ServerState`; no machine ever writes it.

#[allow(unused_imports)]
use crate::prelude::*;

pub mod authz;
mod connect;
mod csi;
mod deployments;
mod jobs;
mod messages;
mod nodes;
pub(crate) mod outbox;
#[cfg(test)]
mod tests;
mod varlocks;

pub use connect::{
    CONSUL_ACL_RATE, CONSUL_ACL_TIMEOUT, ConsulAclCall, ConsulAclError, ConsulAclReply, ConsulToken,
    MAX_PARALLEL_PER_DERIVE, SWEEP_INTERVAL, token_description,
};
pub use deployments::DeploymentRequest;
pub use messages::*;

use alloc::collections::VecDeque;
use core::time::Duration;

use crate::csi::watcher::{GcConfig, VolumeWatcher};
use crate::drainer::Drainer;
use crate::fsm::{Command, Response, ServerState};
use crate::heartbeat::{HeartbeatConfig, Heartbeats};
use crate::op::OpId;
use crate::time::Instant;
use outbox::{JobId, Outbox, Owner};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Request {
        req: ReqId,
        request: ServerRequest,
        /// What the caller proved ([`authz::check`] decides on it first).
        authority: authz::Authority,
    },
    Proposed {
        op: OpId,
        result: Result<(u64, Response), crate::error::Failure>,
    },
    ClientReplied {
        op: OpId,
        result: Result<ClientCsiReply, crate::error::CsiCallError>,
    },
    /// Consul's answer to an [`Action::Consul`] call.
    ConsulReplied {
        op: OpId,
        result: Result<ConsulAclReply, ConsulAclError>,
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
    /// A call to Consul's ACL API (service identity tokens); answered with
    /// [`Input::ConsulReplied`]. The core owns its deadline.
    Consul {
        op: OpId,
        call: ConsulAclCall,
    },
    /// Abandon a `Consul` call past its deadline or of a lost leadership.
    CancelConsulCall {
        op: OpId,
    },
}

/// Nomad wraps plugin `FailedPrecondition` errors so callers retry.
pub const RETRYABLE_PREFIX: &str = "CSI client error (retryable)";

/// How long a request waits for a leader (Nomad's `rpc_hold_timeout`).
pub const RPC_HOLD_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a consistent read that found no leader waits before it asks again, after
/// `attempt` (from 0) such tries: 50 ms doubling to 500 ms, for at most [`RPC_HOLD_TIMEOUT`]
/// in all, as Nomad holds every RPC (reads too) through an election.
pub fn read_hold_pause(attempt: u32) -> Duration {
    Duration::from_millis(50)
        .saturating_mul(1u32 << attempt.min(8))
        .min(Duration::from_millis(500))
}

/// Requests held at most; more are refused at once, as before.
const HELD_MAX: usize = 1024;

/// The leader's machines behind one interface (see the module documentation).
#[derive(Debug)]
pub struct RpcEndpoints {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    leader: bool,
    /// No other server is known to lead: this one may be about to (elected, or its barrier
    /// not applied yet), so requests wait rather than fail.
    holding: bool,
    /// Requests that arrived while [`Self::holding`], each with when it gives up: served in
    /// arrival order once this server leads (Nomad's RPC hold, `rpc_hold_timeout`).
    held: VecDeque<(Instant, ReqId, ServerRequest, authz::Authority)>,
    out: Outbox,
    nodes: nodes::NodeEndpoints,
    jobs: jobs::JobEndpoints,
    drainer: Drainer,
    deployments: crate::deploy::watcher::DeploymentWatcher,
    periodic: crate::periodic::PeriodicDispatcher,
    core_gc: crate::gc::periodic::PeriodicGc,
    csi: csi::CsiEndpoints,
    si_tokens: connect::SiTokens,
    var_locks: varlocks::LockExpiry,
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
            clock: crate::time::Monotonic::default(),
            leader: false,
            // No leader is known when a server starts.
            holding: true,
            held: VecDeque::new(),
            out: Outbox::default(),
            nodes: nodes::NodeEndpoints::new(heartbeat, seed ^ 0x4ea7),
            jobs: jobs::JobEndpoints::new(seed),
            drainer: Drainer::with_faults(faults),
            deployments: Default::default(),
            periodic: Default::default(),
            core_gc: Default::default(),
            csi: csi::CsiEndpoints::new(client_timeout, gc, faults),
            si_tokens: connect::SiTokens::new(),
            var_locks: Default::default(),
        }
    }

    /// What one job may ask (`server { job_max_* }`).
    pub fn with_job_limits(mut self, limits: crate::jobspec::limits::JobLimits) -> Self {
        self.jobs.set_limits(limits);
        self
    }

    /// The leader's periodic garbage collection (`server { *_gc_threshold }`).
    pub fn with_core_gc(mut self, config: crate::gc::periodic::CoreGcConfig) -> Self {
        self.core_gc = crate::gc::periodic::PeriodicGc::new(config);
        self
    }

    /// A scheduler defect re-created on purpose (a regression switch of the simulation).
    pub fn with_scheduler_faults(mut self, faults: crate::config::SchedulerFaults) -> Self {
        self.jobs.set_scheduler_faults(faults);
        self.periodic = core::mem::take(&mut self.periodic).with_faults(faults);
        self
    }

    /// Whether the agent has a Consul (the token sweep runs only then), and a Connect defect
    /// re-created on purpose (a regression switch of the simulation).
    pub fn with_connect(mut self, consul: bool, faults: crate::config::ConnectFaults) -> Self {
        self.si_tokens = core::mem::replace(&mut self.si_tokens, connect::SiTokens::new()).configure(consul, faults);
        self
    }

    /// The cron arithmetic periodic jobs are launched by (see [`crate::periodic`]).
    pub fn with_calendar(mut self, calendar: alloc::sync::Arc<dyn crate::periodic::Calendar>) -> Self {
        self.periodic = self.periodic.with_calendar(calendar);
        self
    }

    /// The wall clock (Unix ms) at `now`: the driver reads it before every step.
    pub fn set_wall_clock(&mut self, now: Instant, unix_ms: u64) {
        self.periodic.set_wall_clock(now, unix_ms);
    }

    pub fn watcher(&self) -> &VolumeWatcher {
        self.csi.watcher()
    }

    pub fn is_leader(&self) -> bool {
        self.leader
    }

    pub fn is_holding(&self) -> bool {
        self.holding
    }

    /// Whether requests that reach this server while it does not lead are held (`true`: no
    /// other server is known to lead, so this one may be about to — Raft elected it and the
    /// core has not heard yet, or its barrier is not applied) or refused at once (`false`:
    /// another leads, or this one lost its term). The driver hands a request to this machine
    /// only when Raft names this server leader, so a hold lasts only as long as the core
    /// takes to catch up: a client registering the moment a dev agent's server wins is served
    /// then, where it was told "No cluster leader" and retried a second later. Held ones are
    /// served when leadership comes ([`Input::Leadership`]), refused when holding ends first
    /// or after [`RPC_HOLD_TIMEOUT`] (Nomad's `rpc_hold_timeout`).
    pub fn set_holding(&mut self, holding: bool) {
        self.holding = holding;
        if !holding && !self.leader {
            self.fail_held(|_| true);
        }
    }

    fn fail_held(&mut self, which: impl Fn(Instant) -> bool) {
        let (failed, kept): (VecDeque<_>, VecDeque<_>) = core::mem::take(&mut self.held)
            .into_iter()
            .partition(|(until, ..)| which(*until));
        self.held = kept;
        for (_, req, ..) in failed {
            self.out
                .reply(req, ServerReply::Error(RpcError::unavailable("No cluster leader")));
        }
    }

    pub fn heartbeats(&self) -> &Heartbeats {
        self.nodes.heartbeats()
    }

    /// Releases in flight, by (namespace, volume, allocation).
    pub fn unpublishing(&self) -> impl Iterator<Item = &(String, String, String)> {
        self.csi.unpublishing()
    }

    pub fn handle(&mut self, now: Instant, input: Input, state: &ServerState) {
        self.clock.observe(now);
        match input {
            Input::Request {
                req,
                request,
                authority,
            } => self.request(now, req, request, &authority, state),
            Input::Proposed { op, result } => {
                for (job, owner, result) in self.out.landed(op, result) {
                    self.proposed(now, job, owner, result, state);
                }
            }
            Input::ClientReplied { op, result } => {
                debug_assert!(
                    self.out.issued(op),
                    "a client's answer for {op}, which this leader never issued"
                );
                self.csi.client_answered(now, op, result, state, &mut self.out)
            }
            Input::ConsulReplied { op, result } => self.si_tokens.consul_replied(now, op, result, state, &mut self.out),
            Input::Leadership { leader } => {
                if self.leader && !leader {
                    self.fail_everything("leadership lost");
                }
                self.leader = leader;
                self.csi.set_enabled(now, leader);
                self.jobs.set_enabled(now, leader);
                self.nodes.set_enabled(leader);
                self.drainer.set_enabled(leader);
                self.deployments.set_enabled(leader);
                self.periodic.set_enabled(leader);
                self.core_gc.set_enabled(now, leader);
                self.si_tokens.set_enabled(leader);
                self.var_locks.set_enabled(leader);
                if leader {
                    for (_, req, request, authority) in core::mem::take(&mut self.held) {
                        self.request(now, req, request, &authority, state);
                    }
                }
            }
        }
        self.run(now, state);
    }

    pub fn handle_timeout(&mut self, now: Instant, state: &ServerState) {
        self.clock.observe(now);
        self.fail_held(|until| until <= now);
        self.csi.handle_timeout(now, state, &mut self.out);
        self.si_tokens.handle_timeout(now, state, &mut self.out);
        self.run(now, state);
    }

    /// The background machines' turn, in a fixed order.
    fn run(&mut self, now: Instant, state: &ServerState) {
        self.nodes.run(now, state, &mut self.out);
        self.csi.run_watcher(now, state, &mut self.out);
        let jobs = &mut self.jobs;
        if let Some(command) = self.drainer.run(now, state, &mut || jobs.new_id()) {
            self.out.propose_new(Owner::Drainer, command);
        }
        if let Some(command) = self.deployments.run(now, state, &mut || jobs.new_id()) {
            self.out.propose_new(Owner::Deployments, command);
        }
        if let Some(command) = self.periodic.run(now, state, &mut || jobs.new_id()) {
            self.out.propose_new(Owner::Periodic, command);
        }
        if let Some(command) = self.core_gc.run(now, state) {
            self.out.propose_new(Owner::CoreGc, command);
        }
        if let Some(command) = self.var_locks.run(now, self.periodic.wall_at(now), state) {
            self.out.propose_new(Owner::VarLocks, command);
        }
        self.jobs.run(now, state, &mut self.out);
        self.si_tokens.run(now, state, &mut self.out);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.csi.poll_timeout(),
            self.jobs.poll_timeout(),
            self.nodes.poll_timeout(),
            self.drainer.poll_timeout(),
            self.deployments.poll_timeout(),
            self.periodic.poll_timeout(),
            self.core_gc.poll_timeout(),
            self.si_tokens.poll_timeout(),
            self.var_locks.poll_timeout(),
            self.held.iter().map(|(until, ..)| *until).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop()
    }

    /// Answers `req` with `error` at once (a request refused before it reached its endpoint).
    pub fn refuse(&mut self, req: ReqId, error: RpcError) {
        self.out.reply(req, ServerReply::Error(error));
    }

    fn request(
        &mut self,
        now: Instant,
        req: ReqId,
        request: ServerRequest,
        authority: &authz::Authority,
        state: &ServerState,
    ) {
        if !self.leader {
            if self.holding && self.held.len() < HELD_MAX {
                self.held
                    .push_back((now + RPC_HOLD_TIMEOUT, req, request, authority.clone()));
                return;
            }
            self.out
                .reply(req, ServerReply::Error(RpcError::unavailable("No cluster leader")));
            return;
        }
        if let Err(error) = authz::check(&request, authority, state) {
            tracing::warn!(error = %error.message, "refused a request its caller may not make");
            self.out.reply(req, ServerReply::Error(error));
            return;
        }
        // A client speaks only for its own node: the secret it registered with (Nomad's
        // `node secret ID does not match`). A node not stored yet is left to each endpoint.
        if let Some((node_id, secret_id)) = request.node_credential()
            && let Some(node) = state.node(node_id)
            && node.secret_id != secret_id
        {
            let text = authz::node_secret_mismatch(&request);
            tracing::warn!(node = %node_id, "refused a call with the wrong node secret");
            self.out.reply(req, ServerReply::Error(RpcError::invalid(text)));
            return;
        }
        use ServerRequest as R;
        let out = &mut self.out;
        let command = match request {
            R::VariablesRead { paths, .. } => {
                out.reply(req, read_variables(&paths, state));
                None
            }
            request @ (R::NodeRegister { .. }
            | R::NodeUpdateStatus { .. }
            | R::NodeUpdateCsiInfo { .. }
            | R::NodeUpdateDrivers { .. }
            | R::NodeEmitEvents { .. }
            | R::NodeDeregister { .. }
            | R::NodeUpdateDrain { .. }
            | R::NodeUpdateEligibility { .. }) => self.nodes.request(now, req, request, state, out),
            request @ (R::JobUpsert { .. }
            | R::JobDeregister { .. }
            | R::JobRegister { .. }
            | R::JobStop { .. }
            | R::JobEvaluate { .. }
            | R::NodeEvaluate { .. }
            | R::AllocUpsert { .. }
            | R::AllocClientUpdate { .. }
            | R::AllocClientUpdates { .. }
            | R::AllocDelete { .. }
            | R::AllocStop { .. }) => self.jobs.request(req, request, state, out),
            R::JobScale(request) => {
                self.jobs.scale(req, *request, state, out);
                None
            }
            request @ R::JobDispatch(_) => {
                let wall_ms = self.periodic.wall_at(now).unwrap_or_default();
                self.jobs.dispatch(req, request, wall_ms, state, out);
                None
            }
            R::PeriodicForce { namespace, job_id } => {
                self.force_periodic(now, req, &namespace, &job_id, state);
                None
            }
            R::SystemGc => Some(Command::SystemGc {
                garbage: crate::gc::collect(state),
            }),
            R::ReconcileSummaries => Some(Command::ReconcileSummaries),
            R::AutopilotSetConfig { config, cas } => Some(Command::AutopilotSetConfig { config, cas }),
            R::Operator(_) => {
                // The agent routes these to the server machine; one arriving here is a bug.
                out.reply(
                    req,
                    ServerReply::Error(RpcError::invalid("operator request sent to the write endpoints")),
                );
                None
            }
            R::Deployment(request) => {
                self.jobs.deployment_request(req, request, state, out);
                None
            }
            R::DeriveSiToken {
                node_id,
                secret_id,
                alloc_id,
                tasks,
            } => {
                let request = (node_id, secret_id, alloc_id, tasks);
                self.si_tokens.request(now, req, request, state, out);
                None
            }
            request => self.csi.request(now, req, request, state, out),
        };
        if let Some(command) = command {
            self.out.propose_new(Owner::Simple { req }, command);
        }
    }

    /// `Periodic.Force`: the parent's child launched now, answered like a register with the
    /// child's evaluation (Nomad's texts for a job that is not periodic).
    fn force_periodic(&mut self, now: Instant, req: ReqId, namespace: &str, job_id: &str, state: &ServerState) {
        let refused = match state.job(namespace, job_id) {
            None => Some(RpcError::not_found(format!("job {job_id:?} not found"))),
            Some(job) if !job.is_periodic() => Some(RpcError::invalid("can't force launch non-periodic job")),
            Some(job) if !job.is_periodic_active() => Some(RpcError::invalid(format!(
                "can't force run non-tracked job {job_id:?} ({namespace})"
            ))),
            Some(_) => None,
        };
        if let Some(error) = refused {
            self.out.reply(req, ServerReply::Error(error));
            return;
        }
        let (Some(parent), Some(wall_ms)) = (state.job(namespace, job_id), self.periodic.wall_at(now)) else {
            return;
        };
        let jobs = &mut self.jobs;
        let command = crate::periodic::launch(state, parent, wall_ms, true, 0, &mut || jobs.new_id());
        let Command::PeriodicLaunch { child: Some(child), .. } = &command else {
            return;
        };
        let flow = jobs::JobFlow::Write {
            req,
            eval_id: child.1.id.clone(),
            namespace: namespace.to_string(),
            job_id: child.0.id.clone(),
        };
        self.out.propose_new(Owner::Jobs(flow), command);
    }

    /// A proposal came back: to the machine that made it.
    fn proposed(
        &mut self,
        now: Instant,
        job: JobId,
        owner: Owner,
        result: Result<(u64, Response), crate::error::Failure>,
        state: &ServerState,
    ) {
        let outcome = match result {
            Ok((_, Response::Error(kind, message))) => Err(RpcError::new(kind, message, kind == ErrorKind::Busy)),
            Ok((index, response)) => Ok((index, response)),
            Err(failure) => Err(RpcError::from(failure)),
        };
        let out = &mut self.out;
        match owner {
            Owner::Simple { req } => {
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::Done { index },
                    Err(error) => ServerReply::Error(error),
                };
                out.reply(req, reply);
            }
            Owner::Nodes(flow) => self.nodes.proposed(now, flow, outcome, state, out),
            Owner::Jobs(flow) => self.jobs.proposed(flow, outcome, state, out),
            Owner::Drainer => {
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "drainer proposal failed");
                }
                self.drainer.proposed();
            }
            Owner::Deployments => {
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "deployment watcher proposal failed");
                }
                self.deployments.proposed();
            }
            Owner::Periodic => {
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "periodic launch failed");
                }
                self.periodic.proposed();
            }
            Owner::CoreGc => {
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "periodic garbage collection failed");
                }
                self.core_gc.proposed();
            }
            Owner::VarLocks => {
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "variable lock expiry failed");
                }
                self.var_locks.proposed();
            }
            Owner::Csi => self.csi.proposed(now, job, outcome, state, out),
            Owner::Connect(flow) => self.si_tokens.proposed(flow, outcome, out),
        }
    }

    /// Leadership is lost: every request still waiting fails as retryable, in the order the
    /// work arrived, and every client call is abandoned.
    fn fail_everything(&mut self, why: &str) {
        let mut waiting = self.csi.fail_everything();
        waiting.extend(self.si_tokens.fail_everything(&mut self.out));
        for (_, (job, owner)) in self.out.take_proposals() {
            match owner {
                Owner::Simple { req } | Owner::Nodes(nodes::NodeFlow::Write { req, .. }) => waiting.push((job, req)),
                Owner::Nodes(nodes::NodeFlow::HeartbeatMissed { .. }) | Owner::Csi | Owner::Connect(_) => {}
                Owner::Jobs(flow) => waiting.extend(self.jobs.abandoned(&flow).map(|req| (job, req))),
                Owner::Drainer => self.drainer.proposed(),
                Owner::Deployments => self.deployments.proposed(),
                Owner::Periodic => self.periodic.proposed(),
                Owner::CoreGc => self.core_gc.proposed(),
                Owner::VarLocks => self.var_locks.proposed(),
            }
        }
        waiting.sort_by_key(|(job, _)| *job);
        for (_, req) in waiting {
            self.out.reply(req, ServerReply::Error(RpcError::unavailable(why)));
        }
        self.csi.abandon_calls(&mut self.out);
    }
}

/// The variables at `paths` as the leader's applied state holds them.
fn read_variables(paths: &[String], state: &ServerState) -> ServerReply {
    let variables = paths
        .iter()
        .filter_map(|path| {
            let variable = state.variable(path)?;
            Some((
                path.clone(),
                messages::VariableItems {
                    items: variable.items.clone(),
                    modify_index: variable.modify_index,
                },
            ))
        })
        .collect();
    ServerReply::Variables {
        index: state.table_index(crate::fsm::Table::Variables),
        variables,
    }
}
