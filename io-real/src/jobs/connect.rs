//! Nomad's `api.ConsulConnect` (a group service's `connect` block) and a task's `Lifecycle`
//! in the job JSON. Durations in nanoseconds, as everywhere in Nomad's API.

use std::collections::BTreeMap;

use drover_core::connect::{ConsulConnect, ConsulProxy, ConsulSidecarService, ConsulUpstream, SidecarTask};
use drover_core::structs::{TaskLifecycle, TaskResources};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiResources, DEFAULT_CPU, DEFAULT_MEMORY_MB, config_entry, config_json, duration, nanos};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiConsulConnect {
    pub native: bool,
    pub sidecar_service: Option<ApiSidecarService>,
    pub sidecar_task: Option<ApiSidecarTask>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiSidecarService {
    pub tags: Vec<String>,
    pub port: String,
    pub proxy: Option<ApiConsulProxy>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiConsulProxy {
    pub local_service_address: String,
    pub local_service_port: u16,
    pub upstreams: Vec<ApiConsulUpstream>,
    pub config: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiConsulUpstream {
    pub destination_name: String,
    pub local_bind_port: u16,
    pub datacenter: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiSidecarTask {
    pub name: String,
    pub driver: String,
    pub user: String,
    pub config: BTreeMap<String, Value>,
    pub env: BTreeMap<String, String>,
    pub resources: Option<ApiResources>,
    pub meta: BTreeMap<String, String>,
    pub kill_timeout: Option<i64>,
}

/// `Lifecycle`: `Hook` (prestart, poststart, poststop) and `Sidecar`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiLifecycle {
    pub hook: String,
    pub sidecar: bool,
}

impl ApiLifecycle {
    pub fn to_lifecycle(&self) -> TaskLifecycle {
        TaskLifecycle {
            hook: self.hook.clone(),
            sidecar: self.sidecar,
        }
    }

    pub fn from_lifecycle(lifecycle: &TaskLifecycle) -> ApiLifecycle {
        ApiLifecycle {
            hook: lifecycle.hook.clone(),
            sidecar: lifecycle.sidecar,
        }
    }
}

fn config_in(
    at: &str,
    config: &BTreeMap<String, Value>,
    problems: &mut Vec<String>,
) -> BTreeMap<String, drover_core::structs::ConfigValue> {
    let mut out = BTreeMap::new();
    for (key, value) in config {
        match config_entry(at, key, value) {
            Ok(value) => {
                out.insert(key.clone(), value);
            }
            Err(problem) => problems.push(problem),
        }
    }
    out
}

fn config_out(config: &BTreeMap<String, drover_core::structs::ConfigValue>) -> BTreeMap<String, Value> {
    config
        .iter()
        .map(|(key, value)| (key.clone(), config_json(value)))
        .collect()
}

impl ApiConsulConnect {
    pub fn to_connect(&self, service: &str, problems: &mut Vec<String>) -> ConsulConnect {
        let at = format!("Service {service} connect");
        ConsulConnect {
            native: self.native,
            sidecar_service: self.sidecar_service.as_ref().map(|sidecar| ConsulSidecarService {
                tags: sidecar.tags.clone(),
                port: sidecar.port.clone(),
                proxy: sidecar.proxy.as_ref().map(|proxy| ConsulProxy {
                    local_service_address: proxy.local_service_address.clone(),
                    local_service_port: proxy.local_service_port,
                    upstreams: proxy
                        .upstreams
                        .iter()
                        .map(|upstream| ConsulUpstream {
                            destination_name: upstream.destination_name.clone(),
                            local_bind_port: upstream.local_bind_port,
                            datacenter: upstream.datacenter.clone(),
                        })
                        .collect(),
                    config: config_in(&format!("{at} proxy"), &proxy.config, problems),
                }),
            }),
            sidecar_task: self.sidecar_task.as_ref().map(|task| SidecarTask {
                name: task.name.clone(),
                driver: task.driver.clone(),
                user: task.user.clone(),
                config: config_in(&format!("{at} sidecar_task"), &task.config, problems),
                env: task.env.clone(),
                resources: task.resources.as_ref().map(|resources| TaskResources {
                    cpu: resources.cpu.unwrap_or(DEFAULT_CPU),
                    memory_mb: resources.memory_mb.unwrap_or(DEFAULT_MEMORY_MB),
                    memory_max_mb: resources.memory_max_mb.unwrap_or(0),
                    ..TaskResources::default()
                }),
                meta: task.meta.clone(),
                kill_timeout: task
                    .kill_timeout
                    .map(|nanos| duration("sidecar_task kill_timeout", nanos, problems)),
            }),
        }
    }

    pub fn from_connect(connect: &ConsulConnect) -> ApiConsulConnect {
        ApiConsulConnect {
            native: connect.native,
            sidecar_service: connect.sidecar_service.as_ref().map(|sidecar| ApiSidecarService {
                tags: sidecar.tags.clone(),
                port: sidecar.port.clone(),
                proxy: sidecar.proxy.as_ref().map(|proxy| ApiConsulProxy {
                    local_service_address: proxy.local_service_address.clone(),
                    local_service_port: proxy.local_service_port,
                    upstreams: proxy
                        .upstreams
                        .iter()
                        .map(|upstream| ApiConsulUpstream {
                            destination_name: upstream.destination_name.clone(),
                            local_bind_port: upstream.local_bind_port,
                            datacenter: upstream.datacenter.clone(),
                        })
                        .collect(),
                    config: config_out(&proxy.config),
                }),
            }),
            sidecar_task: connect.sidecar_task.as_ref().map(|task| ApiSidecarTask {
                name: task.name.clone(),
                driver: task.driver.clone(),
                user: task.user.clone(),
                config: config_out(&task.config),
                env: task.env.clone(),
                resources: task.resources.as_ref().map(|resources| ApiResources {
                    cpu: Some(resources.cpu),
                    memory_mb: Some(resources.memory_mb),
                    memory_max_mb: Some(resources.memory_max_mb),
                    ..ApiResources::default()
                }),
                meta: task.meta.clone(),
                kill_timeout: task.kill_timeout.map(nanos),
            }),
        }
    }
}
