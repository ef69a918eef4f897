//! The servers' controller calls on this client: one at a time per plugin, whoever sends them
//! (#8336). The servers queue their controller calls per plugin, but a new leader, or one
//! restarted, does not know that its predecessor's call is still running in the plugin: the
//! plugin's host keeps the turn, for as long as a server waits for a call
//! ([`CLIENT_CSI_TIMEOUT`]; past that every caller has given up on it, so the next may go).
//!
//! `ClientInput::ControllerCall` asks for a call; the client answers at once when the plugin
//! has no controller registered here, else starts it (`ClientAction::ControllerStart`, to the
//! plugin's newest registration) when the plugin's turn is free, queueing it otherwise. The
//! driver reports `ClientInput::ControllerFinished` once a call it started returned (or, when
//! its caller had already gone, without making it); a call still running at its deadline is
//! given up (`ClientAction::ControllerAbandoned`) and the next one starts.

use super::*;
use crate::config::CLIENT_CSI_TIMEOUT;
use crate::error::{CsiCallError, CsiCallFailure};
use crate::rpc::ClientCsiRequest;

/// A call that waits for its plugin's turn.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Waiting {
    req: u64,
    socket: String,
    request: ClientCsiRequest,
}

/// One plugin's turn: the call that has it, with its deadline, and the calls waiting for it
/// in arrival order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Turn {
    running: Option<(u64, Instant)>,
    waiting: VecDeque<Waiting>,
}

/// The turns of every plugin with a call running or waiting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ControllerTurns {
    turns: BTreeMap<String, Turn>,
}

impl ControllerTurns {
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.turns
            .values()
            .filter_map(|turn| turn.running.map(|(_, deadline)| deadline))
            .min()
    }
}

impl Client {
    pub(super) fn controller_call(&mut self, now: Instant, req: u64, request: ClientCsiRequest) {
        let plugin = request.plugin_id().to_string();
        let Some(info) = self.registry.get(PluginKind::CsiController, &plugin) else {
            self.actions.push_back(ClientAction::ControllerReply {
                req,
                result: Err(CsiCallError::new(
                    CsiCallFailure::Unreachable,
                    format!("CSI client error (retryable): plugin {plugin} for type csi-controller not found"),
                )),
            });
            return;
        };
        let waiting = Waiting {
            req,
            socket: info.socket_path.clone(),
            request,
        };
        // The regression switch: every call goes to the plugin as it arrives, a turn of its own.
        let turn = if self.settings.faults.no_controller_turn {
            format!("{plugin}\0{req}")
        } else {
            plugin
        };
        self.controller_turns
            .turns
            .entry(turn.clone())
            .or_default()
            .waiting
            .push_back(waiting);
        self.next_controller_call(now, &turn);
    }

    /// A call the driver started is over (returned, or never made: its caller had gone).
    pub(super) fn controller_finished(&mut self, now: Instant, req: u64) {
        let held = self
            .controller_turns
            .turns
            .iter_mut()
            .find(|(_, turn)| turn.running.is_some_and(|(running, _)| running == req));
        let Some((plugin, turn)) = held else {
            return; // Given up at its deadline already.
        };
        turn.running = None;
        let plugin = plugin.clone();
        self.next_controller_call(now, &plugin);
    }

    /// Calls past their deadline are given up, and their plugins' next calls start.
    pub(super) fn controller_deadlines(&mut self, now: Instant) {
        let due: Vec<(String, u64)> = self
            .controller_turns
            .turns
            .iter()
            .filter_map(|(plugin, turn)| {
                let (req, deadline) = turn.running?;
                (deadline <= now).then(|| (plugin.clone(), req))
            })
            .collect();
        for (plugin, req) in due {
            if let Some(turn) = self.controller_turns.turns.get_mut(&plugin) {
                turn.running = None;
            }
            self.actions.push_back(ClientAction::ControllerAbandoned {
                req,
                error: CsiCallError::from(format!(
                    "CSI controller call still running after {CLIENT_CSI_TIMEOUT:?}"
                )),
            });
            self.next_controller_call(now, &plugin);
        }
    }

    fn next_controller_call(&mut self, now: Instant, plugin: &str) {
        let Some(turn) = self.controller_turns.turns.get_mut(plugin) else {
            return;
        };
        if turn.running.is_some() {
            return;
        }
        let Some(next) = turn.waiting.pop_front() else {
            self.controller_turns.turns.remove(plugin);
            return;
        };
        turn.running = Some((next.req, now + CLIENT_CSI_TIMEOUT));
        self.actions.push_back(ClientAction::ControllerStart {
            req: next.req,
            socket: next.socket,
            request: next.request,
        });
    }
}
