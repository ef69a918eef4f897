//! The `network` alloc hook (Nomad's `network` hook): a group with `network { mode =
//! "bridge" }` gets one network namespace its tasks share, made by the tasks' driver before
//! any task starts (the docker driver: a pause container with the group's ports published
//! from the host), and removed in postrun once every task is gone. What was made is persisted,
//! so a restarted agent asks for it again (the driver answers the existing one) and removes
//! it when the allocation ends. Host-mode groups (the default) need nothing.

use super::*;
use crate::client::{AllocNetwork, Reply};

impl AllocRunner {
    /// Whether the group has a network of its own (`mode = "bridge"`).
    pub fn has_own_network(&self) -> bool {
        self.bridge()
    }

    /// Whether the group asks for a namespace of its own.
    fn bridge(&self) -> bool {
        self.spec
            .group
            .networks
            .first()
            .is_some_and(|network| network.mode == "bridge")
    }

    /// The driver that makes the namespace: the group's tasks' (validation allows bridge
    /// mode only when they all use one that can).
    fn network_driver(&self) -> String {
        self.spec
            .group
            .tasks
            .first()
            .map(|task| task.driver.clone())
            .unwrap_or_default()
    }

    pub(super) fn network_prerun(&mut self, ops: &mut OpIds) -> HookProgress {
        if !self.bridge() || self.network_requested {
            return HookProgress::Done;
        }
        self.network_requested = true;
        let io = Io::CreateNetwork {
            alloc_id: self.spec.alloc.id.clone(),
            driver: self.network_driver(),
            ports: self.spec.alloc.resources.ports.clone(),
        };
        self.request(ops, io)
    }

    pub(super) fn network_outcome(&mut self, outcome: Outcome) -> PrerunVerdict {
        match outcome {
            Ok(Reply::Network(network)) => {
                self.set_network(Some(network));
                PrerunVerdict::Advance
            }
            Ok(other) => PrerunVerdict::Failed(format!("unexpected reply {other:?}")),
            // Nomad's text.
            Err(error) => PrerunVerdict::Failed(format!("failed to configure networking for alloc: {error}")),
        }
    }

    fn set_network(&mut self, network: Option<AllocNetwork>) {
        if self.local.network != network {
            self.local.network = network.clone();
            self.persist();
        }
        for runner in self.tasks.values_mut() {
            runner.set_network(network.clone());
        }
    }

    /// Postrun: removes the namespace, if one was made; `true` once nothing is left to do.
    pub(super) fn network_postrun(&mut self, ops: &mut OpIds) -> bool {
        if self.network_op.is_some() {
            return false;
        }
        let Some(network) = self.local.network.clone() else {
            return true;
        };
        let op = ops.allocate();
        self.network_op = Some(op);
        self.actions.push(AllocAction::Io {
            op,
            io: Io::DestroyNetwork {
                alloc_id: self.spec.alloc.id.clone(),
                network,
            },
        });
        false
    }

    /// The removal answered. A failure is told and the namespace forgotten: the driver's
    /// orphan sweep removes what is left of it.
    pub(super) fn network_removed(&mut self, outcome: Outcome) {
        if let Err(error) = outcome {
            self.hook_event(AllocHook::Network, "postrun", Err(error.to_string()));
        }
        self.set_network(None);
    }
}
