//! The Controller service, as the CSI spec (v1.9) says each RPC behaves: what it must refuse
//! and with which code, what a repeated call returns, what an unadvertised RPC answers
//! (UNIMPLEMENTED).

use std::collections::BTreeMap;

use drover_proto::csi::v1 as csi;
use drover_proto::csi::v1::controller_server::Controller;
use tonic::{Request, Response, Status};

use super::store::{self, SnapshotRecord, State, VolumeRecord};
use super::{Shared, check_id, invalid, page};

/// A volume's size when the request names none.
const DEFAULT_VOLUME_BYTES: i64 = 1 << 30;

fn unimplemented(capability: &str) -> Status {
    Status::unimplemented(format!("{capability} is not enabled"))
}

/// The fake holds file-system volumes; a capability needs an access type and mode, and a
/// block one is refused.
pub(super) fn check_capability(capability: &csi::VolumeCapability) -> Result<bool, Status> {
    let mode = capability
        .access_mode
        .as_ref()
        .ok_or_else(|| invalid("volume_capability.access_mode is required"))?;
    use csi::volume_capability::access_mode::Mode;
    let mode = Mode::try_from(mode.mode).unwrap_or(Mode::Unknown);
    if mode == Mode::Unknown {
        return Err(invalid("volume_capability.access_mode is unknown"));
    }
    match &capability.access_type {
        None => Err(invalid("volume_capability.access_type is required")),
        Some(csi::volume_capability::AccessType::Block(_)) => {
            Err(invalid("block access is not supported (file-system volumes only)"))
        }
        Some(csi::volume_capability::AccessType::Mount(_)) => {
            Ok(matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly))
        }
    }
}

/// Whether the mode lets the volume be attached to one node only.
fn single_node(capability: &csi::VolumeCapability) -> bool {
    use csi::volume_capability::access_mode::Mode;
    capability.access_mode.as_ref().is_some_and(|mode| {
        matches!(
            Mode::try_from(mode.mode),
            Ok(Mode::SingleNodeWriter
                | Mode::SingleNodeReaderOnly
                | Mode::SingleNodeSingleWriter
                | Mode::SingleNodeMultiWriter)
        )
    })
}

fn volume_message(id: &str, record: &VolumeRecord) -> csi::Volume {
    let content_source = match record.content_source.split_once(':') {
        Some(("snapshot", snapshot_id)) => Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot_id.into(),
                },
            )),
        }),
        Some(("volume", volume_id)) => Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: volume_id.into(),
                },
            )),
        }),
        _ => None,
    };
    csi::Volume {
        capacity_bytes: record.capacity_bytes,
        volume_id: id.into(),
        volume_context: [("fake/name".to_string(), record.name.clone())].into(),
        content_source,
        accessible_topology: record
            .accessible_topology
            .iter()
            .map(|segments| csi::Topology {
                segments: segments.clone().into_iter().collect(),
            })
            .collect(),
    }
}

fn snapshot_message(id: &str, record: &SnapshotRecord) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: record.size_bytes,
        snapshot_id: id.into(),
        source_volume_id: record.source_volume_id.clone(),
        creation_time: Some(drover_proto::prost_types::Timestamp {
            seconds: record.created_unix_s,
            nanos: 0,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// The size a capacity range asks for (the spec's rules), within what the plugin makes.
fn wanted_bytes(range: Option<&csi::CapacityRange>, default: i64, max: i64) -> Result<i64, Status> {
    let Some(range) = range else { return Ok(default) };
    let (required, limit) = (range.required_bytes, range.limit_bytes);
    if required < 0 || limit < 0 {
        return Err(invalid("capacity_range bytes must not be negative"));
    }
    if limit != 0 && limit < required {
        return Err(invalid("capacity_range.limit_bytes is less than required_bytes"));
    }
    let size = match (required, limit) {
        (0, 0) => default,
        (0, limit) => default.min(limit),
        (required, _) => required,
    };
    if size > max {
        return Err(Status::out_of_range(format!(
            "{size} bytes is more than the largest volume this plugin makes ({max} bytes)"
        )));
    }
    Ok(size)
}

/// Whether an existing volume satisfies a repeated CreateVolume (the spec's idempotency).
fn compatible(record: &VolumeRecord, request: &csi::CreateVolumeRequest, source: &str) -> bool {
    let fits = request.capacity_range.as_ref().is_none_or(|range| {
        record.capacity_bytes >= range.required_bytes
            && (range.limit_bytes == 0 || record.capacity_bytes <= range.limit_bytes)
    });
    let parameters: BTreeMap<String, String> = request.parameters.clone().into_iter().collect();
    fits && record.parameters == parameters && record.content_source == source
}

impl Shared {
    /// The topology a new volume is accessible from: the first preferred segment set that is
    /// also requisite (or any preferred), else the first requisite, else this node's; one
    /// naming a key the plugin does not know cannot be provided.
    fn place(&self, requirement: Option<&csi::TopologyRequirement>) -> Result<Vec<BTreeMap<String, String>>, Status> {
        let own = &self.features.topology;
        if own.is_empty() {
            return Ok(Vec::new());
        }
        let Some(requirement) = requirement else {
            return Ok(vec![own.clone()]);
        };
        let known = |topology: &csi::Topology| topology.segments.keys().all(|key| own.contains_key(key));
        let requisite: Vec<&csi::Topology> = requirement.requisite.iter().collect();
        let chosen = requirement
            .preferred
            .iter()
            .find(|preferred| known(preferred) && (requisite.is_empty() || requisite.contains(preferred)))
            .or_else(|| requisite.iter().copied().find(|topology| known(topology)));
        match chosen {
            Some(topology) => Ok(vec![topology.segments.clone().into_iter().collect()]),
            None if requisite.is_empty() && requirement.preferred.is_empty() => Ok(vec![own.clone()]),
            None => Err(Status::resource_exhausted(
                "no requisite topology can be provided: its segments name keys this plugin does not know",
            )),
        }
    }

    fn content_source(&self, request: &csi::CreateVolumeRequest, state: &State) -> Result<(String, i64), Status> {
        let Some(source) = request
            .volume_content_source
            .as_ref()
            .and_then(|source| source.r#type.as_ref())
        else {
            return Ok((String::new(), 0));
        };
        match source {
            csi::volume_content_source::Type::Snapshot(snapshot) => {
                if !self.features.snapshots {
                    return Err(invalid("volumes from snapshots are not supported"));
                }
                let record = state
                    .snapshots
                    .get(&snapshot.snapshot_id)
                    .ok_or_else(|| Status::not_found(format!("snapshot {} does not exist", snapshot.snapshot_id)))?;
                Ok((format!("snapshot:{}", snapshot.snapshot_id), record.size_bytes))
            }
            csi::volume_content_source::Type::Volume(volume) => {
                if !self.features.clone {
                    return Err(invalid("cloning volumes is not supported"));
                }
                let record = state
                    .volumes
                    .get(&volume.volume_id)
                    .ok_or_else(|| Status::not_found(format!("volume {} does not exist", volume.volume_id)))?;
                Ok((format!("volume:{}", volume.volume_id), record.capacity_bytes))
            }
        }
    }

    fn create(&self, request: &csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        check_id("name", &request.name)?;
        if request.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities are required"));
        }
        for capability in &request.volume_capabilities {
            check_capability(capability)?;
        }
        let args = &self.args;
        let created = self.store.update(|state| {
            let (source, source_bytes) = self.content_source(request, state)?;
            // A name already taken is answered first, whatever else the request asks: the
            // volume as it is when compatible, ALREADY_EXISTS when not (CSI's CreateVolume
            // errors), never OUT_OF_RANGE for a size that only conflicts with it.
            if let Some(held) = state.volumes.get(&request.name) {
                let planted = self.features.bugs.contains("create-conflict-ok");
                return if planted || compatible(held, request, &source) {
                    Ok((volume_message(&request.name, held), None))
                } else {
                    Err(Status::already_exists(format!(
                        "volume {} exists with a different capacity, parameters or source",
                        request.name
                    )))
                };
            }
            let size = wanted_bytes(
                request.capacity_range.as_ref(),
                DEFAULT_VOLUME_BYTES,
                args.max_volume_bytes,
            )?
            .max(source_bytes);
            let topology = self.place(request.accessibility_requirements.as_ref())?;
            if request
                .capacity_range
                .as_ref()
                .is_some_and(|range| range.limit_bytes != 0 && range.limit_bytes < size)
            {
                return Err(Status::out_of_range(format!(
                    "the source needs {source_bytes} bytes, more than limit_bytes"
                )));
            }
            if state.used_bytes() + size > args.capacity_bytes {
                return Err(Status::resource_exhausted(format!(
                    "{size} bytes do not fit: {} of {} bytes are free",
                    args.capacity_bytes - state.used_bytes(),
                    args.capacity_bytes
                )));
            }
            let record = VolumeRecord {
                name: request.name.clone(),
                capacity_bytes: size,
                parameters: request.parameters.clone().into_iter().collect(),
                content_source: source.clone(),
                accessible_topology: topology.clone(),
                node_capacity_bytes: size,
                ..VolumeRecord::default()
            };
            let message = volume_message(&request.name, &record);
            state.volumes.insert(request.name.clone(), record);
            Ok((message, Some(source)))
        })?;
        let (volume, made_from) = created;
        let dir = self.store.volume_dir(&volume.volume_id);
        std::fs::create_dir_all(&dir).map_err(|error| Status::internal(error.to_string()))?;
        match made_from.as_deref().and_then(|source| source.split_once(':')) {
            Some(("snapshot", id)) => store::copy_tree(&self.store.snapshot_dir(id), &dir),
            Some(("volume", id)) => store::copy_tree(&self.store.volume_dir(id), &dir),
            _ => Ok(()),
        }
        .map_err(|error| Status::internal(format!("copying the source's data: {error}")))?;
        Ok(volume)
    }

    /// The record of volume `id`, made on the spot under `--auto-create`.
    pub(super) fn existing(&self, id: &str) -> Result<VolumeRecord, Status> {
        check_id("volume_id", id)?;
        let auto_create = self.args.auto_create;
        let record = self.store.update(|state| {
            if let Some(record) = state.volumes.get(id) {
                return Ok(Some(record.clone()));
            }
            if !auto_create {
                return Ok(None);
            }
            let record = VolumeRecord {
                name: id.into(),
                capacity_bytes: DEFAULT_VOLUME_BYTES,
                node_capacity_bytes: DEFAULT_VOLUME_BYTES,
                accessible_topology: self.place(None)?,
                ..VolumeRecord::default()
            };
            state.volumes.insert(id.into(), record.clone());
            Ok(Some(record))
        })?;
        let record = record.ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
        std::fs::create_dir_all(self.store.volume_dir(id)).map_err(|error| Status::internal(error.to_string()))?;
        Ok(record)
    }

    fn known_node(&self, node_id: &str) -> bool {
        node_id == self.args.node_id || self.args.known_node.iter().any(|known| known == node_id)
    }

    fn publish(&self, request: &csi::ControllerPublishVolumeRequest) -> Result<(), Status> {
        check_id("volume_id", &request.volume_id)?;
        if request.node_id.is_empty() {
            return Err(invalid("node_id is required"));
        }
        let capability = request
            .volume_capability
            .as_ref()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        let read_only = check_capability(capability)? || request.readonly;
        self.existing(&request.volume_id)?;
        if !self.known_node(&request.node_id) {
            return Err(Status::not_found(format!("node {} does not exist", request.node_id)));
        }
        let limit = self.args.max_volumes_per_node;
        self.store.update(|state| {
            let attached_here = state
                .volumes
                .iter()
                .filter(|(id, volume)| **id != request.volume_id && volume.attachments.contains_key(&request.node_id))
                .count() as i64;
            let volume = state.volumes.get_mut(&request.volume_id).expect("checked above");
            match volume.attachments.get(&request.node_id) {
                Some(held) if *held == read_only => return Ok(()),
                Some(_) => {
                    return Err(Status::already_exists(format!(
                        "volume {} is attached to {} with a different read-only setting",
                        request.volume_id, request.node_id
                    )));
                }
                None => {}
            }
            if single_node(capability) && !volume.attachments.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "volume {} is attached to another node and its access mode allows one",
                    request.volume_id
                )));
            }
            if limit > 0 && attached_here >= limit {
                return Err(Status::resource_exhausted(format!(
                    "node {} already has {limit} volumes attached",
                    request.node_id
                )));
            }
            volume.attachments.insert(request.node_id.clone(), read_only);
            Ok(())
        })
    }
}

#[tonic::async_trait]
impl Controller for Shared {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.enter("CreateVolume").await?;
        let volume = self.create(&request.into_inner())?;
        Ok(Response::new(csi::CreateVolumeResponse { volume: Some(volume) }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.enter("DeleteVolume").await?;
        let id = request.into_inner().volume_id;
        check_id("volume_id", &id)?;
        let planted = self.features.bugs.contains("delete-missing-not-found");
        self.store.update(|state| match state.volumes.get(&id) {
            None if planted => Err(Status::not_found(format!("volume {id} does not exist"))),
            Some(volume) if !volume.attachments.is_empty() || !volume.published.is_empty() => Err(
                Status::failed_precondition(format!("volume {id} is in use (attached or published)")),
            ),
            _ => {
                state.volumes.remove(&id);
                Ok(())
            }
        })?;
        let dir = self.store.volume_dir(&id);
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
        if !self.features.attach_detach {
            return Err(unimplemented("PUBLISH_UNPUBLISH_VOLUME"));
        }
        let request = request.into_inner();
        self.publish(&request)?;
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: [("attached".to_string(), request.volume_id)].into(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.enter("ControllerUnpublishVolume").await?;
        if !self.features.attach_detach {
            return Err(unimplemented("PUBLISH_UNPUBLISH_VOLUME"));
        }
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        self.store.update(|state| {
            // A volume that is gone is unpublished from every node: the spec's "SHOULD return
            // 0 OK" (a retried unpublish after a delete must not fail for good).
            let Some(volume) = state.volumes.get_mut(&request.volume_id) else {
                return Ok(());
            };
            if request.node_id.is_empty() {
                volume.attachments.clear();
            } else {
                volume.attachments.remove(&request.node_id);
            }
            Ok(())
        })?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.enter("ValidateVolumeCapabilities").await?;
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        if request.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities are required"));
        }
        self.existing(&request.volume_id)?;
        let refused = request
            .volume_capabilities
            .iter()
            .find_map(|capability| check_capability(capability).err());
        if let Some(refused) = refused {
            return Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refused.message().to_string(),
            }));
        }
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

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        self.enter("ListVolumes").await?;
        if !self.features.list_volumes {
            return Err(unimplemented("LIST_VOLUMES"));
        }
        let request = request.into_inner();
        let state = self.store.read()?;
        let volumes: Vec<(String, VolumeRecord)> = state.volumes.into_iter().collect();
        let lenient = self.features.bugs.contains("token-ignored");
        let (volumes, next_token) = page(&volumes, request.max_entries, &request.starting_token, lenient)?;
        let published_nodes = self.features.attach_detach;
        let entries = volumes
            .iter()
            .map(|(id, record)| csi::list_volumes_response::Entry {
                volume: Some(volume_message(id, record)),
                status: published_nodes.then(|| csi::list_volumes_response::VolumeStatus {
                    published_node_ids: record.attachments.keys().cloned().collect(),
                    volume_condition: None,
                }),
            })
            .collect();
        Ok(Response::new(csi::ListVolumesResponse { entries, next_token }))
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.enter("GetCapacity").await?;
        if !self.features.get_capacity {
            return Err(unimplemented("GET_CAPACITY"));
        }
        let request = request.into_inner();
        for capability in &request.volume_capabilities {
            check_capability(capability)?;
        }
        let elsewhere = request.accessible_topology.as_ref().is_some_and(|topology| {
            topology
                .segments
                .iter()
                .any(|(key, value)| self.features.topology.get(key) != Some(value))
        });
        let state = self.store.read()?;
        let available = if elsewhere {
            0
        } else {
            (self.args.capacity_bytes - state.used_bytes()).max(0)
        };
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(self.args.max_volume_bytes),
            minimum_volume_size: None,
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
        let features = &self.features;
        let mut capabilities = vec![rpc(Type::CreateDeleteVolume)];
        for (enabled, kind) in [
            (features.attach_detach, Type::PublishUnpublishVolume),
            (features.attach_detach, Type::PublishReadonly),
            (features.list_volumes, Type::ListVolumes),
            (
                features.list_volumes && features.attach_detach,
                Type::ListVolumesPublishedNodes,
            ),
            (features.get_capacity, Type::GetCapacity),
            (features.snapshots, Type::CreateDeleteSnapshot),
            (features.snapshots, Type::ListSnapshots),
            (features.clone, Type::CloneVolume),
            (features.expand, Type::ExpandVolume),
            (features.get_volume, Type::GetVolume),
            (features.get_volume, Type::VolumeCondition),
        ] {
            if enabled {
                capabilities.push(rpc(kind));
            }
        }
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.enter("CreateSnapshot").await?;
        if !self.features.snapshots {
            return Err(unimplemented("CREATE_DELETE_SNAPSHOT"));
        }
        let request = request.into_inner();
        check_id("source_volume_id", &request.source_volume_id)?;
        check_id("name", &request.name)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs() as i64);
        let (snapshot, fresh) = self.store.update(|state| {
            let source = state
                .volumes
                .get(&request.source_volume_id)
                .ok_or_else(|| Status::not_found(format!("volume {} does not exist", request.source_volume_id)))?;
            if let Some(held) = state.snapshots.get(&request.name) {
                return if held.source_volume_id == request.source_volume_id {
                    Ok((snapshot_message(&request.name, held), false))
                } else {
                    Err(Status::already_exists(format!(
                        "snapshot {} exists of another volume ({})",
                        request.name, held.source_volume_id
                    )))
                };
            }
            let record = SnapshotRecord {
                source_volume_id: request.source_volume_id.clone(),
                size_bytes: source.capacity_bytes,
                created_unix_s: now,
            };
            let message = snapshot_message(&request.name, &record);
            state.snapshots.insert(request.name.clone(), record);
            Ok((message, true))
        })?;
        if fresh {
            store::copy_tree(
                &self.store.volume_dir(&request.source_volume_id),
                &self.store.snapshot_dir(&snapshot.snapshot_id),
            )
            .map_err(|error| Status::internal(format!("copying the volume's data: {error}")))?;
        }
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.enter("DeleteSnapshot").await?;
        if !self.features.snapshots {
            return Err(unimplemented("CREATE_DELETE_SNAPSHOT"));
        }
        let id = request.into_inner().snapshot_id;
        check_id("snapshot_id", &id)?;
        self.store.update(|state| {
            state.snapshots.remove(&id);
            Ok(())
        })?;
        let dir = self.store.snapshot_dir(&id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|error| Status::internal(error.to_string()))?;
        }
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.enter("ListSnapshots").await?;
        if !self.features.snapshots {
            return Err(unimplemented("LIST_SNAPSHOTS"));
        }
        let request = request.into_inner();
        let state = self.store.read()?;
        let snapshots: Vec<(String, SnapshotRecord)> = state
            .snapshots
            .into_iter()
            .filter(|(id, record)| {
                (request.snapshot_id.is_empty() || *id == request.snapshot_id)
                    && (request.source_volume_id.is_empty() || record.source_volume_id == request.source_volume_id)
            })
            .collect();
        let lenient = self.features.bugs.contains("token-ignored");
        let (snapshots, next_token) = page(&snapshots, request.max_entries, &request.starting_token, lenient)?;
        let entries = snapshots
            .iter()
            .map(|(id, record)| csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot_message(id, record)),
            })
            .collect();
        Ok(Response::new(csi::ListSnapshotsResponse { entries, next_token }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.enter("ControllerExpandVolume").await?;
        if !self.features.expand {
            return Err(unimplemented("EXPAND_VOLUME"));
        }
        let request = request.into_inner();
        check_id("volume_id", &request.volume_id)?;
        let range = request
            .capacity_range
            .as_ref()
            .ok_or_else(|| invalid("capacity_range is required"))?;
        let wanted = wanted_bytes(Some(range), 0, self.args.max_volume_bytes)?;
        let args = &self.args;
        let capacity = self.store.update(|state| {
            let used = state.used_bytes();
            let volume = state
                .volumes
                .get_mut(&request.volume_id)
                .ok_or_else(|| Status::not_found(format!("volume {} does not exist", request.volume_id)))?;
            if range.limit_bytes != 0 && range.limit_bytes < volume.capacity_bytes {
                return Err(Status::out_of_range(
                    "limit_bytes is below the volume's capacity: volumes do not shrink",
                ));
            }
            if wanted > volume.capacity_bytes {
                if used - volume.capacity_bytes + wanted > args.capacity_bytes {
                    return Err(Status::resource_exhausted("not enough free storage to grow the volume"));
                }
                volume.capacity_bytes = wanted;
            }
            Ok(volume.capacity_bytes)
        })?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: capacity,
            node_expansion_required: true,
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        self.enter("ControllerGetVolume").await?;
        if !self.features.get_volume {
            return Err(unimplemented("GET_VOLUME"));
        }
        let id = request.into_inner().volume_id;
        check_id("volume_id", &id)?;
        let state = self.store.read()?;
        let record = state
            .volumes
            .get(&id)
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
        Ok(Response::new(csi::ControllerGetVolumeResponse {
            volume: Some(volume_message(&id, record)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: record.attachments.keys().cloned().collect(),
                volume_condition: Some(self.condition(&id)),
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.enter("ControllerModifyVolume").await?;
        Err(unimplemented("MODIFY_VOLUME"))
    }
}
