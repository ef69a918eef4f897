//! Autopilot: the leader's care of the Raft configuration (Nomad's `autopilot`, after
//! hashicorp/raft-autopilot).
//!
//! - **Dead server cleanup.** A server of the Raft configuration that gossip has seen failed
//!   (or has not seen at all) for `server_stabilization_time` without a break is removed from
//!   Raft, so a cluster that lost a server for good regains its failure tolerance once a
//!   replacement joins, and its quorum no longer counts a machine that will not return.
//!   Removals never leave fewer than `min_quorum` voters and remove at most `(voters - 1) / 2`
//!   voters at a time, so a partition that makes a majority look dead removes nothing.
//!   Nomad prunes as soon as serf says failed; waiting out the stabilization time keeps a
//!   gossip flap from costing a server its seat.
//! - **Health.** What `/v1/operator/autopilot/health` reports of each server, and the
//!   cluster's failure tolerance.
//!
//! The configuration is replicated (`Command::AutopilotSetConfig`); until an operator sets
//! one, the leader's agent configuration (`autopilot {}`) applies.

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::collections::BTreeMap;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Instant;

/// Nomad's `AutopilotConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutopilotConfig {
    /// Remove servers that stayed failed for `server_stabilization_time`.
    pub cleanup_dead_servers: bool,
    /// A follower not heard from for longer is unhealthy.
    pub last_contact_threshold: Duration,
    /// A follower more entries behind the leader is unhealthy.
    pub max_trailing_logs: u64,
    /// Dead server cleanup never leaves fewer voters (0: no floor beyond a majority).
    pub min_quorum: u32,
    /// How long a server must stay healthy to count as stable, and stay failed to be removed.
    pub server_stabilization_time: Duration,
    /// Enterprise settings in Nomad; kept and shown, not acted on.
    pub enable_redundancy_zones: bool,
    pub disable_upgrade_migration: bool,
    pub enable_custom_upgrades: bool,
    /// Raft indexes of the replicated configuration (0 while the agent's applies).
    pub create_index: u64,
    pub modify_index: u64,
}

impl Default for AutopilotConfig {
    /// Nomad's defaults.
    fn default() -> Self {
        AutopilotConfig {
            cleanup_dead_servers: true,
            last_contact_threshold: Duration::from_millis(200),
            max_trailing_logs: 250,
            min_quorum: 0,
            server_stabilization_time: Duration::from_secs(10),
            enable_redundancy_zones: false,
            disable_upgrade_migration: false,
            enable_custom_upgrades: false,
            create_index: 0,
            modify_index: 0,
        }
    }
}

/// The text of a refused check-and-set (the HTTP API answers `false`, as Nomad's does).
pub const CAS_MISMATCH: &str = "autopilot configuration was modified since the given index";

/// How gossip sees one server of the Raft configuration, from the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Alive or suspect.
    Alive,
    /// Failed, or absent from gossip, continuously since this instant.
    GoneSince(Instant),
}

/// One server of the Raft configuration, as dead server cleanup weighs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaftServer {
    pub id: u64,
    pub voter: bool,
    pub seen: Seen,
}

/// The servers to remove from Raft now, non-voters first, each voter in id order; `leader` is
/// never among them.
pub fn dead_servers(now: Instant, leader: u64, servers: &[RaftServer], config: &AutopilotConfig) -> Vec<u64> {
    if !config.cleanup_dead_servers {
        return Vec::new();
    }
    let dead = |server: &&RaftServer| {
        server.id != leader
            && matches!(server.seen, Seen::GoneSince(since) if since + config.server_stabilization_time <= now)
    };
    let mut remove: Vec<u64> = servers
        .iter()
        .filter(dead)
        .filter(|server| !server.voter)
        .map(|server| server.id)
        .collect();
    let voters = servers.iter().filter(|server| server.voter).count();
    let most = voters.saturating_sub(1) / 2;
    for (removed, server) in servers.iter().filter(dead).filter(|server| server.voter).enumerate() {
        if removed >= most || voters - removed <= config.min_quorum as usize {
            tracing::warn!(
                server = server.id,
                voters = voters - removed,
                min_quorum = config.min_quorum,
                "autopilot: not removing a failed voter; the cluster would be left without a safe quorum"
            );
            break;
        }
        remove.push(server.id);
    }
    remove
}

/// Tracks since when each server of the Raft configuration has been gone from gossip, as the
/// leader sees it; forgets everything when leadership changes hands (a new leader counts from
/// when it took office).
#[derive(Clone, Debug, Default)]
pub struct GoneSince {
    since: BTreeMap<u64, Instant>,
}

impl GoneSince {
    /// `alive(id)` says whether gossip sees server `id` alive now.
    pub fn observe(&mut self, now: Instant, ids: impl Iterator<Item = u64>, alive: impl Fn(u64) -> bool) {
        let mut next = BTreeMap::new();
        for id in ids {
            if !alive(id) {
                next.insert(id, self.since.get(&id).copied().unwrap_or(now));
            }
        }
        self.since = next;
    }

    pub fn seen(&self, id: u64) -> Seen {
        self.since.get(&id).map_or(Seen::Alive, |since| Seen::GoneSince(*since))
    }

    pub fn clear(&mut self) {
        self.since.clear();
    }

    /// The earliest instant one of them becomes removable.
    pub fn next_deadline(&self, config: &AutopilotConfig) -> Option<Instant> {
        if !config.cleanup_dead_servers {
            return None;
        }
        self.since
            .values()
            .map(|since| *since + config.server_stabilization_time)
            .min()
    }
}

/// The cluster's failure tolerance: how many healthy voters could fail and a quorum remain.
pub fn failure_tolerance(voters: usize, healthy_voters: usize) -> usize {
    let quorum = voters / 2 + 1;
    healthy_voters.saturating_sub(quorum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Instant {
        Instant::from_millis(secs * 1000)
    }

    fn voter(id: u64, seen: Seen) -> RaftServer {
        RaftServer { id, voter: true, seen }
    }

    #[test]
    fn a_failed_voter_is_removed_only_after_the_stabilization_time() {
        let config = AutopilotConfig::default();
        let servers = [
            voter(1, Seen::Alive),
            voter(2, Seen::Alive),
            voter(3, Seen::GoneSince(at(100))),
        ];
        assert!(dead_servers(at(109), 1, &servers, &config).is_empty());
        assert_eq!(dead_servers(at(110), 1, &servers, &config), vec![3]);
        let off = AutopilotConfig {
            cleanup_dead_servers: false,
            ..config
        };
        assert!(dead_servers(at(500), 1, &servers, &off).is_empty());
    }

    #[test]
    fn a_minority_at_most_is_removed_and_never_below_min_quorum() {
        let config = AutopilotConfig::default();
        let gone = Seen::GoneSince(at(0));
        // Two of three look dead (a partition, say): removing both would leave one voter.
        let servers = [voter(1, Seen::Alive), voter(2, gone), voter(3, gone)];
        assert_eq!(dead_servers(at(60), 1, &servers, &config), vec![2]);
        // Five voters, three dead: two go.
        let five = [
            voter(1, Seen::Alive),
            voter(2, Seen::Alive),
            voter(3, gone),
            voter(4, gone),
            voter(5, gone),
        ];
        assert_eq!(dead_servers(at(60), 1, &five, &config), vec![3, 4]);
        let floor = AutopilotConfig {
            min_quorum: 4,
            ..config
        };
        assert_eq!(dead_servers(at(60), 1, &five, &floor), vec![3]);
        // The leader is never removed, and non-voters always may be.
        let servers = [
            voter(1, gone),
            voter(2, Seen::Alive),
            RaftServer {
                id: 9,
                voter: false,
                seen: gone,
            },
        ];
        assert_eq!(dead_servers(at(60), 1, &servers, &config), vec![9]);
    }

    #[test]
    fn gone_since_keeps_the_first_instant_and_forgets_a_server_seen_again() {
        let mut gone = GoneSince::default();
        gone.observe(at(1), [1, 2].into_iter(), |id| id == 1);
        gone.observe(at(5), [1, 2].into_iter(), |id| id == 1);
        assert_eq!(gone.seen(2), Seen::GoneSince(at(1)));
        assert_eq!(gone.next_deadline(&AutopilotConfig::default()), Some(at(11)));
        gone.observe(at(6), [1, 2].into_iter(), |_| true);
        assert_eq!(gone.seen(2), Seen::Alive);
        gone.observe(at(7), [1, 2].into_iter(), |id| id == 1);
        assert_eq!(gone.seen(2), Seen::GoneSince(at(7)));
    }

    #[test]
    fn failure_tolerance_counts_healthy_voters_above_a_quorum() {
        assert_eq!(failure_tolerance(3, 3), 1);
        assert_eq!(failure_tolerance(3, 2), 0);
        assert_eq!(failure_tolerance(5, 5), 2);
        assert_eq!(failure_tolerance(1, 1), 0);
        assert_eq!(failure_tolerance(3, 1), 0);
    }
}
