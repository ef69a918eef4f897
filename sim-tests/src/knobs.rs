//! Simulation knobs, drawn per seed (FoundationDB's idea): each seed runs the same code with
//! its own Raft, node-heartbeat, snapshot, GC and retry timings, drawn from ranges that
//! include production's defaults. A quarter of all seeds run production's values throughout,
//! and every other seed keeps each knob at production's value one time in three, so every
//! production value runs in about half the seeds. The rest are the compressed timings the
//! simulation used before (snapshots and GC within a run, a dead node marked down in seconds)
//! and values between: a bug that needs a short TTL or a long one is found either way.
//!
//! The knobs come from their own stream of the seed, so the scenario's plan (its servers,
//! start times and faults) is the one the seed always drew. They are printed as the first line
//! of a run's fault schedule and kept in a shrunk schedule's file.

use std::fmt;
use std::time::Duration;

use drover_core::config::ServerConfig;
use drover_core::csi::watcher::GcConfig;
use drover_core::heartbeat::HeartbeatConfig;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha_03::ChaCha8Rng;
use serde_json::{Value, json};

/// Keeps the knobs' stream apart from the scenario's and the workload's, which draw from the
/// same seed.
const KNOB_STREAM: u64 = 0x6b6e_6f62_735f_7631;

/// The timings one seed runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Nomad's `raft_multiplier`: every Raft timing this many times production's (1).
    pub raft_multiplier: u32,
    /// Node heartbeat TTLs: the shortest TTL handed out, the grace a missed heartbeat gets,
    /// and the TTL every node gets when a new leader takes office.
    pub heartbeat: HeartbeatConfig,
    /// Raft log entries between snapshots.
    pub snapshot_threshold: u64,
    /// How often a server looks whether a snapshot is due.
    pub snapshot_interval: Duration,
    /// `server_join { retry_interval }`: how long a server waits before joining again.
    pub retry_join: Duration,
    /// CSI claim and plugin garbage collection.
    pub csi_gc: GcConfig,
}

/// One knob's draw: production's value one time in three, else one of `others`.
fn pick<T: Copy>(rng: &mut ChaCha8Rng, production: T, others: &[T]) -> T {
    if rng.gen_ratio(1, 3) {
        production
    } else {
        others[rng.gen_range(0..others.len())]
    }
}

const fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

impl Knobs {
    /// Production's values: what an agent runs with when its configuration names none.
    pub fn production() -> Knobs {
        let server = ServerConfig::default();
        Knobs {
            raft_multiplier: 1,
            heartbeat: server.timing.heartbeat,
            snapshot_threshold: server.timing.snapshot_threshold,
            snapshot_interval: server.timing.snapshot_interval,
            retry_join: server.retry_interval,
            csi_gc: server.timing.csi_gc,
        }
    }

    /// The knobs seed `seed` runs with.
    pub fn draw(seed: u64) -> Knobs {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ KNOB_STREAM);
        let production = Knobs::production();
        if rng.gen_ratio(1, 4) {
            return production;
        }
        let raft_multiplier = pick(&mut rng, production.raft_multiplier, &[2, 3]);
        let min_ttl = pick(&mut rng, production.heartbeat.min_ttl, &[secs(3), secs(5)]);
        let grace = pick(&mut rng, production.heartbeat.grace, &[secs(3), secs(5)]);
        let failover_ttl = pick(&mut rng, production.heartbeat.failover_ttl, &[secs(20), secs(60)]);
        let snapshot_threshold = pick(&mut rng, production.snapshot_threshold, &[64, 512]);
        let snapshot_interval = pick(&mut rng, production.snapshot_interval, &[secs(1), secs(10)]);
        let retry_join = pick(&mut rng, production.retry_join, &[secs(5), secs(15)]);
        let (claim_gc_interval, claim_gc_threshold) = pick(
            &mut rng,
            (
                production.csi_gc.claim_gc_interval,
                production.csi_gc.claim_gc_threshold,
            ),
            &[(secs(20), secs(10)), (secs(60), secs(30))],
        );
        let (plugin_gc_interval, plugin_gc_threshold) = pick(
            &mut rng,
            (
                production.csi_gc.plugin_gc_interval,
                production.csi_gc.plugin_gc_threshold,
            ),
            &[(secs(30), secs(30)), (secs(60), secs(120))],
        );
        Knobs {
            raft_multiplier,
            heartbeat: HeartbeatConfig {
                min_ttl,
                grace,
                failover_ttl,
                ..production.heartbeat
            },
            snapshot_threshold,
            snapshot_interval,
            retry_join,
            csi_gc: GcConfig {
                claim_gc_interval,
                claim_gc_threshold,
                plugin_gc_interval,
                plugin_gc_threshold,
            },
        }
    }

    /// The compressed timings the scenarios were written against and the benches run with:
    /// snapshots and GC within a run, a dead node marked down 6 s after its last heartbeat.
    pub fn shortest() -> Knobs {
        let production = Knobs::production();
        Knobs {
            raft_multiplier: 1,
            heartbeat: HeartbeatConfig {
                min_ttl: secs(3),
                grace: secs(3),
                failover_ttl: secs(20),
                ..production.heartbeat
            },
            snapshot_threshold: 64,
            snapshot_interval: secs(1),
            retry_join: secs(5),
            csi_gc: GcConfig {
                claim_gc_interval: secs(20),
                claim_gc_threshold: secs(10),
                plugin_gc_interval: secs(30),
                plugin_gc_threshold: secs(30),
            },
        }
    }

    /// How long after its last heartbeat a node is marked down (no leader change meanwhile).
    pub fn down_after(&self) -> Duration {
        self.heartbeat.min_ttl + self.heartbeat.grace
    }

    /// When a client outage from `began` to `ended`, drawn against the shortest timings,
    /// ends under these: one that outlasted the shortest time to mark its node down ends as
    /// much later as these TTLs take longer, so the node is still marked down (its
    /// allocations lost and replaced, a plugin deregistered while its replacement
    /// registers); a shorter one is left alone. Without it, production's 20 s would outlast
    /// most of the 2–30 s outages the scenarios draw, and the down-and-back paths (#12744's)
    /// would run only in the seeds that drew short TTLs.
    pub fn outage_end(&self, began: Duration, ended: Duration) -> Duration {
        let shortest = Knobs::shortest().down_after();
        if ended.saturating_sub(began) > shortest {
            ended + self.down_after().saturating_sub(shortest)
        } else {
            ended
        }
    }

    /// Whether every knob has production's value.
    pub fn is_production(&self) -> bool {
        *self == Knobs::production()
    }

    /// Sets a server's configuration to these timings.
    pub fn apply(&self, server: &mut ServerConfig) {
        let defaults = ServerConfig::default().timing;
        let timing = &mut server.timing;
        timing.raft_heartbeat = defaults.raft_heartbeat;
        timing.raft_election_timeout_min = defaults.raft_election_timeout_min;
        timing.raft_election_timeout_max = defaults.raft_election_timeout_max;
        timing.raft_failure_timeout = defaults.raft_failure_timeout;
        timing.raft_election_spread = defaults.raft_election_spread;
        timing.scale_raft(self.raft_multiplier);
        timing.heartbeat = self.heartbeat;
        timing.snapshot_threshold = self.snapshot_threshold;
        timing.snapshot_interval = self.snapshot_interval;
        timing.csi_gc = self.csi_gc;
        server.retry_interval = self.retry_join;
    }

    /// How much longer than with the simulation's shortest timings the cluster may take to
    /// settle once the faults stop: a lost node is marked down only after its TTL and grace
    /// (every node's failover TTL, if a leader took office), a server that missed a join
    /// tries again only after `retry_join`, and elections take `raft_multiplier` times longer.
    pub fn settle_extra(&self) -> Duration {
        let shortest = Knobs::shortest();
        let settle = |knobs: &Knobs| knobs.heartbeat.failover_ttl.max(knobs.heartbeat.min_ttl) + knobs.heartbeat.grace;
        let heartbeat = settle(self).saturating_sub(settle(&shortest));
        let join = self.retry_join.saturating_sub(shortest.retry_join);
        let raft = secs(2) * (self.raft_multiplier - shortest.raft_multiplier);
        heartbeat + join + raft
    }

    /// The knobs as a schedule file keeps them.
    pub fn to_json(&self) -> Value {
        json!({
            "production": self.is_production(),
            "raft_multiplier": self.raft_multiplier,
            "heartbeat_min_ttl_secs": self.heartbeat.min_ttl.as_secs_f64(),
            "heartbeat_grace_secs": self.heartbeat.grace.as_secs_f64(),
            "heartbeat_failover_ttl_secs": self.heartbeat.failover_ttl.as_secs_f64(),
            "snapshot_threshold": self.snapshot_threshold,
            "snapshot_interval_secs": self.snapshot_interval.as_secs_f64(),
            "retry_join_secs": self.retry_join.as_secs_f64(),
            "claim_gc_interval_secs": self.csi_gc.claim_gc_interval.as_secs_f64(),
            "claim_gc_threshold_secs": self.csi_gc.claim_gc_threshold.as_secs_f64(),
            "plugin_gc_interval_secs": self.csi_gc.plugin_gc_interval.as_secs_f64(),
            "plugin_gc_threshold_secs": self.csi_gc.plugin_gc_threshold.as_secs_f64(),
        })
    }
}

impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "knobs{}: raft x{}, node ttl {}s + grace {}s (failover {}s), snapshot every {} entries \
             (checked every {}s), retry_join {}s, claim gc {}s/{}s, plugin gc {}s/{}s",
            if self.is_production() { " (production)" } else { "" },
            self.raft_multiplier,
            self.heartbeat.min_ttl.as_secs(),
            self.heartbeat.grace.as_secs(),
            self.heartbeat.failover_ttl.as_secs(),
            self.snapshot_threshold,
            self.snapshot_interval.as_secs(),
            self.retry_join.as_secs(),
            self.csi_gc.claim_gc_interval.as_secs(),
            self.csi_gc.claim_gc_threshold.as_secs(),
            self.csi_gc.plugin_gc_interval.as_secs(),
            self.csi_gc.plugin_gc_threshold.as_secs(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_its_knobs() {
        for seed in 0..64 {
            assert_eq!(Knobs::draw(seed), Knobs::draw(seed));
        }
    }

    #[test]
    fn production_values_run_in_at_least_a_quarter_of_seeds() {
        let seeds = 0..2_000u64;
        let drawn: Vec<Knobs> = seeds.clone().map(Knobs::draw).collect();
        let production = Knobs::production();
        let share = |matches: &dyn Fn(&Knobs) -> bool| {
            drawn.iter().filter(|knobs| matches(knobs)).count() as f64 / drawn.len() as f64
        };
        let whole = share(&|knobs| knobs.is_production());
        assert!((0.22..0.32).contains(&whole), "whole-production seeds: {whole}");
        type Matches<'a> = &'a dyn Fn(&Knobs) -> bool;
        let each: [(&str, Matches); 6] = [
            ("raft", &|knobs| knobs.raft_multiplier == 1),
            ("ttl", &|knobs| knobs.heartbeat.min_ttl == production.heartbeat.min_ttl),
            ("failover", &|knobs| {
                knobs.heartbeat.failover_ttl == production.heartbeat.failover_ttl
            }),
            ("snapshot", &|knobs| {
                knobs.snapshot_threshold == production.snapshot_threshold
            }),
            ("retry_join", &|knobs| knobs.retry_join == production.retry_join),
            ("claim gc", &|knobs| {
                knobs.csi_gc.claim_gc_interval == production.csi_gc.claim_gc_interval
            }),
        ];
        for (name, matches) in each {
            let share = share(matches);
            assert!(share >= 0.4, "{name}: production's value in {share} of seeds");
        }
        // And the other values run too: every knob varies.
        assert!(drawn.iter().any(|knobs| knobs.raft_multiplier == 3));
        assert!(drawn.iter().any(|knobs| knobs.snapshot_threshold == 64));
        assert!(drawn.iter().any(|knobs| knobs.heartbeat.failover_ttl == secs(20)));
    }

    #[test]
    fn production_settles_as_long_as_its_failover_ttl_allows() {
        assert_eq!(Knobs::production().settle_extra(), secs(300 + 10 + 25 - 23));
        assert_eq!(Knobs::shortest().settle_extra(), Duration::ZERO);
    }

    #[test]
    fn an_outage_long_enough_to_mark_its_node_down_still_does_under_longer_ttls() {
        let production = Knobs::production();
        // Longer than the shortest 6 s: ends 14 s later under production's 10 s + 10 s.
        assert_eq!(production.outage_end(secs(10), secs(17)), secs(31));
        // Shorter: the node was never to be marked down, and is not.
        assert_eq!(production.outage_end(secs(10), secs(15)), secs(15));
        // The shortest timings change nothing.
        assert_eq!(Knobs::shortest().outage_end(secs(10), secs(40)), secs(40));
    }

    #[test]
    fn applying_knobs_scales_raft_from_production() {
        let mut server = ServerConfig::default();
        let knobs = Knobs {
            raft_multiplier: 3,
            ..Knobs::production()
        };
        knobs.apply(&mut server);
        knobs.apply(&mut server);
        assert_eq!(
            server.timing.raft_failure_timeout,
            ServerConfig::default().timing.raft_failure_timeout * 3
        );
    }
}
