//! Formation and failover bench with real `agent` processes on loopback, each configured by a
//! Nomad-style HCL file (`server { bootstrap_expect = 3  server_join { retry_join
//! retry_interval = "1s" } }`). Prints distributions; asserts nothing.
//!
//!   cargo bench -p drover --bench formation [-- ROUNDS]     (default 20)
//!
//! Per round, on a fresh 3-server cluster:
//! - formation: the last server started → all three report the same leader;
//! - crash failover: `kill -9` of the leader → both survivors report the same new leader;
//! - rejoin: the killed server restarted → all three agree again;
//! - graceful failover: SIGTERM to the (new) leader → both survivors report a new leader (the
//!   leaving leader hands over first; measured from the signal, so it includes its shutdown).
//!
//! Then, on one more cluster: `GET /v1/jobs` latency through the leader and through a
//! follower, consistent (the default: Raft read barrier) against `?stale` (answered locally),
//! 500 requests each over a fresh connection; the consistent figure's ratio is against the
//! stale one of the same server. Last, the resident memory of an idle `agent -dev` 30 s after
//! it started.
//!
//! Baseline (measured in the same run): spawn → HTTP API answering, for `agent -dev`. Leaders
//! are polled every 2 ms.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::{Agent, ServerSpec, agreed_leader, cluster_specs, dev_spec, wait_for_every};

const LIMIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(2);

fn stats(label: &str, samples: &mut [Duration], baseline: Option<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let ratio = baseline.map_or(String::new(), |base| {
        format!("  = {:.1}x baseline", ms(at(0.5)) / ms(base))
    });
    println!(
        "{label:<46} min {:>7.1}  p50 {:>7.1}  p90 {:>7.1}  max {:>7.1} ms  (n={}){ratio}",
        ms(samples[0]),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

fn dev_agent(root: &std::path::Path, round: usize) -> (Agent, Instant) {
    let (spec, args) = dev_spec(root, &format!("dev{round}"));
    let started = Instant::now();
    (Agent::start(spec, args), started)
}

/// The server's Nomad-style configuration file, and the flag that loads it.
fn hcl_args(specs: &[ServerSpec], index: usize) -> Vec<String> {
    let spec = &specs[index];
    let join: Vec<String> = specs
        .iter()
        .enumerate()
        .filter(|(other, _)| *other != index)
        .map(|(_, peer)| format!("\"127.0.0.1:{}\"", peer.serf))
        .collect();
    let hcl = format!(
        "name      = \"{name}\"\ndata_dir  = \"{dir}\"\nbind_addr = \"127.0.0.1\"\n\nports {{\n  http = {http}\n  rpc  = {rpc}\n  serf = {serf}\n}}\n\nserver {{\n  enabled          = true\n  bootstrap_expect = {n}\n  server_join {{\n    retry_join     = [{join}]\n    retry_interval = \"1s\"\n  }}\n}}\n",
        name = spec.name,
        dir = spec.data_dir.display(),
        http = spec.http,
        rpc = spec.rpc,
        serf = spec.serf,
        n = specs.len(),
        join = join.join(", "),
    );
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    let file = spec.data_dir.with_extension("hcl");
    std::fs::write(&file, hcl).unwrap();
    vec![format!("-config={}", file.display())]
}

fn new_leader(agents: &[Agent], gone: usize, old: &str) -> Duration {
    let started = Instant::now();
    let survivors: Vec<&Agent> = agents
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != gone)
        .map(|(_, agent)| agent)
        .collect();
    wait_for_every(LIMIT, POLL, || agreed_leader(&survivors, 3).filter(|new| new != old)).expect("a new leader");
    started.elapsed()
}

/// Consistent against stale read latency, through the leader and through a follower.
fn read_latency(root: &std::path::Path, baseline: Duration) {
    let specs = cluster_specs(&root.join("reads"), 3);
    let agents: Vec<Agent> = (0..3)
        .map(|index| Agent::start(specs[index].clone(), hcl_args(&specs, index)))
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader = wait_for_every(LIMIT, POLL, || agreed_leader(&refs, 3)).expect("cluster forms");
    let leader_port = agents
        .iter()
        .find(|agent| agent.rpc_addr() == leader)
        .unwrap()
        .spec
        .http;
    let follower_port = agents
        .iter()
        .find(|agent| agent.rpc_addr() != leader)
        .unwrap()
        .spec
        .http;
    let time = |port: u16, path: &str| -> Vec<Duration> {
        (0..500)
            .map(|_| {
                let started = Instant::now();
                support::http_get(port, path).expect("the read answers");
                started.elapsed()
            })
            .collect()
    };
    // Each consistent figure's ratio is against the stale reads of the same server.
    for (server, port) in [("the leader", leader_port), ("a follower", follower_port)] {
        let _ = time(port, "/v1/jobs?stale");
        let mut stale = time(port, "/v1/jobs?stale");
        stats(&format!("GET /v1/jobs?stale on {server}"), &mut stale, None);
        let base = stale[stale.len() / 2];
        stats(
            &format!("GET /v1/jobs on {server} (consistent)"),
            &mut time(port, "/v1/jobs"),
            Some(base),
        );
    }
    let _ = baseline;
}

/// Resident memory of an idle `agent -dev` 30 s after it started (issue 19 §5: goal 12 MB),
/// split into anonymous memory and file-backed pages (mostly the agent's own code), and again
/// 90 s after start: the agent lets go of its start-up code 10 s after start, and what an idle
/// agent runs later (fingerprints every 30 s, the client's heartbeats) must not creep back.
fn idle_memory(root: &std::path::Path) {
    let (agent, started) = dev_agent(root, 99);
    wait_for_every(LIMIT, POLL, || agent.leader()).expect("dev agent leads");
    let pid = agent.pid().expect("running");
    for after in [30, 90] {
        std::thread::sleep(Duration::from_secs(after).saturating_sub(started.elapsed()));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|line| line.starts_with(name))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
                .map_or(f64::NAN, |kb| kb / 1024.0)
        };
        println!(
            "idle agent -dev RSS {after} s after start: {:.1} MB (anonymous {:.1} MB, file {:.1} MB)",
            field("VmRSS:"),
            field("RssAnon:"),
            field("RssFile:")
        );
    }
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(20);
    let root = tempfile::tempdir().unwrap();
    println!("formation bench: {rounds} rounds, release agent at {}", support::AGENT);

    let mut http_ready = Vec::new();
    let mut dev_leader = Vec::new();
    for round in 0..rounds.min(10) {
        let (agent, started) = dev_agent(root.path(), round);
        wait_for_every(LIMIT, POLL, || agent.get("/v1/agent/self")).expect("dev agent answers");
        http_ready.push(started.elapsed());
        wait_for_every(LIMIT, POLL, || agent.leader()).expect("dev agent leads");
        dev_leader.push(started.elapsed());
    }
    let baseline = {
        let mut sorted = http_ready.clone();
        sorted.sort();
        sorted[sorted.len() / 2]
    };
    stats("baseline: agent -dev spawn -> HTTP answering", &mut http_ready, None);
    stats("agent -dev spawn -> leader", &mut dev_leader, Some(baseline));

    let (mut formation, mut crash, mut rejoin, mut graceful) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let specs = cluster_specs(&root.path().join(format!("cluster{round}")), 3);
        let mut agents: Vec<Agent> = (0..3)
            .map(|index| Agent::start(specs[index].clone(), hcl_args(&specs, index)))
            .collect();
        let last_start = Instant::now();
        let refs: Vec<&Agent> = agents.iter().collect();
        let leader = wait_for_every(LIMIT, POLL, || agreed_leader(&refs, 3)).expect("cluster forms");
        formation.push(last_start.elapsed());

        let index = agents.iter().position(|agent| agent.rpc_addr() == leader).unwrap();
        agents[index].kill();
        crash.push(new_leader(&agents, index, &leader));

        agents[index].restart();
        let restarted = Instant::now();
        let refs: Vec<&Agent> = agents.iter().collect();
        let leader = wait_for_every(LIMIT, POLL, || agreed_leader(&refs, 3)).expect("rejoin");
        rejoin.push(restarted.elapsed());

        let index = agents.iter().position(|agent| agent.rpc_addr() == leader).unwrap();
        agents[index].signal(libc::SIGTERM);
        graceful.push(new_leader(&agents, index, &leader));
        agents[index].terminate();
    }
    stats(
        "3 servers: last start -> same leader on all 3",
        &mut formation,
        Some(baseline),
    );
    stats(
        "3 servers: kill -9 leader -> survivors agree",
        &mut crash,
        Some(baseline),
    );
    stats(
        "3 servers: restart killed server -> all agree",
        &mut rejoin,
        Some(baseline),
    );
    stats(
        "3 servers: SIGTERM leader -> survivors agree",
        &mut graceful,
        Some(baseline),
    );
    read_latency(root.path(), baseline);
    idle_memory(root.path());
    let timing = drover_core::config::ServerTiming::default();
    println!(
        "(Raft heartbeat {:?}, leader lease {:?}; a follower stands after {:?} of silence plus up to {:?})",
        timing.raft_heartbeat,
        timing.raft_election_timeout_max,
        timing.raft_failure_timeout,
        timing.raft_election_spread
    );
}
