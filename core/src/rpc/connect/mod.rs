//! `Node.DeriveSIToken` on the leader, and the revocation of service identity tokens (the
//! 0.10.4–1.8 design of reference §5.1, with the later fixes).
//!
//! A derivation checks the request against the state (Nomad's texts, none recoverable), then
//! asks Consul for one token per task: at most [`MAX_PARALLEL_PER_DERIVE`] calls of a request
//! in flight, all calls of the leader within [`CONSUL_ACL_RATE`] per second. Once every token
//! exists their accessors are committed through Raft, and only then are the secrets handed
//! out. When one call fails the rest are not made; the tokens already created are committed
//! as *orphaned* and the error is returned (recoverable when Consul was unreachable, slow or
//! answered 5xx), so the client may ask again.
//!
//! Revocation is driven by the state alone, so any new leader resumes it: every accessor
//! that is orphaned, or whose allocation is gone or finished on its client, is revoked in
//! Consul (a token Consul no longer knows counts as revoked) and then deleted through Raft. A
//! failed revocation is retried with a doubling backoff (1 s to 60 s; Nomad retries every
//! 5 minutes). Every Consul call has a deadline owned here ([`CONSUL_ACL_TIMEOUT`]); a slow
//! or hung Consul delays only the requests that need it, never the FSM or other endpoints.
//!
//! Tokens Consul holds that the state never learned of (a leader lost before committing
//! them, a creation Consul finished after the call was given up) are found and revoked by the
//! sweep ([`sweep`]), which Nomad does not have.

mod sweep;

pub use sweep::SWEEP_INTERVAL;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::outbox::{JobId, Outbox, Owner};
use super::{Action, ReqId, RpcError, ServerReply};
use crate::connect::{CONNECT_NATIVE_PREFIX, SiTokenAccessor, group_uses_connect, proxied_service};
use crate::fsm::{Command, Response, ServerState};
use crate::op::OpId;
use crate::structs::Task;
use crate::time::Instant;

/// Consul calls in flight for one derivation (Nomad's `maxParallelRequestsPerDerive`).
pub const MAX_PARALLEL_PER_DERIVE: usize = 16;
/// Consul ACL calls per second, across the leader (Nomad's `siTokenRequestRateLimit`).
pub const CONSUL_ACL_RATE: u32 = 500;
/// How long one Consul ACL call may take.
pub const CONSUL_ACL_TIMEOUT: Duration = Duration::from_secs(10);
pub const REVOKE_RETRY_MIN: Duration = Duration::from_secs(1);
pub const REVOKE_RETRY_MAX: Duration = Duration::from_secs(60);
const _: () = assert!(
    REVOKE_RETRY_MIN.as_nanos() < REVOKE_RETRY_MAX.as_nanos(),
    "revocation backoff grows"
);
const _: () = assert!(
    MAX_PARALLEL_PER_DERIVE > 0 && CONSUL_ACL_RATE > 0,
    "derivations make progress"
);

/// A call to Consul's ACL API the leader needs made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsulAclCall {
    /// `PUT /v1/acl/token`: a local token with one service identity.
    CreateToken { description: String, service_name: String },
    /// `DELETE /v1/acl/token/:accessor`.
    RevokeToken { accessor_id: String },
    /// `GET /v1/acl/tokens`: every token's accessor and description.
    ListTokens,
}

/// One token of a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulToken {
    pub accessor_id: String,
    pub description: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsulAclReply {
    Created { accessor_id: String, secret_id: String },
    Revoked,
    Tokens(Vec<ConsulToken>),
}

/// A failed Consul call: `retryable` for a transport failure, a timeout or a 5xx; `not_found`
/// when Consul does not know the token (a revocation that already happened).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulAclError {
    pub message: String,
    pub retryable: bool,
    #[serde(default)]
    pub not_found: bool,
}

/// The description Nomad gives a service identity token.
pub fn token_description(cluster_id: &str, alloc_id: &str, task: &str) -> String {
    format!("_nomad_si [{cluster_id}] [{alloc_id}] [{task}]")
}

/// A proposal of this machine in flight.
#[derive(Debug)]
pub(super) enum ConnectFlow {
    /// The accessors of a derivation: the secrets go out once applied.
    Commit { job: JobId },
    /// Tokens of a failed derivation, committed for revocation.
    Orphans,
    /// Accessors revoked in Consul.
    Deleted { accessor_ids: Vec<String> },
}

#[derive(Debug)]
struct Derivation {
    req: ReqId,
    node_id: String,
    alloc_id: String,
    /// (task, service) still to ask for.
    pending: VecDeque<(String, String)>,
    in_flight: BTreeSet<OpId>,
    /// Task → (accessor, secret).
    created: BTreeMap<String, (String, String)>,
    failure: Option<RpcError>,
}

#[derive(Debug)]
enum Call {
    Create { job: JobId, task: String },
    Revoke { accessor_id: String },
    List,
}

#[derive(Debug, Default)]
struct Revocation {
    in_flight: Option<OpId>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

/// A token bucket: `CONSUL_ACL_RATE` calls a second, bursts up to that many.
#[derive(Debug)]
struct RateLimit {
    available: u32,
    refilled_at: Option<Instant>,
}

impl RateLimit {
    const PER_TOKEN: Duration = Duration::from_micros(1_000_000 / CONSUL_ACL_RATE as u64);

    fn take(&mut self, now: Instant) -> bool {
        let at = *self.refilled_at.get_or_insert(now);
        let earned = now.saturating_duration_since(at).as_micros() / Self::PER_TOKEN.as_micros();
        if earned > 0 {
            self.available = (self.available as u128 + earned).min(CONSUL_ACL_RATE as u128) as u32;
            self.refilled_at = Some(at + Self::PER_TOKEN * earned as u32);
        }
        if self.available == 0 {
            return false;
        }
        self.available -= 1;
        true
    }

    fn next_token_at(&self) -> Option<Instant> {
        (self.available == 0).then(|| self.refilled_at.map(|at| at + Self::PER_TOKEN))?
    }
}

#[derive(Debug)]
pub(super) struct SiTokens {
    enabled: bool,
    derivations: BTreeMap<JobId, Derivation>,
    calls: BTreeMap<OpId, (Call, Instant)>,
    revocations: BTreeMap<String, Revocation>,
    /// Revocations to make now, in the order they became due (a queue, so a leader with
    /// thousands to make does not scan them all on every call).
    ready: VecDeque<String>,
    /// Failed revocations waiting for their retry, by when.
    retries: BTreeSet<(Instant, String)>,
    /// Revoked in Consul, deletion not yet proposed / applied.
    revoked: Vec<String>,
    deleting: BTreeSet<String>,
    rate: RateLimit,
    /// A call was held back by the rate limit.
    throttled: bool,
    sweep: sweep::Sweep,
    /// The allocs and accessors table indexes the last scan for revocations saw: the scan
    /// (all accessors) runs again only when either changed, not on every leader turn.
    scanned: Option<(u64, u64)>,
    /// The agent has a Consul (`consul { address }`): without one there is nothing to sweep.
    sweep_enabled: bool,
    faults: crate::config::ConnectFaults,
}

impl SiTokens {
    pub fn new() -> Self {
        SiTokens {
            enabled: false,
            derivations: BTreeMap::new(),
            calls: BTreeMap::new(),
            revocations: BTreeMap::new(),
            ready: VecDeque::new(),
            retries: BTreeSet::new(),
            revoked: Vec::new(),
            deleting: BTreeSet::new(),
            rate: RateLimit {
                available: CONSUL_ACL_RATE,
                refilled_at: None,
            },
            throttled: false,
            sweep: sweep::Sweep::default(),
            scanned: None,
            sweep_enabled: true,
            faults: crate::config::ConnectFaults::default(),
        }
    }

    /// `consul`: the agent has a Consul to sweep; `faults`: a defect re-created on purpose.
    pub fn configure(mut self, consul: bool, faults: crate::config::ConnectFaults) -> Self {
        self.sweep_enabled = consul;
        self.faults = faults;
        self
    }

    pub fn set_enabled(&mut self, leader: bool) {
        self.enabled = leader;
        self.scanned = None;
    }

    /// `Node.DeriveSIToken`.
    pub fn request(
        &mut self,
        now: Instant,
        req: ReqId,
        (node_id, secret_id, alloc_id, tasks): (String, String, String, Vec<String>),
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let pending = match check(state, &node_id, &secret_id, &alloc_id, &tasks) {
            Ok(pending) => pending,
            Err(message) => {
                out.reply(req, ServerReply::Error(RpcError::refused(message)));
                return;
            }
        };
        let job = out.new_job();
        self.derivations.insert(
            job,
            Derivation {
                req,
                node_id,
                alloc_id,
                pending,
                in_flight: BTreeSet::new(),
                created: BTreeMap::new(),
                failure: None,
            },
        );
        self.pump(now, state, out);
    }

    /// Starts the calls the limits allow: creations of every derivation first, then
    /// revocations.
    fn pump(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        self.throttled = false;
        let cluster_id = state
            .cluster()
            .map(|cluster| cluster.cluster_id.clone())
            .unwrap_or_default();
        let jobs: Vec<JobId> = self.derivations.keys().copied().collect();
        for job in jobs {
            loop {
                let derivation = self.derivations.get_mut(&job).expect("listed");
                if derivation.failure.is_some()
                    || derivation.in_flight.len() >= MAX_PARALLEL_PER_DERIVE
                    || derivation.pending.is_empty()
                {
                    break;
                }
                if !self.rate.take(now) {
                    self.throttled = true;
                    return;
                }
                let (task, service) = derivation.pending.pop_front().expect("not empty");
                let op = out.allocate();
                derivation.in_flight.insert(op);
                let call = ConsulAclCall::CreateToken {
                    description: token_description(&cluster_id, &derivation.alloc_id, &task),
                    service_name: service,
                };
                self.calls
                    .insert(op, (Call::Create { job, task }, now + CONSUL_ACL_TIMEOUT));
                out.push(Action::Consul { op, call });
            }
        }
        while let Some((at, _)) = self.retries.first()
            && *at <= now
        {
            let (_, accessor_id) = self.retries.pop_first().expect("first");
            self.ready.push_back(accessor_id);
        }
        while let Some(accessor_id) = self.ready.front().cloned() {
            let Some(revocation) = self.revocations.get_mut(&accessor_id) else {
                self.ready.pop_front();
                continue;
            };
            if !self.rate.take(now) {
                self.throttled = true;
                return;
            }
            self.ready.pop_front();
            let op = out.allocate();
            revocation.in_flight = Some(op);
            revocation.retry_at = None;
            let call = ConsulAclCall::RevokeToken {
                accessor_id: accessor_id.clone(),
            };
            self.calls
                .insert(op, (Call::Revoke { accessor_id }, now + CONSUL_ACL_TIMEOUT));
            out.push(Action::Consul { op, call });
        }
        if self.enabled && self.sweep_enabled && self.sweep.due(now) {
            if !self.rate.take(now) {
                self.throttled = true;
                return;
            }
            let op = out.allocate();
            self.sweep.started(op);
            self.calls.insert(op, (Call::List, now + CONSUL_ACL_TIMEOUT));
            out.push(Action::Consul {
                op,
                call: ConsulAclCall::ListTokens,
            });
        }
    }

    /// A token listing came back: tokens of this cluster unknown twice in a row are revoked.
    fn listed(&mut self, now: Instant, result: Result<ConsulAclReply, ConsulAclError>, state: &ServerState) {
        let cluster_id = state
            .cluster()
            .map(|cluster| cluster.cluster_id.clone())
            .unwrap_or_default();
        let pending: BTreeSet<&String> = self
            .derivations
            .values()
            .flat_map(|derivation| derivation.created.values().map(|(accessor, _)| accessor))
            .collect();
        let known = |id: &str| {
            state.si_accessor(id).is_some()
                || pending.contains(&id.to_string())
                || self.revocations.contains_key(id)
                || self.deleting.contains(id)
                || self.revoked.iter().any(|revoked| revoked == id)
        };
        let strays = self.sweep.listed(now, result, &cluster_id, known);
        for accessor_id in strays {
            if self.faults.keep_failed_derivation_tokens {
                continue;
            }
            tracing::info!(accessor = %accessor_id, "revoking a Consul Service Identity token the cluster does not know");
            self.revoke(accessor_id);
        }
    }

    /// Queues the revocation of `accessor_id` (once).
    fn revoke(&mut self, accessor_id: String) {
        if !self.revocations.contains_key(&accessor_id) {
            self.revocations.insert(accessor_id.clone(), Revocation::default());
            self.ready.push_back(accessor_id);
        }
    }

    /// Consul answered (or the driver gave up on) the call `op`.
    pub fn consul_replied(
        &mut self,
        now: Instant,
        op: OpId,
        result: Result<ConsulAclReply, ConsulAclError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some((call, _)) = self.calls.remove(&op) else {
            return;
        };
        match call {
            Call::Create { job, task } => self.created(job, op, task, result, out),
            Call::Revoke { accessor_id } => self.revoke_answered(now, accessor_id, result),
            Call::List => self.listed(now, result, state),
        }
        self.pump(now, state, out);
    }

    fn created(
        &mut self,
        job: JobId,
        op: OpId,
        task: String,
        result: Result<ConsulAclReply, ConsulAclError>,
        out: &mut Outbox,
    ) {
        let Some(derivation) = self.derivations.get_mut(&job) else {
            return;
        };
        derivation.in_flight.remove(&op);
        match result {
            Ok(ConsulAclReply::Created { accessor_id, secret_id }) => {
                derivation.created.insert(task, (accessor_id, secret_id));
            }
            Ok(ConsulAclReply::Revoked | ConsulAclReply::Tokens(_)) => {
                derivation
                    .failure
                    .get_or_insert(RpcError::refused("unexpected reply from Consul"));
            }
            Err(error) => {
                let message = format!(
                    "failed to create Consul Service Identity token for task {task}: {}",
                    error.message
                );
                let kind = if error.retryable {
                    crate::error::ErrorKind::Unavailable
                } else {
                    crate::error::ErrorKind::Refused
                };
                derivation
                    .failure
                    .get_or_insert(RpcError::new(kind, message, error.retryable));
            }
        }
        self.finish_if_done(job, out);
    }

    /// A derivation with nothing in flight and nothing more to ask (or a failure) ends: its
    /// accessors are committed, as live tokens or as orphans.
    fn finish_if_done(&mut self, job: JobId, out: &mut Outbox) {
        let done = self
            .derivations
            .get(&job)
            .is_some_and(|d| d.in_flight.is_empty() && (d.pending.is_empty() || d.failure.is_some()));
        if !done {
            return;
        }
        let derivation = self.derivations.remove(&job).expect("present");
        let orphaned = derivation.failure.is_some();
        let accessors: Vec<SiTokenAccessor> = derivation
            .created
            .iter()
            .map(|(task, (accessor_id, _))| SiTokenAccessor {
                node_id: derivation.node_id.clone(),
                alloc_id: derivation.alloc_id.clone(),
                accessor_id: accessor_id.clone(),
                task_name: task.clone(),
                create_index: 0,
                orphaned,
            })
            .collect();
        if let Some(failure) = derivation.failure {
            tracing::warn!(alloc = %derivation.alloc_id, error = %failure.message, created = accessors.len(), "Consul Service Identity token creation for alloc failed");
            out.reply(derivation.req, ServerReply::Error(failure));
            if !accessors.is_empty() && !self.faults.keep_failed_derivation_tokens {
                out.propose_new(
                    Owner::Connect(ConnectFlow::Orphans),
                    Command::SiAccessorsUpsert { accessors },
                );
            }
            return;
        }
        self.derivations.insert(job, derivation);
        out.propose(
            job,
            Owner::Connect(ConnectFlow::Commit { job }),
            Command::SiAccessorsUpsert { accessors },
        );
    }

    fn revoke_answered(&mut self, now: Instant, accessor_id: String, result: Result<ConsulAclReply, ConsulAclError>) {
        let gone = match &result {
            Ok(_) => true,
            Err(error) => error.not_found,
        };
        if gone {
            self.revocations.remove(&accessor_id);
            self.revoked.push(accessor_id);
            return;
        }
        let Some(revocation) = self.revocations.get_mut(&accessor_id) else {
            return;
        };
        revocation.in_flight = None;
        revocation.backoff = (revocation.backoff * 2).clamp(REVOKE_RETRY_MIN, REVOKE_RETRY_MAX);
        revocation.retry_at = Some(now + revocation.backoff);
        self.retries.insert((now + revocation.backoff, accessor_id.clone()));
        if let Err(error) = result {
            tracing::warn!(accessor = %accessor_id, error = %error.message, retry_in = ?revocation.backoff, "revoking a Consul Service Identity token failed");
        }
    }

    /// A proposal of this machine came back.
    pub fn proposed(&mut self, flow: ConnectFlow, outcome: Result<(u64, Response), RpcError>, out: &mut Outbox) {
        match flow {
            ConnectFlow::Commit { job } => {
                let Some(derivation) = self.derivations.remove(&job) else {
                    return;
                };
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::SiTokens {
                        index,
                        tokens: derivation
                            .created
                            .into_iter()
                            .map(|(task, (_, secret))| (task, secret))
                            .collect(),
                    },
                    Err(error) => {
                        // Not committed: nobody else knows these tokens; revoke them now.
                        for (accessor_id, _) in derivation.created.into_values() {
                            self.revoke(accessor_id);
                        }
                        ServerReply::Error(RpcError::unavailable(format!(
                            "registering Service Identity token accessors failed: {}",
                            error.message
                        )))
                    }
                };
                out.reply(derivation.req, reply);
            }
            ConnectFlow::Orphans => {
                if let Err(error) = outcome {
                    tracing::warn!(error = %error.message, "committing orphaned Service Identity tokens failed");
                }
            }
            ConnectFlow::Deleted { accessor_ids } => {
                for id in accessor_ids {
                    self.deleting.remove(&id);
                }
                // A deletion that failed leaves its accessors to be found again.
                self.scanned = None;
            }
        }
    }

    /// The leader's turn: accessors that must go are revoked, revoked ones deleted.
    pub fn run(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        if !self.enabled {
            return;
        }
        let tables = (
            state.table_index(crate::fsm::Table::Allocs),
            state.table_index(crate::fsm::Table::SiTokenAccessors),
        );
        let rescan = self.scanned != Some(tables);
        self.scanned = Some(tables);
        let accessors = if rescan { Some(state.si_accessors()) } else { None };
        for accessor in accessors.into_iter().flatten() {
            let id = &accessor.accessor_id;
            if self.revocations.contains_key(id) || self.deleting.contains(id) || self.revoked.contains(id) {
                continue;
            }
            let finished = state
                .alloc(&accessor.alloc_id)
                .is_none_or(|alloc| alloc.client_terminal());
            if accessor.orphaned || finished {
                self.revoke(id.clone());
            }
        }
        if !self.revoked.is_empty() {
            let accessor_ids = core::mem::take(&mut self.revoked);
            self.deleting.extend(accessor_ids.iter().cloned());
            out.propose_new(
                Owner::Connect(ConnectFlow::Deleted {
                    accessor_ids: accessor_ids.clone(),
                }),
                Command::SiAccessorsDelete { accessor_ids },
            );
        }
        self.pump(now, state, out);
    }

    /// Calls past their deadline fail as retryable (and are abandoned).
    pub fn handle_timeout(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        let expired: Vec<OpId> = self
            .calls
            .iter()
            .filter(|(_, (_, deadline))| now >= *deadline)
            .map(|(op, _)| *op)
            .collect();
        for op in expired {
            out.push(Action::CancelConsulCall { op });
            let error = ConsulAclError {
                message: format!("Consul did not answer within {CONSUL_ACL_TIMEOUT:?}"),
                retryable: true,
                not_found: false,
            };
            self.consul_replied(now, op, Err(error), state, out);
        }
        self.pump(now, state, out);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadlines = self.calls.values().map(|(_, deadline)| *deadline);
        let retries = self.retries.first().map(|(at, _)| *at);
        let throttle = self.rate.next_token_at().filter(|_| self.throttled);
        let sweep = self.sweep.poll_timeout().filter(|_| self.enabled && self.sweep_enabled);
        deadlines.chain(retries).chain(throttle).chain(sweep).min()
    }

    /// Leadership lost: the requests waiting (to be failed by the composer) and every call
    /// abandoned; revocations start again from the state under the next leader.
    pub fn fail_everything(&mut self, out: &mut Outbox) -> Vec<(JobId, ReqId)> {
        for op in core::mem::take(&mut self.calls).into_keys() {
            out.push(Action::CancelConsulCall { op });
        }
        self.revocations.clear();
        self.ready.clear();
        self.retries.clear();
        self.revoked.clear();
        self.deleting.clear();
        self.sweep.reset();
        self.scanned = None;
        core::mem::take(&mut self.derivations)
            .into_iter()
            .map(|(job, derivation)| (job, derivation.req))
            .collect()
    }
}

/// Nomad's checks of `Node.DeriveSIToken`, in its order and words; the tasks to derive for,
/// with the service each one's token identifies.
fn check(
    state: &ServerState,
    node_id: &str,
    secret_id: &str,
    alloc_id: &str,
    tasks: &[String],
) -> Result<VecDeque<(String, String)>, String> {
    if node_id.is_empty() {
        return Err("missing node ID".into());
    }
    if alloc_id.is_empty() {
        return Err("missing allocation ID".into());
    }
    if tasks.is_empty() {
        return Err("no tasks specified".into());
    }
    let node = state
        .node(node_id)
        .ok_or_else(|| format!("Node {node_id:?} does not exist"))?;
    if node.secret_id != secret_id {
        return Err("SecretID mismatch".into());
    }
    let alloc = state
        .alloc(alloc_id)
        .ok_or_else(|| format!("Allocation {alloc_id:?} does not exist"))?;
    if alloc.node_id != node_id {
        return Err(format!("Allocation {alloc_id:?} not running on node {node_id:?}"));
    }
    if alloc.terminal() {
        return Err("Cannot request SI token for terminal allocation".into());
    }
    // The group as the allocation runs it (its job version), else the job's current one.
    let versions = state.job_versions(&alloc.namespace, &alloc.job_id);
    let job = versions
        .iter()
        .find(|job| job.version == alloc.job_version)
        .copied()
        .or_else(|| state.job(&alloc.namespace, &alloc.job_id));
    let group = job
        .and_then(|job| job.task_groups.iter().find(|group| group.name == alloc.task_group))
        .ok_or_else(|| {
            format!(
                "Allocation {alloc_id:?} does not contain TaskGroup {:?}",
                alloc.task_group
            )
        })?;
    if !group_uses_connect(group) {
        return Err(format!("TaskGroup {:?} does not use Connect", group.name));
    }
    let mut pending = VecDeque::new();
    let mut not_connect = Vec::new();
    for name in tasks {
        match group
            .tasks
            .iter()
            .find(|task| &task.name == name)
            .and_then(identity_service)
        {
            Some(service) => pending.push_back((name.clone(), service)),
            None => not_connect.push(name.as_str()),
        }
    }
    // Nomad 1.0–1.8 set this error and went on deriving; it is final here.
    if !not_connect.is_empty() {
        return Err(format!(
            "Requested Consul Service Identity tokens for tasks that are not Connect enabled: {}",
            not_connect.join(", ")
        ));
    }
    Ok(pending)
}

/// The service a Connect task's token identifies.
fn identity_service(task: &Task) -> Option<String> {
    proxied_service(task)
        .or_else(|| task.kind.strip_prefix(CONNECT_NATIVE_PREFIX)?.strip_prefix(':'))
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limit_allows_a_burst_of_one_second_then_one_call_per_two_milliseconds() {
        let mut rate = RateLimit {
            available: CONSUL_ACL_RATE,
            refilled_at: None,
        };
        let start = Instant::ZERO + Duration::from_secs(5);
        for _ in 0..CONSUL_ACL_RATE {
            assert!(rate.take(start));
        }
        assert!(!rate.take(start));
        assert_eq!(rate.next_token_at(), Some(start + Duration::from_millis(2)));
        assert!(!rate.take(start + Duration::from_millis(1)));
        assert!(rate.take(start + Duration::from_millis(2)));
        assert!(!rate.take(start + Duration::from_millis(3)));
        // A quiet second refills the bucket, never beyond its size.
        let later = start + Duration::from_secs(10);
        for _ in 0..CONSUL_ACL_RATE {
            assert!(rate.take(later));
        }
        assert!(!rate.take(later));
    }
}
