//! The `volumes` task hook (§2.5): bind mounts for host volumes from the client's config and
//! for CSI volumes from the alloc hook resources, with the friendly errors of §2.5/§2.6 when
//! the driver cannot mount anything.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use crate::client::hooks::{AllocHookResources, HookError};
use crate::client::{DriverCapabilities, MountConfig, MountConfigSupport};
use crate::structs::{Task, TaskGroup, VolumeType};
use crate::taskenv::TaskEnv;

pub use crate::structs::HostVolumeConfig;

/// The mounts of `task`; never "done", so it re-runs after a restore and every restart.
pub fn volume_mounts(
    task: &Task,
    group: &TaskGroup,
    alloc_index: u32,
    host_volumes: &BTreeMap<String, HostVolumeConfig>,
    resources: &AllocHookResources,
    capabilities: DriverCapabilities,
    env: &TaskEnv,
) -> Result<Vec<MountConfig>, HookError> {
    let mut host_mounts = Vec::new();
    let mut csi_mounts = Vec::new();
    let mut missing = Vec::new();
    for mount in &task.volume_mounts {
        let alias = env.interpolate(&mount.volume);
        let destination = env.interpolate(&mount.destination);
        let Some(request) = group.volumes.get(&alias) else {
            return Err(HookError::fatal(format!(
                "No volume with name {alias} found in task group"
            )));
        };
        match request.volume_type {
            VolumeType::Host => {
                let source = request.source_for(alloc_index);
                match host_volumes.get(&source) {
                    Some(host) => host_mounts.push(MountConfig {
                        task_path: destination,
                        host_path: host.path.clone(),
                        readonly: host.read_only || request.read_only || mount.read_only,
                        propagation: mount.propagation_mode,
                    }),
                    None => missing.push(source),
                }
            }
            VolumeType::Csi => {
                let Some(info) = resources.csi_mounts.get(&alias) else {
                    return Err(HookError::recoverable(format!(
                        "No CSI Mount Point found for volume: {alias}"
                    )));
                };
                csi_mounts.push(MountConfig {
                    task_path: destination,
                    host_path: info.source.clone(),
                    readonly: request.read_only || mount.read_only,
                    propagation: mount.propagation_mode,
                });
            }
        }
    }
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        return Err(HookError::fatal(format!(
            "host volume validation error: missing {}",
            missing.join(", missing ")
        )));
    }
    let none = capabilities.mount_configs == MountConfigSupport::None;
    if none && !host_mounts.is_empty() {
        return Err(HookError::fatal(format!(
            "task driver \"{}\" for \"{}\" does not support host volumes",
            task.driver, task.name
        )));
    }
    if none && !csi_mounts.is_empty() {
        return Err(HookError::fatal(format!(
            "task driver \"{}\" for \"{}\" does not support CSI",
            task.driver, task.name
        )));
    }
    host_mounts.extend(csi_mounts);
    Ok(host_mounts)
}

/// Adds `mount` unless an identical one is already present (hooks re-run after restores).
pub fn add_mount(mounts: &mut Vec<MountConfig>, mount: MountConfig) {
    if !mounts.contains(&mount) {
        mounts.push(mount);
    }
}
