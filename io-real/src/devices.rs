//! The device manager and device plugins (§6): each plugin fingerprints its device instances;
//! the devices task hook asks the manager to reserve instances for a task, which answers with
//! the env, mounts and device nodes the task needs; device stats are collected per reserved
//! instance and surfaced in the allocation's resource usage. `FakeDevicePlugin` is the
//! project's own plugin (fake GPUs backed by `/dev/null`), enough to exercise the hook.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use drover_core::client::{DeviceConfig, ErrorKind, IoError, Reservation};
use drover_core::structs::RequestedDevice;

/// One device instance a plugin found on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInstance {
    pub id: String,
    pub healthy: bool,
}

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

/// Whether a task's device request (`vendor/type/name`, `type/name` or `type`) names `plugin`.
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

/// (alloc, task) → (plugin index, instance ids).
type Reserved = BTreeMap<(String, String), Vec<(usize, Vec<String>)>>;

#[derive(Clone, Default)]
pub struct DeviceManager {
    plugins: Vec<Arc<dyn DevicePlugin>>,
    reserved: Arc<Mutex<Reserved>>,
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

    /// Reserves healthy, unreserved instances for a task; all or nothing. Reserving again for
    /// the same task (a restart) returns its existing instances.
    pub fn reserve(&self, alloc_id: &str, task: &str, requests: &[RequestedDevice]) -> Result<Reservation, IoError> {
        let key = (alloc_id.to_string(), task.to_string());
        let mut reserved = self.reserved.lock().unwrap();
        let picks = match reserved.get(&key) {
            Some(existing) => existing.clone(),
            None => {
                let mut picks: Vec<(usize, Vec<String>)> = Vec::new();
                for request in requests {
                    let Some(index) = self
                        .plugins
                        .iter()
                        .position(|plugin| matches(&request.name, plugin.name()))
                    else {
                        return Err(IoError::new(
                            ErrorKind::NotFound,
                            format!("no device plugin provides {:?}", request.name),
                        ));
                    };
                    let taken: Vec<&String> = reserved
                        .values()
                        .flatten()
                        .chain(picks.iter())
                        .filter(|(plugin, _)| *plugin == index)
                        .flat_map(|(_, ids)| ids)
                        .collect();
                    let free: Vec<String> = self.plugins[index]
                        .fingerprint()
                        .into_iter()
                        .filter(|instance| instance.healthy && !taken.contains(&&instance.id))
                        .map(|instance| instance.id)
                        .take(request.count.max(1) as usize)
                        .collect();
                    if free.len() < request.count.max(1) as usize {
                        return Err(IoError::new(
                            ErrorKind::ResourceExhausted,
                            format!(
                                "not enough healthy {} devices: {} requested, {} free",
                                request.name,
                                request.count.max(1),
                                free.len()
                            ),
                        ));
                    }
                    picks.push((index, free));
                }
                reserved.insert(key, picks.clone());
                picks
            }
        };
        let mut reservation = Reservation::default();
        for (index, ids) in &picks {
            let part = self.plugins[*index].reserve(ids)?;
            reservation.env.extend(part.env);
            reservation.mounts.extend(part.mounts);
            reservation.devices.extend(part.devices);
        }
        Ok(reservation)
    }

    /// Frees a task's instances (the task is gone for good).
    pub fn release(&self, alloc_id: &str, task: &str) {
        self.reserved
            .lock()
            .unwrap()
            .remove(&(alloc_id.to_string(), task.to_string()));
    }

    /// Stats of the instances reserved for one task (its resource usage's `DeviceStats`).
    pub fn task_stats(&self, alloc_id: &str, task: &str) -> Vec<DeviceStats> {
        let reserved = self.reserved.lock().unwrap();
        reserved
            .get(&(alloc_id.to_string(), task.to_string()))
            .map(|picks| {
                picks
                    .iter()
                    .flat_map(|(index, ids)| self.plugins[*index].stats(ids))
                    .collect()
            })
            .unwrap_or_default()
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

    fn gpu(count: u32) -> Vec<RequestedDevice> {
        vec![RequestedDevice {
            name: "gpu".into(),
            count,
        }]
    }

    #[test]
    fn reserves_free_healthy_instances_and_releases_them() {
        let manager = DeviceManager::default().with(Arc::new(FakeDevicePlugin::new(3).with_unhealthy(1)));
        assert_eq!(manager.attributes()["device.drover/gpu/fake.healthy"], "2");
        let first = manager.reserve("a1", "t", &gpu(1)).unwrap();
        assert_eq!(first.env["DROVER_FAKE_GPUS"], "fake-gpu-0");
        assert_eq!(first.devices[0].task_path, "/dev/fake-gpu0");
        // A restart of the same task gets the same instance back.
        assert_eq!(manager.reserve("a1", "t", &gpu(1)).unwrap(), first);
        let second = manager.reserve("a2", "t", &gpu(1)).unwrap();
        assert_eq!(second.env["DROVER_FAKE_GPUS"], "fake-gpu-2", "gpu-1 is unhealthy");
        let error = manager.reserve("a3", "t", &gpu(1)).unwrap_err();
        assert_eq!(error.kind, ErrorKind::ResourceExhausted);
        assert_eq!(error.message, "not enough healthy gpu devices: 1 requested, 0 free");
        assert_eq!(manager.task_stats("a2", "t")[0].utilization_percent, 30.0);
        manager.release("a1", "t");
        assert!(manager.task_stats("a1", "t").is_empty());
        assert_eq!(
            manager.reserve("a3", "t", &gpu(1)).unwrap().env["DROVER_FAKE_GPUS"],
            "fake-gpu-0"
        );
        let unknown = manager
            .reserve(
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
    fn request_names_match_like_nomads() {
        for name in ["drover/gpu/fake", "gpu/fake", "gpu", "drover/gpu"] {
            assert!(matches(name, "drover/gpu/fake"), "{name}");
        }
        assert!(!matches("fpga", "drover/gpu/fake"));
    }
}
