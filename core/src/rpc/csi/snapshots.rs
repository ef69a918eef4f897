//! `CSIVolume.CreateSnapshot`, `DeleteSnapshot`, `ListSnapshots` and `ListExternal`: calls to
//! a plugin's controller through a client, answered to the caller. The servers keep no record
//! of snapshots or unregistered volumes: the storage provider is the only truth, so these
//! change nothing in Raft.
//!
//! Each call first checks that the plugin's controllers advertise the capability it needs
//! (`CREATE_DELETE_SNAPSHOT`, `LIST_SNAPSHOTS`, `LIST_VOLUMES`), with Nomad's texts.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{CsiEndpoints, Flow};
use crate::fsm::{ServerState, Table};
use crate::rpc::outbox::{JobId, Outbox};
use crate::rpc::{
    ClientCsiReply, ClientCsiRequest, ControllerDeleteSnapshotRequest, ControllerListRequest,
    ControllerSnapshotRequest, ListPage, ReqId, RpcError, ServerReply,
};
use crate::structs::{CsiControllerInfo, CsiSnapshot, Secrets};
use crate::time::Instant;

/// A controller capability a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Needs {
    Snapshots,
    ListSnapshots,
    ListVolumes,
}

impl Needs {
    fn has(self, info: &CsiControllerInfo) -> bool {
        match self {
            Needs::Snapshots => info.supports_create_delete_snapshot,
            Needs::ListSnapshots => info.supports_list_snapshots,
            Needs::ListVolumes => info.supports_list_volumes,
        }
    }
}

/// Whether `plugin_id` has a controller advertising `needs`, or why not (Nomad's texts).
pub(super) fn controller_supports(state: &ServerState, plugin_id: &str, needs: Needs) -> Result<(), RpcError> {
    let Some(plugin) = state.plugin(plugin_id) else {
        let text = match needs {
            Needs::Snapshots => format!("no such plugin {plugin_id:?}"),
            Needs::ListSnapshots | Needs::ListVolumes => "no such plugin".to_string(),
        };
        return Err(RpcError::not_found(text));
    };
    let supports = plugin
        .controllers
        .values()
        .any(|info| info.controller_info.as_ref().is_some_and(|c| needs.has(c)));
    if supports {
        return Ok(());
    }
    Err(RpcError::invalid(match needs {
        Needs::Snapshots => format!("plugin {plugin_id:?} does not support snapshot"),
        Needs::ListSnapshots => "plugin does not support listing snapshots".to_string(),
        Needs::ListVolumes => "unimplemented for this plugin".to_string(),
    }))
}

impl CsiEndpoints {
    /// `ControllerCreateSnapshot` of each snapshot's registered source volume. Secrets given
    /// with the snapshot are laid over the volume's own.
    pub(super) fn snapshot_create(
        &mut self,
        now: Instant,
        req: ReqId,
        (namespace, snapshots): (String, Vec<CsiSnapshot>),
        state: &ServerState,
        out: &mut Outbox,
    ) {
        if snapshots.is_empty() {
            out.reply(
                req,
                ServerReply::Error(RpcError::invalid("missing snapshot definition")),
            );
            return;
        }
        let mut requests = Vec::new();
        let mut errors = Vec::new();
        for snapshot in snapshots {
            let Some(volume) = state.volume(&namespace, &snapshot.source_volume_id) else {
                errors.push(format!("no such volume {:?}", snapshot.source_volume_id));
                continue;
            };
            let plugin_id = if snapshot.plugin_id.is_empty() {
                volume.plugin_id.clone()
            } else {
                snapshot.plugin_id.clone()
            };
            if let Err(error) = controller_supports(state, &plugin_id, Needs::Snapshots) {
                errors.push(error.message);
                continue;
            }
            let mut secrets = volume.secrets.clone();
            secrets.extend(snapshot.secrets);
            requests.push(ClientCsiRequest::ControllerCreateSnapshot(ControllerSnapshotRequest {
                plugin_id,
                source_external_id: volume.remote_id().to_string(),
                name: snapshot.name,
                secrets,
                parameters: snapshot.parameters,
            }));
        }
        self.start_snapshots(now, req, requests, errors, state, out);
    }

    /// `ControllerDeleteSnapshot` of each snapshot (its `id` on its `plugin_id`).
    pub(super) fn snapshot_delete(
        &mut self,
        now: Instant,
        req: ReqId,
        snapshots: Vec<CsiSnapshot>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        if snapshots.is_empty() {
            out.reply(
                req,
                ServerReply::Error(RpcError::invalid("missing snapshot definition")),
            );
            return;
        }
        let mut requests = Vec::new();
        let mut errors = Vec::new();
        for snapshot in snapshots {
            if snapshot.id.is_empty() {
                errors.push("missing snapshot ID".to_string());
                continue;
            }
            if let Err(error) = controller_supports(state, &snapshot.plugin_id, Needs::Snapshots) {
                errors.push(error.message);
                continue;
            }
            requests.push(ClientCsiRequest::ControllerDeleteSnapshot(
                ControllerDeleteSnapshotRequest {
                    plugin_id: snapshot.plugin_id,
                    snapshot_id: snapshot.id,
                    secrets: snapshot.secrets,
                },
            ));
        }
        self.start_snapshots(now, req, requests, errors, state, out);
    }

    fn start_snapshots(
        &mut self,
        now: Instant,
        req: ReqId,
        requests: Vec<ClientCsiRequest>,
        errors: Vec<String>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        if requests.is_empty() {
            out.reply(req, ServerReply::Error(RpcError::invalid(errors.join("; "))));
            return;
        }
        let job = self.new_job(
            out,
            Flow::Snapshots {
                req,
                left: requests.len(),
                made: Vec::new(),
                errors,
            },
        );
        for request in requests {
            self.enqueue_controller(now, job, request, state, out);
        }
    }

    /// One snapshot call answered; once all are, the caller gets the snapshots made, or every
    /// error joined (Nomad's multierror) when any failed.
    pub(super) fn snapshot_done(
        &mut self,
        job_id: JobId,
        request: &ClientCsiRequest,
        result: Result<ClientCsiReply, RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(Flow::Snapshots {
            req,
            left,
            made,
            errors,
        }) = self.jobs.get_mut(&job_id)
        else {
            return;
        };
        *left -= 1;
        match (request, result) {
            (ClientCsiRequest::ControllerCreateSnapshot(asked), Ok(ClientCsiReply::Snapshot(mut snapshot))) => {
                snapshot.plugin_id.clone_from(&asked.plugin_id);
                made.push(snapshot);
            }
            (ClientCsiRequest::ControllerCreateSnapshot(_), Ok(other)) => {
                errors.push(format!("could not create snapshot: unexpected answer {other:?}"));
            }
            (ClientCsiRequest::ControllerCreateSnapshot(_), Err(error)) => {
                errors.push(format!("could not create snapshot: {}", error.message));
            }
            (ClientCsiRequest::ControllerDeleteSnapshot(asked), Err(error)) => {
                errors.push(format!("could not delete {:?}: {}", asked.snapshot_id, error.message));
            }
            _ => {}
        }
        if *left > 0 {
            return;
        }
        let req = *req;
        let Some(Flow::Snapshots { made, errors, .. }) = self.jobs.remove(&job_id) else {
            return;
        };
        let reply = if errors.is_empty() {
            ServerReply::Snapshots {
                index: state.table_index(Table::CsiPlugins),
                snapshots: made,
                next_token: String::new(),
            }
        } else {
            ServerReply::Error(RpcError::invalid(errors.join("; ")))
        };
        out.reply(req, reply);
    }

    /// One page of the plugin's `ListSnapshots` or `ListVolumes`.
    pub(super) fn listing(
        &mut self,
        now: Instant,
        req: ReqId,
        (plugin_id, page, secrets): (String, ListPage, Secrets),
        needs: Needs,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        if let Err(error) = controller_supports(state, &plugin_id, needs) {
            out.reply(req, ServerReply::Error(error));
            return;
        }
        let list = ControllerListRequest {
            plugin_id,
            page,
            secrets,
        };
        let request = match needs {
            Needs::ListVolumes => ClientCsiRequest::ControllerListVolumes(list),
            Needs::ListSnapshots | Needs::Snapshots => ClientCsiRequest::ControllerListSnapshots(list),
        };
        let job = self.new_job(out, Flow::Listing { req });
        self.enqueue_controller(now, job, request, state, out);
    }

    /// The page came back: to the caller, cut to `per_page` if the plugin gave more.
    pub(super) fn listing_done(
        &mut self,
        job_id: JobId,
        request: &ClientCsiRequest,
        result: Result<ClientCsiReply, RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(Flow::Listing { req }) = self.jobs.remove(&job_id) else {
            return;
        };
        let per_page = match request {
            ClientCsiRequest::ControllerListSnapshots(list) | ClientCsiRequest::ControllerListVolumes(list) => {
                list.page.per_page as usize
            }
            _ => 0,
        };
        let cut = |len: usize| if per_page > 0 { per_page.min(len) } else { len };
        let index = state.table_index(Table::CsiPlugins);
        let reply = match result {
            Ok(ClientCsiReply::Snapshots {
                mut snapshots,
                next_token,
            }) => {
                snapshots.truncate(cut(snapshots.len()));
                ServerReply::Snapshots {
                    index,
                    snapshots,
                    next_token,
                }
            }
            Ok(ClientCsiReply::Volumes {
                mut volumes,
                next_token,
            }) => {
                volumes.truncate(cut(volumes.len()));
                ServerReply::ExternalVolumes {
                    index,
                    volumes,
                    next_token,
                }
            }
            Ok(other) => ServerReply::Error(RpcError::unavailable(format!(
                "controller list: unexpected answer {other:?}"
            ))),
            Err(error) => ServerReply::Error(error),
        };
        out.reply(req, reply);
    }
}
