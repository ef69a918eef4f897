//! Real `agent` processes: three servers, one killed for good. Autopilot removes it from the
//! Raft configuration once it has stayed dead for `server_stabilization_time`, and a
//! restarted server is added back; with cleanup off an operator removes it by hand
//! (`operator raft remove-peer`, `server force-leave`), with Nomad's texts.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::{
    Agent, ServerSpec, agreed_leader, cli, cli_stdout, cluster_specs, get_json, http_status, server_args, wait_for,
};

const LIMIT: Duration = Duration::from_secs(60);
const STABILIZATION: Duration = Duration::from_secs(2);

/// Three servers that agree on a leader, each with `autopilot { server_stabilization_time =
/// "2s" }`; the leader's index among them.
fn formed(root: &Path) -> (Vec<ServerSpec>, Vec<Agent>, usize) {
    let specs = cluster_specs(root, 3);
    let config = root.join("autopilot.hcl");
    std::fs::write(&config, "autopilot {\n  server_stabilization_time = \"2s\"\n}\n").unwrap();
    let agents: Vec<Agent> = (0..3)
        .map(|index| {
            let mut args = server_args(&specs, index);
            args.push(format!("-config={}", config.display()));
            Agent::start(specs[index].clone(), args)
        })
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader = wait_for(LIMIT, || agreed_leader(&refs, 3)).expect("the cluster forms");
    let leader = agents.iter().position(|agent| agent.rpc_addr() == leader).unwrap();
    (specs, agents, leader)
}

/// The Raft configuration's servers as `port` reports them: (ID, Address).
fn raft_servers(port: u16) -> Option<Vec<(String, String)>> {
    let configuration = get_json(port, "/v1/operator/raft/configuration")?;
    let servers = configuration["Servers"].as_array()?;
    Some(
        servers
            .iter()
            .map(|server| {
                (
                    server["ID"].as_str().unwrap_or_default().to_string(),
                    server["Address"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    )
}

fn has_servers(port: u16, count: usize) -> Option<Vec<(String, String)>> {
    raft_servers(port).filter(|servers| servers.len() == count)
}

/// The gossip status of member `name` as the agent at `port` sees it.
fn member_status(port: u16, name: &str) -> Option<String> {
    let members = get_json(port, "/v1/agent/members")?;
    members["Members"]
        .as_array()?
        .iter()
        .find(|member| member["Name"] == format!("{name}.global"))
        .and_then(|member| member["Status"].as_str().map(str::to_string))
}

fn output(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_dead_server_is_removed_after_the_stabilization_time_and_added_back_when_it_returns() {
    let root = tempfile::tempdir().unwrap();
    let (_specs, mut agents, leader) = formed(root.path());
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let port = agents[other].spec.http;

    let config = get_json(port, "/v1/operator/autopilot/configuration").expect("the configuration");
    assert_eq!(config["ServerStabilizationTime"], "2s", "{config}");
    assert_eq!(config["LastContactThreshold"], "200ms", "{config}");
    assert_eq!(config["CleanupDeadServers"], true, "{config}");
    let health = wait_for(LIMIT, || {
        let health = get_json(port, "/v1/operator/autopilot/health")?;
        (health["Healthy"] == true).then_some(health)
    })
    .expect("a healthy cluster");
    assert_eq!(health["FailureTolerance"], 1, "{health}");
    assert_eq!(health["Voters"].as_array().map(Vec::len), Some(3), "{health}");
    // The operator family's shapes, exactly Nomad's field names (`AutopilotConfiguration`,
    // `OperatorHealthReply` without the Enterprise-only fields it omits when empty,
    // `ServerHealth`).
    let (keys, sorted) = (support::field_names, support::sorted_names);
    let table = [
        (
            "AutopilotConfiguration",
            &config,
            sorted(&[
                "CleanupDeadServers",
                "LastContactThreshold",
                "MaxTrailingLogs",
                "MinQuorum",
                "ServerStabilizationTime",
                "EnableRedundancyZones",
                "DisableUpgradeMigration",
                "EnableCustomUpgrades",
                "CreateIndex",
                "ModifyIndex",
            ]),
        ),
        (
            "OperatorHealthReply",
            &health,
            sorted(&["Healthy", "FailureTolerance", "Leader", "Voters", "Servers"]),
        ),
        (
            "ServerHealth",
            &health["Servers"][0],
            sorted(&[
                "ID",
                "Name",
                "Address",
                "SerfStatus",
                "Version",
                "Leader",
                "Voter",
                "LastContact",
                "LastTerm",
                "LastIndex",
                "Healthy",
                "StableSince",
            ]),
        ),
    ];
    for (shape, value, expected) in table {
        assert_eq!(keys(value), expected, "{shape}: {value}");
    }

    let killed_at = Instant::now();
    agents[follower].kill();
    let remaining = wait_for(LIMIT, || has_servers(port, 2))
        .unwrap_or_else(|| panic!("autopilot removes the dead server:\n{}", agents[leader].log()));
    assert!(
        killed_at.elapsed() >= STABILIZATION,
        "removed after {:?}, before the stabilization time",
        killed_at.elapsed()
    );
    assert!(
        remaining
            .iter()
            .all(|(_, address)| *address != agents[follower].rpc_addr()),
        "{remaining:?}"
    );
    let health = wait_for(LIMIT, || {
        let health = get_json(port, "/v1/operator/autopilot/health")?;
        (health["Healthy"] == true && health["Servers"].as_array()?.len() == 2).then_some(health)
    })
    .expect("two healthy servers");
    assert_eq!(health["FailureTolerance"], 0, "{health}");

    agents[follower].restart();
    wait_for(LIMIT, || has_servers(port, 3))
        .unwrap_or_else(|| panic!("the restarted server is added back:\n{}", agents[leader].log()));
    let health = wait_for(LIMIT, || {
        let health = get_json(port, "/v1/operator/autopilot/health")?;
        (health["Healthy"] == true && health["FailureTolerance"] == 1).then_some(health)
    });
    assert!(health.is_some(), "healthy again with three voters");
}

#[test]
fn with_cleanup_off_an_operator_removes_a_dead_server_by_hand() {
    let root = tempfile::tempdir().unwrap();
    let (specs, mut agents, leader) = formed(root.path());
    let dead = (leader + 1) % 3;
    let port = agents[(leader + 2) % 3].spec.http;

    let set = cli(
        port,
        &["operator", "autopilot", "set-config", "-cleanup-dead-servers=false"],
    );
    assert_eq!(cli_stdout(&set).trim(), "Configuration updated!");
    let shown = cli_stdout(&cli(port, &["operator", "autopilot", "get-config"]));
    assert!(shown.contains("CleanupDeadServers = false"), "{shown}");
    assert!(shown.contains("ServerStabilizationTime = 2s"), "{shown}");
    // A stale check-and-set changes nothing.
    let stale = http_status(
        "PUT",
        port,
        "/v1/operator/autopilot/configuration?cas=1",
        Some(r#"{"CleanupDeadServers": true}"#),
    );
    assert_eq!(stale, Some((200, "false".into())));
    let bad = http_status(
        "PUT",
        port,
        "/v1/operator/autopilot/configuration",
        Some(r#"{"ServerStabilizationTime": "soon"}"#),
    )
    .unwrap();
    assert_eq!(bad.0, 400, "{bad:?}");
    assert!(
        bad.1
            .starts_with("Error parsing autopilot config: ServerStabilizationTime"),
        "{bad:?}"
    );

    // remove-peer's refusals.
    let none = http_status("DELETE", port, "/v1/operator/raft/peer", None);
    assert_eq!(
        none,
        Some((
            400,
            "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove".into()
        ))
    );
    let both = http_status("DELETE", port, "/v1/operator/raft/peer?id=1&address=x", None);
    assert_eq!(both, Some((400, "Must specify only one of ?id or ?address".into())));
    let unknown = cli(port, &["operator", "raft", "remove-peer", "-peer-id=12345"]);
    assert!(!unknown.status.success());
    assert!(
        output(&unknown).starts_with(
            "Error removing peer: Unexpected response code: 404 (id \"12345\" was not found in the Raft configuration)"
        ),
        "{}",
        output(&unknown)
    );

    // Dead, and left in the configuration.
    let dead_addr = agents[dead].rpc_addr();
    let dead_id = raft_servers(port)
        .unwrap()
        .into_iter()
        .find(|(_, address)| *address == dead_addr)
        .map(|(id, _)| id)
        .unwrap();
    agents[dead].kill();
    let leader_port = agents[leader].spec.http;
    wait_for(LIMIT, || {
        (member_status(leader_port, &specs[dead].name)? == "failed").then_some(())
    })
    .expect("gossip sees the server fail");
    std::thread::sleep(STABILIZATION * 2);
    assert_eq!(
        raft_servers(port).map(|servers| servers.len()),
        Some(3),
        "cleanup is off"
    );

    let removed = cli(
        port,
        &["operator", "raft", "remove-peer", &format!("-peer-id={dead_id}")],
    );
    assert_eq!(cli_stdout(&removed).trim(), format!("Removed peer with id {dead_id:?}"));
    // Answered once the leader committed it; this server learns it as it replicates.
    wait_for(LIMIT, || has_servers(port, 2)).expect("the peer is gone everywhere");

    // Back: added again. Dead again: forced out.
    agents[dead].restart();
    wait_for(LIMIT, || has_servers(port, 3)).expect("the restarted server is added back");
    agents[dead].kill();
    wait_for(LIMIT, || {
        (member_status(leader_port, &specs[dead].name)? == "failed").then_some(())
    })
    .expect("gossip sees the server fail again");
    let alive = cli(port, &["server", "force-leave", &specs[leader].name]);
    assert!(
        output(&alive).contains("is alive: force-leave removes only failed servers"),
        "{}",
        output(&alive)
    );
    let forced = cli(port, &["server", "force-leave", &specs[dead].name]);
    cli_stdout(&forced);
    wait_for(LIMIT, || has_servers(port, 2)).expect("the forced-out server is gone everywhere");
    assert_eq!(member_status(leader_port, &specs[dead].name).as_deref(), Some("left"));

    // Join: nothing to join that is not already a member, but the call answers.
    let joined = cli(port, &["server", "join", &format!("127.0.0.1:{}", specs[leader].serf)]);
    assert_eq!(cli_stdout(&joined).trim(), "Joined 1 servers successfully");
    let refused: Value = serde_json::from_str(
        &http_status("PUT", port, "/v1/agent/join?address=nowhere", None)
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(refused["num_joined"], 0);
    assert_eq!(refused["error"], "\"nowhere\" is not an address (ip or ip:port)");
}
