//! What the container driver asks of a container engine: the Engine API's calls the driver
//! makes, with typed answers and failures. A host's Docker Engine (or podman's compatible
//! API) answers through `drover-docker`'s bollard client; a simulation's engine, in io-sim,
//! answers from memory with the faults a seed draws. The driver decides from these kinds,
//! never from an engine's text.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use drover_core::client::IoError;
use drover_core::client::container_spec::ContainerSpec;
use drover_core::client::containers::EngineFacts;
use drover_core::driverspec::docker::DockerAuth;
use futures::stream::BoxStream;

use crate::drivers::{ExecLaunch, TaskResourceUsage};
use crate::io::BoxFuture;

/// Why an engine call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineFailure {
    /// No such container, image or exec (404).
    NotFound,
    /// The name is taken, or the container is not in a state for it (409).
    Conflict,
    /// Nothing to do: the container was already stopped (304).
    NotModified,
    /// A registry refused the credentials (401, 403).
    Unauthorized,
    /// The daemon could not be reached, or the connection broke.
    Unreachable,
    /// The daemon did not answer in time.
    TimedOut,
    /// Anything else the daemon refused or failed at (its HTTP status, when it gave one).
    Failed(Option<u16>),
}

/// A failed engine call: its kind, and what the engine said (for people, never decided on).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EngineError {
    pub kind: EngineFailure,
    pub message: String,
}

impl EngineError {
    pub fn new(kind: EngineFailure, message: impl Into<String>) -> EngineError {
        EngineError {
            kind,
            message: message.into(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == EngineFailure::NotFound
    }

    /// The driver's error for `doing` this: a daemon out of reach is worth another attempt.
    pub fn io_error(&self, doing: &str) -> IoError {
        use drover_core::client::ErrorKind;
        let kind = match self.kind {
            EngineFailure::Unreachable => ErrorKind::Unavailable,
            EngineFailure::TimedOut => ErrorKind::Timeout,
            EngineFailure::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Other,
        };
        IoError::new(kind, format!("{doing}: {}", self.message))
    }
}

/// How a container stands, as the engine inspects it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerState {
    pub running: bool,
    pub exit_code: i64,
    /// The kernel's OOM killer ended it.
    pub oom_killed: bool,
    /// The engine's own error for it (a start that failed), when it has one.
    pub error: Option<String>,
}

/// A container as the engine lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedContainer {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// When the engine created it, in Unix seconds.
    pub created_unix_secs: u64,
}

/// A piece of a container's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

pub type EngineResult<T> = Result<T, EngineError>;

/// A container engine, as the driver uses one. Calls that take time are futures; `facts` is
/// asked from the fingerprint's blocking thread and answers within its own bound.
pub trait Engine: Send + Sync + 'static {
    /// What the daemon is (its version, runtimes, whether it is podman); `Err` when it does
    /// not answer.
    fn facts(&self) -> EngineResult<EngineFacts>;

    /// Whether the engine holds `image`.
    fn has_image(&self, image: &str) -> BoxFuture<EngineResult<bool>>;

    /// Pulls `image` with `auth` (never logged). A registry's missing image is `NotFound`,
    /// refused credentials `Unauthorized`, whatever the daemon's own status said.
    fn pull(&self, image: &str, auth: Option<&DockerAuth>) -> BoxFuture<EngineResult<()>>;

    /// Removes `image`; one a container still uses is the engine's to keep (`Conflict`).
    fn remove_image(&self, image: &str) -> BoxFuture<EngineResult<()>>;

    /// Creates the container `spec` describes, named `spec.name`; its id. A taken name is
    /// `Conflict`.
    fn create(&self, spec: &ContainerSpec) -> BoxFuture<EngineResult<String>>;

    fn start(&self, id: &str) -> BoxFuture<EngineResult<()>>;

    /// Removes the container, running or not, with its anonymous volumes.
    fn remove(&self, id: &str) -> BoxFuture<EngineResult<()>>;

    /// Sends `signal` to the container's main process.
    fn kill(&self, id: &str, signal: i32) -> BoxFuture<EngineResult<()>>;

    /// The engine's own stop: its stop signal, then SIGKILL after `timeout`.
    fn stop(&self, id: &str, timeout: Duration) -> BoxFuture<EngineResult<()>>;

    /// Resolves once the container is no longer running (`Ok`, whatever its exit code), or
    /// when the engine cannot say (`Err`: gone, or the daemon went away under the wait).
    fn wait(&self, id: &str) -> BoxFuture<EngineResult<()>>;

    fn inspect(&self, id: &str) -> BoxFuture<EngineResult<ContainerState>>;

    /// Every container, running or not, that carries `label`.
    fn list(&self, label: &str) -> BoxFuture<EngineResult<Vec<ListedContainer>>>;

    /// The container's output from `since` (Unix seconds; 0: all of it), following it until
    /// it exits or the stream breaks.
    fn logs(&self, id: &str, since: i64) -> BoxStream<'static, EngineResult<Output>>;

    /// The container's resource use, a sample a second while it runs.
    fn stats(&self, id: &str) -> BoxStream<'static, TaskResourceUsage>;

    /// `command` run in the container, attached (`alloc exec`).
    fn exec(&self, id: &str, command: Vec<String>, tty: bool) -> BoxFuture<Result<ExecLaunch, IoError>>;

    /// Prepares `source` for an `rshared` bind (the Engine binds those only from a shared
    /// mount): `true` when it was bound onto itself and shared, to be undone by
    /// [`Engine::release_shared`].
    fn share(&self, source: &Path) -> Result<bool, IoError>;

    fn release_shared(&self, sources: &[String]);
}
