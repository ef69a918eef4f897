//! The `docker` task driver's Engine on a host: a Docker Engine (dockerd, or podman's
//! compatible API) reached over its unix socket through `bollard`. The driver itself
//! (`drover_io_real::containers::ContainerDriver`) and its decisions (core's
//! `client::container_spec`, `client::containers`) are the same in a simulation, where io-sim's
//! engine answers in this one's place; this crate maps each call onto the Engine API and each
//! answer back into the driver's typed ones.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, RemoveImageOptions, StatsOptions, StopContainerOptions,
};
use drover_core::client::IoError;
use drover_core::client::container_spec::ContainerSpec;
use drover_core::client::containers::EngineFacts;
use drover_core::driverspec::docker::DockerAuth;
use drover_core::driverspec::docker_plugin::DockerPluginConfig;
use drover_io_real::containers::{
    ContainerDriver, ContainerState, Engine, EngineError, EngineFailure, EngineResult, ListedContainer, Output,
};
use drover_io_real::drivers::{CgroupUsage, ExecLaunch, TaskResourceUsage};
use drover_io_real::io::BoxFuture;
use futures::StreamExt;
use futures::stream::BoxStream;

pub mod engine;
mod exec;
mod fingerprint;

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

/// The `docker` driver for `plugin`'s settings, its Engine at `endpoint` (see [`endpoint`]).
pub fn driver(plugin: DockerPluginConfig, endpoint: &str) -> ContainerDriver {
    let engine = BollardEngine::connect(endpoint).map(|engine| Arc::new(engine) as Arc<dyn Engine>);
    ContainerDriver::new(plugin, engine)
}

/// A host's Docker Engine, over its unix socket.
#[derive(Clone)]
pub struct BollardEngine {
    docker: Docker,
    socket: PathBuf,
}

impl BollardEngine {
    /// The Engine at `endpoint` (`unix:///path`); `Err` says why there is none.
    pub fn connect(endpoint: &str) -> Result<BollardEngine, String> {
        let not_unix = || format!("docker endpoint {endpoint:?} is not a unix socket (unix:///path)");
        let socket = socket_path(endpoint).ok_or_else(not_unix)?;
        let docker = Docker::connect_with_unix(endpoint, CALL_TIMEOUT_SECS, &API_VERSION)
            .map_err(|error| format!("docker endpoint {endpoint:?}: {error}"))?;
        Ok(BollardEngine { docker, socket })
    }
}

fn credentials(auth: Option<&DockerAuth>) -> Option<bollard::auth::DockerCredentials> {
    auth.map(|auth| bollard::auth::DockerCredentials {
        username: Some(auth.username.clone()).filter(|text| !text.is_empty()),
        password: Some(auth.password.0.clone()).filter(|text| !text.is_empty()),
        email: Some(auth.email.clone()).filter(|text| !text.is_empty()),
        serveraddress: Some(auth.server_address.clone()).filter(|text| !text.is_empty()),
        ..Default::default()
    })
}

fn failed(error: bollard::errors::Error) -> EngineError {
    engine::engine_error(&error)
}

impl Engine for BollardEngine {
    fn facts(&self) -> EngineResult<EngineFacts> {
        fingerprint::facts(&self.socket).map_err(|said| EngineError::new(EngineFailure::Unreachable, said))
    }

    fn has_image(&self, image: &str) -> BoxFuture<EngineResult<bool>> {
        let (docker, image) = (self.docker.clone(), image.to_string());
        Box::pin(async move {
            match docker.inspect_image(&image).await {
                Ok(_) => Ok(true),
                Err(error) if engine::not_found(&error) => Ok(false),
                Err(error) => Err(failed(error)),
            }
        })
    }

    fn pull(&self, image: &str, auth: Option<&DockerAuth>) -> BoxFuture<EngineResult<()>> {
        let (docker, image, credentials) = (self.docker.clone(), image.to_string(), credentials(auth));
        Box::pin(async move {
            let (repo, tag) = image_reference(&image);
            let options = CreateImageOptions {
                from_image: Some(repo),
                tag: Some(tag).filter(|tag| !tag.is_empty()),
                ..Default::default()
            };
            let mut progress = docker.create_image(Some(options), None, credentials.clone());
            let mut pulled = Ok(());
            while let Some(step) = progress.next().await {
                if let Err(error) = step {
                    pulled = Err(error);
                    break;
                }
            }
            let Err(error) = pulled else {
                return Ok(());
            };
            let mut answer = failed(error);
            // dockerd 20.10 answers a registry's "manifest unknown" with a 500 (and some pulls
            // fail inside the progress stream, with text only): its distribution endpoint asks
            // the registry again and answers with the status that fits.
            if !matches!(answer.kind, EngineFailure::NotFound | EngineFailure::Unauthorized)
                && let Err(again) = docker.inspect_registry_image(&image, credentials).await
            {
                let again = failed(again);
                if matches!(again.kind, EngineFailure::NotFound | EngineFailure::Unauthorized) {
                    answer.kind = again.kind;
                }
            }
            Err(answer)
        })
    }

    fn remove_image(&self, image: &str) -> BoxFuture<EngineResult<()>> {
        let (docker, image) = (self.docker.clone(), image.to_string());
        Box::pin(async move {
            docker
                .remove_image(&image, None::<RemoveImageOptions>, None)
                .await
                .map(|_| ())
                .map_err(failed)
        })
    }

    fn create(&self, spec: &ContainerSpec) -> BoxFuture<EngineResult<String>> {
        let docker = self.docker.clone();
        let body = engine::create_body(spec);
        let options = CreateContainerOptions {
            name: Some(spec.name.clone()),
            platform: String::new(),
        };
        Box::pin(async move {
            docker
                .create_container(Some(options), body)
                .await
                .map(|created| created.id)
                .map_err(failed)
        })
    }

    fn start(&self, id: &str) -> BoxFuture<EngineResult<()>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        Box::pin(async move { docker.start_container(&id, None).await.map_err(failed) })
    }

    fn remove(&self, id: &str) -> BoxFuture<EngineResult<()>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        Box::pin(async move { docker.remove_container(&id, Some(options)).await.map_err(failed) })
    }

    fn kill(&self, id: &str, signal: i32) -> BoxFuture<EngineResult<()>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        let options = KillContainerOptions {
            signal: signal.to_string(),
        };
        Box::pin(async move { docker.kill_container(&id, Some(options)).await.map_err(failed) })
    }

    fn stop(&self, id: &str, timeout: Duration) -> BoxFuture<EngineResult<()>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        let options = StopContainerOptions {
            t: Some(timeout.as_secs().try_into().unwrap_or(i32::MAX)),
            signal: None,
        };
        Box::pin(async move { docker.stop_container(&id, Some(options)).await.map_err(failed) })
    }

    fn wait(&self, id: &str) -> BoxFuture<EngineResult<()>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        Box::pin(async move {
            let mut waiting = docker.wait_container(&id, None);
            match waiting.next().await {
                // bollard reports a non-zero exit as an error: it exited all the same.
                Some(Ok(_)) | Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => Ok(()),
                Some(Err(error)) => Err(failed(error)),
                None => Err(EngineError::new(
                    EngineFailure::Unreachable,
                    format!("the wait on container {id} ended without an answer"),
                )),
            }
        })
    }

    fn inspect(&self, id: &str) -> BoxFuture<EngineResult<ContainerState>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        Box::pin(async move {
            let inspected = docker.inspect_container(&id, None).await.map_err(failed)?;
            let state = inspected.state.unwrap_or_default();
            Ok(ContainerState {
                running: state.running == Some(true),
                exit_code: state.exit_code.unwrap_or(0),
                oom_killed: state.oom_killed.unwrap_or(false),
                error: state.error.filter(|error| !error.is_empty()),
            })
        })
    }

    fn list(&self, label: &str) -> BoxFuture<EngineResult<Vec<ListedContainer>>> {
        let docker = self.docker.clone();
        let filters = std::collections::HashMap::from([("label".to_string(), vec![label.to_string()])]);
        Box::pin(async move {
            let listed = docker
                .list_containers(Some(ListContainersOptions {
                    all: true,
                    filters: Some(filters),
                    ..Default::default()
                }))
                .await
                .map_err(failed)?;
            Ok(listed
                .into_iter()
                .filter_map(|summary| {
                    Some(ListedContainer {
                        id: summary.id?,
                        labels: summary
                            .labels
                            .unwrap_or_default()
                            .into_iter()
                            .collect::<BTreeMap<_, _>>(),
                        created_unix_secs: u64::try_from(summary.created?).ok()?,
                    })
                })
                .collect())
        })
    }

    fn logs(&self, id: &str, since: i64) -> BoxStream<'static, EngineResult<Output>> {
        let options = LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            since: since.try_into().unwrap_or(0),
            ..Default::default()
        };
        self.docker
            .logs(id, Some(options))
            .filter_map(|chunk| {
                std::future::ready(match chunk {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        Some(Ok(Output::Stdout(message.to_vec())))
                    }
                    Ok(LogOutput::StdErr { message }) => Some(Ok(Output::Stderr(message.to_vec()))),
                    Ok(LogOutput::StdIn { .. }) => None,
                    Err(error) => Some(Err(failed(error))),
                })
            })
            .boxed()
    }

    fn stats(&self, id: &str) -> BoxStream<'static, TaskResourceUsage> {
        let options = StatsOptions {
            stream: true,
            one_shot: false,
        };
        self.docker
            .stats(id, Some(options))
            .take_while(|sample| std::future::ready(sample.is_ok()))
            .filter_map(|sample| std::future::ready(sample.ok().map(usage)))
            .boxed()
    }

    fn exec(&self, id: &str, command: Vec<String>, tty: bool) -> BoxFuture<Result<ExecLaunch, IoError>> {
        let (docker, id) = (self.docker.clone(), id.to_string());
        Box::pin(async move { exec::launch(docker, &id, command, tty).await })
    }

    fn share(&self, source: &Path) -> Result<bool, IoError> {
        drover_io_real::shared_mounts::make_shared(source)
    }

    fn release_shared(&self, sources: &[String]) {
        drover_io_real::shared_mounts::release_shared(sources);
    }
}

/// One of the Engine's stats samples as the task's resource use.
fn usage(sample: bollard::models::ContainerStatsResponse) -> TaskResourceUsage {
    let cpu = sample.cpu_stats.unwrap_or_default();
    let precpu = sample.precpu_stats.unwrap_or_default();
    let used = cpu.cpu_usage.unwrap_or_default();
    let before = precpu.cpu_usage.unwrap_or_default();
    // Percent of one core over the sampling interval (the system counter covers every CPU,
    // so it is divided back by their number).
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
    TaskResourceUsage {
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
