//! CSI call order per (volume, node): a volume is controller-unpublished from a node only
//! after every allocation there has been node-unpublished (or the node died with its mounts).

use std::collections::{BTreeMap, BTreeSet};

use crate::trace::{PluginEvent, SimEvent};

use super::Invariant;

#[derive(Debug, Default)]
pub struct CsiCallOrder {
    /// (volume, client node) → allocations with the volume node-published there.
    published: BTreeMap<(String, String), BTreeSet<String>>,
}

impl Invariant for CsiCallOrder {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(
            event,
            SimEvent::Plugin(PluginEvent::NodeUnpublished { .. } | PluginEvent::ControllerUnpublished { .. })
        )
    }

    fn name(&self) -> &'static str {
        "CSI call order: node unpublish before controller unpublish per (volume, node)"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Plugin(event) = event else { return Ok(()) };
        match event {
            PluginEvent::NodePublished { volume, alloc } => {
                self.published
                    .entry((volume.clone(), node.to_string()))
                    .or_default()
                    .insert(alloc.clone());
            }
            PluginEvent::NodeUnpublished { volume, alloc } => {
                if let Some(allocs) = self.published.get_mut(&(volume.clone(), node.to_string())) {
                    allocs.remove(alloc);
                }
            }
            PluginEvent::NodeLost => self.published.retain(|(_, on), _| on != node),
            PluginEvent::ControllerUnpublished {
                volume, external_node, ..
            } => {
                let still = self.published.get(&(volume.clone(), external_node.clone()));
                if let Some(allocs) = still.filter(|allocs| !allocs.is_empty()) {
                    return Err(format!(
                        "volume {volume} controller-unpublished from {external_node} while still node-published there for {allocs:?}"
                    ));
                }
            }
            PluginEvent::ControllerPublished { .. }
            | PluginEvent::ControllerCallStarted { .. }
            | PluginEvent::ControllerCallEnded { .. }
            | PluginEvent::VolumeCreated { .. }
            | PluginEvent::VolumeDeleted { .. }
            | PluginEvent::AgentKilled => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_unpublish_before_node_unpublish_is_caught() {
        let mut order = CsiCallOrder::default();
        let published = PluginEvent::NodePublished {
            volume: "v".into(),
            alloc: "a".into(),
        };
        let controller = PluginEvent::ControllerUnpublished {
            plugin: "p".into(),
            volume: "v".into(),
            external_node: "c1".into(),
        };
        order.observe("c1", &SimEvent::Plugin(published)).unwrap();
        assert!(order.observe("c2", &SimEvent::Plugin(controller.clone())).is_err());
        order
            .observe(
                "c1",
                &SimEvent::Plugin(PluginEvent::NodeUnpublished {
                    volume: "v".into(),
                    alloc: "a".into(),
                }),
            )
            .unwrap();
        assert!(order.observe("c2", &SimEvent::Plugin(controller)).is_ok());
    }
}
