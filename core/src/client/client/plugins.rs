//! The client's plugins: the dynamic registry's updates, one fingerprinting instance per
//! CSI plugin (probe, capabilities, node info, every 30 s) and the driver fingerprints.

use super::*;

impl Client {
    pub(super) fn persist_registry(&mut self) {
        self.actions
            .push_back(ClientAction::PersistRegistry(Box::new(self.registry.clone())));
    }

    /// Starts, replaces or stops instance managers as registrations come and go.
    pub(super) fn drain_registry(&mut self, now: Instant) {
        while let Some(event) = self.registry.poll_update() {
            let (kind, name) = match &event {
                RegistryEvent::Registered(info) | RegistryEvent::Deregistered(info) => (info.kind, info.name.clone()),
            };
            match self.registry.get(kind, &name).cloned() {
                Some(info) => {
                    let replace = self
                        .instances
                        .get(&(kind, name.clone()))
                        .is_none_or(|instance| instance.info.alloc_id != info.alloc_id);
                    if replace {
                        self.instances.insert(
                            (kind, name.clone()),
                            Instance {
                                info,
                                step: None,
                                pending: None,
                                next_at: Some(now),
                                basic: None,
                                node_info: None,
                                healthy: false,
                                error: None,
                                controller: None,
                            },
                        );
                        self.start_fingerprint(now, kind, &name);
                    }
                }
                None => {
                    self.instances.remove(&(kind, name.clone()));
                    let map = match kind {
                        PluginKind::CsiController => &mut self.node_controllers,
                        PluginKind::CsiNode => &mut self.node_plugins,
                    };
                    if map.remove(&name).is_some() {
                        self.push_csi_info(now);
                    }
                }
            }
        }
    }

    pub(super) fn start_fingerprint(&mut self, now: Instant, kind: PluginKind, name: &str) {
        let Some(instance) = self.instances.get_mut(&(kind, name.to_string())) else {
            return;
        };
        if instance.pending.is_some() {
            return;
        }
        instance.next_at = None;
        instance.step = Some(if instance.basic.is_none() {
            FingerprintStep::Capabilities
        } else {
            FingerprintStep::Probe
        });
        self.fingerprint_call(now, kind, name);
    }

    pub(super) fn fingerprint_call(&mut self, now: Instant, kind: PluginKind, name: &str) {
        let Some(instance) = self.instances.get_mut(&(kind, name.to_string())) else {
            return;
        };
        let call = match instance.step {
            Some(FingerprintStep::Capabilities) => CsiCall::GetPluginCapabilities,
            Some(FingerprintStep::NodeInfo) => CsiCall::NodeGetInfo,
            Some(FingerprintStep::Probe) => CsiCall::Probe,
            Some(FingerprintStep::ServiceCapabilities) => match kind {
                PluginKind::CsiController => CsiCall::ControllerGetCapabilities,
                PluginKind::CsiNode => CsiCall::NodeGetCapabilities,
            },
            None => return,
        };
        let op = self.ops.allocate();
        instance.pending = Some((op, now + FINGERPRINT_TIMEOUT));
        let socket = instance.info.socket_path.clone();
        self.routes.insert(op, Route::Instance(kind, name.to_string()));
        self.actions.push_back(ClientAction::Io {
            op,
            io: Io::Csi { socket, call },
        });
    }

    pub(super) fn fingerprint_outcome(
        &mut self,
        now: Instant,
        kind: PluginKind,
        name: &str,
        op: OpId,
        outcome: Outcome,
    ) {
        let Some(instance) = self.instances.get_mut(&(kind, name.to_string())) else {
            return;
        };
        if instance.pending.map(|(pending, _)| pending) != Some(op) {
            return;
        }
        instance.pending = None;
        let step = instance.step.clone();
        let next = match (step, outcome) {
            (
                Some(FingerprintStep::Capabilities),
                Ok(Reply::Csi(CsiReply::PluginCapabilities {
                    controller_service,
                    accessibility_constraints,
                })),
            ) => {
                instance.basic = Some((controller_service, accessibility_constraints));
                Ok(match kind {
                    PluginKind::CsiNode => FingerprintStep::NodeInfo,
                    PluginKind::CsiController => FingerprintStep::Probe,
                })
            }
            (
                Some(FingerprintStep::NodeInfo),
                Ok(Reply::Csi(CsiReply::NodeInfo {
                    node_id,
                    max_volumes,
                    topology,
                })),
            ) => {
                instance.node_info = Some(CsiNodeInfo {
                    id: node_id,
                    // 0 means unlimited (#7583).
                    max_volumes: if max_volumes == 0 { i64::MAX as u64 } else { max_volumes },
                    accessible_topology: topology,
                    ..CsiNodeInfo::default()
                });
                Ok(FingerprintStep::Probe)
            }
            (Some(FingerprintStep::Probe), Ok(Reply::Csi(CsiReply::Probe { ready }))) => {
                instance.healthy = ready;
                Ok(FingerprintStep::ServiceCapabilities)
            }
            (Some(FingerprintStep::ServiceCapabilities), Ok(Reply::Csi(CsiReply::ControllerCapabilities(info)))) => {
                instance.controller = Some(info);
                Err(None)
            }
            (
                Some(FingerprintStep::ServiceCapabilities),
                Ok(Reply::Csi(CsiReply::NodeCapabilities {
                    stage_unstage,
                    stats,
                    expand,
                    condition,
                })),
            ) => {
                if let Some(node) = &mut instance.node_info {
                    node.requires_node_stage_volume = stage_unstage;
                    node.supports_stats = stats;
                    node.supports_expand = expand;
                    node.supports_condition = condition;
                }
                Err(None)
            }
            (step, other) => {
                let message = match other {
                    Err(error) => error.message,
                    Ok(reply) => format!("unexpected reply {reply:?}"),
                };
                instance.healthy = false;
                if matches!(step, Some(FingerprintStep::Capabilities | FingerprintStep::NodeInfo)) {
                    instance.basic = None;
                    Err(Some(format!("failed initial fingerprint with err: {message}")))
                } else {
                    Err(Some(message))
                }
            }
        };
        match next {
            Ok(step) => {
                instance.step = Some(step);
                self.fingerprint_call(now, kind, name);
            }
            Err(error) => {
                instance.step = None;
                instance.error = error;
                instance.next_at = Some(now + FINGERPRINT_INTERVAL);
                self.fingerprinted(now, kind, name);
            }
        }
    }

    /// A fingerprint round finished: update the node's CSI info, create the node plugin's
    /// volume manager after its first success, and tell the servers about changes.
    pub(super) fn fingerprinted(&mut self, now: Instant, kind: PluginKind, name: &str) {
        let Some(instance) = self.instances.get(&(kind, name.to_string())) else {
            return;
        };
        let healthy = instance.healthy && instance.error.is_none();
        let (controller_required, topologies) = instance.basic.unwrap_or_default();
        let info = CsiInfo {
            plugin_id: name.to_string(),
            alloc_id: instance.info.alloc_id.clone(),
            healthy,
            health_description: match &instance.error {
                Some(error) => error.clone(),
                None if healthy => "healthy".into(),
                None => "unhealthy".into(),
            },
            update_time_ms: 0,
            provider: instance.info.provider.clone(),
            provider_version: instance.info.version.clone(),
            requires_controller_plugin: controller_required,
            requires_topologies: topologies,
            controller_info: (kind == PluginKind::CsiController)
                .then(|| instance.controller.clone().unwrap_or_default()),
            node_info: (kind == PluginKind::CsiNode).then(|| instance.node_info.clone().unwrap_or_default()),
        };
        if kind == PluginKind::CsiNode
            && healthy
            && let Some(node) = &instance.node_info
        {
            let mounts = PluginMounts {
                plugin_id: name.to_string(),
                socket: instance.info.socket_path.clone(),
                mount_root: instance.info.mount_point.clone(),
                container_mount_point: instance.info.container_mount_point.clone(),
                requires_stage: node.requires_node_stage_volume,
            };
            match self.volumes.get_mut(name) {
                Some(manager) => manager.set_plugin(mounts),
                None => {
                    self.volumes.insert(name.to_string(), VolumeManager::new(mounts));
                    self.seed_restored_users();
                }
            }
            // Requests that waited for this plugin go now.
            let (ready, rest): (Vec<_>, Vec<_>) = core::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|(_, plugin, _, _)| plugin == name);
            self.waiting = rest;
            for (request, plugin, op, _) in ready {
                self.submit_volume(now, request, plugin, op);
            }
        }
        let map = match kind {
            PluginKind::CsiController => &mut self.node_controllers,
            PluginKind::CsiNode => &mut self.node_plugins,
        };
        let previous = map.insert(name.to_string(), info.clone());
        if previous.as_ref() != Some(&info) {
            if previous.as_ref().map(|old| old.healthy) != Some(info.healthy) {
                let mut details = BTreeMap::new();
                details.insert("plugin".to_string(), name.to_string());
                details.insert("type".to_string(), kind.as_str().to_string());
                self.node_event(
                    now,
                    ClientNodeEvent {
                        subsystem: "CSI".into(),
                        message: info.health_description.clone(),
                        details,
                    },
                );
            }
            self.push_csi_info(now);
        }
    }

    pub(super) fn push_csi_info(&mut self, now: Instant) {
        self.report(now, Report::CsiInfo);
    }

    /// A node event: traced locally and queued for the servers (`Node.EmitEvents`).
    pub(super) fn node_event(&mut self, now: Instant, event: ClientNodeEvent) {
        self.actions.push_back(ClientAction::NodeEvent(event.clone()));
        self.pending_events.push(event);
        // The servers keep only the last few; while they are unreachable, so does the queue
        // (never while a batch is in flight: its acknowledgement drains by count).
        if !self.reports_in_flight.contains_key(&Report::NodeEvents) {
            let excess = self.pending_events.len().saturating_sub(MAX_RETAINED_NODE_EVENTS);
            self.pending_events.drain(..excess);
        }
        self.report(now, Report::NodeEvents);
    }

    /// A driver fingerprint: usable while detected and healthy; a health change is a node
    /// event (subsystem `Driver`, as Nomad's driver manager raises), and the node's driver
    /// table is reported when it changed.
    /// Returns whether the driver's entry in the node's table changed.
    pub(super) fn driver_fingerprint(
        &mut self,
        now: Instant,
        name: String,
        capabilities: DriverCapabilities,
        info: DriverInfo,
    ) -> bool {
        if info.detected && info.healthy {
            self.drivers.insert(name.clone(), capabilities);
        } else {
            self.drivers.remove(&name);
        }
        let previous = self.driver_infos.insert(name.clone(), info.clone());
        let health_changed = match &previous {
            Some(old) => old.healthy != info.healthy || old.detected != info.detected,
            None => info.detected && !info.healthy,
        };
        if health_changed {
            let mut details = BTreeMap::new();
            details.insert("driver".to_string(), name);
            self.node_event(
                now,
                ClientNodeEvent {
                    subsystem: "Driver".into(),
                    message: info.health_description.clone(),
                    details,
                },
            );
        }
        previous.as_ref() != Some(&info)
    }
}
