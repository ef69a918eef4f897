//! Volume requests: each node plugin's volume manager, the wait for a plugin that has not
//! registered yet, and the servers' node detach served through the same manager.

use super::*;

impl Client {
    pub(super) fn submit_volume(&mut self, now: Instant, request: OpId, plugin: String, op: VolumeOp) {
        match self.volumes.get_mut(&plugin) {
            Some(manager) => {
                manager.submit(now, request, op, &mut self.ops);
                self.collect_volume(now, &plugin);
            }
            None => self.waiting.push((request, plugin, op, now + PLUGIN_WAIT)),
        }
    }

    pub(super) fn collect_volume(&mut self, now: Instant, plugin: &str) {
        loop {
            let Some(manager) = self.volumes.get_mut(plugin) else {
                return;
            };
            let Some(action) = manager.poll_action() else { return };
            match action {
                VolumeAction::Io { op, io } => {
                    self.routes.insert(op, Route::Volume(plugin.to_string()));
                    self.actions.push_back(ClientAction::Io { op, io });
                }
                VolumeAction::NodeEvent(event) => self.node_event(now, event),
                VolumeAction::Reply { request, outcome } => self.volume_reply(now, request, outcome),
            }
        }
    }

    pub(super) fn volume_reply(&mut self, now: Instant, request: OpId, outcome: Outcome) {
        match self.requesters.remove(&request) {
            Some(VolumeRequester::Alloc(id)) => {
                if let Some(runner) = self.allocs.get_mut(&id) {
                    runner.outcome(now, request, outcome, &mut self.ops);
                    self.collect(now, &id);
                }
            }
            Some(VolumeRequester::NodeDetach(req)) => {
                self.actions.push_back(ClientAction::NodeDetached {
                    req,
                    result: outcome.map(|_| ()).map_err(Into::into),
                });
            }
            Some(VolumeRequester::NodeExpand(req)) => {
                let result = match outcome {
                    Ok(Reply::Csi(CsiReply::Expanded { capacity })) => Ok(capacity),
                    Ok(_) => Ok(0),
                    Err(error) => Err(error.into()),
                };
                self.actions.push_back(ClientAction::NodeExpanded { req, result });
            }
            None => {}
        }
    }

    /// The usage directory an allocation's claim of a volume lives under: as the allocation
    /// mounted it, or (the allocation gone) from the modes the server names.
    fn claim_usage(&self, alloc_id: &str, namespace: &str, volume_id: &str, fallback: UsageOptions) -> UsageOptions {
        self.allocs
            .get(alloc_id)
            .and_then(|runner| {
                runner
                    .local()
                    .csi_stubs
                    .values()
                    .find(|stub| stub.volume_id == volume_id && stub.namespace == namespace)
                    .map(|stub| stub.usage.clone())
            })
            .unwrap_or(fallback)
    }

    pub(super) fn node_expand(&mut self, now: Instant, req: u64, request: crate::rpc::NodeExpandRequest) {
        let op = self.ops.allocate();
        self.requesters.insert(op, VolumeRequester::NodeExpand(req));
        let fallback = UsageOptions {
            read_only: request.claim.read_only,
            attachment_mode: request.claim.attachment_mode,
            access_mode: request.claim.access_mode,
            fs_type: String::new(),
            mount_flags: Vec::new(),
        };
        let usage = self.claim_usage(&request.alloc_id, &request.namespace, &request.volume_id, fallback);
        let volume_op = VolumeOp::Expand {
            plugin_id: request.plugin_id.clone(),
            namespace: request.namespace,
            volume_id: request.volume_id,
            remote_id: request.external_id,
            alloc_id: request.alloc_id,
            usage,
            capacity_min: request.capacity_min,
            capacity_max: request.capacity_max,
        };
        self.submit_volume(now, op, request.plugin_id, volume_op);
    }

    pub(super) fn node_detach(&mut self, now: Instant, req: u64, request: NodeDetachRequest) {
        let op = self.ops.allocate();
        self.requesters.insert(op, VolumeRequester::NodeDetach(req));
        // The alloc may be long gone: the usage directory names only modes.
        let fallback = UsageOptions {
            read_only: request.read_only,
            attachment_mode: request.attachment_mode,
            access_mode: request.access_mode,
            fs_type: String::new(),
            mount_flags: Vec::new(),
        };
        let usage = self.claim_usage(
            &request.alloc_id,
            &request.volume_namespace,
            &request.volume_id,
            fallback,
        );
        let remote_id = if request.external_id.is_empty() {
            request.volume_id.clone()
        } else {
            request.external_id.clone()
        };
        let volume_op = VolumeOp::Unmount {
            plugin_id: request.plugin_id.clone(),
            namespace: request.volume_namespace.clone(),
            volume_id: request.volume_id.clone(),
            remote_id,
            alloc_id: request.alloc_id.clone(),
            usage,
        };
        self.submit_volume(now, op, request.plugin_id, volume_op);
    }
}
