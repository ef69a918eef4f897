//! A service's `connect {}` block as a job carries it (Nomad's `ConsulConnect` and its parts).
//! What Connect does with it — the sidecar task injected at registration, its validation —
//! is `crate::connect`.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigValue, Task, TaskResources};

/// A service's `connect {}` block (Nomad's `ConsulConnect`): exactly one of a sidecar proxy or
/// native.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulConnect {
    #[serde(default)]
    pub native: bool,
    #[serde(default)]
    pub sidecar_service: Option<ConsulSidecarService>,
    #[serde(default)]
    pub sidecar_task: Option<SidecarTask>,
}

impl ConsulConnect {
    pub fn has_sidecar(&self) -> bool {
        self.sidecar_service.is_some()
    }

    /// Nomad's `ConsulConnect.Validate`.
    pub fn validate(&self) -> Result<(), String> {
        if usize::from(self.has_sidecar()) + usize::from(self.native) != 1 {
            return Err(
                "Consul Connect must be exclusively native, make use of a sidecar, or represent a Gateway".into(),
            );
        }
        Ok(())
    }
}

/// `sidecar_service {}`: how the proxy service is registered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulSidecarService {
    /// Tags of the sidecar service; empty: the parent service's.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The proxy's own port label; empty: the injected `connect-proxy-<service>` port.
    #[serde(default)]
    pub port: String,
    #[serde(default)]
    pub proxy: Option<ConsulProxy>,
}

/// `proxy {}` inside `sidecar_service`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulProxy {
    #[serde(default)]
    pub local_service_address: String,
    #[serde(default)]
    pub local_service_port: u16,
    #[serde(default)]
    pub upstreams: Vec<ConsulUpstream>,
    /// Free-form proxy configuration handed to Consul.
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
}

/// One `upstreams {}` block: a service the proxy makes reachable on a local port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsulUpstream {
    pub destination_name: String,
    pub local_bind_port: u16,
    #[serde(default)]
    pub datacenter: String,
}

/// `sidecar_task {}`: what of the injected task the operator overrides (Nomad's
/// `SidecarTask`, merged into the task by `MergeIntoTask`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarTask {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub resources: Option<TaskResources>,
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    #[serde(default)]
    pub kill_timeout: Option<Duration>,
}

impl SidecarTask {
    /// Nomad's `MergeIntoTask`: what is set wins; config keys are merged over the defaults.
    pub(crate) fn merge_into(&self, task: &mut Task) {
        if !self.name.is_empty() {
            task.name = self.name.clone();
        }
        if !self.driver.is_empty() {
            task.driver = self.driver.clone();
        }
        if !self.config.is_empty() {
            // A different driver means a different config: the defaults are Docker's.
            if !self.driver.is_empty() && self.driver != "docker" {
                task.config.clear();
            }
            task.config.extend(self.config.clone());
        }
        task.env.extend(self.env.clone());
        task.meta.extend(self.meta.clone());
        if let Some(resources) = &self.resources {
            task.resources = resources.clone();
        }
        if let Some(timeout) = self.kill_timeout {
            task.kill_timeout = timeout;
        }
    }
}
