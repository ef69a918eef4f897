//! Read indexes asked for at once share one quorum round (etcd batches ReadIndex the same
//! way).
//!
//! openraft 0.9 runs a heartbeat round to every follower for each read index asked, and a
//! follower's replication stream carries one request at a time: under hundreds of reads a
//! second the rounds queued up behind each other and starved log replication (the
//! `read_storm` simulation, seed 31: writes stalled for 20 s and 97% of the reads failed).
//! Here at most one round runs; every read that arrives meanwhile waits for the next round,
//! which starts after it arrived, so its index is still one the leader confirmed after the
//! read began (what linearizability needs). The driver runs each round against openraft.

#[allow(unused_imports)]
use crate::prelude::*;

/// The reads waiting for a round, and whether one runs. `W` is how the driver answers one.
#[derive(Debug)]
pub struct ReadRounds<W> {
    running: bool,
    waiting: Vec<W>,
    /// The regression switch `RaftFaults::reads_join_running_round`: a read joins the round
    /// already running, whose index may predate it.
    join_running_round: bool,
}

impl<W> ReadRounds<W> {
    pub fn new(join_running_round: bool) -> Self {
        ReadRounds {
            running: false,
            waiting: Vec::new(),
            join_running_round,
        }
    }

    /// A read arrives: `true` when no round runs, and the caller starts the rounds.
    pub fn ask(&mut self, waiter: W) -> bool {
        self.waiting.push(waiter);
        !core::mem::replace(&mut self.running, true)
    }

    /// The next round starts: the reads it answers (those waiting now), or `None` when
    /// nobody waits any more and the rounds stop.
    pub fn start_round(&mut self) -> Option<Vec<W>> {
        if self.waiting.is_empty() {
            self.running = false;
            return None;
        }
        if self.join_running_round {
            return Some(Vec::new());
        }
        Some(core::mem::take(&mut self.waiting))
    }

    /// The round's index is known: the reads to answer with it (with the defect switched on,
    /// also those that arrived while it ran).
    pub fn round_ended(&mut self, started_with: Vec<W>) -> Vec<W> {
        if self.join_running_round {
            return core::mem::take(&mut self.waiting);
        }
        started_with
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_arrives_during_a_round_waits_for_the_next_one() {
        let mut rounds = ReadRounds::new(false);
        assert!(rounds.ask(1), "the first read starts the rounds");
        assert!(!rounds.ask(2), "one round at a time");
        let first = rounds.start_round().unwrap();
        assert!(!rounds.ask(3), "arrives while the round runs");
        assert_eq!(rounds.round_ended(first), [1, 2]);
        let second = rounds.start_round().unwrap();
        assert_eq!(rounds.round_ended(second), [3]);
        assert_eq!(rounds.start_round(), None, "nobody waits: the rounds stop");
        assert!(rounds.ask(4), "and the next read starts them again");
    }

    #[test]
    fn the_switched_on_defect_answers_a_late_read_with_the_running_round() {
        let mut rounds = ReadRounds::new(true);
        rounds.ask(1);
        let first = rounds.start_round().unwrap();
        rounds.ask(2);
        assert_eq!(rounds.round_ended(first), [1, 2], "2 got an index from before it began");
    }
}
