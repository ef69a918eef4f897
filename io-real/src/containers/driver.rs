//! The `docker` task driver over any [`Engine`]: each task a container. It pulls the image
//! when it is missing, creates and starts the container, forwards its output into the task's
//! rotated log files, waits for it and reads how it ended (exit code, OOM), stops it with the
//! task's signal and timeout, and removes it when the task is destroyed. What the container is
//! made of, which containers are orphans and which images are due are core's decisions
//! (`client::container_spec`, `client::containers`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::container_spec::container_spec;
use drover_core::client::containers::{self, BrokenWait, ImageGc, PullFailure};
use drover_core::client::{
    AllocNetwork, DriverCapabilities, ErrorKind, ExitResult, IoError, MountConfigSupport, TaskConfig, TaskHandle,
};
use drover_core::config::ClientFaults;
use drover_core::driverspec::docker::DockerTaskConfig;
use drover_core::driverspec::docker_plugin::DockerPluginConfig;
use drover_core::structs::AllocatedPort;
use futures::StreamExt;
use tokio::sync::watch;

use super::engine::{Engine, EngineError, EngineFailure};
use super::logs;
use crate::drivers::{DriverFingerprint, ExecLaunch, TaskDriver, TaskResourceUsage};
use crate::io::BoxFuture;

type Key = (String, String);

/// How long an exited container's output may take to reach the task's logs before its exit
/// is told anyway.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// A container this client is watching.
#[derive(Clone)]
struct Running {
    container: String,
    exit: watch::Receiver<Option<ExitResult>>,
    /// The last resource sample, once `stats` was asked for (a sampler then keeps it fresh).
    usage: Arc<Mutex<Option<TaskResourceUsage>>>,
    sampling: Arc<AtomicBool>,
}

/// What a handle carries for reattaching: the container and the image it runs.
#[derive(serde::Serialize, serde::Deserialize)]
struct HandleState {
    container_id: String,
    image: String,
    /// The task's log directory and rotation, for the output of a container reattached to.
    log_dir: String,
    logs: drover_core::structs::LogConfig,
    /// Bind sources the driver bound onto themselves to share them (for the task's `rshared`
    /// binds, a CSI plugin's): undone when the task is destroyed.
    #[serde(default)]
    shared: Vec<String>,
}

impl HandleState {
    fn read(handle: &TaskHandle) -> Result<HandleState, IoError> {
        serde_json::from_str(&handle.state)
            .map_err(|error| IoError::other(format!("docker: unreadable task handle: {error}")))
    }
}

/// The `docker` driver: tasks as containers of `engine`.
#[derive(Clone)]
pub struct ContainerDriver {
    /// The engine; `Err` says why there is none (an endpoint that is not a unix socket).
    engine: Result<Arc<dyn Engine>, String>,
    plugin: Arc<DockerPluginConfig>,
    tasks: Arc<Mutex<BTreeMap<Key, Running>>>,
    /// Whether the daemon has ever answered: until then the driver is undetected, after that a
    /// daemon that does not answer makes it unhealthy.
    detected: Arc<AtomicBool>,
    /// Tasks between their container's creation and its watch (spared by the orphan sweep
    /// whatever the creation grace).
    starting: Arc<Mutex<BTreeSet<Key>>>,
    /// Whether the orphan sweep runs.
    sweeping: Arc<AtomicBool>,
    /// This client's label on its containers (its allocation root); without it, no sweep.
    client_label: Option<String>,
    /// Which tasks hold which images, and since when the rest have been idle (the core's
    /// `ImageGc` decides which are due).
    images: Arc<Mutex<ImageGc>>,
    /// Starts hold it shared from taking their image until its container exists (from then
    /// on the Engine itself refuses to remove the image); a collection holds it alone while it
    /// removes, so no image goes while a task starts with it.
    image_use: Arc<tokio::sync::RwLock<()>>,
    /// Whether a collection is waiting for the next image to fall due (one at a time).
    collecting: Arc<AtomicBool>,
    /// The driver's start: the core's `now` is measured from it.
    epoch: tokio::time::Instant,
    /// Whether containers' output goes into the tasks' log files (a simulated host's files are
    /// modelled, not the host's: there, none is written).
    log_files: bool,
    /// Defects re-created on purpose (the simulation's regression switches); none in production.
    faults: ClientFaults,
    /// Allocations whose pause container (bridge mode) this client holds: spared by the
    /// orphan sweep.
    networks: Arc<Mutex<BTreeSet<String>>>,
}

impl ContainerDriver {
    /// The driver for `plugin`'s settings over `engine` (`Err`: why there is none).
    pub fn new(plugin: DockerPluginConfig, engine: Result<Arc<dyn Engine>, String>) -> ContainerDriver {
        ContainerDriver {
            engine,
            plugin: Arc::new(plugin),
            tasks: Arc::default(),
            detected: Arc::default(),
            starting: Arc::default(),
            sweeping: Arc::default(),
            client_label: None,
            images: Arc::default(),
            image_use: Arc::default(),
            collecting: Arc::default(),
            epoch: tokio::time::Instant::now(),
            log_files: true,
            faults: ClientFaults::default(),
            networks: Arc::default(),
        }
    }

    /// The client's re-created defects (a simulated client under a regression switch).
    pub fn with_faults(mut self, faults: ClientFaults) -> ContainerDriver {
        self.faults = faults;
        self
    }

    /// Containers' output is left in the engine, not written into the tasks' log files (a
    /// simulated host, whose directories are modelled rather than the host's own).
    pub fn without_log_files(mut self) -> ContainerDriver {
        self.log_files = false;
        self
    }

    /// The client's allocation root: its containers are labelled with it, and only containers
    /// so labelled are ever swept as orphans.
    pub fn with_alloc_root(mut self, alloc_root: &Path) -> ContainerDriver {
        self.client_label = Some(drover_core::client::container_spec::client_label(
            &alloc_root.to_string_lossy(),
        ));
        self
    }

    fn engine(&self) -> Result<Arc<dyn Engine>, IoError> {
        self.engine
            .clone()
            .map_err(|why| IoError::new(ErrorKind::FailedPrecondition, why))
    }

    /// `task` of `alloc` takes `image` (before its pull, so the image cannot fall due).
    fn hold_image(&self, image: &str, alloc: &str, task: &str) {
        if self.plugin.gc_image {
            self.images.lock().unwrap().acquire(image, alloc, task);
        }
    }

    /// `task` of `alloc` no longer uses `image`; once no task has for `image_delay`, it is
    /// removed (`gc { image image_delay }`).
    fn let_go_of_image(&self, image: &str, alloc: &str, task: &str) {
        if !self.plugin.gc_image {
            return;
        }
        let now = crate::clock::core_now(self.epoch);
        // Decided under the lock a collection also ends under: a release either finds the
        // collection still running (it will see this image) or starts the next one.
        let collect = {
            let mut images = self.images.lock().unwrap();
            images.release(image, alloc, task, now);
            images.next_due(self.plugin.image_delay).is_some() && !self.collecting.swap(true, Ordering::SeqCst)
        };
        if collect {
            let driver = self.clone();
            tokio::spawn(async move { driver.collect_images().await });
        }
    }

    /// Waits for the next idle image to fall due and removes every image due then; an image a
    /// task took again meanwhile is no longer idle and stays. One the Engine will not remove
    /// (another container of someone else's uses it) is the Engine's to keep.
    async fn collect_images(&self) {
        // A driver without an engine starts no task, so lets go of no image; should it, the
        // next release may try again.
        let Ok(engine) = self.engine() else {
            self.collecting.store(false, Ordering::SeqCst);
            return;
        };
        loop {
            let next = {
                let images = self.images.lock().unwrap();
                let next = images.next_due(self.plugin.image_delay);
                if next.is_none() {
                    self.collecting.store(false, Ordering::SeqCst);
                }
                next
            };
            let Some(at) = next else {
                return;
            };
            let now = crate::clock::core_now(self.epoch);
            tokio::time::sleep(at.saturating_duration_since(now)).await;
            let _alone = self.image_use.write().await;
            let now = crate::clock::core_now(self.epoch);
            let due = self.images.lock().unwrap().due(now, self.plugin.image_delay);
            for image in due {
                match engine.remove_image(&image).await {
                    Ok(()) => tracing::info!(%image, "removed an image no task used for image_delay"),
                    Err(error) => tracing::debug!(%image, said = %error, "image kept"),
                }
            }
        }
    }

    /// Starts the sweep for labelled containers no task of this client owns (left by a client
    /// killed between creating a container and recording it, or by an allocation collected
    /// while the client was away): every `period`, the first one `period` after the driver's
    /// first healthy fingerprint, when the tasks persisted before a restart have been
    /// reattached.
    fn sweep_orphans(&self) {
        if !self.plugin.gc_containers
            || self.engine.is_err()
            || self.client_label.is_none()
            || self.sweeping.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::SeqCst);
            return;
        };
        let driver = self.clone();
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(driver.plugin.orphan_period).await;
                if let Err(error) = driver.remove_orphans().await {
                    tracing::debug!(%error, "could not look for orphaned containers");
                }
            }
        });
    }

    /// One sweep: the labelled containers core's `orphans` names are removed.
    async fn remove_orphans(&self) -> Result<(), IoError> {
        use drover_core::client::containers::{LABEL_ALLOC_ID, Listed, orphans};
        let engine = self.engine()?;
        let Some(client) = self.client_label.as_deref() else {
            return Ok(());
        };
        let listed = engine
            .list(LABEL_ALLOC_ID)
            .await
            .map_err(|error| error.io_error("Failed to list containers"))?;
        let listed: Vec<Listed> = listed
            .into_iter()
            .map(|container| Listed {
                id: container.id,
                labels: container.labels,
                created: drover_core::Instant::from_millis(container.created_unix_secs.saturating_mul(1000)),
            })
            .collect();
        let mut tracked: BTreeSet<Key> = self.tasks.lock().unwrap().keys().cloned().collect();
        tracked.extend(self.starting.lock().unwrap().iter().cloned());
        // A pause container is labelled with its allocation and no task.
        tracked.extend(
            self.networks
                .lock()
                .unwrap()
                .iter()
                .map(|alloc| (alloc.clone(), String::new())),
        );
        let now = drover_core::Instant::from_millis(crate::clock::unix_millis());
        for id in orphans(&listed, client, &tracked, now, self.plugin.creation_grace) {
            tracing::info!(container = %id, "removing a container no task of this client owns");
            remove_container(engine.as_ref(), &id).await;
        }
        Ok(())
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, IoError> {
        let engine = self.engine()?;
        // The task's own configuration, refused: never worth another attempt (core decides).
        let refused = |text: String| IoError::new(ErrorKind::TaskConfig, text);
        let task_config = DockerTaskConfig::read(&config.config).map_err(|problem| refused(problem.to_string()))?;
        let spec =
            container_spec(&config, &task_config, &self.plugin).map_err(|refusal| refused(refusal.to_string()))?;
        self.hold_image(&task_config.image, &config.alloc_id, &config.task);
        let using = self.image_use.read().await;
        if let Err(error) = ensure_image(engine.as_ref(), &task_config).await {
            drop(using);
            self.let_go_of_image(&task_config.image, &config.alloc_id, &config.task);
            return Err(error);
        }
        // The Engine binds `rshared` only from a shared mount: a host whose `/` is private
        // gets its source bound onto itself and shared (a CSI plugin's mounts reach the host).
        let mut shared = Vec::new();
        for mount in spec.mounts.iter().filter(|mount| mount.propagation == "rshared") {
            match engine.share(Path::new(&mount.source)) {
                Ok(true) => shared.push(mount.source.clone()),
                Ok(false) => {}
                Err(error) => {
                    drop(using);
                    engine.release_shared(&shared);
                    self.let_go_of_image(&task_config.image, &config.alloc_id, &config.task);
                    return Err(error);
                }
            }
        }
        let key = (config.alloc_id.clone(), config.task.clone());
        self.starting.lock().unwrap().insert(key.clone());
        let started = async {
            let id = create_container(engine.as_ref(), &spec).await;
            drop(using);
            let id = id?;
            if let Err(error) = engine.start(&id).await {
                // Nothing is left behind by a container that would not start (a port taken, a
                // bind source missing): the task's start failed and the container goes with it.
                remove_container(engine.as_ref(), &id).await;
                return Err(error.io_error(&format!("Failed to start container {id}")));
            }
            self.watch(
                &engine,
                &config.alloc_id,
                &config.task,
                &id,
                &config.log_dir,
                config.logs,
                0,
            );
            Ok(id)
        }
        .await;
        self.starting.lock().unwrap().remove(&key);
        if started.is_err() {
            engine.release_shared(&shared);
            self.let_go_of_image(&task_config.image, &config.alloc_id, &config.task);
        }
        let id = started?;
        Ok(TaskHandle {
            driver: self.name().to_string(),
            alloc_id: config.alloc_id,
            task: config.task,
            state: serde_json::to_string(&HandleState {
                container_id: id,
                image: task_config.image,
                log_dir: config.log_dir,
                logs: config.logs,
                shared,
            })
            .expect("serializable"),
        })
    }

    /// Follows the container: its exit into the task's watch, its output into the task's logs
    /// (from `since`, Unix seconds; 0 for all of it).
    #[allow(clippy::too_many_arguments)]
    fn watch(
        &self,
        engine: &Arc<dyn Engine>,
        alloc_id: &str,
        task: &str,
        id: &str,
        log_dir: &str,
        logs: drover_core::structs::LogConfig,
        since: i64,
    ) {
        let (sender, receiver) = watch::channel(None);
        // Whether the container's output has all been written (its stream ended).
        let (written, mut output_done) = watch::channel(!self.log_files);
        if self.log_files {
            let follow = logs::follow(
                engine.clone(),
                id.to_string(),
                PathBuf::from(log_dir),
                task.to_string(),
                logs,
                since,
            );
            tokio::spawn(async move {
                follow.await;
                let _ = written.send(true);
            });
        }
        let (engine, waited, faults) = (engine.clone(), id.to_string(), self.faults);
        tokio::spawn(async move {
            let exit = wait_exit(engine.as_ref(), &waited, &faults).await;
            // The exit is told once the last lines are in the task's logs (podman hands them
            // out a moment after the wait answers), so a container is never removed, and
            // `alloc logs` of a dead task never read, before its last words are written.
            let _ = tokio::time::timeout(OUTPUT_DRAIN, output_done.wait_for(|done| *done)).await;
            let _ = sender.send(Some(exit));
        });
        self.tasks.lock().unwrap().insert(
            (alloc_id.to_string(), task.to_string()),
            Running {
                container: id.to_string(),
                exit: receiver,
                usage: Arc::default(),
                sampling: Arc::default(),
            },
        );
    }

    fn running(&self, handle: &TaskHandle) -> Option<Running> {
        self.tasks
            .lock()
            .unwrap()
            .get(&(handle.alloc_id.clone(), handle.task.clone()))
            .cloned()
    }

    async fn stop_task(&self, handle: TaskHandle, kill_timeout: Duration, signal: i32) -> Result<(), IoError> {
        let engine = self.engine()?;
        let state = HandleState::read(&handle)?;
        let Some(mut running) = self.running(&handle) else {
            // Not watched here (its reattach failed): the Engine's own stop, which escalates to
            // SIGKILL after the timeout.
            return match engine.stop(&state.container_id, kill_timeout).await {
                Ok(()) => Ok(()),
                Err(error) if matches!(error.kind, EngineFailure::NotFound | EngineFailure::NotModified) => Ok(()),
                Err(error) => Err(error.io_error("Failed to stop container")),
            };
        };
        if running.exit.borrow().is_some() {
            return Ok(());
        }
        kill(engine.as_ref(), &state.container_id, signal).await?;
        let exited = tokio::time::timeout(kill_timeout, running.exit.wait_for(Option::is_some))
            .await
            .is_ok();
        if !exited {
            kill(engine.as_ref(), &state.container_id, libc::SIGKILL).await?;
            let _ = running.exit.wait_for(Option::is_some).await;
        }
        Ok(())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), IoError> {
        let engine = self.engine()?;
        let state = HandleState::read(&handle)?;
        engine
            .inspect(&state.container_id)
            .await
            .map_err(|error| error.io_error(&format!("container {} is gone", state.container_id)))?;
        self.hold_image(&state.image, &handle.alloc_id, &handle.task);
        let since = if self.log_files {
            logs::resume_from(Path::new(&state.log_dir), &handle.task)
        } else {
            0
        };
        self.watch(
            &engine,
            &handle.alloc_id,
            &handle.task,
            &state.container_id,
            &state.log_dir,
            state.logs,
            since,
        );
        Ok(())
    }

    async fn destroy_task(&self, handle: TaskHandle) -> Result<(), IoError> {
        let engine = self.engine()?;
        let state = HandleState::read(&handle)?;
        // No longer the task's, whatever the engine answers: a container the runner gives up
        // destroying (its daemon stayed away) is then the orphan sweep's to remove.
        self.tasks
            .lock()
            .unwrap()
            .remove(&(handle.alloc_id.clone(), handle.task.clone()));
        force_remove(engine.as_ref(), &state.container_id)
            .await
            .map_err(|error| error.io_error("Failed to remove container"))?;
        engine.release_shared(&state.shared);
        self.let_go_of_image(&state.image, &handle.alloc_id, &handle.task);
        Ok(())
    }
}

impl ContainerDriver {
    /// The allocation's pause container, created (with the infra image pulled if missing)
    /// unless it exists, and running.
    async fn create_network(&self, alloc_id: String, ports: Vec<AllocatedPort>) -> Result<AllocNetwork, IoError> {
        use drover_core::client::containers::{LABEL_ALLOC_ID, LABEL_CLIENT, LABEL_TASK_NAME};
        let engine = self.engine()?;
        let client = self.client_label.clone().unwrap_or_default();
        // Spared by the sweep from before it exists.
        self.networks.lock().unwrap().insert(alloc_id.clone());
        let listed = engine
            .list(LABEL_ALLOC_ID)
            .await
            .map_err(|error| error.io_error("Failed to list containers"))?;
        let existing = listed.into_iter().find(|container| {
            container.labels.get(LABEL_ALLOC_ID) == Some(&alloc_id)
                && container.labels.get(LABEL_CLIENT) == Some(&client)
                && !container.labels.contains_key(LABEL_TASK_NAME)
        });
        let id = match existing {
            Some(container) => container.id,
            None => {
                let spec = drover_core::client::container_spec::network_spec(&alloc_id, &client, &ports, &self.plugin);
                ensure_infra_image(engine.as_ref(), &spec.image).await?;
                engine
                    .create(&spec)
                    .await
                    .map_err(|error| error.io_error("Failed to create the pause container"))?
            }
        };
        match engine.start(&id).await {
            Ok(()) => {}
            Err(error) if error.kind == EngineFailure::NotModified => {}
            Err(error) => {
                remove_container(engine.as_ref(), &id).await;
                return Err(error.io_error("Failed to start the pause container"));
            }
        }
        Ok(AllocNetwork {
            driver: "docker".into(),
            id,
        })
    }

    async fn destroy_network(&self, alloc_id: String, network: AllocNetwork) -> Result<(), IoError> {
        let engine = self.engine()?;
        force_remove(engine.as_ref(), &network.id)
            .await
            .map_err(|error| error.io_error("Failed to remove the pause container"))?;
        self.networks.lock().unwrap().remove(&alloc_id);
        Ok(())
    }
}

/// How long pulling the pause container's image may take (Nomad's default
/// `image_pull_timeout`).
const INFRA_PULL_TIMEOUT: Duration = Duration::from_secs(5 * 60);

async fn ensure_infra_image(engine: &dyn Engine, image: &str) -> Result<(), IoError> {
    match engine.has_image(image).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(error) => return Err(error.io_error("Failed to inspect image")),
    }
    match tokio::time::timeout(INFRA_PULL_TIMEOUT, engine.pull(image, None)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.io_error(&format!("Failed to pull `{image}`"))),
        Err(_) => Err(IoError::new(
            ErrorKind::Timeout,
            format!("Failed to pull `{image}`: timed out"),
        )),
    }
}

/// The task's image, pulled when the Engine does not have it (or always, with `force_pull`),
/// within `image_pull_timeout`.
async fn ensure_image(engine: &dyn Engine, config: &DockerTaskConfig) -> Result<(), IoError> {
    if !config.force_pull {
        match engine.has_image(&config.image).await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => return Err(error.io_error("Failed to inspect image")),
        }
    }
    let failed = |said: String, failure| {
        IoError::new(
            ErrorKind::ImagePull(failure),
            format!("Failed to pull `{}`: {said}", config.image),
        )
    };
    match tokio::time::timeout(
        config.image_pull_timeout,
        engine.pull(&config.image, config.auth.as_ref()),
    )
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => {
            let failure = match error.kind {
                EngineFailure::NotFound => PullFailure::NotFound,
                EngineFailure::Unauthorized => PullFailure::Unauthorized,
                _ => PullFailure::Daemon,
            };
            Err(failed(error.message, failure))
        }
        Err(_) => Err(failed(
            format!("no image after image_pull_timeout ({:?})", config.image_pull_timeout),
            PullFailure::Timeout,
        )),
    }
}

/// Creates the container; a container of the same name (left by a client that crashed between
/// creating it and recording it) is removed first.
async fn create_container(
    engine: &dyn Engine,
    spec: &drover_core::client::container_spec::ContainerSpec,
) -> Result<String, IoError> {
    match engine.create(spec).await {
        Ok(id) => Ok(id),
        Err(error) if error.kind == EngineFailure::Conflict => {
            tracing::info!(container = %spec.name, "removing a leftover container of the same name");
            remove_container(engine, &spec.name).await;
            engine
                .create(spec)
                .await
                .map_err(|error| error.io_error("Failed to create container"))
        }
        Err(error) => Err(error.io_error("Failed to create container")),
    }
}

/// Removes the container, running or not, with its anonymous volumes; one already gone is
/// removed.
async fn force_remove(engine: &dyn Engine, id: &str) -> Result<(), super::engine::EngineError> {
    match engine.remove(id).await {
        Err(error) if !error.is_not_found() => Err(error),
        _ => Ok(()),
    }
}

/// [`force_remove`] where a failure can only be logged (undoing a start, a sweep).
async fn remove_container(engine: &dyn Engine, id: &str) {
    if let Err(error) = force_remove(engine, id).await {
        tracing::warn!(container = %id, %error, "could not remove a container");
    }
}

/// Sends `signal`; a container that is already gone or stopped needs none.
async fn kill(engine: &dyn Engine, id: &str, signal: i32) -> Result<(), IoError> {
    match engine.kill(id, signal).await {
        Ok(()) => Ok(()),
        Err(error) if matches!(error.kind, EngineFailure::NotFound | EngineFailure::Conflict) => Ok(()),
        Err(error) => Err(error.io_error("Failed to signal container")),
    }
}

/// How the container ended. A daemon that goes away while it runs is waited out (a daemon
/// without live-restore stops its containers, whose exits are then read); a container that is
/// gone is reported as an error.
/// After a wait or inspect of container `id` failed: whether to ask again (after the core's
/// pause) or not (the container is gone). An abandoned container is never asked again.
async fn retry(error: &EngineError, doing: &str, id: &str, attempt: &mut u32, faults: &ClientFaults) -> bool {
    match containers::after_broken_wait(error.is_not_found(), *attempt, faults) {
        BrokenWait::Gone => false,
        BrokenWait::Abandon => std::future::pending().await,
        BrokenWait::WaitAgain(pause) => {
            tracing::debug!(container = %id, %error, "{doing} the container again");
            *attempt += 1;
            tokio::time::sleep(pause).await;
            true
        }
    }
}

async fn wait_exit(engine: &dyn Engine, id: &str, faults: &ClientFaults) -> ExitResult {
    let gone = || ExitResult {
        err: Some(format!("container {id} is gone")),
        ..ExitResult::default()
    };
    // A broken wait or inspect is asked again as the core says.
    let mut attempt = 0;
    loop {
        loop {
            match engine.wait(id).await {
                Ok(()) => break,
                Err(error) => {
                    if !retry(&error, "waiting on", id, &mut attempt, faults).await {
                        return gone();
                    }
                }
            }
        }
        loop {
            match engine.inspect(id).await {
                // The wait answered for a container that still runs (a daemon restarting
                // under it): wait again.
                Ok(state) if state.running => break,
                Ok(state) => {
                    return ExitResult {
                        exit_code: state.exit_code.try_into().unwrap_or(i32::MAX),
                        signal: 0,
                        oom_killed: state.oom_killed,
                        err: state.error.filter(|error| !error.is_empty()),
                    };
                }
                Err(error) => {
                    if !retry(&error, "inspecting", id, &mut attempt, faults).await {
                        return gone();
                    }
                }
            }
        }
    }
}

impl TaskDriver for ContainerDriver {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn capabilities(&self) -> DriverCapabilities {
        DriverCapabilities {
            mount_configs: MountConfigSupport::All,
            fs_isolation: true,
        }
    }

    fn fingerprint(&self) -> DriverFingerprint {
        let facts = match &self.engine {
            Ok(engine) => engine
                .facts()
                .map_err(|error| tracing::debug!(%error, "docker daemon did not answer"))
                .ok(),
            Err(why) => {
                tracing::debug!(%why, "no docker engine");
                None
            }
        };
        if facts.is_some() {
            self.detected.store(true, Ordering::SeqCst);
        }
        let (detected, healthy, description, attributes) = drover_core::client::containers::fingerprint(
            facts.as_ref(),
            self.detected.load(Ordering::SeqCst),
            &self.plugin,
        );
        if healthy {
            self.sweep_orphans();
        }
        DriverFingerprint {
            detected,
            healthy,
            health_description: description.into(),
            attributes,
            update_time_ms: 0,
        }
    }

    fn start(&self, config: TaskConfig) -> BoxFuture<Result<TaskHandle, IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.start_task(config).await })
    }

    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult> {
        let driver = self.clone();
        Box::pin(async move {
            if let Some(mut running) = driver.running(&handle)
                && let Ok(exit) = running.exit.wait_for(Option::is_some).await
            {
                return exit.clone().unwrap_or_default();
            }
            match (driver.engine(), HandleState::read(&handle)) {
                (Ok(engine), Ok(state)) => wait_exit(engine.as_ref(), &state.container_id, &driver.faults).await,
                (Err(error), _) | (_, Err(error)) => ExitResult {
                    err: Some(error.message),
                    ..ExitResult::default()
                },
            }
        })
    }

    fn stop(&self, handle: TaskHandle, kill_timeout: Duration, signal: i32) -> BoxFuture<Result<(), IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.stop_task(handle, kill_timeout, signal).await })
    }

    fn recover(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.recover_task(handle).await })
    }

    fn destroy(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.destroy_task(handle).await })
    }

    fn create_network(&self, alloc_id: String, ports: Vec<AllocatedPort>) -> BoxFuture<Result<AllocNetwork, IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.create_network(alloc_id, ports).await })
    }

    fn destroy_network(&self, alloc_id: String, network: AllocNetwork) -> BoxFuture<Result<(), IoError>> {
        let driver = self.clone();
        Box::pin(async move { driver.destroy_network(alloc_id, network).await })
    }

    fn signal(&self, handle: &TaskHandle, signal: i32) -> Result<(), IoError> {
        let engine = self.engine()?;
        let state = HandleState::read(handle)?;
        let running = self.running(handle);
        if running.as_ref().is_some_and(|running| running.exit.borrow().is_some()) {
            return Err(IoError::new(ErrorKind::NotFound, "Task not running"));
        }
        tokio::spawn(async move {
            if let Err(error) = kill(engine.as_ref(), &state.container_id, signal).await {
                tracing::warn!(container = %state.container_id, %error, "could not signal the container");
            }
        });
        Ok(())
    }

    fn stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        let running = self.running(handle)?;
        if !running.sampling.swap(true, Ordering::SeqCst)
            && let Ok(engine) = self.engine()
        {
            let (usage, container) = (running.usage.clone(), running.container.clone());
            tokio::spawn(async move {
                let mut samples = engine.stats(&container);
                while let Some(sample) = samples.next().await {
                    *usage.lock().unwrap() = Some(sample);
                }
            });
        }
        running.usage.lock().unwrap().clone()
    }

    /// `alloc exec` through the Engine's exec API, in the task's container.
    fn exec_launch(
        &self,
        handle: &TaskHandle,
        command: &[String],
        tty: bool,
    ) -> BoxFuture<Result<ExecLaunch, IoError>> {
        let ready = (|| {
            let state = HandleState::read(handle)?;
            if self
                .running(handle)
                .is_none_or(|running| running.exit.borrow().is_some())
            {
                return Err(IoError::new(ErrorKind::NotFound, "Task not running"));
            }
            if command.is_empty() {
                return Err(IoError::other("must provide a command"));
            }
            Ok((self.engine()?, state.container_id))
        })();
        let command = command.to_vec();
        Box::pin(async move {
            let (engine, container) = ready?;
            engine.exec(&container, command, tty).await
        })
    }
}
