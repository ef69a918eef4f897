//! Group commit: proposals made while entries are in flight go out together as one batched
//! entry when one lands, and every request is answered as if it had been committed alone.

use super::*;
use crate::rpc::outbox::{MAX_BATCH, MAX_IN_FLIGHT};
use alloc::boxed::Box;

fn register(h: &mut Harness, req: ReqId, id: &str) {
    let request = ServerRequest::JobRegister {
        job: Box::new(batch_job(id)),
        enforce_index: None,
    };
    send(h, req, request);
}

/// Hands `request` to the machine without answering any proposal it makes.
pub(super) fn send(h: &mut Harness, req: ReqId, request: ServerRequest) {
    let authority = crate::rpc::authz::Authority::Open;
    h.machine.handle(
        h.now,
        Input::Request {
            req,
            request,
            authority,
        },
        &h.fx.state,
    );
}

/// Takes the actions out without answering any proposal: (op, command) of each proposal.
pub(super) fn proposals(h: &mut Harness) -> Vec<(OpId, Command)> {
    let mut out = Vec::new();
    while let Some(action) = h.machine.poll_action() {
        match action {
            Action::Propose { op, command } => out.push((op, *command)),
            Action::Reply { req, reply } => h.replies.push((req, reply)),
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

/// Commits the entry that went out as `op` and tells the machine.
pub(super) fn land(h: &mut Harness, op: OpId, command: Command) {
    let response = h.fx.apply(command);
    let index = h.fx.index;
    h.machine.handle(
        h.now,
        Input::Proposed {
            op,
            result: Ok((index, response)),
        },
        &h.fx.state,
    );
}

/// Registers `first` (request 1) and `second` (request 2), each proposed alone, and returns
/// both entries, in flight: every slot is taken.
fn two_in_flight(h: &mut Harness, first: &str, second: &str) -> Vec<(OpId, Command)> {
    register(h, 1, first);
    let mut out = proposals(h);
    register(h, 2, second);
    out.extend(proposals(h));
    assert!(
        matches!(
            out[..],
            [(_, Command::JobRegister { .. }), (_, Command::JobRegister { .. })]
        ),
        "{out:?}"
    );
    out
}

fn registered(h: &Harness) -> Vec<(ReqId, u64)> {
    h.replies
        .iter()
        .map(|(req, reply)| match reply {
            ServerReply::JobRegistered { index, .. } => (*req, *index),
            other => panic!("request {req}: {other:?}"),
        })
        .collect()
}

#[test]
fn writes_made_while_entries_are_in_flight_are_committed_as_one_entry() {
    let mut h = Harness::new();
    // A lone write goes out at once, as itself; so does a second while the first is out.
    register(&mut h, 1, "a");
    let first = proposals(&mut h);
    register(&mut h, 2, "b");
    let second = proposals(&mut h);
    assert_eq!(MAX_IN_FLIGHT, 2);
    assert!(matches!(first[..], [(_, Command::JobRegister { .. })]), "{first:?}");
    assert!(matches!(second[..], [(_, Command::JobRegister { .. })]), "{second:?}");
    // Three more wait for a slot, and nothing is answered yet.
    for (req, id) in [(3, "c"), (4, "d"), (5, "e")] {
        register(&mut h, req, id);
        assert!(proposals(&mut h).is_empty());
    }
    assert!(h.replies.is_empty());
    // The first lands: it is answered, and the three go out as one entry, in arrival order.
    let (op, command) = first.into_iter().next().unwrap();
    land(&mut h, op, command);
    let batch = proposals(&mut h);
    let [(batch_op, Command::Batch(members))] = &batch[..] else {
        panic!("{batch:?}")
    };
    // (Behind them, the scheduler's plan for the job that landed: its machine proposes too.)
    let ids: Vec<&str> = members
        .iter()
        .filter_map(|member| match member {
            Command::JobRegister { job, .. } => Some(job.id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["c", "d", "e"]);
    assert_eq!(registered(&h).len(), 1);
    // The batch lands before the second: each of its writes is answered at the batch's index.
    land(&mut h, *batch_op, Command::Batch(members.clone()));
    let batch_index = h.fx.index;
    let (op, command) = second.into_iter().next().unwrap();
    land(&mut h, op, command);
    proposals(&mut h);
    let answered = registered(&h);
    assert_eq!(
        answered,
        [
            (1, batch_index - 1),
            (3, batch_index),
            (4, batch_index),
            (5, batch_index),
            (2, batch_index + 1)
        ]
    );
    for id in ["a", "b", "c", "d", "e"] {
        assert!(h.fx.state.job("default", id).is_some(), "job {id} stored");
    }
}

#[test]
fn a_batch_is_capped_and_the_rest_go_out_as_slots_free() {
    let mut h = Harness::new();
    let out = two_in_flight(&mut h, "first", "second");
    let waiting = MAX_BATCH + 3;
    for n in 0..waiting {
        register(&mut h, 10 + n as ReqId, &format!("j{n:03}"));
    }
    assert!(proposals(&mut h).is_empty());
    // One slot frees: the first MAX_BATCH go out; the next slot takes the other three.
    let mut out = out.into_iter();
    let (op, command) = out.next().unwrap();
    land(&mut h, op, command);
    let full = proposals(&mut h);
    let [(full_op, Command::Batch(members))] = &full[..] else {
        panic!("{full:?}")
    };
    assert_eq!(members.len(), MAX_BATCH);
    let (op, command) = out.next().unwrap();
    land(&mut h, op, command);
    let rest = proposals(&mut h);
    let [(_, Command::Batch(rest_members))] = &rest[..] else {
        panic!("{rest:?}")
    };
    // With them, the scheduler's plan for the job that landed (its machine proposes too).
    let names: Vec<&str> = rest_members.iter().map(Command::name).collect();
    assert_eq!(names, ["JobRegister", "JobRegister", "JobRegister", "PlanApply"]);
    land(&mut h, *full_op, Command::Batch(members.clone()));
    proposals(&mut h);
    assert_eq!(registered(&h).len(), 2 + MAX_BATCH);
}

#[test]
fn losing_leadership_fails_the_waiting_writes_and_never_proposes_them() {
    let mut h = Harness::new();
    let out = two_in_flight(&mut h, "a", "b");
    register(&mut h, 3, "c");
    register(&mut h, 4, "d");
    assert!(proposals(&mut h).is_empty());
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    assert!(proposals(&mut h).is_empty(), "the waiting writes are never proposed");
    let failed: Vec<ReqId> = h
        .replies
        .iter()
        .map(|(req, reply)| match reply {
            ServerReply::Error(error) if error.retryable => *req,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(failed, [1, 2, 3, 4], "every write fails as retryable, in arrival order");
    // The entries that were out land late, under a new leader: nothing more is answered and
    // the slots are free again once leadership returns.
    for (op, command) in out {
        land(&mut h, op, command);
    }
    assert_eq!(h.replies.len(), 4);
    h.machine.handle(h.now, Input::Leadership { leader: true }, &h.fx.state);
    proposals(&mut h);
    register(&mut h, 5, "e");
    let out = proposals(&mut h);
    assert!(matches!(out[..], [(_, Command::JobRegister { .. })]), "{out:?}");
}

#[test]
fn a_failed_batch_fails_each_of_its_writes() {
    let mut h = Harness::new();
    let out = two_in_flight(&mut h, "a", "b");
    register(&mut h, 3, "c");
    register(&mut h, 4, "d");
    let (op, command) = out[0].clone();
    land(&mut h, op, command);
    let batch = proposals(&mut h);
    let [(batch_op, Command::Batch(_))] = &batch[..] else {
        panic!("{batch:?}")
    };
    let batch_op = *batch_op;
    h.machine.handle(
        h.now,
        Input::Proposed {
            op: batch_op,
            result: Err(crate::error::Failure::unavailable("log write failed")),
        },
        &h.fx.state,
    );
    proposals(&mut h);
    // Each write of the batch fails as the entry did: unavailable, for the caller to retry.
    let failed: Vec<(ReqId, crate::error::ErrorKind, bool)> = h
        .replies
        .iter()
        .filter_map(|(req, reply)| match reply {
            ServerReply::Error(error) => Some((*req, error.kind, error.retryable)),
            _ => None,
        })
        .collect();
    let unavailable = crate::error::ErrorKind::Unavailable;
    assert_eq!(failed, [(3, unavailable, true), (4, unavailable, true)]);
    assert!(h.fx.state.job("default", "c").is_none());
}
