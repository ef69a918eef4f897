//! The cluster's servers: gossip members (`/v1/agent/members`) and Raft peers
//! (`/v1/operator/raft/configuration`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nomad's `ServerMembers`: the servers this one gossips with, itself among them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServerMembers {
    pub server_name: String,
    pub server_region: String,
    #[serde(rename = "ServerDC")]
    pub server_dc: String,
    pub members: Vec<AgentMember>,
}

/// Nomad's `AgentMember`: one server as gossip sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AgentMember {
    /// `<name>.<region>`.
    pub name: String,
    /// Its gossip IP.
    pub addr: String,
    /// Its gossip port.
    pub port: u16,
    /// `role`, `region`, `dc`, `build`, `port` (RPC), `id`, `bootstrap`/`expect`, …
    pub tags: BTreeMap<String, String>,
    /// `alive`, `leaving`, `left` or `failed`.
    pub status: String,
    pub protocol_min: u8,
    pub protocol_max: u8,
    pub protocol_cur: u8,
    pub delegate_min: u8,
    pub delegate_max: u8,
    pub delegate_cur: u8,
}

/// Nomad's `RaftConfiguration`: the Raft peers as of a commit index.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RaftConfiguration {
    pub index: u64,
    pub servers: Vec<RaftServer>,
}

/// Nomad's `RaftServer`: one peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct RaftServer {
    #[serde(rename = "ID")]
    pub id: String,
    /// `<name>.<region>`.
    pub node: String,
    /// Its RPC address.
    pub address: String,
    pub leader: bool,
    pub voter: bool,
    pub raft_protocol: String,
}
