//! How elections go, where the scenario says the network lets them succeed:
//! - [`ElectionRounds`]: from one leader to the next, at most `bound` terms see a candidacy
//!   (split votes resolve within that many rounds);
//! - [`StableLeader`]: between `from` and `until` nobody stands at all (no false failover
//!   while the leader lives, under the loss and jitter the scenario injects).
//!
//! Both read openraft's persisted votes, as [`super::leader_per_term`] does: a candidacy in a
//! term shows as an uncommitted vote saved in it (by the candidate and by whoever grants it),
//! an established leader as a committed vote.

use std::collections::BTreeSet;
use std::time::Duration;

use drover_io_real::io::AgentEvent;

use crate::trace::SimEvent;

use super::Invariant;

fn vote(event: &SimEvent) -> Option<(u64, bool)> {
    match event {
        SimEvent::Agent(AgentEvent::VoteSaved {
            term,
            voted_for: Some(_),
            committed,
        }) => Some((*term, *committed)),
        _ => None,
    }
}

#[derive(Debug)]
pub struct ElectionRounds {
    bound: usize,
    leader_term: u64,
    /// Terms after `leader_term` that saw a candidacy.
    rounds: BTreeSet<u64>,
}

impl ElectionRounds {
    pub fn new(bound: usize) -> Self {
        ElectionRounds {
            bound,
            leader_term: 0,
            rounds: BTreeSet::new(),
        }
    }
}

impl Invariant for ElectionRounds {
    fn checks(&self, event: &SimEvent) -> bool {
        vote(event).is_some()
    }

    fn name(&self) -> &'static str {
        "split votes resolve within the bound of election rounds"
    }

    fn observe(&mut self, _node: &str, event: &SimEvent) -> Result<(), String> {
        let Some((term, committed)) = vote(event) else {
            return Ok(());
        };
        if term <= self.leader_term {
            return Ok(());
        }
        self.rounds.insert(term);
        if !committed {
            return Ok(());
        }
        let rounds = std::mem::take(&mut self.rounds);
        let previous = std::mem::replace(&mut self.leader_term, term);
        if rounds.len() > self.bound {
            return Err(format!(
                "the leader of term {term} was elected after {} rounds (terms {rounds:?}) since term {previous}",
                rounds.len()
            ));
        }
        Ok(())
    }
}

#[derive(Debug)]
pub struct StableLeader {
    from: Duration,
    until: Duration,
    /// The newest term seen before `from`.
    term: u64,
}

impl StableLeader {
    pub fn new(from: Duration, until: Duration) -> Self {
        StableLeader { from, until, term: 0 }
    }
}

impl Invariant for StableLeader {
    fn checks(&self, event: &SimEvent) -> bool {
        vote(event).is_some()
    }

    fn name(&self) -> &'static str {
        "no false failover: nobody stands while the leader lives"
    }

    fn observe(&mut self, node: &str, event: &SimEvent) -> Result<(), String> {
        self.observe_at(Duration::ZERO, node, event)
    }

    fn observe_at(&mut self, at: Duration, node: &str, event: &SimEvent) -> Result<(), String> {
        let Some((term, _)) = vote(event) else {
            return Ok(());
        };
        if at < self.from {
            self.term = self.term.max(term);
            return Ok(());
        }
        if at <= self.until && term > self.term {
            return Err(format!(
                "{node} saved a vote of term {term} at {at:?}, after the leader of term {} was established",
                self.term
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, committed: bool) -> SimEvent {
        SimEvent::Agent(AgentEvent::VoteSaved {
            term,
            voted_for: Some(1),
            committed,
        })
    }

    #[test]
    fn rounds_are_counted_from_one_leader_to_the_next() {
        let mut rounds = ElectionRounds::new(3);
        assert!(rounds.observe("s1", &vote(1, false)).is_ok());
        assert!(rounds.observe("s1", &vote(1, true)).is_ok());
        for term in 2..=4 {
            assert!(rounds.observe("s2", &vote(term, false)).is_ok());
        }
        assert!(
            rounds.observe("s2", &vote(4, true)).is_ok(),
            "three rounds are within the bound"
        );
        for term in 5..=8 {
            assert!(rounds.observe("s3", &vote(term, false)).is_ok());
        }
        assert!(rounds.observe("s3", &vote(8, true)).is_err(), "four are not");
        assert!(
            rounds.observe("s1", &vote(3, false)).is_ok(),
            "an old term's vote is history"
        );
    }

    #[test]
    fn a_candidacy_in_the_stable_window_is_a_false_failover() {
        let mut stable = StableLeader::new(Duration::from_secs(10), Duration::from_secs(60));
        assert!(stable.observe_at(Duration::from_secs(1), "s1", &vote(1, false)).is_ok());
        assert!(stable.observe_at(Duration::from_secs(2), "s1", &vote(2, true)).is_ok());
        assert!(
            stable.observe_at(Duration::from_secs(20), "s2", &vote(2, true)).is_ok(),
            "a follower accepting the same leader"
        );
        assert!(
            stable
                .observe_at(Duration::from_secs(30), "s3", &vote(3, false))
                .is_err()
        );
        assert!(
            stable
                .observe_at(Duration::from_secs(61), "s3", &vote(4, false))
                .is_ok(),
            "after the window"
        );
    }
}
