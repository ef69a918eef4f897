//! The hook order, written once as data (§2.2 and §2.4, for the hooks this project has), and
//! what a hook hands back and persists.
//!
//! Alloc hooks, in order: `alloc_dir`, `await_previous_allocations`, `network`,
//! `consul_grpc_socket`, `csi_hook`.
//! Task hooks, in order: `validate`, `task_dir`, `volumes`, `devices`, `csi_plugin_supervisor`
//! (the last only for tasks with a `csi_plugin` stanza). Both Nomad 0.11 and today's Nomad
//! keep this relative order.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::client::{DeviceConfig, MountConfig, MountInfo};
use crate::structs::Task;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AllocHook {
    AllocDir,
    AwaitPrevious,
    /// `network`: the shared network namespace of a bridge-mode group.
    Network,
    /// `consul_grpc_socket`: Consul's gRPC API as a socket in the allocation directory, for a
    /// Connect sidecar in a bridge-mode group.
    ConsulGrpcSocket,
    Csi,
}

impl AllocHook {
    pub fn name(self) -> &'static str {
        match self {
            AllocHook::AllocDir => "alloc_dir",
            AllocHook::AwaitPrevious => "await_previous_allocations",
            AllocHook::Network => "network",
            AllocHook::ConsulGrpcSocket => "consul_grpc_socket",
            AllocHook::Csi => "csi_hook",
        }
    }
}

/// Which lifecycle points an alloc hook implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocPhases {
    pub prerun: bool,
    pub postrun: bool,
    pub destroy: bool,
    pub shutdown: bool,
    pub update: bool,
}

/// The alloc runner's hooks in the order they run (prerun forwards; postrun, destroy and
/// shutdown in the same order, as Nomad does).
pub const ALLOC_HOOKS: &[(AllocHook, AllocPhases)] = &[
    (
        AllocHook::AllocDir,
        AllocPhases {
            prerun: true,
            postrun: false,
            destroy: true,
            shutdown: false,
            update: false,
        },
    ),
    (
        AllocHook::AwaitPrevious,
        AllocPhases {
            prerun: true,
            postrun: false,
            destroy: false,
            shutdown: false,
            update: false,
        },
    ),
    (
        AllocHook::Network,
        AllocPhases {
            prerun: true,
            postrun: true,
            destroy: false,
            shutdown: false,
            update: false,
        },
    ),
    (
        AllocHook::ConsulGrpcSocket,
        AllocPhases {
            prerun: true,
            postrun: true,
            destroy: false,
            shutdown: false,
            update: false,
        },
    ),
    (
        AllocHook::Csi,
        AllocPhases {
            prerun: true,
            postrun: true,
            destroy: true,
            shutdown: true,
            update: false,
        },
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskHook {
    Validate,
    TaskDir,
    /// `dispatch_payload`: a dispatched job's payload written to the task's `local/<file>`.
    DispatchPayload,
    Volumes,
    Devices,
    CsiPluginSupervisor,
    Template,
    /// `consul_si_token` (Nomad's sids hook): a Consul service identity token for a Connect
    /// task, derived by the servers, in `secrets/si_token`.
    SiToken,
    /// `envoy_version`: the Envoy version Consul prefers, in a Connect sidecar's image.
    EnvoyVersion,
    /// `envoy_bootstrap`: Envoy's bootstrap configuration for a Connect sidecar task.
    EnvoyBootstrap,
}

impl TaskHook {
    pub fn name(self) -> &'static str {
        match self {
            TaskHook::Validate => "validate",
            TaskHook::TaskDir => "task_dir",
            TaskHook::DispatchPayload => "dispatch_payload",
            TaskHook::Volumes => "volumes",
            TaskHook::Devices => "devices",
            TaskHook::CsiPluginSupervisor => "csi_plugin_supervisor",
            TaskHook::Template => "template",
            TaskHook::SiToken => "consul_si_token",
            TaskHook::EnvoyVersion => "envoy_version",
            TaskHook::EnvoyBootstrap => "envoy_bootstrap",
        }
    }
}

/// When a task hook is part of a task's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    Always,
    HasCsiPlugin,
    HasTemplates,
    /// A task with a `dispatch_payload` block.
    HasDispatchPayload,
    /// A Connect task on a client with a Consul ACL token.
    ConnectWithAcl,
    /// A Connect sidecar proxy task (`connect-proxy:<service>`).
    ConnectProxy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskPhases {
    pub prestart: bool,
    pub poststart: bool,
    pub stop: bool,
}

pub const TASK_HOOKS: &[(TaskHook, Condition, TaskPhases)] = &[
    (
        TaskHook::Validate,
        Condition::Always,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::TaskDir,
        Condition::Always,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::DispatchPayload,
        Condition::HasDispatchPayload,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::Volumes,
        Condition::Always,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::Devices,
        Condition::Always,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::CsiPluginSupervisor,
        Condition::HasCsiPlugin,
        TaskPhases {
            prestart: true,
            poststart: true,
            stop: true,
        },
    ),
    // Renders before the start; watches its variables from poststart on.
    (
        TaskHook::Template,
        Condition::HasTemplates,
        TaskPhases {
            prestart: true,
            poststart: true,
            stop: false,
        },
    ),
    (
        TaskHook::SiToken,
        Condition::ConnectWithAcl,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::EnvoyVersion,
        Condition::ConnectProxy,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
    (
        TaskHook::EnvoyBootstrap,
        Condition::ConnectProxy,
        TaskPhases {
            prestart: true,
            poststart: false,
            stop: false,
        },
    ),
];

/// The hooks a task runs, in order.
pub fn task_hooks(task: &Task, consul_acl: bool) -> Vec<(TaskHook, TaskPhases)> {
    TASK_HOOKS
        .iter()
        .filter(|(_, condition, _)| match condition {
            Condition::Always => true,
            Condition::HasCsiPlugin => task.csi_plugin.is_some(),
            Condition::HasTemplates => !task.templates.is_empty(),
            Condition::HasDispatchPayload => task.dispatch_payload.is_some(),
            Condition::ConnectWithAcl => consul_acl && crate::connect::is_connect_task(task),
            Condition::ConnectProxy => crate::connect::proxied_service(task).is_some(),
        })
        .map(|(hook, _, phases)| (*hook, *phases))
        .collect()
}

/// What one prestart hook hands back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HookResponse {
    pub env: BTreeMap<String, String>,
    pub mounts: Vec<MountConfig>,
    pub devices: Vec<DeviceConfig>,
    /// Never run this hook's prestart again for this task (its env is re-applied).
    pub done: bool,
    pub data: BTreeMap<String, String>,
}

/// A hook's persisted progress (`{Data, PrestartDone, Env}`), per hook name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookState {
    pub prestart_done: bool,
    pub data: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
}

/// Why a hook failed; recoverable failures restart the task under its policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookError {
    pub message: String,
    pub recoverable: bool,
}

impl HookError {
    pub fn recoverable(message: impl Into<String>) -> Self {
        HookError {
            message: message.into(),
            recoverable: true,
        }
    }

    pub fn fatal(message: impl Into<String>) -> Self {
        HookError {
            message: message.into(),
            recoverable: false,
        }
    }
}

/// State carried from alloc hooks to task hooks, sent as messages rather than shared: the
/// alloc runner hands each task runner a copy when it starts it, and again on change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocHookResources {
    /// CSI mounts by volume alias, from `csi_hook`.
    pub csi_mounts: BTreeMap<String, MountInfo>,
}
