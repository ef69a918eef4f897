//! Formation bench with real `agent` processes on loopback. Prints figures; asserts nothing.
//!
//!   cargo bench -p drover --bench formation [-- ROUNDS]
//!
//! Baseline (measured in the same run): spawn → HTTP API answering, for `agent -dev`. Every
//! other figure is also given as a ratio to it.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::{Agent, ServerSpec, agreed_leader, cluster_specs, free_ports, server_args, wait_for};

const LIMIT: Duration = Duration::from_secs(60);

fn stats(label: &str, samples: &mut [Duration], baseline: Option<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = samples[samples.len() / 2];
    let ratio = baseline.map_or(String::new(), |base| {
        format!("  = {:.1}x baseline", ms(median) / ms(base))
    });
    println!(
        "{label:<44} median {:>8.1} ms  min {:>8.1} ms  max {:>8.1} ms  (n={}){ratio}",
        ms(median),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

fn dev_agent(root: &std::path::Path, round: usize) -> (Agent, Instant) {
    let [http, rpc, serf] = free_ports();
    let spec = ServerSpec {
        name: format!("dev{round}"),
        http,
        rpc,
        serf,
        data_dir: root.join(format!("dev{round}")),
    };
    let args = vec![
        "-dev".to_string(),
        format!("-data-dir={}", spec.data_dir.display()),
        format!("-http-port={http}"),
        format!("-rpc-port={rpc}"),
        format!("-serf-port={serf}"),
    ];
    let started = Instant::now();
    (Agent::start(spec, args), started)
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(5);
    let root = tempfile::tempdir().unwrap();
    println!("formation bench: {rounds} rounds, release agent at {}", support::AGENT);

    let mut http_ready = Vec::new();
    let mut dev_leader = Vec::new();
    for round in 0..rounds {
        let (agent, started) = dev_agent(root.path(), round);
        wait_for(LIMIT, || agent.get("/v1/agent/self")).expect("dev agent answers");
        http_ready.push(started.elapsed());
        wait_for(LIMIT, || agent.leader()).expect("dev agent leads");
        dev_leader.push(started.elapsed());
    }
    let baseline = {
        let mut sorted = http_ready.clone();
        sorted.sort();
        sorted[sorted.len() / 2]
    };
    stats("baseline: agent -dev spawn -> HTTP answering", &mut http_ready, None);
    stats("agent -dev spawn -> leader", &mut dev_leader, Some(baseline));

    let mut formation = Vec::new();
    let mut failover = Vec::new();
    let mut rejoin = Vec::new();
    for round in 0..rounds {
        let cluster_root = root.path().join(format!("cluster{round}"));
        let specs = cluster_specs(&cluster_root, 3);
        let mut agents: Vec<Agent> = Vec::new();
        for index in 0..3 {
            agents.push(Agent::start(specs[index].clone(), server_args(&specs, index)));
        }
        let last_start = Instant::now();
        let refs: Vec<&Agent> = agents.iter().collect();
        let leader = wait_for(LIMIT, || agreed_leader(&refs, 3)).expect("cluster forms");
        formation.push(last_start.elapsed());

        let leader_index = agents.iter().position(|agent| agent.rpc_addr() == leader).unwrap();
        agents[leader_index].kill();
        let killed = Instant::now();
        let survivors: Vec<&Agent> = agents
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader_index)
            .map(|(_, a)| a)
            .collect();
        wait_for(LIMIT, || agreed_leader(&survivors, 3).filter(|new| *new != leader)).expect("new leader");
        failover.push(killed.elapsed());

        agents[leader_index].restart();
        let restarted = Instant::now();
        let everyone: Vec<&Agent> = agents.iter().collect();
        wait_for(LIMIT, || agreed_leader(&everyone, 3)).expect("rejoin");
        rejoin.push(restarted.elapsed());
    }
    stats(
        "3 servers: last start -> leader known on all 3",
        &mut formation,
        Some(baseline),
    );
    stats("3 servers: kill -9 leader -> new leader", &mut failover, Some(baseline));
    stats(
        "3 servers: restart killed leader -> rejoined",
        &mut rejoin,
        Some(baseline),
    );
    println!("(Raft election timeout is configured at 600-1200 ms, heartbeat 150 ms.)");
}
