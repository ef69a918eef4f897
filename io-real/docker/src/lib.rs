//! The `docker` task driver: each task a container of a Docker Engine (dockerd, or podman's
//! compatible API), reached over its unix socket through `bollard`.
//!
//! What the container is made of is core's decision (`client::container_spec`): this crate
//! pulls the image when it is missing, creates and starts the container, forwards its output
//! into the task's rotated log files, waits for it and reads how it ended (exit code, OOM),
//! stops it with the task's signal and timeout, and removes it when the task is destroyed.
//! Every container carries Nomad's labels (`com.hashicorp.nomad.alloc_id`, `…task_name`), so a
//! client restarted after a crash reattaches to its own and can find the ones no task owns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptions, RemoveContainerOptions, RemoveImageOptions,
    StatsOptions,
};
use drover_core::client::container_spec::container_spec;
use drover_core::client::containers::{ImageGc, PullFailure};
use drover_core::client::{
    DriverCapabilities, ErrorKind, ExitResult, IoError, MountConfigSupport, TaskConfig, TaskHandle,
};
use drover_core::driverspec::docker::DockerTaskConfig;
use drover_core::driverspec::docker_plugin::DockerPluginConfig;
use drover_io_real::drivers::{CgroupUsage, DriverFingerprint, TaskDriver, TaskResourceUsage};
use drover_io_real::io::BoxFuture;
use futures::StreamExt;
use tokio::sync::watch;

pub mod engine;
mod exec;
mod fingerprint;
mod logs;

/// The Engine API version spoken: dockerd 20.10's, which newer daemons and podman 4 also serve.
const API_VERSION: bollard::ClientVersion = bollard::ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// Docker's own default socket.
const DEFAULT_SOCKET: &str = "unix:///var/run/docker.sock";

/// How long one Engine call may take before the daemon counts as hung (a pull has its own
/// `image_pull_timeout`; waits and log streams are long-lived and only their start is timed).
const CALL_TIMEOUT_SECS: u64 = 60;

type Key = (String, String);

/// A container this client is watching.
#[derive(Clone)]
struct Running {
    container: String,
    exit: watch::Receiver<Option<ExitResult>>,
    /// The last resource sample, once `stats` was asked for (a sampler then keeps it fresh).
    usage: Arc<Mutex<Option<TaskResourceUsage>>>,
    sampling: Arc<std::sync::atomic::AtomicBool>,
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

#[derive(Clone)]
pub struct DockerDriver {
    /// `unix:///path` as configured (plugin `endpoint`, `DOCKER_HOST`, or the default).
    endpoint: String,
    /// The Engine client; `None` when the endpoint is not a unix socket.
    docker: Option<Docker>,
    plugin: Arc<DockerPluginConfig>,
    tasks: Arc<Mutex<BTreeMap<Key, Running>>>,
    /// Whether the daemon has ever answered: until then the driver is undetected, after that a
    /// daemon that does not answer makes it unhealthy.
    detected: Arc<std::sync::atomic::AtomicBool>,
    /// Tasks between their container's creation and its watch (spared by the orphan sweep
    /// whatever the creation grace).
    starting: Arc<Mutex<std::collections::BTreeSet<Key>>>,
    /// Whether the orphan sweep runs.
    sweeping: Arc<std::sync::atomic::AtomicBool>,
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
    collecting: Arc<std::sync::atomic::AtomicBool>,
    /// The driver's start: the core's `now` is measured from it.
    epoch: tokio::time::Instant,
}

/// The endpoint a client uses: the plugin's `endpoint`, else `DOCKER_HOST`, else Docker's
/// default socket.
pub fn endpoint(plugin: &DockerPluginConfig, docker_host: Option<String>) -> String {
    if !plugin.endpoint.is_empty() {
        return plugin.endpoint.clone();
    }
    docker_host
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| DEFAULT_SOCKET.to_string())
}

impl DockerDriver {
    /// The driver for `plugin`'s settings, reaching the Engine at `endpoint` (see [`endpoint`]).
    pub fn new(plugin: DockerPluginConfig, endpoint: String) -> DockerDriver {
        let docker = socket_path(&endpoint)
            .and_then(|_| Docker::connect_with_unix(&endpoint, CALL_TIMEOUT_SECS, &API_VERSION).ok());
        DockerDriver {
            endpoint,
            docker,
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
        }
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
        let now = drover_io_real::clock::core_now(self.epoch);
        // Decided under the lock a collection also ends under: a release either finds the
        // collection still running (it will see this image) or starts the next one.
        let collect = {
            let mut images = self.images.lock().unwrap();
            images.release(image, alloc, task, now);
            images.next_due(self.plugin.image_delay).is_some()
                && !self.collecting.swap(true, std::sync::atomic::Ordering::SeqCst)
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
        use std::sync::atomic::Ordering;
        // A driver without a client starts no task, so lets go of no image; should it, the
        // next release may try again.
        let Ok(docker) = self.client().cloned() else {
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
            let now = drover_io_real::clock::core_now(self.epoch);
            tokio::time::sleep(at.saturating_duration_since(now)).await;
            let _alone = self.image_use.write().await;
            let now = drover_io_real::clock::core_now(self.epoch);
            let due = self.images.lock().unwrap().due(now, self.plugin.image_delay);
            for image in due {
                match docker.remove_image(&image, None::<RemoveImageOptions>, None).await {
                    Ok(_) => tracing::info!(%image, "removed an image no task used for image_delay"),
                    Err(error) => tracing::debug!(%image, said = %engine::said(&error), "image kept"),
                }
            }
        }
    }

    /// The client's allocation root: its containers are labelled with it, and only containers
    /// so labelled are ever swept as orphans.
    pub fn with_alloc_root(mut self, alloc_root: &Path) -> DockerDriver {
        self.client_label = Some(drover_core::client::container_spec::client_label(
            &alloc_root.to_string_lossy(),
        ));
        self
    }

    /// Starts the sweep for labelled containers no task of this client owns (left by a client
    /// killed between creating a container and recording it, or by an allocation collected
    /// while the client was away): every `period`, the first one `period` after the driver's
    /// first fingerprint, when the tasks persisted before a restart have been reattached.
    fn sweep_orphans(&self) {
        use std::sync::atomic::Ordering;
        if !self.plugin.gc_containers
            || self.docker.is_none()
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
        let docker = self.client()?.clone();
        let Some(client) = self.client_label.as_deref() else {
            return Ok(());
        };
        let filters = std::collections::HashMap::from([("label".to_string(), vec![LABEL_ALLOC_ID.to_string()])]);
        let listed = docker
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|error| engine::io_error("Failed to list containers", &error))?;
        let listed: Vec<Listed> = listed
            .into_iter()
            .filter_map(|summary| {
                Some(Listed {
                    id: summary.id?,
                    labels: summary.labels.unwrap_or_default().into_iter().collect(),
                    created: drover_core::Instant::from_millis(u64::try_from(summary.created?).ok()? * 1000),
                })
            })
            .collect();
        let mut tracked: std::collections::BTreeSet<Key> = self.tasks.lock().unwrap().keys().cloned().collect();
        tracked.extend(self.starting.lock().unwrap().iter().cloned());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_millis() as u64)
            .unwrap_or(0);
        let now = drover_core::Instant::from_millis(now_ms);
        for id in orphans(&listed, client, &tracked, now, self.plugin.creation_grace) {
            tracing::info!(container = %id, "removing a container no task of this client owns");
            remove_container(&docker, &id).await;
        }
        Ok(())
    }

    fn client(&self) -> Result<&Docker, IoError> {
        self.docker.as_ref().ok_or_else(|| {
            IoError::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "docker endpoint {:?} is not a unix socket (unix:///path)",
                    self.endpoint
                ),
            )
        })
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, IoError> {
        let docker = self.client()?.clone();
        // The task's own configuration, refused: never worth another attempt (core decides).
        let refused = |text: String| IoError::new(ErrorKind::TaskConfig, text);
        let task_config = DockerTaskConfig::read(&config.config).map_err(|problem| refused(problem.to_string()))?;
        let spec =
            container_spec(&config, &task_config, &self.plugin).map_err(|refusal| refused(refusal.to_string()))?;
        self.hold_image(&task_config.image, &config.alloc_id, &config.task);
        let using = self.image_use.read().await;
        if let Err(error) = ensure_image(&docker, &task_config).await {
            drop(using);
            self.let_go_of_image(&task_config.image, &config.alloc_id, &config.task);
            return Err(error);
        }
        // The Engine binds `rshared` only from a shared mount: a host whose `/` is private
        // gets its source bound onto itself and shared (a CSI plugin's mounts reach the host).
        let mut shared = Vec::new();
        for mount in spec.mounts.iter().filter(|mount| mount.propagation == "rshared") {
            match drover_io_real::shared_mounts::make_shared(Path::new(&mount.source)) {
                Ok(true) => shared.push(mount.source.clone()),
                Ok(false) => {}
                Err(error) => {
                    drop(using);
                    drover_io_real::shared_mounts::release_shared(&shared);
                    self.let_go_of_image(&task_config.image, &config.alloc_id, &config.task);
                    return Err(error);
                }
            }
        }
        let key = (config.alloc_id.clone(), config.task.clone());
        self.starting.lock().unwrap().insert(key.clone());
        let started = async {
            let id = create_container(&docker, &spec).await;
            drop(using);
            let id = id?;
            if let Err(error) = docker.start_container(&id, None).await {
                // Nothing is left behind by a container that would not start (a port taken, a
                // bind source missing): the task's start failed and the container goes with it.
                remove_container(&docker, &id).await;
                return Err(engine::io_error(&format!("Failed to start container {id}"), &error));
            }
            self.watch(&config.alloc_id, &config.task, &id, &config.log_dir, config.logs, 0);
            Ok(id)
        }
        .await;
        self.starting.lock().unwrap().remove(&key);
        if started.is_err() {
            drover_io_real::shared_mounts::release_shared(&shared);
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
    fn watch(
        &self,
        alloc_id: &str,
        task: &str,
        id: &str,
        log_dir: &str,
        logs: drover_core::structs::LogConfig,
        since: i64,
    ) {
        let docker = self.client().expect("watched containers have a client").clone();
        let (sender, receiver) = watch::channel(None);
        tokio::spawn(logs::follow(
            docker.clone(),
            id.to_string(),
            PathBuf::from(log_dir),
            task.to_string(),
            logs,
            since,
        ));
        let waited = id.to_string();
        tokio::spawn(async move {
            let exit = wait_exit(&docker, &waited).await;
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
        let docker = self.client()?.clone();
        let state = HandleState::read(&handle)?;
        let Some(mut running) = self.running(&handle) else {
            // Not watched here (its reattach failed): the Engine's own stop, which escalates to
            // SIGKILL after the timeout.
            let options = bollard::query_parameters::StopContainerOptions {
                t: Some(kill_timeout.as_secs().try_into().unwrap_or(i32::MAX)),
                signal: None,
            };
            return match docker.stop_container(&state.container_id, Some(options)).await {
                Ok(()) => Ok(()),
                Err(error) if engine::not_found(&error) || engine::status(&error) == Some(304) => Ok(()),
                Err(error) => Err(engine::io_error("Failed to stop container", &error)),
            };
        };
        if running.exit.borrow().is_some() {
            return Ok(());
        }
        kill(&docker, &state.container_id, signal).await?;
        let exited = tokio::time::timeout(kill_timeout, running.exit.wait_for(Option::is_some))
            .await
            .is_ok();
        if !exited {
            kill(&docker, &state.container_id, libc::SIGKILL).await?;
            let _ = running.exit.wait_for(Option::is_some).await;
        }
        Ok(())
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), IoError> {
        let docker = self.client()?.clone();
        let state = HandleState::read(&handle)?;
        docker
            .inspect_container(&state.container_id, None)
            .await
            .map_err(|error| engine::io_error(&format!("container {} is gone", state.container_id), &error))?;
        self.hold_image(&state.image, &handle.alloc_id, &handle.task);
        let since = logs::resume_from(Path::new(&state.log_dir), &handle.task);
        self.watch(
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
        let docker = self.client()?.clone();
        let state = HandleState::read(&handle)?;
        force_remove(&docker, &state.container_id)
            .await
            .map_err(|error| engine::io_error("Failed to remove container", &error))?;
        self.tasks
            .lock()
            .unwrap()
            .remove(&(handle.alloc_id.clone(), handle.task.clone()));
        drover_io_real::shared_mounts::release_shared(&state.shared);
        self.let_go_of_image(&state.image, &handle.alloc_id, &handle.task);
        Ok(())
    }
}

/// The path of a `unix://` endpoint.
fn socket_path(endpoint: &str) -> Option<PathBuf> {
    endpoint.strip_prefix("unix://").map(PathBuf::from)
}

/// `repo` and `tag` of an image reference (`latest` when none is named; a digest pins it).
fn image_reference(image: &str) -> (String, String) {
    if image.contains('@') {
        return (image.to_string(), String::new());
    }
    let name_start = image.rfind('/').map(|at| at + 1).unwrap_or(0);
    match image[name_start..].rfind(':') {
        Some(at) => (
            image[..name_start + at].to_string(),
            image[name_start + at + 1..].to_string(),
        ),
        None => (image.to_string(), "latest".to_string()),
    }
}

/// The task's image, pulled when the Engine does not have it (or always, with `force_pull`),
/// within `image_pull_timeout`.
async fn ensure_image(docker: &Docker, config: &DockerTaskConfig) -> Result<(), IoError> {
    if !config.force_pull {
        match docker.inspect_image(&config.image).await {
            Ok(_) => return Ok(()),
            Err(error) if engine::not_found(&error) => {}
            Err(error) => return Err(engine::io_error("Failed to inspect image", &error)),
        }
    }
    let (repo, tag) = image_reference(&config.image);
    let credentials = config.auth.as_ref().map(|auth| bollard::auth::DockerCredentials {
        username: Some(auth.username.clone()).filter(|text| !text.is_empty()),
        password: Some(auth.password.0.clone()).filter(|text| !text.is_empty()),
        email: Some(auth.email.clone()).filter(|text| !text.is_empty()),
        serveraddress: Some(auth.server_address.clone()).filter(|text| !text.is_empty()),
        ..Default::default()
    });
    let options = CreateImageOptions {
        from_image: Some(repo),
        tag: Some(tag).filter(|tag| !tag.is_empty()),
        ..Default::default()
    };
    let pull = async {
        let mut progress = docker.create_image(Some(options), None, credentials.clone());
        while let Some(step) = progress.next().await {
            step?;
        }
        Ok::<(), bollard::errors::Error>(())
    };
    let failed = |said: String, kind| IoError::new(kind, format!("Failed to pull `{}`: {said}", config.image));
    match tokio::time::timeout(config.image_pull_timeout, pull).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => {
            let failure = match engine::status(&error) {
                Some(404) => PullFailure::NotFound,
                Some(401) | Some(403) => PullFailure::Unauthorized,
                // dockerd 20.10 answers a registry's "manifest unknown" with a 500 (and some
                // pulls fail inside the progress stream, with text only): its distribution
                // endpoint asks the registry again and answers with the status that fits.
                _ => match docker.inspect_registry_image(&config.image, credentials).await {
                    Err(error) if engine::status(&error) == Some(404) => PullFailure::NotFound,
                    Err(error) if matches!(engine::status(&error), Some(401) | Some(403)) => PullFailure::Unauthorized,
                    _ => PullFailure::Daemon,
                },
            };
            Err(failed(engine::said(&error), ErrorKind::ImagePull(failure)))
        }
        Err(_) => Err(failed(
            format!("no image after image_pull_timeout ({:?})", config.image_pull_timeout),
            ErrorKind::ImagePull(PullFailure::Timeout),
        )),
    }
}

/// Creates the container; a container of the same name (left by a client that crashed between
/// creating it and recording it) is removed first.
async fn create_container(
    docker: &Docker,
    spec: &drover_core::client::container_spec::ContainerSpec,
) -> Result<String, IoError> {
    let body = engine::create_body(spec);
    let options = || CreateContainerOptions {
        name: Some(spec.name.clone()),
        platform: String::new(),
    };
    match docker.create_container(Some(options()), body.clone()).await {
        Ok(created) => Ok(created.id),
        Err(error) if engine::status(&error) == Some(409) => {
            tracing::info!(container = %spec.name, "removing a leftover container of the same name");
            remove_container(docker, &spec.name).await;
            docker
                .create_container(Some(options()), body)
                .await
                .map(|created| created.id)
                .map_err(|error| engine::io_error("Failed to create container", &error))
        }
        Err(error) => Err(engine::io_error("Failed to create container", &error)),
    }
}

/// Removes the container, running or not, with its anonymous volumes; one already gone is
/// removed.
async fn force_remove(docker: &Docker, id: &str) -> Result<(), bollard::errors::Error> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    match docker.remove_container(id, Some(options)).await {
        Err(error) if !engine::not_found(&error) => Err(error),
        _ => Ok(()),
    }
}

/// [`force_remove`] where a failure can only be logged (undoing a start, a sweep).
async fn remove_container(docker: &Docker, id: &str) {
    if let Err(error) = force_remove(docker, id).await {
        tracing::warn!(container = %id, %error, "could not remove a container");
    }
}

/// Sends `signal`; a container that is already gone or stopped needs none.
async fn kill(docker: &Docker, id: &str, signal: i32) -> Result<(), IoError> {
    let options = KillContainerOptions {
        signal: signal.to_string(),
    };
    match docker.kill_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(error) if engine::not_found(&error) || engine::status(&error) == Some(409) => Ok(()),
        Err(error) => Err(engine::io_error("Failed to signal container", &error)),
    }
}

/// How the container ended. A daemon that goes away while it runs is waited out (a daemon
/// without live-restore stops its containers, whose exits are then read); a container that is
/// gone is reported as an error.
async fn wait_exit(docker: &Docker, id: &str) -> ExitResult {
    let mut pause = Duration::from_millis(200);
    loop {
        let mut waiting = docker.wait_container(id, None);
        match waiting.next().await {
            Some(Ok(_)) | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => break,
            Some(Err(error)) if engine::not_found(&error) => {
                return ExitResult {
                    err: Some(format!("container {id} is gone")),
                    ..ExitResult::default()
                };
            }
            Some(Err(error)) => {
                tracing::debug!(container = %id, %error, "waiting on the container again");
            }
            None => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
    loop {
        match docker.inspect_container(id, None).await {
            Ok(inspected) => {
                let state = inspected.state.unwrap_or_default();
                if state.running == Some(true) {
                    // The wait answered for a container that still runs (a daemon restarting
                    // under it): wait again.
                    return Box::pin(wait_exit(docker, id)).await;
                }
                return ExitResult {
                    exit_code: state.exit_code.unwrap_or(0).try_into().unwrap_or(i32::MAX),
                    signal: 0,
                    oom_killed: state.oom_killed.unwrap_or(false),
                    err: state.error.filter(|error| !error.is_empty()),
                };
            }
            Err(error) if engine::not_found(&error) => {
                return ExitResult {
                    err: Some(format!("container {id} is gone")),
                    ..ExitResult::default()
                };
            }
            Err(error) => {
                tracing::debug!(container = %id, %error, "inspecting the exited container again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Samples the container's use every second while it runs, into `usage`.
async fn sample_usage(docker: Docker, id: String, usage: Arc<Mutex<Option<TaskResourceUsage>>>) {
    let options = StatsOptions {
        stream: true,
        one_shot: false,
    };
    let mut stats = docker.stats(&id, Some(options));
    while let Some(Ok(sample)) = stats.next().await {
        let cpu = sample.cpu_stats.unwrap_or_default();
        let precpu = sample.precpu_stats.unwrap_or_default();
        let used = cpu.cpu_usage.unwrap_or_default();
        let before = precpu.cpu_usage.unwrap_or_default();
        // Percent of one core over the sampling interval (the system counter covers every
        // CPU, so it is divided back by their number).
        let system_delta = cpu
            .system_cpu_usage
            .unwrap_or(0)
            .saturating_sub(precpu.system_cpu_usage.unwrap_or(0)) as f64;
        let cpus = f64::from(cpu.online_cpus.unwrap_or(1).max(1));
        let percent = |now: Option<u64>, then: Option<u64>| {
            if system_delta <= 0.0 {
                return 0.0;
            }
            now.unwrap_or(0).saturating_sub(then.unwrap_or(0)) as f64 / system_delta * cpus * 100.0
        };
        let memory = sample.memory_stats.unwrap_or_default();
        let figures = memory.stats.unwrap_or_default();
        let throttling = cpu.throttling_data.unwrap_or_default();
        let measured = TaskResourceUsage {
            rss_bytes: figures.get("rss").or_else(|| figures.get("anon")).copied().unwrap_or(0),
            user_percent: percent(used.usage_in_usermode, before.usage_in_usermode),
            system_percent: percent(used.usage_in_kernelmode, before.usage_in_kernelmode),
            pids: Vec::new(),
            cgroup: Some(CgroupUsage {
                usage_bytes: memory.usage,
                max_usage_bytes: memory.max_usage,
                cache_bytes: figures.get("cache").or_else(|| figures.get("file")).copied(),
                swap_bytes: figures.get("swap").copied(),
                throttled_periods: throttling.throttled_periods,
                throttled_time_ns: throttling.throttled_time,
            }),
        };
        *usage.lock().unwrap() = Some(measured);
    }
}

impl TaskDriver for DockerDriver {
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
        let fingerprint = fingerprint::take(&self.endpoint, &self.plugin, &self.detected);
        if fingerprint.healthy {
            self.sweep_orphans();
        }
        fingerprint
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
            match (driver.client(), HandleState::read(&handle)) {
                (Ok(docker), Ok(state)) => wait_exit(docker, &state.container_id).await,
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

    fn signal(&self, handle: &TaskHandle, signal: i32) -> Result<(), IoError> {
        let docker = self.client()?.clone();
        let state = HandleState::read(handle)?;
        let running = self.running(handle);
        if running.as_ref().is_some_and(|running| running.exit.borrow().is_some()) {
            return Err(IoError::new(ErrorKind::NotFound, "Task not running"));
        }
        tokio::spawn(async move {
            if let Err(error) = kill(&docker, &state.container_id, signal).await {
                tracing::warn!(container = %state.container_id, %error, "could not signal the container");
            }
        });
        Ok(())
    }

    fn stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        let running = self.running(handle)?;
        if !running.sampling.swap(true, std::sync::atomic::Ordering::SeqCst)
            && let Ok(docker) = self.client()
        {
            tokio::spawn(sample_usage(
                docker.clone(),
                running.container.clone(),
                running.usage.clone(),
            ));
        }
        running.usage.lock().unwrap().clone()
    }

    /// `alloc exec` through the Engine's exec API (`exec`), in the task's container.
    fn exec_launch(
        &self,
        handle: &TaskHandle,
        command: &[String],
        tty: bool,
    ) -> BoxFuture<Result<drover_io_real::drivers::ExecLaunch, IoError>> {
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
            Ok((self.client()?.clone(), state.container_id))
        })();
        let command = command.to_vec();
        Box::pin(async move {
            let (docker, container) = ready?;
            exec::launch(docker, &container, command, tty).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_split_into_repository_and_tag() {
        assert_eq!(image_reference("busybox"), ("busybox".into(), "latest".into()));
        assert_eq!(image_reference("redis:7"), ("redis".into(), "7".into()));
        assert_eq!(
            image_reference("localhost:5000/team/app"),
            ("localhost:5000/team/app".into(), "latest".into())
        );
        assert_eq!(
            image_reference("localhost:5000/team/app:v2"),
            ("localhost:5000/team/app".into(), "v2".into())
        );
        assert_eq!(
            image_reference("app@sha256:abcd"),
            ("app@sha256:abcd".into(), String::new())
        );
    }

    #[test]
    fn the_endpoint_is_the_plugins_then_docker_host_then_the_default() {
        let mut plugin = DockerPluginConfig::default();
        assert_eq!(endpoint(&plugin, None), "unix:///var/run/docker.sock");
        assert_eq!(
            endpoint(&plugin, Some("unix:///run/d.sock".into())),
            "unix:///run/d.sock"
        );
        plugin.endpoint = "unix:///srv/docker.sock".into();
        assert_eq!(
            endpoint(&plugin, Some("unix:///run/d.sock".into())),
            "unix:///srv/docker.sock"
        );
    }
}
