//! The client's host directory layout (§1.2, the post-1.3 shape), and the check that an id is
//! safe to become a path component.
//!
//! ```text
//! <alloc_dir>/<alloc>/alloc/logs/                  task stdout/stderr
//! <alloc_dir>/<alloc>/<task>/                      task working dir
//! <state_dir>/csi/plugins/<plugin alloc>/csi.sock  plugin socket dir -> mount_dir
//! <state_dir>/csi/<type>/<plugin>/                 plugin root -> stage_publish_base_dir
//!     staging/<namespace>/<volume>/<usage>/
//!     per-alloc/<alloc>/<volume>/<usage>/
//! ```
//!
//! Every staging and target path exists in two scopes with the same suffix: the host scope
//! (mkdir, mount checks, bind mounts into consumers) and the plugin scope (inside the plugin
//! task, sent in every CSI RPC) — seed 002, Nomad #7086.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::structs::CsiPluginType;

pub const CSI_SOCKET_NAME: &str = "csi.sock";

/// Rejects ids that would escape or confuse a directory layout.
pub fn check_component(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if id == "." || id == ".." || id.contains('/') || id.contains('\\') || id.contains('\0') {
        return Err(format!("invalid {what} {id:?}: not usable as a path component"));
    }
    Ok(())
}

pub fn join(base: &str, rest: &str) -> String {
    let base = base.trim_end_matches('/');
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        return base.to_string();
    }
    format!("{base}/{rest}")
}

/// Consul's gRPC socket, relative to the allocation's shared directory (`/alloc` in a task).
pub const CONSUL_GRPC_SOCKET: &str = "tmp/consul_grpc.sock";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientPaths {
    pub state_dir: String,
    pub alloc_dir: String,
}

impl ClientPaths {
    pub fn new(state_dir: impl Into<String>, alloc_dir: impl Into<String>) -> Self {
        ClientPaths {
            state_dir: state_dir.into(),
            alloc_dir: alloc_dir.into(),
        }
    }

    pub fn alloc(&self, alloc_id: &str) -> String {
        join(&self.alloc_dir, alloc_id)
    }

    pub fn log_dir(&self, alloc_id: &str) -> String {
        join(&self.alloc(alloc_id), "alloc/logs")
    }

    /// The directory every task of the allocation shares (`NOMAD_ALLOC_DIR`, `/alloc` inside).
    pub fn alloc_shared_dir(&self, alloc_id: &str) -> String {
        join(&self.alloc(alloc_id), "alloc")
    }

    /// Consul's gRPC API inside the allocation (`alloc/tmp/consul_grpc.sock`, as Nomad's).
    pub fn consul_grpc_socket(&self, alloc_id: &str) -> String {
        join(&self.alloc_shared_dir(alloc_id), CONSUL_GRPC_SOCKET)
    }

    pub fn task_dir(&self, alloc_id: &str, task: &str) -> String {
        join(&self.alloc(alloc_id), task)
    }

    /// Where a plugin task's socket lives; short on purpose (unix socket paths ≤ 108 bytes).
    pub fn plugin_socket_dir(&self, plugin_alloc_id: &str) -> String {
        join(&self.state_dir, &format!("csi/plugins/{plugin_alloc_id}"))
    }

    pub fn plugin_socket(&self, plugin_alloc_id: &str) -> String {
        join(&self.plugin_socket_dir(plugin_alloc_id), CSI_SOCKET_NAME)
    }

    pub fn plugin_root(&self, plugin_type: CsiPluginType, plugin_id: &str) -> String {
        let kind = match plugin_type {
            CsiPluginType::Controller => "controller",
            CsiPluginType::Node => "node",
            CsiPluginType::Monolith => "monolith",
        };
        join(&self.state_dir, &format!("csi/{kind}/{plugin_id}"))
    }
}

pub fn staging_suffix(namespace: &str, volume_id: &str, usage: &str) -> String {
    format!("staging/{namespace}/{volume_id}/{usage}")
}

pub fn target_suffix(alloc_id: &str, volume_id: &str, usage: &str) -> String {
    format!("per-alloc/{alloc_id}/{volume_id}/{usage}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_escape_are_rejected() {
        assert!(check_component("volume ID", "vol[0]").is_ok());
        assert!(check_component("volume ID", "").is_err());
        for bad in ["..", ".", "a/b", "../x", "a\0b"] {
            assert!(check_component("volume ID", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn layout() {
        let paths = ClientPaths::new("/s/", "/a");
        assert_eq!(paths.plugin_socket("p1"), "/s/csi/plugins/p1/csi.sock");
        assert_eq!(paths.plugin_root(CsiPluginType::Node, "hp"), "/s/csi/node/hp");
        assert_eq!(paths.log_dir("a1"), "/a/a1/alloc/logs");
        assert_eq!(paths.alloc_shared_dir("a1"), "/a/a1/alloc");
        assert_eq!(join("/local/csi/", "/per-alloc/x"), "/local/csi/per-alloc/x");
    }
}
