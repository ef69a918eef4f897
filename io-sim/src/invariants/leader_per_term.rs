//! At most one leader per Raft term, across every server of the run (a split brain shows up
//! here as two leaders of the same term).
//!
//! Read from openraft's persisted votes, not from its metrics: every vote a server saves is
//! recorded as it becomes durable, and a committed vote names the leader of its term (the
//! leader saves it when it is established, each follower when it accepts that leader). The
//! metrics channel only shows the latest state when the watcher gets to it, so a leader that
//! stepped down between two samples would go unseen.

use std::collections::BTreeMap;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

#[derive(Debug, Default)]
pub struct LeaderPerTerm {
    /// Per term: the leader named by the first committed vote, and the server that saved it.
    leaders: BTreeMap<u64, (u64, String)>,
}

impl Invariant for LeaderPerTerm {
    fn checks(&self, event: &SimEvent) -> bool {
        matches!(event, SimEvent::Agent(AgentEvent::VoteSaved { .. }))
    }

    fn name(&self) -> &'static str {
        "at most one leader per term"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        let SimEvent::Agent(AgentEvent::VoteSaved {
            term,
            voted_for: Some(leader),
            committed: true,
        }) = event
        else {
            return Ok(());
        };
        match self.leaders.get(term) {
            Some((known, seen_by)) if known != leader => Err(format!(
                "term {term} has two leaders: node {known} (committed vote saved by {seen_by}) and node \
                 {leader} (saved by {node})"
            )),
            Some(_) => Ok(()),
            None => {
                self.leaders.insert(*term, (*leader, node.to_string()));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, voted_for: u64, committed: bool) -> SimEvent {
        SimEvent::Agent(AgentEvent::VoteSaved {
            term,
            voted_for: Some(voted_for),
            committed,
        })
    }

    #[test]
    fn two_committed_leaders_of_one_term_are_a_split_brain() {
        let mut invariant = LeaderPerTerm::default();
        assert!(invariant.observe("s1", &vote(3, 1, true)).is_ok());
        assert!(
            invariant.observe("s2", &vote(3, 1, true)).is_ok(),
            "a follower of the same leader"
        );
        assert!(
            invariant.observe("s3", &vote(3, 3, false)).is_ok(),
            "a candidate's vote is no leader"
        );
        assert!(
            invariant.observe("s3", &vote(4, 3, true)).is_ok(),
            "the next term, a new leader"
        );
        let split = invariant.observe("s2", &vote(3, 2, true));
        assert!(split.is_err_and(|why| why.contains("term 3 has two leaders")));
    }
}
