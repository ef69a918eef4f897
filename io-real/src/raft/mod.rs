//! openraft wiring: the type configuration, the redb-backed log and state machine
//! ([`store`]), and the network adapter that carries Raft RPCs over the agent transport
//! ([`network`]).

pub mod changes;
mod log_cache;
pub mod network;
pub mod store;

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::runtime::DroverRuntime;

/// How a server is reached: what openraft stores in the membership for each node id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNode {
    pub name: String,
    /// The server's RPC address, `ip:port`.
    pub rpc_addr: String,
}

impl fmt::Display for ServerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.rpc_addr)
    }
}

openraft::declare_raft_types!(
    /// Drover's Raft: entries are core FSM entries, node ids are the servers' persisted ids.
    pub TypeConfig:
        D = drover_core::fsm::Entry,
        R = drover_core::fsm::Response,
        NodeId = u64,
        Node = ServerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = DroverRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<u64, ServerNode>;
