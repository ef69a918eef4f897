//! An agent is a server, a client, or both; each part is its own machine and the agent only
//! routes inputs and collects actions. The client half arrives with the client issue.

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::vec::Vec;

use crate::bootstrap::BootState;
use crate::config::AgentConfig;
use crate::server::{self, Server};
use crate::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Server(server::Input),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Server(server::Action),
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

#[derive(Debug)]
pub struct Agent {
    server: Option<Server>,
}

impl Agent {
    pub fn new(now: Instant, config: &AgentConfig, boot: Boot) -> Self {
        let server = (config.server.enabled || config.dev_mode).then(|| {
            Server::new(
                now,
                config,
                boot.node_id,
                boot.boot_count,
                boot.state,
                boot.seed,
            )
        });
        Agent { server }
    }

    pub fn server(&self) -> Option<&Server> {
        self.server.as_ref()
    }

    pub fn handle(&mut self, now: Instant, input: Input) {
        match input {
            Input::Server(input) => {
                if let Some(server) = &mut self.server {
                    server.handle(now, input);
                }
            }
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(server) = &mut self.server {
            server.handle_timeout(now);
        }
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.server
            .as_mut()
            .and_then(Server::poll_action)
            .map(Action::Server)
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.server.as_ref().and_then(Server::poll_timeout)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Drains every pending action (convenience for drivers and tests).
    pub fn drain_actions(&mut self) -> Vec<Action> {
        core::iter::from_fn(|| self.poll_action()).collect()
    }
}
