//! Which device instances a task gets (the device manager's choice, §6): the device plugins
//! fingerprint their instances (the driver hands them in), and a task's `device` requests are
//! met with healthy instances no other task holds, all or nothing. A task keeps its instances
//! across restarts until it is dead for good or its allocation is gone. The choice is
//! persisted with the client's records, so an agent restart never hands a held GPU to a
//! second task.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::client::{ErrorKind, IoError};
use crate::structs::RequestedDevice;

/// One device instance a plugin found on this host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInstance {
    pub id: String,
    pub healthy: bool,
}

/// Instances of one plugin (`vendor/type/name`) given to a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePick {
    pub plugin: String,
    pub ids: Vec<String>,
}

/// Every task's instances: alloc → task → picks.
pub type DeviceReservations = BTreeMap<String, BTreeMap<String, Vec<DevicePick>>>;

/// Whether a task's device request (`vendor/type/name`, `type/name`, `vendor/type` or `type`)
/// names `plugin`.
pub fn matches(request: &str, plugin: &str) -> bool {
    let parts: Vec<&str> = plugin.split('/').collect();
    let [vendor, kind, name] = parts.as_slice() else {
        return request == plugin;
    };
    request == plugin
        || request == format!("{kind}/{name}")
        || request == *kind
        || request == format!("{vendor}/{kind}")
}

#[derive(Clone, Debug, Default)]
pub struct DeviceAllocator {
    /// Each plugin's instances as last fingerprinted.
    inventory: BTreeMap<String, Vec<DeviceInstance>>,
    reserved: DeviceReservations,
}

impl DeviceAllocator {
    pub fn set_inventory(&mut self, inventory: BTreeMap<String, Vec<DeviceInstance>>) {
        self.inventory = inventory;
    }

    /// What an earlier run of the agent had handed out.
    pub fn restore(&mut self, reserved: DeviceReservations) {
        self.reserved = reserved;
    }

    pub fn reservations(&self) -> &DeviceReservations {
        &self.reserved
    }

    /// Instances for a task's requests: the ones it already holds (a restart), else healthy
    /// instances nobody holds, all or nothing.
    pub fn choose(
        &mut self,
        alloc_id: &str,
        task: &str,
        requests: &[RequestedDevice],
    ) -> Result<Vec<DevicePick>, IoError> {
        if let Some(held) = self.reserved.get(alloc_id).and_then(|tasks| tasks.get(task)) {
            return Ok(held.clone());
        }
        let mut picks: Vec<DevicePick> = Vec::new();
        for request in requests {
            let Some((plugin, instances)) = self.inventory.iter().find(|(plugin, _)| matches(&request.name, plugin))
            else {
                return Err(IoError::new(
                    ErrorKind::NotFound,
                    format!("no device plugin provides {:?}", request.name),
                ));
            };
            let taken = |id: &String| {
                self.reserved
                    .values()
                    .flat_map(BTreeMap::values)
                    .flatten()
                    .chain(picks.iter())
                    .any(|pick| &pick.plugin == plugin && pick.ids.contains(id))
            };
            let wanted = request.count.max(1) as usize;
            let free: Vec<String> = instances
                .iter()
                .filter(|instance| instance.healthy && !taken(&instance.id))
                .map(|instance| instance.id.clone())
                .take(wanted)
                .collect();
            if free.len() < wanted {
                return Err(IoError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "not enough healthy {} devices: {wanted} requested, {} free",
                        request.name,
                        free.len()
                    ),
                ));
            }
            picks.push(DevicePick {
                plugin: plugin.clone(),
                ids: free,
            });
        }
        self.reserved
            .entry(alloc_id.into())
            .or_default()
            .insert(task.into(), picks.clone());
        Ok(picks)
    }

    /// Frees a task's instances; `true` when it held any.
    pub fn release_task(&mut self, alloc_id: &str, task: &str) -> bool {
        let Some(tasks) = self.reserved.get_mut(alloc_id) else {
            return false;
        };
        let released = tasks.remove(task).is_some();
        if tasks.is_empty() {
            self.reserved.remove(alloc_id);
        }
        released
    }

    /// Frees every instance of an allocation; `true` when it held any.
    pub fn release_alloc(&mut self, alloc_id: &str) -> bool {
        self.reserved.remove(alloc_id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(count: u32) -> Vec<RequestedDevice> {
        vec![RequestedDevice {
            name: "gpu".into(),
            count,
        }]
    }

    fn allocator() -> DeviceAllocator {
        let mut allocator = DeviceAllocator::default();
        let instances = (0..3)
            .map(|index| DeviceInstance {
                id: format!("fake-gpu-{index}"),
                healthy: index != 1,
            })
            .collect();
        allocator.set_inventory(BTreeMap::from([("drover/gpu/fake".to_string(), instances)]));
        allocator
    }

    fn ids(picks: &[DevicePick]) -> Vec<String> {
        picks.iter().flat_map(|pick| pick.ids.clone()).collect()
    }

    #[test]
    fn healthy_free_instances_all_or_nothing_and_kept_across_restarts() {
        let mut devices = allocator();
        assert_eq!(ids(&devices.choose("a1", "t", &gpu(1)).unwrap()), ["fake-gpu-0"]);
        assert_eq!(
            ids(&devices.choose("a1", "t", &gpu(1)).unwrap()),
            ["fake-gpu-0"],
            "a restart keeps its instance"
        );
        assert_eq!(
            ids(&devices.choose("a2", "t", &gpu(1)).unwrap()),
            ["fake-gpu-2"],
            "gpu-1 is unhealthy"
        );
        let error = devices.choose("a3", "t", &gpu(1)).unwrap_err();
        assert_eq!(error.kind, ErrorKind::ResourceExhausted);
        assert_eq!(error.message, "not enough healthy gpu devices: 1 requested, 0 free");
        assert!(devices.reservations().get("a3").is_none(), "a refusal holds nothing");
        assert!(devices.release_task("a1", "t"));
        assert_eq!(ids(&devices.choose("a3", "t", &gpu(1)).unwrap()), ["fake-gpu-0"]);
        let unknown = devices
            .choose(
                "a4",
                "t",
                &[RequestedDevice {
                    name: "fpga".into(),
                    count: 1,
                }],
            )
            .unwrap_err();
        assert_eq!(unknown.message, "no device plugin provides \"fpga\"");
    }

    #[test]
    fn restored_reservations_are_respected() {
        let mut before = allocator();
        before.choose("a1", "t", &gpu(1)).unwrap();
        let mut after = allocator();
        after.restore(before.reservations().clone());
        assert_eq!(ids(&after.choose("a2", "t", &gpu(1)).unwrap()), ["fake-gpu-2"]);
        assert!(after.release_alloc("a1"));
        assert_eq!(ids(&after.choose("a3", "t", &gpu(1)).unwrap()), ["fake-gpu-0"]);
    }

    #[test]
    fn request_names_match_like_nomads() {
        for name in ["drover/gpu/fake", "gpu/fake", "gpu", "drover/gpu"] {
            assert!(matches(name, "drover/gpu/fake"), "{name}");
        }
        assert!(!matches("fpga", "drover/gpu/fake"));
    }
}
