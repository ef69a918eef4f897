//! When this server stands for Raft election (the timer openraft 0.9 would otherwise run).
//!
//! openraft 0.9 draws one election timeout per server for its whole life, adds a leader lease
//! of `election_timeout_max` to the first candidacy after a leader, and checks both on
//! heartbeat ticks. Two servers whose timeouts lie close together therefore split the vote
//! round after round, and failover costs lease plus timeout (1.8–2.4 s with the old
//! 600–1200 ms). Classic Raft (and etcd, and hashicorp/raft) draws a fresh timeout every round.
//! This machine does that instead, and the driver turns openraft's own timer off:
//!
//! - While a leader is known, a follower checks after [`ElectionTiming::failure_timeout`] plus
//!   a random spread whether the leader has been silent that long (the driver measures the
//!   time since its last AppendEntries; heartbeats never pass through the core). If so, it
//!   stands; if not, it checks again when that silence would have passed.
//! - With no leader known (votes still being cast, a fresh start), it stands after a fresh
//!   random pause in `[retry_min, retry_max)`: a round that is winning has that long to
//!   finish before the next one replaces it. After a candidacy of its own that elected no
//!   one (a split vote), the voters take turns by id in disjoint slots, so the next round
//!   cannot collide again: a split vote costs at most one extra round (two if the first in
//!   turn has a shorter log and is refused).
//! - A server that just started waits a whole failure timeout before its first candidacy, so a
//!   restarted follower does not depose a healthy leader before it has heard from it.
//! - Before standing, a server asks the voters for a pre-vote (Raft thesis §9.6): they grant
//!   it when its log is at least as up to date as theirs and they have not heard a leader
//!   for half a failure timeout. Only a granted pre-vote starts an election, so a server with
//!   a stale log, or one cut off from a leader the others still hear, never moves the term.
//! - The only voter stands at once (openraft's rule for single-server clusters).
//! - [`Elections::stand_now`]: a leader leaving gracefully names a successor, which stands as
//!   soon as the voters' leader lease has run out instead of waiting for the failure timeout.
//!
//! Safety is Raft's (terms, votes, log checks in openraft); this machine decides only when.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeSet;
use core::time::Duration;

/// How long past its own view of the lease a named successor waits before it stands. The other
/// voters may have heard the leaving leader's last heartbeat later than the successor did (by
/// up to the difference in one-way latency); a voter still within its lease refuses the vote,
/// and the handover falls back to a full election timeout. 5 ms was too little with 1-10 ms
/// of latency (leader_stops_gracefully seed 4, once reads were batched: 296 ms, three terms).
const HANDOVER_MARGIN: Duration = Duration::from_millis(15);

use rand_010::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::time::Instant;
use serde::{Deserialize, Serialize};

/// The timings of [`Elections`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTiming {
    /// Silence from the leader after which a follower stands (after the spread).
    pub failure_timeout: Duration,
    /// The random extra on top of the failure timeout, drawn every time.
    pub spread: Duration,
    /// The pause before the next candidacy while no leader is known, drawn every round.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// openraft's leader lease (its `election_timeout_max`): voters refuse other candidates
    /// for this long after they last heard their leader.
    pub lease: Duration,
}

/// What the driver is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectionAction {
    /// Tell the core how long since the last AppendEntries from the leader
    /// ([`Elections::contact`]).
    AskContact,
    /// Ask the voters whether they would vote for this server, without changing any term
    /// (Raft's pre-vote, thesis §9.6); answered with [`Elections::pre_vote_result`].
    PreVote,
    /// Start an election now (openraft's `trigger().elect()`).
    Elect,
}

#[derive(Debug)]
pub struct Elections {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    self_id: u64,
    timing: ElectionTiming,
    /// The next check or candidacy.
    next_at: Option<Instant>,
    /// An `AskContact` is out.
    asking: bool,
    /// The role, term, leader and vote last observed.
    seen: (RaftRole, u64, Option<u64>, Option<u64>),
    /// When the current leader was first seen: it counts as heard then.
    leader_seen_at: Instant,
    voter: bool,
    sole_voter: bool,
    /// This server's position among the voters by id (the tie-breaker of repeated rounds).
    rank: u32,
    /// Candidacies since a leader was last known (for the log and the coverage of tests).
    rounds: u32,
    /// A graceful handover names this server: stand once the lease has run out.
    handover: bool,
    /// A pre-vote is out.
    pre_voting: bool,
}

impl Elections {
    pub fn new(now: Instant, self_id: u64, timing: ElectionTiming) -> Self {
        Elections {
            clock: crate::time::Monotonic::default(),
            self_id,
            timing,
            next_at: Some(now + timing.failure_timeout),
            asking: false,
            seen: (RaftRole::Follower, 0, None, None),
            leader_seen_at: now,
            voter: false,
            sole_voter: false,
            rank: 0,
            rounds: 0,
            handover: false,
            pre_voting: false,
        }
    }

    /// Candidacies since a leader was last known.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_at.filter(|_| self.voter && !self.asking && !self.pre_voting)
    }

    /// A new view of Raft. As in Raft, the timer restarts when a leader is heard or this
    /// server grants its vote, and not when another candidate's term merely passes by: a
    /// server with a stale log that stands again and again must not keep the up-to-date ones
    /// from standing (the simulation found that livelock, partition_during_formation seed 44).
    pub fn observe(&mut self, now: Instant, view: &RaftView, rng: &mut ChaCha8Rng) -> Option<ElectionAction> {
        self.voter = view.voters.contains(&self.self_id);
        self.sole_voter = self.voter && view.voters.len() == 1;
        self.rank = view.voters.iter().position(|id| *id == self.self_id).unwrap_or(0) as u32;
        let seen = (view.role, view.term, view.leader, view.voted_for);
        if seen == self.seen {
            return self.sole_voter_stands(view);
        }
        let before = core::mem::replace(&mut self.seen, seen);
        if seen.2 != before.2 {
            self.leader_seen_at = now;
        }
        match view.role {
            RaftRole::Leader => {
                self.next_at = None;
                self.rounds = 0;
                self.handover = false;
            }
            _ if view.leader.is_some() => {
                if seen.2 != before.2 {
                    // A pre-vote granted before this leader won must not depose it.
                    self.pre_voting = false;
                }
                if seen.2 != before.2 || self.next_at.is_none() {
                    // A leader was just heard (or chosen): it has a failure timeout to be
                    // heard again.
                    if self.rounds > 0 {
                        tracing::info!(rounds = self.rounds, leader = ?view.leader, "election settled");
                    }
                    self.rounds = 0;
                    self.next_at = Some(now + self.failure_wait(rng));
                }
            }
            _ => {
                let granted = view.voted_for.is_some_and(|id| id != self.self_id)
                    && (view.voted_for, view.term) != (before.3, before.1);
                if granted {
                    // Another candidate has our vote: a pre-vote of ours still out is moot
                    // (standing now would only break that candidate's round).
                    self.pre_voting = false;
                }
                if granted || self.next_at.is_none() {
                    self.next_at = Some(now + self.retry_wait(rng, self.rounds > 0));
                }
            }
        }
        self.sole_voter_stands(view)
    }

    /// The only voter needs nobody's vote, not even a pre-vote.
    fn sole_voter_stands(&mut self, view: &RaftView) -> Option<ElectionAction> {
        (self.sole_voter && view.role != RaftRole::Leader && view.role != RaftRole::Candidate).then(|| {
            self.next_at = None;
            ElectionAction::Elect
        })
    }

    /// The timer fired.
    pub fn handle_timeout(&mut self, now: Instant, rng: &mut ChaCha8Rng) -> Option<ElectionAction> {
        self.clock.observe(now);
        if self.next_at.is_none_or(|at| at > now) || self.asking || self.pre_voting || !self.voter {
            return None;
        }
        self.next_at = None;
        if self.seen.2.is_some() && self.seen.0 != RaftRole::Leader {
            self.asking = true;
            return Some(ElectionAction::AskContact);
        }
        Some(self.stand(now, rng))
    }

    /// The driver's answer to `AskContact`: the time since the leader was last heard (`None`
    /// when it never was).
    pub fn contact(
        &mut self,
        now: Instant,
        silent_for: Option<Duration>,
        rng: &mut ChaCha8Rng,
    ) -> Option<ElectionAction> {
        if !core::mem::take(&mut self.asking) || !self.voter || self.seen.0 == RaftRole::Leader {
            return None;
        }
        let patience = if self.handover {
            self.timing.lease + HANDOVER_MARGIN
        } else {
            self.timing.failure_timeout
        };
        let since_seen = now - self.leader_seen_at;
        let silent = silent_for.map_or(since_seen, |silent| silent.min(since_seen));
        if silent >= patience {
            return Some(self.stand(now, rng));
        }
        let jitter = if self.handover {
            Duration::ZERO
        } else {
            self.spread(rng)
        };
        self.next_at = Some(now + (patience - silent) + jitter);
        None
    }

    /// A leader leaving gracefully named this server its successor.
    pub fn stand_now(&mut self, now: Instant) -> Option<ElectionAction> {
        if !self.voter || self.seen.0 == RaftRole::Leader {
            return None;
        }
        self.handover = true;
        self.next_at = Some(now);
        None
    }

    /// Time to stand: a named successor at once, anyone else after a pre-vote.
    fn stand(&mut self, now: Instant, rng: &mut ChaCha8Rng) -> ElectionAction {
        if core::mem::take(&mut self.handover) {
            return self.elect(now, rng);
        }
        self.pre_voting = true;
        ElectionAction::PreVote
    }

    /// The voters' answer to a pre-vote: a majority (this server included) would vote for it.
    /// Refused — its log is behind a voter's, or the voters still hear a leader — it tries
    /// again after a random pause, without having moved any term: a server with a stale log
    /// can no longer push the terms past the one that should win (the livelock the
    /// simulation found in leader_killed/1172 and /6756: openraft does not adopt the term of
    /// a vote it refuses by log, so the up-to-date server kept standing one term behind).
    pub fn pre_vote_result(&mut self, now: Instant, granted: bool, rng: &mut ChaCha8Rng) -> Option<ElectionAction> {
        if !core::mem::take(&mut self.pre_voting) || !self.voter || self.seen.0 == RaftRole::Leader {
            return None;
        }
        if granted {
            return Some(self.elect(now, rng));
        }
        self.next_at = Some(now + self.retry_wait(rng, false));
        None
    }

    fn elect(&mut self, now: Instant, rng: &mut ChaCha8Rng) -> ElectionAction {
        self.rounds += 1;
        if self.rounds > 1 {
            tracing::info!(
                rounds = self.rounds,
                term = self.seen.1,
                "no leader yet; standing again"
            );
        }
        self.next_at = Some(now + self.retry_wait(rng, self.rounds > 0));
        ElectionAction::Elect
    }

    fn spread(&self, rng: &mut ChaCha8Rng) -> Duration {
        let spread = self.timing.spread.as_millis() as u64;
        Duration::from_millis(if spread == 0 { 0 } else { rng.random_range(0..spread) })
    }

    fn failure_wait(&self, rng: &mut ChaCha8Rng) -> Duration {
        self.timing.failure_timeout + self.spread(rng)
    }

    /// The pause before the next candidacy while no leader is known. Before this server stood
    /// (it granted its vote, or just started) or after a refused pre-vote (`in_turns` false), a
    /// random pause in `[retry_min, retry_max)`.
    /// After a candidacy of its own that elected no one — most likely a split vote — the
    /// voters take turns by id: slot `rank`, a lease wide, a third of a lease apart, so the
    /// next round cannot collide again and a split vote ends in the round after it.
    fn retry_wait(&self, rng: &mut ChaCha8Rng, in_turns: bool) -> Duration {
        let (min, max) = (
            self.timing.retry_min.as_millis() as u64,
            self.timing.retry_max.as_millis() as u64,
        );
        if !in_turns {
            return Duration::from_millis(if max > min { rng.random_range(min..max) } else { min });
        }
        let slot = (self.timing.lease.as_millis() as u64).max(1);
        let gap = slot / 3;
        Duration::from_millis(min + u64::from(self.rank) * (slot + gap) + rng.random_range(0..slot))
    }
}

/// Whether a pre-vote is won: a majority of every configuration in force granted it, the
/// candidate's own vote among `granted`. During a membership change Raft's joint consensus
/// (§4.3) holds two configurations, and an election needs a majority of each: a candidate
/// counted against the union alone (what the driver did until a swarm run with production's
/// `retry_join` interval livelocked for 400 s) can hold a majority of the old voters yet never
/// win the new ones, and then stands round after round, moving the term past the one server
/// both configurations could elect. With no configuration (no membership yet) it is never
/// won.
pub fn pre_vote_won(configs: &[BTreeSet<u64>], granted: &BTreeSet<u64>) -> bool {
    !configs.is_empty()
        && configs
            .iter()
            .all(|config| config.iter().filter(|id| granted.contains(id)).count() * 2 > config.len())
}

/// What a server knows of its leader when a candidate asks for its pre-vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderHeard {
    /// This server leads.
    pub leading: bool,
    /// This server follows a leader (another server).
    pub following: bool,
    /// How long since that leader's last AppendEntries arrived (`None`: none since start).
    pub silent_for: Option<Duration>,
    /// A follower grants only once its leader has been silent this long.
    pub quiet: Duration,
}

/// Raft's pre-vote rule (thesis §9.6), its first half: a server grants only when it does not
/// lead and has not heard a leader for `quiet`. A server that still hears its leader keeps a
/// partitioned, returning server from disrupting the cluster.
pub fn may_pre_vote(heard: &LeaderHeard) -> bool {
    let quiet = heard.silent_for.is_none_or(|silent| silent >= heard.quiet);
    !heard.leading && (!heard.following || quiet)
}

/// Its second half: the candidate's last log id (term, index) is at least as up to date as
/// ours (`None`: an empty log).
pub fn candidate_up_to_date(candidate: Option<(u64, u64)>, mine: Option<(u64, u64)>) -> bool {
    candidate >= mine
}

/// The successor a leaving leader names: of the other voters, the one that acknowledged the
/// most of its log (ties: the lowest id). `replication` is what the leader knows of each
/// follower: its id and the last index it acknowledged.
pub fn successor(me: u64, voters: &BTreeSet<u64>, replication: &[(u64, Option<u64>)]) -> Option<(u64, Option<u64>)> {
    replication
        .iter()
        .filter(|(id, _)| *id != me && voters.contains(id))
        .map(|(id, matched)| (*id, *matched))
        .max_by_key(|(id, matched)| (*matched, core::cmp::Reverse(*id)))
}

/// Whether a leaving leader may name its successor now: some voter holds its whole log (or
/// there is no other voter). Otherwise a write in flight can sit in one voter's log and not in
/// the successor's, and that voter refuses the successor's vote (the simulation's
/// `leader_stops_gracefully` seed 833: a normal election 240 ms later).
pub fn successor_caught_up(successor: Option<(u64, Option<u64>)>, last_log_index: Option<u64>) -> bool {
    successor.is_none_or(|(_, matched)| matched >= last_log_index)
}

#[cfg(test)]
mod tests;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RaftRole {
    #[default]
    Follower,
    Candidate,
    Leader,
    Learner,
    Shutdown,
}

/// What the driver's Raft instance looks like right now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftView {
    pub role: RaftRole,
    pub term: u64,
    pub leader: Option<u64>,
    /// Whom this server voted for in `term`.
    pub voted_for: Option<u64>,
    pub last_log_index: Option<u64>,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
}
