//! At most one controller RPC in flight per plugin (#8336: concurrent `ControllerPublish`
//! calls race inside plugins), counted where the plugin sees the calls: across every client
//! running a controller of the plugin and every server sending to them, so a new leader that
//! calls while its predecessor's call is still running is caught as well as a server that
//! forgets its own queue.
//!
//! A call is in flight from the moment it reaches the plugin until the plugin answers, its
//! machine or the agent answering for it dies, or its caller's deadline
//! ([`CLIENT_CSI_TIMEOUT`]) has passed: past that the servers have given up on it and a retry
//! is allowed, even if the plugin is still hanging on the first.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_core::agent::CLIENT_CSI_TIMEOUT;

use crate::trace::{PluginEvent, SimEvent};

use super::Invariant;

/// Network delay on either side of the deadline: a call this close to its caller's deadline
/// may already be given up.
const SLACK: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct ControllerSerial {
    /// Per plugin: calls the plugin has not answered yet, with when they arrived and where.
    in_flight: BTreeMap<String, Vec<(Duration, String, String)>>,
}

impl Invariant for ControllerSerial {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(
            event,
            SimEvent::Plugin(PluginEvent::ControllerCallStarted { .. } | PluginEvent::ControllerCallEnded { .. })
        )
    }

    fn name(&self) -> &'static str {
        "at most one controller RPC in flight per plugin"
    }

    fn observe(&mut self, _node: &str, _event: &SimEvent) -> Result<(), String> {
        unreachable!("observed with its time")
    }

    fn observe_at(&mut self, at: Duration, node: &str, event: &SimEvent) -> Result<(), String> {
        match event {
            SimEvent::Plugin(PluginEvent::ControllerCallStarted { plugin, call }) => {
                let calls = self.in_flight.entry(plugin.clone()).or_default();
                calls.retain(|(started, ..)| at.saturating_sub(*started) + SLACK < CLIENT_CSI_TIMEOUT);
                let verdict = match calls.first() {
                    Some((started, other_node, other_call)) => Err(format!(
                        "{call} reached plugin {plugin} on {node} while {other_call} (on {other_node}, \
                         {:.3}s earlier) was unanswered",
                        (at - *started).as_secs_f64()
                    )),
                    None => Ok(()),
                };
                calls.push((at, node.to_string(), call.clone()));
                verdict
            }
            // The machine died with its plugin, or the agent whose process answers the
            // simulated plugin's controller calls: nothing of it is in flight any more (found
            // by client_churn seed 73: a call hung on c2 counted as running after c2's agent
            // was killed with it, and the leader's next call, to c1, reported as a race).
            SimEvent::Plugin(PluginEvent::NodeLost | PluginEvent::AgentKilled) => {
                for calls in self.in_flight.values_mut() {
                    calls.retain(|(_, other_node, _)| other_node != node);
                }
                Ok(())
            }
            SimEvent::Plugin(PluginEvent::ControllerCallEnded { plugin, call }) => {
                if let Some(calls) = self.in_flight.get_mut(plugin)
                    && let Some(position) = calls
                        .iter()
                        .position(|(_, other_node, other_call)| other_node == node && other_call == call)
                {
                    calls.remove(position);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(plugin: &str, call: &str) -> SimEvent {
        SimEvent::Plugin(PluginEvent::ControllerCallStarted {
            plugin: plugin.into(),
            call: call.into(),
        })
    }

    fn ended(plugin: &str, call: &str) -> SimEvent {
        SimEvent::Plugin(PluginEvent::ControllerCallEnded {
            plugin: plugin.into(),
            call: call.into(),
        })
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn overlapping_calls_at_one_plugin_are_caught_across_nodes() {
        let mut invariant = ControllerSerial::default();
        assert!(
            invariant
                .observe_at(secs(1.0), "c1", &started("p", "controller-attach v"))
                .is_ok()
        );
        assert!(
            invariant
                .observe_at(secs(1.0), "c1", &started("q", "controller-attach w"))
                .is_ok(),
            "another plugin"
        );
        let overlap = invariant.observe_at(secs(1.5), "c2", &started("p", "controller-detach v"));
        assert!(overlap.is_err_and(|why| why.contains("while controller-attach v (on c1")));
    }

    #[test]
    fn answered_and_abandoned_calls_no_longer_count() {
        let mut invariant = ControllerSerial::default();
        assert!(
            invariant
                .observe_at(secs(1.0), "c1", &started("p", "controller-attach v"))
                .is_ok()
        );
        assert!(
            invariant
                .observe_at(secs(1.1), "c1", &ended("p", "controller-attach v"))
                .is_ok()
        );
        assert!(
            invariant
                .observe_at(secs(2.0), "c1", &started("p", "controller-attach v"))
                .is_ok()
        );
        // Never answered (a hanging plugin): the server gives up at its deadline and moves on.
        let retry = secs(2.0) + CLIENT_CSI_TIMEOUT;
        assert!(
            invariant
                .observe_at(retry, "c2", &started("p", "controller-attach v"))
                .is_ok()
        );
        assert!(
            invariant
                .observe_at(retry + secs(0.5), "c1", &started("p", "controller-attach v"))
                .is_err()
        );
    }

    #[test]
    fn a_call_dies_with_the_agent_that_answered_for_it() {
        let mut invariant = ControllerSerial::default();
        let agent_killed = SimEvent::Plugin(PluginEvent::AgentKilled);
        assert!(
            invariant
                .observe_at(secs(28.2), "c2", &started("p", "controller-attach v"))
                .is_ok()
        );
        // Another client's agent dying changes nothing.
        assert!(invariant.observe_at(secs(30.0), "c1", &agent_killed).is_ok());
        assert!(
            invariant
                .observe_at(secs(31.0), "c1", &started("p", "controller-attach v"))
                .is_err()
        );
        assert!(invariant.observe_at(secs(32.4), "c2", &agent_killed).is_ok());
        assert!(invariant.observe_at(secs(32.5), "c1", &agent_killed).is_ok());
        assert!(
            invariant
                .observe_at(secs(36.6), "c1", &started("p", "controller-attach v"))
                .is_ok()
        );
    }
}
