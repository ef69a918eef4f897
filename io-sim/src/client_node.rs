//! A client node's identity on a simulated host, shared by both lanes: the settings its
//! client driver runs with and the node record it registers.

use drover_core::client::client::ClientSettings;
use drover_core::client::paths::ClientPaths;
use drover_core::config::AgentConfig;
use drover_core::structs::{Node, NodeResources, NodeStatus};
use drover_io_real::client::node_uuid;

/// The client's settings and node record on a simulated host (the production agent reads the
/// host's CPU and memory; these hosts have 4 cores of 1 GHz and 8 GiB).
pub fn client_identity(name: &str, config: &AgentConfig, agent_id: u64) -> (ClientSettings, Node) {
    let id = node_uuid(agent_id);
    let data_dir = config.data_dir.clone().unwrap_or_else(|| format!("/sim/{name}"));
    let settings = ClientSettings {
        node_id: id.clone(),
        paths: ClientPaths::new(format!("{data_dir}/client"), format!("{data_dir}/alloc")),
        host_volumes: Default::default(),
        region: config.region.clone(),
        seed: agent_id,
        faults: config.client.faults,
        consul: config.consul.for_client(),
        max_kill_timeout: config
            .client
            .max_kill_timeout
            .unwrap_or(drover_core::client::task_runner::DEFAULT_MAX_KILL_TIMEOUT),
    };
    let node = Node {
        id,
        name: name.to_string(),
        datacenter: config.datacenter.clone(),
        rpc_addr: config.advertise.rpc.to_string(),
        http_addr: config.advertise.http.to_string(),
        status: NodeStatus::Ready,
        resources: NodeResources {
            cpu: 4_000,
            memory_mb: 8_192,
            networks: vec![drover_core::structs::NodeNetwork {
                device: "eth0".into(),
                ip: config.advertise.http.ip().to_string(),
                cidr: format!("{}/32", config.advertise.http.ip()),
            }],
            // A narrow dynamic range, so a port handed out twice is likely to show.
            min_dynamic_port: 20000,
            max_dynamic_port: 20015,
            ..NodeResources::default()
        },
        attributes: [
            ("kernel.name", "linux"),
            ("cpu.arch", "amd64"),
            ("cpu.numcores", "4"),
            ("memory.totalbytes", "8589934592"),
            ("unique.hostname", name),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect(),
        ..Node::default()
    };
    (settings, node)
}
