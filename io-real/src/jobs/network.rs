//! Nomad's API form of `network` blocks (`Networks: [{Mode, ReservedPorts, DynamicPorts}]`),
//! of allocated ports, and of a node's addresses.

use drover_core::structs::{AllocatedPort, NetworkResource, NodeNetwork, Port};
use serde::{Deserialize, Serialize};

/// Nomad's `api.NetworkResource`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiNetworkResource {
    pub mode: String,
    pub device: String,
    #[serde(rename = "CIDR")]
    pub cidr: String,
    #[serde(rename = "IP")]
    pub ip: String,
    #[serde(rename = "MBits")]
    pub mbits: Option<u32>,
    pub reserved_ports: Vec<ApiPort>,
    pub dynamic_ports: Vec<ApiPort>,
}

/// Nomad's `api.Port`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiPort {
    pub label: String,
    pub value: i64,
    pub to: i64,
    pub host_network: String,
}

impl ApiNetworkResource {
    pub fn to_network(&self, owner: &str, problems: &mut Vec<String>) -> NetworkResource {
        let mut port = |api: &ApiPort, dynamic: bool| {
            let value = if dynamic {
                0
            } else {
                match u16::try_from(api.value) {
                    Ok(value) if value > 0 => value,
                    _ => {
                        problems.push(format!(
                            "{owner}: port {:?}: static port {} must be between 1 and 65535",
                            api.label, api.value
                        ));
                        0
                    }
                }
            };
            Port {
                label: api.label.clone(),
                value,
                // Out-of-range mappings are reported by validation, with Nomad's texts.
                to: api.to.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
                host_network: api.host_network.clone(),
            }
        };
        let reserved_ports = self.reserved_ports.iter().map(|api| port(api, false)).collect();
        let dynamic_ports = self.dynamic_ports.iter().map(|api| port(api, true)).collect();
        NetworkResource {
            // Nomad's canonical form: an unset mode is host.
            mode: if self.mode.is_empty() {
                "host".into()
            } else {
                self.mode.clone()
            },
            mbits: self.mbits.unwrap_or(0),
            reserved_ports,
            dynamic_ports,
        }
    }

    pub fn from_network(network: &NetworkResource) -> ApiNetworkResource {
        let ports = |ports: &[Port]| ports.iter().map(ApiPort::from_port).collect();
        ApiNetworkResource {
            mode: if network.mode.is_empty() {
                "host".into()
            } else {
                network.mode.clone()
            },
            mbits: Some(network.mbits),
            reserved_ports: ports(&network.reserved_ports),
            dynamic_ports: ports(&network.dynamic_ports),
            ..ApiNetworkResource::default()
        }
    }

    /// An allocation's network as the API shows it: the node's address and the ports as
    /// assigned (static ones under `ReservedPorts`, dynamic ones under `DynamicPorts`).
    pub fn allocated(asked: &[NetworkResource], ports: &[AllocatedPort]) -> Vec<ApiNetworkResource> {
        asked
            .iter()
            .map(|network| {
                let given = |port: &Port| {
                    let allocated = ports.iter().find(|allocated| allocated.label == port.label);
                    ApiPort {
                        label: port.label.clone(),
                        value: allocated.map_or(i64::from(port.value), |allocated| i64::from(allocated.value)),
                        to: allocated.map_or(i64::from(port.to), |allocated| i64::from(allocated.to)),
                        host_network: if port.host_network.is_empty() {
                            "default".into()
                        } else {
                            port.host_network.clone()
                        },
                    }
                };
                ApiNetworkResource {
                    mode: if network.mode.is_empty() {
                        "host".into()
                    } else {
                        network.mode.clone()
                    },
                    ip: ports.first().map(|port| port.host_ip.clone()).unwrap_or_default(),
                    mbits: Some(network.mbits),
                    reserved_ports: network.reserved_ports.iter().map(given).collect(),
                    dynamic_ports: network.dynamic_ports.iter().map(given).collect(),
                    ..ApiNetworkResource::default()
                }
            })
            .collect()
    }

    /// A node's address (`NodeResources.Networks`).
    pub fn node(network: &NodeNetwork) -> ApiNetworkResource {
        ApiNetworkResource {
            mode: "host".into(),
            device: network.device.clone(),
            cidr: network.cidr.clone(),
            ip: network.ip.clone(),
            ..ApiNetworkResource::default()
        }
    }
}

impl ApiPort {
    fn from_port(port: &Port) -> ApiPort {
        ApiPort {
            label: port.label.clone(),
            value: i64::from(port.value),
            to: i64::from(port.to),
            host_network: port.host_network.clone(),
        }
    }
}

/// Nomad's `AllocatedPortMapping` (`AllocatedResources.Shared.Ports`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiPortMapping {
    pub label: String,
    pub value: u16,
    pub to: i32,
    #[serde(rename = "HostIP")]
    pub host_ip: String,
}

impl ApiPortMapping {
    pub fn from_port(port: &AllocatedPort) -> ApiPortMapping {
        ApiPortMapping {
            label: port.label.clone(),
            value: port.value,
            to: port.to,
            host_ip: port.host_ip.clone(),
        }
    }
}
