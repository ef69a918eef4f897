//! A [`ContainerSpec`] as the Engine API's create request, and the Engine's errors as the
//! client's typed ones.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, DeviceMapping, HealthConfig, HostConfig, HostConfigLogConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountTmpfsOptions, MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig,
    PortBinding, ResourcesUlimits,
};
use drover_core::client::IoError;
use drover_core::client::container_spec::{ContainerSpec, MountKind};
use drover_io_real::containers::{EngineError, EngineFailure};

/// The request that creates `spec`'s container (API 1.41: dockerd 20.10 and podman 4).
pub fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
    let mut exposed = Vec::new();
    for port in &spec.ports {
        // Both protocols, as Nomad publishes them.
        for proto in ["tcp", "udp"] {
            let key = format!("{}/{proto}", port.container_port);
            exposed.push(key.clone());
            port_bindings
                .entry(key)
                .or_default()
                .get_or_insert_with(Vec::new)
                .push(PortBinding {
                    host_ip: Some(port.host_ip.clone()).filter(|ip| !ip.is_empty()),
                    host_port: Some(port.host_port.to_string()),
                });
        }
    }
    let mounts = spec
        .mounts
        .iter()
        .map(|mount| Mount {
            target: Some(mount.target.clone()),
            source: Some(mount.source.clone()).filter(|source| !source.is_empty()),
            typ: Some(match mount.kind {
                MountKind::Bind => MountType::BIND,
                MountKind::Volume => MountType::VOLUME,
                MountKind::Tmpfs => MountType::TMPFS,
            }),
            read_only: Some(mount.readonly),
            bind_options: (mount.kind == MountKind::Bind).then(|| MountBindOptions {
                propagation: Some(propagation(&mount.propagation)),
                ..MountBindOptions::default()
            }),
            tmpfs_options: (mount.kind == MountKind::Tmpfs
                && (mount.options.tmpfs_size.is_some() || mount.options.tmpfs_mode.is_some()))
            .then(|| MountTmpfsOptions {
                size_bytes: mount.options.tmpfs_size,
                mode: mount.options.tmpfs_mode,
                ..MountTmpfsOptions::default()
            }),
            volume_options: (mount.kind == MountKind::Volume).then(|| MountVolumeOptions {
                no_copy: mount.options.volume_no_copy.then_some(true),
                labels: (!mount.options.volume_labels.is_empty())
                    .then(|| mount.options.volume_labels.clone().into_iter().collect()),
                driver_config: mount.options.volume_driver.as_ref().map(|(name, options)| {
                    MountVolumeOptionsDriverConfig {
                        name: Some(name.clone()).filter(|name| !name.is_empty()),
                        options: (!options.is_empty()).then(|| options.clone().into_iter().collect()),
                    }
                }),
                ..MountVolumeOptions::default()
            }),
            ..Mount::default()
        })
        .collect::<Vec<_>>();
    let some_vec = |items: &[String]| (!items.is_empty()).then(|| items.to_vec());
    let some_text = |text: &str| Some(text.to_string()).filter(|text| !text.is_empty());
    let host_config = HostConfig {
        binds: Some(spec.binds.clone()),
        mounts: (!mounts.is_empty()).then_some(mounts),
        network_mode: Some(spec.network_mode.clone()).filter(|mode| !mode.is_empty()),
        port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
        memory: Some(spec.memory_bytes).filter(|bytes| *bytes > 0),
        // No swap beyond the limit, as Nomad sets it.
        memory_swap: Some(spec.memory_bytes).filter(|bytes| *bytes > 0),
        memory_reservation: Some(spec.memory_reservation_bytes).filter(|bytes| *bytes > 0),
        cpu_shares: Some(spec.cpu_shares),
        privileged: Some(spec.privileged),
        cap_add: some_vec(&spec.cap_add),
        cap_drop: some_vec(&spec.cap_drop),
        devices: (!spec.devices.is_empty()).then(|| {
            spec.devices
                .iter()
                .map(|device| DeviceMapping {
                    path_on_host: Some(device.host_path.clone()),
                    path_in_container: Some(device.container_path.clone()),
                    cgroup_permissions: Some(device.permissions.clone()),
                })
                .collect()
        }),
        dns: some_vec(&spec.dns_servers),
        dns_search: some_vec(&spec.dns_search),
        dns_options: some_vec(&spec.dns_options),
        extra_hosts: some_vec(&spec.extra_hosts),
        init: spec.init.then_some(true),
        shm_size: spec.shm_size,
        ulimits: (!spec.ulimits.is_empty()).then(|| {
            spec.ulimits
                .iter()
                .map(|ulimit| ResourcesUlimits {
                    name: Some(ulimit.name.clone()),
                    soft: Some(ulimit.soft),
                    hard: Some(ulimit.hard),
                })
                .collect()
        }),
        sysctls: (!spec.sysctls.is_empty()).then(|| spec.sysctls.clone().into_iter().collect()),
        cpuset_cpus: some_text(&spec.cpuset_cpus),
        cpu_period: spec.cpu_period,
        cpu_quota: spec.cpu_quota,
        pids_limit: spec.pids_limit,
        readonly_rootfs: spec.readonly_rootfs.then_some(true),
        security_opt: some_vec(&spec.security_opt),
        group_add: some_vec(&spec.group_add),
        ipc_mode: some_text(&spec.ipc_mode),
        pid_mode: some_text(&spec.pid_mode),
        uts_mode: some_text(&spec.uts_mode),
        userns_mode: some_text(&spec.userns_mode),
        storage_opt: (!spec.storage_opt.is_empty()).then(|| spec.storage_opt.clone().into_iter().collect()),
        log_config: spec.log_driver.as_ref().map(|(kind, options)| HostConfigLogConfig {
            typ: Some(kind.clone()),
            config: Some(options.clone().into_iter().collect()),
        }),
        volume_driver: some_text(&spec.volume_driver),
        ..HostConfig::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: some_vec(&spec.entrypoint),
        cmd: some_vec(&spec.cmd),
        working_dir: Some(spec.working_dir.clone()).filter(|dir| !dir.is_empty()),
        env: Some(spec.env.clone()),
        labels: Some(spec.labels.clone().into_iter().collect()),
        hostname: Some(spec.hostname.clone()).filter(|name| !name.is_empty()),
        tty: Some(spec.tty),
        open_stdin: Some(spec.open_stdin),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(host_config),
        healthcheck: spec.healthcheck_disabled.then(|| HealthConfig {
            test: Some(vec!["NONE".to_string()]),
            ..HealthConfig::default()
        }),
        ..ContainerCreateBody::default()
    }
}

fn propagation(text: &str) -> MountBindOptionsPropagationEnum {
    match text {
        "private" => MountBindOptionsPropagationEnum::PRIVATE,
        "shared" => MountBindOptionsPropagationEnum::SHARED,
        "rshared" => MountBindOptionsPropagationEnum::RSHARED,
        "slave" => MountBindOptionsPropagationEnum::SLAVE,
        "rslave" => MountBindOptionsPropagationEnum::RSLAVE,
        _ => MountBindOptionsPropagationEnum::RPRIVATE,
    }
}

/// The Engine's status code, when it answered at all.
pub fn status(error: &bollard::errors::Error) -> Option<u16> {
    match error {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether the Engine said there is no such container or image.
pub fn not_found(error: &bollard::errors::Error) -> bool {
    status(error) == Some(404)
}

/// Whether the Engine could not be reached or did not answer in time (as opposed to refusing).
pub fn unreachable(error: &bollard::errors::Error) -> bool {
    use bollard::errors::Error;
    matches!(
        error,
        Error::RequestTimeoutError
            | Error::IOError { .. }
            | Error::HyperResponseError { .. }
            | Error::HyperLegacyError { .. }
            | Error::SocketNotFoundError(_)
    )
}

/// The Engine's failure as the driver's typed one.
pub fn engine_error(error: &bollard::errors::Error) -> EngineError {
    let kind = match status(error) {
        Some(404) => EngineFailure::NotFound,
        Some(409) => EngineFailure::Conflict,
        Some(304) => EngineFailure::NotModified,
        Some(401) | Some(403) => EngineFailure::Unauthorized,
        Some(code) => EngineFailure::Failed(Some(code)),
        None if matches!(error, bollard::errors::Error::RequestTimeoutError) => EngineFailure::TimedOut,
        None if unreachable(error) => EngineFailure::Unreachable,
        None => EngineFailure::Failed(None),
    };
    EngineError::new(kind, said(error))
}

/// The client's error for a failed Engine call: what was being done, and what the Engine said.
pub fn io_error(doing: &str, error: &bollard::errors::Error) -> IoError {
    engine_error(error).io_error(doing)
}

/// What the Engine said, without bollard's wrapping; the error itself when it said nothing.
pub fn said(error: &bollard::errors::Error) -> String {
    match error {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use drover_core::client::container_spec::{ContainerMount, PublishedPort};

    use super::*;

    #[test]
    fn a_port_is_published_on_both_protocols_and_a_bind_keeps_its_propagation() {
        let spec = ContainerSpec {
            image: "busybox".into(),
            ports: vec![PublishedPort {
                label: "http".into(),
                host_ip: "127.0.0.1".into(),
                host_port: 20001,
                container_port: 8080,
            }],
            mounts: vec![ContainerMount {
                kind: MountKind::Bind,
                source: "/srv/csi".into(),
                target: "/csi".into(),
                readonly: false,
                propagation: "rshared".into(),
                options: Default::default(),
            }],
            cpu_shares: 100,
            ..ContainerSpec::default()
        };
        let body = serde_json::to_value(create_body(&spec)).unwrap();
        let host = &body["HostConfig"];
        assert_eq!(host["PortBindings"]["8080/tcp"][0]["HostPort"], "20001");
        assert_eq!(host["PortBindings"]["8080/udp"][0]["HostIp"], "127.0.0.1");
        assert!(body["ExposedPorts"]["8080/tcp"].is_object());
        assert_eq!(host["Mounts"][0]["BindOptions"]["Propagation"], "rshared");
        assert!(host.get("Memory").is_none(), "no limit asked for, none sent");
    }
}
