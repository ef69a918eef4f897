//! A server grants at most one vote per term, and a restart never takes its term back (Raft's
//! Figure 2: `currentTerm` and `votedFor` are persistent state, on stable storage before
//! any RPC is answered). A vote that lived only in the page cache and was lost with the
//! power lets the server vote again in the same term — for another candidate — which is
//! how two leaders of one term are born; this catches the second vote itself, whether or
//! not the second leader gets elected.
//!
//! Read from the votes each server saves (recorded once durable) and from the term Raft
//! reports when a restarted server comes up.

use std::collections::BTreeMap;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct OneVote {
    /// Per server: the latest term it saved a vote in, and for whom.
    voted: BTreeMap<String, (u64, u64)>,
    /// Servers that started again and have not yet reported their term.
    restarted: BTreeMap<String, ()>,
}

impl Invariant for OneVote {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(
            event,
            SimEvent::Agent(AgentEvent::VoteSaved { .. } | AgentEvent::RaftChanged { .. })
        )
    }

    fn name(&self) -> &'static str {
        "a server votes once per term, and a restart keeps its vote"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        match event {
            SimEvent::Agent(AgentEvent::Started { .. }) => {
                self.restarted.insert(node.to_string(), ());
                Ok(())
            }
            SimEvent::Agent(AgentEvent::RaftChanged { term, .. }) => {
                if self.restarted.remove(node).is_none() {
                    return Ok(());
                }
                match self.voted.get(node) {
                    Some((voted_term, candidate)) if term < voted_term => Err(format!(
                        "{node} came back at term {term}, though it had voted for node {candidate} in \
                         term {voted_term}: the vote was not on stable storage"
                    )),
                    _ => Ok(()),
                }
            }
            SimEvent::Agent(AgentEvent::VoteSaved {
                term,
                voted_for: Some(candidate),
                committed,
            }) => {
                // A committed vote is not a grant: it records the leader the term elected,
                // which a candidate that lost (it voted for itself) accepts in the same term.
                if let Some((voted_term, earlier)) = self.voted.get(node)
                    && voted_term == term
                    && earlier != candidate
                    && !committed
                {
                    return Err(format!(
                        "{node} voted twice in term {term}: for node {earlier}, then for node {candidate}"
                    ));
                }
                self.voted.insert(node.to_string(), (*term, *candidate));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, voted_for: u64) -> SimEvent {
        SimEvent::Agent(AgentEvent::VoteSaved {
            term,
            voted_for: Some(voted_for),
            committed: false,
        })
    }

    fn leader(term: u64, leader: u64) -> SimEvent {
        SimEvent::Agent(AgentEvent::VoteSaved {
            term,
            voted_for: Some(leader),
            committed: true,
        })
    }

    fn raft(term: u64) -> SimEvent {
        SimEvent::Agent(AgentEvent::RaftChanged {
            role: drover_core::server::RaftRole::Follower,
            term,
            leader: None,
            voters: vec![],
        })
    }

    fn started() -> SimEvent {
        SimEvent::Agent(AgentEvent::Started {
            node_id: 1,
            boot_count: 2,
            boot: Default::default(),
        })
    }

    #[test]
    fn a_second_vote_in_a_term_for_another_candidate_is_caught() {
        let mut invariant = OneVote::default();
        assert!(invariant.observe("s1", &vote(3, 7)).is_ok());
        assert!(invariant.observe("s1", &vote(3, 7)).is_ok(), "the same vote again");
        assert!(invariant.observe("s1", &leader(3, 7)).is_ok(), "its candidate won");
        assert!(invariant.observe("s2", &vote(3, 9)).is_ok(), "another server");
        assert!(invariant.observe("s1", &vote(4, 9)).is_ok(), "a later term");
        let error = invariant.observe("s1", &vote(4, 8)).unwrap_err();
        assert!(error.contains("voted twice in term 4"), "{error}");
    }

    #[test]
    fn a_candidate_that_lost_accepts_the_winner_of_its_term() {
        let mut invariant = OneVote::default();
        invariant.observe("s2", &vote(3, 2)).unwrap();
        invariant.observe("s2", &leader(3, 5)).unwrap();
    }

    #[test]
    fn a_restart_that_forgot_its_term_is_caught_and_one_that_kept_it_is_not() {
        let mut invariant = OneVote::default();
        invariant.observe("s1", &vote(5, 2)).unwrap();
        invariant.observe("s1", &started()).unwrap();
        invariant.observe("s1", &raft(5)).unwrap();
        invariant.observe("s1", &started()).unwrap();
        let error = invariant.observe("s1", &raft(4)).unwrap_err();
        assert!(error.contains("came back at term 4"), "{error}");
        // Only the first report after a start is compared; terms move on freely after.
        invariant.observe("s1", &raft(3)).unwrap();
    }
}
