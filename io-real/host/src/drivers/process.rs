//! The process drivers. `raw_exec` runs the command as a child of the agent with no
//! isolation (and cannot mount anything: `MountConfigs = none`). `exec` runs it in its own
//! mount namespace (and PID, IPC and UTS namespaces: the task is PID 1 and its /proc shows
//! its own processes only), chrooted into its task dir with the host's system dirs bound read-only,
//! the alloc dir at `/alloc`, and every volume and CSI mount bound at its destination with
//! the requested propagation (`MountConfigs = all`), and a /dev of its own with the usual
//! nodes plus the reserved devices; the namespace, and so every bind mount,
//! disappears with the task. Both put the task in its own process group, send SIGINT, then
//! SIGKILL after `kill_timeout`, and write stdout/stderr to `<log_dir>/<task>.std{out,err}.0`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::{
    DriverCapabilities, ErrorKind, ExitResult, IoError, MountConfigSupport, TaskConfig, TaskHandle,
};
use drover_core::structs::{ConfigValue, Propagation};
use tokio::sync::watch;

use super::cgroup::{Cgroups, Limits, TaskCgroup};
use drover_io_real::drivers::{DriverFingerprint, TaskDriver, TaskResourceUsage};
use drover_io_real::io::BoxFuture;
use drover_io_real::shared_mounts::{cstring, make_shared, release_shared};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RawExec,
    Exec,
}

type Key = (String, String);

#[derive(Clone)]
struct Running {
    exit: watch::Receiver<Option<ExitResult>>,
}

#[derive(Clone)]
pub struct ProcessDriver {
    kind: Kind,
    /// Turned off by the operator (raw_exec's default outside `-dev`).
    disabled: bool,
    /// The host's cgroups, when tasks can have them (`None`: process groups only).
    cgroups: Option<Arc<Cgroups>>,
    tasks: Arc<Mutex<BTreeMap<Key, Running>>>,
    /// The previous CPU sample of each task, by session leader.
    samples: Arc<Mutex<BTreeMap<i32, CpuSample>>>,
    /// The agent binary, which runs the log collectors (`agent logmon`); without it a task's
    /// output goes straight into `<task>.<stream>.0`, unrotated.
    logmon: Option<Arc<PathBuf>>,
}

/// When a task's CPU was sampled, and its user and system ticks then.
type CpuSample = (std::time::Instant, u64, u64);

/// What a handle carries for reattaching: the pid and its start time (so a recycled pid is
/// not mistaken for the task), and the boot it was started in.
#[derive(serde::Serialize, serde::Deserialize)]
struct HandleState {
    pid: i32,
    start_time: u64,
    /// The host's boot id when the task started (`/proc/sys/kernel/random/boot_id`). A start
    /// time counts clock ticks since boot, so pid and start time name a process only within
    /// one boot: after a reboot an early-boot daemon can have both. Empty in handles written
    /// before it was kept (then only pid and start time are checked).
    #[serde(default)]
    boot_id: String,
    /// Host sources bound onto themselves to share them with the task; released on exit.
    #[serde(default)]
    shared: Vec<String>,
    /// The task's cgroup, when it has one: every process it started, for the final kill.
    #[serde(default)]
    cgroup: Option<TaskCgroup>,
    /// The task's log collectors (pid and start time): they exit once the task's output
    /// closes, and the task is destroyed only once they have (`destroy_task`).
    #[serde(default)]
    collectors: Vec<(i32, u64)>,
}

/// A task's stdout and stderr (pipes to their collectors, or files), and the collectors.
type Outputs = (std::process::Stdio, std::process::Stdio, Vec<(i32, u64)>);

/// A task's command, ready to spawn.
struct TaskCommand {
    cmd: tokio::process::Command,
    /// The command's name, for errors.
    name: String,
    /// The host sources shared for bidirectional mounts.
    shared: Vec<String>,
    /// The log collectors started for it (pid and start time).
    collectors: Vec<(i32, u64)>,
}

/// This boot of the host, or empty where the kernel does not say.
fn boot_id() -> &'static str {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BOOT_ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().to_string())
            .unwrap_or_default()
    })
}

impl HandleState {
    /// A handle's state. One written in an earlier boot names nothing alive: its processes,
    /// cgroup and bind mounts went with that boot, and a process, cgroup or mount of the same
    /// name now belongs to someone else — so it comes back inert (no pid, no cgroup, nothing
    /// shared), and nothing done through it can signal, kill or unmount what it no longer owns.
    fn read(handle: &TaskHandle) -> Result<HandleState, IoError> {
        let mut state: HandleState =
            serde_json::from_str(&handle.state).map_err(|error| IoError::other(format!("bad task handle: {error}")))?;
        if state.written_in_earlier_boot(boot_id()) {
            state.pid = 0;
            state.cgroup = None;
            state.shared.clear();
            state.collectors.clear();
        }
        Ok(state)
    }

    fn written_in_earlier_boot(&self, current: &str) -> bool {
        !self.boot_id.is_empty() && !current.is_empty() && self.boot_id != current
    }
}

/// The environment a running task process started with (`/proc/<pid>/environ`).
fn task_environment(pid: i32) -> Result<Vec<(String, String)>, IoError> {
    let environ =
        std::fs::read(format!("/proc/{pid}/environ")).map_err(|e| io_error("read the task's environment", e))?;
    Ok(environ
        .split(|byte| *byte == 0)
        .filter_map(|pair| {
            let text = String::from_utf8_lossy(pair);
            let (key, value) = text.split_once('=')?;
            Some((key.to_string(), value.to_string()))
        })
        .collect())
}

/// Host directories bound read-only into an `exec` task's root.
const SYSTEM_DIRS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/etc"];

impl ProcessDriver {
    pub fn raw_exec() -> Self {
        ProcessDriver {
            kind: Kind::RawExec,
            disabled: false,
            cgroups: host_cgroups(),
            tasks: Arc::default(),
            samples: Arc::default(),
            logmon: None,
        }
    }

    pub fn exec() -> Self {
        ProcessDriver {
            kind: Kind::Exec,
            disabled: false,
            cgroups: host_cgroups(),
            tasks: Arc::default(),
            samples: Arc::default(),
            logmon: None,
        }
    }

    /// Task output is rotated per the task's `logs {}` by collectors run from `agent`.
    pub fn with_logmon(mut self, agent: PathBuf) -> Self {
        self.logmon = Some(Arc::new(agent));
        self
    }

    /// Where the task's stdout and stderr go: pipes read by two collectors (`logmon`), or,
    /// without one, files appended to directly.
    fn outputs(&self, config: &TaskConfig) -> Result<Outputs, IoError> {
        let dir = Path::new(&config.log_dir);
        let Some(agent) = &self.logmon else {
            let open_log = |stream: &str| {
                let path = dir.join(format!("{}.{stream}.0", config.task));
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| io_error(&format!("open {}", path.display()), e))
            };
            return Ok((open_log("stdout")?.into(), open_log("stderr")?.into(), Vec::new()));
        };
        let mut writers = Vec::new();
        let mut collectors = Vec::new();
        for stream in ["stdout", "stderr"] {
            let (reader, writer) = std::io::pipe().map_err(|e| io_error("create a log pipe", e))?;
            let base = format!("{}.{stream}", config.task);
            let size = u64::from(config.logs.max_file_size_mb) * 1024 * 1024;
            let mut collector = tokio::process::Command::new(agent.as_path());
            collector
                .args(drover_io_real::logmon::args(dir, &base, config.logs.max_files, size))
                .current_dir(dir)
                .stdin(reader)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            // No `pre_exec`: the collector is spawned, not forked from the agent, and makes
            // its own session first thing (`logmon::main`).
            let mut child = collector
                .spawn()
                .map_err(|e| io_error(&format!("start the log collector for {base}"), e))?;
            if let Some(pid) = child.id().map(|pid| pid as i32)
                && let Some(started) = start_time(pid)
            {
                collectors.push((pid, started));
            }
            // Reaped here while this agent lives; after a restart, by whoever adopts it.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
            writers.push(writer);
        }
        let stderr = writers.pop().expect("two streams");
        let stdout = writers.pop().expect("two streams");
        Ok((stdout.into(), stderr.into(), collectors))
    }

    /// The driver as a client without `plugin "raw_exec" { config { enabled = true } }` has
    /// it: not detected, so the scheduler places no task on it here ("missing drivers").
    pub fn disabled(mut self) -> Self {
        self.disabled = true;
        self
    }

    /// The same driver without cgroups (the fallback a host without them gets).
    pub fn without_cgroups(mut self) -> Self {
        self.cgroups = None;
        self
    }

    /// Whether this driver puts tasks in cgroups.
    pub fn uses_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }
}

/// The host's cgroup layout, detected once per agent; when there is none, the agent says why
/// once and its tasks fall back to process groups.
fn host_cgroups() -> Option<Arc<Cgroups>> {
    static HOST: std::sync::OnceLock<Option<Arc<Cgroups>>> = std::sync::OnceLock::new();
    HOST.get_or_init(|| match Cgroups::detect() {
        Ok(cgroups) => {
            tracing::info!(?cgroups, "tasks run in their own cgroups");
            Some(Arc::new(cgroups))
        }
        Err(reason) => {
            tracing::warn!(
                %reason,
                "tasks cannot have cgroups: they run in process groups, and a process that leaves its \
                 task's session outlives the task"
            );
            None
        }
    })
    .clone()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat).
use crate::nsexec::start_time;

/// Whether `pid` is the live process that started at `started`: a zombie has exited even though
/// its /proc entry stays until its parent reaps it.
fn is_running(pid: i32, started: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(after) = stat.rfind(')').map(|at| &stat[at + 2..]) else {
        return false;
    };
    let mut fields = after.split_whitespace();
    let state = fields.next();
    let start = fields.nth(18).and_then(|field| field.parse::<u64>().ok());
    state != Some("Z") && state != Some("X") && start == Some(started)
}

/// What /proc says about one process: session, user and system ticks, RSS pages.
struct ProcStat {
    session: i32,
    utime: u64,
    stime: u64,
    rss_pages: u64,
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces and parentheses); field 3 is [0].
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(ProcStat {
        session: fields.get(6 - 3)?.parse().ok()?,
        utime: field(14)?,
        stime: field(15)?,
        rss_pages: field(24)?,
    })
}

/// The processes of the session `leader` started (tasks run with `setsid`).
fn session_members(leader: i32) -> Vec<(i32, ProcStat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut members: Vec<(i32, ProcStat)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, proc_stat(pid)?)))
        .filter(|(_, stat)| stat.session == leader)
        .collect();
    members.sort_by_key(|(pid, _)| *pid);
    members
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

fn uptime_seconds() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn propagation_flag(propagation: Propagation) -> libc::c_ulong {
    match propagation {
        Propagation::Private => libc::MS_PRIVATE,
        Propagation::HostToTask => libc::MS_SLAVE,
        Propagation::Bidirectional => libc::MS_SHARED,
    }
}

/// Nomad's shared allocation directories beside `logs`: `data` (kept across the allocation's
/// tasks) and `tmp`, writable by a task of any user (`tmp` sticky). Made once; one that exists
/// is left as it is, and a mode is set only through the directory just made, opened without
/// following a link, so a link a task planted in its place never has a host path changed.
fn shared_alloc_dirs(alloc_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    for (name, mode) in [("data", 0o777), ("tmp", 0o1777)] {
        let path = alloc_dir.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&path)?;
        dir.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn io_error(context: &str, error: std::io::Error) -> IoError {
    let kind = match error.kind() {
        std::io::ErrorKind::NotFound => ErrorKind::NotFound,
        _ => ErrorKind::Other,
    };
    IoError::new(kind, format!("{context}: {error}"))
}

/// The `PATH` an `exec` task runs with unless it sets its own.
const EXEC_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// Prepares the root of an `exec` task: directories for every bind target, created by the
/// agent before the fork (the child only mounts and chroots).
/// Also returns the host sources it bound onto themselves to share them (see
/// [`release_shared`]).
fn prepare_root(
    config: &TaskConfig,
) -> Result<(CString, Vec<drover_io_real::taskexec::BindMount>, Vec<String>), IoError> {
    let root = PathBuf::from(&config.task_dir);
    let mut binds = Vec::new();
    let mut shared = Vec::new();
    let mut add = |source: &Path, task_path: &str, readonly: bool, propagation: Propagation| -> Result<(), IoError> {
        let target = root.join(task_path.trim_start_matches('/'));
        if source.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| io_error(&format!("create {}", target.display()), e))?;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_error(&format!("create {}", parent.display()), e))?;
            }
            if !target.exists() {
                std::fs::File::create(&target).map_err(|e| io_error(&format!("create {}", target.display()), e))?;
            }
        }
        // The clone a bidirectional bind attaches is opened by whoever enters the namespace
        // (`taskexec::open_detached`); the source is made shared here.
        if propagation == Propagation::Bidirectional && make_shared(source)? {
            shared.push(source.display().to_string());
        }
        binds.push(drover_io_real::taskexec::BindMount {
            source: cstring(source)?,
            target: cstring(&target)?,
            readonly,
            propagation: propagation_flag(propagation),
            detached: None,
        });
        Ok(())
    };
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        if path.exists() {
            add(path, dir, true, Propagation::Private)?;
        }
    }
    // A minimal /dev of the task's own (the host's /dev is not shared): the usual nodes, then
    // the devices its reservation names.
    for node in ["null", "zero", "full", "random", "urandom", "tty", "pts", "shm"] {
        let host = Path::new("/dev").join(node);
        if host.exists() {
            add(&host, &format!("/dev/{node}"), false, Propagation::Private)?;
        }
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = root.join("dev").join(link);
        if path.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(target, &path).map_err(|e| io_error(&format!("link {}", path.display()), e))?;
        }
    }
    for device in &config.devices {
        let source = Path::new(&device.host_path);
        if !source.exists() {
            return Err(IoError::new(
                ErrorKind::NotFound,
                format!("device {} does not exist", device.host_path),
            ));
        }
        add(
            source,
            &device.task_path,
            !device.permissions.contains('w'),
            Propagation::Private,
        )?;
    }
    // The task's own /proc, mounted inside its PID namespace (`enter_namespace`): it shows the
    // task's processes only.
    std::fs::create_dir_all(root.join("proc")).map_err(|e| io_error("create proc", e))?;
    let alloc_shared = Path::new(&config.log_dir).parent().map(Path::to_path_buf);
    if let Some(alloc_shared) = alloc_shared {
        add(&alloc_shared, "/alloc", false, Propagation::Private)?;
    }
    for mount in &config.mounts {
        let source = Path::new(&mount.host_path);
        if !source.exists() {
            return Err(IoError::new(
                ErrorKind::NotFound,
                format!("mount source {} does not exist", mount.host_path),
            ));
        }
        add(source, &mount.task_path, mount.readonly, mount.propagation)?;
    }
    std::fs::create_dir_all(root.join("tmp")).map_err(|e| io_error("create tmp", e))?;
    Ok((cstring(&root)?, binds, shared))
}

fn exit_result(status: std::process::ExitStatus) -> ExitResult {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitResult {
            exit_code: code,
            ..ExitResult::default()
        },
        (None, Some(signal)) => ExitResult {
            exit_code: 128 + signal,
            signal,
            ..ExitResult::default()
        },
        _ => ExitResult {
            err: Some("unknown exit status".into()),
            ..ExitResult::default()
        },
    }
}

impl ProcessDriver {
    async fn spawn(&self, config: TaskConfig) -> Result<TaskHandle, IoError> {
        let cgroup = match &self.cgroups {
            Some(cgroups) => {
                let limits = Limits {
                    cpuset: drover_core::structs::cpuset(&config.reserved_cores),
                    cpu_mhz: config.cpu_mhz,
                    memory_mb: config.memory_mb,
                    memory_max_mb: config.memory_max_mb,
                };
                // A host whose cgroups refuse this one task (a controller mounted read-only, a
                // limit on descendants) still runs it, in its process group, and says so.
                match cgroups.create(&config.alloc_id, &config.task, limits) {
                    Ok(cgroup) => Some(cgroup),
                    Err(error) => {
                        tracing::warn!(
                            alloc = %config.alloc_id,
                            task = %config.task,
                            %error,
                            "cannot create the task's cgroup; it runs in a process group only"
                        );
                        None
                    }
                }
            }
            None => None,
        };
        let undo = |shared: &[String]| {
            release_shared(shared);
            if let Some(cgroup) = &cgroup {
                cgroup.remove();
            }
        };
        let TaskCommand {
            mut cmd,
            name: command,
            shared,
            collectors,
        } = match self.command(&config, cgroup.as_ref()) {
            Ok(built) => built,
            Err(error) => {
                undo(&[]);
                return Err(error);
            }
        };
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(error) => {
                undo(&shared);
                return Err(io_error(&format!("{}: start {command}", self.name()), error));
            }
        };
        // The start time is what makes the pid safe to signal later: without it a stop could
        // reach whatever process reused the pid, so a task whose start time cannot be read does
        // not start.
        if let (Some(pid), Some(cgroup)) = (child.id(), &cgroup)
            && let Err(error) = cgroup.adopt(pid as i32)
        {
            // Gone already (a helper that failed): its exit is reported as any task's.
            tracing::debug!(pid, %error, "could not move the task into its cgroup");
        }
        let Some((pid, start_time)) = child.id().and_then(|pid| Some((pid as i32, start_time(pid as i32)?))) else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            if let Some(cgroup) = &cgroup {
                cgroup.kill_all().await;
            }
            undo(&shared);
            return Err(IoError::other(format!(
                "{}: cannot read the start time of the task process",
                self.name()
            )));
        };
        let (sender, receiver) = watch::channel(None);
        let watched = cgroup.clone();
        tokio::spawn(async move {
            let mut exit = match child.wait().await {
                Ok(status) => exit_result(status),
                Err(error) => ExitResult {
                    err: Some(error.to_string()),
                    ..ExitResult::default()
                },
            };
            // What the leader left behind is the client's to destroy (`destroy`), once it has
            // heard of the exit; only the kernel's OOM verdict is read now.
            exit.oom_killed |= watched.as_ref().is_some_and(TaskCgroup::oom_killed);
            let _ = sender.send(Some(exit));
        });
        self.tasks.lock().unwrap().insert(
            (config.alloc_id.clone(), config.task.clone()),
            Running { exit: receiver },
        );
        Ok(TaskHandle {
            driver: self.name().to_string(),
            alloc_id: config.alloc_id,
            task: config.task,
            state: serde_json::to_string(&HandleState {
                pid,
                start_time,
                boot_id: boot_id().to_string(),
                shared,
                cgroup,
                collectors,
            })
            .expect("serializable"),
        })
    }

    /// The task's command, ready to spawn: arguments, logs, environment, and what the child
    /// does between fork and exec (join the task's cgroup, lead a new session, and for `exec`
    /// enter its own mount namespace and root), with its name, the host sources shared for
    /// bidirectional mounts and the log collectors started for it.
    fn command(&self, config: &TaskConfig, cgroup: Option<&TaskCgroup>) -> Result<TaskCommand, IoError> {
        let command = config
            .config
            .get("command")
            .and_then(ConfigValue::as_str)
            .ok_or_else(|| IoError::other(format!("{}: config is missing \"command\"", self.name())))?
            .to_string();
        let args = match config.config.get("args") {
            None => Vec::new(),
            Some(value) => value
                .as_strings()
                .ok_or_else(|| IoError::other(format!("{}: \"args\" must be a list of strings", self.name())))?,
        };
        std::fs::create_dir_all(&config.log_dir).map_err(|e| io_error("create log dir", e))?;
        if let Some(alloc_dir) = Path::new(&config.log_dir).parent() {
            shared_alloc_dirs(alloc_dir).map_err(|e| io_error("create shared alloc dirs", e))?;
        }
        let (stdout, stderr, collectors) = self.outputs(config)?;
        let join = cgroup.map(TaskCgroup::join_paths).unwrap_or_default();
        if let (Kind::RawExec, Some(agent)) = (self.kind, self.logmon.as_ref()) {
            std::fs::create_dir_all(&config.task_dir).map_err(|e| io_error("create task dir", e))?;
            // Started through `agent taskexec` (see `drover_io_real::taskexec`): spawned, never a
            // fork of the agent. What the helper will exec is resolved here, so a missing
            // command still fails the start and names itself.
            let path = config.env.get("PATH").map(std::ffi::OsStr::new);
            if drover_io_real::taskexec::resolve(&command, Path::new(&config.task_dir), path).is_none() {
                return Err(io_error(
                    &format!("{}: start {command}", self.name()),
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ));
            }
            let mut helper = tokio::process::Command::new(agent.as_path());
            helper
                .args(drover_io_real::taskexec::args(&join, None, &command, &args))
                .stdin(std::process::Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .current_dir(&config.task_dir)
                .envs(&config.env);
            return Ok(TaskCommand {
                cmd: helper,
                name: command,
                shared: Vec::new(),
                collectors,
            });
        }
        // An `exec` task's root, prepared by the agent (its directories and bind sources).
        let mut exec_root = match self.kind {
            Kind::Exec => Some(prepare_root(config)?),
            Kind::RawExec => None,
        };
        if let (Some((root, binds, shared)), Some(agent)) = (&exec_root, self.logmon.as_ref()) {
            // Through `agent taskexec` as a raw_exec task, which also enters the task's
            // namespaces and root (and clones the sources of bidirectional binds, a CSI node
            // plugin's); the command is resolved as the task will see it, so a missing one
            // still fails the start by name.
            let task_path = config.env.get("PATH").map(String::as_str).unwrap_or(EXEC_PATH);
            let root_dir = Path::new(std::ffi::OsStr::from_bytes(root.as_bytes()));
            if drover_io_real::taskexec::resolve_in_root(&command, root_dir, binds, Some(task_path.as_ref())).is_none()
            {
                return Err(io_error(
                    &format!("{}: start {command}", self.name()),
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ));
            }
            let isolation = drover_io_real::taskexec::Isolation { root, binds };
            let mut helper = tokio::process::Command::new(agent.as_path());
            helper
                .args(drover_io_real::taskexec::args(&join, Some(&isolation), &command, &args))
                .stdin(std::process::Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .env_clear()
                .env("PATH", EXEC_PATH)
                .envs(&config.env);
            return Ok(TaskCommand {
                cmd: helper,
                name: command,
                shared: shared.clone(),
                collectors,
            });
        }
        let mut shared = Vec::new();
        let mut cmd = tokio::process::Command::new(&command);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        match self.kind {
            Kind::RawExec => {
                std::fs::create_dir_all(&config.task_dir).map_err(|e| io_error("create task dir", e))?;
                cmd.current_dir(&config.task_dir).envs(&config.env);
                // SAFETY: joining the cgroup (open/write/close of prepared paths), setsid and
                // the signal resets are async-signal-safe.
                unsafe {
                    cmd.pre_exec(move || {
                        drover_io_real::taskexec::join_in_child(&join)?;
                        libc::setsid();
                        drover_io_real::taskexec::reset_signals();
                        Ok(())
                    });
                }
            }
            Kind::Exec => {
                let (root, mut binds, prepared) = exec_root.take().expect("prepared for an exec task");
                shared = prepared;
                // Forked without the agent binary: the clones are opened here, before the fork.
                drover_io_real::taskexec::open_detached(&mut binds).map_err(IoError::other)?;
                cmd.env_clear().env("PATH", EXEC_PATH).envs(&config.env);
                // SAFETY: the closure only makes syscalls on data prepared before the fork.
                unsafe {
                    cmd.pre_exec(move || {
                        drover_io_real::taskexec::join_in_child(&join)?;
                        libc::setsid();
                        drover_io_real::taskexec::reset_signals();
                        drover_io_real::taskexec::enter_pid_namespace()?;
                        drover_io_real::taskexec::enter_namespace(&root, &binds)
                    });
                }
            }
        }
        Ok(TaskCommand {
            cmd,
            name: command,
            shared,
            collectors,
        })
    }

    fn running(&self, handle: &TaskHandle) -> Option<Running> {
        self.tasks
            .lock()
            .unwrap()
            .get(&(handle.alloc_id.clone(), handle.task.clone()))
            .cloned()
    }
}

/// Sends `signal` to the process group the task leads, but only while `pid` is still the
/// process the task started as (same start time): after the task was reaped, or after an agent
/// restart, the pid may belong to another process, whose group must not be signalled. Pids 0
/// and 1 are never signalled (`kill(-1)` reaches every process, `kill(0)` our own group).
/// Returns whether the signal was sent.
pub(crate) fn signal_task(pid: i32, started: u64, signal: i32) -> bool {
    if pid <= 1 || start_time(pid) != Some(started) {
        return false;
    }
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(-pid, signal) == 0 }
}

/// Kills what is left of a task's session once its leader is gone: a shell that exits on
/// SIGINT leaves background children (which ignore SIGINT) running, re-parented to PID 1. While
/// any process still has the session id, that id cannot be handed out as a pid, so every
/// process found with it belongs to the task.
fn kill_session_leftovers(leader: i32) {
    if leader <= 1 {
        return;
    }
    for (pid, _) in session_members(leader) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Once a task's leader is gone, nothing the task started may outlive it: every process left
/// in its cgroup is killed and the cgroup removed, or without cgroups the leader (if it still
/// runs) and what is left of its session.
async fn destroy_task(state: &HandleState) -> Result<(), IoError> {
    let all_gone = match &state.cgroup {
        Some(cgroup) => {
            let gone = cgroup.kill_all().await;
            cgroup.remove();
            gone
        }
        None => {
            signal_task(state.pid, state.start_time, libc::SIGKILL);
            kill_session_leftovers(state.pid);
            true
        }
    };
    release_shared(&state.shared);
    collectors_done(&state.collectors).await;
    if all_gone {
        Ok(())
    } else {
        Err(IoError::other(format!(
            "processes of task {} are still in its cgroup after SIGKILL",
            state.pid
        )))
    }
}

/// How long a task's log collectors have, once its output has closed, to write what is left
/// and exit before they are killed.
const COLLECTOR_DRAIN: Duration = Duration::from_secs(5);

/// Once the task's processes are gone, its output pipes close and its log collectors write
/// what is left and exit: waits for that, so nothing of the task outlives its destruction
/// (a dev agent's shutdown), and kills any still running after [`COLLECTOR_DRAIN`].
async fn collectors_done(collectors: &[(i32, u64)]) {
    let deadline = tokio::time::Instant::now() + COLLECTOR_DRAIN;
    loop {
        let left: Vec<&(i32, u64)> = collectors
            .iter()
            .filter(|(pid, started)| is_running(*pid, *started))
            .collect();
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            for (pid, started) in left {
                tracing::warn!(pid, "a log collector did not exit once its task was gone; killing it");
                signal_task(*pid, *started, libc::SIGKILL);
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for a task that is not our child (reattached after a restart): its exit status is
/// not ours to read.
async fn wait_foreign(pid: i32, started: u64) -> ExitResult {
    loop {
        if !is_running(pid, started) {
            return ExitResult {
                err: Some("task exited while the agent was not its parent; exit status unknown".into()),
                ..ExitResult::default()
            };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl ProcessDriver {
    /// CPU and RSS of every process in the task's cgroup (or, without one, its session). CPU
    /// percent covers the time since
    /// the previous sample of this task, or since the task started for the first one.
    fn session_usage(&self, leader: i32, leader_start: u64, cgroup: Option<&TaskCgroup>) -> Option<TaskResourceUsage> {
        if start_time(leader) != Some(leader_start) {
            self.samples.lock().unwrap().remove(&leader);
            return None;
        }
        // The cgroup holds every process of the task, daemons that left its session too.
        let members: Vec<(i32, ProcStat)> = match cgroup {
            Some(cgroup) => {
                let mut pids = cgroup.pids();
                pids.sort_unstable();
                pids.into_iter()
                    .filter_map(|pid| Some((pid, proc_stat(pid)?)))
                    .collect()
            }
            None => session_members(leader),
        };
        let (user, system) = members
            .iter()
            .fold((0u64, 0u64), |(u, s), (_, stat)| (u + stat.utime, s + stat.stime));
        let rss_bytes = members.iter().map(|(_, stat)| stat.rss_pages).sum::<u64>() * page_size();
        let hz = clock_ticks_per_second();
        let now = std::time::Instant::now();
        let previous = self.samples.lock().unwrap().insert(leader, (now, user, system));
        let (seconds, user_delta, system_delta) = match previous {
            Some((at, prev_user, prev_system)) if now.duration_since(at).as_secs_f64() >= 0.05 => (
                now.duration_since(at).as_secs_f64(),
                user.saturating_sub(prev_user),
                system.saturating_sub(prev_system),
            ),
            _ => {
                let started = leader_start as f64 / hz;
                (uptime_seconds().map(|up| up - started).unwrap_or(0.0), user, system)
            }
        };
        let percent = |ticks: u64| {
            if seconds > 0.0 {
                ticks as f64 / hz / seconds * 100.0
            } else {
                0.0
            }
        };
        Some(TaskResourceUsage {
            rss_bytes,
            user_percent: percent(user_delta),
            system_percent: percent(system_delta),
            pids: members.iter().map(|(pid, _)| *pid).collect(),
            cgroup: cgroup.map(TaskCgroup::usage),
        })
    }
}

impl TaskDriver for ProcessDriver {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::RawExec => "raw_exec",
            Kind::Exec => "exec",
        }
    }

    fn capabilities(&self) -> DriverCapabilities {
        match self.kind {
            Kind::RawExec => DriverCapabilities {
                mount_configs: MountConfigSupport::None,
                fs_isolation: false,
            },
            Kind::Exec => DriverCapabilities {
                mount_configs: MountConfigSupport::All,
                fs_isolation: true,
            },
        }
    }

    fn fingerprint(&self) -> DriverFingerprint {
        let mut attributes = BTreeMap::new();
        if self.disabled {
            return DriverFingerprint {
                detected: false,
                healthy: false,
                health_description: "disabled (enable with plugin \"raw_exec\" { config { enabled = true } })".into(),
                attributes,
                update_time_ms: 0,
            };
        }
        match self.kind {
            Kind::RawExec => {
                attributes.insert("driver.raw_exec".to_string(), "1".to_string());
                DriverFingerprint {
                    detected: true,
                    healthy: true,
                    health_description: "Healthy".into(),
                    attributes,
                    update_time_ms: 0,
                }
            }
            Kind::Exec => {
                let root = is_root();
                if root {
                    attributes.insert("driver.exec".to_string(), "1".to_string());
                }
                DriverFingerprint {
                    detected: root,
                    healthy: root,
                    health_description: if root {
                        "Healthy".into()
                    } else {
                        "exec driver must run as root".into()
                    },
                    attributes,
                    update_time_ms: 0,
                }
            }
        }
    }

    fn start(&self, config: TaskConfig) -> BoxFuture<Result<TaskHandle, IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.spawn(config).await })
    }

    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult> {
        let running = self.running(&handle);
        Box::pin(async move {
            match running {
                Some(Running { mut exit, .. }) => loop {
                    if let Some(result) = exit.borrow().clone() {
                        return result;
                    }
                    if exit.changed().await.is_err() {
                        return ExitResult {
                            err: Some("task watcher gone".into()),
                            ..ExitResult::default()
                        };
                    }
                },
                None => match HandleState::read(&handle) {
                    Ok(state) => {
                        let mut exit = wait_foreign(state.pid, state.start_time).await;
                        exit.oom_killed |= state.cgroup.as_ref().is_some_and(TaskCgroup::oom_killed);
                        exit
                    }
                    Err(error) => ExitResult {
                        err: Some(error.to_string()),
                        ..ExitResult::default()
                    },
                },
            }
        })
    }

    fn stop(&self, handle: TaskHandle, kill_timeout: Duration, signal: i32) -> BoxFuture<Result<(), IoError>> {
        let state = HandleState::read(&handle);
        let driver = self.clone();
        Box::pin(async move {
            let state = state?;
            // The whole process group: the task and anything it started; only while the pid
            // is still the task's (`signal_task`).
            if signal_task(state.pid, state.start_time, signal) {
                let gone = driver.wait(handle.clone());
                if tokio::time::timeout(kill_timeout, gone).await.is_err() {
                    signal_task(state.pid, state.start_time, libc::SIGKILL);
                    driver.wait(handle).await;
                }
            }
            // What the leader leaves behind goes with `destroy`, which the client calls next.
            Ok(())
        })
    }

    fn recover(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>> {
        let known = self.running(&handle).is_some();
        Box::pin(async move {
            if known {
                return Ok(());
            }
            let state = HandleState::read(&handle)?;
            if is_running(state.pid, state.start_time) {
                Ok(())
            } else if state.pid == 0 {
                Err(IoError::new(
                    ErrorKind::NotFound,
                    "task process was started before this host rebooted",
                ))
            } else {
                // The leader died while the agent was away; the client destroys what it left
                // behind once it hears so.
                Err(IoError::new(
                    ErrorKind::NotFound,
                    format!("task process {} is gone", state.pid),
                ))
            }
        })
    }

    /// To the task's process group (an `exec` task's stand-in ignores it; the task, PID 1
    /// of its namespace, gets it), only while the pid is still the task's.
    fn signal(&self, handle: &TaskHandle, signal: i32) -> Result<(), IoError> {
        let state = HandleState::read(handle)?;
        if signal_task(state.pid, state.start_time, signal) {
            Ok(())
        } else {
            Err(IoError::new(
                ErrorKind::NotFound,
                format!("task process {} is gone", state.pid),
            ))
        }
    }

    fn destroy(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>> {
        let driver = self.clone();
        Box::pin(async move {
            let state = HandleState::read(&handle)?;
            let destroyed = destroy_task(&state).await;
            driver.tasks.lock().unwrap().remove(&(handle.alloc_id, handle.task));
            driver.samples.lock().unwrap().remove(&state.pid);
            destroyed
        })
    }

    /// The task's own environment and working directory (read from its process), in its
    /// cgroup; for `exec` also in its IPC, UTS, PID and mount namespaces under its root,
    /// through the agent's `nsexec` helper (without the agent binary, the mount namespace and
    /// root only).
    fn exec_command(
        &self,
        handle: &TaskHandle,
        command: &[String],
        tty: bool,
    ) -> Result<std::process::Command, IoError> {
        let state = HandleState::read(handle)?;
        if !signal_task(state.pid, state.start_time, 0) {
            return Err(IoError::new(ErrorKind::NotFound, "Task not running"));
        }
        // An `exec` task's pid is its stand-in in the host's namespaces; the task is its child.
        let pid = match self.kind {
            Kind::RawExec => state.pid,
            Kind::Exec => std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", state.pid))
                .ok()
                .and_then(|children| children.split_whitespace().next()?.parse().ok())
                .unwrap_or(state.pid),
        };
        let env = task_environment(pid)?;
        let (program, args) = command
            .split_first()
            .ok_or_else(|| IoError::other("must provide a command"))?;
        let join = state.cgroup.as_ref().map(TaskCgroup::join_paths).unwrap_or_default();
        let cwd = match self.kind {
            Kind::RawExec => Some(
                std::fs::read_link(format!("/proc/{pid}/cwd")).map_err(|e| io_error("read the task's directory", e))?,
            ),
            Kind::Exec => None,
        };
        if let Some(agent) = self.logmon.as_ref() {
            // Through `agent nsexec` (see `crate::nsexec`): spawned, never a fork of the agent.
            let enter = match self.kind {
                Kind::RawExec => None,
                Kind::Exec => Some(crate::nsexec::Enter {
                    pid,
                    start_time: start_time(pid).ok_or_else(|| IoError::new(ErrorKind::NotFound, "Task not running"))?,
                }),
            };
            let mut helper = std::process::Command::new(agent.as_path());
            helper
                .args(crate::nsexec::args(&join, tty, enter, command))
                .env_clear()
                .envs(env);
            if let Some(cwd) = cwd {
                helper.current_dir(cwd);
            }
            return Ok(helper);
        }
        // Without the agent binary for the helper, forked: an `exec` task's mount namespace
        // and root only.
        let mut cmd = std::process::Command::new(program);
        cmd.args(args).env_clear().envs(env.iter().cloned());
        // A raw_exec task's directory, or an exec task's mount namespace and root.
        let enter = match cwd {
            Some(cwd) => {
                cmd.current_dir(cwd);
                None
            }
            None => {
                let open = |path: String| std::fs::File::open(&path).map_err(|e| io_error(&format!("open {path}"), e));
                Some((open(format!("/proc/{pid}/ns/mnt"))?, open(format!("/proc/{pid}/root"))?))
            }
        };
        let fds = enter
            .as_ref()
            .map(|(mount_ns, root)| (mount_ns.as_raw_fd(), root.as_raw_fd()));
        let keep = Arc::new(enter);
        // SAFETY: the cgroup writes, setsid, the terminal ioctl, and setns, fchdir, chroot and
        // chdir on descriptors opened before the fork are async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                let _ = &keep;
                drover_io_real::taskexec::join_in_child(&join)?;
                libc::setsid();
                if tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some((mount_fd, root_fd)) = fds
                    && (libc::setns(mount_fd, libc::CLONE_NEWNS) != 0
                        || libc::fchdir(root_fd) != 0
                        || libc::chroot(c".".as_ptr()) != 0
                        || libc::chdir(c"/".as_ptr()) != 0)
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    fn stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        let state = HandleState::read(handle).ok()?;
        self.session_usage(state.pid, state.start_time, state.cgroup.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(boot: Option<&str>) -> TaskHandle {
        // This test's own process: a live pid whose start time matches, as a process of a
        // later boot can match a handle of an earlier one.
        let pid = std::process::id() as i32;
        let mut state = serde_json::json!({
            "pid": pid,
            "start_time": start_time(pid).expect("our own start time"),
            "shared": ["/srv/shared"],
        });
        if let Some(boot) = boot {
            state["boot_id"] = boot.into();
        }
        TaskHandle {
            driver: "raw_exec".into(),
            alloc_id: "a1".into(),
            task: "web".into(),
            state: state.to_string(),
        }
    }

    #[test]
    fn a_handle_from_an_earlier_boot_names_no_process_even_when_pid_and_start_time_match() {
        assert!(!boot_id().is_empty(), "this host names its boot");
        let earlier = HandleState::read(&handle(Some("0f1e2d3c-not-this-boot"))).unwrap();
        assert_eq!(earlier.pid, 0, "inert: nothing to signal");
        assert!(
            earlier.shared.is_empty() && earlier.cgroup.is_none(),
            "nothing to unmount or kill"
        );
        assert!(!is_running(earlier.pid, earlier.start_time));

        let this_boot = HandleState::read(&handle(Some(boot_id()))).unwrap();
        assert!(
            is_running(this_boot.pid, this_boot.start_time),
            "the same handle of this boot is the process"
        );
        let unversioned = HandleState::read(&handle(None)).unwrap();
        assert!(
            is_running(unversioned.pid, unversioned.start_time),
            "a handle written before boot ids were kept is checked by pid and start time, as before"
        );
    }
}
