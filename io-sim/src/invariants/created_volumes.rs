//! Once the cluster is quiet, the plugin's storage holds exactly the volumes the cluster has
//! registered: every volume `CreateVolume` made belongs to one registered volume. A retried
//! create after a crash between `ControllerCreateVolume` and the Raft commit must find the
//! volume the first attempt made (the CSI name is the idempotency key), never make a second
//! one that nothing will ever delete; and a deleted volume is gone from both.

use std::collections::BTreeMap;

use drover_core::fsm::ServerState;

pub const NAME: &str = "every volume the plugin made belongs to exactly one registered volume";

/// `storage`: the plugin's volumes, name → external id. Registered volumes of `plugin_id`
/// count as made by the plugin when their external id is one the simulated storage hands out
/// (`sim-…`).
pub fn one_volume_per_create(
    storage: &BTreeMap<String, String>,
    state: &ServerState,
    plugin_id: &str,
) -> Result<(), String> {
    let registered: BTreeMap<String, String> = state
        .volume_keys()
        .filter_map(|(namespace, id)| state.volume(namespace, id))
        .filter(|volume| volume.plugin_id == plugin_id && volume.external_id.starts_with("sim-"))
        .map(|volume| (volume.external_id.clone(), volume.id.clone()))
        .collect();
    let orphans: Vec<String> = storage
        .iter()
        .filter(|(_, external_id)| !registered.contains_key(*external_id))
        .map(|(name, external_id)| format!("{external_id} (asked for as {name:?})"))
        .collect();
    let missing: Vec<String> = registered
        .iter()
        .filter(|(external_id, _)| !storage.values().any(|id| id == *external_id))
        .map(|(external_id, id)| format!("{id} ({external_id})"))
        .collect();
    match (orphans.is_empty(), missing.is_empty()) {
        (true, true) => Ok(()),
        _ => Err(format!(
            "plugin volumes no registered volume names: [{}]; registered volumes the plugin no longer has: [{}]",
            orphans.join(", "),
            missing.join(", ")
        )),
    }
}
