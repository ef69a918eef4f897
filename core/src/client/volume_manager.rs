//! The volume manager of one node plugin (§1.6): mounts and unmounts CSI volumes for
//! allocations, one operation per volume at a time, with usage tracking so a staged volume is
//! unstaged only when its last user leaves.
//!
//! Mount: record usage first (a concurrent unmount then cannot unstage underneath us); when
//! the plugin has STAGE_UNSTAGE_VOLUME, mkdir the staging dir and `NodeStageVolume` unless it
//! is already a mount point; mkdir the target's parent and `NodePublishVolume` unless the
//! target is already mounted (the restore case). Unmount: `NodeUnpublishVolume`; an error is
//! downgraded when the target dir can be removed (nothing is mounted there any more); then
//! free the usage and `NodeUnstageVolume` when no other allocation uses the staged volume.
//! Host-scoped paths for mkdir and mount checks, plugin-scoped paths in every RPC (seed 002).
//! Node RPCs are retried only on timeout / unavailable / resource exhausted, three tries.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use core::time::Duration;

use crate::client::paths::{self, check_component};
use crate::client::{
    ClientNodeEvent, CsiCall, ErrorKind, Io, IoError, MountInfo, Outcome, Reply, UsageOptions, VolumeCapability,
    VolumeOp,
};
use crate::op::{OpId, OpIds};
use crate::structs::{AttachmentMode, CsiMountOptions, CsiVolume};
use crate::time::Instant;

pub const MAX_TRIES: u32 = 3;
pub const RETRY_BASE: Duration = Duration::from_millis(100);

/// What the manager needs to know about its plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginMounts {
    pub plugin_id: String,
    pub socket: String,
    /// Host path of the plugin root.
    pub mount_root: String,
    /// The plugin root as the plugin sees it.
    pub container_mount_point: String,
    pub requires_stage: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeAction {
    Io {
        op: OpId,
        io: Io,
    },
    /// The answer to a [`VolumeOp`] request.
    Reply {
        request: OpId,
        outcome: Outcome,
    },
    NodeEvent(ClientNodeEvent),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    MkdirStaging,
    CheckStaged,
    Stage,
    MkdirTarget,
    CheckPublished,
    Publish,
    Unpublish,
    RmdirTarget,
    Unstage,
    CheckMount,
    Expand,
}

#[derive(Clone, Debug)]
struct Job {
    request: OpId,
    op: VolumeOp,
    step: Step,
    tries: u32,
    pending: Option<OpId>,
    retry_at: Option<Instant>,
    /// The unpublish error, kept in case the target cannot be removed either.
    unpublish_error: Option<IoError>,
}

type VolumeKey = (String, String);

#[derive(Debug)]
pub struct VolumeManager {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    plugin: PluginMounts,
    /// (namespace, volume, usage) → allocations using it.
    usage: BTreeMap<(String, String, String), BTreeSet<String>>,
    running: BTreeMap<VolumeKey, Job>,
    queue: VecDeque<(OpId, VolumeOp)>,
    actions: Vec<VolumeAction>,
    /// (namespace, volume, usage, allocation) unmounted lately, oldest first: the servers'
    /// node detach of a claim the allocation's own unmount already released is answered at
    /// once, not unmounted (and reported) a second time.
    released: VecDeque<(String, String, String, String)>,
}

/// How many recent unmounts [`VolumeManager`] remembers.
pub const RELEASED_MEMORY: usize = 256;

fn key_of(op: &VolumeOp) -> VolumeKey {
    match op {
        VolumeOp::Mount { volume, .. } => (volume.namespace.clone(), volume.id.clone()),
        VolumeOp::Unmount {
            namespace, volume_id, ..
        } => (namespace.clone(), volume_id.clone()),
        // Mount checks touch no volume state; serialise them on their path.
        VolumeOp::HasMount {
            namespace, volume_id, ..
        }
        | VolumeOp::Expand {
            namespace, volume_id, ..
        } => (namespace.clone(), volume_id.clone()),
    }
}

impl VolumeManager {
    pub fn new(plugin: PluginMounts) -> Self {
        VolumeManager {
            clock: crate::time::Monotonic::default(),
            plugin,
            usage: BTreeMap::new(),
            running: BTreeMap::new(),
            queue: VecDeque::new(),
            actions: Vec::new(),
            released: VecDeque::new(),
        }
    }

    /// The (namespace, volume, usage, allocation) of an unmount.
    fn release_key(op: &VolumeOp) -> Option<(String, String, String, String)> {
        match op {
            VolumeOp::Unmount {
                namespace,
                volume_id,
                alloc_id,
                usage,
                ..
            } => Some((namespace.clone(), volume_id.clone(), usage.to_fs(), alloc_id.clone())),
            _ => None,
        }
    }

    /// The plugin was re-registered (a new plugin alloc, a new socket); usage is kept.
    pub fn set_plugin(&mut self, plugin: PluginMounts) {
        self.plugin = plugin;
    }

    pub fn plugin(&self) -> &PluginMounts {
        &self.plugin
    }

    /// After an agent restart: an allocation whose persisted state says it mounted the volume
    /// counts as a user until its mount check or its unmount says otherwise.
    pub fn add_user(&mut self, namespace: &str, volume_id: &str, usage: &UsageOptions, alloc_id: &str) {
        self.usage
            .entry((namespace.to_string(), volume_id.to_string(), usage.to_fs()))
            .or_default()
            .insert(alloc_id.to_string());
    }

    fn remove_user(&mut self, usage_key: &(String, String, String), alloc_id: &str) {
        if let Some(users) = self.usage.get_mut(usage_key) {
            users.remove(alloc_id);
            if users.is_empty() {
                self.usage.remove(usage_key);
            }
        }
    }

    /// Allocations using `(namespace, volume)` under any usage.
    pub fn users(&self, namespace: &str, volume_id: &str) -> BTreeSet<String> {
        self.usage
            .iter()
            .filter(|((ns, vol, _), _)| ns == namespace && vol == volume_id)
            .flat_map(|(_, allocs)| allocs.iter().cloned())
            .collect()
    }

    /// A mount, unmount or mount check; answered with `VolumeAction::Reply { request }`.
    pub fn submit(&mut self, now: Instant, request: OpId, op: VolumeOp, ops: &mut OpIds) {
        if let Err(error) = validate(&op) {
            self.actions.push(VolumeAction::Reply {
                request,
                outcome: Err(IoError::other(error)),
            });
            return;
        }
        self.queue.push_back((request, op));
        self.start_queued(now, ops);
    }

    fn start_queued(&mut self, now: Instant, ops: &mut OpIds) {
        let mut waiting = VecDeque::new();
        while let Some((request, op)) = self.queue.pop_front() {
            let key = key_of(&op);
            if self.running.contains_key(&key) {
                waiting.push_back((request, op));
                continue;
            }
            // Unmounted already, and not mounted again since: nothing to do, nothing to say.
            if let Some(release) = Self::release_key(&op)
                && self.released.contains(&release)
            {
                let (namespace, volume, usage, alloc) = &release;
                let key = (namespace.clone(), volume.clone(), usage.clone());
                if !self.usage.get(&key).is_some_and(|users| users.contains(alloc)) {
                    self.actions.push(VolumeAction::Reply {
                        request,
                        outcome: Ok(Reply::Unit),
                    });
                    continue;
                }
            }
            let step = match &op {
                VolumeOp::Mount { alloc_id, usage, .. } => {
                    // Usage first, so a concurrent unmount cannot unstage underneath us.
                    self.usage
                        .entry((key.0.clone(), key.1.clone(), usage.to_fs()))
                        .or_default()
                        .insert(alloc_id.clone());
                    if self.plugin.requires_stage {
                        Step::MkdirStaging
                    } else {
                        Step::MkdirTarget
                    }
                }
                VolumeOp::Unmount { .. } => Step::Unpublish,
                VolumeOp::HasMount { .. } => Step::CheckMount,
                VolumeOp::Expand { .. } => Step::Expand,
            };
            self.running.insert(
                key.clone(),
                Job {
                    request,
                    op,
                    step,
                    tries: 0,
                    pending: None,
                    retry_at: None,
                    unpublish_error: None,
                },
            );
            self.issue(now, &key, ops);
        }
        self.queue = waiting;
    }

    fn staging_suffix(&self, namespace: &str, volume_id: &str, usage: &UsageOptions) -> String {
        paths::staging_suffix(namespace, volume_id, &usage.to_fs())
    }

    /// Sends the I/O of the job's current step.
    fn issue(&mut self, _now: Instant, key: &VolumeKey, ops: &mut OpIds) {
        let Some(job) = self.running.get(key) else { return };
        debug_assert!(job.pending.is_none(), "volume step {:?} issued twice", job.step);
        let io = match &job.op {
            VolumeOp::Mount {
                volume,
                alloc_id,
                usage,
                publish_context,
                ..
            } => self.mount_io(volume, alloc_id, usage, publish_context, job.step),
            VolumeOp::Unmount {
                namespace,
                volume_id,
                remote_id,
                alloc_id,
                usage,
                ..
            } => self.unmount_io(namespace, volume_id, remote_id, alloc_id, usage, job.step),
            VolumeOp::HasMount { mount, .. } if job.step == Step::CheckMount => Io::IsMountPoint {
                path: mount.source.clone(),
            },
            op @ VolumeOp::Expand { .. } => self.expand_io(op),
            op => unreachable!("step {:?} for {op:?}", job.step),
        };
        let op = ops.allocate();
        if let Some(job) = self.running.get_mut(key) {
            job.pending = Some(op);
            job.tries += 1;
        }
        self.actions.push(VolumeAction::Io { op, io });
    }

    /// The I/O of one step of a mount: staging directory and stage, then target and publish.
    fn mount_io(
        &self,
        volume: &CsiVolume,
        alloc_id: &str,
        usage: &UsageOptions,
        publish_context: &BTreeMap<String, String>,
        step: Step,
    ) -> Io {
        let plugin = &self.plugin;
        let host = |suffix: &str| paths::join(&plugin.mount_root, suffix);
        let scoped = |suffix: &str| paths::join(&plugin.container_mount_point, suffix);
        let staging = self.staging_suffix(&volume.namespace, &volume.id, usage);
        let target = paths::target_suffix(alloc_id, &volume.id, &usage.to_fs());
        match step {
            Step::MkdirStaging => Io::Mkdir { path: host(&staging) },
            Step::CheckStaged => Io::IsMountPoint { path: host(&staging) },
            Step::Stage => Io::Csi {
                socket: plugin.socket.clone(),
                call: CsiCall::NodeStageVolume {
                    volume_id: volume.remote_id().to_string(),
                    publish_context: publish_context.clone(),
                    staging_target_path: scoped(&staging),
                    capability: capability(usage),
                    secrets: volume.secrets.clone(),
                    volume_context: volume.context.clone(),
                },
            },
            Step::MkdirTarget => Io::Mkdir {
                path: host(&format!("per-alloc/{alloc_id}/{}", volume.id)),
            },
            Step::CheckPublished => Io::IsMountPoint { path: host(&target) },
            Step::Publish => Io::Csi {
                socket: plugin.socket.clone(),
                call: CsiCall::NodePublishVolume {
                    volume_id: volume.remote_id().to_string(),
                    publish_context: publish_context.clone(),
                    staging_target_path: if plugin.requires_stage {
                        scoped(&staging)
                    } else {
                        String::new()
                    },
                    target_path: scoped(&target),
                    capability: capability(usage),
                    readonly: usage.read_only,
                    secrets: volume.secrets.clone(),
                    volume_context: volume.context.clone(),
                },
            },
            step => unreachable!("mount step {step:?}"),
        }
    }

    /// The I/O of one step of an unmount: unpublish and remove the target, then unstage.
    fn unmount_io(
        &self,
        namespace: &str,
        volume_id: &str,
        remote_id: &str,
        alloc_id: &str,
        usage: &UsageOptions,
        step: Step,
    ) -> Io {
        let plugin = &self.plugin;
        let target = paths::target_suffix(alloc_id, volume_id, &usage.to_fs());
        match step {
            Step::Unpublish => Io::Csi {
                socket: plugin.socket.clone(),
                call: CsiCall::NodeUnpublishVolume {
                    volume_id: remote_id.to_string(),
                    target_path: paths::join(&plugin.container_mount_point, &target),
                },
            },
            Step::RmdirTarget => Io::Rmdir {
                path: paths::join(&plugin.mount_root, &target),
            },
            Step::Unstage => Io::Csi {
                socket: plugin.socket.clone(),
                call: CsiCall::NodeUnstageVolume {
                    volume_id: remote_id.to_string(),
                    staging_target_path: paths::join(
                        &plugin.container_mount_point,
                        &self.staging_suffix(namespace, volume_id, usage),
                    ),
                },
            },
            step => unreachable!("unmount step {step:?}"),
        }
    }

    /// `NodeExpandVolume` of the allocation's publication (plugin-scoped paths).
    fn expand_io(&self, op: &VolumeOp) -> Io {
        let VolumeOp::Expand {
            namespace,
            volume_id,
            remote_id,
            alloc_id,
            usage,
            capacity_min,
            capacity_max,
            ..
        } = op
        else {
            unreachable!("expand I/O for {op:?}")
        };
        let plugin = &self.plugin;
        let scoped = |suffix: &str| paths::join(&plugin.container_mount_point, suffix);
        Io::Csi {
            socket: plugin.socket.clone(),
            call: CsiCall::NodeExpandVolume {
                volume_id: remote_id.clone(),
                volume_path: scoped(&paths::target_suffix(alloc_id, volume_id, &usage.to_fs())),
                staging_target_path: if plugin.requires_stage {
                    scoped(&self.staging_suffix(namespace, volume_id, usage))
                } else {
                    String::new()
                },
                capacity_min: *capacity_min,
                capacity_max: *capacity_max,
                capability: capability(usage),
            },
        }
    }

    pub fn outcome(&mut self, now: Instant, op: OpId, outcome: Outcome, ops: &mut OpIds) -> bool {
        let Some(key) = self
            .running
            .iter()
            .find(|(_, job)| job.pending == Some(op))
            .map(|(key, _)| key.clone())
        else {
            return false;
        };
        let job = self.running.get_mut(&key).expect("found");
        job.pending = None;
        if job.step == Step::CheckMount {
            let job = self.running.remove(&key).expect("found");
            if let VolumeOp::HasMount {
                namespace,
                volume_id,
                alloc_id,
                usage,
                ..
            } = &job.op
            {
                let usage_key = (namespace.clone(), volume_id.clone(), usage.to_fs());
                match &outcome {
                    // Still mounted after a restart: this allocation uses the volume again.
                    Ok(Reply::Bool(true)) => {
                        self.usage.entry(usage_key).or_default().insert(alloc_id.clone());
                    }
                    // Gone: it is no user (it claims and mounts again).
                    Ok(_) => self.remove_user(&usage_key, alloc_id),
                    Err(_) => {}
                }
            }
            let outcome = match outcome {
                Ok(Reply::Bool(mounted)) => Ok(Reply::Bool(mounted)),
                Ok(_) => Ok(Reply::Bool(false)),
                Err(error) => Err(error),
            };
            self.actions.push(VolumeAction::Reply {
                request: job.request,
                outcome,
            });
            self.start_queued(now, ops);
            return true;
        }
        let is_rpc = matches!(
            job.step,
            Step::Stage | Step::Publish | Step::Unpublish | Step::Unstage | Step::Expand
        );
        if let Err(error) = &outcome
            && is_rpc
            && error.is_retryable()
            && job.tries < MAX_TRIES
        {
            job.retry_at = Some(now + RETRY_BASE * (1 << (job.tries - 1)));
            return true;
        }
        if job.step == Step::Expand && (outcome.is_ok() || job.tries >= MAX_TRIES || !is_retryable(&outcome)) {
            // The plugin's answer (its capacity) goes to whoever asked, as it is.
            let job = self.running.remove(&key).expect("found");
            self.actions.push(VolumeAction::Reply {
                request: job.request,
                outcome,
            });
            self.start_queued(now, ops);
            return true;
        }
        let next = match (&job.step, outcome) {
            (Step::MkdirStaging, Ok(_)) => Ok(Some(Step::CheckStaged)),
            (Step::CheckStaged, Ok(Reply::Bool(true))) => Ok(Some(Step::MkdirTarget)),
            (Step::CheckStaged, Ok(_)) => Ok(Some(Step::Stage)),
            (Step::Stage, Ok(_)) => Ok(Some(Step::MkdirTarget)),
            (Step::MkdirTarget, Ok(_)) => Ok(Some(Step::CheckPublished)),
            (Step::CheckPublished, Ok(Reply::Bool(true))) => Ok(None),
            (Step::CheckPublished, Ok(_)) => Ok(Some(Step::Publish)),
            (Step::Publish, Ok(_)) => Ok(None),
            (Step::Unpublish, Ok(_)) => Ok(Some(Step::Unstage)),
            (Step::Unpublish, Err(error)) => {
                job.unpublish_error = Some(error);
                Ok(Some(Step::RmdirTarget))
            }
            // The target is gone: nothing is mounted there, the unpublish error is moot.
            (Step::RmdirTarget, Ok(_)) => Ok(Some(Step::Unstage)),
            (Step::RmdirTarget, Err(error)) if error.kind == ErrorKind::NotFound => Ok(Some(Step::Unstage)),
            (Step::RmdirTarget, Err(_)) => Err(job.unpublish_error.clone().expect("set before rmdir")),
            (Step::Unstage, Ok(_)) => Ok(None),
            (Step::CheckMount | Step::Expand, Ok(_)) => Ok(None),
            (_, Err(error)) => Err(error),
        };
        self.advance(now, &key, next, ops);
        true
    }

    fn advance(&mut self, now: Instant, key: &VolumeKey, next: Result<Option<Step>, IoError>, ops: &mut OpIds) {
        let mut next = next;
        // Unstage only when the plugin stages and no other allocation uses the staged volume.
        if let Ok(Some(Step::Unstage)) = next
            && let VolumeOp::Unmount {
                namespace,
                volume_id,
                alloc_id,
                usage,
                ..
            } = &self.running[key].op
        {
            let usage_key = (namespace.clone(), volume_id.clone(), usage.to_fs());
            let alloc_id = alloc_id.clone();
            self.remove_user(&usage_key, &alloc_id);
            if !self.plugin.requires_stage || self.usage.contains_key(&usage_key) {
                next = Ok(None);
            }
        }
        match next {
            Ok(Some(step)) => {
                if let Some(job) = self.running.get_mut(key) {
                    job.step = step;
                    job.tries = 0;
                }
                self.issue(now, key, ops);
            }
            Ok(None) => self.finish(now, key, Ok(()), ops),
            Err(error) => self.finish(now, key, Err(error), ops),
        }
    }

    fn finish(&mut self, now: Instant, key: &VolumeKey, result: Result<(), IoError>, ops: &mut OpIds) {
        let job = self.running.remove(key).expect("running");
        let outcome = match (&job.op, result) {
            (
                VolumeOp::Mount {
                    volume,
                    alloc_id,
                    usage,
                    ..
                },
                result,
            ) => {
                let mut details = BTreeMap::new();
                details.insert("volume_id".to_string(), volume.id.clone());
                details.insert("success".to_string(), result.is_ok().to_string());
                if let Err(error) = &result {
                    details.insert("error".to_string(), error.message.clone());
                    // A failed mount leaves no usage behind.
                    let usage_key = (volume.namespace.clone(), volume.id.clone(), usage.to_fs());
                    self.remove_user(&usage_key, alloc_id);
                }
                self.node_event("Mount volume", details);
                result.map(|()| {
                    Reply::Mounted(MountInfo {
                        source: paths::join(
                            &self.plugin.mount_root,
                            &paths::target_suffix(alloc_id, &volume.id, &usage.to_fs()),
                        ),
                        is_device: usage.attachment_mode == AttachmentMode::BlockDevice,
                    })
                })
            }
            (op @ VolumeOp::Unmount { volume_id, .. }, result) => {
                if result.is_ok()
                    && let Some(release) = Self::release_key(op)
                    && !self.released.contains(&release)
                {
                    if self.released.len() == RELEASED_MEMORY {
                        self.released.pop_front();
                    }
                    self.released.push_back(release);
                }
                let mut details = BTreeMap::new();
                details.insert("volume_id".to_string(), volume_id.clone());
                details.insert("success".to_string(), result.is_ok().to_string());
                if let Err(error) = &result {
                    details.insert("error".to_string(), error.message.clone());
                }
                self.node_event("Unmount volume", details);
                result.map(|()| Reply::Unit)
            }
            (VolumeOp::HasMount { .. }, result) => result.map(|()| Reply::Bool(false)),
            (VolumeOp::Expand { .. }, result) => result.map(|()| Reply::Unit),
        };
        self.actions.push(VolumeAction::Reply {
            request: job.request,
            outcome,
        });
        self.start_queued(now, ops);
    }

    fn node_event(&mut self, message: &str, details: BTreeMap<String, String>) {
        self.actions.push(VolumeAction::NodeEvent(ClientNodeEvent {
            subsystem: "Storage".into(),
            message: message.into(),
            details,
        }));
    }

    pub fn handle_timeout(&mut self, now: Instant, ops: &mut OpIds) {
        self.clock.observe(now);
        let due: Vec<VolumeKey> = self
            .running
            .iter()
            .filter(|(_, job)| job.retry_at.is_some_and(|at| now >= at))
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            if let Some(job) = self.running.get_mut(&key) {
                job.retry_at = None;
            }
            self.issue(now, &key, ops);
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.running.values().filter_map(|job| job.retry_at).min()
    }

    pub fn poll_action(&mut self) -> Option<VolumeAction> {
        if self.actions.is_empty() {
            None
        } else {
            Some(self.actions.remove(0))
        }
    }
}

fn capability(usage: &UsageOptions) -> VolumeCapability {
    VolumeCapability {
        access_mode: usage.access_mode,
        attachment_mode: usage.attachment_mode,
        mount_options: CsiMountOptions {
            fs_type: usage.fs_type.clone(),
            mount_flags: usage.mount_flags.clone(),
        },
    }
}

/// Ids become path components; check them before they do.
fn is_retryable(outcome: &Outcome) -> bool {
    outcome.as_ref().err().is_some_and(IoError::is_retryable)
}

fn validate(op: &VolumeOp) -> Result<(), String> {
    match op {
        VolumeOp::Expand {
            namespace,
            volume_id,
            alloc_id,
            ..
        } => {
            check_component("volume ID", volume_id)?;
            check_component("volume namespace", namespace)?;
            check_component("allocation ID", alloc_id)
        }
        VolumeOp::Mount { volume, alloc_id, .. } => {
            check_component("volume ID", &volume.id)?;
            check_component("volume namespace", &volume.namespace)?;
            check_component("allocation ID", alloc_id)
        }
        VolumeOp::Unmount {
            namespace,
            volume_id,
            alloc_id,
            ..
        } => {
            check_component("volume ID", volume_id)?;
            check_component("volume namespace", namespace)?;
            check_component("allocation ID", alloc_id)
        }
        VolumeOp::HasMount {
            namespace,
            volume_id,
            alloc_id,
            ..
        } => {
            check_component("volume ID", volume_id)?;
            check_component("volume namespace", namespace)?;
            check_component("allocation ID", alloc_id)
        }
    }
}
