//! Real `agent` processes on loopback: three servers with `bootstrap_expect = 3`, started in
//! every order, form one cluster; kill -9 the leader and a new leader is elected; restart it and
//! it rejoins without bootstrapping again.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use support::{Agent, ServerSpec, agreed_leader, cluster_specs, http, http_status, server_args, wait_for};

const FORMATION_LIMIT: Duration = Duration::from_secs(60);

fn permutations() -> Vec<[usize; 3]> {
    vec![[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
}

fn bootstrap_lines(log: &str) -> usize {
    log.lines().filter(|line| line.contains("bootstrapping Raft")).count()
}

/// Three servers started together, once they agree on a leader: their specs, the agents and
/// the leader's index among them.
fn formed_cluster(root: &Path) -> (Vec<ServerSpec>, Vec<Agent>, usize) {
    let specs = cluster_specs(root, 3);
    let agents: Vec<Agent> = (0..3)
        .map(|index| Agent::start(specs[index].clone(), server_args(&specs, index)))
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader = wait_for(FORMATION_LIMIT, || agreed_leader(&refs, 3)).expect("the cluster forms");
    let leader_index = agents.iter().position(|agent| agent.rpc_addr() == leader).unwrap();
    (specs, agents, leader_index)
}

#[test]
fn three_servers_form_one_cluster_in_every_start_order() {
    for order in permutations() {
        let root = tempfile::tempdir().unwrap();
        let specs = cluster_specs(root.path(), 3);
        let mut agents: Vec<Option<Agent>> = (0..3).map(|_| None).collect();
        for &index in &order {
            agents[index] = Some(Agent::start(specs[index].clone(), server_args(&specs, index)));
            std::thread::sleep(Duration::from_millis(300));
        }
        let agents: Vec<Agent> = agents.into_iter().map(Option::unwrap).collect();
        let refs: Vec<&Agent> = agents.iter().collect();
        let leader = wait_for(FORMATION_LIMIT, || agreed_leader(&refs, 3));
        let logs: Vec<String> = agents.iter().map(Agent::log).collect();
        assert!(
            leader.is_some(),
            "order {order:?}: no common leader\n{}",
            logs.join("\n---\n")
        );
        // One cluster: every server reports the same three peers.
        let mut peer_sets: Vec<Vec<String>> = agents
            .iter()
            .map(|agent| {
                let mut peers = agent.peers();
                peers.sort();
                peers
            })
            .collect();
        peer_sets.dedup();
        assert_eq!(
            peer_sets.len(),
            1,
            "order {order:?}: servers disagree on membership: {peer_sets:?}"
        );
    }
}

#[test]
fn leader_killed_then_restarted_rejoins_without_bootstrapping() {
    let root = tempfile::tempdir().unwrap();
    let (_, mut agents, leader_index) = formed_cluster(root.path());
    let leader = agents[leader_index].rpc_addr();

    // A write acknowledged before the crash must survive it.
    let written = http(
        "PUT",
        agents[0].spec.http,
        "/v1/var/test/before-crash",
        Some(r#"{"Items":{"k":"v"}}"#),
    );
    assert!(written.is_some(), "write through s1 failed:\n{}", agents[0].log());

    agents[leader_index].kill();
    let survivors: Vec<&Agent> = agents
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader_index)
        .map(|(_, a)| a)
        .collect();
    let new_leader = wait_for(FORMATION_LIMIT, || agreed_leader(&survivors, 3));
    assert!(
        new_leader.as_ref().is_some_and(|new| *new != leader),
        "no new leader after killing {leader}: {new_leader:?}"
    );

    // The new leader retries the dead peer at every 25 ms heartbeat for a second, and says so
    // once (issue 19: one line when a peer becomes unreachable, one when it returns).
    let new_leader = new_leader.unwrap();
    let new_index = agents.iter().position(|agent| agent.rpc_addr() == new_leader).unwrap();
    let dead = format!("addr={}", agents[leader_index].rpc_addr());
    let about_dead = |line: &&str, text: &str| line.contains(text) && line.contains(&dead);
    std::thread::sleep(Duration::from_secs(1));
    let log = agents[new_index].log();
    let unreachable = log
        .lines()
        .filter(|line| about_dead(line, "Raft peer unreachable"))
        .count();
    assert_eq!(unreachable, 1, "one unreachable line for {dead}:\n{log}");

    let bootstraps_before = bootstrap_lines(&agents[leader_index].log());
    agents[leader_index].restart();
    let everyone: Vec<&Agent> = agents.iter().collect();
    let settled = wait_for(FORMATION_LIMIT, || agreed_leader(&everyone, 3));
    assert!(
        settled.is_some(),
        "the restarted server did not rejoin:\n{}",
        agents[leader_index].log()
    );
    // Raft may have moved on to another leader meanwhile; the one that saw the peer go sees
    // it come back (once its next heartbeat is answered), once, and says nothing more of it.
    if settled.as_deref() == Some(new_leader.as_str()) {
        let lines = |log: &str, text: &str| log.lines().filter(|line| about_dead(line, text)).count();
        wait_for(Duration::from_secs(10), || {
            (lines(&agents[new_index].log(), "Raft peer reachable again") > 0).then_some(())
        })
        .unwrap_or_else(|| panic!("no reachable line for {dead}:\n{}", agents[new_index].log()));
        // Heartbeats keep flowing meanwhile: nothing more is said of the peer.
        std::thread::sleep(Duration::from_millis(500));
        let log = agents[new_index].log();
        assert_eq!(lines(&log, "Raft peer reachable again"), 1, "{log}");
        assert_eq!(lines(&log, "Raft peer unreachable"), 1, "{log}");
    }
    let log = agents[leader_index].log();
    let second_life = log.split("=== restart ===").nth(1).unwrap_or_default();
    assert_eq!(
        bootstrap_lines(second_life),
        0,
        "re-bootstrapped after restart:\n{second_life}"
    );
    assert!(bootstraps_before <= 1);
    assert!(second_life.contains("boot_count=2"), "{second_life}");

    // The restarted server has the write (replicated and durable).
    let body = wait_for(FORMATION_LIMIT, || {
        agents[leader_index].get("/v1/var/test/before-crash")
    });
    let body = body.expect("variable readable on the restarted server");
    assert!(body.contains(r#""k":"v""#), "{body}");
    let self_info = agents[leader_index].get("/v1/agent/self").unwrap();
    assert!(self_info.contains(r#""bootstrapped":"true""#), "{self_info}");
}

/// What a server says of the leader, as Nomad's do: 500 `No cluster leader` while it knows
/// none; once the cluster has formed, `X-Nomad-KnownLeader` and a real `X-Nomad-LastContact`
/// (0 on the leader, the age of the leader's last heartbeat on a follower).
#[test]
fn servers_say_no_cluster_leader_until_there_is_one_and_how_recent_its_contact_is() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let first = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let status = |port: u16| {
        let url = format!("http://127.0.0.1:{port}/v1/status/leader");
        match ureq::get(&url).call() {
            Ok(response) => (response.status(), response.into_string().unwrap()),
            Err(ureq::Error::Status(code, response)) => (code, response.into_string().unwrap()),
            // Not listening yet.
            Err(_) => (0, String::new()),
        }
    };
    // Alone, it waits for two more servers: no leader.
    let (code, body) = wait_for(Duration::from_secs(20), || {
        let (code, body) = status(specs[0].http);
        (code != 0).then_some((code, body))
    })
    .unwrap();
    assert_eq!((code, body.trim()), (500, "No cluster leader"));
    let others: Vec<Agent> = (1..3)
        .map(|index| Agent::start(specs[index].clone(), server_args(&specs, index)))
        .collect();
    let agents: Vec<&Agent> = std::iter::once(&first).chain(others.iter()).collect();
    let leader = wait_for(FORMATION_LIMIT, || agreed_leader(&agents, 3)).expect("the cluster forms");
    for agent in &agents {
        let (code, body) = status(agent.spec.http);
        assert_eq!((code, body.trim()), (200, format!("{leader:?}").as_str()));
        let response = ureq::get(&format!("http://127.0.0.1:{}/v1/jobs", agent.spec.http))
            .call()
            .unwrap();
        assert_eq!(response.header("X-Nomad-KnownLeader"), Some("true"));
        let contact: u64 = response.header("X-Nomad-LastContact").unwrap().parse().unwrap();
        if agent.rpc_addr() == leader {
            assert_eq!(contact, 0, "the leader is its own contact");
        } else {
            assert!(contact < 600, "a follower heard the leader {contact} ms ago");
        }
        // The Raft configuration as Nomad's operator endpoint shows it, and the regions.
        let configuration: serde_json::Value =
            serde_json::from_str(&http("GET", agent.spec.http, "/v1/operator/raft/configuration", None).unwrap())
                .unwrap();
        let servers = configuration["Servers"].as_array().unwrap();
        assert_eq!(servers.len(), 3, "{configuration}");
        let leaders: Vec<&serde_json::Value> = servers.iter().filter(|s| s["Leader"] == true).collect();
        assert_eq!(leaders.len(), 1, "{configuration}");
        assert_eq!(leaders[0]["Address"], leader.as_str());
        assert!(servers.iter().all(|s| s["Voter"] == true && s["RaftProtocol"] == "3"));
        assert!(
            servers.iter().all(|s| {
                let node = s["Node"].as_str().unwrap();
                node.ends_with(".global") && !node.ends_with(".global.global")
            }),
            "named <node>.<region>, as Nomad's: {configuration}"
        );
        assert_eq!(
            http("GET", agent.spec.http, "/v1/regions", None).unwrap().trim(),
            r#"["global"]"#
        );
    }
    let output = std::process::Command::new(support::AGENT)
        .args(["operator", "raft", "list-peers"])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{}", first.spec.http))
        .env_remove("NOMAD_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    let rows: Vec<&str> = text.lines().collect();
    assert!(
        rows[0].starts_with("Node") && rows[0].contains("RaftProtocol"),
        "{text}"
    );
    assert_eq!(rows.len(), 4, "{text}");
    assert_eq!(rows.iter().filter(|row| row.contains(" leader ")).count(), 1, "{text}");
    assert!(
        rows.iter().any(|row| row.contains(" leader ") && row.contains(&leader)),
        "{text}"
    );
}

/// Reads are consistent by default (Nomad's default): a write acknowledged through one server
/// is seen by an immediate read through another, every time, because the reading server waits
/// for the leader's commit index first (without that barrier a follower answers from state up
/// to a heartbeat old). `?stale` reads are local; a server without a quorum refuses consistent
/// reads with Nomad's 500 `No cluster leader` and still answers stale ones.
#[test]
fn reads_are_consistent_unless_stale_and_refused_without_a_leader() {
    let root = tempfile::tempdir().unwrap();
    let (specs, mut agents, leader_index) = formed_cluster(root.path());
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader_index).collect();
    let get = |port: u16, path: &str| http_status("GET", port, path, None).unwrap_or_else(|| panic!("GET {path}"));

    let (code, body) = get(specs[0].http, "/v1/jobs?stale=maybe");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("`stale`"), "{body}");

    // Written through one follower, read at once through the other.
    let (writer, reader) = (specs[followers[0]].http, specs[followers[1]].http);
    for round in 0..40 {
        let value = json!({"Items": {"round": round.to_string()}}).to_string();
        http("PUT", writer, "/v1/var/consistency/probe", Some(&value)).expect("written");
        // A read refused while the servers elect (a loaded machine can starve heartbeats)
        // is right, not stale: ask again. What is answered must be the latest write.
        let (code, body) = wait_for(Duration::from_secs(30), || {
            let (code, body) = get(reader, "/v1/var/consistency/probe");
            (!(code == 500 && body.contains("No cluster leader"))).then_some((code, body))
        })
        .expect("the reader answers once a leader is elected");
        assert_eq!(code, 200, "{body}");
        let read: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            read["Items"]["round"],
            round.to_string(),
            "round {round} read a stale value"
        );
    }

    // Without a quorum: consistent reads are refused, stale ones answered.
    let survivor = followers[0];
    for index in (0..3).filter(|index| *index != survivor) {
        agents[index].kill();
    }
    let port = specs[survivor].http;
    let (code, body) = wait_for(Duration::from_secs(10), || {
        let (code, body) = get(port, "/v1/jobs");
        (code != 200).then_some((code, body))
    })
    .expect("consistent reads stop");
    assert_eq!((code, body.trim()), (500, "No cluster leader"));
    // Once it has not heard the dead leader for its failure timeout, it says so.
    wait_for(Duration::from_secs(10), || {
        let stale = ureq::get(&format!("http://127.0.0.1:{port}/v1/jobs?stale"))
            .call()
            .unwrap();
        assert_eq!(stale.status(), 200);
        (stale.header("X-Nomad-KnownLeader") == Some("false")).then_some(())
    })
    .expect("a stale read says no leader is known");
}

/// A follower far behind on large entries catches up: the leader's AppendEntries are capped
/// at `APPEND_ENTRIES_BYTES` (256 KiB), because openraft 0.9 gives each one a single 25 ms
/// heartbeat to complete and retries a timed-out batch unchanged — 300 entries of 60 KB sent
/// as one batch would time out forever.
#[test]
fn a_follower_far_behind_on_large_entries_catches_up() {
    let root = tempfile::tempdir().unwrap();
    let (_, mut agents, leader_index) = formed_cluster(root.path());
    let behind = (leader_index + 1) % 3;
    agents[behind].kill();

    let value = "x".repeat(60_000);
    for i in 0..300 {
        let body = format!(r#"{{"Items":{{"v":"{value}"}}}}"#);
        let path = format!("/v1/var/big/{i}");
        assert!(
            http("PUT", agents[leader_index].spec.http, &path, Some(&body)).is_some(),
            "write {i} failed:\n{}",
            agents[leader_index].log()
        );
    }
    agents[behind].restart();
    // Read locally (`?stale`) on the restarted server: it has the last write once it caught up.
    let caught_up = wait_for(Duration::from_secs(30), || {
        agents[behind]
            .get("/v1/var/big/299?stale")
            .filter(|body| body.contains(&value))
    });
    assert!(
        caught_up.is_some(),
        "the restarted follower never caught up:\n{}",
        agents[behind].log()
    );
}
