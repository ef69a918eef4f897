//! At most one controller RPC in flight per plugin from a server (#8336: concurrent
//! ControllerPublish calls race inside plugins). Counted from the server's own dispatch and
//! completion (or abandonment) of `ClientCSI` calls.

use std::collections::BTreeMap;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct ControllerSerial {
    in_flight: BTreeMap<(String, String), u32>,
}

/// "controller-attach p ..." → Some("p").
fn controller_plugin(call: &str) -> Option<String> {
    let mut words = call.split_whitespace();
    let kind = words.next()?;
    kind.starts_with("controller-")
        .then(|| words.next().map(str::to_string))
        .flatten()
}

impl Invariant for ControllerSerial {
    fn name(&self) -> &'static str {
        "at most one controller RPC in flight per plugin"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(event) = event else { return Ok(()) };
        match event {
            // A (re)started server has nothing in flight.
            AgentEvent::Started { .. } => self.in_flight.retain(|(server, _), _| server != node),
            AgentEvent::ClientCsiCall { call, .. } => {
                if let Some(plugin) = controller_plugin(call) {
                    let count = self.in_flight.entry((node.to_string(), plugin.clone())).or_default();
                    *count += 1;
                    if *count > 1 {
                        return Err(format!(
                            "{node} has {count} controller calls in flight for plugin {plugin}: {call}"
                        ));
                    }
                }
            }
            AgentEvent::ClientCsiDone { call, .. } => {
                if let Some(plugin) = controller_plugin(call)
                    && let Some(count) = self.in_flight.get_mut(&(node.to_string(), plugin))
                {
                    *count = count.saturating_sub(1);
                }
            }
            _ => {}
        }
        Ok(())
    }
}
