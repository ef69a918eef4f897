//! A simulated client host for the production client driver (`drover_io_real::client`): its
//! filesystem (directories and a mount table), task processes, and CSI plugins listening on the
//! sockets of running plugin tasks. Mirrors `drover-io-real`'s `client/host.rs`.
//!
//! The host outlives its client agent: tasks keep running across an agent restart (they are in
//! their own sessions on a real host), so a restarted agent must recover them, and a task that
//! is started twice, a directory removed with a volume still mounted inside, or a task left
//! running once its allocation is gone are all visible here. Task configs understand four
//! keys: `run_for` (a Go duration; the task exits with `exit_code` after it), `exit_code`,
//! `stop_after` (a Go duration: how long it takes to exit once interrupted; killed past its
//! kill timeout), and `children` (the task starts that many processes of its own, which
//! ignore the stop signal and outlive its leader, as a shell's background jobs and daemons do
//! on a real host: only `DestroyTask`, the cgroup kill, or the host's death ends them).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::devices::{DeviceInstance, DevicePick};
use drover_core::client::paths::CSI_SOCKET_NAME;
use drover_core::client::{
    CsiCall, CsiReply, DriverCapabilities, ErrorKind, ExitResult, Io, IoError, MountConfigSupport, Outcome, Reply,
    TaskHandle,
};
use drover_core::config::ClientFaults;
use drover_core::error::{CsiCallError, CsiCallFailure};
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest};
use drover_core::structs::{ConfigValue, CsiControllerInfo, DriverInfo};
use drover_io_real::client::ClientExecutor;
use drover_io_real::containers::ContainerDriver;
use drover_io_real::devices::DeviceStats;
use drover_io_real::drivers::TaskDriver;
use drover_io_real::drivers::TaskResourceUsage;
use drover_io_real::io::{BoxFuture, ClientCsi};
use tokio::sync::watch;

use crate::csi::{PluginControl, PluginMode, SLOW_LATENCY, SimPlugins};
use crate::task_files::TaskFiles;
use crate::trace::{HostEvent, PluginEvent, Recorder};

/// How long a host call takes.
const LATENCY: Duration = Duration::from_millis(1);

struct SimTask {
    pid: u64,
    started: tokio::time::Instant,
    /// When the task exits on its own (`run_for`), with `exit_code`.
    exit_at: Option<tokio::time::Instant>,
    exit_code: i32,
    exit: watch::Sender<Option<ExitResult>>,
    /// Host ports the task binds (its `NOMAD_HOST_PORT_*` variables).
    ports: BTreeSet<u16>,
    /// Processes the task started that still run (they outlive the leader until destroyed).
    children: u32,
    /// How long the leader takes to exit once interrupted (`stop_after`): a daemon finishing
    /// what it was doing. Past the kill timeout it is killed.
    stop_after: Duration,
}

impl SimTask {
    /// Whether the task's leader process runs.
    fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Whether any process of the task runs, the leader or what it started.
    fn alive(&self) -> bool {
        self.running() || self.children > 0
    }

    /// The process ends with `result`, unless it already has; whether it just did.
    fn end(&self, result: ExitResult) -> bool {
        self.exit.send_if_modified(|exit| {
            let first = exit.is_none();
            exit.get_or_insert(result);
            first
        })
    }
}

/// The exit of a process ended by `signal` (a shell's 128 + signal exit code).
fn signalled(signal: i32) -> ExitResult {
    ExitResult {
        exit_code: 128 + signal,
        signal,
        ..ExitResult::default()
    }
}

/// How the CSI plugin process on a host misbehaves (the `client_*` scenarios).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginFaults {
    /// The process dies when the `nth` call of this name (`NodeStageVolume`, `Probe`, ...)
    /// reaches it; the call is not answered. Counted across restarts of the plugin.
    pub crash_on: Option<(String, u32)>,
    /// Every probe answers "not ready".
    pub never_ready: bool,
    /// How long a started plugin process takes to listen on its socket; until then a socket
    /// left behind by the previous process refuses connections.
    pub startup: Duration,
    /// Calls of these names (`NodeUnpublishVolume`, ...) take this long to answer, as a
    /// plugin slowed by its storage does.
    pub slow_calls: BTreeMap<String, Duration>,
}

#[derive(Default)]
struct HostState {
    dirs: BTreeSet<String>,
    /// Small files the client writes itself (service identity tokens), by path.
    files: BTreeMap<String, String>,
    mounts: BTreeSet<String>,
    /// Staging paths staged by the plugin, and publish targets with the staging path each
    /// was published from (checked: stage before publish, unpublish before unstage).
    staged: BTreeSet<String>,
    published: BTreeMap<String, String>,
    /// CSI calls the plugin received, by name.
    calls: BTreeMap<&'static str, u32>,
    tasks: BTreeMap<(String, String), SimTask>,
    /// Pids start over at every boot, as a real kernel's do.
    next_pid: u64,
    /// Which boot of the machine this is (its boot id): a task handle names a process only
    /// within the boot it was written in.
    boot: u64,
    starts: u64,
    /// The next this many task starts fail, as a driver's does when the host is out of
    /// processes or the binary cannot be executed.
    failing_starts: u32,
}

/// One client node's host; clones share it.
#[derive(Clone)]
pub struct SimHost {
    name: String,
    recorder: Recorder,
    plugins: PluginControl,
    faults: PluginFaults,
    state: Arc<Mutex<HostState>>,
    /// The node's Consul agent, which the simulated `consul connect envoy` asks.
    consul: Option<crate::consul::SimConsulAgent>,
    /// The topology segments the node plugin reports (empty: none).
    topology: BTreeMap<String, String>,
    /// Its allocation directories as real files, with hostile tasks planting links in them
    /// (the `task_planted_links` scenario); otherwise they are only modelled.
    files: Option<Arc<TaskFiles>>,
    /// The `docker` driver, the production one, over the host's simulated engine (`None`: the
    /// host has no container engine).
    docker: Option<(crate::engine::SimEngine, ContainerDriver)>,
    /// The client's re-created defects, for its `docker` driver.
    container_faults: ClientFaults,
}

/// What a filesystem request does and the path it names (`None`: not one).
fn file_request(io: &Io) -> Option<(&'static str, &str)> {
    match io {
        Io::Mkdir { path } => Some(("mkdir", path)),
        Io::RemoveAll { path } => Some(("rm -rf", path)),
        Io::Rmdir { path } => Some(("rmdir", path)),
        Io::IsMountPoint { path } => Some(("mountpoint", path)),
        Io::ReadFile { path } => Some(("read", path)),
        Io::WriteFile { path, .. } | Io::WriteBytes { path, .. } => Some(("write", path)),
        _ => None,
    }
}

fn config_str<'a>(config: &'a BTreeMap<String, ConfigValue>, key: &str) -> Option<&'a str> {
    config.get(key).and_then(ConfigValue::as_str)
}

impl SimHost {
    pub fn new(name: &str, recorder: Recorder, plugins: PluginControl, faults: PluginFaults) -> Self {
        SimHost {
            name: name.to_string(),
            recorder,
            plugins,
            faults,
            state: Arc::default(),
            consul: None,
            topology: BTreeMap::new(),
            files: None,
            docker: None,
            container_faults: ClientFaults::default(),
        }
    }

    /// The host runs a container engine, and its client the `docker` driver over it (the
    /// engine outlives the client agent, as a host's daemon does; each agent start makes a new
    /// driver, as a restarted client does, which reattaches to the containers).
    pub fn with_docker(mut self, engine: crate::engine::SimEngine, faults: ClientFaults) -> Self {
        self.container_faults = faults;
        let driver = self.container_driver(&engine);
        self.docker = Some((engine, driver));
        self
    }

    fn container_driver(&self, engine: &crate::engine::SimEngine) -> ContainerDriver {
        ContainerDriver::new(
            drover_core::driverspec::docker_plugin::DockerPluginConfig::default(),
            Ok(Arc::new(engine.clone()) as Arc<dyn drover_io_real::containers::Engine>),
        )
        .with_alloc_root(std::path::Path::new(&format!("/sim/{}/alloc", self.name)))
        .without_log_files()
        .with_faults(self.container_faults)
    }

    /// The host as a newly started client agent finds it: the same processes, files and
    /// engine, and a `docker` driver of its own that has yet to reattach to its containers.
    pub fn for_a_new_agent(&self) -> SimHost {
        let mut host = self.clone();
        if let Some((engine, _)) = &self.docker {
            host.docker = Some((engine.clone(), self.container_driver(engine)));
        }
        host
    }

    /// The host's container engine, when it has one.
    pub fn engine(&self) -> Option<&crate::engine::SimEngine> {
        self.docker.as_ref().map(|(engine, _)| engine)
    }

    /// The `docker` driver, when `driver` names it and the host has one.
    fn docker(&self, driver: &str) -> Option<&ContainerDriver> {
        self.docker
            .as_ref()
            .filter(|_| driver == "docker")
            .map(|(_, driver)| driver)
    }

    /// Keeps the host's allocation directories as real files ([`TaskFiles`]).
    pub fn with_task_files(mut self, files: TaskFiles) -> Self {
        self.files = Some(Arc::new(files));
        self
    }

    /// The node plugin reports `segments` as its accessible topology.
    pub fn with_topology(mut self, segments: BTreeMap<String, String>) -> Self {
        self.topology = segments;
        self
    }

    /// Gives the host a `consul` CLI talking to `agent`.
    pub fn with_consul(mut self, agent: crate::consul::SimConsulAgent) -> Self {
        self.consul = Some(agent);
        self
    }

    /// The simulated `consul connect envoy -bootstrap -sidecar-for <id> [-token <t>]`: asks
    /// the agent for the sidecar, and writes the bootstrap (the sidecar id and the token) to
    /// `stdout_path`.
    async fn run_command(&self, program: String, args: Vec<String>, stdout_path: String) -> Outcome {
        let consul = match &self.consul {
            Some(consul) if program.rsplit('/').next() == Some("consul") => consul,
            _ => {
                return Err(IoError::new(
                    ErrorKind::NotFound,
                    format!("exec: {program:?}: executable file not found in $PATH"),
                ));
            }
        };
        let value = |flag: &str| {
            args.iter()
                .position(|arg| arg == flag)
                .and_then(|at| args.get(at + 1))
                .cloned()
        };
        if args.get(..2) != Some(&["connect".to_string(), "envoy".to_string()][..])
            || !args.contains(&"-bootstrap".into())
        {
            return Err(IoError::other(format!("consul: unexpected arguments {args:?}")));
        }
        let sidecar_for = value("-sidecar-for").unwrap_or_default();
        let bootstrap = consul
            .envoy_bootstrap(&sidecar_for, value("-token").as_deref())
            .await
            .map_err(IoError::other)?;
        self.filesystem(Io::WriteFile {
            path: stdout_path,
            content: bootstrap,
            mode: 0o440,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.state.lock().expect("host lock")
    }

    /// The tasks running on this host: (alloc, task).
    pub fn running_tasks(&self) -> Vec<(String, String)> {
        let mut running: Vec<(String, String)> = self
            .lock()
            .tasks
            .iter()
            .filter(|(_, task)| task.running())
            .map(|(key, _)| key.clone())
            .collect();
        // A running container is its task running.
        if let Some(engine) = self.engine() {
            running.extend(engine.running().into_iter().map(|(_, _, alloc, task)| (alloc, task)));
        }
        running
    }

    /// The tasks with any process on this host, the leader's or what it left behind:
    /// (alloc, task).
    pub fn task_processes(&self) -> Vec<(String, String)> {
        let mut processes: Vec<(String, String)> = self
            .lock()
            .tasks
            .iter()
            .filter(|(_, task)| task.alive())
            .map(|(key, _)| key.clone())
            .collect();
        // A container's main process is the task's.
        if let Some(engine) = self.engine() {
            processes.extend(engine.running().into_iter().map(|(_, _, alloc, task)| (alloc, task)));
        }
        processes
    }

    /// Records that no process of a task is left, once that is newly so.
    fn gone(&self, key: &(String, String)) {
        self.recorder.record_host(
            &self.name,
            HostEvent::TaskProcessesGone {
                alloc: key.0.clone(),
                task: key.1.clone(),
            },
        );
    }

    /// Task starts since the host booted.
    pub fn starts(&self) -> u64 {
        self.lock().starts
    }

    pub fn mounts(&self) -> Vec<String> {
        self.lock().mounts.iter().cloned().collect()
    }

    /// The files the client wrote whose path ends with `suffix`, with their text.
    pub fn files_ending(&self, suffix: &str) -> Vec<(String, String)> {
        self.lock()
            .files
            .iter()
            .filter(|(path, _)| path.ends_with(suffix))
            .map(|(path, text)| (path.clone(), text.clone()))
            .collect()
    }

    fn note(&self, text: String) {
        self.recorder.note(format!("{}: {text}", self.name));
    }

    /// The next `count` task starts on this host fail.
    pub fn fail_next_starts(&self, count: u32) {
        // On a host with a container engine, its creates fail (the docker driver's starts).
        if let Some(engine) = self.engine() {
            engine.fail_next_creates(count);
        }
        self.lock().failing_starts = count;
        self.note(format!("the next {count} task starts fail"));
    }

    /// The kernel's OOM killer ends the leader process of one running task (the `pick`th, in
    /// order, of those running); what the task started lives on until the client destroys
    /// it. Returns the task, if any ran.
    pub fn oom_kill(&self, pick: usize) -> Option<(String, String)> {
        if let Some(engine) = self.engine() {
            return engine.oom_kill(pick);
        }
        let state = self.lock();
        let running: Vec<&(String, String)> = state
            .tasks
            .iter()
            .filter(|(_, task)| task.running())
            .map(|(key, _)| key)
            .collect();
        let key = (*running.get(pick % running.len().max(1))?).clone();
        let task = &state.tasks[&key];
        task.end(ExitResult {
            exit_code: 137,
            signal: 9,
            oom_killed: true,
            err: Some("OOM Killed".into()),
        });
        let gone = !task.alive();
        drop(state);
        self.note(format!("task {}/{} OOM killed", key.0, key.1));
        if gone {
            self.gone(&key);
        }
        Some(key)
    }

    /// The machine dies: every task is killed and every mount is gone (directories survive
    /// on its disk). What a reboot finds is an empty process table.
    pub fn power_off(&self) {
        let mut state = self.lock();
        let mut gone = Vec::new();
        for (key, task) in state.tasks.iter_mut() {
            let was_alive = task.alive();
            task.end(ExitResult {
                exit_code: 137,
                signal: 9,
                err: Some("host lost".into()),
                ..ExitResult::default()
            });
            task.children = 0;
            if was_alive {
                gone.push(key.clone());
            }
        }
        state.mounts.clear();
        state.staged.clear();
        state.published.clear();
        state.boot += 1;
        state.next_pid = 0;
        drop(state);
        for key in gone {
            self.gone(&key);
        }
    }

    /// The plugin allocation whose socket `socket` is.
    fn socket_alloc(socket: &str) -> Option<String> {
        let dir = socket.strip_suffix(CSI_SOCKET_NAME)?;
        Some(
            dir.trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string(),
        )
    }

    /// Whether a task of the plugin allocation whose socket `socket` is runs and has had time
    /// to listen.
    fn plugin_listening(&self, socket: &str) -> bool {
        let Some(alloc) = Self::socket_alloc(socket) else {
            return false;
        };
        let now = tokio::time::Instant::now();
        self.lock().tasks.iter().any(|((task_alloc, _), task)| {
            *task_alloc == alloc && task.running() && now >= task.started + self.faults.startup
        })
    }

    /// The plugin process behind `socket` dies on this call when the faults say so.
    fn crashes_on(&self, socket: &str, name: &'static str) -> bool {
        let mut state = self.lock();
        let count = state.calls.entry(name).or_default();
        *count += 1;
        let count = *count;
        if self.faults.crash_on != Some((name.to_string(), count)) {
            return false;
        }
        let alloc = Self::socket_alloc(socket).unwrap_or_default();
        let mut gone = Vec::new();
        for (key, task) in state.tasks.iter() {
            if key.0 == alloc && task.end(signalled(9)) && !task.alive() {
                gone.push(key.clone());
            }
        }
        drop(state);
        for key in &gone {
            self.gone(key);
        }
        self.note(format!("plugin {alloc} crashes on {name} #{count}"));
        true
    }

    /// A request carried out in real files: the invariants checked after it (`read`: what it
    /// returned, if it reads), a refusal noted; its outcome passed on.
    fn judged<T>(
        &self,
        files: &TaskFiles,
        request: &str,
        read: Option<&str>,
        done: Result<T, IoError>,
    ) -> Result<T, IoError> {
        files.check(&self.recorder, request, read);
        if let Err(error) = &done {
            self.note(format!("{request} refused: {}", error.message));
        }
        done
    }

    fn filesystem(&self, io: Io) -> Outcome {
        // Below the allocation root of a host with real files, the request is carried out
        // there first (a payload's bytes as they are); the model follows only if it succeeds.
        let mut read = None;
        if let Some(files) = &self.files
            && let Some((name, path)) = file_request(&io).filter(|(_, path)| files.owns(path))
        {
            let done = match &io {
                Io::Mkdir { path } => files.mkdir(path),
                Io::RemoveAll { path } => files.remove_all(path),
                Io::Rmdir { path } => files.rmdir(path),
                Io::WriteFile { path, content, mode } => files.write(path, content.as_bytes(), *mode),
                Io::WriteBytes { path, content, mode } => files.write(path, content, *mode),
                Io::ReadFile { path } => files.read(path).map(|text| read = Some(text)),
                _ => Ok(()),
            };
            let seen = read.as_ref().map(|text| text.as_deref().unwrap_or(""));
            self.judged(files, &format!("{name} {path}"), seen, done)?;
        }
        // The simulated files hold text; a payload's bytes are kept as (lossy) text.
        let io = match io {
            Io::WriteBytes { path, content, mode } => Io::WriteFile {
                path,
                content: String::from_utf8_lossy(&content).into_owned(),
                mode,
            },
            other => other,
        };
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
                state.files.retain(|file, _| !inside(file));
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
            Io::ReadFile { path } => Ok(Reply::File(match read {
                Some(text) => text,
                None => state.files.get(&path).cloned(),
            })),
            Io::WriteFile { path, content, .. } => {
                let parent = path.rsplit_once('/').map(|(parent, _)| parent.to_string());
                if parent.is_some_and(|parent| !state.dirs.contains(&parent)) {
                    return Err(IoError::new(
                        ErrorKind::NotFound,
                        format!("write {path}: no such directory"),
                    ));
                }
                state.files.insert(path, content);
                Ok(Reply::Unit)
            }
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
        if let Some(left) = state.tasks.get(&key).map(|task| task.children).filter(|left| *left > 0) {
            // The previous run of the task is over (a new one starts), and processes of it
            // still run: they were never destroyed.
            drop(state);
            self.recorder.violate(
                "no task process outlives its task",
                format!(
                    "{}: {}/{} starts again while {left} processes of its previous run still run",
                    self.name, key.0, key.1
                ),
            );
            return Err(IoError::other("the task's previous processes still run"));
        }
        if state.failing_starts > 0 {
            state.failing_starts -= 1;
            drop(state);
            self.note(format!("task {}/{} fails to start", key.0, key.1));
            return Err(IoError::other(
                "failed to launch command with executor: fork/exec: resource temporarily unavailable",
            ));
        }
        // The task binds the host ports it was given, as a real server would: one bound by a
        // running task of another allocation on this host would fail with EADDRINUSE. The
        // tasks of one allocation share its group network (a Connect sidecar beside its app).
        let ports: BTreeSet<u16> = config
            .env
            .iter()
            .filter(|(name, _)| name.starts_with("NOMAD_HOST_PORT_"))
            .filter_map(|(_, value)| value.parse().ok())
            .collect();
        let holder = state
            .tasks
            .iter()
            .find(|((alloc, _), task)| *alloc != key.0 && task.running() && !task.ports.is_disjoint(&ports))
            .map(|((alloc, task), held)| {
                (
                    format!("{alloc}/{task}"),
                    held.ports.intersection(&ports).copied().collect::<Vec<_>>(),
                )
            });
        if let Some((holder, shared)) = holder {
            drop(state);
            self.recorder.violate(
                "a host port is bound by one allocation at a time",
                format!("{}: {}/{} binds {shared:?}, held by {holder}", self.name, key.0, key.1),
            );
            return Err(IoError::other("bind: address already in use"));
        }
        state.next_pid += 1;
        state.starts += 1;
        let (pid, boot) = (state.next_pid, state.boot);
        let exit_at = config_str(&config.config, "run_for")
            .and_then(|text| drover_core::goduration::parse(text).ok())
            .map(|after| tokio::time::Instant::now() + after);
        let exit_code = match config.config.get("exit_code") {
            Some(ConfigValue::Int(code)) => *code as i32,
            _ => 0,
        };
        let children = match config.config.get("children") {
            Some(ConfigValue::Int(count)) => (*count).clamp(0, 64) as u32,
            _ => 0,
        };
        let stop_after = config_str(&config.config, "stop_after")
            .and_then(|text| drover_core::goduration::parse(text).ok())
            .unwrap_or_default();
        let (exit, _) = watch::channel(None);
        state.tasks.insert(
            key.clone(),
            SimTask {
                pid,
                started: tokio::time::Instant::now(),
                exit_at,
                exit_code,
                exit,
                ports,
                children,
                stop_after,
            },
        );
        drop(state);
        self.note(format!("task {}/{} started (pid {pid})", key.0, key.1));
        if let Some(files) = &self.files
            && matches!(config.config.get("plant_links"), Some(ConfigValue::Bool(true)))
        {
            for planted in files.plant(&key.0, &key.1, pid) {
                self.note(format!("task {}/{} plants a link: {planted}", key.0, key.1));
            }
        }
        self.recorder.record_host(
            &self.name,
            HostEvent::TaskStarted {
                alloc: key.0.clone(),
                task: key.1.clone(),
            },
        );
        Ok(Reply::Started(TaskHandle {
            driver: config.driver,
            alloc_id: key.0,
            task: key.1,
            state: format!("pid={pid} boot={boot}"),
        }))
    }

    /// The pid a handle names, if it was written in this boot.
    fn pid(handle: &TaskHandle, boot: u64) -> Option<u64> {
        let (pid, written_in) = handle.state.split_once(' ')?;
        let pid = pid.strip_prefix("pid=")?.parse().ok()?;
        (written_in.strip_prefix("boot=")?.parse::<u64>().ok()? == boot).then_some(pid)
    }

    /// The task a handle names, if it is that very process (of this boot).
    fn with_task<R>(&self, handle: &TaskHandle, f: impl FnOnce(&SimTask) -> R) -> Option<R> {
        let state = self.lock();
        let task = state.tasks.get(&(handle.alloc_id.clone(), handle.task.clone()))?;
        (Some(task.pid) == Self::pid(handle, state.boot)).then(|| f(task))
    }

    /// SIGINT, then SIGKILL if the task has not exited within `kill_timeout` (the production
    /// driver's `stop`): answers once the leader is gone.
    async fn stop(&self, handle: &TaskHandle, kill_timeout: Duration) -> Outcome {
        let Some((stop_after, mut exit)) = self.with_task(handle, |task| (task.stop_after, task.exit.subscribe()))
        else {
            return Ok(Reply::Unit);
        };
        let (wait, result) = if stop_after <= kill_timeout {
            (stop_after, signalled(2))
        } else {
            (kill_timeout, signalled(9))
        };
        // It may exit by itself meanwhile; then that exit stands.
        let _ = tokio::time::timeout(wait, exit.wait_for(Option::is_some)).await;
        let stopped = self.with_task(handle, |task| task.end(result));
        if stopped == Some(true) {
            self.note(format!("task {}/{} stopped", handle.alloc_id, handle.task));
            self.gone_if_so(handle);
        }
        Ok(Reply::Unit)
    }

    /// Records the task of `handle` gone when none of its processes is left.
    fn gone_if_so(&self, handle: &TaskHandle) {
        if self.with_task(handle, SimTask::alive) == Some(false) {
            self.gone(&(handle.alloc_id.clone(), handle.task.clone()));
        }
    }

    /// `DestroyTask`: the cgroup kill. Every process of the task still running is killed;
    /// a task already destroyed, or replaced since, is left alone.
    fn destroy(&self, handle: &TaskHandle) -> Outcome {
        let killed = {
            let mut state = self.lock();
            let key = (handle.alloc_id.clone(), handle.task.clone());
            let pid = Self::pid(handle, state.boot);
            match state.tasks.get_mut(&key) {
                Some(task) if Some(task.pid) == pid && task.alive() => {
                    task.end(signalled(9));
                    Some(std::mem::take(&mut task.children))
                }
                _ => None,
            }
        };
        if let Some(children) = killed {
            self.note(format!(
                "task {}/{} destroyed ({children} processes left behind killed)",
                handle.alloc_id, handle.task
            ));
            self.gone(&(handle.alloc_id.clone(), handle.task.clone()));
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
        if self.crashes_on(socket, call.name()) {
            return Err(IoError::new(ErrorKind::Unavailable, "transport is closing"));
        }
        if self.plugins.mode().fails(call.name()) {
            return Err(IoError::other(
                "rpc error: code = Internal desc = injected plugin failure",
            ));
        }
        let reply = match call {
            CsiCall::Probe => CsiReply::Probe {
                ready: !self.faults.never_ready,
            },
            CsiCall::GetPluginInfo => CsiReply::PluginInfo {
                name: "fake.drover.dev".into(),
                version: "0.1.0".into(),
            },
            CsiCall::GetPluginCapabilities => CsiReply::PluginCapabilities {
                controller_service: true,
                accessibility_constraints: !self.topology.is_empty(),
            },
            // Attach/detach, so every claim and release goes through the controller too; and
            // volumes made and deleted through the cluster.
            CsiCall::ControllerGetCapabilities => CsiReply::ControllerCapabilities(CsiControllerInfo {
                supports_attach_detach: true,
                supports_read_only_attach: true,
                supports_create_delete: true,
                ..CsiControllerInfo::default()
            }),
            CsiCall::NodeGetInfo => CsiReply::NodeInfo {
                node_id: format!("ext-{}", self.name),
                max_volumes: 0,
                topology: (!self.topology.is_empty()).then(|| drover_core::structs::CsiTopology {
                    segments: self.topology.clone(),
                }),
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
                let mut state = self.lock();
                state.staged.insert(staging_target_path.clone());
                state.mounts.insert(staging_target_path);
                CsiReply::Done
            }
            CsiCall::NodeUnstageVolume {
                staging_target_path, ..
            } => {
                let mut state = self.lock();
                let users: Vec<String> = state
                    .published
                    .iter()
                    .filter(|(_, staging)| **staging == staging_target_path)
                    .map(|(target, _)| target.clone())
                    .collect();
                state.staged.remove(&staging_target_path);
                state.mounts.remove(&staging_target_path);
                drop(state);
                if !users.is_empty() {
                    self.recorder.violate(
                        "unpublish before unstage",
                        format!(
                            "{}: {staging_target_path} unstaged while {users:?} still published",
                            self.name
                        ),
                    );
                }
                CsiReply::Done
            }
            // The simulated file systems have no size: the node sees what was asked.
            CsiCall::NodeExpandVolume { capacity_min, .. } => CsiReply::Expanded { capacity: capacity_min },
            CsiCall::NodePublishVolume {
                volume_id,
                target_path,
                staging_target_path,
                ..
            } => {
                let mut state = self.lock();
                if !state.staged.contains(&staging_target_path) {
                    drop(state);
                    self.recorder.violate(
                        "stage before publish",
                        format!(
                            "{}: {target_path} published from unstaged {staging_target_path:?}",
                            self.name
                        ),
                    );
                    return Err(IoError::new(ErrorKind::FailedPrecondition, "volume not staged"));
                }
                state.published.insert(target_path.clone(), staging_target_path);
                state.mounts.insert(target_path.clone());
                drop(state);
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
                let was = {
                    let mut state = self.lock();
                    state.published.remove(&target_path);
                    state.mounts.remove(&target_path)
                };
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
                io @ (Io::Mkdir { .. }
                | Io::RemoveAll { .. }
                | Io::Rmdir { .. }
                | Io::IsMountPoint { .. }
                | Io::ReadFile { .. }
                | Io::WriteFile { .. }
                | Io::WriteBytes { .. }) => host.filesystem(io),
                Io::RunCommand {
                    program,
                    args,
                    stdout_path,
                    ..
                } => host.run_command(program, args, stdout_path).await,
                Io::StartTask(config) => match host.docker(&config.driver) {
                    Some(docker) => Ok(Reply::Started(docker.start(*config).await?)),
                    None => host.start(*config),
                },
                Io::StopTask {
                    handle,
                    kill_timeout,
                    signal,
                } if host.docker(&handle.driver).is_some() => {
                    let docker = host.docker(&handle.driver).expect("checked");
                    docker.stop(handle, kill_timeout, signal).await.map(|()| Reply::Unit)
                }
                Io::DestroyTask { handle } if host.docker(&handle.driver).is_some() => {
                    let docker = host.docker(&handle.driver).expect("checked");
                    docker.destroy(handle).await.map(|()| Reply::Unit)
                }
                Io::SignalTask { handle, signal } if host.docker(&handle.driver).is_some() => {
                    let docker = host.docker(&handle.driver).expect("checked");
                    docker.signal(&handle, signal).map(|()| Reply::Unit)
                }
                Io::RecoverTask { handle } if host.docker(&handle.driver).is_some() => {
                    let docker = host.docker(&handle.driver).expect("checked");
                    docker.recover(handle).await.map(|()| Reply::Unit)
                }
                Io::CreateNetwork {
                    alloc_id,
                    driver,
                    ports,
                } => match host.docker(&driver) {
                    Some(docker) => docker.create_network(alloc_id, ports).await.map(Reply::Network),
                    None => Err(IoError::new(
                        drover_core::client::ErrorKind::Unsupported,
                        format!("the {driver} driver cannot make a group network"),
                    )),
                },
                // A simulated host serves no sockets: what reaches Consul is modelled apart.
                Io::ProxySocket { path, target } => {
                    host.note(format!("socket {path} forwards to {target}"));
                    Ok(Reply::Unit)
                }
                Io::StopProxySocket { path } => {
                    host.note(format!("socket {path} closed"));
                    Ok(Reply::Unit)
                }
                Io::DestroyNetwork { alloc_id, network } => match host.docker(&network.driver) {
                    Some(docker) => docker.destroy_network(alloc_id, network).await.map(|()| Reply::Unit),
                    None => Ok(Reply::Unit),
                },
                Io::StopTask {
                    handle, kill_timeout, ..
                } => host.stop(&handle, kill_timeout).await,
                Io::DestroyTask { handle } => host.destroy(&handle),
                Io::SignalTask { handle, signal } => match host.with_task(&handle, SimTask::running) {
                    Some(true) => {
                        host.note(format!("task {}/{} signalled ({signal})", handle.alloc_id, handle.task));
                        Ok(Reply::Unit)
                    }
                    _ => Err(IoError::new(ErrorKind::NotFound, "process gone")),
                },
                // Into real files, by the production code (`task_planted_links`).
                Io::RenderTemplate(request)
                    if host.files.as_ref().is_some_and(|files| files.owns(&request.task_dir)) =>
                {
                    let files = host.files.as_ref().expect("checked");
                    let rendered = files.render(&request);
                    let what = format!("render {}/{}", request.task_dir, request.template.dest_path);
                    let seen = rendered.as_ref().map(|reply| reply.content.as_str()).unwrap_or("");
                    let seen = seen.to_string();
                    host.judged(files, &what, Some(&seen), rendered).map(Reply::Rendered)
                }
                // The production renderer; files are not modelled, only their directories.
                Io::RenderTemplate(request) => {
                    if !request.template.source_path.is_empty() {
                        return Err(IoError::other("template sources are not modelled on simulated hosts"));
                    }
                    let reply = drover_io_real::template::render(
                        &request.template.embedded_tmpl,
                        &request.env,
                        &request.variables,
                    )
                    .map_err(IoError::other)?;
                    if reply.complete() {
                        let destination = format!("{}/{}", request.task_dir, request.template.dest_path);
                        if let Some((parent, _)) = destination.rsplit_once('/') {
                            host.lock().dirs.insert(parent.to_string());
                        }
                    }
                    Ok(Reply::Rendered(reply))
                }
                Io::RecoverTask { handle } => match host.with_task(&handle, SimTask::running) {
                    Some(true) => Ok(Reply::Unit),
                    _ => Err(IoError::new(ErrorKind::NotFound, "process gone")),
                },
                Io::PrepareDevices { .. } => Ok(Reply::Reserved(Default::default())),
                Io::Csi { socket, call } => {
                    match host.plugins.mode() {
                        PluginMode::Hanging => std::future::pending::<()>().await,
                        PluginMode::Slow => tokio::time::sleep(SLOW_LATENCY).await,
                        PluginMode::Healthy
                        | PluginMode::Failing
                        | PluginMode::FailCall(_)
                        | PluginMode::LoseAnswers => {}
                    }
                    if let Some(delay) = host.faults.slow_calls.get(call.name()) {
                        tokio::time::sleep(*delay).await;
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
        if let Some(docker) = self.docker(&handle.driver) {
            return docker.wait(handle);
        }
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
                                task.end(ExitResult {
                                    exit_code,
                                    ..ExitResult::default()
                                })
                            });
                            host.note(format!("task {}/{} exited with {exit_code}", handle.alloc_id, handle.task));
                            host.gone_if_so(&handle);
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
                    update_time_ms: 0,
                },
            )
        })
        .chain(
            self.docker
                .as_ref()
                .map(|(_, docker)| (docker.name().to_string(), docker.capabilities(), docker.fingerprint())),
        )
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

    fn task_stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        self.docker(&handle.driver)?.stats(handle)
    }

    fn controller(&self, socket: String, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, CsiCallError>> {
        let host = self.clone();
        Box::pin(async move {
            if !host.plugin_listening(&socket) {
                return Err(CsiCallError::new(
                    CsiCallFailure::Unreachable,
                    format!("CSI client error (retryable): dial unix {socket}: connect: connection refused"),
                ));
            }
            SimPlugins::new(&host.name, host.recorder.clone(), host.plugins.clone())
                .call(request)
                .await
        })
    }
}
