//! Node heartbeats on the leader (Nomad's `nomad/heartbeat.go`).
//!
//! Every node that is not down has a deadline. A client heartbeat (`Node.UpdateStatus`, or a
//! registration) moves it to `now + ttl + grace`, where the TTL handed back to the client is
//! scaled with the cluster's size (`max(min_ttl, nodes / max_per_second)`) plus a random stagger
//! of up to one more TTL, so a thousand clients do not all call in the same second. A deadline
//! that passes marks the node down through Raft with the `Node heartbeat missed` event; the
//! scheduler then replaces its allocations and CSI releases skip its node plugin.
//!
//! Only the leader keeps deadlines. On gaining leadership every node not already down gets the
//! long failover TTL: clients need time to find the new leader before anyone is declared lost.
//! Nodes that appear in the applied state without having heartbeated to this leader (entries
//! applied after the step-up) get the failover TTL too, so no node is ever left untimed.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use rand_010::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use crate::fsm::{ServerState, Table};
use crate::structs::NodeStatus;
use crate::time::Instant;

pub use crate::config::HeartbeatConfig;

/// The message of the node event raised when a node is marked down for a missed heartbeat.
pub const HEARTBEAT_MISSED: &str = "Node heartbeat missed";
/// The message raised when a down node heartbeats again.
pub const REREGISTERED: &str = "Node reregistered by heartbeat";

#[derive(Debug)]
pub struct Heartbeats {
    config: HeartbeatConfig,
    enabled: bool,
    deadlines: Deadlines,
    /// Nodes whose down-marking is being proposed.
    marking: BTreeSet<String>,
    /// The nodes-table index last reconciled against.
    seen_index: Option<u64>,
    rng: ChaCha8Rng,
}

impl Heartbeats {
    pub fn new(config: HeartbeatConfig, seed: u64) -> Self {
        Heartbeats {
            config,
            enabled: false,
            deadlines: Deadlines::default(),
            marking: BTreeSet::new(),
            seen_index: None,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    pub fn config(&self) -> &HeartbeatConfig {
        &self.config
    }

    /// Started when leadership is gained (every live node gets the failover TTL on the next
    /// reconcile), emptied when it is lost.
    pub fn set_enabled(&mut self, enabled: bool) {
        if self.enabled != enabled {
            self.deadlines.clear();
            self.marking.clear();
            self.seen_index = None;
        }
        self.enabled = enabled;
    }

    /// A heartbeat or registration from `node_id`: returns the TTL the client should call
    /// in again within.
    pub fn reset(&mut self, now: Instant, node_id: &str, state: &ServerState) -> Duration {
        let ttl = self.ttl(state.node_count());
        if self.enabled {
            self.deadlines.set(node_id, now + ttl + self.config.grace);
        }
        ttl
    }

    fn ttl(&mut self, nodes: usize) -> Duration {
        let rate = u64::from(self.config.max_per_second.max(1));
        let scaled = Duration::from_nanos((nodes as u64).saturating_mul(1_000_000_000) / rate);
        let ttl = scaled.max(self.config.min_ttl);
        // Whole milliseconds: the client is told the TTL in milliseconds.
        let millis = ttl.as_millis() as u64;
        let stagger = if millis == 0 {
            0
        } else {
            self.rng.random_range(0..millis)
        };
        Duration::from_millis(millis + stagger)
    }

    /// Keeps the deadlines in line with the applied node table: nodes that are down or gone
    /// lose theirs; live nodes without one get the failover TTL.
    pub fn reconcile(&mut self, now: Instant, state: &ServerState) {
        if !self.enabled {
            return;
        }
        let index = state.table_index(Table::Nodes);
        if self.seen_index == Some(index) {
            return;
        }
        self.seen_index = Some(index);
        self.deadlines
            .retain(|id| state.node(id).is_some_and(|node| node.status != NodeStatus::Down));
        self.marking
            .retain(|id| state.node(id).is_some_and(|node| node.status != NodeStatus::Down));
        for node in state.nodes().filter(|node| node.status != NodeStatus::Down) {
            if !self.marking.contains(&node.id) && self.deadlines.get(&node.id).is_none() {
                self.deadlines.set(&node.id, now + self.config.failover_ttl);
            }
        }
    }

    /// Nodes whose deadline passed: each is to be marked down (once; `marked` ends it).
    pub fn expired(&mut self, now: Instant) -> Vec<String> {
        if !self.enabled {
            return Vec::new();
        }
        let expired = self.deadlines.take_due(now);
        for id in &expired {
            self.marking.insert(id.clone());
        }
        expired
    }

    /// The down-marking of `node_id` was applied (or failed): the next reconcile decides.
    pub fn marked(&mut self, node_id: &str) {
        self.marking.remove(node_id);
        self.seen_index = None;
    }

    pub fn deadline(&self, node_id: &str) -> Option<Instant> {
        self.deadlines.get(node_id)
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first()
    }
}

/// Deadlines by node, also ordered by time: the next one and the due ones are found without
/// looking at the others (the leader asks on every input; a cluster has thousands of nodes).
#[derive(Debug, Default)]
struct Deadlines {
    by_node: BTreeMap<String, Instant>,
    by_time: BTreeSet<(Instant, String)>,
}

impl Deadlines {
    fn set(&mut self, node_id: &str, at: Instant) {
        if let Some(old) = self.by_node.insert(node_id.to_string(), at) {
            self.by_time.remove(&(old, node_id.to_string()));
        }
        self.by_time.insert((at, node_id.to_string()));
    }

    fn get(&self, node_id: &str) -> Option<Instant> {
        self.by_node.get(node_id).copied()
    }

    fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let by_time = &mut self.by_time;
        self.by_node.retain(|id, at| {
            let kept = keep(id);
            if !kept {
                by_time.remove(&(*at, id.clone()));
            }
            kept
        });
    }

    fn clear(&mut self) {
        self.by_node.clear();
        self.by_time.clear();
    }

    fn first(&self) -> Option<Instant> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Removes and returns the nodes whose deadline is at or before `now`, by node id.
    fn take_due(&mut self, now: Instant) -> Vec<String> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.by_time.first()
            && *at <= now
        {
            let (_, id) = self.by_time.pop_first().expect("non-empty");
            self.by_node.remove(&id);
            due.push(id);
        }
        due.sort();
        due
    }
}
