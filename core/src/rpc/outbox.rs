//! What the leader's machines share: one op id space, one action queue in order, and the
//! proposals in flight with the machine each belongs to.
//!
//! Proposals are committed together when they arrive together (group commit): at most
//! [`MAX_IN_FLIGHT`] entries are handed to Raft at a time, and the proposals made while
//! they are in flight wait here and go out as one [`Command::Batch`] entry when one
//! lands — one log write and one round of replication for all of them. A lone proposal goes
//! out at once and as itself, so a quiet cluster's latency and log are as before; only
//! concurrent writers are batched, and they wait for nothing but the entry ahead of them
//! (no timer). Nomad batches only its plan and client updates; etcd and TigerBeetle batch
//! every request this way.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

use super::connect::ConnectFlow;
use super::jobs::JobFlow;
use super::nodes::NodeFlow;
use super::{Action, ReqId, ServerReply};
use crate::fsm::{Command, Response};
use crate::op::{OpId, OpIds};

/// One piece of work of any machine, numbered in the order work arrived (on leadership loss,
/// the requests still waiting are failed in that order).
pub(super) type JobId = u64;

/// Who a proposal's result goes back to.
#[derive(Debug)]
pub(super) enum Owner {
    /// A request answered with the proposal's index.
    Simple {
        req: ReqId,
    },
    Nodes(NodeFlow),
    Jobs(JobFlow),
    Drainer,
    /// The deployment watcher's proposal.
    Deployments,
    /// The periodic dispatcher's launch.
    Periodic,
    /// The leader's periodic garbage collection.
    CoreGc,
    /// A lapsed variable lock's expiry.
    VarLocks,
    /// A step of a CSI flow; the flow is the job of the same number in the CSI machine.
    Csi,
    /// Service identity token accessors.
    Connect(ConnectFlow),
}

/// Raft entries of proposals in flight at once. Two keep the log busy while the leader
/// applies and answers the one before; more would only cut the batches smaller.
pub const MAX_IN_FLIGHT: usize = 2;

/// Proposals in one batched entry at most, so an entry stays small to replicate.
pub const MAX_BATCH: usize = 64;
const _: () = assert!(MAX_IN_FLIGHT > 0 && MAX_BATCH > 0, "proposals make progress");

/// What a proposal's landing hands back to the machine that made it.
pub(super) type Landed = (JobId, Owner, Result<(u64, Response), crate::error::Failure>);

#[derive(Debug, Default)]
pub(super) struct Outbox {
    ops: OpIds,
    next_job: JobId,
    proposals: BTreeMap<OpId, (JobId, Owner)>,
    actions: VecDeque<Action>,
    /// Proposals made while [`MAX_IN_FLIGHT`] entries were in flight, in the order made.
    waiting: VecDeque<(OpId, Command)>,
    /// Entries handed to Raft and not yet landed: the op each went out as, and the
    /// proposals it carries (itself, or a batch's members in order).
    in_flight: BTreeMap<OpId, Vec<OpId>>,
}

impl Outbox {
    pub fn new_job(&mut self) -> JobId {
        self.next_job += 1;
        self.next_job
    }

    pub fn allocate(&mut self) -> OpId {
        self.ops.allocate()
    }

    pub fn propose(&mut self, job: JobId, owner: Owner, command: Command) {
        let op = self.ops.allocate();
        let previous = self.proposals.insert(op, (job, owner));
        debug_assert!(previous.is_none(), "op ids are never reused");
        self.waiting.push_back((op, command));
    }

    /// A proposal of a new job of its own.
    pub fn propose_new(&mut self, owner: Owner, command: Command) {
        let job = self.new_job();
        self.propose(job, owner, command);
    }

    pub fn reply(&mut self, req: ReqId, reply: ServerReply) {
        self.actions.push_back(Action::Reply { req, reply });
    }

    pub fn push(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    /// The next action: replies and calls in the order made, then the waiting proposals as
    /// one entry while fewer than [`MAX_IN_FLIGHT`] are in flight.
    pub fn pop(&mut self) -> Option<Action> {
        if let Some(action) = self.actions.pop_front() {
            return Some(action);
        }
        if self.waiting.is_empty() || self.in_flight.len() >= MAX_IN_FLIGHT {
            return None;
        }
        let take = self.waiting.len().min(MAX_BATCH);
        let (ops, mut commands): (Vec<OpId>, Vec<Command>) = self.waiting.drain(..take).unzip();
        let (op, command) = if let [op] = ops[..] {
            (op, commands.pop().expect("one command per op"))
        } else {
            crate::cover::point("group commit: concurrent proposals go out as one entry");
            (self.ops.allocate(), Command::Batch(commands))
        };
        debug_assert!(
            command
                .members()
                .iter()
                .all(|member| !matches!(member, Command::Batch(_))),
            "a batch never holds a batch"
        );
        self.in_flight.insert(op, ops);
        Some(Action::Propose {
            op,
            command: alloc::boxed::Box::new(command),
        })
    }

    /// The proposals the entry that went out as `op` carried, each with its own result: a
    /// batch's responses are dealt out in order, all at the entry's index; a failure is
    /// every member's. Proposals already failed (leadership lost) are gone and skipped.
    /// Whether `op` was handed out by this outbox (a proposal or a call to a client).
    pub fn issued(&self, op: OpId) -> bool {
        self.ops.issued(op)
    }

    pub fn landed(&mut self, op: OpId, result: Result<(u64, Response), crate::error::Failure>) -> Vec<Landed> {
        debug_assert!(
            self.ops.issued(op),
            "a proposal outcome for {op}, which this leader never issued"
        );
        let Some(ops) = self.in_flight.remove(&op) else {
            return Vec::new();
        };
        let results: Vec<Result<(u64, Response), crate::error::Failure>> = match (result, ops.len()) {
            (result, 1) => alloc::vec![result],
            (Ok((index, Response::Batch(responses))), members) if responses.len() == members => {
                responses.into_iter().map(|response| Ok((index, response))).collect()
            }
            (Ok((index, other)), members) => {
                debug_assert!(false, "a batch of {members} answered {other:?}");
                let why = alloc::format!("a batch of {members} proposals at index {index} was answered {other:?}");
                alloc::vec![Err(crate::error::Failure::unavailable(why)); members]
            }
            (Err(error), members) => alloc::vec![Err(error); members],
        };
        ops.into_iter()
            .zip(results)
            .filter_map(|(op, result)| {
                let (job, owner) = self.proposals.remove(&op)?;
                Some((job, owner, result))
            })
            .collect()
    }

    /// Every proposal not yet landed, to fail: those waiting are never proposed, and results
    /// of those in flight are dropped when they come.
    pub fn take_proposals(&mut self) -> BTreeMap<OpId, (JobId, Owner)> {
        self.waiting.clear();
        self.in_flight.clear();
        core::mem::take(&mut self.proposals)
    }
}
