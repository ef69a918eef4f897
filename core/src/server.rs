//! The server machine: gossip membership, the bootstrap decision, discovery (retry-join and
//! Consul), and the leader's duties that are about cluster shape (adding servers to Raft,
//! stamping leadership).
//!
//! Raft itself (openraft) runs in the driver; this machine sees it only through
//! [`Input::RaftObserved`] and drives it only through actions.
//!
//! Inputs ([`Input`]): gossip packets, resolved join targets, `Status.Peers` answers, Raft
//! initialisation and membership-change outcomes, Raft observations, Consul answers.
//! Actions ([`Action`]): packets to send, names to resolve, RPCs, Raft operations, Consul calls.

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::net::SocketAddr;
use core::time::Duration;

use rand_010::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::bootstrap::{BootState, Bootstrap, BootstrapAction, Peer};
use crate::config::{AgentConfig, ServerConfig};
use crate::election::{ElectionAction, Elections};
use crate::fsm::Command;
use crate::membership::{MemberId, MemberView, Membership, ServerTags};
use crate::op::{OpId, OpIds};
use crate::time::Instant;

mod operator;
pub mod reads;
pub mod snapshots;
pub use operator::OperatorRequest;

/// Deadline for adding one server to the Raft configuration (the learner must catch up).
const RAFT_CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long after a failed Raft configuration change the leader reconciles again (at most its
/// reconcile interval): Raft refuses a change while another is uncommitted, and retried at
/// once the removal went round some 14,000 times a second while a partition held the earlier
/// change back (swarm seed 442).
const RAFT_CHANGE_RETRY: Duration = Duration::from_secs(1);
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::election::{RaftRole, RaftView};

impl RaftView {
    pub fn peer_count(&self) -> usize {
        self.voters.len() + self.learners.len()
    }

    fn contains(&self, id: u64) -> bool {
        self.voters.contains(&id) || self.learners.contains(&id)
    }
}

/// The first live server of `region` the leader's Raft configuration does not hold as it
/// asks to be held: absent altogether, or a learner though it is no non-voter. The second is
/// a voter autopilot removed while it was gone (openraft keeps a removed voter as a learner):
/// once it is back it votes again, as Nomad's reconciliation re-adds a live serf member that
/// Raft lost, instead of staying a learner until it dies once more.
/// `learner_left_behind` re-creates the defect (`RaftFaults::learner_left_behind`).
pub fn server_to_add(members: &[MemberId], raft: &RaftView, region: &str, learner_left_behind: bool) -> Option<Peer> {
    members.iter().find_map(|member| {
        let tags = member.tags.as_ref()?;
        let learner_held = tags.nonvoter || learner_left_behind;
        let held = raft.voters.contains(&tags.id) || (learner_held && raft.learners.contains(&tags.id));
        (tags.region == region && !held).then(|| Peer {
            id: tags.id,
            name: member.name.clone(),
            rpc_addr: tags.rpc_addr,
            nonvoter: tags.nonvoter,
        })
    })
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// The answer to [`Action::AskLeaderContact`]: milliseconds since the last AppendEntries
    /// (`None`: none arrived since the agent started).
    LeaderContact {
        silent_for_ms: Option<u64>,
    },
    /// A leader leaving gracefully named this server its successor.
    StandForElection,
    /// The answer to [`Action::PreVote`]: whether a majority of the voters would vote for us.
    PreVoteAnswered {
        granted: bool,
    },
    GossipReceived {
        data: Vec<u8>,
    },
    /// An operator's `server join`: announce this server to each gossip address.
    Join {
        addrs: Vec<SocketAddr>,
    },
    JoinResolved {
        op: OpId,
        result: Result<Vec<SocketAddr>, crate::error::Failure>,
    },
    PeersAnswered {
        op: OpId,
        result: Result<Vec<String>, crate::error::Failure>,
    },
    RaftInitialized {
        op: OpId,
        result: Result<(), crate::error::Failure>,
    },
    RaftObserved(RaftView),
    ServerAdded {
        op: OpId,
        result: Result<(), crate::error::Failure>,
    },
    /// The outcome of [`Action::RemoveRaftServer`].
    ServerRemoved {
        op: OpId,
        result: Result<(), crate::error::Failure>,
    },
    Proposed {
        op: OpId,
        result: Result<u64, crate::error::Failure>,
    },
    /// The answer to [`Action::AskLogProgress`]: the last applied index and the last
    /// snapshot's (0: none).
    LogProgress {
        applied: u64,
        snapshot: u64,
    },
    ConsulServersFound {
        op: OpId,
        result: Result<Vec<SocketAddr>, crate::error::Failure>,
    },
    ConsulRegistered {
        op: OpId,
        result: Result<(), crate::error::Failure>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    SendGossip {
        to: SocketAddr,
        data: Vec<u8>,
    },
    /// Resolve a `retry_join` entry ("ip", "ip:port", "host:port"); `default_port` if none.
    ResolveJoin {
        op: OpId,
        target: String,
        default_port: u16,
    },
    QueryPeers {
        op: OpId,
        peer: Peer,
    },
    InitializeRaft {
        op: OpId,
        servers: Vec<Peer>,
    },
    PersistBootstrapped,
    /// Add a server to the Raft configuration (as a voter unless `peer.nonvoter`).
    AddRaftServer {
        op: OpId,
        peer: Peer,
    },
    /// Remove a server (a voter when `voter`) from the Raft configuration altogether.
    RemoveRaftServer {
        op: OpId,
        id: u64,
        voter: bool,
    },
    /// The answer to an operator's request ([`OperatorRequest`]).
    Reply {
        req: crate::rpc::ReqId,
        reply: crate::rpc::ServerReply,
    },
    Propose {
        op: OpId,
        command: alloc::boxed::Box<Command>,
    },
    /// Start a Raft election now (the core runs the election timer: [`crate::election`]).
    Elect,
    /// Answer with [`Input::LeaderContact`]: how long since the last AppendEntries arrived.
    AskLeaderContact,
    /// Ask every voter for a pre-vote; answer with [`Input::PreVoteAnswered`].
    PreVote,
    /// Answer with [`Input::LogProgress`]: how far the log is applied and snapshotted.
    AskLogProgress,
    /// Snapshot the state now ([`snapshots::SnapshotPolicy`] decided it).
    Snapshot,
    LookupConsul {
        op: OpId,
        service: String,
        tag: String,
    },
    RegisterConsul {
        op: OpId,
        service: String,
        tags: Vec<String>,
        addr: SocketAddr,
        id: String,
    },
}

/// A pending operation whose outcome the core waits for, with its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    Join,
    AddServer,
    RemoveServer,
    /// The leadership barrier of this term (`LeadershipEstablished`).
    Barrier(u64),
    ConsulLookup,
    ConsulRegister,
}

#[derive(Debug)]
pub struct Server {
    /// When to look whether a snapshot is due.
    snapshots: snapshots::SnapshotPolicy,
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    config: ServerConfig,
    consul: crate::config::ConsulConfig,
    region: String,
    name: String,
    serf_addr: SocketAddr,
    node_id: u64,
    membership: Membership,
    bootstrap: Bootstrap,
    raft: RaftView,
    led_term: Option<u64>,
    /// The term whose leadership barrier this server proposed and saw applied: from then on
    /// its state holds every entry of earlier terms, and the leader's endpoints may act.
    established_term: Option<u64>,
    ops: OpIds,
    pending: BTreeMap<OpId, (Pending, Instant)>,
    rng: ChaCha8Rng,
    join_attempts: u32,
    join_retry_at: Option<Instant>,
    consul_poll_at: Option<Instant>,
    /// The catalog registrations still to make (`auto_advertise`): the server's serf address
    /// (servers find each other by it) and its RPC address (clients find servers by it,
    /// `client_auto_join`), as Nomad registers its `serf` and `rpc` services.
    consul_unregistered: VecDeque<(&'static str, SocketAddr)>,
    reconcile_at: Option<Instant>,
    /// The autopilot settings in force (the replicated ones once set, else the agent's).
    autopilot: crate::autopilot::AutopilotConfig,
    /// Since when each server of the Raft configuration has been gone from gossip (leader).
    gone: crate::autopilot::GoneSince,
    /// Operators waiting on a removal, by its operation.
    operator_replies: BTreeMap<OpId, crate::rpc::ReqId>,
    elections: Elections,
    actions: VecDeque<Action>,
}

/// Read-only view for the HTTP API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub node_id: u64,
    pub bootstrap_expect: u32,
    pub bootstrapped: bool,
    pub members: Vec<MemberView>,
    pub raft: RaftView,
}

impl Server {
    /// `node_id` is the persisted Raft id, `generation` grows with every restart, and
    /// `seed` feeds every random choice this machine makes.
    pub fn new(now: Instant, config: &AgentConfig, node_id: u64, generation: u64, boot: BootState, seed: u64) -> Self {
        assert!(config.server.enabled, "a server machine needs server mode");
        let server = &config.server;
        let tags = ServerTags {
            region: config.region.clone(),
            datacenter: config.datacenter.clone(),
            id: node_id,
            rpc_addr: config.advertise.rpc,
            expect: server.bootstrap_expect,
            bootstrap: server.bootstrap_expect == 1,
            nonvoter: server.non_voting_server,
            build: String::from(env!("CARGO_PKG_VERSION")),
        };
        let me = MemberId {
            name: format!("{}.{}", config.name, config.region),
            addr: config.advertise.serf,
            generation: generation << 32,
            tags: Some(tags),
        };
        let snapshots = snapshots::SnapshotPolicy::new(
            now,
            server.timing.snapshot_interval,
            server.timing.snapshot_threshold,
            seed,
        );
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let membership = Membership::new(me, &server.timing.gossip, rng.random());
        let bootstrap = Bootstrap::new(
            now,
            server.bootstrap_expect,
            config.region.clone(),
            node_id,
            server.timing,
            server.bootstrap_fault,
            boot,
        );
        let consul_enabled = config.consul.address.is_some();
        let mut this = Server {
            snapshots,
            clock: crate::time::Monotonic::default(),
            config: server.clone(),
            consul: config.consul.clone(),
            region: config.region.clone(),
            name: format!("{}.{}", config.name, config.region),
            serf_addr: config.advertise.serf,
            node_id,
            membership,
            bootstrap,
            raft: RaftView::default(),
            led_term: None,
            established_term: None,
            ops: OpIds::default(),
            pending: BTreeMap::new(),
            rng,
            join_attempts: 0,
            join_retry_at: (!server.retry_join.is_empty()).then_some(now),
            consul_poll_at: (consul_enabled && (config.consul.server_auto_join || config.consul.auto_advertise))
                .then_some(now),
            consul_unregistered: if consul_enabled && config.consul.auto_advertise {
                VecDeque::from([("serf", config.advertise.serf), ("rpc", config.advertise.rpc)])
            } else {
                VecDeque::new()
            },
            reconcile_at: None,
            autopilot: server.autopilot,
            gone: Default::default(),
            operator_replies: BTreeMap::new(),
            elections: Elections::new(now, node_id, server.timing.elections()),
            actions: VecDeque::new(),
        };
        this.drain_children();
        this
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    pub fn handle(&mut self, now: Instant, input: Input) {
        self.clock.observe(now);
        match input {
            Input::GossipReceived { data } => self.membership.handle_packet(now, &data),
            Input::Join { addrs } => {
                for addr in addrs {
                    tracing::info!(%addr, "operator: joining gossip");
                    self.membership.join(now, addr);
                }
            }
            Input::JoinResolved { op, result } => {
                if self.complete(op).is_some() {
                    match result {
                        Ok(addrs) => {
                            let known = self.live_gossip_addrs();
                            for addr in addrs.into_iter().filter(|addr| !known.contains(addr)) {
                                self.membership.join(now, addr);
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "retry_join: could not resolve address")
                        }
                    }
                }
            }
            Input::PeersAnswered { op, result } => self.bootstrap.handle_peers(now, op, result, &mut self.ops),
            Input::RaftInitialized { op, result } => self.bootstrap.handle_initialized(op, result),
            Input::RaftObserved(view) => self.observe_raft(now, view),
            Input::LogProgress { applied, snapshot } => {
                if self.snapshots.wants_snapshot(applied, snapshot) {
                    self.actions.push_back(Action::Snapshot);
                }
            }
            Input::LeaderContact { silent_for_ms } => {
                let silent = silent_for_ms.map(Duration::from_millis);
                let action = self.elections.contact(now, silent, &mut self.rng);
                self.election_action(action);
            }
            Input::PreVoteAnswered { granted } => {
                let action = self.elections.pre_vote_result(now, granted, &mut self.rng);
                self.election_action(action);
            }
            Input::StandForElection => {
                tracing::info!("named successor by the leaving leader; standing once its lease runs out");
                let action = self.elections.stand_now(now);
                self.election_action(action);
            }
            Input::ServerAdded { op, result } => {
                if self.complete(op).is_some() {
                    if let Err(error) = &result {
                        tracing::warn!(%error, "failed to add server to the Raft configuration");
                    }
                    self.raft_change_done(now, result.is_ok());
                }
            }
            Input::ServerRemoved { op, result } => self.server_removed(now, op, result),
            Input::Proposed { op, result } => {
                if let Some(Pending::Barrier(term)) = self.complete(op) {
                    match result {
                        Ok(_) if self.led_term == Some(term) => self.established_term = Some(term),
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, "leadership barrier was not committed");
                            self.retry_barrier(now, term);
                        }
                    }
                }
            }
            Input::ConsulServersFound { op, result } => {
                if self.complete(op).is_some() {
                    self.handle_consul_servers(now, result);
                }
            }
            Input::ConsulRegistered { op, result } => {
                if self.complete(op).is_some() {
                    match result {
                        Ok(()) => {
                            self.consul_unregistered.pop_front();
                            self.register_consul(now);
                        }
                        Err(error) => {
                            tracing::warn!(%error, "failed to register with Consul; will retry")
                        }
                    }
                }
            }
        }
        self.after_input(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock.observe(now);
        self.membership.handle_timeout(now);
        let members = self.membership.live_members();
        self.bootstrap.handle_timeout(now, &members, &mut self.ops);
        self.expire_pending(now);
        if self.join_retry_at.is_some_and(|at| at <= now) {
            self.retry_join(now);
        }
        if self.consul_poll_at.is_some_and(|at| at <= now) {
            self.poll_consul(now);
        }
        if self.reconcile_at.is_some_and(|at| at <= now) {
            self.reconcile(now);
        }
        let action = self.elections.handle_timeout(now, &mut self.rng);
        self.election_action(action);
        if self.snapshots.handle_timeout(now) {
            self.actions.push_back(Action::AskLogProgress);
        }
        self.after_input(now);
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.membership.poll_timeout(),
            self.bootstrap.poll_timeout(),
            self.pending.values().map(|(_, deadline)| *deadline).min(),
            self.join_retry_at,
            self.consul_poll_at,
            self.reconcile_at,
            self.elections.poll_timeout(),
            Some(self.snapshots.poll_timeout()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn status(&self) -> ServerStatus {
        ServerStatus {
            node_id: self.node_id,
            bootstrap_expect: self.bootstrap.expect(),
            bootstrapped: self.bootstrap.is_bootstrapped(),
            members: self.membership.all_members(),
            raft: self.raft.clone(),
        }
    }

    /// The gossip member name of this server (`name.region`).
    pub fn member_name(&self) -> &str {
        &self.name
    }

    fn after_input(&mut self, now: Instant) {
        if self.membership.take_changed() {
            let members = self.membership.live_members();
            self.bootstrap.evaluate(now, &members, &mut self.ops);
            if self.is_leader() {
                self.reconcile_at = Some(now);
            }
        }
        self.drain_children();
    }

    fn drain_children(&mut self) {
        while let Some((to, data)) = self.membership.poll_send() {
            self.actions.push_back(Action::SendGossip { to, data });
        }
        while let Some(action) = self.bootstrap.poll_action() {
            self.actions.push_back(match action {
                BootstrapAction::QueryPeers { op, peer } => Action::QueryPeers { op, peer },
                BootstrapAction::Initialize { op, servers } => Action::InitializeRaft { op, servers },
                BootstrapAction::PersistBootstrapped => Action::PersistBootstrapped,
            });
        }
    }

    pub fn is_leader(&self) -> bool {
        self.raft.role == RaftRole::Leader
    }

    /// Raft names another server leader.
    pub fn leader_elsewhere(&self) -> bool {
        self.raft.leader.is_some_and(|leader| leader != self.node_id)
    }

    /// Leads, and its leadership barrier is applied: its state holds everything committed
    /// by earlier leaders (Nomad's barrier in `establishLeadership`). Before that, a new
    /// leader's scheduler could plan from a state lacking its predecessor's last plans and
    /// place an allocation twice (found by csi_leader_failover, seed 17).
    pub fn leads(&self) -> bool {
        self.is_leader() && self.established_term == Some(self.raft.term)
    }

    /// Proposes this term's leadership barrier; its application is awaited before the
    /// endpoints act.
    fn propose_barrier(&mut self, now: Instant) {
        let term = self.raft.term;
        let cluster_id = format!("{:016x}{:016x}", self.rng.random::<u64>(), self.rng.random::<u64>());
        let op = self.start(now, Pending::Barrier(term), PROPOSE_TIMEOUT);
        self.actions.push_back(Action::Propose {
            op,
            command: alloc::boxed::Box::new(Command::LeadershipEstablished {
                leader_id: self.node_id,
                term,
                cluster_id,
            }),
        });
    }

    /// A barrier that failed or timed out is proposed again while this term lasts.
    fn retry_barrier(&mut self, now: Instant, term: u64) {
        if self.is_leader() && self.raft.term == term && self.established_term != Some(term) {
            self.propose_barrier(now);
        }
    }

    fn observe_raft(&mut self, now: Instant, view: RaftView) {
        self.bootstrap.observe_raft(view.last_log_index, view.leader.is_some());
        let became_leader = view.role == RaftRole::Leader && self.led_term != Some(view.term);
        self.raft = view;
        if became_leader {
            self.gone.clear();
            self.led_term = Some(self.raft.term);
            tracing::info!(term = self.raft.term, "leadership gained");
            self.propose_barrier(now);
            self.reconcile_at = Some(now);
        }
        if !self.is_leader() {
            self.reconcile_at = None;
            self.gone.clear();
            self.abandon_operator_replies();
        }
        let action = self.elections.observe(now, &self.raft, &mut self.rng);
        self.election_action(action);
    }

    fn election_action(&mut self, action: Option<ElectionAction>) {
        match action {
            Some(ElectionAction::Elect) => self.actions.push_back(Action::Elect),
            Some(ElectionAction::AskContact) => self.actions.push_back(Action::AskLeaderContact),
            Some(ElectionAction::PreVote) => self.actions.push_back(Action::PreVote),
            None => {}
        }
    }

    /// A configuration change is over: the next goes at once after a success, a retry only
    /// after [`RAFT_CHANGE_RETRY`].
    fn raft_change_done(&mut self, now: Instant, succeeded: bool) {
        self.reconcile_at = Some(if succeeded {
            now
        } else {
            now + RAFT_CHANGE_RETRY.min(self.config.timing.reconcile_interval)
        });
    }

    /// Leader duty: every live server of our region that gossip knows but Raft does not is added.
    fn reconcile(&mut self, now: Instant) {
        self.reconcile_at = None;
        if !self.is_leader() {
            return;
        }
        self.reconcile_at = Some(now + self.config.timing.reconcile_interval);
        self.observe_gone(now);
        if self.busy(Pending::AddServer) || self.busy(Pending::RemoveServer) {
            return;
        }
        let learner_left_behind = self.config.raft_faults.learner_left_behind;
        if let Some(peer) = server_to_add(
            &self.membership.live_members(),
            &self.raft,
            &self.region,
            learner_left_behind,
        ) {
            tracing::info!(server = %peer.name, id = peer.id, nonvoter = peer.nonvoter, "adding server to the Raft configuration");
            let op = self.start(now, Pending::AddServer, RAFT_CHANGE_TIMEOUT);
            self.actions.push_back(Action::AddRaftServer { op, peer });
            return;
        }
        self.prune_dead_servers(now);
    }

    /// Re-announces to the `retry_join` targets that are not live gossip members (the
    /// resolved addresses of live ones are skipped when they come back). Nomad stops after the
    /// first successful join, which leaves servers that came up on opposite sides of a
    /// partition in two gossip islands forever. While isolated or with no Raft leader known,
    /// each round counts against `retry_max`; with a leader it goes on uncounted, as serf's
    /// reconnect to failed members does: a server autopilot removed while it was partitioned
    /// away, whose view still held a member that had died meanwhile and the leader its
    /// predecessor had been, was otherwise never seen again by the restarted leader, nor it by
    /// the leader (swarm seed 1146).
    fn retry_join(&mut self, now: Instant) {
        self.join_retry_at = Some(now + self.config.retry_interval);
        let isolated = self.membership.peer_count() == 0;
        let reconnecting = !isolated && self.raft.leader.is_some();
        if reconnecting && self.config.raft_faults.no_gossip_reconnect {
            return;
        }
        if !reconnecting {
            if self.config.retry_max != 0 && self.join_attempts >= self.config.retry_max {
                if self.join_attempts == self.config.retry_max {
                    tracing::error!(
                        attempts = self.join_attempts,
                        "retry_join: giving up after retry_max attempts"
                    );
                    self.join_attempts += 1;
                }
                return;
            }
            self.join_attempts += 1;
        }
        for target in self.config.retry_join.clone() {
            let op = self.start(now, Pending::Join, self.config.retry_interval);
            self.actions.push_back(Action::ResolveJoin {
                op,
                target,
                default_port: self.serf_addr.port(),
            });
        }
    }

    fn poll_consul(&mut self, now: Instant) {
        let jitter_ms = self
            .rng
            .random_range(0..=self.consul.poll_interval.as_millis() as u64 / 4);
        self.consul_poll_at = Some(now + self.consul.poll_interval + Duration::from_millis(jitter_ms));
        self.register_consul(now);
        let expected = self.bootstrap.expect().max(1) as usize;
        let wanted = self.consul.server_auto_join && self.raft.leader.is_none() && self.raft.peer_count() < expected;
        if wanted && !self.busy(Pending::ConsulLookup) {
            let op = self.start(now, Pending::ConsulLookup, self.consul.timeout);
            self.actions.push_back(Action::LookupConsul {
                op,
                service: self.consul.server_service_name.clone(),
                tag: String::from("serf"),
            });
        }
    }

    /// The next catalog registration, unless one is in flight or none is left.
    fn register_consul(&mut self, now: Instant) {
        let Some(&(tag, addr)) = self.consul_unregistered.front() else {
            return;
        };
        if self.busy(Pending::ConsulRegister) {
            return;
        }
        let op = self.start(now, Pending::ConsulRegister, self.consul.timeout);
        self.actions.push_back(Action::RegisterConsul {
            op,
            service: self.consul.server_service_name.clone(),
            tags: alloc::vec![String::from(tag)],
            addr,
            id: format!("_nomad-server-{}-{tag}", self.name),
        });
    }

    fn handle_consul_servers(&mut self, now: Instant, result: Result<Vec<SocketAddr>, crate::error::Failure>) {
        match result {
            Ok(addrs) => {
                let known: BTreeSet<SocketAddr> = self
                    .membership
                    .live_members()
                    .iter()
                    .map(|member| member.addr)
                    .collect();
                for addr in addrs.into_iter().filter(|addr| !known.contains(addr)) {
                    tracing::info!(%addr, "joining server found in Consul");
                    self.membership.join(now, addr);
                }
            }
            Err(error) => tracing::warn!(%error, "Consul server lookup failed; will retry"),
        }
    }

    fn live_gossip_addrs(&self) -> BTreeSet<SocketAddr> {
        self.membership
            .live_members()
            .iter()
            .map(|member| member.addr)
            .collect()
    }

    fn busy(&self, kind: Pending) -> bool {
        self.pending.values().any(|(pending, _)| *pending == kind)
    }

    fn start(&mut self, now: Instant, kind: Pending, timeout: Duration) -> OpId {
        let op = self.ops.allocate();
        self.pending.insert(op, (kind, now + timeout));
        op
    }

    fn complete(&mut self, op: OpId) -> Option<Pending> {
        debug_assert!(
            self.ops.issued(op),
            "an outcome for {op}, which this server never issued"
        );
        self.pending.remove(&op).map(|(kind, _)| kind)
    }

    fn expire_pending(&mut self, now: Instant) {
        let expired: Vec<(OpId, Pending)> = self
            .pending
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(op, (kind, _))| (*op, *kind))
            .collect();
        for (op, kind) in expired {
            self.pending.remove(&op);
            tracing::warn!(%op, ?kind, "operation timed out");
            match kind {
                Pending::AddServer => self.reconcile_at = Some(now),
                Pending::RemoveServer => {
                    self.removal_expired(op);
                    self.reconcile_at = Some(now);
                }
                Pending::Barrier(term) => self.retry_barrier(now, term),
                Pending::Join | Pending::ConsulLookup | Pending::ConsulRegister => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    fn leader_view(term: u64) -> RaftView {
        RaftView {
            role: RaftRole::Leader,
            term,
            leader: Some(1),
            voted_for: Some(1),
            last_log_index: Some(3),
            voters: [1].into_iter().collect(),
            learners: BTreeSet::new(),
        }
    }

    /// The barrier proposals among the actions (op and term).
    fn barriers(server: &mut Server) -> Vec<(OpId, u64)> {
        core::iter::from_fn(|| server.poll_action())
            .filter_map(|action| match action {
                Action::Propose { op, command } => match *command {
                    Command::LeadershipEstablished { term, .. } => Some((op, term)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    fn member(id: u64, region: &str, nonvoter: bool) -> MemberId {
        let addr: SocketAddr = ([10, 0, 0, id as u8], 4648).into();
        MemberId {
            name: format!("s{id}.{region}"),
            addr,
            generation: 1,
            tags: Some(ServerTags {
                region: region.into(),
                datacenter: "dc1".into(),
                id,
                rpc_addr: ([10, 0, 0, id as u8], 4647).into(),
                expect: 3,
                bootstrap: false,
                nonvoter,
                build: "0.1.0".into(),
            }),
        }
    }

    #[test]
    fn a_live_server_raft_holds_as_a_learner_is_made_a_voter_again_unless_it_is_a_nonvoter() {
        let mut raft = leader_view(2);
        raft.voters = [1, 2].into();
        raft.learners = [3, 4].into();
        let added = |members: &[MemberId]| server_to_add(members, &raft, "global", false).map(|peer| peer.id);
        // Voters and a non-voter learner are held as they ask.
        assert_eq!(
            added(&[
                member(1, "global", false),
                member(2, "global", false),
                member(4, "global", true)
            ]),
            None
        );
        // A voter autopilot removed while it was gone came back: it is left a learner by
        // openraft, and it is added again (as a voter).
        assert_eq!(
            added(&[member(1, "global", false), member(3, "global", false)]),
            Some(3)
        );
        // One Raft does not know at all, and never one of another region.
        assert_eq!(added(&[member(5, "global", true)]), Some(5));
        assert_eq!(added(&[member(6, "europe", false)]), None);
        // The regression switch leaves the learner as it is.
        let left = server_to_add(&[member(3, "global", false)], &raft, "global", true);
        assert_eq!(left.map(|peer| peer.id), None);
    }

    #[test]
    fn a_new_leader_leads_only_once_its_barrier_is_applied_and_retries_a_lost_one() {
        let mut config = AgentConfig::default();
        config.server.enabled = true;
        config.server.bootstrap_expect = 1;
        let boot = BootState {
            last_log_index: Some(3),
            bootstrapped: true,
        };
        let mut server = Server::new(Instant::ZERO, &config, 1, 1, boot, 7);
        server.handle(Instant::ZERO, Input::RaftObserved(leader_view(2)));
        assert!(
            server.is_leader() && !server.leads(),
            "Raft says leader; the barrier is not applied"
        );
        let [(op, 2)] = barriers(&mut server)[..] else {
            panic!("one barrier for term 2")
        };
        // Lost (a failed proposal): proposed again, still not leading.
        let lost = Input::Proposed {
            op,
            result: Err(crate::error::Failure::unavailable("leadership lost")),
        };
        server.handle(Instant::ZERO, lost);
        assert!(!server.leads());
        let [(op, 2)] = barriers(&mut server)[..] else {
            panic!("the barrier again")
        };
        let applied = Input::Proposed { op, result: Ok(4) };
        server.handle(Instant::ZERO, applied);
        assert!(server.leads());
        // A new term needs its own barrier.
        server.handle(Instant::ZERO, Input::RaftObserved(leader_view(3)));
        assert!(!server.leads());
        assert_eq!(barriers(&mut server).len(), 1);
    }
}
