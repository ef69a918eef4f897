//! The Node service: real bind mounts for staging and publishing, volume statistics from
//! the volume's files and the filesystem holding them, node-side expansion, and the node's
//! topology and volume limit.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use drover_proto::csi::v1 as csi;
use drover_proto::csi::v1::node_server::Node;
use tonic::{Request, Response, Status};

use super::controller::check_capability;
use super::{Shared, check_id, invalid};

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

fn required_capability(capability: Option<&csi::VolumeCapability>) -> Result<bool, Status> {
    check_capability(capability.ok_or_else(|| invalid("volume_capability is required"))?)
}

/// Inodes of the filesystem holding `path` (total, free), from statvfs.
fn inodes(path: &Path) -> Option<(i64, i64)> {
    let path = c_path(path).ok()?;
    // SAFETY: statvfs fills the zeroed struct for a valid NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some((stat.f_files as i64, stat.f_ffree as i64))
}

impl Shared {
    /// The volume's condition: abnormal once its data directory is gone from under it.
    pub(super) fn condition(&self, id: &str) -> csi::VolumeCondition {
        if self.store.volume_dir(id).is_dir() {
            csi::VolumeCondition {
                abnormal: false,
                message: "the volume's data directory is present".into(),
            }
        } else {
            csi::VolumeCondition {
                abnormal: true,
                message: format!("the data directory of volume {id} is missing"),
            }
        }
    }

    /// The volume's data directory (its record made under `--auto-create`).
    fn source(&self, id: &str) -> Result<PathBuf, Status> {
        self.existing(id)?;
        Ok(self.store.volume_dir(id))
    }
}

#[tonic::async_trait]
impl Node for Shared {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.enter("NodeStageVolume").await?;
        if !self.features.stage_unstage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.staging_target_path.is_empty() {
            return Err(invalid("staging_target_path is required"));
        }
        required_capability(request.volume_capability.as_ref())?;
        let source = self.source(&request.volume_id)?;
        let staging = PathBuf::from(&request.staging_target_path);
        std::fs::create_dir_all(&staging).map_err(|error| Status::internal(error.to_string()))?;
        if !is_mounted(&staging) {
            bind_mount(&source, &staging, false)?;
        }
        let (id, path) = (request.volume_id.clone(), request.staging_target_path.clone());
        self.store.update(|state| {
            if let Some(volume) = state.volumes.get_mut(&id) {
                volume.staged.insert(path.clone());
            }
            Ok(())
        })?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.enter("NodeUnstageVolume").await?;
        if !self.features.stage_unstage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.staging_target_path.is_empty() {
            return Err(invalid("staging_target_path is required"));
        }
        unmount(Path::new(&request.staging_target_path))?;
        self.store.update(|state| {
            if let Some(volume) = state.volumes.get_mut(&request.volume_id) {
                volume.staged.remove(&request.staging_target_path);
            }
            Ok(())
        })?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.enter("NodePublishVolume").await?;
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.target_path.is_empty() {
            return Err(invalid("target_path is required"));
        }
        let read_only = required_capability(request.volume_capability.as_ref())? || request.readonly;
        let source = if self.features.stage_unstage {
            if request.staging_target_path.is_empty() {
                return Err(Status::failed_precondition(
                    "staging_target_path is required: the volume must be staged first",
                ));
            }
            self.existing(&request.volume_id)?;
            let staging = PathBuf::from(&request.staging_target_path);
            if !is_mounted(&staging) {
                return Err(Status::failed_precondition(
                    "the volume is not staged at staging_target_path",
                ));
            }
            staging
        } else {
            self.source(&request.volume_id)?
        };
        let held = self
            .store
            .read()?
            .volumes
            .get(&request.volume_id)
            .and_then(|volume| volume.published.get(&request.target_path).copied());
        let target = PathBuf::from(&request.target_path);
        match held {
            Some(was_read_only) if was_read_only != read_only && is_mounted(&target) => {
                return Err(Status::already_exists(format!(
                    "volume {} is published at {} with a different read-only setting",
                    request.volume_id, request.target_path
                )));
            }
            _ => {}
        }
        std::fs::create_dir_all(&target).map_err(|error| Status::internal(error.to_string()))?;
        if !is_mounted(&target) {
            bind_mount(&source, &target, read_only)?;
        }
        self.store.update(|state| {
            if let Some(volume) = state.volumes.get_mut(&request.volume_id) {
                volume.published.insert(request.target_path.clone(), read_only);
            }
            Ok(())
        })?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.enter("NodeUnpublishVolume").await?;
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.target_path.is_empty() {
            return Err(invalid("target_path is required"));
        }
        let target = PathBuf::from(&request.target_path);
        unmount(&target)?;
        if target.is_dir() {
            let _ = std::fs::remove_dir(&target);
        }
        self.store.update(|state| {
            if let Some(volume) = state.volumes.get_mut(&request.volume_id) {
                volume.published.remove(&request.target_path);
            }
            Ok(())
        })?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        self.enter("NodeGetVolumeStats").await?;
        if !self.features.volume_stats {
            return Err(Status::unimplemented("GET_VOLUME_STATS is not enabled"));
        }
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.volume_path.is_empty() {
            return Err(invalid("volume_path is required"));
        }
        let state = self.store.read()?;
        let volume = state
            .volumes
            .get(&request.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", request.volume_id)))?;
        let at_path =
            volume.published.contains_key(&request.volume_path) || volume.staged.contains(&request.volume_path);
        if !at_path || !Path::new(&request.volume_path).exists() {
            return Err(Status::not_found(format!(
                "volume {} is not published or staged at {}",
                request.volume_id, request.volume_path
            )));
        }
        let dir = self.store.volume_dir(&request.volume_id);
        let used = super::store::used_bytes(&dir);
        let total = volume.node_capacity_bytes.max(used);
        let mut usage = vec![csi::VolumeUsage {
            available: total - used,
            total,
            used,
            unit: csi::volume_usage::Unit::Bytes as i32,
        }];
        if let Some((files, free)) = inodes(&dir) {
            usage.push(csi::VolumeUsage {
                available: free,
                total: files,
                used: files - free,
                unit: csi::volume_usage::Unit::Inodes as i32,
            });
        }
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(self.condition(&request.volume_id)),
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        self.enter("NodeExpandVolume").await?;
        if !self.features.expand {
            return Err(Status::unimplemented("EXPAND_VOLUME is not enabled"));
        }
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.volume_path.is_empty() {
            return Err(invalid("volume_path is required"));
        }
        if !Path::new(&request.volume_path).exists() {
            return Err(Status::not_found(format!(
                "volume_path {} does not exist",
                request.volume_path
            )));
        }
        let wanted = request.capacity_range.as_ref().map_or(0, |range| range.required_bytes);
        let capacity = self.store.update(|state| {
            let volume = state
                .volumes
                .get_mut(&request.volume_id)
                .ok_or_else(|| Status::not_found(format!("volume {} does not exist", request.volume_id)))?;
            if wanted > volume.capacity_bytes {
                return Err(Status::out_of_range(format!(
                    "{wanted} bytes is more than the volume's capacity ({}): expand it on the controller first",
                    volume.capacity_bytes
                )));
            }
            volume.node_capacity_bytes = if wanted > 0 { wanted } else { volume.capacity_bytes };
            Ok(volume.node_capacity_bytes)
        })?;
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: capacity,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        self.enter("NodeGetCapabilities").await?;
        use csi::node_service_capability::rpc::Type;
        let features = &self.features;
        let capabilities = [
            (features.stage_unstage, Type::StageUnstageVolume),
            (features.volume_stats, Type::GetVolumeStats),
            (features.volume_stats, Type::VolumeCondition),
            (features.expand, Type::ExpandVolume),
        ]
        .into_iter()
        .filter(|(enabled, _)| *enabled)
        .map(|(_, kind)| csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(
                csi::node_service_capability::Rpc { r#type: kind as i32 },
            )),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.enter("NodeGetInfo").await?;
        let topology = &self.features.topology;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.args.node_id.clone(),
            max_volumes_per_node: self.args.max_volumes_per_node,
            accessible_topology: (!topology.is_empty()).then(|| csi::Topology {
                segments: topology.clone().into_iter().collect(),
            }),
        }))
    }
}
