//! Networks in host mode: the ports a group (or, 0.11-style, a task) asks for, the ports an
//! allocation was given, and what a node offers (its addresses, reserved ports and dynamic
//! range).

use super::*;

/// Nomad's default dynamic port range (`client { min_dynamic_port max_dynamic_port }`).
pub const DEFAULT_MIN_DYNAMIC_PORT: u16 = 20000;
pub const DEFAULT_MAX_DYNAMIC_PORT: u16 = 32000;

/// Network modes a jobspec may ask for. Nomad's `bridge` and `cni/*` need CNI, which Drover
/// does not have: they are refused at validation rather than silently run in the host's.
/// A group network of its own, shared by the group's tasks.
pub const NETWORK_MODE_BRIDGE: &str = "bridge";
pub const NETWORK_MODE_HOST: &str = "host";

/// A `port "<label>" {}` block: `value` is the `static` port (0 for a dynamic one), `to` the
/// port the task listens on when it differs (`-1`: the same as the allocated one).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Port {
    pub label: String,
    pub value: u16,
    #[serde(default)]
    pub to: i32,
    #[serde(default)]
    pub host_network: String,
}

/// A `network {}` block (Nomad's `NetworkResource`): static ports in `reserved_ports`,
/// dynamic ones in `dynamic_ports`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkResource {
    /// Empty or `host`.
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub mbits: u32,
    #[serde(default)]
    pub reserved_ports: Vec<Port>,
    #[serde(default)]
    pub dynamic_ports: Vec<Port>,
}

impl NetworkResource {
    /// Static ports first, then dynamic ones, each in the order written.
    pub fn ports(&self) -> impl Iterator<Item = &Port> {
        self.reserved_ports.iter().chain(&self.dynamic_ports)
    }
}

/// A port as placed (Nomad's `AllocatedPortMapping`): the host port `value` on `host_ip`, and
/// `to`, the port the task is told to bind when a mapping was asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AllocatedPort {
    pub label: String,
    pub value: u16,
    #[serde(default)]
    pub to: i32,
    pub host_ip: String,
}

impl AllocatedPort {
    /// The port the task binds: `to` when set, the host port otherwise (`NOMAD_PORT_<label>`).
    pub fn task_port(&self) -> u32 {
        if self.to > 0 {
            self.to as u32
        } else {
            u32::from(self.value)
        }
    }
}

/// One of a node's addresses (Nomad's `NodeNetworkResource`, host mode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeNetwork {
    pub device: String,
    pub ip: String,
    #[serde(default)]
    pub cidr: String,
}

/// `"22,80,8000-8100"` (Nomad's `ParsePortRanges`, for `reserved_ports`): every port named,
/// ascending, or what was wrong.
pub fn parse_port_ranges(spec: &str) -> Result<BTreeSet<u16>, String> {
    let mut ports = BTreeSet::new();
    for part in spec.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        let parse = |text: &str| {
            text.trim()
                .parse::<u16>()
                .map_err(|_| format!("invalid port {:?} in port range {spec:?}", text.trim()))
        };
        match part.split_once('-') {
            None => {
                ports.insert(parse(part)?);
            }
            Some((low, high)) => {
                let (low, high) = (parse(low)?, parse(high)?);
                if high < low {
                    return Err(format!("invalid range {part:?}: {high} is lower than {low}"));
                }
                ports.extend(low..=high);
            }
        }
    }
    Ok(ports)
}

/// `ports` back in the compact form `parse_port_ranges` reads (`"22,80,8000-8100"`).
pub fn format_port_ranges(ports: &BTreeSet<u16>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(u16, u16)> = None;
    for &port in ports {
        run = match run {
            Some((low, high)) if u32::from(high) + 1 == u32::from(port) => Some((low, port)),
            Some(done) => {
                out.push(range_text(done));
                Some((port, port))
            }
            None => Some((port, port)),
        };
    }
    out.extend(run.map(range_text));
    out.join(",")
}

fn range_text((low, high): (u16, u16)) -> String {
    if low == high {
        low.to_string()
    } else {
        format!("{low}-{high}")
    }
}

/// Why a group cannot have a network of its own (`mode = "bridge"`): Drover makes one only
/// for containers (a pause container the group's `docker` tasks join).
fn bridge_refusals(group: &TaskGroup) -> Vec<String> {
    let mut errors: Vec<String> = group
        .tasks
        .iter()
        .filter(|task| task.driver != "docker")
        .map(|task| {
            format!(
                "network mode \"bridge\" needs every task of the group to run in a container: task {:?} \
                 uses driver {:?}",
                task.name, task.driver
            )
        })
        .collect();
    // The pause container holds what the group shares; one task cannot have its own.
    for task in group.tasks.iter().filter(|task| task.driver == "docker") {
        for key in [
            "hostname",
            "dns_servers",
            "dns_search_domains",
            "dns_options",
            "extra_hosts",
        ] {
            if task.config.contains_key(key) {
                errors.push(format!(
                    "{key} cannot be set on task {:?}: the tasks of a group with network mode \"bridge\" \
                     share the group's network",
                    task.name
                ));
            }
        }
    }
    errors
}

/// Nomad's `TaskGroup.validateNetworks`: one group network, in host mode; every port label
/// once across the group and its tasks; every static port once; `to` within `-1..=65535`.
pub fn validate_networks(group: &TaskGroup) -> Vec<String> {
    let mut errors = Vec::new();
    if group.networks.len() > 1 {
        errors.push("Only one task group network resource is allowed".to_string());
    }
    let task_networks = group
        .tasks
        .iter()
        .flat_map(|task| task.resources.networks.iter().map(move |network| (Some(task), network)));
    let mut labels: BTreeMap<&str, String> = BTreeMap::new();
    let mut statics: BTreeMap<u16, String> = BTreeMap::new();
    for (task, network) in group
        .networks
        .iter()
        .map(|network| (None, network))
        .chain(task_networks)
    {
        let group_bridge = task.is_none() && network.mode == NETWORK_MODE_BRIDGE;
        if group_bridge {
            errors.extend(bridge_refusals(group));
        } else if !network.mode.is_empty() && network.mode != NETWORK_MODE_HOST {
            errors.push(format!(
                "network mode {:?} is not supported: Drover runs tasks in the host's network, or a \
                 group of containers in a network of its own (mode \"bridge\"); CNI networking is \
                 not available",
                network.mode
            ));
        }
        let owner = task.map_or_else(|| "taskgroup network".to_string(), |task| task.name.clone());
        for port in network.ports() {
            if let Some(other) = labels.get(port.label.as_str()) {
                errors.push(format!("Port label {} already in use by {other}", port.label));
            } else {
                labels.insert(&port.label, owner.clone());
            }
            if port.value != 0 {
                if let Some(other) = statics.get(&port.value) {
                    errors.push(format!("Static port {} already reserved by {other}", port.value));
                } else {
                    statics.insert(port.value, format!("{owner}:{}", port.label));
                }
            }
            if port.to < -1 {
                errors.push(format!(
                    "Port {:?} cannot be mapped to negative value {}",
                    port.label, port.to
                ));
            } else if port.to > i32::from(u16::MAX) {
                errors.push(format!(
                    "Port {:?} cannot be mapped to a port ({}) greater than {}",
                    port.label,
                    port.to,
                    u16::MAX
                ));
            }
        }
    }
    errors
}

/// The port labels `task` may name in a service: the group network's and its own.
pub fn port_labels(group: &TaskGroup, task: &Task) -> BTreeSet<String> {
    group
        .networks
        .iter()
        .chain(&task.resources.networks)
        .flat_map(NetworkResource::ports)
        .map(|port| port.label.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_and_print_back() {
        let ports = parse_port_ranges("22, 80,8000-8003,8002").unwrap();
        assert_eq!(
            ports.iter().copied().collect::<Vec<_>>(),
            [22, 80, 8000, 8001, 8002, 8003]
        );
        assert_eq!(format_port_ranges(&ports), "22,80,8000-8003");
        assert_eq!(parse_port_ranges("").unwrap().len(), 0);
        assert!(parse_port_ranges("80-70").unwrap_err().contains("70 is lower than 80"));
        assert!(parse_port_ranges("http").unwrap_err().contains("invalid port \"http\""));
        assert!(parse_port_ranges("70000").is_err());
    }
}
