//! A simulated client host for the production client driver (`drover_io_real::client`): its
//! filesystem (directories and a mount table), task processes, and CSI plugins listening on the
//! sockets of running plugin tasks. Mirrors `drover-io-real`'s `client/host.rs`.
//!
//! The host outlives its client agent: tasks keep running across an agent restart (they are in
//! their own sessions on a real host), so a restarted agent must recover them, and a task that
//! is started twice, a directory removed with a volume still mounted inside, or a task left
//! running once its allocation is gone are all visible here. Task configs understand two keys:
//! `run_for` (a Go duration; the task exits with `exit_code` after it) and `exit_code`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::devices::{DeviceInstance, DevicePick};
use drover_core::client::paths::CSI_SOCKET_NAME;
use drover_core::client::{
    CsiCall, CsiReply, DriverCapabilities, ErrorKind, ExitResult, Io, IoError, MountConfigSupport, Outcome, Reply,
    TaskHandle,
};
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest};
use drover_core::structs::{ConfigValue, CsiControllerInfo, DriverInfo};
use drover_io_real::client::ClientExecutor;
use drover_io_real::devices::DeviceStats;
use drover_io_real::drivers::TaskResourceUsage;
use drover_io_real::io::{BoxFuture, ClientCsi};
use tokio::sync::watch;

use crate::csi::{PluginControl, PluginMode, SLOW_LATENCY, SimPlugins};
use crate::trace::{PluginEvent, Recorder};

/// How long a host call takes.
const LATENCY: Duration = Duration::from_millis(1);

struct SimTask {
    pid: u64,
    /// When the task exits on its own (`run_for`), with `exit_code`.
    exit_at: Option<tokio::time::Instant>,
    exit_code: i32,
    exit: watch::Sender<Option<ExitResult>>,
}

impl SimTask {
    fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }
}

#[derive(Default)]
struct HostState {
    dirs: BTreeSet<String>,
    mounts: BTreeSet<String>,
    tasks: BTreeMap<(String, String), SimTask>,
    next_pid: u64,
    starts: u64,
}

/// One client node's host; clones share it.
#[derive(Clone)]
pub struct SimHost {
    name: String,
    recorder: Recorder,
    plugins: PluginControl,
    state: Arc<Mutex<HostState>>,
}

fn config_str<'a>(config: &'a BTreeMap<String, ConfigValue>, key: &str) -> Option<&'a str> {
    config.get(key).and_then(ConfigValue::as_str)
}

impl SimHost {
    pub fn new(name: &str, recorder: Recorder, plugins: PluginControl) -> Self {
        SimHost {
            name: name.to_string(),
            recorder,
            plugins,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.state.lock().expect("host lock")
    }

    /// The tasks running on this host: (alloc, task).
    pub fn running_tasks(&self) -> Vec<(String, String)> {
        self.lock()
            .tasks
            .iter()
            .filter(|(_, task)| task.running())
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Task starts since the host booted.
    pub fn starts(&self) -> u64 {
        self.lock().starts
    }

    pub fn mounts(&self) -> Vec<String> {
        self.lock().mounts.iter().cloned().collect()
    }

    fn note(&self, text: String) {
        self.recorder.note(format!("{}: {text}", self.name));
    }

    /// The machine dies: every task is killed and every mount is gone (directories survive
    /// on its disk). What a reboot finds is an empty process table.
    pub fn power_off(&self) {
        let mut state = self.lock();
        for task in state.tasks.values() {
            task.exit.send_if_modified(|exit| {
                let first = exit.is_none();
                exit.get_or_insert(ExitResult {
                    exit_code: 137,
                    signal: 9,
                    err: Some("host lost".into()),
                    ..ExitResult::default()
                });
                first
            });
        }
        state.mounts.clear();
    }

    /// The plugin allocation whose socket `socket` is, if a task of it is running.
    fn plugin_listening(&self, socket: &str) -> bool {
        let Some(dir) = socket.strip_suffix(CSI_SOCKET_NAME) else {
            return false;
        };
        let alloc = dir.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
        self.lock()
            .tasks
            .iter()
            .any(|((task_alloc, _), task)| task_alloc == alloc && task.running())
    }

    fn filesystem(&self, io: Io) -> Outcome {
        let mut state = self.lock();
        match io {
            Io::Mkdir { path } => {
                state.dirs.insert(path);
                Ok(Reply::Unit)
            }
            Io::RemoveAll { path } => {
                let inside = |candidate: &String| candidate == &path || candidate.starts_with(&format!("{path}/"));
                if let Some(mount) = state.mounts.iter().find(|mount| inside(mount)).cloned() {
                    drop(state);
                    self.recorder.violate(
                        "rm -rf never crosses a live mount",
                        format!("{}: removing {path} with {mount} still mounted", self.name),
                    );
                    return Err(IoError::other(format!("remove {path}: device or resource busy")));
                }
                state.dirs.retain(|dir| !inside(dir));
                Ok(Reply::Unit)
            }
            Io::Rmdir { path } => {
                if state.mounts.contains(&path) {
                    return Err(IoError::other(format!("rmdir {path}: device or resource busy")));
                }
                if state.dirs.iter().any(|dir| dir.starts_with(&format!("{path}/"))) {
                    return Err(IoError::other(format!("rmdir {path}: directory not empty")));
                }
                state.dirs.remove(&path);
                Ok(Reply::Unit)
            }
            Io::IsMountPoint { path } => Ok(Reply::Bool(state.mounts.contains(&path))),
            other => Err(IoError::other(format!("not a filesystem request: {other:?}"))),
        }
    }

    fn start(&self, config: drover_core::client::TaskConfig) -> Outcome {
        let key = (config.alloc_id.clone(), config.task.clone());
        let mut state = self.lock();
        if state.tasks.get(&key).is_some_and(SimTask::running) {
            drop(state);
            self.recorder.violate(
                "a task runs once",
                format!("{}: {}/{} started while still running", self.name, key.0, key.1),
            );
            return Err(IoError::other("task already running"));
        }
        state.next_pid += 1;
        state.starts += 1;
        let pid = state.next_pid;
        let exit_at = config_str(&config.config, "run_for")
            .and_then(|text| drover_core::goduration::parse(text).ok())
            .map(|after| tokio::time::Instant::now() + after);
        let exit_code = match config.config.get("exit_code") {
            Some(ConfigValue::Int(code)) => *code as i32,
            _ => 0,
        };
        let (exit, _) = watch::channel(None);
        state.tasks.insert(
            key.clone(),
            SimTask {
                pid,
                exit_at,
                exit_code,
                exit,
            },
        );
        drop(state);
        self.note(format!("task {}/{} started (pid {pid})", key.0, key.1));
        Ok(Reply::Started(TaskHandle {
            driver: config.driver,
            alloc_id: key.0,
            task: key.1,
            state: format!("pid={pid}"),
        }))
    }

    fn pid(handle: &TaskHandle) -> Option<u64> {
        handle.state.strip_prefix("pid=")?.parse().ok()
    }

    /// The task a handle names, if it is that very process.
    fn with_task<R>(&self, handle: &TaskHandle, f: impl FnOnce(&SimTask) -> R) -> Option<R> {
        let state = self.lock();
        let task = state.tasks.get(&(handle.alloc_id.clone(), handle.task.clone()))?;
        (Some(task.pid) == Self::pid(handle)).then(|| f(task))
    }

    fn stop(&self, handle: &TaskHandle) -> Outcome {
        let stopped = self.with_task(handle, |task| {
            task.exit.send_if_modified(|exit| {
                let first = exit.is_none();
                exit.get_or_insert(ExitResult {
                    exit_code: 130,
                    signal: 2,
                    ..ExitResult::default()
                });
                first
            })
        });
        if stopped == Some(true) {
            self.note(format!("task {}/{} stopped", handle.alloc_id, handle.task));
        }
        Ok(Reply::Unit)
    }

    fn csi(&self, socket: &str, call: CsiCall) -> Outcome {
        if !self.plugin_listening(socket) {
            return Err(IoError::new(
                ErrorKind::Unavailable,
                format!("dial unix {socket}: connect: connection refused"),
            ));
        }
        if self.plugins.mode() == PluginMode::Failing {
            return Err(IoError::other(
                "rpc error: code = Internal desc = injected plugin failure",
            ));
        }
        let reply = match call {
            CsiCall::Probe => CsiReply::Probe { ready: true },
            CsiCall::GetPluginInfo => CsiReply::PluginInfo {
                name: "fake.drover.dev".into(),
                version: "0.1.0".into(),
            },
            CsiCall::GetPluginCapabilities => CsiReply::PluginCapabilities {
                controller_service: true,
                accessibility_constraints: false,
            },
            // Attach/detach, so every claim and release goes through the controller too.
            CsiCall::ControllerGetCapabilities => CsiReply::ControllerCapabilities(CsiControllerInfo {
                supports_attach_detach: true,
                supports_read_only_attach: true,
                ..CsiControllerInfo::default()
            }),
            CsiCall::NodeGetInfo => CsiReply::NodeInfo {
                node_id: format!("ext-{}", self.name),
                max_volumes: 0,
                topology: None,
            },
            // Staged once per volume and node, shared by the allocations there.
            CsiCall::NodeGetCapabilities => CsiReply::NodeCapabilities {
                stage_unstage: true,
                stats: false,
                expand: false,
                condition: false,
            },
            CsiCall::NodeStageVolume {
                staging_target_path, ..
            } => {
                self.lock().mounts.insert(staging_target_path);
                CsiReply::Done
            }
            CsiCall::NodeUnstageVolume {
                staging_target_path, ..
            } => {
                self.lock().mounts.remove(&staging_target_path);
                CsiReply::Done
            }
            CsiCall::NodePublishVolume {
                volume_id, target_path, ..
            } => {
                self.lock().mounts.insert(target_path.clone());
                let alloc = alloc_of_target(&target_path);
                self.recorder.record_plugin(
                    &self.name,
                    PluginEvent::NodePublished {
                        volume: volume_id,
                        alloc,
                    },
                );
                CsiReply::Done
            }
            CsiCall::NodeUnpublishVolume { volume_id, target_path } => {
                let was = self.lock().mounts.remove(&target_path);
                if was {
                    self.recorder.record_plugin(
                        &self.name,
                        PluginEvent::NodeUnpublished {
                            volume: volume_id,
                            alloc: alloc_of_target(&target_path),
                        },
                    );
                }
                CsiReply::Done
            }
        };
        Ok(Reply::Csi(reply))
    }
}

/// The allocation of a publish target (`.../per-alloc/<alloc>/<volume>/<usage>`).
fn alloc_of_target(target: &str) -> String {
    let parts: Vec<&str> = target.split('/').collect();
    parts
        .iter()
        .position(|part| *part == "per-alloc")
        .and_then(|at| parts.get(at + 1))
        .map(|alloc| alloc.to_string())
        .unwrap_or_default()
}

impl ClientExecutor for SimHost {
    fn execute(&self, io: Io) -> BoxFuture<Outcome> {
        let host = self.clone();
        Box::pin(async move {
            tokio::time::sleep(LATENCY).await;
            match io {
                io @ (Io::Mkdir { .. } | Io::RemoveAll { .. } | Io::Rmdir { .. } | Io::IsMountPoint { .. }) => {
                    host.filesystem(io)
                }
                Io::StartTask(config) => host.start(*config),
                Io::StopTask { handle, .. } => host.stop(&handle),
                Io::RecoverTask { handle } => match host.with_task(&handle, SimTask::running) {
                    Some(true) => Ok(Reply::Unit),
                    _ => Err(IoError::new(ErrorKind::NotFound, "process gone")),
                },
                Io::PrepareDevices { .. } => Ok(Reply::Reserved(Default::default())),
                Io::Csi { socket, call } => {
                    match host.plugins.mode() {
                        PluginMode::Hanging => std::future::pending::<()>().await,
                        PluginMode::Slow => tokio::time::sleep(SLOW_LATENCY).await,
                        PluginMode::Healthy | PluginMode::Failing => {}
                    }
                    host.csi(&socket, call)
                }
                Io::Server(_) | Io::AllocSync(_) | Io::Consul(_) | Io::Volume(_) | Io::ReserveDevices { .. } => {
                    Err(IoError::other("not an executor request"))
                }
            }
        })
    }

    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult> {
        let host = self.clone();
        Box::pin(async move {
            let Some((mut exit, exit_at, exit_code)) =
                host.with_task(&handle, |task| (task.exit.subscribe(), task.exit_at, task.exit_code))
            else {
                return ExitResult {
                    err: Some("process gone".into()),
                    ..ExitResult::default()
                };
            };
            loop {
                if let Some(result) = exit.borrow_and_update().clone() {
                    return result;
                }
                let deadline = exit_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
                tokio::select! {
                    biased;
                    changed = exit.changed() => {
                        if changed.is_err() {
                            return ExitResult { err: Some("process gone".into()), ..ExitResult::default() };
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => {
                        if exit_at.is_some() {
                            host.with_task(&handle, |task| {
                                task.exit.send_if_modified(|exit| {
                                    let first = exit.is_none();
                                    exit.get_or_insert(ExitResult { exit_code, ..ExitResult::default() });
                                    first
                                })
                            });
                            host.note(format!("task {}/{} exited with {exit_code}", handle.alloc_id, handle.task));
                        }
                    }
                }
            }
        })
    }

    fn fingerprint(&self) -> Vec<(String, DriverCapabilities, DriverInfo)> {
        [
            ("raw_exec", MountConfigSupport::None, false),
            ("exec", MountConfigSupport::All, true),
        ]
        .into_iter()
        .map(|(name, mount_configs, fs_isolation)| {
            (
                name.to_string(),
                DriverCapabilities {
                    mount_configs,
                    fs_isolation,
                },
                DriverInfo {
                    detected: true,
                    healthy: true,
                    health_description: "Healthy".into(),
                    attributes: BTreeMap::new(),
                },
            )
        })
        .collect()
    }

    fn node_attributes(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn device_inventory(&self) -> BTreeMap<String, Vec<DeviceInstance>> {
        BTreeMap::new()
    }

    fn device_stats(&self, _picks: &[DevicePick]) -> Vec<DeviceStats> {
        Vec::new()
    }

    fn task_stats(&self, _handle: &TaskHandle) -> Option<TaskResourceUsage> {
        None
    }

    fn controller(&self, socket: String, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, String>> {
        let host = self.clone();
        Box::pin(async move {
            if !host.plugin_listening(&socket) {
                return Err(format!(
                    "CSI client error (retryable): dial unix {socket}: connect: connection refused"
                ));
            }
            SimPlugins::new(&host.name, host.recorder.clone(), host.plugins.clone())
                .call(request)
                .await
        })
    }
}
