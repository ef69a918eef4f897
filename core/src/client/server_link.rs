//! The client's link to the servers (Nomad's `registerAndHeartbeat` and `watchAllocations`):
//! registering the node until a server takes it, heartbeating within the TTL the servers hand
//! out, registering again when they forgot the node, and the blocking alloc sync with its
//! backoff and its filter of stale replies.
//!
//! Every retry, pause and filter is decided here; the driver only carries the requests out
//! ([`Io::Server`] and [`Io::AllocSync`]) and hands back their outcomes.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use core::time::Duration;

use crate::client::{Io, Outcome, Reply};
use crate::op::{OpId, OpIds};
use crate::rpc::{NodeAllocsReply, NodeAllocsRequest, ServerReply, ServerRequest};
use crate::structs::{Allocation, Job, Node, NodeStatus};
use crate::time::Instant;

/// How long a refused or failed registration waits before the next attempt.
pub const REGISTER_RETRY: Duration = Duration::from_secs(1);
/// How long a failed heartbeat waits before the next attempt (the server's grace period is
/// what this retry has to fit in).
pub const HEARTBEAT_RETRY: Duration = Duration::from_secs(1);
/// How long one alloc sync may block on the servers.
pub const ALLOC_SYNC_WAIT: Duration = Duration::from_secs(30);
/// The first pause after a failed alloc sync; each further failure doubles it, up to
/// [`ALLOC_SYNC_BACKOFF_MAX`]. A success resets it.
pub const ALLOC_SYNC_BACKOFF_MIN: Duration = Duration::from_millis(500);
pub const ALLOC_SYNC_BACKOFF_MAX: Duration = Duration::from_secs(15);

/// What the link learned that the client must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// A server took the node's registration; `again` when it had been registered before (the
    /// registration replaced the node record, so everything reported must be reported again).
    Registered { again: bool },
    /// A sync newer than any used before: the node's allocations as of that index.
    Allocs {
        allocs: Vec<(Allocation, Arc<Job>)>,
        finished_elsewhere: Vec<String>,
    },
}

/// One kind of request: at most one in flight, the next one due at `next_at`.
#[derive(Clone, Debug, Default)]
struct Slot {
    in_flight: Option<OpId>,
    next_at: Option<Instant>,
}

impl Slot {
    fn due(&self, now: Instant) -> bool {
        self.in_flight.is_none() && self.next_at.is_some_and(|at| now >= at)
    }

    fn waiting(&self) -> Option<Instant> {
        self.next_at.filter(|_| self.in_flight.is_none())
    }
}

#[derive(Clone, Debug, Default)]
pub struct ServerLink {
    /// The node record to register; `None` until [`ServerLink::connect`].
    node: Option<Node>,
    registered: bool,
    ever_registered: bool,
    register: Slot,
    heartbeat: Slot,
    sync: Slot,
    /// The TTL of the last accepted registration or heartbeat.
    ttl: Duration,
    /// The index of the newest alloc sync used.
    synced_index: Option<u64>,
    /// The view digest of that sync.
    synced_view: Option<u64>,
    backoff: Duration,
    /// The node changed while a registration was in flight: register once more after it.
    register_again: bool,
    /// The first registration attempt was logged.
    registering_said: bool,
    /// When a server last took a registration or heartbeat (what `stop_after_client_disconnect`
    /// counts from).
    last_contact: Option<Instant>,
}

impl ServerLink {
    /// Starts registering `node` at once.
    pub fn connect(&mut self, now: Instant, node: Node) {
        self.node = Some(node);
        self.register.next_at = Some(now);
    }

    /// Replaces the node's attributes under `prefixes` with `attributes`; when that changes
    /// the node, it is registered again so the servers place by the new values.
    pub fn set_attributes(&mut self, now: Instant, prefixes: &[&str], attributes: BTreeMap<String, String>) {
        let Some(node) = &mut self.node else { return };
        let mut updated = node.attributes.clone();
        updated.retain(|key, _| !prefixes.iter().any(|prefix| key.starts_with(prefix)));
        updated.extend(attributes);
        if updated == node.attributes {
            return;
        }
        node.attributes = updated;
        if self.register.in_flight.is_none() {
            self.register.next_at = Some(now);
        } else {
            self.register_again = true;
        }
    }

    /// The node's secret, presented with every call the client makes for its node.
    /// A restarted client already knows its allocations as of `index` (the newest modify
    /// index among those it restored): no list older than that is used, so a server that has
    /// not caught up with them since its own restart cannot make the client stop one of them
    /// as if the servers had dropped it (swarm seed 1063: a lagging server's first list left
    /// out a running allocation, the client destroyed it and reported it complete, and the
    /// service job was never placed again).
    pub fn known_as_of(&mut self, index: u64) {
        let floor = index.saturating_sub(1);
        if self.synced_index.is_none_or(|synced| synced < floor) {
            self.synced_index = Some(floor);
        }
    }

    pub fn secret_id(&self) -> &str {
        self.node.as_ref().map_or("", |node| node.secret_id.as_str())
    }

    /// When a server last took this node's registration or heartbeat.
    pub fn last_contact(&self) -> Option<Instant> {
        self.last_contact
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn owns(&self, op: OpId) -> bool {
        [&self.register, &self.heartbeat, &self.sync]
            .iter()
            .any(|slot| slot.in_flight == Some(op))
    }

    /// The requests due at `now`, each with a fresh op id.
    pub fn poll(&mut self, now: Instant, ops: &mut OpIds) -> Vec<(OpId, Io)> {
        let Some(node) = &self.node else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if self.register.due(now) {
            let op = ops.allocate();
            self.register = Slot {
                in_flight: Some(op),
                next_at: None,
            };
            let mut node = node.clone();
            node.status = NodeStatus::Ready;
            if !self.ever_registered && !self.registering_said {
                // Said once: a client that never gets further shows where it stopped.
                self.registering_said = true;
                tracing::info!(node_id = %node.id, "registering the node with the servers");
            }
            out.push((op, Io::Server(ServerRequest::NodeRegister { node: Box::new(node) })));
        }
        if self.registered && self.heartbeat.due(now) {
            let op = ops.allocate();
            self.heartbeat = Slot {
                in_flight: Some(op),
                next_at: None,
            };
            out.push((
                op,
                Io::Server(ServerRequest::NodeUpdateStatus {
                    node_id: node.id.clone(),
                    secret_id: node.secret_id.clone(),
                    status: NodeStatus::Ready,
                }),
            ));
        }
        if self.sync.due(now) {
            let op = ops.allocate();
            self.sync = Slot {
                in_flight: Some(op),
                next_at: None,
            };
            out.push((
                op,
                Io::AllocSync(NodeAllocsRequest {
                    node_id: node.id.clone(),
                    min_index: self.synced_index.unwrap_or(0),
                    known_view: self.synced_view,
                    max_wait_ms: ALLOC_SYNC_WAIT.as_millis() as u64,
                }),
            ));
        }
        out
    }

    /// The outcome of one of this link's requests ([`ServerLink::owns`]).
    pub fn outcome(&mut self, now: Instant, op: OpId, outcome: Outcome) -> Option<LinkEvent> {
        if self.register.in_flight == Some(op) {
            self.register.in_flight = None;
            return self.registration(now, outcome);
        }
        if self.heartbeat.in_flight == Some(op) {
            self.heartbeat.in_flight = None;
            self.heartbeat_outcome(now, outcome);
            return None;
        }
        if self.sync.in_flight == Some(op) {
            self.sync.in_flight = None;
            return self.sync_outcome(now, outcome);
        }
        None
    }

    fn registration(&mut self, now: Instant, outcome: Outcome) -> Option<LinkEvent> {
        match outcome {
            Ok(Reply::Server(ServerReply::Heartbeat { heartbeat_ttl_ms, .. })) => {
                let again = core::mem::replace(&mut self.ever_registered, true);
                self.registered = true;
                self.last_contact = Some(now);
                self.ttl = Duration::from_millis(heartbeat_ttl_ms);
                self.heartbeat.next_at = Some(now + self.ttl.max(HEARTBEAT_RETRY));
                // The alloc sync starts with the first registration and then runs on its own.
                if !again && self.sync.in_flight.is_none() {
                    self.sync.next_at = Some(now);
                }
                if core::mem::take(&mut self.register_again) {
                    self.register.next_at = Some(now);
                }
                Some(LinkEvent::Registered { again })
            }
            failed => {
                tracing::warn!(outcome = ?failed, "node registration failed; retrying");
                self.register.next_at = Some(now + REGISTER_RETRY);
                None
            }
        }
    }

    fn heartbeat_outcome(&mut self, now: Instant, outcome: Outcome) {
        match outcome {
            Ok(Reply::Server(ServerReply::Heartbeat { heartbeat_ttl_ms, .. })) => {
                self.ttl = Duration::from_millis(heartbeat_ttl_ms);
                self.heartbeat.next_at = Some(now + self.ttl.max(HEARTBEAT_RETRY));
                self.last_contact = Some(now);
            }
            // Decided by the error's kind, never its text: the servers no longer hold the node.
            Ok(Reply::Server(ServerReply::Error(error)))
                if !error.retryable && error.kind == crate::error::ErrorKind::NotFound =>
            {
                tracing::info!("the servers do not know this node; registering it again");
                self.registered = false;
                self.heartbeat.next_at = None;
                self.register.next_at = Some(now);
            }
            _ => self.heartbeat.next_at = Some(now + HEARTBEAT_RETRY),
        }
    }

    /// A reply is used only when its index moved past the last one used: reads are served by
    /// any server, and a lagging one must never hand back an older list — one that would make
    /// the client stop an allocation a newer state still has.
    fn sync_outcome(&mut self, now: Instant, outcome: Outcome) -> Option<LinkEvent> {
        match outcome {
            Ok(Reply::Allocs(reply)) => {
                self.backoff = Duration::ZERO;
                self.sync.next_at = Some(now);
                if self.synced_index.is_some_and(|last| reply.index <= last) {
                    return None;
                }
                self.synced_index = Some(reply.index);
                self.synced_view = Some(reply.view);
                Some(LinkEvent::Allocs {
                    allocs: NodeAllocsReply::paired(reply.allocs, reply.jobs),
                    finished_elsewhere: reply.finished_elsewhere,
                })
            }
            failed => {
                self.backoff = (self.backoff * 2).clamp(ALLOC_SYNC_BACKOFF_MIN, ALLOC_SYNC_BACKOFF_MAX);
                tracing::warn!(outcome = ?failed, backoff = ?self.backoff, "alloc sync failed; retrying");
                self.sync.next_at = Some(now + self.backoff);
                None
            }
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let heartbeat = self.heartbeat.waiting().filter(|_| self.registered);
        [self.register.waiting(), heartbeat, self.sync.waiting()]
            .into_iter()
            .flatten()
            .min()
    }
}
