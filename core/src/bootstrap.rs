//! The bootstrap decision: when, and with whom, a server initialises Raft.
//!
//! Follows Nomad's `maybeBootstrap` after e812954bd9 (reference §4), with one deliberate
//! tightening: a discovered server whose `Status.Peers` cannot be confirmed after every retry
//! abandons the attempt (it is retried later) instead of being assumed empty.
//!
//! ```text
//!            evaluate(): expect>0, not bootstrapped, voters >= expect, no conflicting tags
//!   Waiting ───────────────────────────────────────────────────────────────▶ Querying
//!     ▲  ▲                                                                  │  │   │
//!     │  └──── a query failed after every retry (retry later) ──────────────┘  │   │
//!     │                                                                        │   │
//!     │        a peer reports Raft peers: an existing cluster will add us      │   │
//!  Bootstrapped ◀──────────────────────────────────────────────────────────────┘   │
//!     ▲                                                                            │
//!     └──── Initializing ◀──── every peer confirmed it has no Raft peers ──────────┘
//!             (bootstrapped is set whether or not initialisation succeeded)
//! ```
//!
//! Inputs: [`Bootstrap::evaluate`] (member list changed or retry timer), the outcome of each
//! `QueryPeers` / `Initialize` action, [`Bootstrap::observe_raft`] and timeouts.
//! Actions: [`BootstrapAction`].

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::string::String;
use alloc::vec::Vec;
use core::net::SocketAddr;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{BootstrapFault, ServerTiming};
use crate::membership::MemberId;
use crate::op::{OpId, OpIds};
use crate::time::Instant;

/// A server that takes part in a bootstrap configuration.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Peer {
    pub id: u64,
    pub name: String,
    pub rpc_addr: SocketAddr,
    pub nonvoter: bool,
}

/// What the server's durable store said when the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootState {
    /// Index of the last Raft log entry on disk, `None` when the log is empty. (openraft's
    /// first entry, written by initialisation, has index 0.)
    pub last_log_index: Option<u64>,
    /// The persisted `bootstrapped` flag.
    pub bootstrapped: bool,
}

impl BootState {
    pub fn has_raft_state(&self) -> bool {
        self.last_log_index.is_some()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BootstrapAction {
    /// Ask `peer` for its Raft peers (`Status.Peers`, stale allowed).
    QueryPeers { op: OpId, peer: Peer },
    /// Initialise Raft with exactly this configuration.
    Initialize { op: OpId, servers: Vec<Peer> },
    /// Durably record `bootstrapped = true`.
    PersistBootstrapped,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum QueryState {
    InFlight { deadline: Instant },
    Backoff { until: Instant },
    Confirmed,
}

#[derive(Clone, Debug)]
struct Query {
    peer: Peer,
    attempts: u32,
    state: QueryState,
}

#[derive(Clone, Debug)]
enum Phase {
    Waiting {
        next_evaluation: Instant,
    },
    Querying {
        servers: Vec<Peer>,
        queries: BTreeMap<OpId, Query>,
    },
    /// Confirmed, but a lower-ranked server initialises first (see `maybe_initialize`).
    Staggered {
        servers: Vec<Peer>,
        at: Instant,
    },
    Initializing {
        op: OpId,
    },
    Bootstrapped,
}

impl Phase {
    /// The state's name, for coverage ([`crate::cover`]).
    fn name(&self) -> &'static str {
        match self {
            Phase::Waiting { .. } => "waiting",
            Phase::Querying { .. } => "querying",
            Phase::Staggered { .. } => "staggered",
            Phase::Initializing { .. } => "initializing",
            Phase::Bootstrapped => "bootstrapped",
        }
    }
}

#[derive(Debug)]
pub struct Bootstrap {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    expect: u32,
    region: String,
    self_id: u64,
    timing: ServerTiming,
    fault: Option<BootstrapFault>,
    started_at: Instant,
    leader_known: bool,
    phase: Phase,
    actions: VecDeque<BootstrapAction>,
}

impl Bootstrap {
    /// Moves to `phase`, counted as a transition of the bootstrap machine.
    fn set_phase(&mut self, phase: Phase) {
        crate::cover::transition("bootstrap", self.phase.name(), phase.name());
        self.phase = phase;
    }
    pub fn new(
        now: Instant,
        expect: u32,
        region: String,
        self_id: u64,
        timing: ServerTiming,
        fault: Option<BootstrapFault>,
        boot: BootState,
    ) -> Self {
        let mut bootstrap = Bootstrap {
            clock: crate::time::Monotonic::default(),
            expect,
            region,
            self_id,
            timing,
            fault,
            started_at: now,
            leader_known: false,
            phase: Phase::Waiting { next_evaluation: now },
            actions: VecDeque::new(),
        };
        if boot.bootstrapped {
            bootstrap.phase = Phase::Bootstrapped;
        } else if boot.has_raft_state() {
            // Restart with existing state: never bootstrap again.
            tracing::info!(last_log_index = ?boot.last_log_index, "existing Raft state found; not bootstrapping");
            bootstrap.mark_bootstrapped();
        }
        bootstrap
    }

    pub fn is_bootstrapped(&self) -> bool {
        matches!(self.phase, Phase::Bootstrapped)
    }

    pub fn expect(&self) -> u32 {
        self.expect
    }

    /// The current phase, for status output and tests: `waiting`, `querying`, `initializing`
    /// or `bootstrapped`.
    pub fn phase(&self) -> &'static str {
        match self.phase {
            Phase::Waiting { .. } => "waiting",
            Phase::Querying { .. } => "querying",
            Phase::Staggered { .. } | Phase::Initializing { .. } => "initializing",
            Phase::Bootstrapped => "bootstrapped",
        }
    }

    /// Whether an attempt is under way (peers being queried or Raft being initialised).
    pub fn is_attempting(&self) -> bool {
        matches!(
            self.phase,
            Phase::Querying { .. } | Phase::Staggered { .. } | Phase::Initializing { .. }
        )
    }

    /// The Raft log gained entries or a leader was seen: existing state, never bootstrap.
    pub fn observe_raft(&mut self, last_log_index: Option<u64>, leader_known: bool) {
        self.leader_known = leader_known;
        if last_log_index.is_some() && !self.is_bootstrapped() && !matches!(self.phase, Phase::Initializing { .. }) {
            tracing::info!(?last_log_index, "Raft state appeared; bootstrap no longer needed");
            self.mark_bootstrapped();
        }
    }

    /// Re-runs the decision against the current live members (ourselves included).
    pub fn evaluate(&mut self, now: Instant, members: &[MemberId], ops: &mut OpIds) {
        let Phase::Waiting { next_evaluation } = self.phase else {
            return;
        };
        if self.expect == 0 {
            return;
        }
        if let Some(BootstrapFault::SelfElectAfterElectionTimeout) = self.fault {
            self.evaluate_faulty(now, members, ops);
            return;
        }
        let _ = next_evaluation;
        self.set_phase(Phase::Waiting {
            next_evaluation: now + self.timing.bootstrap_retry,
        });
        let mut servers = Vec::new();
        let mut voters = 0u32;
        for member in members {
            let Some(tags) = &member.tags else { continue };
            if tags.region != self.region {
                continue;
            }
            if tags.expect != 0 && tags.expect != self.expect {
                tracing::error!(
                    peer = %member.name,
                    peer_expect = tags.expect,
                    expect = self.expect,
                    "peer has a different bootstrap_expect; not bootstrapping"
                );
                return;
            }
            if tags.bootstrap && tags.id != self.self_id {
                tracing::error!(peer = %member.name, "peer is in bootstrap mode; not bootstrapping");
                return;
            }
            if !tags.nonvoter {
                voters += 1;
            }
            servers.push(Peer {
                id: tags.id,
                name: member.name.clone(),
                rpc_addr: tags.rpc_addr,
                nonvoter: tags.nonvoter,
            });
        }
        if voters < self.expect {
            tracing::debug!(
                voters,
                expect = self.expect,
                "waiting for more servers before bootstrapping"
            );
            return;
        }
        servers.sort();
        if let Some(BootstrapFault::SkipPeerQuery) = self.fault {
            tracing::warn!("fault injection: bootstrapping without asking the others for their Raft peers");
            self.initialize(servers, ops);
            return;
        }
        let mut queries = BTreeMap::new();
        for peer in servers.iter().filter(|peer| peer.id != self.self_id) {
            let op = ops.allocate();
            self.actions
                .push_back(BootstrapAction::QueryPeers { op, peer: peer.clone() });
            queries.insert(
                op,
                Query {
                    peer: peer.clone(),
                    attempts: 1,
                    state: QueryState::InFlight {
                        deadline: now + self.timing.peer_query_timeout,
                    },
                },
            );
        }
        tracing::info!(
            servers = servers.len(),
            "enough servers discovered; confirming none has Raft peers"
        );
        self.set_phase(Phase::Querying { servers, queries });
        self.maybe_initialize(now, ops);
    }

    /// The negative control: after one election timeout without a leader, initialise alone.
    fn evaluate_faulty(&mut self, now: Instant, members: &[MemberId], ops: &mut OpIds) {
        let due = self.started_at + self.timing.raft_election_timeout_max;
        if self.leader_known || now < due {
            self.set_phase(Phase::Waiting { next_evaluation: due });
            return;
        }
        let me = members
            .iter()
            .find(|member| member.tags.as_ref().is_some_and(|tags| tags.id == self.self_id))
            .and_then(|member| member.tags.as_ref().map(|tags| (member.name.clone(), tags)));
        let Some((name, tags)) = me else { return };
        let servers = alloc::vec![Peer {
            id: tags.id,
            name,
            rpc_addr: tags.rpc_addr,
            nonvoter: false,
        }];
        let op = ops.allocate();
        tracing::warn!("fault injection: electing ourselves without waiting for bootstrap_expect");
        self.actions.push_back(BootstrapAction::Initialize { op, servers });
        self.set_phase(Phase::Initializing { op });
    }

    /// Outcome of a `QueryPeers` action.
    pub fn handle_peers(
        &mut self,
        now: Instant,
        op: OpId,
        result: Result<Vec<String>, crate::error::Failure>,
        ops: &mut OpIds,
    ) {
        let Phase::Querying { queries, .. } = &mut self.phase else {
            return;
        };
        let Some(query) = queries.get_mut(&op) else {
            return;
        };
        if !matches!(query.state, QueryState::InFlight { .. }) {
            return;
        }
        match result {
            Ok(peers) if !peers.is_empty() => {
                tracing::info!(
                    peer = %query.peer.name,
                    ?peers,
                    "existing Raft peers reported by peer; joining that cluster instead of bootstrapping"
                );
                self.mark_bootstrapped();
            }
            Ok(_) => {
                query.state = QueryState::Confirmed;
                self.maybe_initialize(now, ops);
            }
            Err(error) => self.query_failed(now, op, &error.message),
        }
    }

    /// Outcome of the `Initialize` action. Bootstrapped either way: never re-enter.
    pub fn handle_initialized(&mut self, op: OpId, result: Result<(), crate::error::Failure>) {
        let Phase::Initializing { op: pending } = self.phase else {
            return;
        };
        if pending != op {
            return;
        }
        match result {
            Ok(()) => tracing::info!("Raft bootstrapped"),
            Err(error) => tracing::warn!(%error, "Raft bootstrap failed; treating as bootstrapped"),
        }
        self.mark_bootstrapped();
    }

    pub fn handle_timeout(&mut self, now: Instant, members: &[MemberId], ops: &mut OpIds) {
        self.clock.observe(now);
        match &mut self.phase {
            Phase::Waiting { next_evaluation } if *next_evaluation <= now => {
                self.evaluate(now, members, ops);
            }
            Phase::Querying { queries, .. } => {
                let mut expired = Vec::new();
                let mut resend = Vec::new();
                for (op, query) in queries.iter() {
                    match query.state {
                        QueryState::InFlight { deadline } if deadline <= now => expired.push(*op),
                        QueryState::Backoff { until } if until <= now => resend.push(*op),
                        _ => {}
                    }
                }
                for op in resend {
                    self.resend(now, op, ops);
                }
                for op in expired {
                    self.query_failed(now, op, "timed out");
                }
            }
            Phase::Staggered { servers, at } if *at <= now => {
                let servers = core::mem::take(servers);
                self.initialize(servers, ops);
            }
            _ => {}
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Waiting { next_evaluation } if self.expect != 0 => Some(*next_evaluation),
            Phase::Staggered { at, .. } => Some(*at),
            Phase::Querying { queries, .. } => queries
                .values()
                .filter_map(|query| match query.state {
                    QueryState::InFlight { deadline } => Some(deadline),
                    QueryState::Backoff { until } => Some(until),
                    QueryState::Confirmed => None,
                })
                .min(),
            _ => None,
        }
    }

    pub fn poll_action(&mut self) -> Option<BootstrapAction> {
        self.actions.pop_front()
    }

    fn query_failed(&mut self, now: Instant, op: OpId, error: &str) {
        let Phase::Querying { queries, .. } = &mut self.phase else {
            return;
        };
        let Some(query) = queries.get_mut(&op) else {
            return;
        };
        if query.attempts >= self.timing.peer_retries_max {
            tracing::error!(
                peer = %query.peer.name,
                %error,
                attempts = query.attempts,
                "failed to confirm peer status; abandoning this bootstrap attempt"
            );
            self.set_phase(Phase::Waiting {
                next_evaluation: now + self.timing.bootstrap_retry,
            });
            return;
        }
        let backoff = backoff(self.timing.peer_retry_base, query.attempts);
        tracing::warn!(peer = %query.peer.name, %error, retry_in = ?backoff, "failed to confirm peer status");
        query.state = QueryState::Backoff { until: now + backoff };
    }

    fn resend(&mut self, now: Instant, op: OpId, ops: &mut OpIds) {
        let Phase::Querying { queries, .. } = &mut self.phase else {
            return;
        };
        let Some(mut query) = queries.remove(&op) else {
            return;
        };
        query.attempts += 1;
        query.state = QueryState::InFlight {
            deadline: now + self.timing.peer_query_timeout,
        };
        let op = ops.allocate();
        self.actions.push_back(BootstrapAction::QueryPeers {
            op,
            peer: query.peer.clone(),
        });
        queries.insert(op, query);
    }

    /// Every other server confirmed it has no Raft peers: initialise. openraft starts an
    /// election as it initialises, so three servers that initialise at once split the first
    /// vote and formation waits a whole election round (the bimodal tail of issue 19). The
    /// voters initialise in the order of their ids instead, `raft_election_timeout_min` apart:
    /// the first one's vote requests reach the others before they initialise, they grant it,
    /// and its first AppendEntries bootstraps them (their own initialisation is then refused
    /// and they count as bootstrapped). If the first one is slow or gone, the next one goes.
    fn maybe_initialize(&mut self, now: Instant, ops: &mut OpIds) {
        let Phase::Querying { servers, queries } = &self.phase else {
            return;
        };
        if !queries.values().all(|query| query.state == QueryState::Confirmed) {
            return;
        }
        let confirmed: BTreeSet<u64> = queries.values().map(|query| query.peer.id).collect();
        assert!(
            servers
                .iter()
                .all(|peer| peer.id == self.self_id || confirmed.contains(&peer.id)),
            "every other server was confirmed before initialising"
        );
        assert!(
            servers.iter().any(|peer| peer.id == self.self_id),
            "we are part of our own configuration"
        );
        let mut voters: Vec<u64> = servers
            .iter()
            .filter(|peer| !peer.nonvoter)
            .map(|peer| peer.id)
            .collect();
        voters.sort_unstable();
        let rank = voters.iter().position(|id| *id == self.self_id).unwrap_or(voters.len()) as u32;
        let servers = servers.clone();
        if rank == 0 {
            self.initialize(servers, ops);
        } else {
            let at = now + self.timing.raft_election_timeout_min * rank;
            self.set_phase(Phase::Staggered { servers, at });
        }
    }

    fn initialize(&mut self, servers: Vec<Peer>, ops: &mut OpIds) {
        let op = ops.allocate();
        tracing::info!(servers = ?servers.iter().map(|peer| &peer.name).collect::<Vec<_>>(), "bootstrapping Raft");
        self.actions.push_back(BootstrapAction::Initialize { op, servers });
        self.set_phase(Phase::Initializing { op });
    }

    fn mark_bootstrapped(&mut self) {
        if !self.is_bootstrapped() {
            self.set_phase(Phase::Bootstrapped);
            self.actions.push_back(BootstrapAction::PersistBootstrapped);
        }
    }
}

/// `base * 2^(attempt-1)`: 1 s, 2 s, 4 s, … for Nomad's base of one second.
fn backoff(base: Duration, attempt: u32) -> Duration {
    base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
}
