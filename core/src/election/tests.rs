use super::*;
use alloc::collections::BTreeSet;
use rand_chacha::rand_core::SeedableRng;

const MS: Duration = Duration::from_millis(1);

fn timing() -> ElectionTiming {
    crate::config::ServerTiming::default().elections()
}

fn view(role: RaftRole, term: u64, leader: Option<u64>, voters: &[u64]) -> RaftView {
    RaftView {
        role,
        term,
        leader,
        voted_for: leader,
        last_log_index: Some(1),
        voters: voters.iter().copied().collect::<BTreeSet<u64>>(),
        learners: BTreeSet::new(),
    }
}

fn at(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// Runs the timer until it asks for something, answering contact questions with `silent`.
fn next_action(
    elections: &mut Elections,
    rng: &mut ChaCha8Rng,
    silent: impl Fn(Instant) -> Option<Duration>,
) -> (Instant, ElectionAction) {
    loop {
        let now = elections.poll_timeout().expect("a timer is armed");
        match elections.handle_timeout(now, rng) {
            Some(ElectionAction::AskContact) => match elections.contact(now, silent(now), rng) {
                // The voters grant the pre-vote.
                Some(ElectionAction::PreVote) => {
                    return (now, elections.pre_vote_result(now, true, rng).expect("an election"));
                }
                Some(action) => return (now, action),
                None => {}
            },
            Some(ElectionAction::PreVote) => {
                return (now, elections.pre_vote_result(now, true, rng).expect("an election"));
            }
            Some(action) => return (now, action),
            None => panic!("the timer fired for nothing"),
        }
    }
}

#[test]
fn a_follower_stands_only_after_the_leader_is_silent_for_the_failure_timeout() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut elections = Elections::new(at(0), 2, timing());
    assert_eq!(
        elections.observe(at(0), &view(RaftRole::Follower, 1, Some(1), &[1, 2, 3]), &mut rng),
        None
    );
    // The leader heartbeats until 1 s, then dies.
    let dead_at = at(1_000);
    let silent = |now: Instant| {
        let last = if now < dead_at {
            Instant::from_nanos(now.as_nanos() - 10_000_000)
        } else {
            dead_at
        };
        Some(Duration::from_nanos(now.as_nanos() - last.as_nanos()))
    };
    let (stood, action) = next_action(&mut elections, &mut rng, silent);
    assert_eq!(action, ElectionAction::Elect);
    let waited = Duration::from_nanos(stood.as_nanos() - dead_at.as_nanos());
    let t = timing();
    assert!(
        waited >= t.failure_timeout && waited <= t.failure_timeout + t.spread,
        "stood {waited:?} after the leader went silent"
    );
}

#[test]
fn a_fresh_server_waits_a_failure_timeout_before_its_first_candidacy() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut elections = Elections::new(at(0), 2, timing());
    elections.observe(at(0), &view(RaftRole::Follower, 0, None, &[1, 2, 3]), &mut rng);
    let (stood, action) = next_action(&mut elections, &mut rng, |_| None);
    assert_eq!(action, ElectionAction::Elect);
    assert!(stood >= at(0) + timing().failure_timeout, "stood at {stood:?}");
}

#[test]
fn the_only_voter_stands_at_once_and_a_leader_or_learner_never() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut single = Elections::new(at(0), 1, timing());
    assert_eq!(
        single.observe(at(5), &view(RaftRole::Follower, 3, None, &[1]), &mut rng),
        Some(ElectionAction::Elect)
    );
    let mut leader = Elections::new(at(0), 1, timing());
    leader.observe(at(0), &view(RaftRole::Leader, 2, Some(1), &[1, 2, 3]), &mut rng);
    assert_eq!(leader.poll_timeout(), None);
    let mut learner = Elections::new(at(0), 4, timing());
    learner.observe(at(0), &view(RaftRole::Learner, 2, Some(1), &[1, 2, 3]), &mut rng);
    assert_eq!(learner.poll_timeout(), None);
}

#[test]
fn a_named_successor_stands_when_the_lease_runs_out_not_after_the_failure_timeout() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut elections = Elections::new(at(0), 2, timing());
    elections.observe(at(0), &view(RaftRole::Follower, 1, Some(1), &[1, 2, 3]), &mut rng);
    // The leader's last heartbeat came at 990 ms; it names us at 1 s and stops.
    elections.stand_now(at(1_000));
    let (stood, action) = next_action(&mut elections, &mut rng, |now| {
        Some(Duration::from_nanos(now.as_nanos() - at(990).as_nanos()))
    });
    assert_eq!(action, ElectionAction::Elect);
    let t = timing();
    assert!(
        stood >= at(990) + t.lease,
        "stood at {stood:?}, inside the voters' lease"
    );
    assert!(
        stood <= at(990) + t.lease + super::HANDOVER_MARGIN + 5 * MS,
        "stood at {stood:?}, long after the lease"
    );
}

/// Candidates that stood at the same instant (the split vote openraft 0.9's fixed timeouts
/// repeat forever) stand next in disjoint turns: the next round is at least 20 ms apart
/// between any two of them (many round trips on a LAN), in every seed, so the split vote
/// ends in the round after it.
#[test]
fn after_a_split_vote_the_next_round_cannot_collide_in_any_seed() {
    let voters = [1, 2, 3, 4, 5];
    let mut closest = u64::MAX;
    for seed in 0..2_000u64 {
        let mut next = Vec::new();
        for id in voters {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (id << 40));
            let mut server = Elections::new(at(0), id, timing());
            server.observe(at(0), &view(RaftRole::Follower, 1, None, &voters), &mut rng);
            // Everyone stands at 1 s (no leader known); all are candidates of term 2, no winner.
            assert_eq!(
                server.handle_timeout(at(1_000), &mut rng),
                Some(ElectionAction::PreVote)
            );
            assert_eq!(
                server.pre_vote_result(at(1_000), true, &mut rng),
                Some(ElectionAction::Elect)
            );
            let mut candidate = view(RaftRole::Candidate, 2, None, &voters);
            candidate.voted_for = Some(id);
            server.observe(at(1_000), &candidate, &mut rng);
            next.push(server.poll_timeout().expect("armed").as_nanos());
        }
        next.sort_unstable();
        closest = closest.min(next.windows(2).map(|pair| pair[1] - pair[0]).min().unwrap());
        let last = Duration::from_nanos(next[4]) - Duration::from_millis(1_000);
        assert!(
            last < Duration::from_millis(700),
            "seed {seed}: the last turn comes {last:?} later"
        );
    }
    assert!(closest >= 20_000_000, "two turns only {closest} ns apart");
}

/// A stale candidate's terms pass by without restarting the timer of a server that refused
/// it; granting a vote does restart it.
#[test]
fn only_a_granted_vote_restarts_the_timer_not_a_passing_term() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let voters = [1, 2, 3];
    let mut elections = Elections::new(at(0), 3, timing());
    elections.observe(at(0), &view(RaftRole::Follower, 4, None, &voters), &mut rng);
    let due = elections.poll_timeout().unwrap();
    for (term, ms) in [(5, 50), (6, 100), (7, 150)] {
        let mut refused = view(RaftRole::Follower, term, None, &voters);
        refused.voted_for = None;
        elections.observe(at(ms), &refused, &mut rng);
        assert_eq!(elections.poll_timeout(), Some(due), "term {term} moved the timer");
    }
    let mut granted = view(RaftRole::Follower, 8, None, &voters);
    granted.voted_for = Some(1);
    elections.observe(at(180), &granted, &mut rng);
    assert!(elections.poll_timeout().unwrap() >= at(180) + timing().retry_min);
}

/// A refused pre-vote moves no term and is asked again after a random pause; a named
/// successor stands without one.
#[test]
fn a_refused_pre_vote_is_asked_again_later_and_a_successor_needs_none() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let voters = [1, 2, 3];
    let mut elections = Elections::new(at(0), 2, timing());
    elections.observe(at(0), &view(RaftRole::Follower, 3, None, &voters), &mut rng);
    let due = elections.poll_timeout().unwrap();
    assert_eq!(elections.handle_timeout(due, &mut rng), Some(ElectionAction::PreVote));
    assert_eq!(elections.poll_timeout(), None, "nothing else while the pre-vote is out");
    assert_eq!(elections.pre_vote_result(due, false, &mut rng), None);
    let again = elections.poll_timeout().unwrap();
    assert!(again >= due + timing().retry_min && again < due + timing().retry_max);
    assert_eq!(elections.rounds(), 0, "a refused pre-vote is no election round");

    let mut successor = Elections::new(at(0), 3, timing());
    successor.observe(at(0), &view(RaftRole::Follower, 3, Some(1), &voters), &mut rng);
    successor.stand_now(at(500));
    assert_eq!(
        successor.handle_timeout(at(500), &mut rng),
        Some(ElectionAction::AskContact)
    );
    let silent = timing().lease + super::HANDOVER_MARGIN + Duration::from_millis(1);
    assert_eq!(
        successor.contact(at(500), Some(silent), &mut rng),
        Some(ElectionAction::Elect)
    );
}

/// A pre-vote answered after another candidate won, or after this server voted for another,
/// starts no election: it would only depose the winner or break the round it joined.
#[test]
fn a_late_pre_vote_answer_deposes_no_one() {
    let voters = [1, 2, 3];
    for interruption in ["new leader", "vote granted"] {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut elections = Elections::new(at(0), 3, timing());
        elections.observe(at(0), &view(RaftRole::Follower, 2, None, &voters), &mut rng);
        let due = elections.poll_timeout().unwrap();
        assert_eq!(elections.handle_timeout(due, &mut rng), Some(ElectionAction::PreVote));
        let mut meanwhile = match interruption {
            "new leader" => view(RaftRole::Follower, 3, Some(1), &voters),
            _ => view(RaftRole::Follower, 3, None, &voters),
        };
        meanwhile.voted_for = Some(1);
        elections.observe(due, &meanwhile, &mut rng);
        assert_eq!(elections.pre_vote_result(due, true, &mut rng), None, "{interruption}");
        assert!(
            elections.poll_timeout().is_some(),
            "{interruption}: the timer still runs"
        );
    }
}

fn ids(list: &[u64]) -> BTreeSet<u64> {
    list.iter().copied().collect()
}

#[test]
fn a_pre_vote_needs_a_majority_of_every_configuration() {
    // One configuration: two of three.
    assert!(pre_vote_won(&[ids(&[1, 2, 3])], &ids(&[3, 2])));
    assert!(!pre_vote_won(&[ids(&[1, 2, 3])], &ids(&[3])));
    // Removing 3 (joint {1,2,3} and {1,2}): 3 and 2 are a majority of the old voters but not of
    // the new, where 1 (whose log is longer) refuses. A swarm run with production's 30 s
    // retry_join livelocked on this for 400 s: 3 stood every round with 2's vote, moving the
    // term past 1, the only server both configurations could elect.
    let joint = [ids(&[1, 2, 3]), ids(&[1, 2])];
    assert!(!pre_vote_won(&joint, &ids(&[3, 2])));
    assert!(pre_vote_won(&joint, &ids(&[1, 2])));
    // Four voters: three are needed, two are a tie.
    assert!(!pre_vote_won(&[ids(&[1, 2, 3, 4])], &ids(&[1, 2])));
    assert!(pre_vote_won(&[ids(&[1, 2, 3, 4])], &ids(&[1, 2, 4])));
    // No membership: nothing to win.
    assert!(!pre_vote_won(&[], &ids(&[1])));
}

#[test]
fn pre_vote_is_granted_to_an_up_to_date_candidate_once_the_leader_is_quiet() {
    let heard = LeaderHeard {
        leading: false,
        following: true,
        silent_for: Some(Duration::from_millis(100)),
        quiet: Duration::from_millis(500),
    };
    assert!(!may_pre_vote(&heard), "the leader was heard 100 ms ago");
    let quiet = LeaderHeard {
        silent_for: Some(Duration::from_millis(500)),
        ..heard
    };
    assert!(may_pre_vote(&quiet));
    assert!(
        may_pre_vote(&LeaderHeard {
            silent_for: None,
            ..heard
        }),
        "never heard since start"
    );
    assert!(
        may_pre_vote(&LeaderHeard {
            following: false,
            ..heard
        }),
        "no leader known"
    );
    assert!(
        !may_pre_vote(&LeaderHeard { leading: true, ..quiet }),
        "a leader never grants"
    );
    let mine = Some((3, 10));
    assert!(candidate_up_to_date(Some((3, 10)), mine));
    assert!(!candidate_up_to_date(Some((3, 9)), mine), "a shorter log");
    assert!(!candidate_up_to_date(Some((2, 50)), mine), "an older term");
    assert!(candidate_up_to_date(Some((4, 1)), mine), "a newer term");
    assert!(!candidate_up_to_date(None, mine), "an empty log against ours");
    assert!(candidate_up_to_date(None, None));
}

#[test]
fn the_successor_is_the_most_caught_up_other_voter_lowest_id_on_ties() {
    let voters: BTreeSet<u64> = [1, 2, 3, 4].into();
    let replication = [(2, Some(7)), (3, Some(9)), (4, Some(9)), (5, Some(12)), (1, Some(12))];
    assert_eq!(
        successor(1, &voters, &replication),
        Some((3, Some(9))),
        "5 is no voter, 1 is me"
    );
    assert_eq!(successor(1, &voters, &[(2, None)]), Some((2, None)));
    assert_eq!(successor(1, &voters, &[]), None);
    assert!(successor_caught_up(Some((3, Some(9))), Some(9)));
    assert!(!successor_caught_up(Some((3, Some(8))), Some(9)));
    assert!(
        successor_caught_up(None, Some(9)),
        "no other voter: nothing to wait for"
    );
}
