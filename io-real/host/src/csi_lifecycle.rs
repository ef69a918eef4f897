//! The controller calls of a volume's life after its creation, as the CSI spec has them:
//! snapshots (`CreateSnapshot`, `DeleteSnapshot`, `ListSnapshots`), `ListVolumes` and
//! `ControllerExpandVolume`. Each answers the server's `ClientCSI` call it serves.

use drover_core::error::CsiCallError;
use drover_core::rpc::{
    ClientCsiReply, ControllerDeleteSnapshotRequest, ControllerExpandRequest, ControllerListRequest,
    ControllerSnapshotRequest, ListPage,
};
use drover_core::structs::{CsiExternalVolume, CsiSnapshot};
use drover_proto::csi::v1 as csi;

use crate::csi::{CsiClient, plain, status_error};

fn bytes(value: u64) -> Result<i64, String> {
    i64::try_from(value).map_err(|_| format!("capacity {value} is out of range"))
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn snapshot(from: csi::Snapshot) -> CsiSnapshot {
    CsiSnapshot {
        id: from.snapshot_id,
        external_source_volume_id: from.source_volume_id,
        size_bytes: unsigned(from.size_bytes),
        create_time: from.creation_time.map_or(0, |time| time.seconds),
        is_ready: from.ready_to_use,
        ..CsiSnapshot::default()
    }
}

fn max_entries(page: &ListPage) -> Result<i32, String> {
    i32::try_from(page.per_page).map_err(|_| format!("per_page {} is out of range", page.per_page))
}

impl CsiClient {
    pub(crate) async fn create_snapshot(
        &self,
        request: &ControllerSnapshotRequest,
    ) -> Result<ClientCsiReply, CsiCallError> {
        let answer = self
            .controller()
            .create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: request.source_external_id.clone(),
                name: request.name.clone(),
                secrets: request.secrets.clone().into_iter().collect(),
                parameters: request.parameters.clone().into_iter().collect(),
            })
            .await
            .map_err(|status| status_error("CreateSnapshot", status))?
            .into_inner();
        let made = answer
            .snapshot
            .ok_or("CreateSnapshot: the plugin answered no snapshot")?;
        let mut made = snapshot(made);
        made.name.clone_from(&request.name);
        Ok(ClientCsiReply::Snapshot(made))
    }

    pub(crate) async fn delete_snapshot(
        &self,
        request: &ControllerDeleteSnapshotRequest,
    ) -> Result<ClientCsiReply, CsiCallError> {
        self.controller()
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: request.snapshot_id.clone(),
                secrets: request.secrets.clone().into_iter().collect(),
            })
            .await
            .map_err(|status| status_error("DeleteSnapshot", status))?;
        Ok(ClientCsiReply::Done)
    }

    pub(crate) async fn list_snapshots(&self, request: &ControllerListRequest) -> Result<ClientCsiReply, CsiCallError> {
        let answer = self
            .controller()
            .list_snapshots(csi::ListSnapshotsRequest {
                max_entries: max_entries(&request.page)?,
                starting_token: request.page.next_token.clone(),
                source_volume_id: String::new(),
                snapshot_id: String::new(),
                secrets: request.secrets.clone().into_iter().collect(),
            })
            .await
            .map_err(|status| status_error("ListSnapshots", status))?
            .into_inner();
        let snapshots = answer
            .entries
            .into_iter()
            .filter_map(|entry| entry.snapshot)
            .map(snapshot)
            .collect();
        Ok(ClientCsiReply::Snapshots {
            snapshots,
            next_token: answer.next_token,
        })
    }

    pub(crate) async fn list_volumes(&self, request: &ControllerListRequest) -> Result<ClientCsiReply, CsiCallError> {
        let answer = self
            .controller()
            .list_volumes(csi::ListVolumesRequest {
                max_entries: max_entries(&request.page)?,
                starting_token: request.page.next_token.clone(),
            })
            .await
            .map_err(|status| status_error("ListVolumes", status))?
            .into_inner();
        let volumes = answer
            .entries
            .into_iter()
            .filter_map(|entry| {
                let volume = entry.volume?;
                let status = entry.status.unwrap_or_default();
                let condition = status.volume_condition.unwrap_or_default();
                let (clone_id, snapshot_id) = match volume.content_source.and_then(|source| source.r#type) {
                    Some(csi::volume_content_source::Type::Volume(source)) => (source.volume_id, String::new()),
                    Some(csi::volume_content_source::Type::Snapshot(source)) => (String::new(), source.snapshot_id),
                    None => (String::new(), String::new()),
                };
                Some(CsiExternalVolume {
                    external_id: volume.volume_id,
                    capacity_bytes: unsigned(volume.capacity_bytes),
                    volume_context: volume.volume_context.into_iter().collect(),
                    clone_id,
                    snapshot_id,
                    published_external_node_ids: status.published_node_ids,
                    is_abnormal: condition.abnormal,
                    status: condition.message,
                })
            })
            .collect();
        Ok(ClientCsiReply::Volumes {
            volumes,
            next_token: answer.next_token,
        })
    }

    pub(crate) async fn expand_volume(
        &self,
        request: &ControllerExpandRequest,
    ) -> Result<ClientCsiReply, CsiCallError> {
        let answer = self
            .controller()
            .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: request.external_id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: bytes(request.capacity_min)?,
                    limit_bytes: bytes(request.capacity_max)?,
                }),
                secrets: request.secrets.clone().into_iter().collect(),
                volume_capability: request.capability.as_ref().map(plain),
            })
            .await
            .map_err(|status| status_error("ControllerExpandVolume", status))?
            .into_inner();
        Ok(ClientCsiReply::Expanded {
            capacity: unsigned(answer.capacity_bytes),
            node_expansion_required: answer.node_expansion_required,
        })
    }
}
