//! Agent configuration: Nomad's HCL agent blocks and command-line flags, merged into the core's
//! [`AgentConfig`] (defaults < files in order < flags).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

pub mod tls;
use drover_core::config::{Advertise, AgentConfig};
use serde::Deserialize;

/// Nomad's agent config file, for the blocks Drover understands.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FileConfig {
    pub name: Option<String>,
    pub region: Option<String>,
    pub datacenter: Option<String>,
    pub data_dir: Option<String>,
    pub bind_addr: Option<String>,
    pub log_level: Option<String>,
    pub ports: Option<PortsBlock>,
    pub advertise: Option<AdvertiseBlock>,
    pub server: Option<ServerBlock>,
    pub client: Option<ClientBlock>,
    pub consul: Option<ConsulBlock>,
    /// `plugin "<name>" { config { ... } }`: task driver settings.
    pub plugin: Option<std::collections::BTreeMap<String, PluginBlock>>,
    pub limits: Option<LimitsBlock>,
    pub acl: Option<AclBlock>,
    pub tls: Option<tls::TlsBlock>,
    pub autopilot: Option<AutopilotBlock>,
}

/// Nomad's `autopilot {}`: what the leader applies until an operator sets the cluster's own
/// (`operator autopilot set-config`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AutopilotBlock {
    pub cleanup_dead_servers: Option<bool>,
    pub last_contact_threshold: Option<String>,
    pub max_trailing_logs: Option<u64>,
    pub min_quorum: Option<u32>,
    pub server_stabilization_time: Option<String>,
    pub enable_redundancy_zones: Option<bool>,
    pub disable_upgrade_migration: Option<bool>,
    pub enable_custom_upgrades: Option<bool>,
}

fn apply_autopilot(config: &mut drover_core::autopilot::AutopilotConfig, block: AutopilotBlock) -> anyhow::Result<()> {
    if let Some(text) = &block.last_contact_threshold {
        config.last_contact_threshold = parse_duration("autopilot.last_contact_threshold", text)?;
    }
    if let Some(text) = &block.server_stabilization_time {
        config.server_stabilization_time = parse_duration("autopilot.server_stabilization_time", text)?;
    }
    config.cleanup_dead_servers = block.cleanup_dead_servers.unwrap_or(config.cleanup_dead_servers);
    config.max_trailing_logs = block.max_trailing_logs.unwrap_or(config.max_trailing_logs);
    config.min_quorum = block.min_quorum.unwrap_or(config.min_quorum);
    config.enable_redundancy_zones = block.enable_redundancy_zones.unwrap_or(config.enable_redundancy_zones);
    config.disable_upgrade_migration = block
        .disable_upgrade_migration
        .unwrap_or(config.disable_upgrade_migration);
    config.enable_custom_upgrades = block.enable_custom_upgrades.unwrap_or(config.enable_custom_upgrades);
    Ok(())
}

/// Nomad's `acl {}`. Servers resolve tokens from the replicated state (cached until the ACL
/// tables change); a client-only agent asks a server and keeps the answer `token_ttl`.
/// `policy_ttl` is read and checked: policies come with the token they belong to.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AclBlock {
    pub enabled: Option<bool>,
    pub token_ttl: Option<String>,
    pub policy_ttl: Option<String>,
    pub token_min_expiration_ttl: Option<String>,
    pub token_max_expiration_ttl: Option<String>,
}

/// Nomad's `limits {}`: what one client may hold of the agent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LimitsBlock {
    pub http_max_conns_per_client: Option<i64>,
    pub rpc_max_conns_per_client: Option<i64>,
    pub https_handshake_timeout: Option<String>,
    pub rpc_handshake_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PluginBlock {
    pub config: Option<PluginConfigBlock>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PluginConfigBlock {
    pub enabled: Option<bool>,
    // The docker driver's (Nomad's docker plugin `config`).
    pub endpoint: Option<String>,
    pub allow_privileged: Option<bool>,
    pub allow_caps: Option<Vec<String>>,
    pub volumes: Option<DockerVolumesBlock>,
    pub gc: Option<DockerGcBlock>,
    /// The image of the pause container a bridge-mode group's tasks share.
    pub infra_image: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DockerVolumesBlock {
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DockerGcBlock {
    pub image: Option<bool>,
    pub image_delay: Option<String>,
    pub container: Option<bool>,
    pub dangling_containers: Option<DockerDanglingBlock>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DockerDanglingBlock {
    pub enabled: Option<bool>,
    pub creation_grace: Option<String>,
    pub period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PortsBlock {
    pub http: Option<u16>,
    pub rpc: Option<u16>,
    pub serf: Option<u16>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AdvertiseBlock {
    pub http: Option<String>,
    pub rpc: Option<String>,
    pub serf: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ServerBlock {
    pub enabled: Option<bool>,
    pub bootstrap_expect: Option<u32>,
    pub non_voting_server: Option<bool>,
    /// The gossip key, base64 (`agent operator gossip keyring generate`).
    pub encrypt: Option<String>,
    pub server_join: Option<ServerJoinBlock>,
    /// Deprecated placement Nomad still accepts directly in `server {}`.
    pub retry_join: Option<Vec<String>>,
    pub retry_interval: Option<String>,
    pub retry_max: Option<u32>,
    pub heartbeat_grace: Option<String>,
    pub min_heartbeat_ttl: Option<String>,
    /// What one job may ask (Drover's; the defaults are `jobspec::limits`).
    pub job_max_group_count: Option<u64>,
    pub job_max_count: Option<u64>,
    pub job_max_groups: Option<u64>,
    pub job_max_group_tasks: Option<u64>,
    pub max_heartbeats_per_second: Option<f64>,
    pub failover_heartbeat_ttl: Option<String>,
    /// Nomad's scale for the Raft timings (1–10; 0 or unset: 1).
    pub raft_multiplier: Option<i64>,
    /// Raft log entries between snapshots (Nomad's `raft_snapshot_threshold`, 8192).
    pub raft_snapshot_threshold: Option<i64>,
    /// How often to look whether a snapshot is due (Nomad's `raft_snapshot_interval`, "120s").
    pub raft_snapshot_interval: Option<String>,
    /// The leader's periodic GC: how often, and how long each kind must have been finished.
    pub job_gc_interval: Option<String>,
    pub job_gc_threshold: Option<String>,
    pub eval_gc_threshold: Option<String>,
    pub batch_eval_gc_threshold: Option<String>,
    pub deployment_gc_threshold: Option<String>,
    pub node_gc_threshold: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ServerJoinBlock {
    pub retry_join: Option<Vec<String>>,
    pub retry_interval: Option<String>,
    pub retry_max: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ClientBlock {
    pub enabled: Option<bool>,
    /// Servers to talk to, `host[:port]` (port 4647 when left out).
    pub servers: Option<Vec<String>>,
    pub host_volume: Option<std::collections::BTreeMap<String, HostVolumeBlock>>,
    /// `meta { key = "value" }`: the node's metadata (`${meta.<key>}`, constraints).
    pub meta: Option<std::collections::BTreeMap<String, String>>,
    pub node_class: Option<String>,
    /// The cap on every task's `kill_timeout` (Nomad's default 30 s).
    pub max_kill_timeout: Option<String>,
    /// The interface whose address tasks' ports are allocated on.
    pub network_interface: Option<String>,
    pub min_dynamic_port: Option<u32>,
    pub max_dynamic_port: Option<u32>,
    pub reserved: Option<ReservedBlock>,
}

/// `client { reserved {} }`: what allocations may not have (only ports are kept here).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReservedBlock {
    /// `"22,80,8000-8100"`.
    pub reserved_ports: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct HostVolumeBlock {
    pub path: String,
    pub read_only: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ConsulBlock {
    pub address: Option<String>,
    pub server_service_name: Option<String>,
    pub server_auto_join: Option<bool>,
    pub auto_advertise: Option<bool>,
    pub timeout: Option<String>,
    pub token: Option<String>,
    pub grpc_address: Option<String>,
    pub client_auto_join: Option<bool>,
    pub binary: Option<String>,
    pub ssl: Option<bool>,
    pub verify_ssl: Option<bool>,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub auth: Option<String>,
}

const KNOWN_TOP_LEVEL: &[&str] = &[
    "name",
    "region",
    "datacenter",
    "data_dir",
    "bind_addr",
    "log_level",
    "ports",
    "advertise",
    "limits",
    "acl",
    "tls",
    "server",
    "client",
    "consul",
    "plugin",
    "autopilot",
];

/// `server { job_gc_interval, *_gc_threshold }`: Go durations, each above zero.
fn apply_core_gc(config: &mut drover_core::gc::periodic::CoreGcConfig, server: &ServerBlock) -> anyhow::Result<()> {
    let thresholds = &mut config.thresholds;
    let settings = [
        ("server.job_gc_interval", &server.job_gc_interval, &mut config.interval),
        ("server.job_gc_threshold", &server.job_gc_threshold, &mut thresholds.job),
        (
            "server.eval_gc_threshold",
            &server.eval_gc_threshold,
            &mut thresholds.eval,
        ),
        (
            "server.batch_eval_gc_threshold",
            &server.batch_eval_gc_threshold,
            &mut thresholds.batch_eval,
        ),
        (
            "server.deployment_gc_threshold",
            &server.deployment_gc_threshold,
            &mut thresholds.deployment,
        ),
        (
            "server.node_gc_threshold",
            &server.node_gc_threshold,
            &mut thresholds.node,
        ),
    ];
    for (field, text, setting) in settings {
        if let Some(text) = text {
            let value = parse_duration(field, text)?;
            if value.is_zero() {
                anyhow::bail!("{field} = {text:?}: it must be greater than zero");
            }
            *setting = value;
        }
    }
    Ok(())
}

/// `server { job_max_* }` over `limits`: each a whole number from 1 to its ceiling (what one
/// evaluation can build in memory without risk; a limit is a promise the scheduler keeps).
fn job_limits(
    server: &ServerBlock,
    mut limits: drover_core::jobspec::limits::JobLimits,
) -> anyhow::Result<drover_core::jobspec::limits::JobLimits> {
    let check = |name: &str, value: Option<u64>, ceiling: u64| -> anyhow::Result<Option<u64>> {
        match value {
            Some(value) if value == 0 || value > ceiling => Err(anyhow::anyhow!(
                "server.{name} = {value}: it must be between 1 and {ceiling}"
            )),
            other => Ok(other),
        }
    };
    if let Some(value) = check("job_max_group_count", server.job_max_group_count, 1_000_000)? {
        limits.group_count = value as u32;
    }
    if let Some(value) = check("job_max_count", server.job_max_count, 5_000_000)? {
        limits.job_count = value;
    }
    if let Some(value) = check("job_max_groups", server.job_max_groups, 10_000)? {
        limits.groups = value as usize;
    }
    if let Some(value) = check("job_max_group_tasks", server.job_max_group_tasks, 10_000)? {
        limits.tasks = value as usize;
    }
    Ok(limits)
}

/// Command-line flags, already parsed.
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub dev: bool,
    pub server: bool,
    pub client: bool,
    pub bootstrap_expect: Option<u32>,
    pub data_dir: Option<String>,
    pub bind: Option<String>,
    pub http_port: Option<u16>,
    pub rpc_port: Option<u16>,
    pub serf_port: Option<u16>,
    pub retry_join: Vec<String>,
    pub retry_interval: Option<String>,
    pub retry_max: Option<u32>,
    pub servers: Vec<String>,
    pub region: Option<String>,
    pub dc: Option<String>,
    pub node: Option<String>,
    pub consul_address: Option<String>,
    pub log_level: Option<String>,
    pub config: Vec<PathBuf>,
}

/// The merged configuration, plus what is not part of the core's config.
#[derive(Debug)]
pub struct Loaded {
    pub config: AgentConfig,
    /// The HTTP API's bounds (`limits {}`).
    pub http_limits: crate::limits::HttpLimits,
    /// Inbound agent RPC connections per client address (`limits { rpc_max_conns_per_client }`).
    pub rpc_max_conns_per_client: usize,
    /// Time for an RPC peer to finish its TLS handshake (`limits { rpc_handshake_timeout }`).
    pub rpc_handshake_timeout: Duration,
    /// `tls {}`: what is served over TLS, with which files.
    pub tls: crate::tls::agent::TlsSettings,
    pub log_level: String,
    /// Operator-facing notes (ignored keys); validation warnings are added by the caller.
    pub notes: Vec<String>,
}

/// Parses one HCL config file, returning the typed blocks and the top-level keys it ignores.
pub fn parse_file(path: &Path) -> anyhow::Result<(FileConfig, Vec<String>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("Error loading configuration from {}", path.display()))?;
    parse_text(&text).with_context(|| format!("Error loading configuration from {}", path.display()))
}

pub fn parse_text(text: &str) -> anyhow::Result<(FileConfig, Vec<String>)> {
    let body = drover_io_real::hcl_check::parse_body(text).map_err(|error| anyhow::anyhow!("{error}"))?;
    let mut ignored = Vec::new();
    for structure in body.iter() {
        let key = match structure {
            hcl::Structure::Attribute(attribute) => attribute.key.to_string(),
            hcl::Structure::Block(block) => block.identifier.to_string(),
        };
        if !KNOWN_TOP_LEVEL.contains(&key.as_str()) && !ignored.contains(&key) {
            ignored.push(key);
        }
    }
    let config: FileConfig = hcl::from_body(body).map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok((config, ignored))
}

/// Parses a Go-style duration ("30s", "1m", "500ms"), naming the field when it does not.
pub fn parse_duration(field: &str, text: &str) -> anyhow::Result<Duration> {
    drover_core::goduration::parse(text.trim())
        .map_err(|error| anyhow::anyhow!("invalid {field} {text:?}: {error}; expected a duration such as \"30s\""))
}

fn parse_ip(field: &str, text: &str) -> anyhow::Result<IpAddr> {
    text.trim()
        .parse()
        .with_context(|| format!("invalid {field} {text:?}: expected an IP address"))
}

/// An `advertise` value: "ip" or "ip:port"; the port defaults to `port`.
fn parse_advertise(field: &str, text: &str, port: u16) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    Ok(SocketAddr::new(parse_ip(field, text)?, port))
}

/// A client's server address, `host[:port]` with Nomad's RPC port 4647 as the default,
/// resolved to `ip:port` once at start.
fn resolve_server(field: &str, text: &str) -> anyhow::Result<String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr.to_string());
    }
    if let Ok(ip) = text.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 4647).to_string());
    }
    let with_port = if text.contains(':') {
        text.to_string()
    } else {
        format!("{text}:4647")
    };
    let addr = with_port
        .to_socket_addrs()
        .with_context(|| format!("invalid {field} address {text:?}"))?
        .next()
        .with_context(|| format!("invalid {field} address {text:?}: it resolves to nothing"))?;
    Ok(addr.to_string())
}

/// `network_interface`, the dynamic port range and `reserved { reserved_ports }`, checked.
fn apply_client_network(config: &mut drover_core::config::ClientConfig, client: &ClientBlock) -> anyhow::Result<()> {
    if let Some(interface) = &client.network_interface {
        let known = crate::executor::interfaces();
        if !known.iter().any(|network| network.device == *interface) {
            let names: std::collections::BTreeSet<&str> = known.iter().map(|network| network.device.as_str()).collect();
            bail!(
                "client.network_interface {interface:?}: no such interface with an address (this host has: {})",
                names.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        config.network_interface = interface.clone();
    }
    let port = |key: &str, value: u32| -> anyhow::Result<u16> {
        match u16::try_from(value) {
            Ok(port) if port > 0 => Ok(port),
            _ => bail!("client.{key} must be between 1 and 65535, got {value}"),
        }
    };
    if let Some(min) = client.min_dynamic_port {
        config.min_dynamic_port = port("min_dynamic_port", min)?;
    }
    if let Some(max) = client.max_dynamic_port {
        config.max_dynamic_port = port("max_dynamic_port", max)?;
    }
    let range = drover_core::structs::NodeResources {
        min_dynamic_port: config.min_dynamic_port,
        max_dynamic_port: config.max_dynamic_port,
        ..Default::default()
    }
    .dynamic_range();
    if range.start() > range.end() {
        bail!(
            "client.min_dynamic_port ({}) must be less than client.max_dynamic_port ({})",
            range.start(),
            range.end()
        );
    }
    if let Some(ports) = client
        .reserved
        .as_ref()
        .and_then(|reserved| reserved.reserved_ports.as_ref())
    {
        config.reserved_ports = drover_core::structs::parse_port_ranges(ports)
            .map_err(|problem| anyhow::anyhow!("client.reserved.reserved_ports: {problem}"))?;
    }
    Ok(())
}

/// Merges defaults, files and flags. `dev_data_dir` is used for `-dev` without `-data-dir`.
pub fn load(flags: &Flags, dev_data_dir: impl FnOnce() -> anyhow::Result<String>) -> anyhow::Result<Loaded> {
    let mut config = AgentConfig::default();
    let mut log_level = "INFO".to_string();
    let mut notes = Vec::new();
    let mut bind: Option<IpAddr> = None;
    let mut advertise = AdvertiseBlock::default();
    let mut http_limits = crate::limits::HttpLimits::default();
    let mut rpc_max_conns_per_client = crate::net::RPC_MAX_CONNS_PER_CLIENT;
    let mut rpc_handshake_timeout = crate::tls::stream::HANDSHAKE_TIMEOUT;
    let mut tls_settings = crate::tls::agent::TlsSettings::default();

    if flags.dev {
        config.dev_mode = true;
        config.server.enabled = true;
        config.client.enabled = true;
        config.client.raw_exec_enabled = true;
        config.server.bootstrap_expect = 1;
        bind = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        config.name = "dev".to_string();
    }

    for path in &flags.config {
        let files = config_files(path)?;
        for file in files {
            let (mut parsed, ignored) = parse_file(&file)?;
            for key in ignored {
                notes.push(format!("{}: ignoring unsupported config key {key:?}", file.display()));
            }
            if let Some(block) = parsed.limits.take() {
                let rpc = RpcLimits {
                    max_conns_per_client: &mut rpc_max_conns_per_client,
                    handshake_timeout: &mut rpc_handshake_timeout,
                };
                apply_limits(&mut http_limits, rpc, block)
                    .with_context(|| format!("Error loading configuration from {}", file.display()))?;
            }
            if let Some(block) = parsed.tls.take() {
                tls::apply(&mut tls_settings, &mut notes, block)
                    .with_context(|| format!("Error loading configuration from {}", file.display()))?;
            }
            apply_file(
                &mut config,
                &mut log_level,
                &mut bind,
                &mut advertise,
                &mut notes,
                parsed,
            )?;
        }
    }

    if flags.server {
        config.server.enabled = true;
    }
    if flags.client {
        config.client.enabled = true;
    }
    if let Some(expect) = flags.bootstrap_expect {
        config.server.bootstrap_expect = expect;
    }
    if let Some(dir) = &flags.data_dir {
        config.data_dir = Some(dir.clone());
    }
    if let Some(text) = &flags.bind {
        bind = Some(parse_ip("-bind", text)?);
    }
    if let Some(port) = flags.http_port {
        config.ports.http = port;
    }
    if let Some(port) = flags.rpc_port {
        config.ports.rpc = port;
    }
    if let Some(port) = flags.serf_port {
        config.ports.serf = port;
    }
    if !flags.retry_join.is_empty() {
        config.server.retry_join = flags.retry_join.clone();
    }
    if !flags.servers.is_empty() {
        config.client.servers = flags
            .servers
            .iter()
            .flat_map(|list| list.split(','))
            .filter(|server| !server.trim().is_empty())
            .map(|server| resolve_server("-servers", server.trim()))
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(text) = &flags.retry_interval {
        config.server.retry_interval = parse_duration("-retry-interval", text)?;
    }
    if let Some(max) = flags.retry_max {
        config.server.retry_max = max;
    }
    if let Some(region) = &flags.region {
        config.region = region.clone();
    }
    if let Some(dc) = &flags.dc {
        config.datacenter = dc.clone();
    }
    if let Some(node) = &flags.node {
        config.name = node.clone();
    }
    if let Some(address) = &flags.consul_address {
        config.consul.address = Some(address.clone());
    }
    if let Some(level) = &flags.log_level {
        log_level = level.clone();
    }
    if config.dev_mode && config.data_dir.is_none() {
        config.data_dir = Some(dev_data_dir()?);
    }

    config.bind_addr = bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let default_ip = if config.bind_addr.is_unspecified() {
        local_ip()
    } else {
        config.bind_addr
    };
    let mut resolved = Advertise::on(default_ip, config.ports);
    if let Some(text) = &advertise.http {
        resolved.http = parse_advertise("advertise.http", text, config.ports.http)?;
    }
    if let Some(text) = &advertise.rpc {
        resolved.rpc = parse_advertise("advertise.rpc", text, config.ports.rpc)?;
    }
    if let Some(text) = &advertise.serf {
        resolved.serf = parse_advertise("advertise.serf", text, config.ports.serf)?;
    }
    config.advertise = resolved;
    if !config.bind_addr.is_loopback() && !config.acl.enabled {
        notes.push(format!(
            "the HTTP API listens on {}:{} with ACLs disabled: anyone who can reach it can run \
             jobs on every client, read every variable and deregister every volume. Enable ACLs \
             (acl {{ enabled = true }}), or bind it to a loopback or private address (bind_addr, \
             -bind) and firewall the port",
            config.bind_addr, config.ports.http
        ));
    }
    tls_settings.check()?;
    Ok(Loaded {
        config,
        http_limits,
        rpc_max_conns_per_client,
        rpc_handshake_timeout,
        tls: tls_settings,
        log_level,
        notes,
    })
}

/// The RPC side of `limits {}`.
struct RpcLimits<'a> {
    max_conns_per_client: &'a mut usize,
    handshake_timeout: &'a mut Duration,
}

fn apply_limits(http: &mut crate::limits::HttpLimits, rpc: RpcLimits<'_>, block: LimitsBlock) -> anyhow::Result<()> {
    if let Some(max) = block.http_max_conns_per_client {
        http.max_conns_per_client =
            usize::try_from(max).map_err(|_| anyhow::anyhow!("http_max_conns_per_client must be >= 0"))?;
    }
    if let Some(max) = block.rpc_max_conns_per_client {
        *rpc.max_conns_per_client =
            usize::try_from(max).map_err(|_| anyhow::anyhow!("rpc_max_conns_per_client must be >= 0"))?;
    }
    if let Some(text) = &block.https_handshake_timeout {
        http.handshake_timeout = parse_duration("https_handshake_timeout", text)?;
    }
    if let Some(text) = &block.rpc_handshake_timeout {
        *rpc.handshake_timeout = parse_duration("rpc_handshake_timeout", text)?;
    }
    Ok(())
}

/// A path names a file, or a directory whose `*.hcl` files are read in name order (as Nomad).
fn config_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let metadata =
        std::fs::metadata(path).with_context(|| format!("Error loading configuration from {}", path.display()))?;
    if !metadata.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("Error loading configuration from {}", path.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|file| file.extension().is_some_and(|ext| ext == "hcl"))
        .collect();
    files.sort();
    Ok(files)
}

/// One config file's text over the defaults, as [`load`] applies each file (no flags, no other
/// files): the config and the notes on what it ignored.
pub fn from_text(text: &str) -> anyhow::Result<(AgentConfig, Vec<String>)> {
    let (parsed, ignored) = parse_text(text)?;
    let mut config = AgentConfig::default();
    let mut notes: Vec<String> = ignored
        .into_iter()
        .map(|key| format!("ignoring unsupported config key {key:?}"))
        .collect();
    apply_file(
        &mut config,
        &mut String::new(),
        &mut None,
        &mut AdvertiseBlock::default(),
        &mut notes,
        parsed,
    )?;
    Ok((config, notes))
}

fn apply_file(
    config: &mut AgentConfig,
    log_level: &mut String,
    bind: &mut Option<IpAddr>,
    advertise: &mut AdvertiseBlock,
    notes: &mut Vec<String>,
    file: FileConfig,
) -> anyhow::Result<()> {
    if let Some(name) = file.name {
        config.name = name;
    }
    if let Some(acl) = file.acl {
        if let Some(enabled) = acl.enabled {
            config.acl.enabled = enabled;
        }
        if let Some(text) = &acl.token_ttl {
            config.acl.token_ttl = parse_duration("token_ttl", text)?;
        }
        if let Some(text) = &acl.policy_ttl {
            parse_duration("policy_ttl", text)?;
        }
        if let Some(text) = &acl.token_min_expiration_ttl {
            config.acl.token_min_expiration_ttl = parse_duration("token_min_expiration_ttl", text)?;
        }
        if let Some(text) = &acl.token_max_expiration_ttl {
            config.acl.token_max_expiration_ttl = parse_duration("token_max_expiration_ttl", text)?;
        }
        if config.acl.token_min_expiration_ttl > config.acl.token_max_expiration_ttl {
            anyhow::bail!("acl: token_min_expiration_ttl is longer than token_max_expiration_ttl");
        }
    }
    if let Some(region) = file.region {
        config.region = region;
    }
    if let Some(datacenter) = file.datacenter {
        config.datacenter = datacenter;
    }
    if let Some(dir) = file.data_dir {
        config.data_dir = Some(dir);
    }
    if let Some(text) = file.bind_addr {
        *bind = Some(parse_ip("bind_addr", &text)?);
    }
    if let Some(level) = file.log_level {
        *log_level = level;
    }
    if let Some(ports) = file.ports {
        config.ports.http = ports.http.unwrap_or(config.ports.http);
        config.ports.rpc = ports.rpc.unwrap_or(config.ports.rpc);
        config.ports.serf = ports.serf.unwrap_or(config.ports.serf);
    }
    if let Some(block) = file.advertise {
        advertise.http = block.http.or(advertise.http.take());
        advertise.rpc = block.rpc.or(advertise.rpc.take());
        advertise.serf = block.serf.or(advertise.serf.take());
    }
    if let Some(block) = file.autopilot {
        apply_autopilot(&mut config.server.autopilot, block)?;
    }
    if let Some(server) = file.server {
        if let Some(enabled) = server.enabled {
            config.server.enabled = enabled;
        }
        if let Some(expect) = server.bootstrap_expect {
            config.server.bootstrap_expect = expect;
        }
        config.server.job_limits = job_limits(&server, config.server.job_limits)?;
        apply_core_gc(&mut config.server.timing.core_gc, &server)?;
        if let Some(key) = server.encrypt {
            drover_io_real::keyring::check_key(&key).map_err(|error| anyhow::anyhow!("server.encrypt: {error}"))?;
            config.server.encrypt = Some(drover_core::structs::SecretText(key));
        }
        if let Some(nonvoter) = server.non_voting_server {
            config.server.non_voting_server = nonvoter;
        }
        let join = server.server_join.unwrap_or_default();
        if let Some(targets) = join.retry_join.or(server.retry_join) {
            config.server.retry_join = targets;
        }
        if let Some(text) = join.retry_interval.or(server.retry_interval) {
            config.server.retry_interval = parse_duration("retry_interval", &text)?;
        }
        if let Some(max) = join.retry_max.or(server.retry_max) {
            config.server.retry_max = max;
        }
        match server.raft_multiplier {
            None | Some(0) => {}
            Some(multiplier @ 1..=10) => config.server.timing.scale_raft(multiplier as u32),
            Some(other) => bail!("raft_multiplier cannot be {other}. Must be between 1 and 10"),
        }
        match server.raft_snapshot_threshold {
            None => {}
            Some(threshold @ 1..) => config.server.timing.snapshot_threshold = threshold as u64,
            Some(other) => bail!("raft_snapshot_threshold must be positive, not {other}"),
        }
        if let Some(text) = &server.raft_snapshot_interval {
            let interval = parse_duration("raft_snapshot_interval", text)?;
            if interval.is_zero() {
                bail!("raft_snapshot_interval must be positive, not {text:?}");
            }
            config.server.timing.snapshot_interval = interval;
        }
        let heartbeat = &mut config.server.timing.heartbeat;
        if let Some(text) = &server.heartbeat_grace {
            heartbeat.grace = parse_duration("heartbeat_grace", text)?;
        }
        if let Some(text) = &server.min_heartbeat_ttl {
            heartbeat.min_ttl = parse_duration("min_heartbeat_ttl", text)?;
        }
        if let Some(text) = &server.failover_heartbeat_ttl {
            heartbeat.failover_ttl = parse_duration("failover_heartbeat_ttl", text)?;
        }
        if let Some(rate) = server.max_heartbeats_per_second {
            if !(rate >= 1.0 && rate <= f64::from(u32::MAX)) {
                bail!("max_heartbeats_per_second must be at least 1, got {rate}");
            }
            heartbeat.max_per_second = rate as u32;
        }
    }
    if let Some(client) = file.client {
        if let Some(enabled) = client.enabled {
            config.client.enabled = enabled;
        }
        apply_client_network(&mut config.client, &client)?;
        if let Some(servers) = client.servers {
            config.client.servers = servers
                .iter()
                .map(|server| resolve_server("client.servers", server))
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(meta) = client.meta {
            config.client.meta = meta;
        }
        if let Some(class) = client.node_class {
            config.client.node_class = class;
        }
        if let Some(text) = &client.max_kill_timeout {
            config.client.max_kill_timeout = Some(parse_duration("client.max_kill_timeout", text)?);
        }
        for (name, volume) in client.host_volume.unwrap_or_default() {
            config.client.host_volumes.insert(
                name,
                drover_core::client::volume_hook::HostVolumeConfig {
                    path: volume.path,
                    read_only: volume.read_only,
                },
            );
        }
    }
    for (name, plugin) in file.plugin.unwrap_or_default() {
        match name.as_str() {
            "raw_exec" => {
                if let Some(enabled) = plugin.config.and_then(|config| config.enabled) {
                    config.client.raw_exec_enabled = enabled;
                }
            }
            "mock" | "mock_driver" => {
                if let Some(enabled) = plugin.config.and_then(|config| config.enabled) {
                    config.client.mock_driver_enabled = enabled;
                }
            }
            "docker" => {
                let Some(block) = plugin.config else { continue };
                let docker = &mut config.client.docker;
                if let Some(endpoint) = block.endpoint {
                    if !endpoint.starts_with("unix://") {
                        anyhow::bail!(
                            "plugin \"docker\": endpoint {endpoint:?} is not a unix socket; Drover reaches the Engine at unix:///path"
                        );
                    }
                    docker.endpoint = endpoint;
                }
                if let Some(allow) = block.allow_privileged {
                    docker.allow_privileged = allow;
                }
                if let Some(caps) = block.allow_caps {
                    docker.allow_caps = caps;
                }
                if let Some(image) = block.infra_image.filter(|image| !image.trim().is_empty()) {
                    docker.infra_image = image;
                }
                if let Some(enabled) = block.volumes.and_then(|volumes| volumes.enabled) {
                    docker.volumes_enabled = enabled;
                }
                if let Some(gc) = block.gc {
                    if let Some(image) = gc.image {
                        docker.gc_image = image;
                    }
                    if let Some(delay) = gc.image_delay {
                        docker.image_delay = parse_duration("plugin.docker.gc.image_delay", &delay)?;
                    }
                    if let Some(dangling) = gc.dangling_containers {
                        if let Some(enabled) = dangling.enabled {
                            docker.gc_containers = enabled;
                        }
                        if let Some(period) = dangling.period {
                            docker.orphan_period =
                                parse_duration("plugin.docker.gc.dangling_containers.period", &period)?;
                        }
                        if let Some(grace) = dangling.creation_grace {
                            docker.creation_grace =
                                parse_duration("plugin.docker.gc.dangling_containers.creation_grace", &grace)?;
                        }
                    }
                }
            }
            other => notes.push(format!("plugin {other:?} has no settings in Drover; ignored")),
        }
    }
    if let Some(consul) = file.consul {
        if let Some(address) = consul.address {
            config.consul.address = Some(address);
        }
        if let Some(name) = consul.server_service_name {
            config.consul.server_service_name = name;
        }
        if let Some(auto_join) = consul.server_auto_join {
            config.consul.server_auto_join = auto_join;
        }
        if let Some(auto_advertise) = consul.auto_advertise {
            config.consul.auto_advertise = auto_advertise;
        }
        if let Some(text) = consul.timeout {
            config.consul.timeout = parse_duration("consul.timeout", &text)?;
        }
        if let Some(token) = consul.token.filter(|token| !token.is_empty()) {
            config.consul.token = Some(token);
        }
        if let Some(address) = consul.grpc_address.filter(|address| !address.is_empty()) {
            config.consul.grpc_address = address;
        }
        if let Some(auto_join) = consul.client_auto_join {
            config.consul.client_auto_join = auto_join;
        }
        if let Some(binary) = consul.binary.filter(|binary| !binary.is_empty()) {
            config.consul.binary = binary;
        }
        let transport = &mut config.consul.transport;
        if let Some(ssl) = consul.ssl {
            transport.ssl = ssl;
        }
        if let Some(verify) = consul.verify_ssl {
            transport.verify_ssl = verify;
        }
        for (value, field) in [
            (consul.ca_file, &mut transport.ca_file),
            (consul.cert_file, &mut transport.cert_file),
            (consul.key_file, &mut transport.key_file),
        ] {
            if let Some(value) = value.filter(|value| !value.is_empty()) {
                *field = value;
            }
        }
        if let Some(auth) = consul.auth.filter(|auth| !auth.is_empty()) {
            transport.auth = Some(auth);
        }
    }
    Ok(())
}

/// The address other agents should use when we bind to every interface: the source address
/// of the default route, or loopback when there is none. No packet is sent.
fn local_ip() -> IpAddr {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|socket| {
            socket.connect("10.254.254.254:1")?;
            socket.local_addr()
        })
        .map(|addr| addr.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOMAD_SERVER: &str = r#"
name       = "server-1"
region     = "eu"
datacenter = "eu-west-1"
data_dir   = "/var/lib/nomad"
bind_addr  = "10.0.0.5"

ports {
  http = 5646
  rpc  = 5647
  serf = 5648
}

advertise {
  rpc = "192.168.1.5"
}

server {
  enabled                = true
  bootstrap_expect       = 3
  heartbeat_grace        = "20s"
  min_heartbeat_ttl      = "15s"
  failover_heartbeat_ttl = "10m"
  server_join {
    retry_join     = ["10.0.0.6", "10.0.0.7:5648"]
    retry_interval = "15s"
  }
}

client {
  enabled = false
}

telemetry {
  publish_allocation_metrics = true
}

acl {
  enabled = true
}
"#;

    fn no_dev() -> anyhow::Result<String> {
        panic!("not in dev mode")
    }

    /// The server timings a `server { enabled = true  <extra> }` file loads to.
    /// The server config a `server { enabled = true <extra> }` file loads to.
    fn server_config(extra: &str) -> anyhow::Result<drover_core::config::ServerConfig> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("server.hcl");
        std::fs::write(&file, format!("server {{\n  enabled = true\n  {extra}\n}}\n")).unwrap();
        let flags = Flags {
            config: vec![file],
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        load(&flags, no_dev).map(|loaded| loaded.config.server)
    }

    fn server_timing(extra: &str) -> anyhow::Result<drover_core::config::ServerTiming> {
        server_config(extra).map(|server| server.timing)
    }

    #[test]
    fn an_operators_nomad_config_works_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("server.hcl");
        std::fs::write(&file, NOMAD_SERVER).unwrap();
        let flags = Flags {
            config: vec![file.clone()],
            ..Flags::default()
        };
        let loaded = load(&flags, no_dev).unwrap();
        let config = loaded.config;
        assert_eq!(config.name, "server-1");
        assert_eq!(
            (config.region.as_str(), config.datacenter.as_str()),
            ("eu", "eu-west-1")
        );
        assert_eq!(config.data_dir.as_deref(), Some("/var/lib/nomad"));
        assert_eq!(config.bind_addr, "10.0.0.5".parse::<IpAddr>().unwrap());
        assert_eq!(
            (config.ports.http, config.ports.rpc, config.ports.serf),
            (5646, 5647, 5648)
        );
        assert_eq!(config.advertise.rpc, "192.168.1.5:5647".parse().unwrap());
        assert_eq!(config.advertise.serf, "10.0.0.5:5648".parse().unwrap());
        assert!(config.server.enabled && !config.client.enabled);
        assert_eq!(config.server.bootstrap_expect, 3);
        assert_eq!(config.server.retry_join, vec!["10.0.0.6", "10.0.0.7:5648"]);
        assert_eq!(config.server.retry_interval, Duration::from_secs(15));
        let heartbeat = config.server.timing.heartbeat;
        assert_eq!(
            (
                heartbeat.grace,
                heartbeat.min_ttl,
                heartbeat.failover_ttl,
                heartbeat.max_per_second
            ),
            (
                Duration::from_secs(20),
                Duration::from_secs(15),
                Duration::from_secs(600),
                50
            )
        );
        assert_eq!(
            loaded.notes,
            vec![format!(
                "{}: ignoring unsupported config key \"telemetry\"",
                file.display()
            ),]
        );
        assert!(config.acl.enabled, "acl {{ enabled = true }}");
        assert_eq!(config.validate(), Ok(vec![]));
    }

    #[test]
    fn a_consul_block_with_tls_and_auth_is_read_as_nomad_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("consul.hcl");
        std::fs::write(
            &file,
            r#"
consul {
  address    = "127.0.0.1:8501"
  ssl        = true
  verify_ssl = false
  ca_file    = "/etc/consul.d/ca.pem"
  cert_file  = "/etc/consul.d/client.pem"
  key_file   = "/etc/consul.d/client-key.pem"
  auth       = "nomad:s3cret"
}
client {
  enabled = true
  servers = ["127.0.0.1:4647"]
}
"#,
        )
        .unwrap();
        let flags = Flags {
            config: vec![file],
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        let config = load(&flags, no_dev).unwrap().config;
        let transport = &config.consul.transport;
        assert!(transport.ssl && !transport.verify_ssl);
        assert_eq!(
            (
                transport.ca_file.as_str(),
                transport.cert_file.as_str(),
                transport.key_file.as_str()
            ),
            (
                "/etc/consul.d/ca.pem",
                "/etc/consul.d/client.pem",
                "/etc/consul.d/client-key.pem"
            )
        );
        assert_eq!(transport.auth.as_deref(), Some("nomad:s3cret"));
        assert_eq!(config.consul.for_client().transport, *transport);
        assert_eq!(config.validate(), Ok(vec![]));
    }

    #[test]
    fn a_consul_certificate_without_its_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("consul.hcl");
        std::fs::write(
            &file,
            "consul {\n  address = \"127.0.0.1:8501\"\n  cert_file = \"/c.pem\"\n}\nserver {\n  enabled = true\n}\n",
        )
        .unwrap();
        let flags = Flags {
            config: vec![file],
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        let config = load(&flags, no_dev).unwrap().config;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "consul: cert_file is set but key_file is not; both are needed"
        );
    }

    #[test]
    fn raft_multiplier_scales_the_raft_timings_within_nomads_range() {
        let load_with = |multiplier: &str| server_timing(&format!("raft_multiplier = {multiplier}"));
        let base = drover_core::config::ServerTiming::default();
        let scaled = load_with("5").unwrap();
        assert_eq!(scaled.raft_heartbeat, base.raft_heartbeat * 5);
        assert_eq!(scaled.raft_failure_timeout, base.raft_failure_timeout * 5);
        assert_eq!(scaled.raft_election_timeout_max, base.raft_election_timeout_max * 5);
        assert_eq!(load_with("0").unwrap(), base);
        assert_eq!(
            load_with("11").unwrap_err().to_string(),
            "raft_multiplier cannot be 11. Must be between 1 and 10"
        );
    }

    #[test]
    fn job_limits_are_the_defaults_unless_set_and_refused_out_of_range() {
        let load_with = |extra: &str| server_config(extra).map(|server| server.job_limits);
        let defaults = drover_core::jobspec::limits::JobLimits::default();
        assert_eq!(load_with("").unwrap(), defaults);
        let raised = load_with(
            "job_max_group_count = 20000\n  job_max_count = 100000\n  job_max_groups = 5\n  job_max_group_tasks = 7",
        )
        .unwrap();
        assert_eq!(
            (raised.group_count, raised.job_count, raised.groups, raised.tasks),
            (20_000, 100_000, 5, 7)
        );
        assert_eq!(
            load_with("job_max_group_count = 0").unwrap_err().to_string(),
            "server.job_max_group_count = 0: it must be between 1 and 1000000"
        );
        assert!(load_with("job_max_count = 9000000000").is_err());
    }

    #[test]
    fn raft_snapshot_threshold_is_nomads_8192_unless_set() {
        let load_with = |extra: &str| server_timing(extra).map(|timing| timing.snapshot_threshold);
        assert_eq!(load_with("").unwrap(), 8192);
        assert_eq!(load_with("raft_snapshot_threshold = 100").unwrap(), 100);
        assert_eq!(
            load_with("raft_snapshot_threshold = 0").unwrap_err().to_string(),
            "raft_snapshot_threshold must be positive, not 0"
        );
    }

    #[test]
    fn raft_snapshot_interval_is_nomads_120s_unless_set() {
        let load_with = |extra: &str| server_timing(extra).map(|timing| timing.snapshot_interval);
        assert_eq!(load_with("").unwrap(), Duration::from_secs(120));
        assert_eq!(
            load_with("raft_snapshot_interval = \"30s\"").unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            load_with("raft_snapshot_interval = \"0s\"").unwrap_err().to_string(),
            "raft_snapshot_interval must be positive, not \"0s\""
        );
        assert!(
            load_with("raft_snapshot_interval = \"often\"")
                .unwrap_err()
                .to_string()
                .starts_with("invalid raft_snapshot_interval \"often\"")
        );
    }

    #[test]
    fn the_autopilot_block_sets_the_leaders_defaults_and_bad_durations_are_named() {
        let (config, notes) = from_text(
            "server { enabled = true }\nautopilot {\n  cleanup_dead_servers = false\n  \
             server_stabilization_time = \"30s\"\n  last_contact_threshold = \"500ms\"\n  min_quorum = 3\n}\n",
        )
        .unwrap();
        assert!(notes.iter().all(|note| !note.contains("autopilot")), "{notes:?}");
        let autopilot = config.server.autopilot;
        assert!(!autopilot.cleanup_dead_servers);
        assert_eq!(autopilot.server_stabilization_time, Duration::from_secs(30));
        assert_eq!(autopilot.last_contact_threshold, Duration::from_millis(500));
        assert_eq!((autopilot.min_quorum, autopilot.max_trailing_logs), (3, 250));
        let (config, _) = from_text(
            "server {\n  job_gc_interval = \"1m\"\n  eval_gc_threshold = \"10m\"\n  node_gc_threshold = \"48h\"\n}\n",
        )
        .unwrap();
        let gc = config.server.timing.core_gc;
        assert_eq!(gc.interval, Duration::from_secs(60));
        assert_eq!(gc.thresholds.eval, Duration::from_secs(600));
        assert_eq!(gc.thresholds.node, Duration::from_secs(48 * 3_600));
        assert_eq!(
            gc.thresholds.job,
            Duration::from_secs(4 * 3_600),
            "Nomad's default stays"
        );
        let error = from_text("server { job_gc_threshold = \"0s\" }\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "server.job_gc_threshold = \"0s\": it must be greater than zero"
        );
        let error = from_text("autopilot { server_stabilization_time = \"soon\" }\n").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("invalid autopilot.server_stabilization_time \"soon\""),
            "{error}"
        );
    }

    #[test]
    fn flags_override_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.hcl");
        std::fs::write(
            &file,
            "region = \"a\"\nserver {\n  enabled = true\n  bootstrap_expect = 5\n}\n",
        )
        .unwrap();
        let flags = Flags {
            config: vec![dir.path().to_path_buf()],
            bootstrap_expect: Some(3),
            region: Some("b".into()),
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        let config = load(&flags, no_dev).unwrap().config;
        assert_eq!((config.region.as_str(), config.server.bootstrap_expect), ("b", 3));
    }

    #[test]
    fn a_client_block_names_its_servers_and_host_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.hcl");
        std::fs::write(
            &file,
            r#"
client {
  enabled = true
  servers = ["127.0.0.1", "127.0.0.2:5647", "[::1]"]
  host_volume "certs" {
    path      = "/etc/ssl/certs"
    read_only = true
  }
  host_volume "data" {
    path = "/srv/data"
  }
}
"#,
        )
        .unwrap();
        let flags = Flags {
            config: vec![file.clone()],
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        let config = load(&flags, no_dev).unwrap().config;
        assert_eq!(
            config.client.servers,
            ["127.0.0.1:4647", "127.0.0.2:5647", "[::1]:4647"]
        );
        assert_eq!(config.client.host_volumes["certs"].path, "/etc/ssl/certs");
        assert!(config.client.host_volumes["certs"].read_only);
        assert!(!config.client.host_volumes["data"].read_only);
        assert_eq!(config.validate(), Ok(vec![]));

        // The flag wins, comma lists and repeats alike.
        let flags = Flags {
            config: vec![file],
            data_dir: Some("/d".into()),
            servers: vec!["10.0.0.1,10.0.0.2:4000".into(), "10.0.0.3".into()],
            ..Flags::default()
        };
        let config = load(&flags, no_dev).unwrap().config;
        assert_eq!(
            config.client.servers,
            ["10.0.0.1:4647", "10.0.0.2:4000", "10.0.0.3:4647"]
        );

        let flags = Flags {
            client: true,
            data_dir: Some("/d".into()),
            servers: vec!["no such host!".into()],
            ..Flags::default()
        };
        let error = load(&flags, no_dev).unwrap_err().to_string();
        assert_eq!(error, "invalid -servers address \"no such host!\"");
    }

    #[test]
    fn raw_exec_is_off_unless_enabled_and_on_in_dev_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.hcl");
        std::fs::write(
            &file,
            r#"
client {
  enabled    = true
  servers    = ["127.0.0.1"]
  node_class = "gpu"
  max_kill_timeout = "2m"
  meta {
    rack = "r7"
  }
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
plugin "docker" {
  config {
    endpoint         = "unix:///run/engine.sock"
    allow_privileged = true
    volumes {
      enabled = true
    }
    gc {
      image_delay = "10m"
    }
  }
}
plugin "mock_driver" {
  config {
    enabled = true
  }
}
"#,
        )
        .unwrap();
        let plain = Flags {
            client: true,
            data_dir: Some("/d".into()),
            servers: vec!["127.0.0.1".into()],
            ..Flags::default()
        };
        assert!(!load(&plain, no_dev).unwrap().config.client.raw_exec_enabled);
        assert!(!load(&plain, no_dev).unwrap().config.client.mock_driver_enabled);
        let dev = Flags {
            dev: true,
            ..Flags::default()
        };
        assert!(
            load(&dev, || Ok("/tmp/dev".into()))
                .unwrap()
                .config
                .client
                .raw_exec_enabled
        );
        let flags = Flags {
            config: vec![file],
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        let loaded = load(&flags, no_dev).unwrap();
        assert!(loaded.config.client.raw_exec_enabled);
        assert!(
            loaded.config.client.mock_driver_enabled,
            "the scripted driver, only when asked"
        );
        assert_eq!(loaded.config.client.node_class, "gpu");
        assert_eq!(loaded.config.client.max_kill_timeout, Some(Duration::from_secs(120)));
        assert_eq!(loaded.config.client.meta["rack"], "r7");
        let docker = &loaded.config.client.docker;
        assert_eq!(docker.endpoint, "unix:///run/engine.sock");
        assert!(docker.allow_privileged && docker.volumes_enabled && docker.gc_image);
        assert_eq!(docker.image_delay, Duration::from_secs(600));
        assert!(loaded.notes[0].starts_with("the HTTP API listens on 0.0.0.0:4646 with ACLs disabled"));
        assert_eq!(loaded.notes.len(), 1);
    }

    #[test]
    fn the_limits_block_is_read_and_bad_values_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("limits.hcl");
        std::fs::write(
            &file,
            "bind_addr = \"127.0.0.1\"\nlimits {\n  http_max_conns_per_client = 7\n  rpc_max_conns_per_client = 9\n}\n",
        )
        .unwrap();
        let flags = Flags {
            config: vec![file.clone()],
            data_dir: Some("/d".into()),
            server: true,
            ..Flags::default()
        };
        let loaded = load(&flags, no_dev).unwrap();
        assert_eq!(loaded.http_limits.max_conns_per_client, 7);
        assert_eq!(loaded.rpc_max_conns_per_client, 9);
        assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
        std::fs::write(
            &file,
            "bind_addr = \"127.0.0.1\"\nlimits {\n  rpc_handshake_timeout = \"3s\"\n  https_handshake_timeout = \"0\"\n}\n",
        )
        .unwrap();
        let loaded = load(&flags, no_dev).unwrap();
        assert_eq!(loaded.rpc_handshake_timeout, Duration::from_secs(3));
        assert_eq!(loaded.http_limits.handshake_timeout, Duration::ZERO);
        assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
        std::fs::write(&file, "limits {\n  http_max_conns_per_client = -1\n}\n").unwrap();
        let error = format!("{:#}", load(&flags, no_dev).unwrap_err());
        assert!(error.ends_with("http_max_conns_per_client must be >= 0"), "{error}");
    }

    #[test]
    fn defaults_are_nomads_ports() {
        let flags = Flags {
            dev: true,
            ..Flags::default()
        };
        let config = load(&flags, || Ok("/tmp/dev".into())).unwrap().config;
        assert_eq!(
            (config.ports.http, config.ports.rpc, config.ports.serf),
            (4646, 4647, 4648)
        );
        assert_eq!(config.server.bootstrap_expect, 1);
        assert_eq!(config.data_dir.as_deref(), Some("/tmp/dev"));
        assert_eq!(config.validate(), Ok(vec![]));
    }

    #[test]
    fn bad_values_are_named() {
        let error = parse_text("server { bootstrap_expect = \"three\" }")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("three") || error.contains("u32") || error.contains("invalid type"),
            "{error}"
        );
        let error = parse_duration("retry_interval", "soon").unwrap_err().to_string();
        assert_eq!(
            error,
            "invalid retry_interval \"soon\": time: invalid duration \"soon\"; expected a duration such as \"30s\""
        );
        let flags = Flags {
            bind: Some("not-an-ip".into()),
            server: true,
            data_dir: Some("/d".into()),
            ..Flags::default()
        };
        let error = load(&flags, no_dev).unwrap_err().to_string();
        assert_eq!(error, "invalid -bind \"not-an-ip\": expected an IP address");
    }

    #[test]
    fn client_ports_settings_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let load_text = |text: &str| {
            let file = dir.path().join("client.hcl");
            std::fs::write(&file, text).unwrap();
            let flags = Flags {
                config: vec![file],
                data_dir: Some("/d".into()),
                ..Flags::default()
            };
            load(&flags, no_dev).map(|loaded| loaded.config.client)
        };
        let client = load_text(
            r#"
client {
  enabled           = true
  servers           = ["127.0.0.1"]
  network_interface = "lo"
  min_dynamic_port  = 25000
  max_dynamic_port  = 26000
  reserved {
    reserved_ports = "22,8500-8502"
  }
}
"#,
        )
        .unwrap();
        assert_eq!(client.network_interface, "lo");
        assert_eq!((client.min_dynamic_port, client.max_dynamic_port), (25000, 26000));
        assert_eq!(client.reserved_ports, [22, 8500, 8501, 8502].into());
        let error = |text: &str| load_text(text).unwrap_err().to_string();
        assert!(
            error(r#"client { network_interface = "nope0" }"#)
                .starts_with("client.network_interface \"nope0\": no such interface with an address (this host has: ")
        );
        assert_eq!(
            error("client {\n min_dynamic_port = 30000\n max_dynamic_port = 29000\n}"),
            "client.min_dynamic_port (30000) must be less than client.max_dynamic_port (29000)"
        );
        assert_eq!(
            error("client { max_dynamic_port = 70000 }"),
            "client.max_dynamic_port must be between 1 and 65535, got 70000"
        );
        assert_eq!(
            error("client {\n reserved {\n reserved_ports = \"22,ssh\"\n }\n}"),
            "client.reserved.reserved_ports: invalid port \"ssh\" in port range \"22,ssh\""
        );
    }
}
