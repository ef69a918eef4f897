//! The device plugins (§6): each plugin fingerprints its device instances, and prepares what a
//! task needs to use the instances the client core chose for it (the env, mounts and device
//! nodes); device stats are collected per instance and surfaced in the allocation's resource
//! usage. Which instances a task gets is the core's decision
//! (`drover_core::client::devices`). `FakeDevicePlugin` is the project's own plugin (fake GPUs
//! backed by `/dev/null`), enough to exercise the hook.

use std::collections::BTreeMap;
use std::sync::Arc;

use drover_core::client::devices::{DeviceInstance, DevicePick};
use drover_core::client::{DeviceConfig, ErrorKind, IoError, Reservation};

/// Usage of one device instance.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceStats {
    /// `vendor/type/name` of the plugin that owns the instance.
    pub device: String,
    pub id: String,
    pub summary: String,
    pub utilization_percent: f64,
    pub memory_used_mib: u64,
}

pub trait DevicePlugin: Send + Sync + 'static {
    /// `vendor/type/name`, e.g. `drover/gpu/fake`.
    fn name(&self) -> &str;
    fn fingerprint(&self) -> Vec<DeviceInstance>;
    /// What a task needs to use these instances.
    fn reserve(&self, ids: &[String]) -> Result<Reservation, IoError>;
    fn stats(&self, ids: &[String]) -> Vec<DeviceStats>;
}

#[derive(Clone, Default)]
pub struct DeviceManager {
    plugins: Vec<Arc<dyn DevicePlugin>>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.plugins.iter().map(|plugin| plugin.name()))
            .finish()
    }
}

impl DeviceManager {
    pub fn with(mut self, plugin: Arc<dyn DevicePlugin>) -> Self {
        self.plugins.push(plugin);
        self
    }

    /// Node attributes from the fingerprints (`device.<name>.count`, `.healthy`).
    pub fn attributes(&self) -> BTreeMap<String, String> {
        let mut attributes = BTreeMap::new();
        for plugin in &self.plugins {
            let instances = plugin.fingerprint();
            let healthy = instances.iter().filter(|instance| instance.healthy).count();
            attributes.insert(format!("device.{}.count", plugin.name()), instances.len().to_string());
            attributes.insert(format!("device.{}.healthy", plugin.name()), healthy.to_string());
        }
        attributes
    }

    /// Every plugin's instances, by plugin name.
    pub fn inventory(&self) -> BTreeMap<String, Vec<DeviceInstance>> {
        self.plugins
            .iter()
            .map(|plugin| (plugin.name().to_string(), plugin.fingerprint()))
            .collect()
    }

    fn plugin(&self, name: &str) -> Result<&Arc<dyn DevicePlugin>, IoError> {
        self.plugins
            .iter()
            .find(|plugin| plugin.name() == name)
            .ok_or_else(|| IoError::new(ErrorKind::NotFound, format!("no device plugin {name:?}")))
    }

    /// What a task needs to use the instances chosen for it.
    pub fn prepare(&self, picks: &[DevicePick]) -> Result<Reservation, IoError> {
        let mut reservation = Reservation::default();
        for pick in picks {
            let part = self.plugin(&pick.plugin)?.reserve(&pick.ids)?;
            reservation.env.extend(part.env);
            reservation.mounts.extend(part.mounts);
            reservation.devices.extend(part.devices);
        }
        Ok(reservation)
    }

    /// Stats of a task's instances (its resource usage's `DeviceStats`).
    pub fn stats(&self, picks: &[DevicePick]) -> Vec<DeviceStats> {
        picks
            .iter()
            .filter_map(|pick| Some(self.plugin(&pick.plugin).ok()?.stats(&pick.ids)))
            .flatten()
            .collect()
    }
}

/// Fake GPUs: `count` instances `fake-gpu-<n>`, each backed by `/dev/null` at
/// `/dev/fake-gpu<n>` in the task, announced in `DROVER_FAKE_GPUS`.
#[derive(Clone, Debug)]
pub struct FakeDevicePlugin {
    count: usize,
    unhealthy: Vec<usize>,
}

impl FakeDevicePlugin {
    pub fn new(count: usize) -> Self {
        FakeDevicePlugin {
            count,
            unhealthy: Vec::new(),
        }
    }

    pub fn with_unhealthy(mut self, index: usize) -> Self {
        self.unhealthy.push(index);
        self
    }
}

impl DevicePlugin for FakeDevicePlugin {
    fn name(&self) -> &str {
        "drover/gpu/fake"
    }

    fn fingerprint(&self) -> Vec<DeviceInstance> {
        (0..self.count)
            .map(|index| DeviceInstance {
                id: format!("fake-gpu-{index}"),
                healthy: !self.unhealthy.contains(&index),
            })
            .collect()
    }

    fn reserve(&self, ids: &[String]) -> Result<Reservation, IoError> {
        let mut reservation = Reservation::default();
        reservation.env.insert("DROVER_FAKE_GPUS".into(), ids.join(","));
        for id in ids {
            let index = id.trim_start_matches("fake-gpu-");
            reservation.devices.push(DeviceConfig {
                task_path: format!("/dev/fake-gpu{index}"),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            });
        }
        Ok(reservation)
    }

    fn stats(&self, ids: &[String]) -> Vec<DeviceStats> {
        ids.iter()
            .map(|id| {
                let index: u64 = id.trim_start_matches("fake-gpu-").parse().unwrap_or(0);
                DeviceStats {
                    device: self.name().to_string(),
                    id: id.clone(),
                    summary: format!("{}% busy", 10 * (index + 1)),
                    utilization_percent: 10.0 * (index + 1) as f64,
                    memory_used_mib: 256 * (index + 1),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_prepare_and_stats_follow_the_plugins() {
        let manager = DeviceManager::default().with(Arc::new(FakeDevicePlugin::new(3).with_unhealthy(1)));
        assert_eq!(manager.attributes()["device.drover/gpu/fake.healthy"], "2");
        let inventory = manager.inventory();
        assert_eq!(inventory["drover/gpu/fake"].len(), 3);
        assert!(!inventory["drover/gpu/fake"][1].healthy);
        let picks = vec![DevicePick {
            plugin: "drover/gpu/fake".into(),
            ids: vec!["fake-gpu-2".into()],
        }];
        let reservation = manager.prepare(&picks).unwrap();
        assert_eq!(reservation.env["DROVER_FAKE_GPUS"], "fake-gpu-2");
        assert_eq!(reservation.devices[0].task_path, "/dev/fake-gpu2");
        assert_eq!(manager.stats(&picks)[0].utilization_percent, 30.0);
        let unknown = vec![DevicePick {
            plugin: "acme/fpga/x".into(),
            ids: vec!["x".into()],
        }];
        assert_eq!(
            manager.prepare(&unknown).unwrap_err().message,
            "no device plugin \"acme/fpga/x\""
        );
    }
}
