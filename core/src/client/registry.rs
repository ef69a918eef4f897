//! The dynamic plugin registry (§1.4, today's shape): registrations keyed by (type, name) with
//! a list per key, newest first; deregistration removes only the matching allocation's entry,
//! so an old plugin alloc stopping cannot remove its replacement. Every change is appended to
//! an ordered update stream and the whole registry is persisted.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PluginKind {
    CsiController,
    CsiNode,
}

impl PluginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::CsiController => "csi-controller",
            PluginKind::CsiNode => "csi-node",
        }
    }
}

/// One registration (`dynamicplugins.PluginInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub kind: PluginKind,
    /// The plugin id of the `csi_plugin` stanza.
    pub name: String,
    /// The vendor version `GetPluginInfo` reported.
    pub version: String,
    pub provider: String,
    /// Host path of the plugin's socket.
    pub socket_path: String,
    pub alloc_id: String,
    /// Host path of the plugin root (staging and per-alloc dirs live below).
    pub mount_point: String,
    /// The same directory as the plugin sees it (`stage_publish_base_dir`).
    pub container_mount_point: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryEvent {
    Registered(PluginInfo),
    Deregistered(PluginInfo),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    plugins: BTreeMap<(PluginKind, String), Vec<PluginInfo>>,
    #[serde(skip)]
    updates: VecDeque<RegistryEvent>,
}

impl Registry {
    /// Registers `info` in front of its key; a second registration by the same allocation is
    /// ignored. Returns whether anything changed.
    pub fn register(&mut self, info: PluginInfo) -> Result<bool, String> {
        if info.name.is_empty() || info.socket_path.is_empty() {
            return Err("plugin registration needs a name and a socket path".into());
        }
        let list = self.plugins.entry((info.kind, info.name.clone())).or_default();
        if list.iter().any(|existing| existing.alloc_id == info.alloc_id) {
            return Ok(false);
        }
        list.insert(0, info.clone());
        self.updates.push_back(RegistryEvent::Registered(info));
        Ok(true)
    }

    /// Removes the registration of `alloc_id` only. Returns whether anything changed.
    pub fn deregister(&mut self, kind: PluginKind, name: &str, alloc_id: &str) -> bool {
        let key = (kind, name.to_string());
        let Some(list) = self.plugins.get_mut(&key) else {
            return false;
        };
        let Some(position) = list.iter().position(|info| info.alloc_id == alloc_id) else {
            return false;
        };
        let removed = list.remove(position);
        if list.is_empty() {
            self.plugins.remove(&key);
        }
        self.updates.push_back(RegistryEvent::Deregistered(removed));
        true
    }

    /// Removes every registration of `name` whichever allocation made it: Nomad's behaviour
    /// before #12744, kept only for the simulation's regression switch
    /// (`ClientFaults::deregister_plugin_by_name`).
    pub fn deregister_name(&mut self, kind: PluginKind, name: &str) -> bool {
        let Some(list) = self.plugins.remove(&(kind, name.to_string())) else {
            return false;
        };
        self.updates.extend(list.into_iter().map(RegistryEvent::Deregistered));
        true
    }

    /// The newest registration of every plugin of `kind`.
    pub fn list(&self, kind: PluginKind) -> Vec<&PluginInfo> {
        self.plugins
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .filter_map(|(_, list)| list.first())
            .collect()
    }

    /// The newest registration of one plugin.
    pub fn get(&self, kind: PluginKind, name: &str) -> Option<&PluginInfo> {
        self.plugins
            .get(&(kind, name.to_string()))
            .and_then(|list| list.first())
    }

    pub fn for_alloc(&self, kind: PluginKind, name: &str, alloc_id: &str) -> Option<&PluginInfo> {
        self.plugins
            .get(&(kind, name.to_string()))
            .and_then(|list| list.iter().find(|info| info.alloc_id == alloc_id))
    }

    /// The next change, in the order they happened; none is dropped.
    pub fn poll_update(&mut self) -> Option<RegistryEvent> {
        self.updates.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, alloc: &str) -> PluginInfo {
        PluginInfo {
            kind: PluginKind::CsiNode,
            name: name.into(),
            version: "1.0".into(),
            provider: "p".into(),
            socket_path: format!("/s/{alloc}/csi.sock"),
            alloc_id: alloc.into(),
            mount_point: "/s/csi/node/x".into(),
            container_mount_point: "/local/csi".into(),
        }
    }

    #[test]
    fn newest_first_and_deregister_only_the_matching_alloc() {
        let mut registry = Registry::default();
        assert!(registry.register(info("hp", "old")).unwrap());
        assert!(registry.register(info("hp", "new")).unwrap());
        assert!(
            !registry.register(info("hp", "new")).unwrap(),
            "duplicate alloc ignored"
        );
        assert_eq!(registry.get(PluginKind::CsiNode, "hp").unwrap().alloc_id, "new");
        // The old alloc stopping must not remove its replacement.
        assert!(registry.deregister(PluginKind::CsiNode, "hp", "old"));
        assert_eq!(registry.get(PluginKind::CsiNode, "hp").unwrap().alloc_id, "new");
        assert!(!registry.deregister(PluginKind::CsiNode, "hp", "old"));
        assert!(!registry.deregister(PluginKind::CsiController, "hp", "new"));
        assert!(registry.deregister(PluginKind::CsiNode, "hp", "new"));
        assert!(registry.list(PluginKind::CsiNode).is_empty());
        let order: Vec<String> = core::iter::from_fn(|| registry.poll_update())
            .map(|event| match event {
                RegistryEvent::Registered(info) => format!("+{}", info.alloc_id),
                RegistryEvent::Deregistered(info) => format!("-{}", info.alloc_id),
            })
            .collect();
        assert_eq!(order, ["+old", "+new", "-old", "-new"]);
    }

    #[test]
    fn survives_a_persist_round_trip() {
        let mut registry = Registry::default();
        registry.register(info("hp", "a1")).unwrap();
        let bytes = postcard::to_allocvec(&registry).unwrap();
        let restored: Registry = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(
            restored.get(PluginKind::CsiNode, "hp"),
            registry.get(PluginKind::CsiNode, "hp")
        );
        assert!(registry.register(PluginInfo::clone(&info("", "x"))).is_err());
    }
}
