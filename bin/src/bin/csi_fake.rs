//! `drover-csi-fake`: the project's own CSI v1.9 plugin, hostpath-like, for tests and the demo.
//!
//! Serves Identity, Controller and Node on a unix socket (`--endpoint` or `CSI_ENDPOINT`).
//! Volumes are directories under `--state-dir`; staging and publishing are real bind mounts
//! (root needed). Optional capabilities: `--stage-unstage` (STAGE_UNSTAGE_VOLUME) and
//! `--attach-detach` (PUBLISH_UNPUBLISH_VOLUME). Fault switches name CSI calls by their RPC
//! name: `--fail NodePublishVolume`, `--hang NodeStageVolume`, `--slow ControllerPublishVolume=2000`,
//! `--crash NodeUnpublishVolume` (the process exits when the call arrives).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use drover_proto::csi::v1 as csi;
use drover_proto::csi::v1::controller_server::{Controller, ControllerServer};
use drover_proto::csi::v1::identity_server::{Identity, IdentityServer};
use drover_proto::csi::v1::node_server::{Node, NodeServer};
use tonic::{Request, Response, Status};

#[derive(Debug, Parser, Clone)]
#[command(
    name = "drover-csi-fake",
    about = "A hostpath-like CSI v1.9 plugin with fault switches"
)]
struct Args {
    /// Unix socket to serve on ("unix:///path" or a path); defaults to $CSI_ENDPOINT.
    #[arg(long)]
    endpoint: Option<String>,
    /// Where volumes (and the plugin's records) live.
    #[arg(long, default_value = "/tmp/drover-csi-fake")]
    state_dir: PathBuf,
    /// The node id reported by NodeGetInfo.
    #[arg(long, default_value = "fake-node")]
    node_id: String,
    #[arg(long)]
    stage_unstage: bool,
    #[arg(long)]
    attach_detach: bool,
    /// Accept volumes that were never created (as volumes registered out of band).
    #[arg(long)]
    auto_create: bool,
    #[arg(long, value_name = "CALL")]
    fail: Vec<String>,
    #[arg(long, value_name = "CALL")]
    hang: Vec<String>,
    #[arg(long, value_name = "CALL=MS")]
    slow: Vec<String>,
    #[arg(long, value_name = "CALL")]
    crash: Vec<String>,
}

struct Faults {
    fail: BTreeSet<String>,
    hang: BTreeSet<String>,
    slow: BTreeMap<String, u64>,
    crash: BTreeSet<String>,
}

struct Plugin {
    args: Args,
    faults: Faults,
    /// volume id → node ids it is controller-published to.
    attachments: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

/// The three CSI services share one plugin.
#[derive(Clone)]
struct Shared(Arc<Plugin>);

impl std::ops::Deref for Shared {
    type Target = Plugin;

    fn deref(&self) -> &Plugin {
        &self.0
    }
}

fn invalid(message: &str) -> Status {
    Status::invalid_argument(message)
}

impl Plugin {
    /// Applies the fault switches for `call`.
    async fn enter(&self, call: &str) -> Result<(), Status> {
        eprintln!("drover-csi-fake: {call}");
        if self.faults.crash.contains(call) {
            eprintln!("drover-csi-fake: crashing on {call}");
            std::process::exit(3);
        }
        if let Some(ms) = self.faults.slow.get(call) {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        if self.faults.hang.contains(call) {
            std::future::pending::<()>().await;
        }
        if self.faults.fail.contains(call) {
            return Err(Status::internal(format!("injected failure in {call}")));
        }
        Ok(())
    }

    fn volume_dir(&self, id: &str) -> Result<PathBuf, Status> {
        if id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        if id.contains('/') || id.contains("..") || id.chars().any(char::is_control) {
            return Err(invalid(
                "volume_id must not contain path separators, \"..\" or control characters",
            ));
        }
        Ok(self.args.state_dir.join("volumes").join(id))
    }

    fn existing_volume(&self, id: &str) -> Result<PathBuf, Status> {
        let dir = self.volume_dir(id)?;
        if !dir.is_dir() {
            if !self.args.auto_create {
                return Err(Status::not_found(format!("volume {id} does not exist")));
            }
            std::fs::create_dir_all(&dir).map_err(|error| Status::internal(error.to_string()))?;
        }
        Ok(dir)
    }
}

fn is_mounted(target: &Path) -> bool {
    let Ok(canonical) = target.canonicalize() else {
        return false;
    };
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    mountinfo
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .any(|mount_point| Path::new(mount_point) == canonical)
}

fn c_path(path: &Path) -> Result<CString, Status> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| invalid("path contains a NUL byte"))
}

fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    let (source_c, target_c) = (c_path(source)?, c_path(target)?);
    // SAFETY: both strings are valid NUL-terminated paths; no filesystem type or data.
    let result = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if result != 0 {
        return Err(Status::internal(format!(
            "bind mount {} on {}: {}",
            source.display(),
            target.display(),
            std::io::Error::last_os_error()
        )));
    }
    if read_only {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        // SAFETY: as above; remounts the bind mount just made read-only.
        let result = unsafe {
            libc::mount(
                std::ptr::null(),
                target_c.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if result != 0 {
            return Err(Status::internal(format!(
                "read-only remount of {}: {}",
                target.display(),
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

fn unmount(target: &Path) -> Result<(), Status> {
    if !is_mounted(target) {
        return Ok(());
    }
    let target_c = c_path(target)?;
    // SAFETY: a valid NUL-terminated path.
    let result = unsafe { libc::umount2(target_c.as_ptr(), 0) };
    if result != 0 {
        return Err(Status::internal(format!(
            "unmount {}: {}",
            target.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

fn require_capability(capability: &Option<csi::VolumeCapability>) -> Result<bool, Status> {
    let capability = capability
        .as_ref()
        .ok_or_else(|| invalid("volume_capability is required"))?;
    let mode = capability
        .access_mode
        .as_ref()
        .ok_or_else(|| invalid("volume_capability.access_mode is required"))?;
    use csi::volume_capability::access_mode::Mode;
    let read_only_mode = matches!(
        Mode::try_from(mode.mode),
        Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    );
    if capability.access_type.is_none() {
        return Err(invalid("volume_capability.access_type is required"));
    }
    Ok(read_only_mode)
}

#[tonic::async_trait]
impl Identity for Shared {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.enter("GetPluginInfo").await?;
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: "drover.csi.fake".into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        self.enter("GetPluginCapabilities").await?;
        use csi::plugin_capability::service::Type;
        let service = |kind: Type| csi::PluginCapability {
            r#type: Some(csi::plugin_capability::Type::Service(csi::plugin_capability::Service {
                r#type: kind as i32,
            })),
        };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![service(Type::ControllerService)],
        }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        self.enter("Probe").await?;
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for Shared {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.enter("CreateVolume").await?;
        let request = request.into_inner();
        if request.name.is_empty() {
            return Err(invalid("name is required"));
        }
        if request.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities are required"));
        }
        let dir = self.volume_dir(&request.name)?;
        std::fs::create_dir_all(&dir).map_err(|error| Status::internal(error.to_string()))?;
        let capacity = request
            .capacity_range
            .map_or(0, |range| range.required_bytes.max(range.limit_bytes.min(1 << 30)));
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: capacity,
                volume_id: request.name,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.enter("DeleteVolume").await?;
        let dir = self.volume_dir(&request.into_inner().volume_id)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|error| Status::internal(error.to_string()))?;
        }
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.enter("ControllerPublishVolume").await?;
        if !self.args.attach_detach {
            return Err(Status::unimplemented("PUBLISH_UNPUBLISH_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if request.node_id.is_empty() {
            return Err(invalid("node_id is required"));
        }
        require_capability(&request.volume_capability)?;
        self.existing_volume(&request.volume_id)?;
        if request.node_id != self.args.node_id {
            return Err(Status::not_found(format!("node {} does not exist", request.node_id)));
        }
        self.attachments
            .lock()
            .expect("attachments")
            .entry(request.volume_id.clone())
            .or_default()
            .insert(request.node_id);
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: [("attached".to_string(), request.volume_id)].into(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.enter("ControllerUnpublishVolume").await?;
        if !self.args.attach_detach {
            return Err(Status::unimplemented("PUBLISH_UNPUBLISH_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if let Some(nodes) = self
            .attachments
            .lock()
            .expect("attachments")
            .get_mut(&request.volume_id)
        {
            nodes.remove(&request.node_id);
        }
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.enter("ValidateVolumeCapabilities").await?;
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if request.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities are required"));
        }
        self.existing_volume(&request.volume_id)?;
        Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context,
                volume_capabilities: request.volume_capabilities,
                parameters: request.parameters,
                mutable_parameters: Default::default(),
            }),
            message: String::new(),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        self.enter("ControllerGetCapabilities").await?;
        use csi::controller_service_capability::rpc::Type;
        let rpc = |kind: Type| csi::ControllerServiceCapability {
            r#type: Some(csi::controller_service_capability::Type::Rpc(
                csi::controller_service_capability::Rpc { r#type: kind as i32 },
            )),
        };
        let mut capabilities = vec![rpc(Type::CreateDeleteVolume)];
        if self.args.attach_detach {
            capabilities.push(rpc(Type::PublishUnpublishVolume));
        }
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities }))
    }
}

#[tonic::async_trait]
impl Node for Shared {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.enter("NodeStageVolume").await?;
        if !self.args.stage_unstage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if request.staging_target_path.is_empty() {
            return Err(invalid("staging_target_path is required"));
        }
        require_capability(&request.volume_capability)?;
        let source = self.existing_volume(&request.volume_id)?;
        let staging = PathBuf::from(&request.staging_target_path);
        std::fs::create_dir_all(&staging).map_err(|error| Status::internal(error.to_string()))?;
        if !is_mounted(&staging) {
            bind_mount(&source, &staging, false)?;
        }
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.enter("NodeUnstageVolume").await?;
        if !self.args.stage_unstage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if request.staging_target_path.is_empty() {
            return Err(invalid("staging_target_path is required"));
        }
        unmount(Path::new(&request.staging_target_path))?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.enter("NodePublishVolume").await?;
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if request.target_path.is_empty() {
            return Err(invalid("target_path is required"));
        }
        let read_only_mode = require_capability(&request.volume_capability)?;
        let source = if self.args.stage_unstage {
            if request.staging_target_path.is_empty() {
                return Err(Status::failed_precondition(
                    "staging_target_path is required: the volume must be staged first",
                ));
            }
            let staging = PathBuf::from(&request.staging_target_path);
            if !is_mounted(&staging) {
                return Err(Status::failed_precondition(
                    "the volume is not staged at staging_target_path",
                ));
            }
            staging
        } else {
            self.existing_volume(&request.volume_id)?
        };
        let target = PathBuf::from(&request.target_path);
        std::fs::create_dir_all(&target).map_err(|error| Status::internal(error.to_string()))?;
        if !is_mounted(&target) {
            bind_mount(&source, &target, request.readonly || read_only_mode)?;
        }
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.enter("NodeUnpublishVolume").await?;
        let request = request.into_inner();
        self.volume_dir(&request.volume_id)?;
        if request.target_path.is_empty() {
            return Err(invalid("target_path is required"));
        }
        let target = PathBuf::from(&request.target_path);
        unmount(&target)?;
        if target.is_dir() {
            let _ = std::fs::remove_dir(&target);
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        self.enter("NodeGetCapabilities").await?;
        use csi::node_service_capability::rpc::Type;
        let mut capabilities = Vec::new();
        if self.args.stage_unstage {
            capabilities.push(csi::NodeServiceCapability {
                r#type: Some(csi::node_service_capability::Type::Rpc(
                    csi::node_service_capability::Rpc {
                        r#type: Type::StageUnstageVolume as i32,
                    },
                )),
            });
        }
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.enter("NodeGetInfo").await?;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.args.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

fn socket_path(args: &Args) -> anyhow::Result<PathBuf> {
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| std::env::var("CSI_ENDPOINT").ok())
        .ok_or_else(|| anyhow::anyhow!("no endpoint: pass --endpoint or set CSI_ENDPOINT"))?;
    Ok(PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(&endpoint)))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let socket = socket_path(&args)?;
    let slow = args
        .slow
        .iter()
        .map(|spec| {
            let (call, ms) = spec
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--slow wants CALL=MS, got {spec:?}"))?;
            Ok((call.to_string(), ms.parse()?))
        })
        .collect::<anyhow::Result<BTreeMap<String, u64>>>()?;
    let plugin = Shared(Arc::new(Plugin {
        faults: Faults {
            fail: args.fail.iter().cloned().collect(),
            hang: args.hang.iter().cloned().collect(),
            slow,
            crash: args.crash.iter().cloned().collect(),
        },
        attachments: Mutex::new(BTreeMap::new()),
        args,
    }));
    std::fs::create_dir_all(plugin.args.state_dir.join("volumes"))?;
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // A stale socket from an earlier run would make bind fail.
    let _ = std::fs::remove_file(&socket);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::UnixListener::bind(&socket)?;
        eprintln!("drover-csi-fake: serving on {}", socket.display());
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(plugin.clone()))
            .add_service(ControllerServer::new(plugin.clone()))
            .add_service(NodeServer::new(plugin))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await?;
        Ok(())
    })
}
