//! The turmoil lane's scenarios: what each does to the cluster after it formed. Every choice
//! (start delays, whom to kill or cut off, when, how lossy the links are) comes from the seed.

use std::time::Duration;

use drover_core::config::{AgentConfig, Ports};
use drover_io_sim::disk::Crash;
use drover_io_sim::turmoil::cluster::{ClientSpec, NetworkSpec, ServerSpec, TurmoilCluster};
use rand::Rng;
use rand_chacha_03::ChaCha8Rng;

/// A fault phase: it runs after formation, while the workload writes and reads, and must
/// leave the cluster healed (the runner then checks liveness and the history).
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub faults: fn(&mut TurmoilCluster, &mut ChaCha8Rng) -> Result<(), String>,
    /// Client nodes (each with a CSI plugin when `csi`).
    pub clients: usize,
    /// Whether an operator runs the CSI claim script (`csi.rs`) alongside the workload.
    pub csi: bool,
}

pub fn all() -> &'static [Scenario] {
    &[
        Scenario {
            name: "formation",
            about: "three servers start in a random order and bootstrap over tonic and UDP gossip; the workload \
                    runs through the HTTP API of every server",
            faults: quiet,
            clients: 0,
            csi: false,
        },
        Scenario {
            name: "leader_kill",
            about: "the leader's process is killed (with or without losing unsynced writes) and restarted later",
            faults: leader_kill,
            clients: 0,
            csi: false,
        },
        Scenario {
            name: "partition_loss",
            about: "one server is cut off, the links drop messages (breaking TCP connections), then all heals",
            faults: partition_loss,
            clients: 0,
            csi: false,
        },
        Scenario {
            name: "csi_claim",
            about: "a client runs a CSI plugin; a volume is registered and claimed by a job, the leader is killed \
                    while the claim is in flight, then the job stops and the claim must be released",
            faults: csi_leader_kill,
            clients: 1,
            csi: true,
        },
    ]
}

pub fn find(name: &str) -> Option<&'static Scenario> {
    all().iter().find(|scenario| scenario.name == name)
}

/// Three servers that retry-join each other by host name, starting within two seconds.
pub fn servers(rng: &mut ChaCha8Rng, keep_dead_connections: bool) -> Vec<ServerSpec> {
    let names: Vec<String> = (1..=3).map(|n| format!("s{n}")).collect();
    names
        .iter()
        .map(|name| {
            // No data directory: this world's files are the host's, and would outlive the run
            // (a replay would start from what its run left). The Raft store lives on the
            // cluster's simulated disk and the root keys in its kept keystore.
            let mut config = AgentConfig {
                name: name.clone(),
                data_dir: None,
                ports: Ports::default(),
                ..AgentConfig::default()
            };
            config.server.enabled = true;
            config.server.bootstrap_expect = 3;
            config.server.retry_join = names.iter().filter(|other| *other != name).cloned().collect();
            config.server.retry_interval = Duration::from_secs(5);
            // Snapshot often, so a restarted server restores one.
            config.server.timing.snapshot_threshold = 64;
            config.server.timing.snapshot_interval = Duration::from_secs(1);
            ServerSpec {
                name: name.clone(),
                config,
                first_start_delay: Duration::from_millis(rng.gen_range(0..2_000)),
                keep_dead_connections,
            }
        })
        .collect()
}

/// Client nodes pointed at the servers by host name.
pub fn clients(count: usize, rng: &mut ChaCha8Rng, keep_dead_connections: bool) -> Vec<ClientSpec> {
    (1..=count)
        .map(|n| {
            let name = format!("c{n}");
            let mut config = AgentConfig {
                name: name.clone(),
                data_dir: Some(format!("/sim/{name}")),
                ports: Ports::default(),
                ..AgentConfig::default()
            };
            config.client.enabled = true;
            config.client.servers = (1..=3).map(|server| format!("s{server}")).collect();
            ClientSpec {
                name,
                config,
                first_start_delay: Duration::from_millis(rng.gen_range(0..3_000)),
                keep_dead_connections,
            }
        })
        .collect()
}

pub fn network(rng: &mut ChaCha8Rng) -> NetworkSpec {
    let max_latency = Duration::from_millis(rng.gen_range(2..30));
    NetworkSpec {
        max_latency,
        ..NetworkSpec::default()
    }
}

fn wait(cluster: &mut TurmoilCluster, rng: &mut ChaCha8Rng, range: std::ops::Range<u64>) -> Result<(), String> {
    let bound = Duration::from_millis(rng.gen_range(range));
    cluster.step_until(bound, |_| false).map(|_| ())
}

fn quiet(cluster: &mut TurmoilCluster, rng: &mut ChaCha8Rng) -> Result<(), String> {
    wait(cluster, rng, 5_000..10_000)
}

fn leader_kill(cluster: &mut TurmoilCluster, rng: &mut ChaCha8Rng) -> Result<(), String> {
    kill_and_restart_leader(cluster, rng, [1_000..4_000, 3_000..10_000, 1_000..5_000])
}

/// The leader dies within the first seconds after formation: while the plugin job, the volume
/// and the consumer job are being registered, or while the claim's controller and node
/// publish are in flight, depending on the seed.
fn csi_leader_kill(cluster: &mut TurmoilCluster, rng: &mut ChaCha8Rng) -> Result<(), String> {
    kill_and_restart_leader(cluster, rng, [300..3_500, 3_000..8_000, 1_000..3_000])
}

/// Waits, kills the leader (with or without its unsynced writes), waits, restarts it and waits
/// again, each wait drawn from its range of milliseconds.
fn kill_and_restart_leader(
    cluster: &mut TurmoilCluster,
    rng: &mut ChaCha8Rng,
    [before, down, after]: [std::ops::Range<u64>; 3],
) -> Result<(), String> {
    wait(cluster, rng, before)?;
    let leader = super::common_leader(cluster).ok().and_then(|id| cluster.index_of(id));
    let victim = leader.unwrap_or_else(|| rng.gen_range(0..3));
    let crash = if rng.gen_bool(0.5) {
        Crash::LoseUnsynced
    } else {
        Crash::KeepUnsynced
    };
    cluster.crash(victim, crash);
    wait(cluster, rng, down)?;
    cluster.restart(victim);
    wait(cluster, rng, after)
}

fn partition_loss(cluster: &mut TurmoilCluster, rng: &mut ChaCha8Rng) -> Result<(), String> {
    wait(cluster, rng, 1_000..3_000)?;
    let alone = rng.gen_range(0..3);
    let others: Vec<usize> = (0..3).filter(|&index| index != alone).collect();
    cluster.partition(&[alone], &others);
    wait(cluster, rng, 2_000..8_000)?;
    cluster.heal();
    let rate = rng.gen_range(0.005..0.05);
    cluster.set_fail_rate(rate);
    wait(cluster, rng, 2_000..6_000)?;
    cluster.set_fail_rate(0.0);
    wait(cluster, rng, 500..2_000)
}

/// A defect re-created on purpose: the lane must catch it.
pub struct Switch {
    pub name: &'static str,
    pub bug: &'static str,
    pub scenarios: &'static [&'static str],
    /// Invariants any of which reporting it counts as the catch.
    pub invariants: &'static [&'static str],
    /// The run that catches it (scenario, seed): the first catch of the long lane's search from
    /// seed 0. The default run checks only this one still catches it.
    pub caught_by: (&'static str, u64),
}

pub const SWITCHES: &[Switch] = &[Switch {
    name: "no-keepalive",
    bug: "agent RPC keeps using connections that died without a reset: no HTTP/2 keepalive, and a timed-out \
          call's channel is kept",
    scenarios: &["partition_loss"],
    invariants: &["liveness", "acknowledged writes read back"],
    caught_by: ("partition_loss", 0),
}];

pub fn find_switch(name: &str) -> Option<&'static Switch> {
    SWITCHES.iter().find(|switch| switch.name == name)
}
