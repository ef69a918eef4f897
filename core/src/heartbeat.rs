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

/// Nomad's server defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeartbeatConfig {
    /// `min_heartbeat_ttl` (10 s).
    pub min_ttl: Duration,
    /// `max_heartbeats_per_second` (50): the TTL grows with the node count past this rate.
    pub max_per_second: u32,
    /// `heartbeat_grace` (10 s): added to the TTL on the server side only.
    pub grace: Duration,
    /// `failover_heartbeat_ttl` (5 min): every node's deadline after a leader change.
    pub failover_ttl: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            min_ttl: Duration::from_secs(10),
            max_per_second: 50,
            grace: Duration::from_secs(10),
            failover_ttl: Duration::from_secs(300),
        }
    }
}

/// The message of the node event raised when a node is marked down for a missed heartbeat.
pub const HEARTBEAT_MISSED: &str = "Node heartbeat missed";
/// The message raised when a down node heartbeats again.
pub const REREGISTERED: &str = "Node reregistered by heartbeat";

#[derive(Debug)]
pub struct Heartbeats {
    config: HeartbeatConfig,
    enabled: bool,
    deadlines: BTreeMap<String, Instant>,
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
            deadlines: BTreeMap::new(),
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
        let ttl = self.ttl(state.nodes().count());
        if self.enabled {
            self.deadlines
                .insert(node_id.to_string(), now + ttl + self.config.grace);
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
            .retain(|id, _| state.node(id).is_some_and(|node| node.status != NodeStatus::Down));
        self.marking
            .retain(|id| state.node(id).is_some_and(|node| node.status != NodeStatus::Down));
        for node in state.nodes().filter(|node| node.status != NodeStatus::Down) {
            if !self.marking.contains(&node.id) {
                self.deadlines
                    .entry(node.id.clone())
                    .or_insert(now + self.config.failover_ttl);
            }
        }
    }

    /// Nodes whose deadline passed: each is to be marked down (once; `marked` ends it).
    pub fn expired(&mut self, now: Instant) -> Vec<String> {
        if !self.enabled {
            return Vec::new();
        }
        let expired: Vec<String> = self
            .deadlines
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.deadlines.remove(id);
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
        self.deadlines.get(node_id).copied()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.values().min().copied()
    }
}
