//! The `docker` driver's task config: every key Nomad's docker driver takes (its
//! `taskConfigSpec`), so that Nomad's job files pass unchanged and a misspelt key is named.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::Shape::{Block, Blocks, Bool, Duration, Number, NumberMap, String, StringMap, Strings};
use super::{ConfigProblem, Field};
use crate::structs::ConfigValue;

const AUTH: &[Field] = &[
    Field::optional("username", String),
    Field::optional("password", String),
    Field::optional("email", String),
    Field::optional("server_address", String),
];

const DEVICE: &[Field] = &[
    Field::optional("host_path", String),
    Field::optional("container_path", String),
    Field::optional("cgroup_permissions", String),
];

const HEALTHCHECKS: &[Field] = &[Field::optional("disable", Bool)];

const LOGGING: &[Field] = &[
    Field::optional("type", String),
    Field::optional("driver", String),
    Field::optional("config", StringMap),
];

const BIND_OPTIONS: &[Field] = &[Field::optional("propagation", String)];

const TMPFS_OPTIONS: &[Field] = &[Field::optional("size", Number), Field::optional("mode", Number)];

const VOLUME_DRIVER_CONFIG: &[Field] = &[Field::optional("name", String), Field::optional("options", StringMap)];

const VOLUME_OPTIONS: &[Field] = &[
    Field::optional("no_copy", Bool),
    Field::optional("labels", StringMap),
    Field::optional("driver_config", Block(VOLUME_DRIVER_CONFIG)),
];

/// A `mount` block: a bind, a named volume or a tmpfs.
const MOUNT: &[Field] = &[
    Field::optional("type", String),
    Field::optional("target", String),
    Field::optional("source", String),
    Field::optional("readonly", Bool),
    Field::optional("bind_options", Block(BIND_OPTIONS)),
    Field::optional("tmpfs_options", Block(TMPFS_OPTIONS)),
    Field::optional("volume_options", Block(VOLUME_OPTIONS)),
];

/// The task config, in Nomad's order of its spec (alphabetical but for a few).
pub const FIELDS: &[Field] = &[
    Field::required("image", String),
    Field::unsupported(
        "advertise_ipv6_address",
        Bool,
        "user-defined networks are not managed by Drover's docker driver",
    ),
    Field::optional("args", Strings),
    Field::optional("auth", Block(AUTH)),
    Field::optional("auth_soft_fail", Bool),
    Field::optional("cap_add", Strings),
    Field::optional("cap_drop", Strings),
    Field::optional("command", String),
    Field::optional("cpuset_cpus", String),
    Field::optional("cpu_hard_limit", Bool),
    Field::optional("cpu_cfs_period", Number),
    Field::optional("devices", Blocks(DEVICE)),
    Field::optional("dns_search_domains", Strings),
    Field::optional("dns_options", Strings),
    Field::optional("dns_servers", Strings),
    Field::optional("entrypoint", Strings),
    Field::optional("extra_hosts", Strings),
    Field::optional("force_pull", Bool),
    Field::optional("group_add", Strings),
    Field::optional("healthchecks", Block(HEALTHCHECKS)),
    Field::optional("hostname", String),
    Field::optional("init", Bool),
    Field::optional("interactive", Bool),
    Field::optional("ipc_mode", String),
    Field::unsupported(
        "ipv4_address",
        String,
        "user-defined networks are not managed by Drover's docker driver",
    ),
    Field::unsupported(
        "ipv6_address",
        String,
        "user-defined networks are not managed by Drover's docker driver",
    ),
    Field::unsupported(
        "isolation",
        String,
        "Windows isolation modes; Linux containers have none",
    ),
    Field::optional("labels", StringMap),
    Field::optional("load", String),
    Field::optional("logging", Block(LOGGING)),
    Field::unsupported(
        "mac_address",
        String,
        "a fixed MAC address is not passed to the Engine yet",
    ),
    Field::optional("memory_hard_limit", Number),
    // `mount` is the repeated block; `mounts` the pre-1.0 list of objects.
    Field::optional("mount", Blocks(MOUNT)),
    Field::optional("mounts", Blocks(MOUNT)),
    Field::unsupported(
        "network_aliases",
        Strings,
        "user-defined networks are not managed by Drover's docker driver",
    ),
    Field::optional("network_mode", String),
    Field::optional("runtime", String),
    Field::optional("pids_limit", Number),
    Field::optional("pid_mode", String),
    Field::optional("ports", Strings),
    Field::optional("port_map", NumberMap),
    Field::optional("privileged", Bool),
    Field::optional("image_pull_timeout", Duration),
    Field::optional("readonly_rootfs", Bool),
    Field::optional("security_opt", Strings),
    Field::optional("shm_size", Number),
    Field::optional("storage_opt", StringMap),
    Field::optional("sysctl", StringMap),
    Field::optional("tty", Bool),
    Field::optional("ulimit", StringMap),
    Field::optional("uts_mode", String),
    Field::optional("userns_mode", String),
    Field::optional("volumes", Strings),
    Field::optional("volume_driver", String),
    Field::optional("work_dir", String),
];

/// A docker task's config as the driver uses it, read once the client has interpolated it
/// (`taskenv`): every value has its type by then. Defaults are Nomad's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerTaskConfig {
    pub image: alloc::string::String,
    pub command: alloc::string::String,
    pub args: Vec<alloc::string::String>,
    pub entrypoint: Vec<alloc::string::String>,
    pub work_dir: alloc::string::String,
    /// Port labels of the group's `network` to publish.
    pub ports: Vec<alloc::string::String>,
    /// The older `port_map`: label to the port inside the container.
    pub port_map: BTreeMap<alloc::string::String, i64>,
    /// `host:container[:ro]` binds, relative hosts paths taken from the task dir.
    pub volumes: Vec<alloc::string::String>,
    pub mounts: Vec<DockerMount>,
    pub privileged: bool,
    pub cap_add: Vec<alloc::string::String>,
    pub cap_drop: Vec<alloc::string::String>,
    pub network_mode: alloc::string::String,
    pub labels: BTreeMap<alloc::string::String, alloc::string::String>,
    pub hostname: alloc::string::String,
    pub dns_servers: Vec<alloc::string::String>,
    pub dns_search_domains: Vec<alloc::string::String>,
    pub dns_options: Vec<alloc::string::String>,
    pub extra_hosts: Vec<alloc::string::String>,
    pub devices: Vec<DockerDevice>,
    pub init: bool,
    pub tty: bool,
    pub interactive: bool,
    /// Bytes of `/dev/shm` (the engine's default when unset).
    pub shm_size: Option<i64>,
    pub ulimit: BTreeMap<alloc::string::String, alloc::string::String>,
    pub sysctl: BTreeMap<alloc::string::String, alloc::string::String>,
    pub force_pull: bool,
    /// How long a pull may take (Nomad's default 5 minutes).
    pub image_pull_timeout: core::time::Duration,
    /// Registry credentials: passed to the engine, never logged.
    pub auth: Option<DockerAuth>,
    /// CPUs the container may run on (`0-3`, `1,3`).
    pub cpuset_cpus: alloc::string::String,
    /// The task's `cpu` as a CFS quota: it may use no more than its share of the node.
    pub cpu_hard_limit: bool,
    /// The CFS period of that quota in µs (0: [`CPU_CFS_PERIOD`]).
    pub cpu_cfs_period: i64,
    pub pids_limit: Option<i64>,
    pub readonly_rootfs: bool,
    pub security_opt: Vec<alloc::string::String>,
    pub group_add: Vec<alloc::string::String>,
    pub ipc_mode: alloc::string::String,
    pub pid_mode: alloc::string::String,
    pub uts_mode: alloc::string::String,
    pub userns_mode: alloc::string::String,
    pub storage_opt: BTreeMap<alloc::string::String, alloc::string::String>,
    /// MB: the hard memory limit, `memory` then the soft one (Nomad's older `memory_max`).
    pub memory_hard_limit: Option<i64>,
    /// `healthchecks { disable = true }`: the image's own HEALTHCHECK is turned off.
    pub healthchecks_disabled: bool,
    /// `logging { type config }`: the Engine's log driver and its options (`driver` is the
    /// older name of `type`).
    pub logging: Option<(
        alloc::string::String,
        BTreeMap<alloc::string::String, alloc::string::String>,
    )>,
    pub volume_driver: alloc::string::String,
}

/// A `mount` block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerMount {
    /// `bind`, `volume` (the default) or `tmpfs`.
    pub mount_type: alloc::string::String,
    pub target: alloc::string::String,
    pub source: alloc::string::String,
    pub readonly: bool,
    pub propagation: alloc::string::String,
    /// `tmpfs_options { size mode }`: bytes, and the mode as a number (`0o1777` = 1023).
    pub tmpfs_size: Option<i64>,
    pub tmpfs_mode: Option<i64>,
    /// `volume_options`: the named volume's `no_copy`, `labels` and `driver_config`.
    pub volume_no_copy: bool,
    pub volume_labels: BTreeMap<alloc::string::String, alloc::string::String>,
    pub volume_driver: Option<(
        alloc::string::String,
        BTreeMap<alloc::string::String, alloc::string::String>,
    )>,
}

/// A `devices` block: a host device made visible in the container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerDevice {
    pub host_path: alloc::string::String,
    /// The host path when empty (as Docker's CLI does).
    pub container_path: alloc::string::String,
    /// `rwm` when empty.
    pub cgroup_permissions: alloc::string::String,
}

/// Registry credentials from a task's `auth` block (`Debug` redacts the password).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerAuth {
    pub username: alloc::string::String,
    pub password: crate::structs::SecretText,
    pub email: alloc::string::String,
    pub server_address: alloc::string::String,
}

/// The CFS period of a `cpu_hard_limit` quota when `cpu_cfs_period` names none (µs; the
/// kernel's default, and Nomad's).
pub const CPU_CFS_PERIOD: i64 = 100_000;

/// The longest `cpu_cfs_period` the kernel takes (µs).
pub const MAX_CPU_CFS_PERIOD: i64 = 1_000_000;

/// Values the types alone do not refuse: a `cpu_cfs_period` outside 0 to 1 s (Nomad's text).
pub fn check_values(config: &BTreeMap<alloc::string::String, ConfigValue>, problems: &mut Vec<ConfigProblem>) {
    if let Some(period) = config.get("cpu_cfs_period").and_then(ConfigValue::as_int)
        && !(0..=MAX_CPU_CFS_PERIOD).contains(&period)
    {
        problems.push(ConfigProblem::Invalid {
            path: "cpu_cfs_period".into(),
            message: "invalid value for cpu_cfs_period",
        });
    }
}

/// Nomad's default `image_pull_timeout`.
pub const IMAGE_PULL_TIMEOUT: core::time::Duration = core::time::Duration::from_secs(5 * 60);

impl DockerTaskConfig {
    /// The interpolated config as the driver takes it; the first value that does not read
    /// (one the admission check let through as `${…}` and that interpolated to the wrong type)
    /// is named as admission would have named it.
    pub fn read(config: &BTreeMap<alloc::string::String, ConfigValue>) -> Result<DockerTaskConfig, ConfigProblem> {
        let problems = super::check("docker", config);
        if let Some(problem) = problems.into_iter().next() {
            return Err(problem);
        }
        let get = |key: &str| config.get(key);
        let text = |key: &str| get(key).map(text_of).unwrap_or_default();
        let flag = |key: &str| get(key).is_some_and(truthy);
        let strings = |key: &str| get(key).map(strings_of).unwrap_or_default();
        let map = |key: &str| get(key).map(string_map).unwrap_or_default();
        let wrong = |key: &'static str, expected: &'static str| ConfigProblem::Wrong {
            path: key.into(),
            expected,
        };
        let image_pull_timeout = match get("image_pull_timeout").and_then(ConfigValue::as_str) {
            None => IMAGE_PULL_TIMEOUT,
            Some(text) => crate::goduration::parse(text).map_err(|_| wrong("image_pull_timeout", "duration"))?,
        };
        let shm_size = match get("shm_size") {
            None => None,
            Some(value) => Some(value.as_int().ok_or_else(|| wrong("shm_size", "number"))?),
        };
        let mut port_map = BTreeMap::new();
        for block in get("port_map")
            .map(super::maps)
            .unwrap_or_default()
            .into_iter()
            .flatten()
        {
            for (label, port) in block {
                port_map.insert(
                    label.clone(),
                    port.as_int().ok_or_else(|| wrong("port_map", "map of number"))?,
                );
            }
        }
        let blocks = |key: &str| get(key).and_then(super::maps).unwrap_or_default();
        let mounts = blocks("mount")
            .into_iter()
            .chain(blocks("mounts"))
            .map(|block| {
                let field = |key: &str| block.get(key).map(text_of).unwrap_or_default();
                let propagation = block
                    .get("bind_options")
                    .and_then(super::maps)
                    .and_then(|options| {
                        options
                            .first()
                            .and_then(|options| options.get("propagation"))
                            .map(text_of)
                    })
                    .unwrap_or_default();
                let mount_type = field("type");
                let options = |key: &str| {
                    block
                        .get(key)
                        .and_then(super::maps)
                        .and_then(|blocks| blocks.first().cloned())
                };
                let tmpfs = options("tmpfs_options");
                let tmpfs_number = |key: &str| {
                    tmpfs
                        .as_ref()
                        .and_then(|tmpfs| tmpfs.get(key))
                        .and_then(ConfigValue::as_int)
                };
                let volume = options("volume_options");
                let driver = volume
                    .as_ref()
                    .and_then(|volume| volume.get("driver_config"))
                    .and_then(super::maps)
                    .and_then(|blocks| blocks.first().cloned())
                    .map(|driver| {
                        (
                            driver.get("name").map(text_of).unwrap_or_default(),
                            driver.get("options").map(string_map).unwrap_or_default(),
                        )
                    });
                DockerMount {
                    tmpfs_size: tmpfs_number("size"),
                    tmpfs_mode: tmpfs_number("mode"),
                    volume_no_copy: volume
                        .as_ref()
                        .and_then(|volume| volume.get("no_copy"))
                        .is_some_and(truthy),
                    volume_labels: volume
                        .as_ref()
                        .and_then(|volume| volume.get("labels"))
                        .map(string_map)
                        .unwrap_or_default(),
                    volume_driver: driver,
                    mount_type: if mount_type.is_empty() {
                        "volume".into()
                    } else {
                        mount_type
                    },
                    target: field("target"),
                    source: field("source"),
                    readonly: block.get("readonly").is_some_and(truthy),
                    propagation,
                }
            })
            .collect();
        let devices = blocks("devices")
            .into_iter()
            .map(|block| {
                let field = |key: &str| block.get(key).map(text_of).unwrap_or_default();
                let host_path = field("host_path");
                let container_path = field("container_path");
                let permissions = field("cgroup_permissions");
                DockerDevice {
                    container_path: if container_path.is_empty() {
                        host_path.clone()
                    } else {
                        container_path
                    },
                    host_path,
                    cgroup_permissions: if permissions.is_empty() {
                        "rwm".into()
                    } else {
                        permissions
                    },
                }
            })
            .collect();
        let auth = blocks("auth").first().map(|block| {
            let field = |key: &str| block.get(key).map(text_of).unwrap_or_default();
            DockerAuth {
                username: field("username"),
                password: crate::structs::SecretText(field("password")),
                email: field("email"),
                server_address: field("server_address"),
            }
        });
        let number = |key: &'static str| -> Result<Option<i64>, ConfigProblem> {
            match get(key) {
                None => Ok(None),
                Some(value) => value.as_int().map(Some).ok_or_else(|| wrong(key, "number")),
            }
        };
        let logging = blocks("logging").first().map(|block| {
            let field = |key: &str| block.get(key).map(text_of).unwrap_or_default();
            let kind = match field("type") {
                kind if kind.is_empty() => field("driver"),
                kind => kind,
            };
            let options = block.get("config").map(string_map).unwrap_or_default();
            (kind, options)
        });
        let healthchecks_disabled = blocks("healthchecks")
            .first()
            .is_some_and(|block| block.get("disable").is_some_and(truthy));
        Ok(DockerTaskConfig {
            cpuset_cpus: text("cpuset_cpus"),
            cpu_hard_limit: flag("cpu_hard_limit"),
            cpu_cfs_period: number("cpu_cfs_period")?.unwrap_or(0),
            pids_limit: number("pids_limit")?,
            readonly_rootfs: flag("readonly_rootfs"),
            security_opt: strings("security_opt"),
            group_add: strings("group_add"),
            ipc_mode: text("ipc_mode"),
            pid_mode: text("pid_mode"),
            uts_mode: text("uts_mode"),
            userns_mode: text("userns_mode"),
            storage_opt: map("storage_opt"),
            memory_hard_limit: number("memory_hard_limit")?,
            healthchecks_disabled,
            logging,
            volume_driver: text("volume_driver"),
            image: text("image"),
            command: text("command"),
            args: strings("args"),
            entrypoint: strings("entrypoint"),
            work_dir: text("work_dir"),
            ports: strings("ports"),
            port_map,
            volumes: strings("volumes"),
            mounts,
            privileged: flag("privileged"),
            cap_add: strings("cap_add"),
            cap_drop: strings("cap_drop"),
            network_mode: text("network_mode"),
            labels: map("labels"),
            hostname: text("hostname"),
            dns_servers: strings("dns_servers"),
            dns_search_domains: strings("dns_search_domains"),
            dns_options: strings("dns_options"),
            extra_hosts: strings("extra_hosts"),
            devices,
            init: flag("init"),
            tty: flag("tty"),
            interactive: flag("interactive"),
            shm_size,
            ulimit: map("ulimit"),
            sysctl: map("sysctl"),
            force_pull: flag("force_pull"),
            image_pull_timeout,
            auth,
        })
    }
}

/// A bool, or a string HCL converts to `true`.
fn truthy(value: &ConfigValue) -> bool {
    value.as_bool().unwrap_or(value.as_str() == Some("true"))
}

/// A scalar as text (HCL converts numbers and bools to strings).
fn text_of(value: &ConfigValue) -> alloc::string::String {
    match value {
        ConfigValue::String(text) => text.clone(),
        ConfigValue::Int(number) => alloc::format!("{number}"),
        ConfigValue::Bool(flag) => alloc::format!("{flag}"),
        ConfigValue::List(_) | ConfigValue::Map(_) => alloc::string::String::new(),
    }
}

fn strings_of(value: &ConfigValue) -> Vec<alloc::string::String> {
    match value {
        ConfigValue::List(items) => items.iter().map(text_of).collect(),
        _ => Vec::new(),
    }
}

/// A map, or the maps of the older block syntax merged in order.
fn string_map(value: &ConfigValue) -> BTreeMap<alloc::string::String, alloc::string::String> {
    super::maps(value)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|map| map.iter().map(|(key, value)| (key.clone(), text_of(value))))
        .collect()
}

#[cfg(test)]
mod tests {
    use alloc::collections::BTreeSet;
    use alloc::string::ToString;

    use super::*;

    #[test]
    fn every_key_is_named_once() {
        fn unique(fields: &[Field]) {
            let names: BTreeSet<&str> = fields.iter().map(|field| field.name).collect();
            assert_eq!(names.len(), fields.len());
            for field in fields {
                if let Block(inner) | Blocks(inner) = field.shape {
                    unique(inner);
                }
            }
        }
        unique(FIELDS);
        assert_eq!(FIELDS.len(), 55);
        assert!(super::super::check("docker", &BTreeMap::new()).len() == 1);
    }

    fn config(json: &str) -> BTreeMap<alloc::string::String, ConfigValue> {
        fn value(json: &serde_json::Value) -> ConfigValue {
            match json {
                serde_json::Value::Bool(flag) => ConfigValue::Bool(*flag),
                serde_json::Value::Number(number) => ConfigValue::Int(number.as_i64().unwrap()),
                serde_json::Value::String(text) => ConfigValue::String(text.clone()),
                serde_json::Value::Array(items) => ConfigValue::List(items.iter().map(value).collect()),
                serde_json::Value::Object(map) => {
                    ConfigValue::Map(map.iter().map(|(key, item)| (key.clone(), value(item))).collect())
                }
                serde_json::Value::Null => unreachable!(),
            }
        }
        match value(&serde_json::from_str(json).unwrap()) {
            ConfigValue::Map(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_config_reads_with_nomads_defaults() {
        let read = DockerTaskConfig::read(&config(r#"{"image": "busybox:1"}"#)).unwrap();
        assert_eq!(read.image, "busybox:1");
        assert_eq!(read.image_pull_timeout, IMAGE_PULL_TIMEOUT);
        assert_eq!(read.shm_size, None);
        assert!(!read.privileged && read.auth.is_none() && read.mounts.is_empty());
    }

    #[test]
    fn every_kind_of_value_reads_as_the_driver_uses_it() {
        let read = DockerTaskConfig::read(&config(
            r#"{"image": "web:2", "args": ["-p", 8080], "privileged": "true", "shm_size": "1024",
                "port_map": [{"http": 80}, {"admin": 9000}], "labels": [{"team": "a"}, {"tier": "web"}],
                "image_pull_timeout": "90s",
                "mount": [{"type": "bind", "source": "local/conf", "target": "/etc/app", "readonly": true,
                           "bind_options": {"propagation": "rshared"}}, {"target": "/cache"}],
                "devices": [{"host_path": "/dev/fuse"}],
                "auth": {"username": "u", "password": "hunter2"}}"#,
        ))
        .unwrap();
        assert_eq!(read.args, ["-p", "8080"]);
        assert!(read.privileged);
        assert_eq!(read.shm_size, Some(1024));
        assert_eq!(
            read.port_map,
            BTreeMap::from([("admin".to_string(), 9000), ("http".to_string(), 80)])
        );
        assert_eq!(read.labels.len(), 2);
        assert_eq!(read.image_pull_timeout, core::time::Duration::from_secs(90));
        assert_eq!(read.mounts[0].propagation, "rshared");
        assert!(read.mounts[0].readonly);
        assert_eq!(read.mounts[1].mount_type, "volume");
        assert_eq!(read.devices[0].container_path, "/dev/fuse");
        assert_eq!(read.devices[0].cgroup_permissions, "rwm");
        let auth = read.auth.unwrap();
        assert_eq!(auth.password.expose(), "hunter2");
        assert!(!alloc::format!("{auth:?}").contains("hunter2"));
    }

    #[test]
    fn a_value_that_interpolated_to_the_wrong_type_is_named() {
        let refused = DockerTaskConfig::read(&config(r#"{"image": "web", "shm_size": "lots"}"#)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "config: Inappropriate value for attribute \"shm_size\": number required."
        );
    }
}
