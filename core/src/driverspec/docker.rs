//! The `docker` driver's task config: every key Nomad's docker driver takes (its
//! `taskConfigSpec`), so that Nomad's job files pass unchanged and a misspelt key is named.

use super::Field;
use super::Shape::{Block, Blocks, Bool, Duration, Number, NumberMap, String, StringMap, Strings};

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
    Field::optional("advertise_ipv6_address", Bool),
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
    Field::optional("ipv4_address", String),
    Field::optional("ipv6_address", String),
    Field::optional("isolation", String),
    Field::optional("labels", StringMap),
    Field::optional("load", String),
    Field::optional("logging", Block(LOGGING)),
    Field::optional("mac_address", String),
    Field::optional("memory_hard_limit", Number),
    // `mount` is the repeated block; `mounts` the pre-1.0 list of objects.
    Field::optional("mount", Blocks(MOUNT)),
    Field::optional("mounts", Blocks(MOUNT)),
    Field::optional("network_aliases", Strings),
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

#[cfg(test)]
mod tests {
    use alloc::collections::{BTreeMap, BTreeSet};

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
}
