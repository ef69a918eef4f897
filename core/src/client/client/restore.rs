//! What a client brings back from an earlier run of the agent: the connection to the servers
//! that restores its records once the node is registered, the plugin registry, every
//! allocation's runner, the volume users those allocations were, and its device reservations.

use super::*;

/// An allocation restored as a user of a volume (see `Client::restored_users`).
#[derive(Debug)]
pub(super) struct RestoredUser {
    plugin_id: String,
    namespace: String,
    volume_id: String,
    usage: UsageOptions,
    alloc_id: String,
}

impl Client {
    /// Links the client to the servers: registers `node` (until a server takes it), then
    /// heartbeats and syncs allocations on its own. `registry` and `saved` (the records of an
    /// earlier run) are restored once the node is registered: a registration replaces the node
    /// record, so a report that landed before it would be wiped.
    pub fn connect(&mut self, now: Instant, node: Node, registry: Registry, saved: Vec<SavedAlloc>) {
        self.cadences.start(now, cadences::Fingerprint::Drivers);
        self.pending_restore = Some((registry, saved));
        self.node_env = Arc::new(NodeEnv {
            node: node.clone(),
            region: self.settings.region.clone(),
        });
        self.link.connect(now, node);
        self.drive_link(now);
    }

    /// The device instances an earlier run of the agent handed out (persisted with
    /// `ClientAction::PersistDevices`): they stay taken.
    pub fn restore_devices(&mut self, reserved: DeviceReservations) {
        self.devices.restore(reserved);
    }

    pub(super) fn persist_devices(&mut self) {
        self.actions.push_back(ClientAction::PersistDevices(Box::new(
            self.devices.reservations().clone(),
        )));
    }

    /// Rebuilds the client from what it persisted before an agent restart: the registry (so
    /// volumes can be unmounted) and every allocation's runner state.
    pub fn restore(&mut self, now: Instant, registry: Registry, allocs: Vec<SavedAlloc>) {
        if !allocs.is_empty() {
            tracing::info!(allocs = allocs.len(), "restoring allocations from the client state");
        }
        for info in [PluginKind::CsiController, PluginKind::CsiNode]
            .into_iter()
            .flat_map(|kind| registry.list(kind).into_iter().cloned().collect::<Vec<_>>())
        {
            self.registry.register(info).ok();
        }
        self.restored_users = allocs
            .iter()
            .flat_map(|(alloc, _, local, _)| {
                local
                    .csi_stubs
                    .values()
                    .filter(|stub| stub.mount.is_some())
                    .map(|stub| RestoredUser {
                        plugin_id: stub.plugin_id.clone(),
                        namespace: stub.namespace.clone(),
                        volume_id: stub.volume_id.clone(),
                        usage: stub.usage.clone(),
                        alloc_id: alloc.id.clone(),
                    })
            })
            .collect();
        self.drain_registry(now);
        self.seed_restored_users();
        let newest = allocs.iter().map(|(alloc, ..)| alloc.modify_index).max();
        if let Some(newest) = newest.filter(|_| !self.settings.faults.trust_lagging_first_sync) {
            self.link.known_as_of(newest);
        }
        for (alloc, job, local, tasks) in allocs {
            let Some(spec) = self.spec(&alloc, &job) else { continue };
            let mut runner = AllocRunner::restore(spec, local, tasks, self.servers_contacted);
            runner.run(now, &mut self.ops);
            self.allocs.insert(alloc.id.clone(), runner);
            self.collect(now, &alloc.id);
        }
    }

    /// Hands restored volume users to the volume managers that exist now.
    pub(super) fn seed_restored_users(&mut self) {
        let volumes = &mut self.volumes;
        self.restored_users.retain(|user| {
            let Some(manager) = volumes.get_mut(&user.plugin_id) else {
                return true;
            };
            manager.add_user(&user.namespace, &user.volume_id, &user.usage, &user.alloc_id);
            false
        });
    }
}
