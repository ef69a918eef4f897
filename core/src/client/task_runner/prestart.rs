//! What each prestart hook asks of the host (its I/O) and how its replies become the hook's
//! response: the task directory, volume and device mounts, the plugin socket directory, and
//! the environment the task starts with.

use super::*;
use crate::client::ConsulOp;
use crate::connect::envoy_version;

/// The `envoy_version` hook's data: the sidecar's image with Consul's Envoy version.
pub(super) const ENVOY_IMAGE: &str = "image";

impl TaskRunner {
    /// The I/O a hook's prestart needs, in order; replies are collected in `self.replies`.
    pub(super) fn prestart_io(&self, hook: TaskHook) -> Vec<Io> {
        let spec = &self.spec;
        match hook {
            // The template hook runs its own I/O (`templates.rs`).
            TaskHook::Validate
            | TaskHook::Volumes
            | TaskHook::Template
            | TaskHook::SiToken
            | TaskHook::EnvoyBootstrap => Vec::new(),
            TaskHook::EnvoyVersion => match self.sidecar_image() {
                Some(image) if envoy_version::needs_version(&spec.task.driver, Some(&image)) => {
                    vec![Io::Consul(ConsulOp::SupportedProxies)]
                }
                _ => Vec::new(),
            },
            TaskHook::TaskDir => {
                let dir = spec.paths.task_dir(&spec.alloc_id, &spec.task.name);
                vec![
                    Io::Mkdir {
                        path: paths::join(&dir, "local"),
                    },
                    Io::Mkdir {
                        path: paths::join(&dir, "secrets"),
                    },
                ]
            }
            // Nothing to write without a payload (Nomad's hook is not needed then).
            TaskHook::DispatchPayload => match &spec.task.dispatch_payload {
                Some(config) if !spec.payload.is_empty() && crate::structs::payload_file_is_local(&config.file) => {
                    let local = paths::join(&spec.paths.task_dir(&spec.alloc_id, &spec.task.name), "local");
                    let path = paths::join(&local, &config.file);
                    let mut io = Vec::new();
                    if let Some((parent, _)) = path.rsplit_once('/') {
                        io.push(Io::Mkdir {
                            path: parent.to_string(),
                        });
                    }
                    io.push(Io::WriteBytes {
                        path,
                        content: spec.payload.clone(),
                        mode: 0o644,
                    });
                    io
                }
                _ => Vec::new(),
            },
            TaskHook::Devices => {
                if spec.task.resources.devices.is_empty() {
                    Vec::new()
                } else {
                    vec![Io::ReserveDevices {
                        alloc_id: spec.alloc_id.clone(),
                        task: spec.task.name.clone(),
                        devices: spec.task.resources.devices.clone(),
                    }]
                }
            }
            TaskHook::CsiPluginSupervisor => {
                let Some(plugin) = &spec.task.csi_plugin else {
                    return Vec::new();
                };
                vec![
                    Io::Mkdir {
                        path: spec.paths.plugin_root(plugin.plugin_type, &plugin.id),
                    },
                    Io::Mkdir {
                        path: spec.paths.plugin_socket_dir(&spec.alloc_id),
                    },
                ]
            }
        }
    }

    /// The task's `image` as its environment interpolates it (`${meta.connect.sidecar_image}`
    /// becomes the client's image, which may ask for [`envoy_version::VERSION_VAR`]).
    fn sidecar_image(&self) -> Option<String> {
        let image = self.spec.task.config.get("image")?.as_str()?;
        Some(self.task_env().interpolate(image))
    }

    pub(super) fn prestart_finish(&self, hook: TaskHook) -> Result<HookResponse, HookError> {
        let spec = &self.spec;
        let task = &spec.task;
        match hook {
            TaskHook::Template | TaskHook::SiToken | TaskHook::EnvoyBootstrap => {
                unreachable!("this hook finishes through its own phase")
            }
            TaskHook::Validate => self.validate_finish(),
            // Asked again before every start (Consul may have been upgraded in between); the
            // image goes to the start, not into the task's environment.
            TaskHook::EnvoyVersion => match (self.replies.first(), self.sidecar_image()) {
                (Some(Reply::Proxies(supported)), Some(image)) => envoy_version::resolve_image(&image, supported)
                    .map(|image| HookResponse {
                        data: BTreeMap::from([(ENVOY_IMAGE.to_string(), image)]),
                        ..HookResponse::default()
                    })
                    .map_err(|why| {
                        HookError::recoverable(format!("error interpreting desired Envoy version from Consul: {why}"))
                    }),
                (Some(other), _) => Err(HookError::recoverable(format!("unexpected reply {other:?}"))),
                (None, _) => Ok(HookResponse::default()),
            },
            TaskHook::TaskDir => Ok(self.task_dir_finish()),
            TaskHook::DispatchPayload => match &task.dispatch_payload {
                Some(config) if !crate::structs::payload_file_is_local(&config.file) => Err(HookError::fatal(format!(
                    "dispatch_payload file {:?} escapes the task's local directory",
                    config.file
                ))),
                _ => Ok(HookResponse {
                    done: true,
                    ..HookResponse::default()
                }),
            },
            TaskHook::Volumes => {
                let capabilities = spec.driver.expect("validated");
                let env = self.task_env();
                let mounts = volume_hook::volume_mounts(
                    task,
                    &spec.group,
                    spec.alloc_index,
                    &spec.host_volumes,
                    &self.resources,
                    capabilities,
                    &env,
                )?;
                Ok(HookResponse {
                    mounts,
                    ..HookResponse::default()
                })
            }
            TaskHook::Devices => match self.replies.first() {
                None => Ok(HookResponse {
                    done: true,
                    ..HookResponse::default()
                }),
                Some(Reply::Reserved(reservation)) => Ok(HookResponse {
                    env: reservation.env.clone(),
                    mounts: reservation.mounts.clone(),
                    devices: reservation.devices.clone(),
                    done: true,
                    data: BTreeMap::new(),
                }),
                Some(other) => Err(HookError::recoverable(format!(
                    "device reservation: unexpected reply {other:?}"
                ))),
            },
            TaskHook::CsiPluginSupervisor => Ok(self.plugin_supervisor_finish()),
        }
    }

    /// The task's driver is detected here and its CSI plugin block is valid.
    fn validate_finish(&self) -> Result<HookResponse, HookError> {
        let spec = &self.spec;
        let task = &spec.task;
        if spec.driver.is_none() {
            return Err(HookError::fatal(format!(
                "failed to validate task: driver \"{}\" is not detected on this node",
                task.driver
            )));
        }
        if let Some(plugin) = &task.csi_plugin {
            let errors = plugin.validate();
            if !errors.is_empty() {
                return Err(HookError::fatal(format!(
                    "failed to validate task: {}",
                    errors.join("; ")
                )));
            }
        }
        Ok(HookResponse::default())
    }

    /// Nomad's directory variables, as the task sees its directories.
    fn task_dir_finish(&self) -> HookResponse {
        let spec = &self.spec;
        let task = &spec.task;
        let mut env = BTreeMap::new();
        if spec.driver.is_some_and(|caps| caps.fs_isolation) {
            // The task's root is its task dir; the alloc dir is bound at /alloc.
            env.insert("NOMAD_ALLOC_DIR".into(), "/alloc".into());
            env.insert("NOMAD_TASK_DIR".into(), "/local".into());
            env.insert("NOMAD_SECRETS_DIR".into(), "/secrets".into());
        } else {
            let dir = spec.paths.task_dir(&spec.alloc_id, &task.name);
            let alloc_dir = paths::join(&spec.paths.alloc(&spec.alloc_id), "alloc");
            env.insert("NOMAD_ALLOC_DIR".into(), alloc_dir);
            env.insert("NOMAD_TASK_DIR".into(), paths::join(&dir, "local"));
            env.insert("NOMAD_SECRETS_DIR".into(), paths::join(&dir, "secrets"));
        }
        HookResponse {
            env,
            done: true,
            ..HookResponse::default()
        }
    }

    /// A plugin task's mounts (socket directory, stage/publish base, `/dev`) and `CSI_ENDPOINT`.
    fn plugin_supervisor_finish(&self) -> HookResponse {
        let spec = &self.spec;
        let task = &spec.task;
        let plugin = task.csi_plugin.as_ref().expect("hook only for plugins");
        let socket_dir = spec.paths.plugin_socket_dir(&spec.alloc_id);
        let root = spec.paths.plugin_root(plugin.plugin_type, &plugin.id);
        let mounts = vec![
            MountConfig {
                task_path: plugin.mount_dir.clone(),
                host_path: socket_dir.clone(),
                readonly: false,
                propagation: Propagation::Bidirectional,
            },
            MountConfig {
                task_path: plugin.stage_publish_base_dir.clone(),
                host_path: root,
                readonly: false,
                propagation: Propagation::Bidirectional,
            },
            MountConfig {
                task_path: "/dev".into(),
                host_path: "/dev".into(),
                readonly: false,
                propagation: Propagation::Private,
            },
        ];
        let mut env = BTreeMap::new();
        if !task.env.contains_key("CSI_ENDPOINT") {
            // Without filesystem isolation the task sees host paths.
            let isolated = spec.driver.is_some_and(|caps| caps.fs_isolation);
            let socket = if isolated {
                paths::join(&plugin.mount_dir, paths::CSI_SOCKET_NAME)
            } else {
                paths::join(&socket_dir, paths::CSI_SOCKET_NAME)
            };
            env.insert("CSI_ENDPOINT".into(), format!("unix://{socket}"));
        }
        // Not done: the mounts must be re-added after every restore.
        HookResponse {
            env,
            mounts,
            ..HookResponse::default()
        }
    }

    /// The task's environment: Nomad's variables, the task's own, then what hooks added.
    /// The task's environment (`taskenv`): its directories as the driver shows them, and what
    /// the hooks added so far.
    pub(super) fn task_env(&self) -> TaskEnv<'_> {
        let spec = &self.spec;
        let mut env = spec.env.clone();
        env.dirs = if spec.driver.is_some_and(|driver| driver.fs_isolation) {
            TaskDirs {
                alloc: "/alloc".into(),
                local: "/local".into(),
                secrets: "/secrets".into(),
            }
        } else {
            let task_dir = spec.paths.task_dir(&spec.alloc_id, &spec.task.name);
            TaskDirs {
                alloc: spec.paths.alloc_shared_dir(&spec.alloc_id),
                local: paths::join(&task_dir, "local"),
                secrets: paths::join(&task_dir, "secrets"),
            }
        };
        env.hook_env = self.hook_env.clone();
        TaskEnv::build(&env, &spec.node)
    }
}
