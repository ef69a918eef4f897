//! The cases, from the CSI spec (v1.9): for each RPC, the refusals it must make (with their
//! codes), what a repeated call answers, and what it returns.

use std::collections::BTreeSet;
use std::path::PathBuf;

use drover_proto::csi::v1 as csi;
use tonic::{Code, Status};

use super::{Case, Check, Need};
use csi::controller_service_capability::rpc::Type as Rpc;
use csi::node_service_capability::rpc::Type as NodeRpc;

const GIB: i64 = 1 << 30;

pub(super) fn cases() -> Vec<Case> {
    macro_rules! case {
        ($name:expr, [$($need:expr),*], $run:ident) => {
            Case { name: $name, needs: &[$($need),*], run: |check| Box::pin($run(check)) }
        };
    }
    vec![
        case!("GetPluginInfo: a valid name and a version", [], plugin_info),
        case!("Probe: answers", [], probe),
        case!(
            "CreateVolume: name and capabilities required (INVALID_ARGUMENT)",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            create_needs_arguments
        ),
        case!(
            "CreateVolume: repeated, the same volume",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            create_is_idempotent
        ),
        case!(
            "CreateVolume: same name, larger capacity (ALREADY_EXISTS)",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            create_conflict
        ),
        case!(
            "CreateVolume: capacity within the range asked for",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            create_capacity_range
        ),
        case!(
            "CreateVolume: limit below required (INVALID_ARGUMENT)",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            create_inverted_range
        ),
        case!(
            "DeleteVolume: repeated and unknown ids succeed",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            delete_is_idempotent
        ),
        case!(
            "ValidateVolumeCapabilities: unknown volume (NOT_FOUND)",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            validate_missing
        ),
        case!(
            "ValidateVolumeCapabilities: confirms what the volume was made with",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            validate_confirms
        ),
        case!(
            "ControllerPublishVolume: unknown volume or node (NOT_FOUND)",
            [
                Need::Rpc(Rpc::CreateDeleteVolume),
                Need::Rpc(Rpc::PublishUnpublishVolume)
            ],
            publish_missing
        ),
        case!(
            "ControllerPublishVolume: repeated publish and unpublish succeed",
            [
                Need::Rpc(Rpc::CreateDeleteVolume),
                Need::Rpc(Rpc::PublishUnpublishVolume),
                Need::NodeId
            ],
            publish_is_idempotent
        ),
        case!(
            "ListVolumes: pages with starting_token, each volume once",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::ListVolumes)],
            list_volumes_pages
        ),
        case!(
            "ListVolumes: an unknown starting_token (ABORTED)",
            [Need::Rpc(Rpc::ListVolumes)],
            list_volumes_bad_token
        ),
        case!(
            "GetCapacity: shrinks as volumes are made",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::GetCapacity)],
            get_capacity
        ),
        case!(
            "CreateSnapshot: repeated the same, another source ALREADY_EXISTS",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::CreateDeleteSnapshot)],
            snapshot_idempotency
        ),
        case!(
            "CreateVolume: from a snapshot, the source echoed",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::CreateDeleteSnapshot)],
            volume_from_snapshot
        ),
        case!(
            "ListSnapshots: filters, pages, ABORTED on a bad token",
            [
                Need::Rpc(Rpc::CreateDeleteVolume),
                Need::Rpc(Rpc::CreateDeleteSnapshot),
                Need::Rpc(Rpc::ListSnapshots)
            ],
            list_snapshots
        ),
        case!(
            "CreateVolume: cloned from a volume",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::CloneVolume)],
            clone_volume
        ),
        case!(
            "ControllerExpandVolume: grows; unknown volume NOT_FOUND",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::ExpandVolume)],
            controller_expand
        ),
        case!(
            "ControllerGetVolume: the volume and its status; unknown NOT_FOUND",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Rpc(Rpc::GetVolume)],
            get_volume
        ),
        case!(
            "CreateVolume: placed within the requisite topology",
            [Need::Rpc(Rpc::CreateDeleteVolume), Need::Topology],
            create_in_topology
        ),
        case!("NodeGetInfo: a node id and a volume limit", [], node_info),
        case!(
            "NodePublishVolume: target and capability required; unknown volume NOT_FOUND",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            node_publish_refusals
        ),
        case!(
            "NodePublishVolume: staged and published, repeated, then undone twice",
            [Need::Rpc(Rpc::CreateDeleteVolume)],
            node_publish_cycle
        ),
        case!(
            "NodeGetVolumeStats: usage of a published volume; unknown NOT_FOUND",
            [
                Need::Rpc(Rpc::CreateDeleteVolume),
                Need::NodeRpc(NodeRpc::GetVolumeStats)
            ],
            node_stats
        ),
        case!(
            "NodeExpandVolume: the node side follows the controller",
            [
                Need::Rpc(Rpc::CreateDeleteVolume),
                Need::Rpc(Rpc::ExpandVolume),
                Need::NodeRpc(NodeRpc::ExpandVolume)
            ],
            node_expand
        ),
    ]
}

/// `result` failed with `code`, or says what came back instead.
fn expect_code<T: std::fmt::Debug>(what: &str, result: Result<T, Status>, code: Code) -> Result<(), String> {
    match result {
        Err(status) if status.code() == code => Ok(()),
        Err(status) => Err(format!(
            "{what}: wanted {code:?}, got {:?} ({})",
            status.code(),
            status.message()
        )),
        Ok(answer) => Err(format!("{what}: wanted {code:?}, got OK: {answer:?}")),
    }
}

fn ok<T>(what: &str, result: Result<tonic::Response<T>, Status>) -> Result<T, String> {
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("{what}: {:?} ({})", status.code(), status.message()))
}

fn ensure(condition: bool, text: impl FnOnce() -> String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(text()) }
}

pub(super) fn mount_capability(mode: csi::volume_capability::access_mode::Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn writer() -> csi::VolumeCapability {
    mount_capability(csi::volume_capability::access_mode::Mode::SingleNodeWriter)
}

fn range(required: i64, limit: i64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    })
}

fn create_request(name: &str, required: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: range(required, 0),
        volume_capabilities: vec![writer()],
        ..Default::default()
    }
}

/// What a case made, removed when it ends (pass or fail).
#[derive(Default)]
struct Made {
    volumes: Vec<String>,
    snapshots: Vec<String>,
    published: Vec<(String, PathBuf)>,
    staged: Vec<(String, PathBuf)>,
    attached: Vec<String>,
}

impl Made {
    async fn clean(self, check: &Check) {
        let mut node = check.client.node();
        for (volume_id, target) in self.published {
            let _ = node
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id,
                    target_path: target.display().to_string(),
                })
                .await;
        }
        for (volume_id, staging) in self.staged {
            let _ = node
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id,
                    staging_target_path: staging.display().to_string(),
                })
                .await;
        }
        let mut controller = check.client.controller();
        for volume_id in self.attached {
            let _ = controller
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                    volume_id,
                    node_id: check.advertised.node_id.clone(),
                    secrets: Default::default(),
                })
                .await;
        }
        for snapshot_id in self.snapshots {
            let _ = controller
                .delete_snapshot(csi::DeleteSnapshotRequest {
                    snapshot_id,
                    secrets: Default::default(),
                })
                .await;
        }
        for volume_id in self.volumes {
            let _ = controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id,
                    secrets: Default::default(),
                })
                .await;
        }
    }
}

impl Check {
    async fn create(&self, made: &mut Made, request: csi::CreateVolumeRequest) -> Result<csi::Volume, String> {
        let answer = ok("CreateVolume", self.client.controller().create_volume(request).await)?;
        let volume = answer.volume.ok_or("CreateVolume: no volume in the answer")?;
        ensure(!volume.volume_id.is_empty(), || {
            "CreateVolume: an empty volume_id".into()
        })?;
        if !made.volumes.contains(&volume.volume_id) {
            made.volumes.push(volume.volume_id.clone());
        }
        Ok(volume)
    }

    async fn snapshot(&self, made: &mut Made, source: &str, name: &str) -> Result<csi::Snapshot, Status> {
        let answer = self
            .client
            .controller()
            .create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: source.into(),
                name: name.into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let snapshot = answer
            .snapshot
            .ok_or_else(|| Status::internal("CreateSnapshot: no snapshot in the answer"))?;
        if !made.snapshots.contains(&snapshot.snapshot_id) {
            made.snapshots.push(snapshot.snapshot_id.clone());
        }
        Ok(snapshot)
    }

    fn has(&self, need: Need) -> bool {
        self.advertised.has(need)
    }

    /// Makes `volume_id` usable on this node as the spec orders it: attached (when the
    /// controller publishes), staged (when the node stages), published at a fresh target.
    async fn publish_here(&self, made: &mut Made, volume_id: &str, read_only: bool) -> Result<PathBuf, String> {
        let mut publish_context = Default::default();
        if self.has(Need::Rpc(Rpc::PublishUnpublishVolume)) {
            let answer = ok(
                "ControllerPublishVolume",
                self.client
                    .controller()
                    .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                        volume_id: volume_id.into(),
                        node_id: self.advertised.node_id.clone(),
                        volume_capability: Some(writer()),
                        readonly: read_only,
                        ..Default::default()
                    })
                    .await,
            )?;
            made.attached.push(volume_id.into());
            publish_context = answer.publish_context;
        }
        let base = self
            .work_dir
            .join(self.name(&format!("{volume_id}-{}", made.published.len())));
        let staging = base.join("staging");
        if self.has(Need::NodeRpc(NodeRpc::StageUnstageVolume)) {
            std::fs::create_dir_all(&staging).map_err(|error| error.to_string())?;
            ok(
                "NodeStageVolume",
                self.client
                    .node()
                    .node_stage_volume(csi::NodeStageVolumeRequest {
                        volume_id: volume_id.into(),
                        publish_context: publish_context.clone(),
                        staging_target_path: staging.display().to_string(),
                        volume_capability: Some(writer()),
                        ..Default::default()
                    })
                    .await,
            )?;
            made.staged.push((volume_id.into(), staging.clone()));
        }
        let target = base.join("target");
        ok(
            "NodePublishVolume",
            self.client
                .node()
                .node_publish_volume(self.publish_request(volume_id, &staging, &target, publish_context, read_only))
                .await,
        )?;
        made.published.push((volume_id.into(), target.clone()));
        Ok(target)
    }

    fn publish_request(
        &self,
        volume_id: &str,
        staging: &std::path::Path,
        target: &std::path::Path,
        publish_context: std::collections::HashMap<String, String>,
        read_only: bool,
    ) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: volume_id.into(),
            publish_context,
            staging_target_path: if self.has(Need::NodeRpc(NodeRpc::StageUnstageVolume)) {
                staging.display().to_string()
            } else {
                String::new()
            },
            target_path: target.display().to_string(),
            volume_capability: Some(writer()),
            readonly: read_only,
            ..Default::default()
        }
    }
}

/// Runs `body` with a fresh [`Made`], then removes what it made.
macro_rules! with_made {
    ($check:expr, |$made:ident| $body:block) => {{
        let mut $made = Made::default();
        let result: Result<(), String> = async { $body }.await;
        $made.clean($check).await;
        result
    }};
}

async fn plugin_info(check: &Check) -> Result<(), String> {
    let info = ok(
        "GetPluginInfo",
        check
            .client
            .identity()
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await,
    )?;
    let valid = !info.name.is_empty()
        && info.name.len() <= 63
        && info
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        && info.name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && info.name.ends_with(|c: char| c.is_ascii_alphanumeric());
    ensure(valid, || {
        format!(
            "name {:?} is not a domain-name-like string of at most 63 characters",
            info.name
        )
    })?;
    ensure(!info.vendor_version.is_empty(), || "vendor_version is empty".into())
}

async fn probe(check: &Check) -> Result<(), String> {
    ok("Probe", check.client.identity().probe(csi::ProbeRequest {}).await).map(|_| ())
}

async fn create_needs_arguments(check: &Check) -> Result<(), String> {
    let mut controller = check.client.controller();
    let mut nameless = create_request("", GIB);
    nameless.name.clear();
    expect_code(
        "without a name",
        controller.create_volume(nameless).await,
        Code::InvalidArgument,
    )?;
    let mut bare = create_request(&check.name("bare"), GIB);
    bare.volume_capabilities.clear();
    let result = controller.create_volume(bare).await;
    if result.is_ok() {
        let _ = controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: check.name("bare"),
                secrets: Default::default(),
            })
            .await;
    }
    expect_code("without capabilities", result, Code::InvalidArgument)
}

async fn create_is_idempotent(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let name = check.name("idem");
        let first = check.create(&mut made, create_request(&name, GIB)).await?;
        let second = check.create(&mut made, create_request(&name, GIB)).await?;
        ensure(first.volume_id == second.volume_id, || {
            format!("two volumes for one name: {} and {}", first.volume_id, second.volume_id)
        })?;
        ensure(first.capacity_bytes == second.capacity_bytes, || {
            format!(
                "capacity changed: {} then {}",
                first.capacity_bytes, second.capacity_bytes
            )
        })
    })
}

async fn create_conflict(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let name = check.name("conflict");
        let volume = check.create(&mut made, create_request(&name, GIB)).await?;
        let larger = create_request(&name, volume.capacity_bytes.max(GIB) * 2);
        let result = check.client.controller().create_volume(larger).await;
        expect_code("the same name with twice the capacity", result, Code::AlreadyExists)
    })
}

async fn create_capacity_range(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let mut request = create_request(&check.name("range"), GIB);
        request.capacity_range = range(GIB, 2 * GIB);
        let volume = check.create(&mut made, request).await?;
        ensure(
            volume.capacity_bytes == 0 || (GIB..=2 * GIB).contains(&volume.capacity_bytes),
            || format!("capacity {} outside [{GIB}, {}]", volume.capacity_bytes, 2 * GIB),
        )
    })
}

async fn create_inverted_range(check: &Check) -> Result<(), String> {
    let name = check.name("inverted");
    let mut request = create_request(&name, 2 * GIB);
    request.capacity_range = range(2 * GIB, GIB);
    let result = check.client.controller().create_volume(request).await;
    // A plugin that made it anyway has it deleted by the ID it gave, which need not be the
    // name (deleting by name leaked one volume per run on such plugins).
    let made = result
        .as_ref()
        .ok()
        .and_then(|response| response.get_ref().volume.as_ref())
        .map(|volume| volume.volume_id.clone());
    if let Some(volume_id) = made {
        let deleted = check
            .client
            .controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: volume_id.clone(),
                secrets: Default::default(),
            })
            .await;
        if let Err(status) = deleted {
            return Err(format!(
                "limit_bytes below required_bytes: made volume {volume_id:?} ({name}) instead of refusing, \
                 and could not delete it: {status}"
            ));
        }
    }
    expect_code("limit_bytes below required_bytes", result, Code::InvalidArgument)
}

async fn delete_is_idempotent(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("delete"), GIB))
            .await?;
        let mut controller = check.client.controller();
        let delete = |volume_id: String| csi::DeleteVolumeRequest {
            volume_id,
            secrets: Default::default(),
        };
        ok(
            "DeleteVolume",
            controller.delete_volume(delete(volume.volume_id.clone())).await,
        )?;
        ok(
            "DeleteVolume again",
            controller.delete_volume(delete(volume.volume_id.clone())).await,
        )?;
        ok(
            "DeleteVolume of an unknown id",
            controller.delete_volume(delete(check.name("never-made-0"))).await,
        )?;
        expect_code(
            "DeleteVolume without an id",
            controller.delete_volume(delete(String::new())).await,
            Code::InvalidArgument,
        )
    })
}

async fn validate_missing(check: &Check) -> Result<(), String> {
    let result = check
        .client
        .controller()
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: check.name("never-made-1"),
            volume_capabilities: vec![writer()],
            ..Default::default()
        })
        .await;
    expect_code("an unknown volume", result, Code::NotFound)
}

async fn validate_confirms(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("validate"), GIB))
            .await?;
        let answer = ok(
            "ValidateVolumeCapabilities",
            check
                .client
                .controller()
                .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                    volume_id: volume.volume_id.clone(),
                    volume_context: volume.volume_context.clone(),
                    volume_capabilities: vec![writer()],
                    ..Default::default()
                })
                .await,
        )?;
        let confirmed = answer
            .confirmed
            .ok_or_else(|| format!("not confirmed: {}", answer.message))?;
        ensure(confirmed.volume_capabilities == vec![writer()], || {
            format!("confirmed other capabilities: {:?}", confirmed.volume_capabilities)
        })
    })
}

async fn publish_missing(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let mut controller = check.client.controller();
        let request = |volume_id: String, node_id: String| csi::ControllerPublishVolumeRequest {
            volume_id,
            node_id,
            volume_capability: Some(writer()),
            ..Default::default()
        };
        // Without the node service (`--controller-only`) there is no node id: a made-up one
        // is just as unknown as the volume, and an empty one would be INVALID_ARGUMENT.
        let node = match check.advertised.node_id.as_str() {
            "" => check.name("some-node"),
            id => id.to_string(),
        };
        let result = controller
            .controller_publish_volume(request(check.name("never-made-2"), node))
            .await;
        expect_code("an unknown volume", result, Code::NotFound)?;
        let volume = check
            .create(&mut made, create_request(&check.name("publish-missing"), GIB))
            .await?;
        let result = controller
            .controller_publish_volume(request(volume.volume_id.clone(), check.name("no-such-node")))
            .await;
        expect_code("an unknown node", result, Code::NotFound)?;
        let result = controller
            .controller_publish_volume(request(volume.volume_id, String::new()))
            .await;
        expect_code("no node id", result, Code::InvalidArgument)
    })
}

async fn publish_is_idempotent(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("attach"), GIB))
            .await?;
        let mut controller = check.client.controller();
        let publish = csi::ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: check.advertised.node_id.clone(),
            volume_capability: Some(writer()),
            ..Default::default()
        };
        made.attached.push(volume.volume_id.clone());
        let first = ok(
            "ControllerPublishVolume",
            controller.controller_publish_volume(publish.clone()).await,
        )?;
        let second = ok(
            "ControllerPublishVolume again",
            controller.controller_publish_volume(publish).await,
        )?;
        ensure(first.publish_context == second.publish_context, || {
            "a repeated publish answered another publish_context".into()
        })?;
        let unpublish = csi::ControllerUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: check.advertised.node_id.clone(),
            secrets: Default::default(),
        };
        ok(
            "ControllerUnpublishVolume",
            controller.controller_unpublish_volume(unpublish.clone()).await,
        )?;
        ok(
            "ControllerUnpublishVolume again",
            controller.controller_unpublish_volume(unpublish).await,
        )?;
        Ok(())
    })
}

async fn list_volumes_pages(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let mut wanted = BTreeSet::new();
        for at in 0..3 {
            let volume = check
                .create(&mut made, create_request(&check.name(&format!("list-{at}")), GIB))
                .await?;
            wanted.insert(volume.volume_id);
        }
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let page = ok(
                "ListVolumes",
                check
                    .client
                    .controller()
                    .list_volumes(csi::ListVolumesRequest {
                        max_entries: 1,
                        starting_token: token.clone(),
                    })
                    .await,
            )?;
            ensure(page.entries.len() <= 1, || {
                format!("max_entries 1 answered {} entries", page.entries.len())
            })?;
            seen.extend(
                page.entries
                    .into_iter()
                    .filter_map(|entry| entry.volume)
                    .map(|volume| volume.volume_id),
            );
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        let ours: Vec<&String> = seen.iter().filter(|id| wanted.contains(*id)).collect();
        let distinct: BTreeSet<&String> = ours.iter().copied().collect();
        ensure(distinct.len() == wanted.len() && ours.len() == wanted.len(), || {
            format!("paging saw {ours:?} of {wanted:?}")
        })
    })
}

async fn list_volumes_bad_token(check: &Check) -> Result<(), String> {
    let result = check
        .client
        .controller()
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 1,
            starting_token: "not-a-token-this-plugin-made".into(),
        })
        .await;
    expect_code("a made-up starting_token", result, Code::Aborted)
}

async fn get_capacity(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let ask = || csi::GetCapacityRequest {
            volume_capabilities: vec![writer()],
            ..Default::default()
        };
        let before = ok("GetCapacity", check.client.controller().get_capacity(ask()).await)?;
        ensure(before.available_capacity >= 0, || {
            format!("negative capacity {}", before.available_capacity)
        })?;
        check
            .create(&mut made, create_request(&check.name("capacity"), GIB))
            .await?;
        let after = ok("GetCapacity", check.client.controller().get_capacity(ask()).await)?;
        ensure(after.available_capacity <= before.available_capacity, || {
            format!(
                "capacity grew from {} to {} after a volume was made",
                before.available_capacity, after.available_capacity
            )
        })
    })
}

async fn snapshot_idempotency(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let one = check
            .create(&mut made, create_request(&check.name("snap-src-1"), GIB))
            .await?;
        let two = check
            .create(&mut made, create_request(&check.name("snap-src-2"), GIB))
            .await?;
        let name = check.name("snap");
        let first = check
            .snapshot(&mut made, &one.volume_id, &name)
            .await
            .map_err(|e| format!("CreateSnapshot: {e}"))?;
        let again = check
            .snapshot(&mut made, &one.volume_id, &name)
            .await
            .map_err(|e| format!("CreateSnapshot again: {e}"))?;
        ensure(first.snapshot_id == again.snapshot_id, || {
            "a repeated CreateSnapshot made another snapshot".into()
        })?;
        ensure(first.source_volume_id == one.volume_id, || {
            format!("source_volume_id {:?}", first.source_volume_id)
        })?;
        let other = check.snapshot(&mut made, &two.volume_id, &name).await;
        expect_code("the same name of another volume", other, Code::AlreadyExists)?;
        let nameless = check.snapshot(&mut made, &one.volume_id, "").await;
        expect_code("CreateSnapshot without a name", nameless, Code::InvalidArgument)?;
        let mut controller = check.client.controller();
        let delete = |snapshot_id: String| csi::DeleteSnapshotRequest {
            snapshot_id,
            secrets: Default::default(),
        };
        ok(
            "DeleteSnapshot",
            controller.delete_snapshot(delete(first.snapshot_id.clone())).await,
        )?;
        ok(
            "DeleteSnapshot again",
            controller.delete_snapshot(delete(first.snapshot_id)).await,
        )?;
        Ok(())
    })
}

async fn volume_from_snapshot(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let source = check
            .create(&mut made, create_request(&check.name("restore-src"), GIB))
            .await?;
        let snapshot = check
            .snapshot(&mut made, &source.volume_id, &check.name("restore-snap"))
            .await
            .map_err(|e| format!("CreateSnapshot: {e}"))?;
        let mut request = create_request(&check.name("restored"), snapshot.size_bytes.max(GIB));
        request.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot.snapshot_id.clone(),
                },
            )),
        });
        let restored = check.create(&mut made, request.clone()).await?;
        ensure(restored.content_source == request.volume_content_source, || {
            format!("content_source not echoed: {:?}", restored.content_source)
        })?;
        request.name = check.name("restored-missing");
        request.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: check.name("no-such-snapshot"),
                },
            )),
        });
        let result = check.client.controller().create_volume(request).await;
        expect_code("from an unknown snapshot", result, Code::NotFound)
    })
}

async fn list_snapshots(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let source = check
            .create(&mut made, create_request(&check.name("ls-src"), GIB))
            .await?;
        let mut wanted = BTreeSet::new();
        for at in 0..3 {
            let snapshot = check
                .snapshot(&mut made, &source.volume_id, &check.name(&format!("ls-{at}")))
                .await
                .map_err(|e| format!("CreateSnapshot: {e}"))?;
            wanted.insert(snapshot.snapshot_id);
        }
        let list = |request: csi::ListSnapshotsRequest| {
            let mut controller = check.client.controller();
            async move { controller.list_snapshots(request).await }
        };
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let page = ok(
                "ListSnapshots",
                list(csi::ListSnapshotsRequest {
                    max_entries: 1,
                    starting_token: token.clone(),
                    source_volume_id: source.volume_id.clone(),
                    ..Default::default()
                })
                .await,
            )?;
            ensure(page.entries.len() <= 1, || {
                format!("max_entries 1 answered {} entries", page.entries.len())
            })?;
            seen.extend(
                page.entries
                    .into_iter()
                    .filter_map(|entry| entry.snapshot)
                    .map(|s| s.snapshot_id),
            );
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        let distinct: BTreeSet<String> = seen.iter().cloned().collect();
        ensure(distinct == wanted && seen.len() == wanted.len(), || {
            format!("paging by source saw {seen:?} of {wanted:?}")
        })?;
        let one = wanted.iter().next().cloned().unwrap_or_default();
        let by_id = ok(
            "ListSnapshots by id",
            list(csi::ListSnapshotsRequest {
                snapshot_id: one.clone(),
                ..Default::default()
            })
            .await,
        )?;
        ensure(by_id.entries.len() == 1, || {
            format!("by snapshot_id: {} entries", by_id.entries.len())
        })?;
        let unknown = ok(
            "ListSnapshots of an unknown id",
            list(csi::ListSnapshotsRequest {
                snapshot_id: check.name("no-such-snapshot"),
                ..Default::default()
            })
            .await,
        )?;
        ensure(unknown.entries.is_empty(), || {
            "an unknown snapshot_id listed something".into()
        })?;
        let result = list(csi::ListSnapshotsRequest {
            max_entries: 1,
            starting_token: "not-a-token-this-plugin-made".into(),
            ..Default::default()
        })
        .await;
        expect_code("a made-up starting_token", result, Code::Aborted)
    })
}

async fn clone_volume(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let source = check
            .create(&mut made, create_request(&check.name("clone-src"), GIB))
            .await?;
        let mut request = create_request(&check.name("clone"), source.capacity_bytes.max(GIB));
        request.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: source.volume_id.clone(),
                },
            )),
        });
        let clone = check.create(&mut made, request.clone()).await?;
        ensure(clone.content_source == request.volume_content_source, || {
            format!("content_source not echoed: {:?}", clone.content_source)
        })
    })
}

async fn controller_expand(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("expand"), GIB))
            .await?;
        let mut controller = check.client.controller();
        let expand =
            |volume_id: String, capacity_range: Option<csi::CapacityRange>| csi::ControllerExpandVolumeRequest {
                volume_id,
                capacity_range,
                ..Default::default()
            };
        let wanted = volume.capacity_bytes.max(GIB) * 2;
        let grown = ok(
            "ControllerExpandVolume",
            controller
                .controller_expand_volume(expand(volume.volume_id.clone(), range(wanted, 0)))
                .await,
        )?;
        ensure(grown.capacity_bytes >= wanted, || {
            format!("grew to {} of {wanted} bytes", grown.capacity_bytes)
        })?;
        let missing = controller
            .controller_expand_volume(expand(check.name("never-made-3"), range(wanted, 0)))
            .await;
        expect_code("an unknown volume", missing, Code::NotFound)?;
        let rangeless = controller
            .controller_expand_volume(expand(volume.volume_id, None))
            .await;
        expect_code("without a capacity_range", rangeless, Code::InvalidArgument)
    })
}

async fn get_volume(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check.create(&mut made, create_request(&check.name("get"), GIB)).await?;
        let mut controller = check.client.controller();
        let answer = ok(
            "ControllerGetVolume",
            controller
                .controller_get_volume(csi::ControllerGetVolumeRequest {
                    volume_id: volume.volume_id.clone(),
                })
                .await,
        )?;
        let got = answer.volume.ok_or("no volume in the answer")?;
        ensure(got.volume_id == volume.volume_id, || {
            format!("answered volume {}", got.volume_id)
        })?;
        ensure(answer.status.is_some(), || "no status".into())?;
        let missing = controller
            .controller_get_volume(csi::ControllerGetVolumeRequest {
                volume_id: check.name("never-made-4"),
            })
            .await;
        expect_code("an unknown volume", missing, Code::NotFound)
    })
}

async fn create_in_topology(check: &Check) -> Result<(), String> {
    let topology = check
        .advertised
        .node_topology
        .clone()
        .ok_or("the node reports no topology")?;
    with_made!(check, |made| {
        let mut request = create_request(&check.name("topology"), GIB);
        request.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![topology.clone()],
            preferred: vec![topology.clone()],
        });
        let volume = check.create(&mut made, request).await?;
        ensure(volume.accessible_topology.contains(&topology), || {
            format!(
                "placed at {:?}, not within the requisite {topology:?}",
                volume.accessible_topology
            )
        })
    })
}

async fn node_info(check: &Check) -> Result<(), String> {
    let info = ok(
        "NodeGetInfo",
        check.client.node().node_get_info(csi::NodeGetInfoRequest {}).await,
    )?;
    ensure(!info.node_id.is_empty(), || "an empty node_id".into())?;
    ensure(info.max_volumes_per_node >= 0, || {
        format!("max_volumes_per_node {}", info.max_volumes_per_node)
    })
}

async fn node_publish_refusals(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("refuse"), GIB))
            .await?;
        let target = check.work_dir.join(check.name("refuse-target"));
        let staging = check.work_dir.join(check.name("refuse-staging"));
        let mut node = check.client.node();
        let mut request = check.publish_request(&volume.volume_id, &staging, &target, Default::default(), false);
        request.target_path.clear();
        expect_code(
            "without a target_path",
            node.node_publish_volume(request).await,
            Code::InvalidArgument,
        )?;
        let mut request = check.publish_request(&volume.volume_id, &staging, &target, Default::default(), false);
        request.volume_capability = None;
        expect_code(
            "without a capability",
            node.node_publish_volume(request).await,
            Code::InvalidArgument,
        )?;
        let result = node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: String::new(),
                target_path: target.display().to_string(),
            })
            .await;
        expect_code("NodeUnpublishVolume without a volume_id", result, Code::InvalidArgument)?;
        if !check.has(Need::NodeRpc(NodeRpc::StageUnstageVolume)) {
            let request = check.publish_request(
                &check.name("never-made-5"),
                &staging,
                &target,
                Default::default(),
                false,
            );
            let result = node.node_publish_volume(request).await;
            made.published.push((check.name("never-made-6"), target.clone()));
            expect_code("an unknown volume", result, Code::NotFound)?;
        }
        Ok(())
    })
}

async fn node_publish_cycle(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("cycle"), GIB))
            .await?;
        let target = check.publish_here(&mut made, &volume.volume_id, false).await?;
        ensure(target.is_dir(), || {
            format!("nothing at the target path {}", target.display())
        })?;
        // Written through the published path, read back after a second publish.
        std::fs::write(target.join("drover-check"), b"written through the mount")
            .map_err(|error| format!("writing through the published volume: {error}"))?;
        let (_, staging) = made.staged.last().cloned().unwrap_or_default();
        let again = check.publish_request(&volume.volume_id, &staging, &target, Default::default(), false);
        ok(
            "NodePublishVolume again",
            check.client.node().node_publish_volume(again).await,
        )?;
        let read = std::fs::read(target.join("drover-check")).map_err(|error| format!("reading it back: {error}"))?;
        ensure(read == b"written through the mount", || {
            "read back something else".into()
        })?;
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            target_path: target.display().to_string(),
        };
        let mut node = check.client.node();
        ok(
            "NodeUnpublishVolume",
            node.node_unpublish_volume(unpublish.clone()).await,
        )?;
        ok("NodeUnpublishVolume again", node.node_unpublish_volume(unpublish).await)?;
        if let Some((volume_id, staging)) = made.staged.first().cloned() {
            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id,
                staging_target_path: staging.display().to_string(),
            };
            ok("NodeUnstageVolume", node.node_unstage_volume(unstage.clone()).await)?;
            ok("NodeUnstageVolume again", node.node_unstage_volume(unstage).await)?;
        }
        Ok(())
    })
}

async fn node_stats(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("stats"), GIB))
            .await?;
        let target = check.publish_here(&mut made, &volume.volume_id, false).await?;
        std::fs::write(target.join("payload"), vec![7u8; 64 << 10]).map_err(|error| error.to_string())?;
        let mut node = check.client.node();
        let stats = ok(
            "NodeGetVolumeStats",
            node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await,
        )?;
        let bytes = stats
            .usage
            .iter()
            .find(|usage| usage.unit == csi::volume_usage::Unit::Bytes as i32)
            .ok_or("no usage in bytes")?;
        ensure(bytes.used >= 64 << 10 && bytes.total >= bytes.used, || {
            format!("usage {bytes:?} after 64 KiB were written")
        })?;
        if check.has(Need::NodeRpc(NodeRpc::VolumeCondition)) {
            let condition = stats
                .volume_condition
                .ok_or("VOLUME_CONDITION advertised, none reported")?;
            ensure(!condition.abnormal, || {
                format!("a healthy volume reported abnormal: {}", condition.message)
            })?;
        }
        let missing = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: check.name("never-made-7"),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await;
        expect_code("an unknown volume", missing, Code::NotFound)
    })
}

async fn node_expand(check: &Check) -> Result<(), String> {
    with_made!(check, |made| {
        let volume = check
            .create(&mut made, create_request(&check.name("node-expand"), GIB))
            .await?;
        let target = check.publish_here(&mut made, &volume.volume_id, false).await?;
        let wanted = volume.capacity_bytes.max(GIB) * 2;
        let grown = ok(
            "ControllerExpandVolume",
            check
                .client
                .controller()
                .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                    volume_id: volume.volume_id.clone(),
                    capacity_range: range(wanted, 0),
                    volume_capability: Some(writer()),
                    ..Default::default()
                })
                .await,
        )?;
        let mut node = check.client.node();
        let expanded = ok(
            "NodeExpandVolume",
            node.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: target.display().to_string(),
                capacity_range: range(grown.capacity_bytes, 0),
                volume_capability: Some(writer()),
                ..Default::default()
            })
            .await,
        )?;
        ensure(
            expanded.capacity_bytes == 0 || expanded.capacity_bytes >= wanted,
            || format!("the node grew it to {} of {wanted} bytes", expanded.capacity_bytes),
        )?;
        let nowhere = node
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: String::new(),
                capacity_range: range(wanted, 0),
                ..Default::default()
            })
            .await;
        expect_code("without a volume_path", nowhere, Code::InvalidArgument)
    })
}
