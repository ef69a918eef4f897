//! A simulated container engine: the `docker` driver's [`Engine`] on a simulated host, so the
//! production driver (`drover_io_real::containers::ContainerDriver`) runs in the simulation
//! unchanged, against the faults a seed draws. It keeps its images and containers in memory
//! and outlives the client agent (containers run on across an agent restart, as a real
//! daemon's do), and its faults are a daemon's: stopped (its containers stopped with it, as
//! dockerd without live-restore does) and started again, hung (calls time out after the
//! client's call timeout), slow, an image the registry does not have, creates that fail, a
//! container OOM-killed or dying by itself.
//!
//! A container runs until it is stopped or killed, unless its command is `sleep N` (it exits
//! 0 after N seconds), as a service and a batch task do.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::container_spec::ContainerSpec;
use drover_core::client::containers::EngineFacts;
use drover_core::client::{ErrorKind, IoError};
use drover_core::driverspec::docker::DockerAuth;
use drover_io_real::containers::{
    ContainerState, Engine, EngineError, EngineFailure, EngineResult, ListedContainer, Output,
};
use drover_io_real::drivers::{ExecLaunch, TaskResourceUsage};
use drover_io_real::io::BoxFuture;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::trace::{HostEvent, Recorder};

/// How long an answer takes.
const LATENCY: Duration = Duration::from_millis(2);
/// How much longer a slow daemon takes.
const SLOW: Duration = Duration::from_secs(2);
/// A hung daemon's calls fail after the client's own call timeout (bollard's, in the
/// production engine).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// What a container's main process uses, as its stats report it.
const RSS_BYTES: u64 = 24 * 1024 * 1024;

/// How the daemon answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DaemonMode {
    #[default]
    Up,
    /// Not running: every call fails at once, as a socket nobody listens on does.
    Down,
    /// Running, answering nothing: every call times out.
    Hung,
    /// Answering, slowly.
    Slow,
}

struct SimContainer {
    name: String,
    image: String,
    labels: BTreeMap<String, String>,
    created_unix_secs: u64,
    started: bool,
    /// How it ended, once it has.
    exit: watch::Sender<Option<ContainerState>>,
    /// `sleep N`: it exits 0 after N seconds of running.
    runs_for: Option<Duration>,
}

impl SimContainer {
    fn running(&self) -> bool {
        self.started && self.exit.borrow().is_none()
    }

    fn state(&self) -> ContainerState {
        self.exit.borrow().clone().unwrap_or(ContainerState {
            running: self.started,
            ..ContainerState::default()
        })
    }

    /// Its allocation and task, from its labels.
    fn task(&self) -> (String, String) {
        use drover_core::client::containers::{LABEL_ALLOC_ID, LABEL_TASK_NAME};
        let label = |name: &str| self.labels.get(name).cloned().unwrap_or_default();
        (label(LABEL_ALLOC_ID), label(LABEL_TASK_NAME))
    }

    /// It ends with `code` unless it already has; whether it just did. A container that ran
    /// is recorded gone on `engine`'s host.
    fn end(&self, code: i64, oom_killed: bool, engine: &SimEngine) -> bool {
        let ended = self.exit.send_if_modified(|exit| {
            let first = exit.is_none();
            exit.get_or_insert(ContainerState {
                running: false,
                exit_code: code,
                oom_killed,
                error: None,
            });
            first
        });
        if ended && self.started {
            let (alloc, task) = self.task();
            engine
                .recorder
                .record_host(&engine.host, HostEvent::ContainerGone { alloc, task });
        }
        ended
    }
}

#[derive(Default)]
struct EngineState {
    mode: DaemonMode,
    images: BTreeSet<String>,
    /// Images the registry does not have: their pulls fail with 404.
    missing: BTreeSet<String>,
    containers: BTreeMap<String, SimContainer>,
    next_id: u64,
    /// The next this many creates fail (the daemon's 500).
    failing_creates: u32,
    /// Bumped whenever the daemon stops: waits in flight fail, as their connection breaks.
    stops: u64,
}

/// A host's simulated container engine (cheap to clone; clones share it).
#[derive(Clone)]
pub struct SimEngine {
    host: String,
    recorder: Recorder,
    state: Arc<Mutex<EngineState>>,
    stopped: Arc<watch::Sender<u64>>,
}

fn unreachable() -> EngineError {
    EngineError::new(
        EngineFailure::Unreachable,
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
    )
}

fn no_such(what: &str, id: &str) -> EngineError {
    EngineError::new(EngineFailure::NotFound, format!("No such {what}: {id}"))
}

impl SimEngine {
    /// The engine of host `host`, holding `images`.
    pub fn new(host: &str, recorder: Recorder, images: &[&str]) -> SimEngine {
        let state = EngineState {
            images: images.iter().map(|image| image.to_string()).collect(),
            ..EngineState::default()
        };
        SimEngine {
            host: host.to_string(),
            recorder,
            state: Arc::new(Mutex::new(state)),
            stopped: Arc::new(watch::channel(0).0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EngineState> {
        self.state.lock().expect("engine state")
    }

    fn note(&self, text: String) {
        self.recorder.note(format!("{} engine: {text}", self.host));
    }

    /// Waits as the daemon's mode says, then fails if it is not up.
    async fn answer(&self) -> EngineResult<()> {
        tokio::time::sleep(LATENCY).await;
        let mode = self.lock().mode;
        match mode {
            DaemonMode::Up => Ok(()),
            DaemonMode::Slow => {
                tokio::time::sleep(SLOW).await;
                Ok(())
            }
            DaemonMode::Down => Err(unreachable()),
            DaemonMode::Hung => {
                tokio::time::sleep(CALL_TIMEOUT).await;
                Err(EngineError::new(EngineFailure::TimedOut, "Timeout error"))
            }
        }
    }

    pub fn mode(&self) -> DaemonMode {
        self.lock().mode
    }

    /// The daemon hangs, slows or recovers (a stopped one is started with [`SimEngine::start`]).
    pub fn set_mode(&self, mode: DaemonMode) {
        if mode == DaemonMode::Down {
            self.stop_daemon();
            return;
        }
        self.note(format!("daemon {mode:?}"));
        self.lock().mode = mode;
        self.recorder.record_host(
            &self.host,
            HostEvent::EngineAnswers {
                answers: mode != DaemonMode::Hung,
            },
        );
    }

    /// The daemon stops: its containers are stopped with it (SIGTERM, then killed), and waits
    /// in flight break.
    pub fn stop_daemon(&self) {
        let stopped = {
            let mut state = self.lock();
            state.mode = DaemonMode::Down;
            state.stops += 1;
            let mut stopped = Vec::new();
            for (id, container) in &state.containers {
                if container.running() && container.end(143, false, self) {
                    stopped.push(id.clone());
                }
            }
            self.stopped.send_replace(state.stops);
            stopped
        };
        self.recorder
            .record_host(&self.host, HostEvent::EngineAnswers { answers: false });
        self.note(format!("daemon stopped, and its containers {stopped:?}"));
    }

    /// The daemon starts again (its stopped containers stay stopped: no restart policy).
    pub fn start_daemon(&self) {
        self.lock().mode = DaemonMode::Up;
        self.note("daemon started".into());
        self.recorder
            .record_host(&self.host, HostEvent::EngineAnswers { answers: true });
    }

    /// The registry lacks `image` (a pull fails with 404), and the engine does not hold it.
    pub fn lose_image(&self, image: &str) {
        let mut state = self.lock();
        state.images.remove(image);
        state.missing.insert(image.to_string());
    }

    /// The next `count` creates fail.
    pub fn fail_next_creates(&self, count: u32) {
        self.lock().failing_creates += count;
    }

    /// The running container of allocation `alloc` (its first, by id) ends: OOM-killed (137)
    /// or dying by itself with `code`. Returns its id, if one ran.
    pub fn end_container_of(&self, alloc: &str, code: i64, oom_killed: bool) -> Option<String> {
        let ended = {
            let state = self.lock();
            state
                .containers
                .iter()
                .find(|(_, container)| {
                    container.running()
                        && container
                            .labels
                            .get(drover_core::client::containers::LABEL_ALLOC_ID)
                            .map(String::as_str)
                            == Some(alloc)
                })
                .map(|(id, container)| {
                    container.end(code, oom_killed, self);
                    id.clone()
                })
        };
        if let Some(id) = &ended {
            self.note(format!("container {id} ended ({code}, oom killed: {oom_killed})"));
        }
        ended
    }

    /// The kernel's OOM killer ends one running container (the `pick`th, in id order, of
    /// those running): its allocation and task.
    pub fn oom_kill(&self, pick: usize) -> Option<(String, String)> {
        let running = self.running();
        let (id, _, alloc, task) = running.get(pick % running.len().max(1))?.clone();
        let ended = self
            .lock()
            .containers
            .get(&id)
            .is_some_and(|container| container.end(137, true, self));
        if ended {
            self.note(format!("container {id} OOM killed"));
        }
        Some((alloc, task))
    }

    /// The running containers: id, name, and their allocation and task labels.
    pub fn running(&self) -> Vec<(String, String, String, String)> {
        use drover_core::client::containers::{LABEL_ALLOC_ID, LABEL_TASK_NAME};
        self.lock()
            .containers
            .iter()
            .filter(|(_, container)| container.running())
            .map(|(id, container)| {
                let label = |name: &str| container.labels.get(name).cloned().unwrap_or_default();
                (
                    id.clone(),
                    container.name.clone(),
                    label(LABEL_ALLOC_ID),
                    label(LABEL_TASK_NAME),
                )
            })
            .collect()
    }

    /// Every container the engine holds, running or not: id and allocation label.
    pub fn containers(&self) -> Vec<(String, String)> {
        use drover_core::client::containers::LABEL_ALLOC_ID;
        self.lock()
            .containers
            .iter()
            .map(|(id, container)| {
                (
                    id.clone(),
                    container.labels.get(LABEL_ALLOC_ID).cloned().unwrap_or_default(),
                )
            })
            .collect()
    }

    fn exit_of(&self, id: &str) -> EngineResult<watch::Receiver<Option<ContainerState>>> {
        self.lock()
            .containers
            .get(id)
            .map(|container| container.exit.subscribe())
            .ok_or_else(|| no_such("container", id))
    }

    /// The container `id` or named `id`: its id.
    fn resolve(state: &EngineState, id: &str) -> Option<String> {
        if state.containers.contains_key(id) {
            return Some(id.to_string());
        }
        state
            .containers
            .iter()
            .find(|(_, container)| container.name == id)
            .map(|(found, _)| found.clone())
    }
}

/// `sleep N` runs for N seconds.
fn runs_for(spec: &ContainerSpec) -> Option<Duration> {
    let command: Vec<&str> = spec.entrypoint.iter().chain(&spec.cmd).map(String::as_str).collect();
    match command.as_slice() {
        ["sleep", seconds] => seconds.parse().ok().map(Duration::from_secs),
        _ => None,
    }
}

impl Engine for SimEngine {
    fn facts(&self) -> EngineResult<EngineFacts> {
        match self.lock().mode {
            DaemonMode::Up | DaemonMode::Slow => Ok(EngineFacts {
                version: Some("20.10.24".into()),
                runtimes: vec!["runc".into()],
                podman: false,
            }),
            DaemonMode::Down => Err(unreachable()),
            DaemonMode::Hung => Err(EngineError::new(EngineFailure::TimedOut, "Timeout error")),
        }
    }

    fn has_image(&self, image: &str) -> BoxFuture<EngineResult<bool>> {
        let (engine, image) = (self.clone(), image.to_string());
        Box::pin(async move {
            engine.answer().await?;
            Ok(engine.lock().images.contains(&image))
        })
    }

    fn pull(&self, image: &str, _auth: Option<&DockerAuth>) -> BoxFuture<EngineResult<()>> {
        let (engine, image) = (self.clone(), image.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let mut state = engine.lock();
            if state.missing.contains(&image) {
                return Err(EngineError::new(
                    EngineFailure::NotFound,
                    format!("manifest for {image} not found: manifest unknown"),
                ));
            }
            state.images.insert(image);
            Ok(())
        })
    }

    fn remove_image(&self, image: &str) -> BoxFuture<EngineResult<()>> {
        let (engine, image) = (self.clone(), image.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let mut state = engine.lock();
            if state.containers.values().any(|container| container.image == image) {
                return Err(EngineError::new(
                    EngineFailure::Conflict,
                    format!("conflict: unable to remove repository reference \"{image}\": container is using it"),
                ));
            }
            if !state.images.remove(&image) {
                return Err(no_such("image", &image));
            }
            drop(state);
            engine.note(format!("image {image} removed"));
            Ok(())
        })
    }

    fn create(&self, spec: &ContainerSpec) -> BoxFuture<EngineResult<String>> {
        let (engine, spec) = (self.clone(), spec.clone());
        Box::pin(async move {
            engine.answer().await?;
            let id = {
                let mut state = engine.lock();
                if state.failing_creates > 0 {
                    state.failing_creates -= 1;
                    return Err(EngineError::new(
                        EngineFailure::Failed(Some(500)),
                        "failed to create the container",
                    ));
                }
                if !state.images.contains(&spec.image) {
                    return Err(no_such("image", &spec.image));
                }
                if state.containers.values().any(|container| container.name == spec.name) {
                    return Err(EngineError::new(
                        EngineFailure::Conflict,
                        format!("Conflict. The container name \"/{}\" is already in use", spec.name),
                    ));
                }
                state.next_id += 1;
                let id = format!("{}-{:04}", engine.host, state.next_id);
                let container = SimContainer {
                    name: spec.name.clone(),
                    image: spec.image.clone(),
                    labels: spec.labels.clone(),
                    created_unix_secs: drover_io_real::clock::unix_millis() / 1000,
                    started: false,
                    exit: watch::channel(None).0,
                    runs_for: runs_for(&spec),
                };
                state.containers.insert(id.clone(), container);
                id
            };
            engine.note(format!("created {id} ({})", spec.name));
            Ok(id)
        })
    }

    fn start(&self, id: &str) -> BoxFuture<EngineResult<()>> {
        let (engine, id) = (self.clone(), id.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let runs_for = {
                let mut state = engine.lock();
                let Some(container) = state.containers.get_mut(&id) else {
                    return Err(no_such("container", &id));
                };
                if container.started {
                    return Err(EngineError::new(
                        EngineFailure::NotModified,
                        "container already started",
                    ));
                }
                container.started = true;
                let (alloc, task) = container.task();
                engine
                    .recorder
                    .record_host(&engine.host, HostEvent::ContainerRunning { alloc, task });
                container.runs_for
            };
            engine.note(format!("started {id}"));
            if let Some(after) = runs_for {
                let (engine, id) = (engine.clone(), id.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let ended = engine
                        .lock()
                        .containers
                        .get(&id)
                        .is_some_and(|container| container.end(0, false, &engine));
                    if ended {
                        engine.note(format!("{id} exited 0"));
                    }
                });
            }
            Ok(())
        })
    }

    fn remove(&self, id: &str) -> BoxFuture<EngineResult<()>> {
        let (engine, id) = (self.clone(), id.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let removed = {
                let mut state = engine.lock();
                let Some(found) = Self::resolve(&state, &id) else {
                    return Err(no_such("container", &id));
                };
                let container = state.containers.remove(&found).expect("resolved");
                container.end(137, false, &engine);
                found
            };
            engine.note(format!("removed {removed}"));
            Ok(())
        })
    }

    fn kill(&self, id: &str, signal: i32) -> BoxFuture<EngineResult<()>> {
        let (engine, id) = (self.clone(), id.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let state = engine.lock();
            let Some(container) = state.containers.get(&id) else {
                return Err(no_such("container", &id));
            };
            if !container.running() {
                return Err(EngineError::new(
                    EngineFailure::Conflict,
                    format!("Container {id} is not running"),
                ));
            }
            // Every signal ends a simulated container's process (its default action).
            container.end(128 + i64::from(signal), false, &engine);
            drop(state);
            engine.note(format!("{id} killed ({signal})"));
            Ok(())
        })
    }

    fn stop(&self, id: &str, _timeout: Duration) -> BoxFuture<EngineResult<()>> {
        let (engine, id) = (self.clone(), id.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let state = engine.lock();
            let Some(container) = state.containers.get(&id) else {
                return Err(no_such("container", &id));
            };
            if !container.running() {
                return Err(EngineError::new(
                    EngineFailure::NotModified,
                    "container already stopped",
                ));
            }
            container.end(143, false, &engine);
            drop(state);
            engine.note(format!("{id} stopped"));
            Ok(())
        })
    }

    fn wait(&self, id: &str) -> BoxFuture<EngineResult<()>> {
        let (engine, id) = (self.clone(), id.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let mut exit = engine.exit_of(&id)?;
            let mut stopped = engine.stopped.subscribe();
            stopped.borrow_and_update();
            tokio::select! {
                _ = exit.wait_for(Option::is_some) => Ok(()),
                _ = stopped.changed() => Err(EngineError::new(EngineFailure::Unreachable, "the daemon went away")),
            }
        })
    }

    fn inspect(&self, id: &str) -> BoxFuture<EngineResult<ContainerState>> {
        let (engine, id) = (self.clone(), id.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let state = engine.lock();
            state
                .containers
                .get(&id)
                .map(SimContainer::state)
                .ok_or_else(|| no_such("container", &id))
        })
    }

    fn list(&self, label: &str) -> BoxFuture<EngineResult<Vec<ListedContainer>>> {
        let (engine, label) = (self.clone(), label.to_string());
        Box::pin(async move {
            engine.answer().await?;
            let state = engine.lock();
            Ok(state
                .containers
                .iter()
                .filter(|(_, container)| container.labels.contains_key(&label))
                .map(|(id, container)| ListedContainer {
                    id: id.clone(),
                    labels: container.labels.clone(),
                    created_unix_secs: container.created_unix_secs,
                })
                .collect())
        })
    }

    /// Simulated containers write nothing: the stream ends when the container does.
    fn logs(&self, id: &str, _since: i64) -> BoxStream<'static, EngineResult<Output>> {
        let exit = self.exit_of(id);
        futures::stream::once(async move {
            if let Ok(mut exit) = exit {
                let _ = exit.wait_for(Option::is_some).await;
            }
        })
        .filter_map(|()| std::future::ready(None))
        .boxed()
    }

    fn stats(&self, id: &str) -> BoxStream<'static, TaskResourceUsage> {
        let running = self.lock().containers.get(id).is_some_and(SimContainer::running);
        let sample = TaskResourceUsage {
            rss_bytes: RSS_BYTES,
            ..TaskResourceUsage::default()
        };
        futures::stream::iter(running.then_some(sample)).boxed()
    }

    fn exec(&self, _id: &str, _command: Vec<String>, _tty: bool) -> BoxFuture<Result<ExecLaunch, IoError>> {
        Box::pin(async {
            Err(IoError::new(
                ErrorKind::Unsupported,
                "exec in a simulated container is not modelled",
            ))
        })
    }

    fn share(&self, _source: &Path) -> Result<bool, IoError> {
        Ok(false)
    }

    fn release_shared(&self, _sources: &[String]) {}
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use drover_core::client::containers::PullFailure;
    use drover_core::client::{TaskConfig, TaskHandle};
    use drover_core::driverspec::docker_plugin::DockerPluginConfig;
    use drover_core::structs::ConfigValue;
    use drover_io_real::containers::ContainerDriver;
    use drover_io_real::drivers::TaskDriver;

    use super::*;

    const IMAGE: &str = "busybox:1.36";

    fn engine() -> SimEngine {
        SimEngine::new("c1", Recorder::new(), &[IMAGE])
    }

    /// The production driver over `engine`, as a client agent starts it.
    fn driver(engine: &SimEngine) -> ContainerDriver {
        ContainerDriver::new(
            DockerPluginConfig::default(),
            Ok(Arc::new(engine.clone()) as Arc<dyn Engine>),
        )
        .with_alloc_root(Path::new("/sim/c1/alloc"))
        .without_log_files()
    }

    fn task(alloc: &str, image: &str, command: &[&str]) -> TaskConfig {
        let mut config = BTreeMap::from([("image".to_string(), ConfigValue::String(image.into()))]);
        if let Some((first, rest)) = command.split_first() {
            config.insert("command".into(), ConfigValue::String(first.to_string()));
            config.insert(
                "args".into(),
                ConfigValue::List(rest.iter().map(|arg| ConfigValue::String(arg.to_string())).collect()),
            );
        }
        TaskConfig {
            alloc_id: alloc.into(),
            task: "web".into(),
            driver: "docker".into(),
            config,
            env: BTreeMap::new(),
            mounts: Vec::new(),
            devices: Vec::new(),
            task_dir: format!("/sim/c1/alloc/{alloc}/web"),
            log_dir: format!("/sim/c1/alloc/{alloc}/alloc/logs"),
            kill_timeout: Duration::from_secs(5),
            cpu_mhz: 100,
            memory_mb: 64,
            memory_max_mb: 0,
            logs: Default::default(),
            node_cpu_mhz: 4_000,
            node_cores: 4,
            reserved_cores: Vec::new(),
            network: None,
        }
    }

    async fn started(driver: &ContainerDriver, config: TaskConfig) -> TaskHandle {
        driver.start(config).await.expect("the task starts")
    }

    #[tokio::test]
    async fn a_task_runs_as_a_labelled_container_stops_with_its_signal_and_leaves_nothing() {
        let engine = engine();
        let driver = driver(&engine);
        assert!(driver.fingerprint().healthy);
        let handle = started(&driver, task("a1", IMAGE, &[])).await;
        let running = engine.running();
        assert_eq!(running.len(), 1);
        assert_eq!((running[0].2.as_str(), running[0].3.as_str()), ("a1", "web"));
        driver.stop(handle.clone(), Duration::from_secs(5), 15).await.unwrap();
        let exit = driver.wait(handle.clone()).await;
        assert_eq!(exit.exit_code, 143);
        driver.destroy(handle).await.unwrap();
        assert!(engine.containers().is_empty());
    }

    #[tokio::test]
    async fn a_missing_image_fails_the_start_for_good_and_a_failed_create_leaves_nothing() {
        let engine = engine();
        engine.lose_image("gone:1");
        let driver = driver(&engine);
        let error = driver.start(task("a1", "gone:1", &[])).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::ImagePull(PullFailure::NotFound));
        engine.fail_next_creates(1);
        assert!(driver.start(task("a2", IMAGE, &[])).await.is_err());
        assert!(engine.containers().is_empty());
        // The next start works.
        started(&driver, task("a2", IMAGE, &[])).await;
        assert_eq!(engine.running().len(), 1);
    }

    #[tokio::test]
    async fn a_stopped_daemon_makes_the_driver_unhealthy_and_its_containers_exit() {
        let engine = engine();
        let driver = driver(&engine);
        assert!(driver.fingerprint().detected);
        let handle = started(&driver, task("a1", IMAGE, &[])).await;
        engine.stop_daemon();
        let fingerprint = driver.fingerprint();
        assert!(fingerprint.detected && !fingerprint.healthy);
        assert_eq!(
            fingerprint.health_description,
            drover_core::client::containers::ENGINE_UNREACHABLE
        );
        let back = engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            back.start_daemon();
        });
        // The wait outlasts the daemon's absence and reads how the container ended.
        let exit = driver.wait(handle).await;
        assert_eq!((exit.exit_code, exit.oom_killed), (143, false));
        assert!(driver.fingerprint().healthy);
    }

    #[tokio::test]
    async fn a_restarted_client_reattaches_and_reads_an_oom_kill() {
        let engine = engine();
        let handle = started(&driver(&engine), task("a1", IMAGE, &[])).await;
        // The agent restarts: a new driver, the same engine.
        let restarted = driver(&engine);
        restarted.recover(handle.clone()).await.unwrap();
        engine.end_container_of("a1", 137, true);
        let exit = restarted.wait(handle).await;
        assert_eq!((exit.exit_code, exit.oom_killed), (137, true));
    }

    #[tokio::test]
    async fn a_container_gone_while_the_client_was_away_is_not_recovered() {
        let engine = engine();
        let handle = started(&driver(&engine), task("a1", IMAGE, &[])).await;
        let id = engine.running()[0].0.clone();
        engine.remove(&id).await.unwrap();
        let error = driver(&engine).recover(handle).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn sleep_n_exits_by_itself() {
        let engine = engine();
        let driver = driver(&engine);
        let handle = started(&driver, task("a1", IMAGE, &["sleep", "1"])).await;
        let exit = driver.wait(handle).await;
        assert_eq!((exit.exit_code, exit.err), (0, None));
    }
}
