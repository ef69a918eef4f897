//! Task drivers: the `TaskDriver` I/O trait the client driver executes `StartTask`,
//! `StopTask` and `RecoverTask` with, and the built-in drivers — `raw_exec` and `exec`
//! (real child processes, in `drover-host`'s `drivers`) and `mock` (scripted, also in the
//! simulation).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use drover_core::client::{DriverCapabilities, ExitResult, IoError, TaskConfig, TaskHandle};

use crate::io::BoxFuture;

pub mod mock;

/// What a driver reports about itself on this host (Nomad's `DriverInfo`).
pub use drover_core::structs::DriverInfo as DriverFingerprint;

pub trait TaskDriver: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    fn capabilities(&self) -> DriverCapabilities;

    fn fingerprint(&self) -> DriverFingerprint;

    /// Starts the task; the handle carries what `recover` needs after an agent restart.
    fn start(&self, config: TaskConfig) -> BoxFuture<Result<TaskHandle, IoError>>;

    /// Resolves when the task exits (the driver's task-event stream, one task at a time).
    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult>;

    /// Sends the task `signal` (its `kill_signal`), then kills it after `kill_timeout`;
    /// resolves once it is gone.
    fn stop(&self, handle: TaskHandle, kill_timeout: Duration, signal: i32) -> BoxFuture<Result<(), IoError>>;

    /// Reattaches to a task started before an agent restart.
    fn recover(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>>;

    /// Once the task's leader is gone: kills every process the task left behind, removes its
    /// cgroup and releases what the driver holds for it (Nomad's `DestroyTask`). Idempotent.
    fn destroy(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>>;

    /// Sends a signal (a Linux signal number) to the running task.
    fn signal(&self, handle: &TaskHandle, signal: i32) -> Result<(), IoError>;

    /// Makes the network namespace a bridge-mode allocation's tasks share, with `ports`
    /// published into it (Nomad's `CreateNetwork`); the allocation's existing one again
    /// after an agent restart. Only a driver whose tasks can join one does.
    fn create_network(
        &self,
        _alloc_id: String,
        _ports: Vec<drover_core::structs::AllocatedPort>,
    ) -> BoxFuture<Result<drover_core::client::AllocNetwork, IoError>> {
        let error = IoError::new(
            drover_core::client::ErrorKind::Unsupported,
            format!("the {} driver cannot make a group network", self.name()),
        );
        Box::pin(async move { Err(error) })
    }

    /// Removes what `create_network` made. Idempotent.
    fn destroy_network(
        &self,
        _alloc_id: String,
        _network: drover_core::client::AllocNetwork,
    ) -> BoxFuture<Result<(), IoError>> {
        Box::pin(async move { Ok(()) })
    }

    /// The task's CPU and memory use now (`None`: not measured by this driver, or gone).
    fn stats(&self, _handle: &TaskHandle) -> Option<TaskResourceUsage> {
        None
    }

    /// Starts `command` in the running task's context (`alloc exec`): by default the
    /// process [`exec_command`](Self::exec_command) sets up, for the host to run; a driver
    /// with an API of its own for it (the Docker Engine's exec) starts it there and hands
    /// over its streams.
    fn exec_launch(
        &self,
        handle: &TaskHandle,
        command: &[String],
        tty: bool,
    ) -> BoxFuture<Result<ExecLaunch, IoError>> {
        let launch = self.exec_command(handle, command, tty).map(ExecLaunch::Process);
        Box::pin(async move { launch })
    }

    /// `command` set up to run in the running task's context (`alloc exec`), leading a
    /// session of its own (with its stdin as the controlling terminal when `tty`).
    fn exec_command(
        &self,
        _handle: &TaskHandle,
        _command: &[String],
        _tty: bool,
    ) -> Result<std::process::Command, IoError> {
        Err(IoError::new(
            drover_core::client::ErrorKind::Unsupported,
            format!("the {} driver does not support exec", self.name()),
        ))
    }
}

/// How an `alloc exec` command starts: a process for the host to spawn, or one a driver
/// started through its own API.
pub enum ExecLaunch {
    Process(std::process::Command),
    Streams(ExecStreams),
}

/// A command a driver started in a task (the Docker Engine's exec): what it reads, what it
/// writes (stdout and stderr apart, or one terminal), and its [`ExecControl`].
pub struct ExecStreams {
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    pub output: futures::stream::BoxStream<'static, ExecOutput>,
    pub control: Arc<dyn ExecControl>,
}

/// A piece of a driver-started command's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOutput {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// What the host may do with a command its driver started: resize its terminal, learn its
/// exit code once its output ended, and kill it when the session is given up.
pub trait ExecControl: Send + Sync + 'static {
    fn resize(&self, width: u16, height: u16) -> BoxFuture<()>;
    fn exit_code(&self) -> BoxFuture<i32>;
    fn kill(&self) -> BoxFuture<()>;
}

/// One task's measured resource use (Nomad's `ResourceUsage` for the executor-based drivers:
/// RSS, and CPU percent split into user and system mode).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskResourceUsage {
    pub rss_bytes: u64,
    /// Percent of one core since the previous sample (or since the task started).
    pub user_percent: f64,
    pub system_percent: f64,
    pub pids: Vec<i32>,
    /// What the task's cgroup accounts (memory usage, cache, swap, CPU throttling); `None`
    /// without a cgroup.
    pub cgroup: Option<CgroupUsage>,
}

/// What a task's cgroup accounts to it; `None` where this kernel does not keep the figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub usage_bytes: Option<u64>,
    pub max_usage_bytes: Option<u64>,
    pub cache_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
    /// CFS periods in which the task was throttled, and for how long in all.
    pub throttled_periods: Option<u64>,
    pub throttled_time_ns: Option<u64>,
}

impl CgroupUsage {
    /// Two tasks' usage together (an allocation's total); a figure known for neither stays
    /// unknown.
    pub fn plus(self, other: CgroupUsage) -> CgroupUsage {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        CgroupUsage {
            usage_bytes: add(self.usage_bytes, other.usage_bytes),
            max_usage_bytes: add(self.max_usage_bytes, other.max_usage_bytes),
            cache_bytes: add(self.cache_bytes, other.cache_bytes),
            swap_bytes: add(self.swap_bytes, other.swap_bytes),
            throttled_periods: add(self.throttled_periods, other.throttled_periods),
            throttled_time_ns: add(self.throttled_time_ns, other.throttled_time_ns),
        }
    }
}

/// The drivers of one client, by name (the driver manager's table).
#[derive(Clone, Default)]
pub struct Drivers {
    drivers: BTreeMap<String, Arc<dyn TaskDriver>>,
}

impl Drivers {
    pub fn with(mut self, driver: Arc<dyn TaskDriver>) -> Self {
        self.drivers.insert(driver.name().to_string(), driver);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn TaskDriver>> {
        self.drivers.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn TaskDriver>> {
        self.drivers.values()
    }
}

impl std::fmt::Debug for Drivers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.drivers.keys()).finish()
    }
}
