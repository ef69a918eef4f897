//! The messages of the servers' write endpoints: requests, replies and errors as they travel
//! between agents (JSON inside the agent envelope), and the `ClientCSI` calls the leader makes.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use alloc::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::csi::unpublish::{ControllerDetachRequest, NodeDetachRequest};
pub use crate::error::ErrorKind;
use crate::structs::{
    AccessMode, Allocation, AttachmentMode, ClientStatus, CsiCapability, CsiExternalVolume, CsiInfo, CsiMountOptions,
    CsiSnapshot, CsiVolume, CsiVolumeClaim, DrainStrategy, DriverInfo, Job, Node, NodeEvent, NodeStatus,
    SchedulingEligibility,
};

/// Correlates a request with its reply; chosen by the driver.
pub type ReqId = u64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerRequest {
    NodeRegister {
        node: alloc::boxed::Box<Node>,
    },
    NodeUpdateStatus {
        node_id: String,
        /// The calling node's secret: only its own node may send this.
        #[serde(default)]
        secret_id: String,
        status: NodeStatus,
    },
    NodeUpdateCsiInfo {
        node_id: String,
        /// The calling node's secret: only its own node may send this.
        #[serde(default)]
        secret_id: String,
        controllers: BTreeMap<String, CsiInfo>,
        nodes: BTreeMap<String, CsiInfo>,
    },
    NodeUpdateDrivers {
        node_id: String,
        /// The calling node's secret: only its own node may send this.
        #[serde(default)]
        secret_id: String,
        drivers: BTreeMap<String, DriverInfo>,
    },
    NodeEmitEvents {
        node_id: String,
        /// The calling node's secret: only its own node may send this.
        #[serde(default)]
        secret_id: String,
        events: Vec<NodeEvent>,
    },
    NodeDeregister {
        node_id: String,
    },
    /// `Node.UpdateDrain`: `strategy` starts or changes a drain, `None` cancels it.
    NodeUpdateDrain {
        node_id: String,
        strategy: Option<DrainStrategy>,
        mark_eligible: bool,
    },
    /// `Node.UpdateEligibility`.
    NodeUpdateEligibility {
        node_id: String,
        eligibility: SchedulingEligibility,
    },
    /// `Node.DeriveSIToken`: Consul service identity tokens for Connect tasks of an
    /// allocation on the calling node.
    DeriveSiToken {
        node_id: String,
        secret_id: String,
        alloc_id: String,
        tasks: Vec<String>,
    },
    JobUpsert {
        job: alloc::boxed::Box<Job>,
    },
    JobDeregister {
        namespace: String,
        job_id: String,
    },
    AllocUpsert {
        allocs: Vec<Allocation>,
    },
    AllocClientUpdate {
        alloc_id: String,
        client_status: ClientStatus,
    },
    /// `Node.UpdateAlloc`: a client's batch of allocation reports.
    AllocClientUpdates {
        node_id: String,
        /// The calling node's secret: only its own node may send this.
        #[serde(default)]
        secret_id: String,
        updates: Vec<crate::structs::AllocClientReport>,
    },
    AllocDelete {
        alloc_ids: Vec<String>,
    },
    /// `Alloc.Stop`: the allocation is marked to migrate and an evaluation replaces it;
    /// answered with the evaluation.
    AllocStop {
        alloc_id: String,
    },
    VolumeRegister {
        volumes: Vec<CsiVolume>,
    },
    VolumeDeregister {
        namespace: String,
        volume_ids: Vec<String>,
        force: bool,
    },
    /// `CSIVolume.Create`: each volume made by a healthy controller (`ControllerCreateVolume`,
    /// named by the volume's name so a retry finds the same volume), then registered.
    VolumeCreate {
        volumes: Vec<CsiVolume>,
    },
    /// `CSIVolume.Delete`: refused while claimed; `ControllerDeleteVolume`, then deregistered.
    VolumeDelete {
        namespace: String,
        volume_id: String,
        /// `X-Nomad-CSI-Secrets`; the volume's own secrets when empty.
        secrets: crate::structs::Secrets,
    },
    /// `CSIVolume.CreateSnapshot`: `ControllerCreateSnapshot` of each registered source
    /// volume, on its plugin (or the snapshot's `plugin_id`).
    SnapshotCreate {
        namespace: String,
        snapshots: Vec<CsiSnapshot>,
    },
    /// `CSIVolume.DeleteSnapshot`: `ControllerDeleteSnapshot` of each (`id`, `plugin_id`).
    SnapshotDelete {
        snapshots: Vec<CsiSnapshot>,
    },
    /// `CSIVolume.ListSnapshots`: one page of the plugin's `ListSnapshots`.
    SnapshotList {
        plugin_id: String,
        page: ListPage,
        secrets: crate::structs::Secrets,
    },
    /// `CSIVolume.ListExternal`: one page of the plugin's `ListVolumes`.
    VolumeListExternal {
        plugin_id: String,
        page: ListPage,
    },
    VolumeClaim {
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
        /// The claiming node's secret (stamped by the client, [`ServerRequest::stamp_node`]).
        #[serde(default)]
        secret_id: String,
    },
    VolumeUnpublish {
        namespace: String,
        volume_id: String,
        claim: CsiVolumeClaim,
        /// The releasing node's secret.
        #[serde(default)]
        secret_id: String,
    },
    VolumeDetach {
        namespace: String,
        volume_id: String,
        node_id: String,
    },
    PluginDelete {
        plugin_id: String,
    },
    /// `Job.Register`: validated, stored (a new version when the spec changed) with an
    /// evaluation; replies `JobRegistered`.
    JobRegister {
        job: alloc::boxed::Box<Job>,
        /// `job run -check-index`: refused unless the stored job's `job_modify_index` is
        /// this (0: the job must not exist yet).
        #[serde(default)]
        enforce_index: Option<u64>,
    },
    /// `Node.Evaluate`: `node-update` evaluations for every job with a live allocation on the
    /// node and every system job, as a node's status change makes them.
    NodeEvaluate {
        node_id: String,
    },
    /// `Job.Dispatch`: a child of a parameterized job registered with the payload and meta
    /// (checked against the parent's `parameterized` block); replies `JobDispatched`. With
    /// an idempotency token that a child of the parent (not yet collected) carries, that child is
    /// the answer and nothing is registered.
    JobDispatch(alloc::boxed::Box<JobDispatchRequest>),
    /// `Periodic.Force`: a periodic parent's child launched now; answered like a register
    /// (with the child's evaluation).
    PeriodicForce {
        namespace: String,
        job_id: String,
    },
    /// `System.GarbageCollect`: everything collectable now (`crate::gc`) removed.
    SystemGc,
    /// `Job.Scale`: a group's count changed within its scaling policy.
    JobScale(alloc::boxed::Box<JobScaleRequest>),
    /// `Operator.AutopilotSetConfiguration` (`cas`: only if last modified at that index).
    AutopilotSetConfig {
        config: crate::autopilot::AutopilotConfig,
        cas: Option<u64>,
    },
    /// Raft peer removal and force-leave: answered by the leader's server machine, which
    /// owns the Raft configuration and gossip (`server/operator.rs`).
    Operator(OperatorRequest),
    /// `System.ReconcileJobSummaries`.
    ReconcileSummaries,
    /// An operator's hand on a deployment or a job's versions (promote, pause, fail,
    /// allocation health, revert, stable), answered like a register.
    Deployment(super::deployments::DeploymentRequest),
    /// `Job.Evaluate`: a new evaluation of the job as it stands (`job-register`), answered
    /// like a register.
    JobEvaluate {
        namespace: String,
        job_id: String,
    },
    /// `Job.Deregister`: stop the job (or, with `purge`, remove it) with an evaluation.
    JobStop {
        namespace: String,
        job_id: String,
        purge: bool,
    },
    /// The variables at `paths` (a client's templates' `nomadVar`), read by the leader from
    /// its applied state, so a read never misses a write acknowledged before it; replies
    /// `Variables`.
    VariablesRead {
        paths: Vec<String>,
        /// The reading node and its secret (stamped by the client, [`ServerRequest::stamp_node`]).
        #[serde(default)]
        node_id: String,
        #[serde(default)]
        secret_id: String,
    },
}

impl ServerRequest {
    /// The node a client's own call speaks for, and the secret it presents: checked against the
    /// node's stored secret before the call is served (`DeriveSiToken` checks its own, with
    /// Nomad's `SecretID mismatch`).
    /// Sets the node secret a client presents on a request it makes for its node, where the
    /// maker (an allocation runner) does not hold the secret itself.
    pub fn stamp_node(&mut self, node: &str, secret: &str) {
        match self {
            ServerRequest::VolumeClaim { secret_id, .. } | ServerRequest::VolumeUnpublish { secret_id, .. } => {
                *secret_id = secret.to_string();
            }
            ServerRequest::VariablesRead { node_id, secret_id, .. } => {
                *node_id = node.to_string();
                *secret_id = secret.to_string();
            }
            _ => {}
        }
    }

    pub fn node_credential(&self) -> Option<(&str, &str)> {
        match self {
            ServerRequest::NodeUpdateStatus { node_id, secret_id, .. }
            | ServerRequest::NodeUpdateCsiInfo { node_id, secret_id, .. }
            | ServerRequest::NodeUpdateDrivers { node_id, secret_id, .. }
            | ServerRequest::NodeEmitEvents { node_id, secret_id, .. }
            | ServerRequest::AllocClientUpdates { node_id, secret_id, .. } => Some((node_id, secret_id)),
            ServerRequest::VolumeClaim { claim, secret_id, .. }
            | ServerRequest::VolumeUnpublish { claim, secret_id, .. } => Some((&claim.node_id, secret_id)),
            ServerRequest::NodeRegister { node } => Some((&node.id, &node.secret_id)),
            ServerRequest::VariablesRead { node_id, secret_id, .. } => Some((node_id, secret_id)),
            _ => None,
        }
    }
}

/// `Job.Scale`'s request (Nomad's `JobScaleRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobScaleRequest {
    pub namespace: String,
    pub job_id: String,
    pub group: String,
    /// The new count; `None` for an autoscaler's report that only records an event.
    pub count: Option<i64>,
    /// `EnforceIndex`-style: only when the job's `job_modify_index` is this (0: any).
    #[serde(default)]
    pub job_modify_index: u64,
    /// The scaling event's `Message`, `Error` and `Meta`.
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub error: bool,
    #[serde(default)]
    pub meta: alloc::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcError {
    /// What kind of failure this is (absent in replies of builds before it existed).
    #[serde(default)]
    pub kind: ErrorKind,
    pub message: String,
    /// The caller may retry (no leader, leadership lost, a retryable plugin error).
    pub retryable: bool,
}

impl RpcError {
    pub fn new(kind: ErrorKind, message: impl Into<String>, retryable: bool) -> Self {
        RpcError {
            kind,
            message: message.into(),
            retryable,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::NotFound, message, false)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::Invalid, message, false)
    }

    pub fn refused(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::Refused, message, false)
    }

    /// No leader, a lost leadership, an unreachable peer: retryable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        RpcError::new(ErrorKind::Unavailable, message, true)
    }

    /// A plugin's or controller's failure, retryable or not as the plugin said.
    pub fn from_plugin(message: impl Into<String>, retryable: bool) -> Self {
        let kind = if retryable {
            ErrorKind::Unavailable
        } else {
            ErrorKind::Refused
        };
        RpcError::new(kind, message, retryable)
    }
}

/// `Node.GetClientAllocs`: the allocations placed on `node_id`, as a blocking query — the
/// server answers once its applied index passes `min_index` or after `max_wait_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocsRequest {
    pub node_id: String,
    pub min_index: u64,
    pub max_wait_ms: u64,
    /// The view digest of the client's last reply ([`NodeAllocsReply::view`]): the server
    /// keeps waiting while the node's view still has it, so a change elsewhere in the cluster
    /// does not send the client its whole view again.
    #[serde(default)]
    pub known_view: Option<u64>,
}

/// The allocations of one node with their jobs, as of the server's applied `index`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocsReply {
    pub index: u64,
    /// The node's allocations; each one's job is the one in `jobs` with its namespace and job
    /// id.
    pub allocs: Vec<Allocation>,
    /// The jobs of `allocs`, each once: a job of a hundred groups with a thousand allocations
    /// here is sent (and held by the client) once, not a thousand times (issue 54 §8).
    #[serde(default)]
    pub jobs: Vec<Job>,
    /// Allocations on other nodes that these wait for and that have finished
    /// ([`ServerState::node_allocs`]).
    pub finished_elsewhere: Vec<String>,
    /// [`ServerState::node_allocs_view`] of this answer.
    #[serde(default)]
    pub view: u64,
}

impl NodeAllocsReply {
    /// Each allocation with its job, the job shared by all of its allocations; an allocation
    /// whose job is not in the reply is left out (the servers list none such).
    pub fn paired(allocs: Vec<Allocation>, jobs: Vec<Job>) -> Vec<(Allocation, Arc<Job>)> {
        let jobs: BTreeMap<(String, String), Arc<Job>> = jobs
            .into_iter()
            .map(|job| ((job.namespace.clone(), job.id.clone()), Arc::new(job)))
            .collect();
        allocs
            .into_iter()
            .filter_map(|alloc| {
                let job = jobs.get(&(alloc.namespace.clone(), alloc.job_id.clone()))?.clone();
                Some((alloc, job))
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerReply {
    Done {
        index: u64,
    },
    Claimed {
        index: u64,
        volume: alloc::boxed::Box<CsiVolume>,
        publish_context: BTreeMap<String, String>,
    },
    Error(RpcError),
    /// Snapshots a plugin made or listed, and the token of the next page (empty: none).
    Snapshots {
        index: u64,
        snapshots: Vec<CsiSnapshot>,
        next_token: String,
    },
    /// A page of the volumes a plugin lists, and the token of the next page (empty: none).
    ExternalVolumes {
        index: u64,
        volumes: Vec<CsiExternalVolume>,
        next_token: String,
    },
    /// A node registration or status update (a heartbeat): the client calls in again within
    /// `heartbeat_ttl_ms` or the leader marks the node down.
    Heartbeat {
        index: u64,
        heartbeat_ttl_ms: u64,
    },
    /// A job write: the evaluation it created and the job's modify index after it.
    JobRegistered {
        index: u64,
        eval_id: String,
        job_modify_index: u64,
    },
    /// `Job.Dispatch`: the child registered (or the live one the idempotency token names,
    /// with no evaluation) and its evaluation.
    JobDispatched {
        index: u64,
        dispatched_job_id: String,
        eval_id: String,
        job_create_index: u64,
    },
    /// The variables asked for that exist, with their items and modify indexes, as of the
    /// variables table's `index`.
    Variables {
        index: u64,
        variables: BTreeMap<String, VariableItems>,
    },
    /// `Node.DeriveSIToken`: each task's token secret, its accessor committed at `index`.
    SiTokens {
        index: u64,
        tokens: BTreeMap<String, String>,
    },
}

/// One variable as a template reads it: its items and the index it was last written at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableItems {
    pub items: crate::structs::Secrets,
    pub modify_index: u64,
}

impl ServerReply {
    /// The Raft index the write was applied at; `None` for an error.
    pub fn index(&self) -> Option<u64> {
        match self {
            ServerReply::Done { index }
            | ServerReply::Claimed { index, .. }
            | ServerReply::Heartbeat { index, .. }
            | ServerReply::JobRegistered { index, .. }
            | ServerReply::JobDispatched { index, .. }
            | ServerReply::Variables { index, .. }
            | ServerReply::SiTokens { index, .. }
            | ServerReply::Snapshots { index, .. }
            | ServerReply::ExternalVolumes { index, .. } => Some(*index),
            ServerReply::Error(_) => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerAttachRequest {
    pub plugin_id: String,
    pub volume_id: String,
    pub client_csi_node_id: String,
    pub attachment_mode: AttachmentMode,
    pub access_mode: AccessMode,
    pub mount_options: Option<CsiMountOptions>,
    pub read_only: bool,
    pub secrets: crate::structs::Secrets,
    pub volume_context: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerValidateRequest {
    pub plugin_id: String,
    pub volume_id: String,
    pub capabilities: Vec<CsiCapability>,
    pub parameters: BTreeMap<String, String>,
    pub context: BTreeMap<String, String>,
    pub secrets: crate::structs::Secrets,
}

/// `ControllerCreateVolume`: `name` is the idempotency key (the volume's name), so a create
/// retried after a crash gets the volume the first attempt made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerCreateRequest {
    pub plugin_id: String,
    pub name: String,
    pub capacity_min: u64,
    pub capacity_max: u64,
    pub capabilities: Vec<CsiCapability>,
    pub mount_options: Option<CsiMountOptions>,
    pub parameters: BTreeMap<String, String>,
    pub secrets: crate::structs::Secrets,
    pub snapshot_id: String,
    pub clone_id: String,
    pub topology: Option<crate::structs::CsiTopologyRequest>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerDeleteRequest {
    pub plugin_id: String,
    pub external_id: String,
    pub secrets: crate::structs::Secrets,
}

/// A page of a plugin's listing: at most `per_page` entries (0: the plugin's choice), from
/// `next_token` (a token the plugin handed out; empty: the start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListPage {
    pub per_page: u32,
    pub next_token: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerSnapshotRequest {
    pub plugin_id: String,
    pub source_external_id: String,
    pub name: String,
    pub secrets: crate::structs::Secrets,
    pub parameters: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerDeleteSnapshotRequest {
    pub plugin_id: String,
    pub snapshot_id: String,
    pub secrets: crate::structs::Secrets,
}

/// `ListSnapshots` (with secrets) or `ListVolumes` (without).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerListRequest {
    pub plugin_id: String,
    pub page: ListPage,
    pub secrets: crate::structs::Secrets,
}

/// `ControllerExpandVolume` to at least `capacity_min` bytes (at most `capacity_max`, 0: no
/// limit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerExpandRequest {
    pub plugin_id: String,
    pub external_id: String,
    pub capacity_min: u64,
    pub capacity_max: u64,
    /// The capability the volume is in use with, if it is.
    pub capability: Option<CsiCapability>,
    pub secrets: crate::structs::Secrets,
}

/// `NodeExpandVolume` of one claim's publication on the claim's node (sent to that client).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeExpandRequest {
    pub plugin_id: String,
    pub node_id: String,
    pub namespace: String,
    pub volume_id: String,
    pub external_id: String,
    pub alloc_id: String,
    pub claim: ClaimUsage,
    pub capacity_min: u64,
    pub capacity_max: u64,
}

/// How a claim uses its volume (the client's usage directory is named after it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimUsage {
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
    pub read_only: bool,
}

/// `ClientCSI.*`: calls a server makes to a client's CSI plugins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientCsiRequest {
    ControllerAttach(ControllerAttachRequest),
    ControllerDetach(ControllerDetachRequest),
    ControllerValidate(ControllerValidateRequest),
    NodeDetach(NodeDetachRequest),
    ControllerCreate(alloc::boxed::Box<ControllerCreateRequest>),
    ControllerDelete(ControllerDeleteRequest),
    ControllerCreateSnapshot(ControllerSnapshotRequest),
    ControllerDeleteSnapshot(ControllerDeleteSnapshotRequest),
    ControllerListSnapshots(ControllerListRequest),
    ControllerListVolumes(ControllerListRequest),
    ControllerExpand(ControllerExpandRequest),
    /// Served by the client's volume manager, like `NodeDetach`.
    NodeExpand(NodeExpandRequest),
}

impl ClientCsiRequest {
    pub fn plugin_id(&self) -> &str {
        match self {
            ClientCsiRequest::ControllerAttach(request) => &request.plugin_id,
            ClientCsiRequest::ControllerDetach(request) => &request.plugin_id,
            ClientCsiRequest::ControllerValidate(request) => &request.plugin_id,
            ClientCsiRequest::NodeDetach(request) => &request.plugin_id,
            ClientCsiRequest::ControllerCreate(request) => &request.plugin_id,
            ClientCsiRequest::ControllerDelete(request) => &request.plugin_id,
            ClientCsiRequest::ControllerCreateSnapshot(request) => &request.plugin_id,
            ClientCsiRequest::ControllerDeleteSnapshot(request) => &request.plugin_id,
            ClientCsiRequest::ControllerListSnapshots(request) => &request.plugin_id,
            ClientCsiRequest::ControllerListVolumes(request) => &request.plugin_id,
            ClientCsiRequest::ControllerExpand(request) => &request.plugin_id,
            ClientCsiRequest::NodeExpand(request) => &request.plugin_id,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientCsiReply {
    Done,
    Attached {
        publish_context: BTreeMap<String, String>,
    },
    /// What `ControllerCreateVolume` made.
    Created {
        external_id: String,
        capacity: u64,
        context: BTreeMap<String, String>,
        topologies: Vec<crate::structs::CsiTopology>,
    },
    /// What `ControllerCreateSnapshot` made.
    Snapshot(CsiSnapshot),
    Snapshots {
        snapshots: Vec<CsiSnapshot>,
        next_token: String,
    },
    Volumes {
        volumes: Vec<CsiExternalVolume>,
        next_token: String,
    },
    /// `ControllerExpandVolume` or `NodeExpandVolume` done: the volume's capacity now, and
    /// (controller only) whether every node publishing it must expand it too.
    Expanded {
        capacity: u64,
        node_expansion_required: bool,
    },
}

/// Nomad's `JobDispatchRequest` (see [`ServerRequest::JobDispatch`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDispatchRequest {
    pub namespace: String,
    pub job_id: String,
    pub payload: Vec<u8>,
    pub meta: BTreeMap<String, String>,
    pub idempotency_token: String,
}

/// An operator's request that the leader's server machine answers (it owns the Raft
/// configuration and gossip, which the write endpoints do not see).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorRequest {
    /// `Operator.RaftRemovePeerByID` (the HTTP layer resolves `?address=` to an id).
    RemovePeer { id: u64 },
    /// `agent force-leave`: a failed server marked left, and removed from Raft.
    ForceLeave { node: String, prune: bool },
}

/// A driver's failure, as the endpoint that was waiting on it answers: its kind kept, retryable
/// when it may pass by itself.
impl From<crate::error::Failure> for RpcError {
    fn from(failure: crate::error::Failure) -> Self {
        let retryable = matches!(failure.kind, ErrorKind::Unavailable | ErrorKind::Busy);
        RpcError::new(failure.kind, failure.message, retryable)
    }
}
