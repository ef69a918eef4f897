//! What the leader's machines share: one op id space, one action queue in order, and the
//! proposals in flight with the machine each belongs to.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, VecDeque};

use super::connect::ConnectFlow;
use super::jobs::JobFlow;
use super::nodes::NodeFlow;
use super::{Action, ReqId, ServerReply};
use crate::fsm::Command;
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
    /// A step of a CSI flow; the flow is the job of the same number in the CSI machine.
    Csi,
    /// Service identity token accessors.
    Connect(ConnectFlow),
}

#[derive(Debug, Default)]
pub(super) struct Outbox {
    ops: OpIds,
    next_job: JobId,
    proposals: BTreeMap<OpId, (JobId, Owner)>,
    actions: VecDeque<Action>,
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
        self.actions.push_back(Action::Propose {
            op,
            command: alloc::boxed::Box::new(command),
        });
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

    pub fn pop(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn take_proposal(&mut self, op: OpId) -> Option<(JobId, Owner)> {
        self.proposals.remove(&op)
    }

    pub fn take_proposals(&mut self) -> BTreeMap<OpId, (JobId, Owner)> {
        core::mem::take(&mut self.proposals)
    }
}
