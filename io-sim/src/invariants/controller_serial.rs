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
//!
//! A call's age counts the jumps of its client's monotonic clock while it ran: a jump models a
//! paused VM resuming, and the client holding the plugin's turn measures the caller's
//! deadline on its own clock, as it must (so did the tokio timer it once used, in a real
//! pause). The simulation advances only that clock, not the world's; the invariant credits
//! the pause, or it would demand that a client know how long it was paused without a clock
//! (swarm seeds 211, 568 and 885).

use std::collections::BTreeMap;
use std::time::Duration;

use drover_core::agent::CLIENT_CSI_TIMEOUT;

use crate::trace::{HostEvent, PluginEvent, SimEvent};

use super::Invariant;

/// Network delay on either side of the deadline: a call this close to its caller's deadline
/// may already be given up.
const SLACK: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct ControllerSerial {
    /// Per plugin: calls the plugin has not answered yet, with when they arrived (less the
    /// jumps of their node's clock until then) and where.
    in_flight: BTreeMap<String, Vec<(Duration, String, String)>>,
    /// Per node: how far its monotonic clock has jumped ahead in all.
    jumped: BTreeMap<String, Duration>,
}

impl Invariant for ControllerSerial {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(
            event,
            SimEvent::Plugin(PluginEvent::ControllerCallStarted { .. } | PluginEvent::ControllerCallEnded { .. })
                | SimEvent::Host(HostEvent::MonotonicJumped { .. })
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
            SimEvent::Host(HostEvent::MonotonicJumped { by_ms }) => {
                *self.jumped.entry(node.to_string()).or_default() += Duration::from_millis(*by_ms);
                Ok(())
            }
            SimEvent::Plugin(PluginEvent::ControllerCallStarted { plugin, call }) => {
                // `at` on a node's own clock: the run's time plus the node's jumps so far.
                let jumped = &self.jumped;
                let local = |at: Duration, node: &str| at + jumped.get(node).copied().unwrap_or_default();
                let started = local(at, node);
                let calls = self.in_flight.entry(plugin.clone()).or_default();
                calls.retain(|(started, other_node, _)| {
                    local(at, other_node).saturating_sub(*started) + SLACK < CLIENT_CSI_TIMEOUT
                });
                let verdict = match calls.first() {
                    Some((started, other_node, other_call)) => Err(format!(
                        "{call} reached plugin {plugin} on {node} while {other_call} (on {other_node}, \
                         {:.3}s earlier by its clock) was unanswered",
                        local(at, other_node).saturating_sub(*started).as_secs_f64()
                    )),
                    None => Ok(()),
                };
                calls.push((started, node.to_string(), call.clone()));
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
    fn a_jump_of_the_calls_client_clock_counts_toward_its_deadline_and_no_other_does() {
        let jump = |by_ms| SimEvent::Host(HostEvent::MonotonicJumped { by_ms });
        let mut invariant = ControllerSerial::default();
        assert!(
            invariant
                .observe_at(secs(1.0), "c1", &started("p", "controller-attach v"))
                .is_ok()
        );
        assert!(
            invariant
                .observe_at(secs(1.0), "c2", &started("q", "controller-attach w"))
                .is_ok()
        );
        // Another node's pause does not age c1's call.
        assert!(invariant.observe_at(secs(2.0), "c2", &jump(30_000)).is_ok());
        let overlap = invariant.observe_at(secs(3.0), "c1", &started("p", "controller-detach v"));
        assert!(overlap.is_err_and(|why| why.contains("2.000s earlier")));
        // c2's own call is 30 s old by c2's clock: given up by its caller.
        assert!(
            invariant
                .observe_at(secs(3.0), "c2", &started("q", "controller-detach w"))
                .is_ok()
        );
        // c1 paused for 30 s: both of its calls are past their caller's deadline.
        assert!(invariant.observe_at(secs(4.0), "c1", &jump(30_000)).is_ok());
        assert!(
            invariant
                .observe_at(secs(4.5), "c1", &started("p", "controller-expand v"))
                .is_ok()
        );
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
