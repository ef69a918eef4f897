//! The container a docker task gets (Nomad's `createContainerConfig`), decided here so that
//! the real engine and the simulated one start the same container and every refusal is typed
//! and tested: the task's directories bound where Nomad binds them, its `volumes` and `mount`
//! blocks checked against what the client allows, its group ports published, its resources as
//! limits, its capabilities checked against `allow_caps`. The driver only translates a
//! [`ContainerSpec`] into the Engine API's request.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::fmt;

use super::TaskConfig;
use super::containers::{LABEL_ALLOC_ID, LABEL_CLIENT, LABEL_TASK_NAME};
use crate::driverspec::docker::{CPU_CFS_PERIOD, DockerMount, DockerTaskConfig, MAX_CPU_CFS_PERIOD};
use crate::driverspec::docker_plugin::{DOCKER_DEFAULT_CAPS, DockerPluginConfig, normal_cap};
use crate::structs::Propagation;

/// Docker refuses fewer CPU shares than this.
const MIN_CPU_SHARES: i64 = 2;

/// The kernel's smallest CFS quota (µs).
const MIN_CPU_QUOTA: i64 = 1_000;

/// Everything the engine is asked for, in the order the engine is told it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// `<task>-<alloc id>`, as Nomad names its containers.
    pub name: String,
    pub image: String,
    /// Empty: the image's own.
    pub entrypoint: Vec<String>,
    /// `command` and `args`; empty: the image's own.
    pub cmd: Vec<String>,
    pub working_dir: String,
    /// `NAME=value`, by name.
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub hostname: String,
    pub tty: bool,
    pub open_stdin: bool,
    /// `host:container[:mode]`: the task's directories, then its `volumes`.
    pub binds: Vec<String>,
    /// `mount` blocks, then what the client mounts for the task (CSI volumes, host volumes).
    pub mounts: Vec<ContainerMount>,
    /// Empty: the engine's default network.
    pub network_mode: String,
    pub ports: Vec<PublishedPort>,
    /// The hard memory limit, and the soft one when `memory_max` raised the hard one.
    pub memory_bytes: i64,
    pub memory_reservation_bytes: i64,
    pub cpu_shares: i64,
    pub privileged: bool,
    /// Upper case, as the engine takes them.
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub devices: Vec<ContainerDevice>,
    pub dns_servers: Vec<String>,
    pub dns_search: Vec<String>,
    pub dns_options: Vec<String>,
    pub extra_hosts: Vec<String>,
    pub init: bool,
    pub shm_size: Option<i64>,
    pub ulimits: Vec<Ulimit>,
    pub sysctls: BTreeMap<String, String>,
    /// Empty: any CPU.
    pub cpuset_cpus: String,
    /// `cpu_hard_limit`: the CFS period and quota (µs) that hold the task to its `cpu`.
    pub cpu_period: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub pids_limit: Option<i64>,
    pub readonly_rootfs: bool,
    pub security_opt: Vec<String>,
    pub group_add: Vec<String>,
    pub ipc_mode: String,
    pub pid_mode: String,
    pub uts_mode: String,
    pub userns_mode: String,
    pub storage_opt: BTreeMap<String, String>,
    /// The image's own HEALTHCHECK turned off.
    pub healthcheck_disabled: bool,
    /// The Engine's log driver and its options; `None`: the Engine's default.
    pub log_driver: Option<(String, BTreeMap<String, String>)>,
    pub volume_driver: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountKind {
    Bind,
    Volume,
    Tmpfs,
}

impl MountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MountKind::Bind => "bind",
            MountKind::Volume => "volume",
            MountKind::Tmpfs => "tmpfs",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMount {
    pub kind: MountKind,
    pub source: String,
    pub target: String,
    pub readonly: bool,
    /// `rprivate`, `rslave` or `rshared` for binds; empty otherwise.
    pub propagation: String,
    /// A tmpfs's size and mode, a named volume's options.
    pub options: MountOptions,
}

/// A tmpfs mount's mode when its `tmpfs_options` name none: world-writable and sticky, as
/// dockerd makes it (`0o1777`).
pub const DEFAULT_TMPFS_MODE: i64 = 0o1777;

/// What a `mount` block's `tmpfs_options` or `volume_options` ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountOptions {
    pub tmpfs_size: Option<i64>,
    pub tmpfs_mode: Option<i64>,
    pub volume_no_copy: bool,
    pub volume_labels: BTreeMap<String, String>,
    /// The volume driver's name and options.
    pub volume_driver: Option<(String, BTreeMap<String, String>)>,
}

/// A port of the group's network published on the host (TCP and UDP, as Nomad does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedPort {
    pub label: String,
    pub host_ip: String,
    pub host_port: u16,
    pub container_port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerDevice {
    pub host_path: String,
    pub container_path: String,
    pub permissions: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ulimit {
    pub name: String,
    pub soft: i64,
    pub hard: i64,
}

/// Why a docker task's container cannot be made as asked (Nomad's texts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerRefusal {
    NoImage,
    PrivilegedDisabled,
    /// A `volumes` entry is not `host:container[:mode]`.
    InvalidVolume {
        volume: String,
    },
    /// A host path outside the allocation directory, with `volumes` not enabled.
    HostPathNotAllowed {
        volume: String,
    },
    /// A named volume (`mount { type = "volume" }`), with `volumes` not enabled.
    VolumeNotAllowed {
        source: String,
    },
    /// A `mount` block of a type the engine does not have, or with no target.
    InvalidMount {
        target: String,
        reason: &'static str,
    },
    PortNotFound {
        label: String,
    },
    /// `port_map` with no network port to map.
    NoNetworkToMap,
    /// Capabilities asked for that `allow_caps` does not list.
    CapsNotAllowed {
        caps: Vec<String>,
    },
    InvalidUlimit {
        name: String,
        value: String,
    },
    /// `cpu_cfs_period` outside 0 to 1 s.
    InvalidCfsPeriod,
    /// `cpu_hard_limit` on a node whose CPU was not fingerprinted: no share to compute.
    NodeCpuUnknown,
    /// A key a container joining its group's network (bridge mode) cannot have: the pause
    /// container holds the hostname, DNS and hosts of the whole group.
    SharedNetworkKey {
        key: &'static str,
    },
}

impl fmt::Display for ContainerRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerRefusal::NoImage => write!(f, "image name required for docker driver"),
            ContainerRefusal::PrivilegedDisabled => {
                write!(f, "Docker privileged mode is disabled on this Nomad agent")
            }
            ContainerRefusal::InvalidVolume { volume } => {
                write!(f, "invalid docker volume {volume:?}: expected host:container[:mode]")
            }
            ContainerRefusal::HostPathNotAllowed { volume } => {
                write!(f, "volumes are not enabled; cannot mount host paths: {volume:?}")
            }
            ContainerRefusal::VolumeNotAllowed { source } => {
                write!(f, "volumes are not enabled; cannot mount volume: {source:?}")
            }
            ContainerRefusal::InvalidMount { target, reason } => {
                write!(f, "invalid mount {target:?}: {reason}")
            }
            ContainerRefusal::PortNotFound { label } => {
                write!(f, "Port {label:?} not found, check network block")
            }
            ContainerRefusal::NoNetworkToMap => {
                write!(f, "Trying to map ports but no network interface is available")
            }
            ContainerRefusal::CapsNotAllowed { caps } => write!(
                f,
                "driver does not allow the following capabilities: {}",
                caps.join(", ")
            ),
            ContainerRefusal::InvalidCfsPeriod => write!(f, "invalid value for cpu_cfs_period"),
            ContainerRefusal::NodeCpuUnknown => write!(
                f,
                "cpu_hard_limit: the node's CPU is unknown, so the task's share of it cannot be computed"
            ),
            ContainerRefusal::SharedNetworkKey { key } => write!(
                f,
                "{key} cannot be set on a task of a group with network mode \"bridge\": its tasks share \
                 the group's network"
            ),
            ContainerRefusal::InvalidUlimit { name, value } => write!(
                f,
                "failed to parse ulimit configuration: {name} = {value:?} is not \"soft\" or \"soft:hard\""
            ),
        }
    }
}

/// The container for `task` with its `docker` config read, on a client configured `plugin`.
pub fn container_spec(
    task: &TaskConfig,
    docker: &DockerTaskConfig,
    plugin: &DockerPluginConfig,
) -> Result<ContainerSpec, ContainerRefusal> {
    if docker.image.trim().is_empty() {
        return Err(ContainerRefusal::NoImage);
    }
    if docker.privileged && !plugin.allow_privileged {
        return Err(ContainerRefusal::PrivilegedDisabled);
    }
    let alloc_dir = parent(&task.task_dir);
    let mut env = task.env.clone();
    let ports = published_ports(&task.env, docker, &mut env)?;
    let (cap_add, cap_drop) = capabilities(docker, plugin)?;
    let (memory_bytes, memory_reservation_bytes) = match docker.memory_hard_limit.filter(|mb| *mb > 0) {
        // Nomad's older `memory_hard_limit`: the hard limit, `memory` the soft one.
        Some(hard_mb) => (
            hard_mb.max(i64::from(task.memory_mb)) * 1024 * 1024,
            i64::from(task.memory_mb) * 1024 * 1024,
        ),
        None => memory_limits(task.memory_mb, task.memory_max_mb),
    };

    let mut binds = vec![
        format!("{}:/alloc", join(&alloc_dir, "alloc")),
        format!("{}:/local", join(&task.task_dir, "local")),
        format!("{}:/secrets", join(&task.task_dir, "secrets")),
    ];
    for volume in &docker.volumes {
        binds.push(user_bind(volume, &task.task_dir, &alloc_dir, plugin)?);
    }
    let mut mounts = Vec::new();
    for mount in &docker.mounts {
        mounts.push(user_mount(mount, &task.task_dir, &alloc_dir, plugin)?);
    }
    // What the client mounts for the task: its CSI volumes (the published path) and host
    // volumes, bound with the propagation the job asked for.
    for mount in &task.mounts {
        mounts.push(ContainerMount {
            kind: MountKind::Bind,
            source: mount.host_path.clone(),
            target: mount.task_path.clone(),
            readonly: mount.readonly,
            propagation: unix_propagation(mount.propagation).into(),
            options: MountOptions::default(),
        });
    }

    let mut labels = docker.labels.clone();
    labels.insert(LABEL_ALLOC_ID.into(), task.alloc_id.clone());
    labels.insert(LABEL_TASK_NAME.into(), task.task.clone());
    labels.insert(LABEL_CLIENT.into(), parent(&alloc_dir));

    let mut cmd = Vec::new();
    if !docker.command.is_empty() {
        cmd.push(docker.command.clone());
    }
    cmd.extend(docker.args.iter().cloned());

    let devices = docker
        .devices
        .iter()
        .map(|device| ContainerDevice {
            host_path: device.host_path.clone(),
            container_path: device.container_path.clone(),
            permissions: device.cgroup_permissions.clone(),
        })
        .chain(task.devices.iter().map(|device| ContainerDevice {
            host_path: device.host_path.clone(),
            container_path: device.task_path.clone(),
            permissions: if device.permissions.is_empty() {
                "rwm".into()
            } else {
                device.permissions.clone()
            },
        }))
        .collect();

    let cpu_limit = if docker.cpu_hard_limit {
        Some(cpu_hard_limit(task, docker.cpu_cfs_period)?)
    } else {
        None
    };

    let mut ulimits = Vec::new();
    for (name, value) in &docker.ulimit {
        ulimits.push(ulimit(name, value)?);
    }

    let (network_mode, joined) = match &task.network {
        Some(network) if docker.network_mode.is_empty() => (format!("container:{}", network.id), true),
        _ => (docker.network_mode.clone(), false),
    };
    if joined {
        let shared = [
            ("hostname", !docker.hostname.is_empty()),
            ("dns_servers", !docker.dns_servers.is_empty()),
            ("dns_search_domains", !docker.dns_search_domains.is_empty()),
            ("dns_options", !docker.dns_options.is_empty()),
            ("extra_hosts", !docker.extra_hosts.is_empty()),
        ];
        if let Some((key, _)) = shared.into_iter().find(|(_, set)| *set) {
            return Err(ContainerRefusal::SharedNetworkKey { key });
        }
    }
    let spec = ContainerSpec {
        name: format!("{}-{}", task.task, task.alloc_id),
        image: docker.image.clone(),
        entrypoint: docker.entrypoint.clone(),
        cmd,
        working_dir: docker.work_dir.clone(),
        env: env.iter().map(|(name, value)| format!("{name}={value}")).collect(),
        labels,
        // In the group's own network (bridge mode) the pause container publishes the ports;
        // the Engine refuses them on a container joining it.
        hostname: docker.hostname.clone(),
        tty: docker.tty,
        open_stdin: docker.interactive,
        binds,
        mounts,
        network_mode,
        ports: if joined { Vec::new() } else { ports },
        memory_bytes,
        memory_reservation_bytes,
        cpu_shares: i64::from(task.cpu_mhz).max(MIN_CPU_SHARES),
        privileged: docker.privileged,
        cap_add,
        cap_drop,
        devices,
        dns_servers: docker.dns_servers.clone(),
        dns_search: docker.dns_search_domains.clone(),
        dns_options: docker.dns_options.clone(),
        extra_hosts: docker.extra_hosts.clone(),
        init: docker.init,
        shm_size: docker.shm_size,
        ulimits,
        sysctls: docker.sysctl.clone(),
        // The cores the scheduler reserved win over the job's own `cpuset_cpus`, as in Nomad.
        cpuset_cpus: if task.reserved_cores.is_empty() {
            docker.cpuset_cpus.clone()
        } else {
            crate::structs::cpuset(&task.reserved_cores)
        },
        cpu_period: cpu_limit.map(|(period, _)| period),
        cpu_quota: cpu_limit.map(|(_, quota)| quota),
        pids_limit: docker.pids_limit,
        readonly_rootfs: docker.readonly_rootfs,
        security_opt: docker.security_opt.clone(),
        group_add: docker.group_add.clone(),
        ipc_mode: docker.ipc_mode.clone(),
        pid_mode: docker.pid_mode.clone(),
        uts_mode: docker.uts_mode.clone(),
        userns_mode: docker.userns_mode.clone(),
        storage_opt: docker.storage_opt.clone(),
        healthcheck_disabled: docker.healthchecks_disabled,
        log_driver: docker.logging.clone().filter(|(kind, _)| !kind.is_empty()),
        volume_driver: docker.volume_driver.clone(),
    };
    debug_assert!(spec.binds.len() >= 3, "the task's three directories are always bound");
    debug_assert_eq!(spec.labels.get(LABEL_ALLOC_ID), Some(&task.alloc_id));
    Ok(spec)
}

/// `cpu_hard_limit`'s CFS period and quota (µs), as Nomad computes them: the task's share of
/// the node's CPU (`cpu` over the node's MHz) of every period on each of its cores, the share
/// truncated to whole µs before it is multiplied by the cores. A quota under the kernel's
/// smallest (1 ms, which Docker refuses outright) is raised to it: a small task on a large
/// node gets slightly more than its share rather than no container.
pub fn cpu_hard_limit(task: &TaskConfig, cfs_period: i64) -> Result<(i64, i64), ContainerRefusal> {
    if !(0..=MAX_CPU_CFS_PERIOD).contains(&cfs_period) {
        return Err(ContainerRefusal::InvalidCfsPeriod);
    }
    if task.node_cpu_mhz == 0 {
        return Err(ContainerRefusal::NodeCpuUnknown);
    }
    let period = if cfs_period == 0 { CPU_CFS_PERIOD } else { cfs_period };
    let share = i128::from(task.cpu_mhz) * i128::from(period) / i128::from(task.node_cpu_mhz);
    let quota = share * i128::from(task.node_cores.max(1));
    let quota = i64::try_from(quota).unwrap_or(i64::MAX).max(MIN_CPU_QUOTA);
    Ok((period, quota))
}

/// Nomad's memory limits: `memory_max` is the hard limit when set, `memory` then the soft one;
/// otherwise `memory` is the hard limit. Bytes.
pub fn memory_limits(memory_mb: u32, memory_max_mb: u32) -> (i64, i64) {
    let soft = i64::from(memory_mb) * 1024 * 1024;
    if memory_max_mb > 0 {
        (i64::from(memory_max_mb.max(memory_mb)) * 1024 * 1024, soft)
    } else {
        (soft, 0)
    }
}

/// The ports to publish: each label of `ports` from the group's network (the task's
/// `NOMAD_HOST_PORT_<label>` and `NOMAD_PORT_<label>`), or with `port_map` every port of the
/// network, mapped to the port `port_map` names inside the container (whose
/// `NOMAD_PORT_<label>` then says so, as Nomad's `SetPortMapEnvs` does).
/// The pause container of a bridge-mode allocation (Nomad's `nomad_init_<alloc id>`): the
/// network namespace its tasks join, with every port of the group published from the host
/// into it (the host port to the port the tasks bind). Labelled as the allocation's, with no
/// task, so the orphan sweep knows whose it is.
pub fn network_spec(
    alloc_id: &str,
    client: &str,
    ports: &[crate::structs::AllocatedPort],
    plugin: &DockerPluginConfig,
) -> ContainerSpec {
    ContainerSpec {
        name: format!("nomad_init_{alloc_id}"),
        image: plugin.infra_image.clone(),
        labels: BTreeMap::from([
            (LABEL_ALLOC_ID.to_string(), alloc_id.to_string()),
            (LABEL_CLIENT.to_string(), client.to_string()),
        ]),
        ports: ports
            .iter()
            .map(|port| PublishedPort {
                label: port.label.clone(),
                host_ip: port.host_ip.clone(),
                host_port: port.value,
                container_port: u16::try_from(port.task_port()).unwrap_or(port.value),
            })
            .collect(),
        // As little as a pause process needs.
        memory_bytes: 0,
        cpu_shares: MIN_CPU_SHARES,
        ..ContainerSpec::default()
    }
}

fn published_ports(
    task_env: &BTreeMap<String, String>,
    docker: &DockerTaskConfig,
    env: &mut BTreeMap<String, String>,
) -> Result<Vec<PublishedPort>, ContainerRefusal> {
    let host_port = |label: &str| -> Option<u16> { task_env.get(&format!("NOMAD_HOST_PORT_{label}"))?.parse().ok() };
    let host_ip = |label: &str| {
        task_env
            .get(&format!("NOMAD_HOST_IP_{label}"))
            .cloned()
            .unwrap_or_default()
    };
    let mut ports = Vec::new();
    for label in &docker.ports {
        let Some(value) = host_port(label) else {
            return Err(ContainerRefusal::PortNotFound { label: label.clone() });
        };
        let container_port = task_env
            .get(&format!("NOMAD_PORT_{label}"))
            .and_then(|port| port.parse().ok())
            .unwrap_or(value);
        ports.push(PublishedPort {
            label: label.clone(),
            host_ip: host_ip(label),
            host_port: value,
            container_port,
        });
    }
    if docker.port_map.is_empty() || !docker.ports.is_empty() {
        return Ok(ports);
    }
    let labels: Vec<String> = task_env
        .keys()
        .filter_map(|name| name.strip_prefix("NOMAD_HOST_PORT_"))
        .map(String::from)
        .collect();
    if labels.is_empty() {
        return Err(ContainerRefusal::NoNetworkToMap);
    }
    if let Some(label) = docker.port_map.keys().find(|label| !labels.contains(label)) {
        return Err(ContainerRefusal::PortNotFound { label: label.clone() });
    }
    for label in labels {
        let Some(value) = host_port(&label) else {
            continue;
        };
        let container_port = docker
            .port_map
            .get(&label)
            .and_then(|port| u16::try_from(*port).ok())
            .unwrap_or(value);
        env.insert(format!("NOMAD_PORT_{label}"), container_port.to_string());
        ports.push(PublishedPort {
            host_ip: host_ip(&label),
            label,
            host_port: value,
            container_port,
        });
    }
    Ok(ports)
}

/// `cap_add` and `cap_drop` as the engine takes them: every capability the container would
/// hold (Docker's defaults plus `cap_add`, less `cap_drop`) must be in `allow_caps`; Docker's
/// defaults that are not (`net_raw`, by Nomad's default) are dropped. `privileged` holds every
/// capability and is allowed or not on its own.
fn capabilities(
    docker: &DockerTaskConfig,
    plugin: &DockerPluginConfig,
) -> Result<(Vec<String>, Vec<String>), ContainerRefusal> {
    let upper = |cap: &str| normal_cap(cap).to_ascii_uppercase();
    let drops_all = docker.cap_drop.iter().any(|cap| normal_cap(cap) == "all");
    let mut missing: Vec<String> = docker
        .cap_add
        .iter()
        .filter(|cap| !plugin.allows_cap(cap))
        .map(|cap| normal_cap(cap))
        .collect();
    missing.sort();
    missing.dedup();
    if !missing.is_empty() && !docker.privileged {
        return Err(ContainerRefusal::CapsNotAllowed { caps: missing });
    }
    let cap_add: Vec<String> = docker.cap_add.iter().map(|cap| upper(cap)).collect();
    let mut cap_drop: Vec<String> = docker.cap_drop.iter().map(|cap| upper(cap)).collect();
    if !drops_all && !docker.privileged {
        for cap in DOCKER_DEFAULT_CAPS {
            let dropped = docker.cap_drop.iter().any(|dropped| normal_cap(dropped) == *cap);
            let added = docker.cap_add.iter().any(|added| normal_cap(added) == *cap);
            if !plugin.allows_cap(cap) && !dropped && !added {
                cap_drop.push(cap.to_ascii_uppercase());
            }
        }
    }
    Ok((cap_add, cap_drop))
}

/// One `volumes` entry: a relative host path is the task directory's; a host path outside the
/// allocation directory needs `volumes { enabled = true }`.
fn user_bind(
    volume: &str,
    task_dir: &str,
    alloc_dir: &str,
    plugin: &DockerPluginConfig,
) -> Result<String, ContainerRefusal> {
    let parts: Vec<&str> = volume.split(':').collect();
    if parts.len() < 2 || parts.len() > 3 || parts[0].is_empty() || parts[1].is_empty() {
        return Err(ContainerRefusal::InvalidVolume { volume: volume.into() });
    }
    let source = host_path(parts[0], task_dir);
    if !plugin.volumes_enabled && !is_within(&source, alloc_dir) {
        return Err(ContainerRefusal::HostPathNotAllowed { volume: volume.into() });
    }
    let mut bind = format!("{source}:{}", parts[1]);
    if let Some(mode) = parts.get(2) {
        bind.push(':');
        bind.push_str(mode);
    }
    Ok(bind)
}

fn user_mount(
    mount: &DockerMount,
    task_dir: &str,
    alloc_dir: &str,
    plugin: &DockerPluginConfig,
) -> Result<ContainerMount, ContainerRefusal> {
    if mount.target.is_empty() {
        return Err(ContainerRefusal::InvalidMount {
            target: String::new(),
            reason: "a mount needs a target",
        });
    }
    let kind = match mount.mount_type.as_str() {
        "bind" => MountKind::Bind,
        "volume" | "" => MountKind::Volume,
        "tmpfs" => MountKind::Tmpfs,
        _ => {
            return Err(ContainerRefusal::InvalidMount {
                target: mount.target.clone(),
                reason: "type must be \"bind\", \"volume\" or \"tmpfs\"",
            });
        }
    };
    let source = match kind {
        MountKind::Bind => {
            let source = host_path(&mount.source, task_dir);
            if !plugin.volumes_enabled && !is_within(&source, alloc_dir) {
                return Err(ContainerRefusal::HostPathNotAllowed {
                    volume: format!("{}:{}", mount.source, mount.target),
                });
            }
            source
        }
        MountKind::Volume => {
            if !plugin.volumes_enabled {
                return Err(ContainerRefusal::VolumeNotAllowed {
                    source: mount.source.clone(),
                });
            }
            mount.source.clone()
        }
        MountKind::Tmpfs => String::new(),
    };
    let propagation = match kind {
        MountKind::Bind if mount.propagation.is_empty() => "rprivate".into(),
        MountKind::Bind => mount.propagation.clone(),
        _ => String::new(),
    };
    let tmpfs_asked = mount.tmpfs_size.is_some() || mount.tmpfs_mode.is_some();
    let volume_asked = mount.volume_no_copy || !mount.volume_labels.is_empty() || mount.volume_driver.is_some();
    if tmpfs_asked && kind != MountKind::Tmpfs {
        return Err(ContainerRefusal::InvalidMount {
            target: mount.target.clone(),
            reason: "tmpfs_options apply to a tmpfs mount only",
        });
    }
    if volume_asked && kind != MountKind::Volume {
        return Err(ContainerRefusal::InvalidMount {
            target: mount.target.clone(),
            reason: "volume_options apply to a volume mount only",
        });
    }
    Ok(ContainerMount {
        kind,
        source,
        target: mount.target.clone(),
        readonly: mount.readonly,
        propagation,
        options: MountOptions {
            tmpfs_size: mount.tmpfs_size,
            // Said even when the job does not: dockerd's default, which podman's compatible API
            // does not apply (an unset mode makes the tmpfs mode 000 there).
            tmpfs_mode: mount
                .tmpfs_mode
                .or((kind == MountKind::Tmpfs).then_some(DEFAULT_TMPFS_MODE)),
            volume_no_copy: mount.volume_no_copy,
            volume_labels: mount.volume_labels.clone(),
            volume_driver: mount.volume_driver.clone(),
        },
    })
}

/// `soft` or `soft:hard`.
fn ulimit(name: &str, value: &str) -> Result<Ulimit, ContainerRefusal> {
    let refuse = || ContainerRefusal::InvalidUlimit {
        name: name.into(),
        value: value.into(),
    };
    let mut parts = value.split(':');
    let soft: i64 = parts
        .next()
        .and_then(|soft| soft.trim().parse().ok())
        .ok_or_else(refuse)?;
    let hard: i64 = match parts.next() {
        Some(hard) => hard.trim().parse().map_err(|_| refuse())?,
        None => soft,
    };
    if parts.next().is_some() || soft > hard {
        return Err(refuse());
    }
    Ok(Ulimit {
        name: name.into(),
        soft,
        hard,
    })
}

fn unix_propagation(propagation: Propagation) -> &'static str {
    match propagation {
        Propagation::Private => "rprivate",
        Propagation::HostToTask => "rslave",
        Propagation::Bidirectional => "rshared",
    }
}

/// What a client's containers carry as [`LABEL_CLIENT`]: its allocation root, as the task
/// directories under it name it.
pub fn client_label(alloc_root: &str) -> String {
    clean(alloc_root)
}

/// A host path as the engine gets it: relative ones from the task directory, `.` and `..`
/// resolved (lexically: the engine resolves links itself, inside the container's namespace).
fn host_path(path: &str, task_dir: &str) -> String {
    if path.starts_with('/') {
        clean(path)
    } else {
        clean(&join(task_dir, path))
    }
}

fn join(dir: &str, path: &str) -> String {
    format!("{}/{}", dir.trim_end_matches('/'), path)
}

fn parent(path: &str) -> String {
    let cleaned = clean(path);
    match cleaned.rfind('/') {
        Some(0) | None => "/".into(),
        Some(at) => cleaned[..at].into(),
    }
}

/// `/a/./b/../c` → `/a/c`; never above `/`.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

fn is_within(path: &str, dir: &str) -> bool {
    let dir = clean(dir);
    path == dir || path.starts_with(&format!("{}/", dir.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_lexically_and_never_climb_above_the_root() {
        assert_eq!(clean("/a/./b/../c/"), "/a/c");
        assert_eq!(clean("/../../etc"), "/etc");
        assert_eq!(host_path("../../../../../etc", "/data/alloc/a1/web"), "/etc");
        assert_eq!(
            host_path("local/conf", "/data/alloc/a1/web"),
            "/data/alloc/a1/web/local/conf"
        );
        assert_eq!(parent("/data/alloc/a1/web"), "/data/alloc/a1");
        assert!(is_within("/data/alloc/a1/alloc/x", "/data/alloc/a1"));
        assert!(!is_within("/data/alloc/a10", "/data/alloc/a1"));
    }

    #[test]
    fn memory_max_makes_memory_the_soft_limit() {
        assert_eq!(memory_limits(256, 0), (256 << 20, 0));
        assert_eq!(memory_limits(256, 512), (512 << 20, 256 << 20));
    }

    #[test]
    fn ulimits_read_soft_and_hard() {
        assert_eq!(ulimit("nofile", "1024:2048").unwrap().hard, 2048);
        assert_eq!(ulimit("nproc", "64").unwrap().soft, 64);
        assert!(ulimit("nofile", "2048:1024").is_err());
        assert!(ulimit("nofile", "many").is_err());
    }
}
