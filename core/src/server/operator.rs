//! The leader's changes to the cluster's shape that are not additions: an operator's
//! `operator raft remove-peer` and `server force-leave`, and autopilot's dead server cleanup
//! ([`crate::autopilot`]). Each removal goes through [`Action::RemoveRaftServer`], one at a
//! time, and its outcome arrives as [`Input::ServerRemoved`].

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::collections::BTreeSet;

use super::{Action, Pending, RAFT_CHANGE_TIMEOUT, Server};
use crate::autopilot::{self, AutopilotConfig, RaftServer};
use crate::membership::MemberStatus;
pub use crate::rpc::OperatorRequest;
use crate::rpc::{ReqId, RpcError, ServerReply};
use crate::time::Instant;

impl Server {
    /// The autopilot settings in force: the replicated ones, else this agent's.
    pub fn set_autopilot(&mut self, config: AutopilotConfig) {
        self.autopilot = config;
    }

    pub fn autopilot(&self) -> &AutopilotConfig {
        &self.autopilot
    }

    /// This agent's own settings (`autopilot {}`).
    pub fn agent_autopilot(&self) -> AutopilotConfig {
        self.config.autopilot
    }

    pub fn handle_operator(&mut self, now: Instant, req: ReqId, request: OperatorRequest) {
        if !self.leads() {
            self.reply(req, Err(RpcError::unavailable("No cluster leader")));
            return;
        }
        match request {
            OperatorRequest::RemovePeer { id } => {
                if !self.raft.contains(id) {
                    let text = format!("id {:?} was not found in the Raft configuration", id.to_string());
                    self.reply(req, Err(RpcError::not_found(text)));
                } else if id == self.node_id {
                    let text = format!(
                        "id {:?} is the leader: it cannot remove itself from the Raft configuration",
                        id.to_string()
                    );
                    self.reply(req, Err(RpcError::refused(text)));
                } else {
                    tracing::info!(id, "operator: removing server from the Raft configuration");
                    self.remove_server(now, id, Some(req));
                }
            }
            OperatorRequest::ForceLeave { node, prune } => self.force_leave(now, req, &node, prune),
        }
    }

    fn force_leave(&mut self, now: Instant, req: ReqId, node: &str, prune: bool) {
        let qualified = format!("{node}.{}", self.region);
        let found = self
            .membership
            .all_members()
            .into_iter()
            .filter(|member| member.id.name == node || member.id.name == qualified)
            .max_by_key(|member| member.id.generation);
        let Some(member) = found else {
            // Nomad's serf takes a force-leave of a name it does not know as done (200): the
            // member may have gone already, and a script that retries must not fail.
            tracing::info!(
                server = node,
                "operator: force-leave of a server not in the gossip pool; nothing to do"
            );
            self.reply(req, Ok(()));
            return;
        };
        if member.id == *self.membership.me() || matches!(member.status, MemberStatus::Alive | MemberStatus::Suspect) {
            let text = format!(
                "server {:?} is alive: force-leave removes only failed servers",
                member.id.name
            );
            self.reply(req, Err(RpcError::refused(text)));
            return;
        }
        tracing::info!(server = %member.id.name, prune, "operator: forcing a failed server to leave");
        self.membership.force_leave(&member.id, prune);
        let id = member.id.tags.as_ref().map(|tags| tags.id);
        match id.filter(|id| self.raft.contains(*id)) {
            Some(id) => self.remove_server(now, id, Some(req)),
            None => self.reply(req, Ok(())),
        }
    }

    /// Notes which servers of the Raft configuration gossip sees gone, and since when.
    pub(super) fn observe_gone(&mut self, now: Instant) {
        let alive: BTreeSet<u64> = self
            .membership
            .live_members()
            .iter()
            .filter_map(|member| member.tags.as_ref())
            .filter(|tags| tags.region == self.region)
            .map(|tags| tags.id)
            .collect();
        let me = self.node_id;
        let ids = self.raft.voters.iter().chain(self.raft.learners.iter()).copied();
        self.gone.observe(now, ids, |id| id == me || alive.contains(&id));
    }

    /// Autopilot's dead server cleanup, run with the leader's reconciliation when no other
    /// change of the configuration is under way.
    pub(super) fn prune_dead_servers(&mut self, now: Instant) {
        let me = self.node_id;
        let servers: Vec<RaftServer> = self
            .raft
            .voters
            .iter()
            .map(|id| (*id, true))
            .chain(self.raft.learners.iter().map(|id| (*id, false)))
            .map(|(id, voter)| RaftServer {
                id,
                voter,
                seen: self.gone.seen(id),
            })
            .collect();
        if let Some(&id) = autopilot::dead_servers(now, me, &servers, &self.autopilot).first() {
            tracing::info!(
                id,
                stabilization = ?self.autopilot.server_stabilization_time,
                "autopilot: removing a dead server from the Raft configuration"
            );
            self.remove_server(now, id, None);
        }
    }

    fn remove_server(&mut self, now: Instant, id: u64, reply_to: Option<ReqId>) {
        let op = self.start(now, Pending::RemoveServer, RAFT_CHANGE_TIMEOUT);
        if let Some(req) = reply_to {
            self.operator_replies.insert(op, req);
        }
        let voter = self.raft.voters.contains(&id);
        self.actions.push_back(Action::RemoveRaftServer { op, id, voter });
    }

    /// The outcome of a removal: the operator who asked is answered.
    pub(super) fn server_removed(
        &mut self,
        now: Instant,
        op: crate::op::OpId,
        result: Result<(), crate::error::Failure>,
    ) {
        if self.complete(op).is_none() {
            return;
        }
        if let Err(error) = &result {
            tracing::warn!(%error, "failed to remove a server from the Raft configuration");
        }
        let succeeded = result.is_ok();
        if let Some(req) = self.operator_replies.remove(&op) {
            self.reply(req, result.map_err(RpcError::from));
        }
        self.raft_change_done(now, succeeded);
    }

    /// A removal that timed out: its operator is told so.
    pub(super) fn removal_expired(&mut self, op: crate::op::OpId) {
        if let Some(req) = self.operator_replies.remove(&op) {
            let error = RpcError::unavailable("timed out changing the Raft configuration");
            self.reply(req, Err(error));
        }
    }

    /// Lost leadership: waiting operators are told to ask again.
    pub(super) fn abandon_operator_replies(&mut self) {
        for (_, req) in core::mem::take(&mut self.operator_replies) {
            self.reply(req, Err(RpcError::unavailable("leadership lost")));
        }
    }

    fn reply(&mut self, req: ReqId, result: Result<(), RpcError>) {
        let reply = match result {
            Ok(()) => ServerReply::Done { index: 0 },
            Err(error) => ServerReply::Error(error),
        };
        self.actions.push_back(Action::Reply { req, reply });
    }
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use super::super::{Input, RaftRole, RaftView};
    use super::*;
    use crate::bootstrap::BootState;
    use crate::config::AgentConfig;
    use crate::fsm::Command;
    use crate::rpc::ErrorKind;

    /// A server that leads a Raft configuration of `voters` (itself, id 1, among them), its
    /// barrier applied, with no gossip peers (so every other voter is gone from gossip).
    fn leader(voters: &[u64]) -> Server {
        let mut config = AgentConfig::default();
        config.server.enabled = true;
        config.server.bootstrap_expect = 3;
        let boot = BootState {
            last_log_index: Some(3),
            bootstrapped: true,
        };
        let mut server = Server::new(Instant::ZERO, &config, 1, 1, boot, 7);
        server.handle(Instant::ZERO, Input::RaftObserved(view(voters)));
        let barrier = drain(&mut server).into_iter().find_map(|action| match action {
            Action::Propose { op, command } if matches!(*command, Command::LeadershipEstablished { .. }) => Some(op),
            _ => None,
        });
        let op = barrier.expect("a leadership barrier");
        server.handle(Instant::ZERO, Input::Proposed { op, result: Ok(4) });
        assert!(server.leads());
        server
    }

    fn view(voters: &[u64]) -> RaftView {
        RaftView {
            role: RaftRole::Leader,
            term: 2,
            leader: Some(1),
            voted_for: Some(1),
            last_log_index: Some(3),
            voters: voters.iter().copied().collect(),
            learners: BTreeSet::new(),
        }
    }

    fn drain(server: &mut Server) -> Vec<Action> {
        core::iter::from_fn(|| server.poll_action()).collect()
    }

    fn removals(actions: &[Action]) -> Vec<(crate::op::OpId, u64)> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::RemoveRaftServer { op, id, .. } => Some((*op, *id)),
                _ => None,
            })
            .collect()
    }

    fn replies(actions: &[Action]) -> Vec<(ReqId, ServerReply)> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Reply { req, reply } => Some((*req, reply.clone())),
                _ => None,
            })
            .collect()
    }

    /// Runs the server's timers until `until`, returning every action.
    fn run_until(server: &mut Server, until: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        while let Some(at) = server.poll_timeout().filter(|at| *at <= until) {
            server.handle_timeout(at);
            actions.extend(drain(server));
        }
        actions
    }

    #[test]
    fn a_voter_gone_for_the_stabilization_time_is_removed_and_no_more_than_a_minority() {
        let mut server = leader(&[1, 2, 3]);
        let stabilization = server.autopilot().server_stabilization_time;
        let early = run_until(&mut server, Instant::ZERO + (stabilization - Duration::from_millis(1)));
        assert!(removals(&early).is_empty(), "nothing before the stabilization time");
        let later = run_until(&mut server, Instant::ZERO + stabilization * 2);
        let [(op, 2)] = removals(&later)[..] else {
            panic!("voter 2 alone removed (one at a time, and at most (3 - 1) / 2 voters): {later:?}")
        };
        let at = Instant::ZERO + stabilization * 2;
        server.handle(at, Input::ServerRemoved { op, result: Ok(()) });
        server.handle(at, Input::RaftObserved(view(&[1, 3])));
        let after = run_until(&mut server, at + stabilization * 3);
        assert!(
            removals(&after).is_empty(),
            "two voters left: removing the other would leave no quorum"
        );
    }

    /// Raft refuses a change while another is uncommitted: the removal is tried again a second
    /// later, not at once (swarm seed 442 retried it some 14,000 times a second).
    #[test]
    fn a_failed_removal_is_retried_after_a_pause_not_at_once() {
        let mut server = leader(&[1, 2, 3]);
        let stabilization = server.autopilot().server_stabilization_time;
        let at = Instant::ZERO + stabilization * 2;
        let [(op, 2)] = removals(&run_until(&mut server, at))[..] else {
            panic!("voter 2 removed")
        };
        let refused = crate::error::Failure::new(ErrorKind::Unavailable, "already undergoing a configuration change");
        server.handle(
            at,
            Input::ServerRemoved {
                op,
                result: Err(refused),
            },
        );
        let soon = run_until(&mut server, at + Duration::from_millis(999));
        assert!(removals(&soon).is_empty(), "retried at once: {soon:?}");
        let [(_, 2)] = removals(&run_until(&mut server, at + Duration::from_secs(1)))[..] else {
            panic!("voter 2 removed again a second later")
        };
    }

    #[test]
    fn dead_server_cleanup_off_removes_nothing() {
        let mut server = leader(&[1, 2, 3]);
        server.set_autopilot(AutopilotConfig {
            cleanup_dead_servers: false,
            ..AutopilotConfig::default()
        });
        let actions = run_until(&mut server, Instant::ZERO + Duration::from_secs(60));
        assert!(removals(&actions).is_empty());
    }

    #[test]
    fn remove_peer_answers_with_nomads_texts_and_once_raft_removed_the_peer() {
        let mut server = leader(&[1, 2, 3]);
        drain(&mut server);
        server.handle_operator(Instant::ZERO, 10, OperatorRequest::RemovePeer { id: 9 });
        server.handle_operator(Instant::ZERO, 11, OperatorRequest::RemovePeer { id: 1 });
        let answered = replies(&drain(&mut server));
        let texts: Vec<(ReqId, ErrorKind, String)> = answered
            .into_iter()
            .map(|(req, reply)| match reply {
                ServerReply::Error(error) => (req, error.kind, error.message),
                other => panic!("an error, not {other:?}"),
            })
            .collect();
        assert_eq!(
            texts,
            vec![
                (
                    10,
                    ErrorKind::NotFound,
                    "id \"9\" was not found in the Raft configuration".into()
                ),
                (
                    11,
                    ErrorKind::Refused,
                    "id \"1\" is the leader: it cannot remove itself from the Raft configuration".into()
                ),
            ]
        );
        server.handle_operator(Instant::ZERO, 12, OperatorRequest::RemovePeer { id: 3 });
        let actions = drain(&mut server);
        let [(op, 3)] = removals(&actions)[..] else {
            panic!("server 3 removed: {actions:?}")
        };
        assert!(replies(&actions).is_empty(), "answered only once Raft removed it");
        server.handle(Instant::ZERO, Input::ServerRemoved { op, result: Ok(()) });
        assert_eq!(replies(&drain(&mut server)), vec![(12, ServerReply::Done { index: 0 })]);
    }

    #[test]
    fn operators_are_told_when_this_server_does_not_lead_or_the_member_is_alive() {
        let mut server = leader(&[1, 2, 3]);
        drain(&mut server);
        let leave = OperatorRequest::ForceLeave {
            node: "nobody".into(),
            prune: false,
        };
        // Not a member: done, as Nomad's serf answers it (nothing to remove).
        server.handle_operator(Instant::ZERO, 1, leave.clone());
        assert_eq!(replies(&drain(&mut server)), vec![(1, ServerReply::Done { index: 0 })]);
        // Its own name: alive.
        let me = server.member_name().split('.').next().unwrap().to_string();
        server.handle_operator(Instant::ZERO, 2, OperatorRequest::ForceLeave { node: me, prune: true });
        let [(2, ServerReply::Error(error))] = &replies(&drain(&mut server))[..] else {
            panic!("an error")
        };
        assert!(error.message.contains("is alive"), "{}", error.message);
        let mut follower = view(&[1, 2, 3]);
        follower.role = RaftRole::Follower;
        follower.leader = Some(2);
        server.handle(Instant::ZERO, Input::RaftObserved(follower));
        server.handle_operator(Instant::ZERO, 3, leave);
        let [(3, ServerReply::Error(error))] = &replies(&drain(&mut server))[..] else {
            panic!("an error")
        };
        assert_eq!(
            (error.kind, error.message.as_str()),
            (ErrorKind::Unavailable, "No cluster leader")
        );
    }
}
