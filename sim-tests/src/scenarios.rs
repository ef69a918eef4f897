//! The scenarios. Each turns a seeded generator into a [`Plan`]: which servers, when each
//! first starts, and a fault schedule. Every choice comes from the generator, so a seed names
//! one run exactly.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use drover_core::config::{Advertise, AgentConfig, BootstrapFault, Ports};
use drover_io_sim::cluster::ServerSpec;
use drover_io_sim::consul::ConsulMode;
use drover_io_sim::disk::Crash;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha_03::ChaCha8Rng;

#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Re-create the pre-0.11 self-election bug on every server (negative control).
    pub negative_control: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Server(usize),
    /// Whoever leads when the step runs (resolved at run time, deterministically).
    Leader,
    /// The server killed most recently.
    LastKilled,
}

#[derive(Clone, Debug)]
pub enum Action {
    Kill {
        target: Target,
        crash: Crash,
    },
    Restart(Target),
    /// Cut these servers off from the rest, both ways.
    Partition(Vec<usize>),
    ClogOneWay(usize, usize),
    Heal,
    Consul(ConsulMode),
    AddServer(Box<ServerSpec>),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub at: Duration,
    pub action: Action,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = format!("{:>3}.{:03}s", self.at.as_secs(), self.at.subsec_millis());
        match &self.action {
            Action::Kill { target, crash } => write!(f, "{at} kill {target:?} ({crash:?})"),
            Action::Restart(target) => write!(f, "{at} restart {target:?}"),
            Action::Partition(side) => write!(f, "{at} partition {:?} from the rest", names(side)),
            Action::ClogOneWay(from, to) => write!(f, "{at} clog s{} -> s{}", from + 1, to + 1),
            Action::Heal => write!(f, "{at} heal"),
            Action::Consul(mode) => write!(f, "{at} consul {mode:?}"),
            Action::AddServer(spec) => write!(f, "{at} add server {}", spec.name),
        }
    }
}

fn names(indexes: &[usize]) -> Vec<String> {
    indexes.iter().map(|index| format!("s{}", index + 1)).collect()
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub servers: Vec<ServerSpec>,
    pub consul_initial: ConsulMode,
    pub steps: Vec<Step>,
    /// Servers that stay down through the quiet phase.
    pub keep_dead: Vec<Target>,
    /// How long after the fault phase a leader must be known everywhere.
    pub quiet_bound: Duration,
}

impl Plan {
    /// The fault schedule as the operator reads it: start times, then steps.
    pub fn schedule(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .servers
            .iter()
            .map(|spec| {
                let at = spec.first_start_delay;
                format!("{:>3}.{:03}s start {}", at.as_secs(), at.subsec_millis(), spec.name)
            })
            .collect();
        lines.sort();
        lines.extend(self.steps.iter().map(ToString::to_string));
        lines
    }

    pub fn fault_phase_end(&self) -> Duration {
        let last_start = self
            .servers
            .iter()
            .map(|spec| spec.first_start_delay)
            .max()
            .unwrap_or_default();
        let last_step = self.steps.iter().map(|step| step.at).max().unwrap_or_default();
        last_start.max(last_step) + Duration::from_secs(1)
    }
}

pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub build: fn(&mut ChaCha8Rng, &Options) -> Plan,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "formation_3",
        about: "three servers, bootstrap_expect = 3, random start order and delays",
        build: formation_3,
    },
    Scenario {
        name: "formation_5",
        about: "five servers, bootstrap_expect = 5, random start order and delays",
        build: formation_5,
    },
    Scenario {
        name: "partition_during_formation",
        about: "a partition or one-way clog while the servers are still discovering each other",
        build: partition_during_formation,
    },
    Scenario {
        name: "restart_with_state",
        about: "servers killed (power loss or process kill) and restarted on their disks",
        build: restart_with_state,
    },
    Scenario {
        name: "late_fourth_server",
        about: "a fourth server with the same bootstrap_expect joins a formed cluster",
        build: late_fourth_server,
    },
    Scenario {
        name: "consul_discovery",
        about: "no retry_join: servers find each other only through a Consul that hangs, refuses or is slow",
        build: consul_discovery,
    },
    Scenario {
        name: "leader_killed",
        about: "the leader is killed after formation, and maybe restarted",
        build: leader_killed,
    },
];

pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|scenario| scenario.name == name)
}

fn ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, index as u8 + 1))
}

fn millis(rng: &mut ChaCha8Rng, range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(rng.gen_range(range))
}

/// A server of the simulated cluster: Nomad's default ports on its own address.
fn server(index: usize, expect: u32, join: &[usize], consul: bool, delay: Duration, options: &Options) -> ServerSpec {
    let ports = Ports::default();
    let mut config = AgentConfig {
        name: format!("s{}", index + 1),
        data_dir: Some(format!("/sim/s{}", index + 1)),
        bind_addr: ip(index),
        ports,
        advertise: Advertise::on(ip(index), ports),
        ..AgentConfig::default()
    };
    config.server.enabled = true;
    config.server.bootstrap_expect = expect;
    config.server.retry_join = join
        .iter()
        .filter(|peer| **peer != index)
        .map(|peer| ip(*peer).to_string())
        .collect();
    config.server.retry_interval = Duration::from_secs(5);
    if consul {
        config.consul.address = Some("127.0.0.1:8500".to_string());
    }
    if options.negative_control {
        config.server.bootstrap_fault = Some(BootstrapFault::SelfElectAfterElectionTimeout);
    }
    ServerSpec {
        name: format!("s{}", index + 1),
        ip: ip(index),
        config,
        first_start_delay: delay,
    }
}

/// `n` servers that all retry-join each other, starting in a random order within `spread`.
fn servers(
    rng: &mut ChaCha8Rng,
    n: usize,
    expect: u32,
    spread_ms: u64,
    consul: bool,
    options: &Options,
) -> Vec<ServerSpec> {
    let everyone: Vec<usize> = (0..n).collect();
    let join: &[usize] = if consul { &[] } else { &everyone };
    (0..n)
        .map(|index| server(index, expect, join, consul, millis(rng, 0..spread_ms), options))
        .collect()
}

fn plan(servers: Vec<ServerSpec>, steps: Vec<Step>) -> Plan {
    Plan {
        servers,
        consul_initial: ConsulMode::Healthy,
        steps,
        keep_dead: Vec::new(),
        quiet_bound: Duration::from_secs(60),
    }
}

fn crash(rng: &mut ChaCha8Rng) -> Crash {
    if rng.gen_bool(0.5) {
        Crash::LoseUnsynced
    } else {
        Crash::KeepUnsynced
    }
}

fn formation_3(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    plan(servers(rng, 3, 3, 6_000, false, options), Vec::new())
}

fn formation_5(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    plan(servers(rng, 5, 5, 6_000, false, options), Vec::new())
}

fn partition_during_formation(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    let n = if rng.gen_bool(0.5) { 3 } else { 5 };
    let servers = servers(rng, n, n as u32, 6_000, false, options);
    let mut steps = Vec::new();
    let mut at = millis(rng, 0..6_000);
    for _ in 0..rng.gen_range(1..=2) {
        let action = if rng.gen_bool(0.7) {
            let mut all: Vec<usize> = (0..n).collect();
            all.shuffle(rng);
            let size = rng.gen_range(1..=n / 2);
            let mut side: Vec<usize> = all[..size].to_vec();
            side.sort();
            Action::Partition(side)
        } else {
            let from = rng.gen_range(0..n);
            let to = (from + rng.gen_range(1..n)) % n;
            Action::ClogOneWay(from, to)
        };
        steps.push(Step { at, action });
        at += millis(rng, 3_000..20_000);
        steps.push(Step {
            at,
            action: Action::Heal,
        });
        at += millis(rng, 500..5_000);
    }
    plan(servers, steps)
}

fn restart_with_state(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    let servers = servers(rng, 3, 3, 4_000, false, options);
    let mut steps = Vec::new();
    let mut at = millis(rng, 3_000..12_000);
    for _ in 0..rng.gen_range(2..=3) {
        let target = Target::Server(rng.gen_range(0..3));
        steps.push(Step {
            at,
            action: Action::Kill {
                target,
                crash: crash(rng),
            },
        });
        at += millis(rng, 0..8_000);
        steps.push(Step {
            at,
            action: Action::Restart(Target::LastKilled),
        });
        at += millis(rng, 1_000..10_000);
    }
    plan(servers, steps)
}

fn late_fourth_server(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    let servers = servers(rng, 3, 3, 4_000, false, options);
    let late = server(3, 3, &[0, 1, 2], false, Duration::ZERO, options);
    let steps = vec![Step {
        at: millis(rng, 12_000..20_000),
        action: Action::AddServer(Box::new(late)),
    }];
    plan(servers, steps)
}

fn consul_discovery(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    let servers = servers(rng, 3, 3, 6_000, true, options);
    let bad = [ConsulMode::Hang, ConsulMode::Down, ConsulMode::Slow];
    let initial = *bad.choose(rng).expect("non-empty");
    let mut steps = Vec::new();
    let mut at = millis(rng, 2_000..10_000);
    for _ in 0..rng.gen_range(0..=2) {
        let mode = if rng.gen_bool(0.5) {
            ConsulMode::Healthy
        } else {
            *bad.choose(rng).expect("non-empty")
        };
        steps.push(Step {
            at,
            action: Action::Consul(mode),
        });
        at += millis(rng, 2_000..10_000);
    }
    steps.push(Step {
        at,
        action: Action::Consul(ConsulMode::Healthy),
    });
    Plan {
        consul_initial: initial,
        quiet_bound: Duration::from_secs(90),
        ..plan(servers, steps)
    }
}

fn leader_killed(rng: &mut ChaCha8Rng, options: &Options) -> Plan {
    let n = if rng.gen_bool(0.5) { 3 } else { 5 };
    let servers = servers(rng, n, n as u32, 4_000, false, options);
    let at = millis(rng, 12_000..18_000);
    let mut steps = vec![Step {
        at,
        action: Action::Kill {
            target: Target::Leader,
            crash: crash(rng),
        },
    }];
    let restart = rng.gen_bool(0.5);
    if restart {
        steps.push(Step {
            at: at + millis(rng, 1_000..10_000),
            action: Action::Restart(Target::LastKilled),
        });
    }
    let mut plan = plan(servers, steps);
    if !restart {
        // The killed leader stays down; the survivors still hold a quorum.
        plan.keep_dead = vec![Target::LastKilled];
    }
    plan
}
