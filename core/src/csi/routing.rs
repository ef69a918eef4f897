//! Which clients can serve a controller RPC for a plugin (HEAD behaviour, §3.7): controller
//! instances that are healthy on a node that exists and is ready, in sorted node-id order, so
//! the same controller is preferred (many plugins assume a single active controller).

#[allow(unused_imports)]
use crate::prelude::*;

use crate::fsm::ServerState;
use crate::structs::{CsiVolumeClaim, NodeStatus};

/// A client able to run a controller RPC: node id and its agent RPC address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerTarget {
    pub node_id: String,
    pub rpc_addr: String,
}

pub fn controller_candidates(state: &ServerState, plugin_id: &str) -> Vec<ControllerTarget> {
    let Some(plugin) = state.plugin(plugin_id) else {
        return Vec::new();
    };
    plugin
        .controllers
        .iter()
        .filter(|(_, info)| info.healthy && info.controller_info.is_some())
        .filter_map(|(node_id, _)| {
            let node = state.node(node_id)?;
            (node.status == NodeStatus::Ready).then(|| ControllerTarget {
                node_id: node_id.clone(),
                rpc_addr: node.rpc_addr.clone(),
            })
        })
        .collect()
}

/// The storage provider's name for the claim's node (CSI's node id): the one recorded in the
/// claim, else the node plugin's fingerprint; empty when the node or its plugin is gone.
pub fn external_node_id(state: &ServerState, claim: &CsiVolumeClaim, plugin_id: &str) -> String {
    if !claim.external_node_id.is_empty() {
        return claim.external_node_id.clone();
    }
    state
        .node(&claim.node_id)
        .and_then(|node| node.csi_node_plugins.get(plugin_id))
        .and_then(|info| info.node_info.as_ref())
        .map(|info| info.id.clone())
        .unwrap_or_default()
}
