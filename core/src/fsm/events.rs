//! What each applied command changed, as Nomad's event stream names it
//! (`nomad/state/events.go`): one event type per command, and one event per object of the
//! topics Nomad streams (Job, Allocation, Evaluation, Deployment, Node, CSIVolume, CSIPlugin)
//! that the command wrote or removed.
//!
//! Nomad derives the objects from the transaction's changes; here each command names the keys
//! it writes, which costs what the command holds rather than a scan of the tables. The
//! object is read from the state after the apply, or from the state before it when the
//! command removed it.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{Command, ServerState};
use crate::structs::{Allocation, CsiPlugin, CsiVolume, Deployment, Evaluation, Job, Node};

/// The event stream's topics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Topic {
    Job,
    Allocation,
    Evaluation,
    Deployment,
    Node,
    CsiVolume,
    CsiPlugin,
}

impl Topic {
    /// Nomad's topic names.
    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Job => "Job",
            Topic::Allocation => "Allocation",
            Topic::Evaluation => "Evaluation",
            Topic::Deployment => "Deployment",
            Topic::Node => "Node",
            Topic::CsiVolume => "CSIVolume",
            Topic::CsiPlugin => "CSIPlugin",
        }
    }

    pub const ALL: [Topic; 7] = [
        Topic::Job,
        Topic::Allocation,
        Topic::Evaluation,
        Topic::Deployment,
        Topic::Node,
        Topic::CsiVolume,
        Topic::CsiPlugin,
    ];
}

/// The object an event carries, as stored (the API renders it).
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    Job(alloc::boxed::Box<Job>),
    Allocation(alloc::boxed::Box<Allocation>),
    Evaluation(alloc::boxed::Box<Evaluation>),
    Deployment(alloc::boxed::Box<Deployment>),
    Node(alloc::boxed::Box<Node>),
    CsiVolume(alloc::boxed::Box<CsiVolume>),
    CsiPlugin(alloc::boxed::Box<CsiPlugin>),
}

impl Payload {
    pub fn topic(&self) -> Topic {
        match self {
            Payload::Job(_) => Topic::Job,
            Payload::Allocation(_) => Topic::Allocation,
            Payload::Evaluation(_) => Topic::Evaluation,
            Payload::Deployment(_) => Topic::Deployment,
            Payload::Node(_) => Topic::Node,
            Payload::CsiVolume(_) => Topic::CsiVolume,
            Payload::CsiPlugin(_) => Topic::CsiPlugin,
        }
    }

    /// The event's key (the object's ID) and namespace (empty for nodes and plugins).
    pub fn key(&self) -> (&str, &str) {
        match self {
            Payload::Job(job) => (&job.id, &job.namespace),
            Payload::Allocation(alloc) => (&alloc.id, &alloc.namespace),
            Payload::Evaluation(eval) => (&eval.id, &eval.namespace),
            Payload::Deployment(deployment) => (&deployment.id, &deployment.namespace),
            Payload::Node(node) => (&node.id, ""),
            Payload::CsiVolume(volume) => (&volume.id, &volume.namespace),
            Payload::CsiPlugin(plugin) => (&plugin.id, ""),
        }
    }
}

/// One event: Nomad's `Type`, and the object.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub kind: &'static str,
    pub payload: Payload,
}

/// Nomad's event type of `command` (`MsgTypeEvents`); `None` for commands Nomad streams
/// nothing for.
pub fn event_type(command: &Command) -> Option<&'static str> {
    Some(match command {
        Command::NodeRegister { .. } => "NodeRegistration",
        Command::NodeDeregister { .. } => "NodeDeregistration",
        Command::NodeEmitEvents { .. } | Command::NodeUpdateStatus { .. } => "NodeStreamEvent",
        Command::NodeUpdateDrain { .. } | Command::NodeUpdateEligibility { .. } => "NodeDrain",
        Command::EvalUpsert { .. } => "EvaluationUpdated",
        Command::AllocClientUpdate { .. } | Command::AllocClientUpdates { .. } | Command::AllocUpsert { .. } => {
            "AllocationUpdated"
        }
        Command::JobRegister { .. }
        | Command::JobUpsert { .. }
        | Command::PeriodicLaunch { .. }
        | Command::JobScale { job: Some(_), .. } => "JobRegistered",
        Command::JobStop { .. } | Command::JobDeregister { .. } => "JobDeregistered",
        Command::AllocUpdateDesiredTransition { .. } => "AllocationUpdateDesiredStatus",
        Command::DeploymentStatus { .. } => "DeploymentStatusUpdate",
        Command::DeploymentPromote { .. } => "DeploymentPromotion",
        Command::DeploymentAllocHealth { .. } => "DeploymentAllocHealth",
        Command::PlanApply { .. } => "PlanResult",
        Command::CsiVolumeRegister { .. } => "CSIVolumeRegistered",
        Command::CsiVolumeDeregister { .. } => "CSIVolumeDeregistered",
        Command::CsiVolumeClaim { .. } => "CSIVolumeClaim",
        _ => return None,
    })
}

/// The objects a command writes or removes, by topic and (namespace, ID).
fn touched(command: &Command) -> Vec<(Topic, String, String)> {
    let job = |job: &Job| (Topic::Job, job.namespace.clone(), job.id.clone());
    let eval = |eval: &Evaluation| (Topic::Evaluation, eval.namespace.clone(), eval.id.clone());
    let alloc = |id: &String| (Topic::Allocation, String::new(), id.clone());
    let node = |id: &String| (Topic::Node, String::new(), id.clone());
    let deployment = |id: &String| (Topic::Deployment, String::new(), id.clone());
    let mut out = Vec::new();
    match command {
        Command::NodeRegister { node: registered } => out.push(node(&registered.id)),
        Command::NodeDeregister { node_id }
        | Command::NodeUpdateStatus { node_id, .. }
        | Command::NodeEmitEvents { node_id, .. }
        | Command::NodeUpdateDrain { node_id, .. }
        | Command::NodeUpdateEligibility { node_id, .. } => out.push(node(node_id)),
        Command::EvalUpsert { evals } => out.extend(evals.iter().map(eval)),
        Command::AllocClientUpdate { alloc_id, .. } => out.push(alloc(alloc_id)),
        Command::AllocClientUpdates { updates } => out.extend(updates.iter().map(|update| alloc(&update.alloc_id))),
        Command::AllocUpsert { allocs } => out.extend(allocs.iter().map(|a| alloc(&a.id))),
        Command::AllocUpdateDesiredTransition { transitions, evals } => {
            out.extend(transitions.keys().map(alloc));
            out.extend(evals.iter().map(eval));
        }
        Command::JobRegister {
            job: registered,
            eval: e,
            ..
        } => {
            out.push(job(registered));
            out.extend(e.iter().map(eval));
        }
        Command::JobUpsert { job: registered } => out.push(job(registered)),
        Command::JobScale {
            job: Some(registered),
            eval: e,
            ..
        } => {
            out.push(job(registered));
            out.extend(e.iter().map(eval));
        }
        Command::PeriodicLaunch { child: Some(child), .. } => {
            out.push(job(&child.0));
            out.push(eval(&child.1));
        }
        Command::JobStop {
            namespace,
            job_id,
            eval: e,
            ..
        } => {
            out.push((Topic::Job, namespace.clone(), job_id.clone()));
            out.push(eval(e));
        }
        Command::JobDeregister { namespace, job_id } => out.push((Topic::Job, namespace.clone(), job_id.clone())),
        Command::PlanApply {
            allocs,
            evals,
            deployment: created,
            deployment_updates,
        } => {
            out.extend(allocs.iter().map(|a| alloc(&a.id)));
            out.extend(evals.iter().map(eval));
            out.extend(created.iter().map(|d| deployment(&d.id)));
            out.extend(
                deployment_updates
                    .iter()
                    .map(|update| deployment(&update.deployment_id)),
            );
        }
        Command::DeploymentStatus {
            update,
            job: rolled_back,
            eval: e,
        } => {
            out.push(deployment(&update.deployment_id));
            out.extend(rolled_back.iter().map(job));
            out.extend(e.iter().map(eval));
        }
        Command::DeploymentPromote {
            deployment_id, eval: e, ..
        } => {
            out.push(deployment(deployment_id));
            out.push(eval(e));
        }
        Command::DeploymentAllocHealth {
            deployment_id,
            healthy,
            unhealthy,
            job: rolled_back,
            eval: e,
            ..
        } => {
            out.push(deployment(deployment_id));
            out.extend(healthy.iter().chain(unhealthy).map(alloc));
            out.extend(rolled_back.iter().map(job));
            out.push(eval(e));
        }
        Command::CsiVolumeRegister { volumes } => out.extend(
            volumes
                .iter()
                .map(|volume| (Topic::CsiVolume, volume.namespace.clone(), volume.id.clone())),
        ),
        Command::CsiVolumeDeregister {
            namespace, volume_ids, ..
        } => out.extend(
            volume_ids
                .iter()
                .map(|id| (Topic::CsiVolume, namespace.clone(), id.clone())),
        ),
        Command::CsiVolumeClaim {
            namespace, volume_id, ..
        } => out.push((Topic::CsiVolume, namespace.clone(), volume_id.clone())),
        _ => {}
    }
    out
}

/// The object of `topic` under (namespace, id) in `state`.
fn object(state: &ServerState, topic: Topic, namespace: &str, id: &str) -> Option<Payload> {
    use alloc::boxed::Box;
    Some(match topic {
        Topic::Job => Payload::Job(Box::new(state.job(namespace, id)?.clone())),
        Topic::Allocation => Payload::Allocation(Box::new(state.alloc(id)?.clone())),
        Topic::Evaluation => Payload::Evaluation(Box::new(state.eval(id)?.clone())),
        Topic::Deployment => Payload::Deployment(Box::new(state.deployment(id)?.clone())),
        Topic::Node => Payload::Node(Box::new(state.node(id)?.clone())),
        Topic::CsiVolume => Payload::CsiVolume(Box::new(state.volume_raw(namespace, id)?.clone())),
        Topic::CsiPlugin => Payload::CsiPlugin(Box::new(state.plugin(id)?.clone())),
    })
}

/// The events of `command`, applied on `before` to give `after`: each object it wrote as it
/// is now, each it removed as it was, once. A command refused by the state machine wrote
/// nothing, and has none.
///
/// A batch's members each give their own events, read from the state after the whole batch
/// (they share one index, as Nomad's batched node and allocation updates do).
pub fn events(command: &Command, before: &ServerState, after: &ServerState) -> Vec<Event> {
    if let Command::Batch(members) = command {
        return members
            .iter()
            .flat_map(|member| events(member, before, after))
            .collect();
    }
    let Some(kind) = event_type(command) else {
        return Vec::new();
    };
    let mut seen = alloc::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (topic, namespace, id) in touched(command) {
        if !seen.insert((topic, namespace.clone(), id.clone())) {
            continue;
        }
        let now = object(after, topic, &namespace, &id);
        let was = object(before, topic, &namespace, &id);
        let payload = match (now, was) {
            (Some(now), was) if was.as_ref() != Some(&now) => now,
            // Removed: Nomad streams deletions of jobs, nodes, volumes and plugins.
            (None, Some(was)) if matches!(topic, Topic::Job | Topic::Node | Topic::CsiVolume | Topic::CsiPlugin) => was,
            _ => continue,
        };
        out.push(Event { kind, payload });
    }
    out.extend(
        plugin_changes(before, after)
            .into_iter()
            .map(|payload| Event { kind, payload }),
    );
    out
}

/// The CSI plugins the command changed, as Nomad streams them under the command's type:
/// plugins are derived from node fingerprints and plugin jobs, so rather than the command's
/// keys the plugin table is compared, and only when the command touched it (there are few
/// plugins). A plugin that went away is streamed as it was.
fn plugin_changes(before: &ServerState, after: &ServerState) -> Vec<Payload> {
    use super::Table;
    use alloc::boxed::Box;
    if before.table_index(Table::CsiPlugins) == after.table_index(Table::CsiPlugins) {
        return Vec::new();
    }
    let changed = after
        .plugins()
        .filter(|plugin| before.plugin(&plugin.id) != Some(*plugin))
        .map(|plugin| Payload::CsiPlugin(Box::new(plugin.clone())));
    let removed = before
        .plugins()
        .filter(|plugin| after.plugin(&plugin.id).is_none())
        .map(|plugin| Payload::CsiPlugin(Box::new(plugin.clone())));
    changed.chain(removed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::Entry;

    fn job(id: &str) -> Job {
        Job {
            id: id.into(),
            name: id.into(),
            namespace: "default".into(),
            ..Job::default()
        }
    }

    fn apply(state: &mut ServerState, index: u64, command: Command) -> Vec<Event> {
        let before = state.clone();
        state.apply(
            index,
            &Entry {
                at_unix_ms: 1,
                command: command.clone(),
            },
        );
        events(&command, &before, state)
    }

    fn summary(events: &[Event]) -> Vec<(&'static str, &'static str, String)> {
        events
            .iter()
            .map(|event| {
                (
                    event.kind,
                    event.payload.topic().as_str(),
                    event.payload.key().0.to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn a_registration_streams_the_job_and_its_evaluation_and_a_purge_the_job_as_it_was() {
        let mut state = ServerState::default();
        let eval = Evaluation {
            id: "e1".into(),
            namespace: "default".into(),
            job_id: "web".into(),
            ..Evaluation::default()
        };
        let registered = apply(
            &mut state,
            1,
            Command::JobRegister {
                job: job("web"),
                eval: Some(eval.clone()),
                enforce_index: None,
            },
        );
        assert_eq!(
            summary(&registered),
            vec![
                ("JobRegistered", "Job", "web".into()),
                ("JobRegistered", "Evaluation", "e1".into())
            ]
        );
        let Payload::Job(stored) = &registered[0].payload else {
            panic!("a job")
        };
        assert_eq!(stored.modify_index, 1, "the job as stored, indexes set");
        let purged = apply(
            &mut state,
            2,
            Command::JobDeregister {
                namespace: "default".into(),
                job_id: "web".into(),
            },
        );
        assert_eq!(summary(&purged), vec![("JobDeregistered", "Job", "web".into())]);
        // Nothing Nomad streams: no events.
        let variable = Command::VariableDelete {
            path: "x".into(),
            cas: None,
            lock_id: None,
        };
        assert!(apply(&mut state, 3, variable).is_empty());
    }

    #[test]
    fn a_refused_command_streams_nothing() {
        let mut state = ServerState::default();
        // Deregistering a job that is not there changes nothing.
        let nothing = apply(
            &mut state,
            1,
            Command::JobDeregister {
                namespace: "default".into(),
                job_id: "ghost".into(),
            },
        );
        assert!(nothing.is_empty(), "{nothing:?}");
    }

    #[test]
    fn a_node_fingerprinting_a_plugin_streams_the_plugin_and_its_removal() {
        let mut state = ServerState::default();
        let node = crate::fsm::csi::tests::node("n1", true);
        let registered = apply(&mut state, 1, Command::NodeRegister { node: node.clone() });
        assert_eq!(
            summary(&registered),
            vec![
                ("NodeRegistration", "Node", "n1".into()),
                ("NodeRegistration", "CSIPlugin", "p".into())
            ]
        );
        let Payload::CsiPlugin(plugin) = &registered[1].payload else {
            panic!("a plugin")
        };
        assert_eq!((plugin.controllers_healthy, plugin.nodes_healthy), (1, 1));
        // The plugin turns unhealthy on the node: streamed again, as it is now.
        let sick = crate::fsm::csi::tests::node("n1", false);
        let changed = apply(&mut state, 2, Command::NodeRegister { node: sick });
        let plugins: Vec<_> = changed
            .iter()
            .filter_map(|event| match &event.payload {
                Payload::CsiPlugin(plugin) => Some(plugin.nodes_healthy),
                _ => None,
            })
            .collect();
        assert_eq!(plugins, vec![0]);
        // The node goes: so does its plugin, streamed as it was.
        let gone = apply(&mut state, 3, Command::NodeDeregister { node_id: "n1".into() });
        assert_eq!(
            summary(&gone),
            vec![
                ("NodeDeregistration", "Node", "n1".into()),
                ("NodeDeregistration", "CSIPlugin", "p".into())
            ]
        );
        // A command that leaves the plugins alone streams none.
        let eval = Evaluation {
            id: "e1".into(),
            namespace: "default".into(),
            ..Evaluation::default()
        };
        let evals = apply(&mut state, 4, Command::EvalUpsert { evals: vec![eval] });
        assert_eq!(summary(&evals), vec![("EvaluationUpdated", "Evaluation", "e1".into())]);
    }
}
