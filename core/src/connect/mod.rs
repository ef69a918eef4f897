//! Consul Connect in jobs: the `connect` block of a group `service` (a sidecar proxy, or a
//! Connect-native task), its validation with Nomad's texts, and the job mutator that injects
//! the sidecar task `connect-proxy-<service>` (Nomad's `jobConnectHook`), so the job the API
//! returns shows the task as Nomad's does.
//!
//! Nomad requires bridge networking for sidecars; Drover runs a sidecar group in host mode
//! too (the proxy's port is a dynamic host port, the sidecar container on the host's
//! network), or in bridge mode for a group of containers. The service identity tokens the
//! proxies use are derived by the servers (`Node.DeriveSIToken`, 0.10.4–1.8 design).

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod envoy_version;
mod transport;
pub use transport::ConsulTransport;

use crate::structs::{
    ConfigValue, Constraint, Job, LIFECYCLE_PRESTART, Port, Service, Task, TaskGroup, TaskLifecycle, TaskResources,
};

/// Prefix of the injected sidecar task's name and kind (`connect-proxy-web`,
/// `connect-proxy:web`), and of its dynamic port's label.
pub const CONNECT_PROXY_PREFIX: &str = "connect-proxy";
/// Prefix of a Connect-native task's kind.
pub const CONNECT_NATIVE_PREFIX: &str = "connect-native";
/// Where the envoy bootstrap hook writes the proxy's configuration (Nomad's
/// `EnvoyBootstrapPath`).
pub const ENVOY_BOOTSTRAP_PATH: &str = "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json";
/// The image the injected sidecar runs, resolved from the client's `meta` (by default
/// Envoy's image at the version Consul prefers: [`envoy_version`]).
pub const SIDECAR_IMAGE: &str = "${meta.connect.sidecar_image}";

/// A Consul service identity token the leader created for a task, by its accessor (Nomad's
/// `SITokenAccessor`; the secret is never stored). `orphaned`: created for a derivation that
/// failed; it is revoked like the token of a finished allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiTokenAccessor {
    pub node_id: String,
    pub alloc_id: String,
    pub accessor_id: String,
    pub task_name: String,
    pub create_index: u64,
    #[serde(default)]
    pub orphaned: bool,
}

// The `connect {}` block's data lives with the rest of the job (`structs/connect.rs`); what
// Connect does with it is here.
pub use crate::structs::{ConsulConnect, ConsulProxy, ConsulSidecarService, ConsulUpstream, SidecarTask};

/// What a client needs of Consul for Connect tasks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientConsul {
    /// The client presents a Consul ACL token (`consul { token }`): Connect tasks get service
    /// identity tokens (the `consul_si_token` hook), as Nomad's client does with ACLs on.
    pub acl: bool,
    /// Consul's HTTP address (`consul { address }`), for `consul connect envoy -http-addr`.
    pub http_addr: String,
    /// Consul's gRPC address (`consul { grpc_address }`), for `-grpc-addr`.
    pub grpc_addr: String,
    /// The `consul` CLI to run.
    pub binary: String,
    /// TLS and basic auth for Consul's HTTP API, handed to `consul connect envoy`.
    #[serde(default)]
    pub transport: ConsulTransport,
}

/// The kind of the sidecar of `service` (`connect-proxy:<service>`).
pub fn proxy_kind(service: &str) -> String {
    format!("{CONNECT_PROXY_PREFIX}:{service}")
}

/// The service a task proxies, when it is a Connect sidecar.
pub fn proxied_service(task: &Task) -> Option<&str> {
    task.kind.strip_prefix(CONNECT_PROXY_PREFIX)?.strip_prefix(':')
}

/// Whether the task takes part in Connect (a sidecar proxy or a native task): the tasks a
/// service identity token is derived for.
pub fn is_connect_task(task: &Task) -> bool {
    proxied_service(task).is_some() || task.kind.starts_with(&format!("{CONNECT_NATIVE_PREFIX}:"))
}

/// Whether any group service uses Connect.
pub fn group_uses_connect(group: &TaskGroup) -> bool {
    group.services.iter().any(|service| service.connect.is_some())
}

/// Nomad's `jobConnectHook.Mutate`: for each group service with a sidecar, the sidecar task
/// (unless one is there already) with the `sidecar_task` overrides, and the proxy's dynamic
/// port; for a native service, its task's kind. Groups without a network are left for
/// validation to name. The only error: a native service whose task is ambiguous or missing.
pub fn mutate(job: &mut Job) -> Result<(), String> {
    for group in &mut job.task_groups {
        if group.networks.is_empty() {
            continue;
        }
        let services = group.services.clone();
        for (position, service) in services.iter().enumerate() {
            let Some(connect) = &service.connect else { continue };
            if connect.has_sidecar() {
                inject_sidecar(group, service, connect);
            } else if connect.native {
                let task = native_task(group, &service.name, &service.task_name)?;
                let name = group.tasks[task].name.clone();
                group.tasks[task].kind = format!("{CONNECT_NATIVE_PREFIX}:{}", service.name);
                group.services[position].task_name = name;
            }
        }
    }
    Ok(())
}

fn inject_sidecar(group: &mut TaskGroup, service: &Service, connect: &ConsulConnect) {
    let kind = proxy_kind(&service.name);
    let position = match group.tasks.iter().position(|task| task.kind == kind) {
        Some(position) => position,
        None => {
            let mut task = sidecar_task(&service.name);
            if group.networks[0].mode != "bridge" {
                // Envoy listens on the proxy's host port and binds its admin API on the
                // host's loopback, so the container shares the host's network.
                task.config
                    .insert("network_mode".into(), ConfigValue::String("host".into()));
            }
            if group.tasks.iter().any(|other| other.name == task.name) {
                // Nomad appends a random fragment; a stable one keeps a re-registration of the
                // same job the same version.
                task.name = format!("{}-{}", task.name, short_hash(&service.name));
            }
            group.tasks.push(task);
            group.tasks.len() - 1
        }
    };
    if let Some(overrides) = &connect.sidecar_task {
        overrides.merge_into(&mut group.tasks[position]);
    }
    let label = format!("{CONNECT_PROXY_PREFIX}-{}", service.name);
    let network = &mut group.networks[0];
    if !network.ports().any(|port| port.label == label) {
        network.dynamic_ports.push(Port {
            label,
            value: 0,
            to: -1,
            host_network: String::new(),
        });
    }
}

/// Nomad's `newConnectSidecarTask`.
fn sidecar_task(service: &str) -> Task {
    let args = [
        "-c",
        ENVOY_BOOTSTRAP_PATH,
        "-l",
        "${meta.connect.log_level}",
        "--concurrency",
        "${meta.connect.proxy_concurrency}",
        "--disable-hot-restart",
    ];
    let mut config = BTreeMap::new();
    config.insert("image".to_string(), ConfigValue::String(SIDECAR_IMAGE.into()));
    config.insert(
        "args".to_string(),
        ConfigValue::List(args.iter().map(|arg| ConfigValue::String((*arg).into())).collect()),
    );
    Task {
        name: format!("{CONNECT_PROXY_PREFIX}-{service}"),
        kind: proxy_kind(service),
        driver: "docker".into(),
        config,
        resources: TaskResources {
            cpu: 250,
            memory_mb: 128,
            ..TaskResources::default()
        },
        constraints: vec![Constraint {
            ltarget: "${attr.consul.version}".into(),
            rtarget: ">= 1.6.0-beta1".into(),
            operand: "semver".into(),
        }],
        lifecycle: Some(TaskLifecycle {
            hook: LIFECYCLE_PRESTART.into(),
            sidecar: true,
        }),
        ..Task::default()
    }
}

/// Nomad's `getNamedTaskForNativeService`: the named task, or the group's only task.
fn native_task(group: &TaskGroup, service: &str, task_name: &str) -> Result<usize, String> {
    if task_name.is_empty() {
        if group.tasks.len() == 1 {
            return Ok(0);
        }
        return Err(format!(
            "task for Consul Connect Native service {}->{service} is ambiguous and must be set",
            group.name
        ));
    }
    group
        .tasks
        .iter()
        .position(|task| task.name == task_name)
        .ok_or_else(|| {
            format!(
                "task {task_name} named by Consul Connect Native service {}->{service} does not exist",
                group.name
            )
        })
}

/// Nomad's `groupConnectValidate` (sidecar half; bridge networking is not required here, see
/// the module doc), plus the port a sidecar forwards to.
pub fn validate_group(group: &TaskGroup) -> Vec<String> {
    let mut errors = Vec::new();
    for service in &group.services {
        let Some(connect) = &service.connect else { continue };
        if connect.has_sidecar() {
            if group.networks.len() != 1 {
                errors.push(format!(
                    "Consul Connect sidecars require exactly 1 network, found {} in group {:?}",
                    group.networks.len(),
                    group.name
                ));
            }
            if service.port_label.is_empty() {
                errors.push(format!(
                    "Consul Connect sidecar service {:?} requires a port label",
                    service.name
                ));
            }
            for check in &service.checks {
                if check.check_type == "tcp" {
                    errors.push(format!(
                        "Check {} invalid: tcp checks are not valid for Connect enabled services",
                        check.name
                    ));
                }
            }
        }
        if connect.native && service.task_name.is_empty() {
            errors.push(format!(
                "Service {} is Connect Native and requires setting the task",
                service.name
            ));
        }
    }
    errors
}

/// Six hex digits derived from `text` (FNV-1a), stable across runs.
fn short_hash(text: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in text.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{:06x}", hash & 0x00ff_ffff)
}

#[cfg(test)]
mod tests;
