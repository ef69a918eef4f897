//! Nodes in the state store: registration (keeping what belongs to the servers), status,
//! driver and CSI fingerprints, events, drains and eligibility.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, Response, ServerState, Table};
use crate::error::ErrorKind;
use alloc::collections::BTreeMap;

use crate::structs::{
    CsiInfo, DrainMetadata, DrainStrategy, DriverInfo, MAX_RETAINED_NODE_EVENTS, Node, NodeEvent, SchedulingEligibility,
};

/// Appends events to a node, stamped with the entry's time and index; the node keeps the last
/// `MAX_RETAINED_NODE_EVENTS`.
fn record_events<'a>(node: &mut Node, events: impl Iterator<Item = &'a NodeEvent>, index: u64, at_ms: u64) {
    for event in events {
        let mut event = event.clone();
        event.timestamp_ms = at_ms;
        event.create_index = index;
        node.events.push(event);
    }
    let excess = node.events.len().saturating_sub(MAX_RETAINED_NODE_EVENTS);
    node.events.drain(..excess);
}

/// Nomad's node event messages for drains and eligibility.
pub const DRAIN_SET_EVENT: &str = "Node drain strategy set";
pub const DRAIN_UPDATED_EVENT: &str = "Node drain strategy updated";
pub const DRAIN_DISABLED_EVENT: &str = "Node drain disabled";
pub const DRAIN_COMPLETE_EVENT: &str = "Node drain complete";
pub const ELIGIBLE_EVENT: &str = "Node marked as eligible for scheduling";
pub const INELIGIBLE_EVENT: &str = "Node marked as ineligible for scheduling";
/// Nomad's refusal to make a draining node eligible.
pub const DRAINING_NOT_ELIGIBLE: &str = "can not set node's scheduling eligibility to eligible while it is draining";

/// Nomad's node registration events.
pub const REGISTERED_EVENT: &str = "Node registered";
pub const REREGISTERED_EVENT: &str = "Node re-registered";

/// `drivers` with each one's update time: kept from `old` while its fingerprint is the same,
/// `at_ms` when it changed or is new (Nomad's `DriverInfo.UpdateTime`).
fn stamped_drivers(
    drivers: &BTreeMap<String, DriverInfo>,
    old: Option<&BTreeMap<String, DriverInfo>>,
    at_ms: u64,
) -> BTreeMap<String, DriverInfo> {
    drivers
        .iter()
        .map(|(name, info)| {
            let mut info = info.clone();
            info.update_time_ms = match old.and_then(|old| old.get(name)) {
                Some(before) if before.same_fingerprint(&info) && before.update_time_ms != 0 => before.update_time_ms,
                _ => at_ms,
            };
            (name.clone(), info)
        })
        .collect()
}

fn cluster_event(message: &str) -> NodeEvent {
    NodeEvent {
        message: message.into(),
        subsystem: "Cluster".into(),
        ..NodeEvent::default()
    }
}

impl ServerState {
    /// Starts, changes or ends a node's drain. A drain makes the node ineligible; ending it
    /// leaves the node ineligible unless `mark_eligible` (Nomad's `-keep-ineligible` is the
    /// CLI's default off, so the CLI asks for it).
    fn update_drain(
        &mut self,
        index: u64,
        at_ms: u64,
        node_id: &str,
        strategy: Option<&DrainStrategy>,
        mark_eligible: bool,
        complete: bool,
    ) -> Response {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Response::Error(ErrorKind::NotFound, "node not found".into());
        };
        let was_draining = node.drain_strategy.is_some();
        let message = match (strategy, was_draining, complete) {
            (Some(_), false, _) => Some(DRAIN_SET_EVENT),
            (Some(_), true, _) => Some(DRAIN_UPDATED_EVENT),
            (None, true, true) => Some(DRAIN_COMPLETE_EVENT),
            (None, true, false) => Some(DRAIN_DISABLED_EVENT),
            // The drainer completing a drain an operator already ended: nothing to do.
            (None, false, true) => return Response::Done,
            (None, false, false) => None,
        };
        match strategy {
            Some(strategy) => {
                let started_at_ms = node
                    .drain_strategy
                    .as_ref()
                    .map_or(at_ms, |current| current.started_at_ms);
                let force_deadline_ms = match strategy.deadline_ns {
                    0 => None,
                    deadline if deadline < 0 => Some(at_ms),
                    deadline => Some(at_ms.saturating_add(deadline as u64 / 1_000_000)),
                };
                node.drain_strategy = Some(DrainStrategy {
                    deadline_ns: strategy.deadline_ns,
                    ignore_system_jobs: strategy.ignore_system_jobs,
                    force_deadline_ms,
                    started_at_ms,
                });
                node.scheduling_eligibility = SchedulingEligibility::Ineligible;
                node.last_drain = Some(DrainMetadata {
                    started_at_ms,
                    updated_at_ms: at_ms,
                    status: crate::structs::DrainStatus::Draining,
                });
            }
            None => {
                node.drain_strategy = None;
                if let Some(last) = node.last_drain.as_mut().filter(|_| was_draining) {
                    last.updated_at_ms = at_ms;
                    last.status = if complete {
                        crate::structs::DrainStatus::Complete
                    } else {
                        crate::structs::DrainStatus::Canceled
                    };
                }
                if mark_eligible {
                    node.scheduling_eligibility = SchedulingEligibility::Eligible;
                }
            }
        }
        if let Some(message) = message {
            let event = NodeEvent {
                message: message.into(),
                subsystem: "Drain".into(),
                ..NodeEvent::default()
            };
            record_events(node, [event].iter(), index, at_ms);
        }
        node.modify_index = index;
        self.touch(Table::Nodes, index);
        Response::Done
    }

    /// Node commands: registration, status, fingerprints, events, drain and eligibility.
    pub(super) fn apply_node(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        let response = self.apply_node_command(index, at_ms, command);
        let node_id = match command {
            Command::NodeRegister { node } => Some(node.id.as_str()),
            Command::NodeUpdateStatus { node_id, .. }
            | Command::NodeUpdateCsiInfo { node_id, .. }
            | Command::NodeUpdateDrivers { node_id, .. }
            | Command::NodeEmitEvents { node_id, .. }
            | Command::NodeDeregister { node_id }
            | Command::NodeUpdateDrain { node_id, .. }
            | Command::NodeUpdateEligibility { node_id, .. } => Some(node_id.as_str()),
            _ => None,
        };
        if let Some(node_id) = node_id {
            self.queue_draining_node(node_id);
        }
        response
    }

    fn apply_node_command(&mut self, index: u64, at_ms: u64, command: &Command) -> Response {
        match command {
            Command::NodeRegister { node } => self.register_node(index, at_ms, node),
            Command::NodeUpdateStatus { node_id, status, event } => {
                let Some(node) = self.nodes.get_mut(node_id) else {
                    return Response::Error(ErrorKind::NotFound, format!("node not found: {node_id}"));
                };
                record_events(node, event.iter(), index, at_ms);
                node.status = *status;
                node.status_updated_at_ms = at_ms;
                node.modify_index = index;
                self.touch(Table::Nodes, index);
                // Node status feeds volume release decisions; wake volume watchers.
                self.touch(Table::CsiVolumes, index);
                Response::Done
            }
            Command::NodeUpdateCsiInfo {
                node_id,
                controllers,
                nodes,
            } => self.update_csi_info(index, at_ms, node_id, controllers, nodes),
            Command::NodeUpdateDrivers { node_id, drivers } => self.update_drivers(index, at_ms, node_id, drivers),
            Command::NodeEmitEvents { node_id, events } => {
                let Some(node) = self.nodes.get_mut(node_id) else {
                    return Response::Error(ErrorKind::NotFound, format!("node not found: {node_id}"));
                };
                record_events(node, events.iter(), index, at_ms);
                node.modify_index = index;
                self.touch(Table::Nodes, index);
                Response::Done
            }
            Command::NodeDeregister { node_id } => {
                let Some(old) = self.nodes.remove(node_id) else {
                    return Response::Error(ErrorKind::NotFound, format!("node not found: {node_id}"));
                };
                self.touch(Table::Nodes, index);
                self.update_node_plugins(index, at_ms, Some(&old), None);
                Response::Done
            }
            Command::NodeUpdateDrain {
                node_id,
                strategy,
                mark_eligible,
                complete,
            } => self.update_drain(index, at_ms, node_id, strategy.as_ref(), *mark_eligible, *complete),
            Command::NodeUpdateEligibility { node_id, eligibility } => {
                self.update_eligibility(index, at_ms, node_id, *eligibility)
            }
            other => unreachable!("{} is not routed here", other.name()),
        }
    }

    /// A client's registration replaces its node record, keeping what belongs to the servers.
    fn register_node(&mut self, index: u64, at_ms: u64, node: &Node) -> Response {
        let mut node = node.clone();
        let old = self.nodes.get(&node.id).cloned();
        node.create_index = old.as_ref().map_or(index, |old| old.create_index);
        node.modify_index = index;
        node.status_updated_at_ms = at_ms;
        if node.events.is_empty() {
            node.events = old.as_ref().map(|old| old.events.clone()).unwrap_or_default();
        }
        node.drivers = stamped_drivers(&node.drivers, old.as_ref().map(|old| &old.drivers), at_ms);
        // Nomad's registration events: the first registration, and a node that comes back
        // from down.
        match &old {
            None => record_events(&mut node, [cluster_event(REGISTERED_EVENT)].iter(), index, at_ms),
            Some(old)
                if old.status == crate::structs::NodeStatus::Down
                    && node.status != crate::structs::NodeStatus::Down =>
            {
                record_events(&mut node, [cluster_event(REREGISTERED_EVENT)].iter(), index, at_ms)
            }
            Some(_) => {}
        }
        // A client re-registering does not end a drain or undo an operator's
        // eligibility: those belong to the servers.
        let none = BTreeMap::new();
        let stored = |pick: fn(&Node) -> &BTreeMap<String, CsiInfo>| old.as_ref().map_or(&none, pick);
        node.csi_controller_plugins = stamped(
            &node.csi_controller_plugins,
            stored(|n| &n.csi_controller_plugins),
            at_ms,
        );
        node.csi_node_plugins = stamped(&node.csi_node_plugins, stored(|n| &n.csi_node_plugins), at_ms);
        if let Some(old) = &old {
            node.scheduling_eligibility = old.scheduling_eligibility;
            node.drain_strategy = old.drain_strategy.clone();
            node.last_drain = old.last_drain.clone();
        }
        self.nodes.insert(node.id.clone(), node.clone());
        self.touch(Table::Nodes, index);
        self.update_node_plugins(index, at_ms, old.as_ref(), Some(&node));
        Response::Done
    }

    /// A client's CSI fingerprint: the node's plugins and the plugin table with them.
    fn update_csi_info(
        &mut self,
        index: u64,
        at_ms: u64,
        node_id: &str,
        controllers: &BTreeMap<String, CsiInfo>,
        nodes: &BTreeMap<String, CsiInfo>,
    ) -> Response {
        let Some(old) = self.nodes.get(node_id).cloned() else {
            return Response::Error(ErrorKind::NotFound, format!("node not found: {node_id}"));
        };
        let mut node = old.clone();
        node.csi_controller_plugins = stamped(controllers, &old.csi_controller_plugins, at_ms);
        node.csi_node_plugins = stamped(nodes, &old.csi_node_plugins, at_ms);
        node.modify_index = index;
        self.nodes.insert(node_id.to_string(), node.clone());
        self.touch(Table::Nodes, index);
        self.update_node_plugins(index, at_ms, Some(&old), Some(&node));
        Response::Done
    }

    /// A client's driver fingerprint, mirrored into the node's `driver.*` attributes.
    fn update_drivers(
        &mut self,
        index: u64,
        at_ms: u64,
        node_id: &str,
        drivers: &BTreeMap<String, DriverInfo>,
    ) -> Response {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Response::Error(ErrorKind::NotFound, format!("node not found: {node_id}"));
        };
        let drivers = &stamped_drivers(drivers, Some(&node.drivers), at_ms);
        for (name, info) in drivers {
            let prefix = format!("driver.{name}");
            node.attributes
                .retain(|key, _| !(key == &prefix || key.starts_with(&format!("{prefix}."))));
            if info.detected {
                node.attributes
                    .extend(info.attributes.iter().map(|(key, value)| (key.clone(), value.clone())));
            }
        }
        node.drivers = drivers.clone();
        node.modify_index = index;
        self.touch(Table::Nodes, index);
        Response::Done
    }

    /// An operator's eligibility toggle (refused while the node drains).
    fn update_eligibility(
        &mut self,
        index: u64,
        at_ms: u64,
        node_id: &str,
        eligibility: SchedulingEligibility,
    ) -> Response {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Response::Error(ErrorKind::NotFound, "node not found".into());
        };
        if node.drain_strategy.is_some() && eligibility == SchedulingEligibility::Eligible {
            return Response::Error(ErrorKind::Refused, DRAINING_NOT_ELIGIBLE.into());
        }
        if node.scheduling_eligibility != eligibility {
            let message = match eligibility {
                SchedulingEligibility::Eligible => ELIGIBLE_EVENT,
                SchedulingEligibility::Ineligible => INELIGIBLE_EVENT,
            };
            record_events(node, [cluster_event(message)].iter(), index, at_ms);
            node.scheduling_eligibility = eligibility;
        }
        node.modify_index = index;
        self.touch(Table::Nodes, index);
        Response::Done
    }
}

/// Plugin fingerprints with their `UpdateTime`: when the fingerprint last changed, on the
/// cluster's clock (the entry's time); an unchanged one keeps the time it had.
fn stamped(
    reported: &BTreeMap<String, CsiInfo>,
    stored: &BTreeMap<String, CsiInfo>,
    at_ms: u64,
) -> BTreeMap<String, CsiInfo> {
    reported
        .iter()
        .map(|(plugin, info)| {
            let mut info = info.clone();
            info.update_time_ms = match stored.get(plugin) {
                Some(old)
                    if CsiInfo {
                        update_time_ms: info.update_time_ms,
                        ..old.clone()
                    } == info =>
                {
                    old.update_time_ms
                }
                _ => at_ms,
            };
            (plugin.clone(), info)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::csi::tests::{Fixture, node};
    use crate::structs::NodeStatus;

    fn exec(healthy: bool) -> BTreeMap<String, DriverInfo> {
        BTreeMap::from([(
            "exec".to_string(),
            DriverInfo {
                detected: true,
                healthy,
                health_description: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                attributes: BTreeMap::new(),
                update_time_ms: 0,
            },
        )])
    }

    /// Nomad's registration events, and each driver's `UpdateTime`: when the servers first
    /// saw its fingerprint, kept while it says the same, moved when it changes.
    #[test]
    fn registration_events_and_driver_update_times_are_kept_as_nomads_are() {
        let mut fx = Fixture::new();
        let mut n1 = node("n1", true);
        n1.drivers = exec(true);
        fx.ok(Command::NodeRegister { node: n1.clone() });
        let stored = fx.state.node("n1").unwrap().clone();
        let messages: Vec<&str> = stored.events.iter().map(|event| event.message.as_str()).collect();
        assert_eq!(messages, [REGISTERED_EVENT]);
        assert_eq!(stored.events[0].subsystem, "Cluster");
        assert_eq!(stored.events[0].timestamp_ms, 1_000);
        assert_eq!(stored.drivers["exec"].update_time_ms, 1_000);

        // The same fingerprint again: the time stays; a change moves it.
        fx.ok(Command::NodeRegister { node: n1.clone() });
        assert_eq!(fx.state.node("n1").unwrap().drivers["exec"].update_time_ms, 1_000);
        assert_eq!(
            fx.state.node("n1").unwrap().events.len(),
            1,
            "a re-registration of a ready node"
        );
        fx.ok(Command::NodeUpdateDrivers {
            node_id: "n1".into(),
            drivers: exec(false),
        });
        assert_eq!(fx.state.node("n1").unwrap().drivers["exec"].update_time_ms, 3_000);

        // Down, then back: re-registered.
        fx.ok(Command::NodeUpdateStatus {
            node_id: "n1".into(),
            status: NodeStatus::Down,
            event: None,
        });
        fx.ok(Command::NodeRegister { node: n1 });
        let messages: Vec<String> = fx
            .state
            .node("n1")
            .unwrap()
            .events
            .iter()
            .map(|event| event.message.clone())
            .collect();
        assert_eq!(messages.last().map(String::as_str), Some(REREGISTERED_EVENT));
    }
}
