//! The checkpointed release of one claim (reference §3.5, HEAD), as a pure next-step rule.
//!
//! ```text
//!  Taken/Unpublishing ──node detach (or node down/gone: skip)──▶ NodeDetached
//!  NodeDetached ──controller detach (or not needed / node still uses it)──▶ ReadyToFree
//!  ControllerDetached ─────────────────────────────────────────────────────▶ ReadyToFree
//!  ReadyToFree ──commit──▶ claim freed
//! ```
//! Every transition is committed through Raft (a `Checkpoint`) before the next external call,
//! so any leader can resume a half-done release from the stored claim state. The CSI call
//! order per (volume, node) is therefore node unpublish before controller unpublish.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::config::CsiFaults;
use crate::fsm::ServerState;
use crate::structs::{AccessMode, AttachmentMode, ClaimMode, ClaimState, CsiVolume, CsiVolumeClaim, NodeStatus};

/// `ClientCSI.NodeDetachVolume` to the client that owns the node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeDetachRequest {
    pub node_id: String,
    pub plugin_id: String,
    pub volume_id: String,
    pub volume_namespace: String,
    pub external_id: String,
    pub alloc_id: String,
    pub attachment_mode: AttachmentMode,
    pub access_mode: AccessMode,
    pub read_only: bool,
}

/// `ClientCSI.ControllerDetachVolume` to a client running a healthy controller.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerDetachRequest {
    pub plugin_id: String,
    /// The volume's remote id (external id when set).
    pub volume_id: String,
    pub client_csi_node_id: String,
    pub secrets: crate::structs::Secrets,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Commit this claim state before anything else happens.
    Checkpoint(CsiVolumeClaim),
    NodeDetach(NodeDetachRequest),
    ControllerDetach(ControllerDetachRequest),
    /// The claim is freed.
    Done,
}

fn with_state(claim: &CsiVolumeClaim, state: ClaimState) -> Step {
    crate::cover::transition("unpublish", claim.state.name(), state.name());
    let mut claim = claim.clone();
    claim.state = state;
    Step::Checkpoint(claim)
}

/// What to do next for `claim` (its state as last committed) on `volume` (denormalised).
pub fn next_step(state: &ServerState, volume: &CsiVolume, claim: &CsiVolumeClaim) -> Step {
    next_step_with(state, volume, claim, &CsiFaults::default())
}

/// [`next_step`], optionally re-creating the release defects `faults` names (regression
/// switches): Nomad #13416 (node detach attempted on a down node).
pub fn next_step_with(state: &ServerState, volume: &CsiVolume, claim: &CsiVolumeClaim, faults: &CsiFaults) -> Step {
    let detach_down_nodes = faults.node_detach_on_down_node;
    let recorded = volume.past_claims.contains_key(&claim.allocation_id)
        || volume.read_claims.contains_key(&claim.allocation_id)
        || volume.write_claims.contains_key(&claim.allocation_id);
    if !recorded && claim.state == ClaimState::ReadyToFree {
        crate::cover::transition("unpublish", claim.state.name(), "freed");
        return Step::Done;
    }
    match claim.state {
        ClaimState::Taken | ClaimState::Unpublishing => node_step(state, volume, claim, detach_down_nodes),
        ClaimState::NodeDetached => controller_step(state, volume, claim),
        ClaimState::ControllerDetached => with_state(claim, ClaimState::ReadyToFree),
        ClaimState::ReadyToFree => Step::Checkpoint(claim.clone()),
    }
}

fn node_step(state: &ServerState, volume: &CsiVolume, claim: &CsiVolumeClaim, detach_down_nodes: bool) -> Step {
    let node = state.node(&claim.node_id);
    // A node that is gone or down cannot unmount; it will not use the volume again (#13301).
    let unreachable = node.is_none_or(|node| node.status == NodeStatus::Down);
    if !claim.node_id.is_empty() && unreachable && !(detach_down_nodes && node.is_some()) {
        return with_state(claim, ClaimState::NodeDetached);
    }
    if claim.allocation_id.is_empty() || claim.access_mode == AccessMode::Unknown {
        return with_state(claim, ClaimState::NodeDetached);
    }
    Step::NodeDetach(NodeDetachRequest {
        node_id: claim.node_id.clone(),
        plugin_id: volume.plugin_id.clone(),
        volume_id: volume.id.clone(),
        volume_namespace: volume.namespace.clone(),
        external_id: volume.remote_id().to_string(),
        alloc_id: claim.allocation_id.clone(),
        attachment_mode: claim.attachment_mode,
        access_mode: claim.access_mode,
        read_only: claim.mode == ClaimMode::Read,
    })
}

fn controller_step(state: &ServerState, volume: &CsiVolume, claim: &CsiVolumeClaim) -> Step {
    let plugin = state.plugin(&volume.plugin_id);
    let attach_detach = plugin.is_some_and(|plugin| plugin.supports_attach_detach());
    if !volume.plugin_health.controller_required || !attach_detach {
        return with_state(claim, ClaimState::ReadyToFree);
    }
    // Another claim on the same node whose node-side release is not finished still has the
    // volume mounted there: the controller must not detach it from the node yet. Nomad (#14484)
    // looks only at non-terminal allocations, which lets a terminal-but-still-mounted one be
    // detached under its feet (found by the simulation). The last claim to finish its node
    // release does the controller detach.
    let still_used = volume
        .read_claims
        .values()
        .chain(volume.write_claims.values())
        .filter(|other| other.allocation_id != claim.allocation_id && other.node_id == claim.node_id)
        .any(|other| {
            volume
                .past_claims
                .get(&other.allocation_id)
                .is_none_or(|past| matches!(past.state, ClaimState::Taken | ClaimState::Unpublishing))
        });
    if still_used {
        return with_state(claim, ClaimState::ReadyToFree);
    }
    let external_node_id = super::routing::external_node_id(state, claim, &volume.plugin_id);
    if external_node_id.is_empty() {
        // The node was garbage collected: nothing left to detach from.
        return with_state(claim, ClaimState::ReadyToFree);
    }
    Step::ControllerDetach(ControllerDetachRequest {
        plugin_id: volume.plugin_id.clone(),
        volume_id: volume.remote_id().to_string(),
        client_csi_node_id: external_node_id,
        secrets: volume.secrets.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::Command;
    use crate::fsm::csi::tests::{Fixture, alloc, claim, node, volume};
    use crate::structs::{ClientStatus, NodeStatus};

    fn setup() -> Fixture {
        let mut fx = Fixture::new();
        fx.ok(Command::NodeRegister { node: node("n1", true) });
        fx.ok(Command::CsiVolumeRegister {
            volumes: vec![volume("v")],
        });
        fx.ok(Command::AllocUpsert {
            allocs: vec![alloc("a1", "n1"), alloc("a2", "n1")],
        });
        fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Taken),
        });
        fx
    }

    fn step(fx: &Fixture, state: ClaimState) -> Step {
        let vol = fx.state.volume("default", "v").unwrap();
        next_step(&fx.state, &vol, &claim("a1", "n1", ClaimMode::Write, state))
    }

    #[test]
    fn node_detach_comes_first_then_controller_detach() {
        let fx = setup();
        let Step::NodeDetach(request) = step(&fx, ClaimState::Unpublishing) else {
            panic!()
        };
        assert_eq!(
            (request.node_id.as_str(), request.alloc_id.as_str(), request.read_only),
            ("n1", "a1", false)
        );
        let Step::ControllerDetach(request) = step(&fx, ClaimState::NodeDetached) else {
            panic!()
        };
        assert_eq!(request.client_csi_node_id, "ext-plug-n1");
        assert_eq!(request.secrets["token"], "s3cr3t");
        assert_eq!(
            step(&fx, ClaimState::ControllerDetached),
            Step::Checkpoint(claim("a1", "n1", ClaimMode::Write, ClaimState::ReadyToFree))
        );
    }

    #[test]
    fn a_down_or_missing_node_skips_node_detach() {
        let mut fx = setup();
        fx.ok(Command::NodeUpdateStatus {
            node_id: "n1".into(),
            status: NodeStatus::Down,
            event: None,
        });
        assert_eq!(
            step(&fx, ClaimState::Unpublishing),
            Step::Checkpoint(claim("a1", "n1", ClaimMode::Write, ClaimState::NodeDetached))
        );
        let mut fx = setup();
        fx.ok(Command::NodeDeregister { node_id: "n1".into() });
        assert_eq!(
            step(&fx, ClaimState::Unpublishing),
            Step::Checkpoint(claim("a1", "n1", ClaimMode::Write, ClaimState::NodeDetached))
        );
        // ... and with the node gone there is no external node id to detach from either.
        assert_eq!(
            step(&fx, ClaimState::NodeDetached),
            Step::Checkpoint(claim("a1", "n1", ClaimMode::Write, ClaimState::ReadyToFree))
        );
    }

    #[test]
    fn controller_detach_waits_until_every_other_claim_on_the_node_is_node_detached() {
        let mut fx = Fixture::new();
        fx.ok(Command::NodeRegister { node: node("n1", true) });
        let mut multi = volume("v");
        multi.requested_capabilities[0].access_mode = AccessMode::MultiNodeMultiWriter;
        fx.ok(Command::CsiVolumeRegister { volumes: vec![multi] });
        fx.ok(Command::AllocUpsert {
            allocs: vec![alloc("a1", "n1"), alloc("a2", "n1")],
        });
        for id in ["a1", "a2"] {
            let mut c = claim(id, "n1", ClaimMode::Write, ClaimState::Taken);
            c.access_mode = AccessMode::MultiNodeMultiWriter;
            fx.ok(Command::CsiVolumeClaim {
                namespace: "default".into(),
                volume_id: "v".into(),
                claim: c,
            });
        }
        let vol = fx.state.volume("default", "v").unwrap();
        let mut mine = claim("a1", "n1", ClaimMode::Write, ClaimState::NodeDetached);
        mine.access_mode = AccessMode::MultiNodeMultiWriter;
        let Step::Checkpoint(next) = next_step(&fx.state, &vol, &mine) else {
            panic!()
        };
        assert_eq!(next.state, ClaimState::ReadyToFree);
        // a2 finishing is not enough: it is still mounted until its node release is done.
        fx.ok(Command::AllocClientUpdate {
            alloc_id: "a2".into(),
            client_status: ClientStatus::Complete,
        });
        let vol = fx.state.volume("default", "v").unwrap();
        let Step::Checkpoint(next) = next_step(&fx.state, &vol, &mine) else {
            panic!()
        };
        assert_eq!(next.state, ClaimState::ReadyToFree);
        let mut theirs = claim("a2", "n1", ClaimMode::Write, ClaimState::NodeDetached);
        theirs.access_mode = AccessMode::MultiNodeMultiWriter;
        fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: theirs,
        });
        let vol = fx.state.volume("default", "v").unwrap();
        assert!(matches!(next_step(&fx.state, &vol, &mine), Step::ControllerDetach(_)));
    }

    #[test]
    fn a_plugin_without_attach_detach_needs_no_controller() {
        let mut fx = Fixture::new();
        let mut n1 = node("n1", true);
        n1.csi_controller_plugins.clear();
        for info in n1.csi_node_plugins.values_mut() {
            info.requires_controller_plugin = false;
        }
        fx.ok(Command::NodeRegister { node: n1 });
        fx.ok(Command::CsiVolumeRegister {
            volumes: vec![volume("v")],
        });
        fx.ok(Command::AllocUpsert {
            allocs: vec![alloc("a1", "n1")],
        });
        fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Taken),
        });
        assert_eq!(
            step(&fx, ClaimState::NodeDetached),
            Step::Checkpoint(claim("a1", "n1", ClaimMode::Write, ClaimState::ReadyToFree))
        );
    }

    #[test]
    fn a_freed_claim_is_done() {
        let mut fx = setup();
        fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::ReadyToFree),
        });
        assert_eq!(step(&fx, ClaimState::ReadyToFree), Step::Done);
    }
}
