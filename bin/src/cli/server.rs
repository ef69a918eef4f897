//! `agent server members` and `agent operator raft list-peers`.

use drover_http::api;

use super::{Api, Failure, table, text};

pub(super) fn server_members(api: &Api) -> Result<(), Failure> {
    let members: api::ServerMembers = api.get_as("/v1/agent/members")?;
    let leader = api.get("/v1/status/leader").map(|v| text(&v)).unwrap_or_default();
    let mut rows = vec![
        [
            "Name",
            "Address",
            "Port",
            "Status",
            "Leader",
            "Raft Version",
            "Build",
            "Datacenter",
            "Region",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    for member in members.members {
        let tag = |key: &str| member.tags.get(key).cloned().unwrap_or_default();
        let is_leader = !leader.is_empty() && leader == format!("{}:{}", member.addr, tag("port"));
        rows.push(vec![
            member.name.clone(),
            member.addr.clone(),
            member.port.to_string(),
            member.status.clone(),
            is_leader.to_string(),
            "3".into(),
            tag("build"),
            tag("dc"),
            tag("region"),
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

pub(super) fn list_peers(api: &Api) -> Result<(), Failure> {
    let configuration: api::RaftConfiguration = api.get_as("/v1/operator/raft/configuration")?;
    let mut rows = vec![
        ["Node", "ID", "Address", "State", "Voter", "RaftProtocol"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for server in configuration.servers {
        let state = if server.leader { "leader" } else { "follower" };
        rows.push(vec![
            server.node,
            server.id,
            server.address,
            state.into(),
            server.voter.to_string(),
            server.raft_protocol,
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}
