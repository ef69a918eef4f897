//! The client's `plugin "docker" { config { … } }`: what an operator allows docker tasks on
//! this node (Nomad's docker `configSpec`, the keys users set).

use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;

use serde::{Deserialize, Serialize};

/// The capabilities Docker gives a container unless told otherwise.
pub const DOCKER_DEFAULT_CAPS: &[&str] = &[
    "audit_write",
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "mknod",
    "net_bind_service",
    "net_raw",
    "setfcap",
    "setgid",
    "setpcap",
    "setuid",
    "sys_chroot",
];

/// Nomad's default `gc { image_delay }`.
pub const IMAGE_DELAY: Duration = Duration::from_secs(3 * 60);

/// Nomad's default `dangling_containers { period }`.
pub const ORPHAN_PERIOD: Duration = Duration::from_secs(5 * 60);

/// Nomad's default `infra_image`: the pause container of a bridge-mode group.
pub const INFRA_IMAGE: &str = "registry.k8s.io/pause-amd64:3.3";

/// How long a labelled container no task knows is left alone (Nomad's `creation_grace`).
pub const CREATION_GRACE: Duration = Duration::from_secs(5 * 60);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DockerPluginConfig {
    /// `endpoint`: the Engine's socket (`unix:///path`); empty: `DOCKER_HOST`, else
    /// `unix:///var/run/docker.sock`.
    pub endpoint: String,
    /// `allow_privileged`: whether a task may ask for `privileged = true` (Nomad: off).
    pub allow_privileged: bool,
    /// `volumes { enabled }`: whether tasks may bind host paths outside their allocation
    /// directory, or use named volumes (Nomad: off).
    pub volumes_enabled: bool,
    /// `allow_caps`: the capabilities a task may keep or add (lower case, `all` for any).
    pub allow_caps: Vec<String>,
    /// `gc { image }`: remove an image once no task has used it for `image_delay`.
    pub gc_image: bool,
    pub image_delay: Duration,
    /// `gc { dangling_containers { enabled } }`: remove labelled containers no task owns.
    pub gc_containers: bool,
    /// `gc { dangling_containers { creation_grace } }`.
    pub creation_grace: Duration,
    /// `gc { dangling_containers { period } }`: how often labelled containers are looked over.
    pub orphan_period: Duration,
    /// `infra_image`: what the pause container of a bridge-mode group runs (pulled when the
    /// Engine lacks it).
    pub infra_image: String,
}

impl Default for DockerPluginConfig {
    fn default() -> Self {
        DockerPluginConfig {
            endpoint: String::new(),
            allow_privileged: false,
            volumes_enabled: false,
            // Nomad's default `allow_caps`: Docker's defaults less `net_raw`.
            allow_caps: DOCKER_DEFAULT_CAPS
                .iter()
                .filter(|cap| **cap != "net_raw")
                .map(|cap| String::from(*cap))
                .collect(),
            gc_image: true,
            image_delay: IMAGE_DELAY,
            gc_containers: true,
            creation_grace: CREATION_GRACE,
            orphan_period: ORPHAN_PERIOD,
            infra_image: INFRA_IMAGE.into(),
        }
    }
}

impl DockerPluginConfig {
    /// Whether `cap` (any case, with or without `CAP_`) may be in a container here.
    pub fn allows_cap(&self, cap: &str) -> bool {
        let cap = normal_cap(cap);
        self.allow_caps
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case("all") || normal_cap(allowed) == cap)
    }
}

/// A capability as Nomad compares them: lower case, without `cap_`.
pub fn normal_cap(cap: &str) -> String {
    let lower = cap.trim().to_ascii_lowercase();
    match lower.strip_prefix("cap_") {
        Some(rest) => String::from(rest),
        None => lower,
    }
}
