//! An agent is a server, a client, or both; each part is its own machine and the agent only
//! routes inputs and collects actions. The client half arrives with the client issue.

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::vec::Vec;

use crate::bootstrap::BootState;
use crate::config::AgentConfig;
use crate::fsm::ServerState;
use crate::rpc::{self, RpcEndpoints};
use crate::server::{self, Server};
use crate::time::Instant;

pub use crate::config::CLIENT_CSI_TIMEOUT;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Server(server::Input),
    Rpc(rpc::Input),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Server(server::Action),
    Rpc(rpc::Action),
}

/// Identity and durable facts the driver read from disk before starting the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Boot {
    pub node_id: u64,
    /// How many times this data dir has started the agent (1 on first start).
    pub boot_count: u64,
    pub state: BootState,
    pub seed: u64,
}

/// The server half: cluster formation and the write endpoints, which only act while this
/// server leads.
#[derive(Debug)]
struct ServerHalf {
    server: Server,
    rpc: RpcEndpoints,
}

/// Every machine takes the replicated state store as read-only context (`state`); it changes
/// only through Raft.
#[derive(Debug)]
pub struct Agent {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    server: Option<ServerHalf>,
}

impl Agent {
    pub fn new(now: Instant, config: &AgentConfig, boot: Boot) -> Self {
        let server = (config.server.enabled || config.dev_mode).then(|| ServerHalf {
            server: Server::new(now, config, boot.node_id, boot.boot_count, boot.state, boot.seed),
            rpc: RpcEndpoints::new(
                CLIENT_CSI_TIMEOUT,
                config.server.timing.csi_gc,
                config.server.timing.heartbeat,
                config.server.csi_faults,
                boot.seed ^ 0x5ced_u64,
            )
            .with_connect(config.consul.address.is_some(), config.server.connect_faults)
            .with_job_limits(config.server.job_limits)
            .with_core_gc(config.server.timing.core_gc)
            .with_scheduler_faults(config.server.scheduler_faults),
        });
        Agent {
            clock: crate::time::Monotonic::default(),
            server,
        }
    }

    /// The cron arithmetic periodic jobs are launched by (see [`crate::periodic`]).
    pub fn with_calendar(mut self, calendar: alloc::sync::Arc<dyn crate::periodic::Calendar>) -> Self {
        if let Some(half) = self.server.take() {
            self.server = Some(ServerHalf {
                rpc: half.rpc.with_calendar(calendar),
                server: half.server,
            });
        }
        self
    }

    /// The wall clock (Unix ms) at `now`: the driver reads it before every step, since cron
    /// specs name wall-clock times.
    pub fn set_wall_clock(&mut self, now: Instant, unix_ms: u64) {
        if let Some(half) = &mut self.server {
            half.rpc.set_wall_clock(now, unix_ms);
        }
    }

    pub fn server(&self) -> Option<&Server> {
        self.server.as_ref().map(|half| &half.server)
    }

    pub fn endpoints(&self) -> Option<&RpcEndpoints> {
        self.server.as_ref().map(|half| &half.rpc)
    }

    pub fn handle(&mut self, now: Instant, input: Input, state: &ServerState) {
        self.clock.observe(now);
        let Some(half) = &mut self.server else { return };
        half.server.set_autopilot(Self::autopilot(&half.server, state));
        match input {
            Input::Server(input) => half.server.handle(now, input),
            Input::Rpc(rpc::Input::Request {
                req,
                request: request @ rpc::ServerRequest::Operator(_),
                authority,
            }) => match (rpc::authz::check(&request, &authority, state), request) {
                (Ok(()), rpc::ServerRequest::Operator(request)) => half.server.handle_operator(now, req, request),
                (Err(error), _) => half.rpc.refuse(req, error),
                (Ok(()), _) => unreachable!("matched as an operator request"),
            },
            Input::Rpc(input) => half.rpc.handle(now, input, state),
        }
        Self::sync_leadership(half, now, state);
    }

    pub fn handle_timeout(&mut self, now: Instant, state: &ServerState) {
        self.clock.observe(now);
        let Some(half) = &mut self.server else { return };
        half.server.set_autopilot(Self::autopilot(&half.server, state));
        half.server.handle_timeout(now);
        half.rpc.handle_timeout(now, state);
        Self::sync_leadership(half, now, state);
    }

    /// The autopilot settings in force: the cluster's once an operator set them, else the
    /// agent's own (`autopilot {}`), as Nomad's leader reads them.
    fn autopilot(server: &Server, state: &ServerState) -> crate::autopilot::AutopilotConfig {
        state.autopilot_config().copied().unwrap_or(server.agent_autopilot())
    }

    /// The endpoints act only while Raft says we lead and our leadership barrier is applied.
    fn sync_leadership(half: &mut ServerHalf, now: Instant, state: &ServerState) {
        let leader = half.server.leads();
        if leader != half.rpc.is_leader() {
            half.rpc.handle(now, rpc::Input::Leadership { leader }, state);
        }
        // Not leading, and no other server known to: requests wait for this one to.
        let holding = !leader && !half.server.leader_elsewhere();
        if holding != half.rpc.is_holding() {
            half.rpc.set_holding(holding);
        }
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        let half = self.server.as_mut()?;
        match half.server.poll_action() {
            // An operator's answer goes out as every endpoint's does.
            Some(server::Action::Reply { req, reply }) => Some(Action::Rpc(rpc::Action::Reply { req, reply })),
            Some(action) => Some(Action::Server(action)),
            None => half.rpc.poll_action().map(Action::Rpc),
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let half = self.server.as_ref()?;
        [half.server.poll_timeout(), half.rpc.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Drains every pending action (convenience for drivers and tests).
    pub fn drain_actions(&mut self) -> Vec<Action> {
        core::iter::from_fn(|| self.poll_action()).collect()
    }
}
