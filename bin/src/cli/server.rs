//! `agent server members` and `agent operator raft list-peers`.

use super::{Api, Failure, table, text};

pub(super) fn server_members(api: &Api) -> Result<(), Failure> {
    let members = api.get("/v1/agent/members")?;
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
    for member in members["Members"].as_array().into_iter().flatten() {
        let tags = &member["Tags"];
        let is_leader = !leader.is_empty() && leader == format!("{}:{}", text(&member["Addr"]), text(&tags["port"]));
        rows.push(vec![
            text(&member["Name"]),
            text(&member["Addr"]),
            text(&member["Port"]),
            text(&member["Status"]),
            is_leader.to_string(),
            "3".into(),
            text(&tags["build"]),
            text(&tags["dc"]),
            text(&tags["region"]),
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

pub(super) fn list_peers(api: &Api) -> Result<(), Failure> {
    let configuration = api.get("/v1/operator/raft/configuration")?;
    let mut rows = vec![
        ["Node", "ID", "Address", "State", "Voter", "RaftProtocol"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for server in configuration["Servers"].as_array().into_iter().flatten() {
        let state = if server["Leader"].as_bool().unwrap_or(false) {
            "leader"
        } else {
            "follower"
        };
        rows.push(vec![
            text(&server["Node"]),
            text(&server["ID"]),
            text(&server["Address"]),
            state.into(),
            text(&server["Voter"]),
            text(&server["RaftProtocol"]),
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}
