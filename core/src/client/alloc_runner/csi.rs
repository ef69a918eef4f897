//! The `csi_hook`'s volume half: which CSI volumes the group requests, the claim (retried
//! while the answer says a retry can help), the mount through the node plugin's volume
//! manager, restoring instead of claiming again, and each volume's release in postrun.

use super::*;

impl AllocRunner {
    pub(super) fn csi_requests(&self) -> Vec<(String, VolumeRequest)> {
        self.spec
            .group
            .volumes
            .iter()
            .filter(|(_, request)| request.volume_type == VolumeType::Csi)
            .map(|(alias, request)| (alias.clone(), request.clone()))
            .collect()
    }

    pub(super) fn csi_prerun(&mut self, now: Instant, ops: &mut OpIds) -> HookProgress {
        let requests = self.csi_requests();
        if requests.is_empty() {
            return HookProgress::Done;
        }
        if self.csi.is_none() {
            if let Err(why) = self.csi_check(&requests) {
                return HookProgress::Failed(why);
            }
            self.csi = Some(CsiStep::Restore { index: 0 });
            self.claim_give_up_at = Some(now + CLAIM_RETRY_CAP);
        }
        loop {
            let progress = match self.csi.clone().expect("set above") {
                CsiStep::Restore { index } => self.csi_restore_step(index, &requests, ops),
                CsiStep::Claim { index } => self.csi_claim_step(index, &requests, ops),
                CsiStep::Mount { index } => self.csi_mount_step(index, &requests, ops),
            };
            if let Some(progress) = progress {
                return progress;
            }
        }
    }

    /// Before the first claim: some task can take a mount, and every volume ID is one path
    /// component.
    fn csi_check(&self, requests: &[(String, VolumeRequest)]) -> Result<(), String> {
        let supports = self.spec.group.tasks.iter().any(|task| {
            self.spec
                .drivers
                .get(&task.driver)
                .is_some_and(|caps| caps.mount_configs != MountConfigSupport::None)
        });
        if !supports {
            return Err("no task supports CSI".into());
        }
        for (alias, request) in requests {
            let volume_id = request.source_for(self.spec.alloc.index());
            if let Err(error) = paths::check_component("volume ID", &volume_id) {
                return Err(format!("volume {alias}: {error}"));
            }
        }
        Ok(())
    }

    /// After an agent restart: ask whether the volume `index` is still mounted. `None` when
    /// the step moved on without I/O.
    fn csi_restore_step(
        &mut self,
        index: usize,
        requests: &[(String, VolumeRequest)],
        ops: &mut OpIds,
    ) -> Option<HookProgress> {
        let Some((alias, _)) = requests.get(index) else {
            self.csi = Some(CsiStep::Claim { index: 0 });
            return None;
        };
        let Some(stub) = self.local.csi_stubs.get(alias) else {
            self.csi = Some(CsiStep::Restore { index: index + 1 });
            return None;
        };
        let Some(mount) = stub.mount.clone() else {
            // Claimed but not mounted before the restart: the claim's answer (the volume and
            // its publish context) was not kept, so claim again; the stub stays for postrun.
            self.reclaim.insert(alias.clone());
            self.csi = Some(CsiStep::Restore { index: index + 1 });
            return None;
        };
        let check = VolumeOp::HasMount {
            plugin_id: stub.plugin_id.clone(),
            namespace: stub.namespace.clone(),
            volume_id: stub.volume_id.clone(),
            alloc_id: self.spec.alloc.id.clone(),
            usage: stub.usage.clone(),
            mount,
        };
        Some(self.request(ops, Io::Volume(check)))
    }

    /// Claim the volume `index` unless a stub says it is claimed already.
    fn csi_claim_step(
        &mut self,
        index: usize,
        requests: &[(String, VolumeRequest)],
        ops: &mut OpIds,
    ) -> Option<HookProgress> {
        let Some((alias, request)) = requests.get(index) else {
            self.csi = Some(CsiStep::Mount { index: 0 });
            return None;
        };
        if self.local.csi_stubs.contains_key(alias) && !self.reclaim.contains(alias) {
            self.csi = Some(CsiStep::Claim { index: index + 1 });
            return None;
        }
        let claim = CsiVolumeClaim {
            allocation_id: self.spec.alloc.id.clone(),
            node_id: self.spec.node_id.clone(),
            external_node_id: String::new(),
            mode: if request.read_only {
                ClaimMode::Read
            } else {
                ClaimMode::Write
            },
            access_mode: request.access_mode,
            attachment_mode: request.attachment_mode,
            state: ClaimState::Taken,
        };
        let io = Io::Server(ServerRequest::VolumeClaim {
            secret_id: String::new(),
            namespace: self.spec.alloc.namespace.clone(),
            volume_id: request.source_for(self.spec.alloc.index()),
            claim,
        });
        Some(self.request(ops, io))
    }

    /// Mount the volume `index` through its plugin unless it is mounted; after the last, hand
    /// the mounts to the task hooks.
    fn csi_mount_step(
        &mut self,
        index: usize,
        requests: &[(String, VolumeRequest)],
        ops: &mut OpIds,
    ) -> Option<HookProgress> {
        let Some((alias, _)) = requests.get(index) else {
            self.resources.csi_mounts = self
                .local
                .csi_stubs
                .iter()
                .filter_map(|(alias, stub)| stub.mount.clone().map(|mount| (alias.clone(), mount)))
                .collect();
            self.csi = None;
            return Some(HookProgress::Done);
        };
        let stub = &self.local.csi_stubs[alias];
        if stub.mount.is_some() {
            self.csi = Some(CsiStep::Mount { index: index + 1 });
            return None;
        }
        let Some((volume, publish_context)) = self.claimed.get(alias).cloned() else {
            return Some(HookProgress::Failed(format!("volume {alias} was not claimed")));
        };
        if !stub.mount_attempted {
            if let Some(stub) = self.local.csi_stubs.get_mut(alias) {
                stub.mount_attempted = true;
            }
            self.persist();
        }
        let stub = &self.local.csi_stubs[alias];
        let io = Io::Volume(VolumeOp::Mount {
            plugin_id: stub.plugin_id.clone(),
            volume,
            alloc_id: self.spec.alloc.id.clone(),
            usage: stub.usage.clone(),
            publish_context,
        });
        Some(self.request(ops, io))
    }

    /// The outcome of the CSI hook's current step.
    pub(super) fn csi_outcome(&mut self, now: Instant, outcome: Outcome) -> PrerunVerdict {
        let requests = self.csi_requests();
        match self.csi.clone() {
            Some(CsiStep::Restore { index }) => {
                let alias = &requests[index].0;
                if !matches!(outcome, Ok(Reply::Bool(true))) {
                    // Gone (or unknown): claim and mount it again. The stub stays until the
                    // claim succeeds: the run before the restart may have been stopped between
                    // unpublish and unstage, and if this claim is refused, postrun's unmount is
                    // what unstages the volume.
                    self.reclaim.insert(alias.clone());
                }
                self.csi = Some(CsiStep::Restore { index: index + 1 });
                PrerunVerdict::Advance
            }
            Some(CsiStep::Claim { index }) => {
                let (alias, request) = &requests[index];
                self.csi_claim_outcome(now, index, alias, request, outcome)
            }
            Some(CsiStep::Mount { index }) => {
                let alias = requests[index].0.clone();
                match outcome {
                    Ok(Reply::Mounted(info)) => {
                        if let Some(stub) = self.local.csi_stubs.get_mut(&alias) {
                            stub.mount = Some(info);
                        }
                        self.persist();
                        self.csi = Some(CsiStep::Mount { index: index + 1 });
                        PrerunVerdict::Advance
                    }
                    Ok(reply) => PrerunVerdict::Failed(format!("mount {alias}: unexpected reply {reply:?}")),
                    Err(error) => PrerunVerdict::Failed(format!("mount volume {alias}: {error}")),
                }
            }
            None => PrerunVerdict::Advance,
        }
    }

    /// The servers' answer to a claim: a stub persisted, or a retry while the answer says
    /// one can help and the retry cap is not reached.
    fn csi_claim_outcome(
        &mut self,
        now: Instant,
        index: usize,
        alias: &str,
        request: &VolumeRequest,
        outcome: Outcome,
    ) -> PrerunVerdict {
        let mode = if request.read_only {
            ClaimMode::Read
        } else {
            ClaimMode::Write
        };
        let (message, retryable) = match outcome {
            Ok(Reply::Server(ServerReply::Claimed {
                volume,
                publish_context,
                ..
            })) => {
                let stub = CsiVolumeStub {
                    volume_id: volume.id.clone(),
                    namespace: volume.namespace.clone(),
                    remote_id: volume.remote_id().to_string(),
                    plugin_id: volume.plugin_id.clone(),
                    mode,
                    usage: usage_for(request, &volume.mount_options, &volume),
                    mount: None,
                    // What a mount before a restart may have left is still to be unmounted.
                    mount_attempted: self
                        .local
                        .csi_stubs
                        .get(alias)
                        .is_some_and(|old| old.mount_attempted || old.mount.is_some()),
                };
                self.local.csi_stubs.insert(alias.to_string(), stub);
                self.reclaim.remove(alias);
                self.claimed.insert(alias.to_string(), (volume, publish_context));
                self.persist();
                self.claim_backoff = CLAIM_BACKOFF_START;
                self.csi = Some(CsiStep::Claim { index: index + 1 });
                return PrerunVerdict::Advance;
            }
            Ok(Reply::Server(ServerReply::Error(error))) => {
                // Server answers worth waiting out (§2.3) are retryable or `ErrorKind::Busy`: claims
                // exhausted, a volume unschedulable, and one more than Nomad's list — a volume whose plugin
                // the servers do not (yet) know healthy. That is what a claim meets right after a client
                // restart, when the allocation was placed while the agent was down and the node's
                // re-registration has not been followed by its CSI fingerprint yet; Nomad fails the
                // allocation and its reschedule policy places another 30 s later or more. Waiting it out
                // takes the volume as soon as the fingerprint lands (found by the real-client simulation,
                // seed 76 of real_clients_csi, when the servers did not reschedule at all).
                let retryable = error.retryable || error.kind == crate::error::ErrorKind::Busy;
                (error.message, retryable)
            }
            Ok(reply) => (format!("unexpected reply {reply:?}"), false),
            // The servers could not be reached at all.
            Err(error) => (format!("no servers: {error}"), true),
        };
        let message = format!("claim volume {}: {message}", request.source);
        if retryable && !self.spec.faults.no_claim_retry && self.claim_give_up_at.is_some_and(|at| now < at) {
            self.claim_retry_at = Some(now + self.claim_backoff);
            self.claim_backoff = (self.claim_backoff * 2).min(CLAIM_BACKOFF_MAX);
            return PrerunVerdict::Retry(message);
        }
        PrerunVerdict::Failed(message)
    }

    pub(super) fn release_step(&mut self, now: Instant, alias: &str, ops: &mut OpIds) {
        let Some(stub) = self.local.csi_stubs.get(alias).cloned() else {
            return;
        };
        let Some(release) = self.releases.get_mut(alias) else {
            return;
        };
        let io = match release.step {
            VolumeRelease::Unmount if stub.mount.is_some() || stub.mount_attempted => Io::Volume(VolumeOp::Unmount {
                plugin_id: stub.plugin_id.clone(),
                namespace: stub.namespace.clone(),
                volume_id: stub.volume_id.clone(),
                remote_id: stub.remote_id.clone(),
                alloc_id: self.spec.alloc.id.clone(),
                usage: stub.usage.clone(),
            }),
            VolumeRelease::Unmount | VolumeRelease::Unpublish => {
                release.step = VolumeRelease::Unpublish;
                Io::Server(ServerRequest::VolumeUnpublish {
                    secret_id: String::new(),
                    namespace: stub.namespace.clone(),
                    volume_id: stub.volume_id.clone(),
                    claim: CsiVolumeClaim {
                        allocation_id: self.spec.alloc.id.clone(),
                        node_id: self.spec.node_id.clone(),
                        external_node_id: String::new(),
                        mode: stub.mode,
                        access_mode: stub.usage.access_mode,
                        attachment_mode: stub.usage.attachment_mode,
                        state: ClaimState::Unpublishing,
                    },
                })
            }
            VolumeRelease::Done => return,
        };
        let _ = now;
        let op = ops.allocate();
        release.pending = Some(op);
        self.actions.push(AllocAction::Io { op, io });
    }

    pub(super) fn release_outcome(&mut self, now: Instant, alias: &str, outcome: Outcome, ops: &mut OpIds) {
        let Some(release) = self.releases.get_mut(alias) else {
            return;
        };
        release.pending = None;
        match release.step {
            VolumeRelease::Unmount => {
                match outcome {
                    Ok(_) => {
                        if let Some(stub) = self.local.csi_stubs.get_mut(alias) {
                            stub.mount = None;
                            stub.mount_attempted = false;
                        }
                        self.persist();
                    }
                    Err(error) if now < release.give_up_at && !self.spec.faults.no_unmount_retry => {
                        // Retried (Nomad's `unmountWithRetry`): the plugin may be restarting
                        // — after an agent restart its old instance is gone and the new one
                        // not yet registered. Nobody else would unmount it: the servers skip
                        // node detach for a node they marked down, and may have freed the
                        // claim already (found by real_clients_rolling_update, seed 32).
                        release.retry_at = Some(now + release.backoff);
                        release.backoff = (release.backoff * 2).min(CLAIM_BACKOFF_MAX);
                        self.hook_event(AllocHook::Csi, "postrun-retry", Err(format!("{alias}: {error}")));
                        return;
                    }
                    Err(error) => {
                        // Given up: recorded; the servers' node detach is the last resort.
                        self.hook_event(AllocHook::Csi, "postrun-unmount", Err(format!("{alias}: {error}")));
                    }
                }
                if let Some(release) = self.releases.get_mut(alias) {
                    release.step = VolumeRelease::Unpublish;
                    release.backoff = CLAIM_BACKOFF_START;
                }
                self.release_step(now, alias, ops);
            }
            VolumeRelease::Unpublish => {
                let retry = match &outcome {
                    Ok(Reply::Server(ServerReply::Done { .. })) => None,
                    Ok(Reply::Server(ServerReply::Error(error))) => Some((error.message.clone(), error.retryable)),
                    Ok(reply) => Some((format!("unexpected reply {reply:?}"), false)),
                    Err(error) => Some((format!("no servers: {error}"), true)),
                };
                match retry {
                    Some((message, true)) if now < release.give_up_at => {
                        release.retry_at = Some(now + release.backoff);
                        release.backoff = (release.backoff * 2).min(CLAIM_BACKOFF_MAX);
                        self.hook_event(AllocHook::Csi, "postrun-retry", Err(format!("{alias}: {message}")));
                    }
                    other => {
                        release.step = VolumeRelease::Done;
                        if let Some((message, _)) = other {
                            self.hook_event(AllocHook::Csi, "postrun-unpublish", Err(format!("{alias}: {message}")));
                        }
                        self.local.csi_stubs.remove(alias);
                        self.persist();
                        self.advance_postrun(now, ops);
                    }
                }
            }
            VolumeRelease::Done => {}
        }
    }
}

/// How this allocation uses the volume: read-only and modes from the request (the volume's
/// modes when the request has none), mount options merged per field with the request winning.
fn usage_for(
    request: &VolumeRequest,
    volume_options: &Option<CsiMountOptions>,
    volume: &crate::structs::CsiVolume,
) -> UsageOptions {
    let mut fs_type = volume_options.as_ref().map(|o| o.fs_type.clone()).unwrap_or_default();
    let mut mount_flags = volume_options
        .as_ref()
        .map(|o| o.mount_flags.clone())
        .unwrap_or_default();
    if let Some(options) = &request.mount_options {
        if !options.fs_type.is_empty() {
            fs_type = options.fs_type.clone();
        }
        if !options.mount_flags.is_empty() {
            mount_flags = options.mount_flags.clone();
        }
    }
    UsageOptions {
        read_only: request.read_only,
        attachment_mode: if request.attachment_mode == Default::default() {
            volume.attachment_mode
        } else {
            request.attachment_mode
        },
        access_mode: if request.access_mode == Default::default() {
            volume.access_mode
        } else {
            request.access_mode
        },
        fs_type,
        mount_flags,
    }
}
