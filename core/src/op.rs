//! Operation ids: every action that starts I/O carries one, and its outcome comes back as an
//! input carrying the same id. A reply whose id is no longer pending (it timed out, or the
//! machine moved on) is ignored, which is how the core owns every deadline.

use core::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OpId(pub u64);

impl fmt::Debug for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}

/// Hands out operation ids in increasing order; one per machine tree, shared by reference.
#[derive(Debug, Default)]
pub struct OpIds {
    next: u64,
}

impl OpIds {
    pub fn allocate(&mut self) -> OpId {
        self.next += 1;
        OpId(self.next)
    }

    /// Whether `op` was handed out here: an outcome for an op never issued is a driver's bug
    /// (answering another machine's op, or inventing one), checked where outcomes come in.
    pub fn issued(&self, op: OpId) -> bool {
        (1..=self.next).contains(&op.0)
    }
}

/// What a driver keeps of the ops it was asked to carry out, to check its own side of the
/// seam: each is answered once, and only ops it was given are answered.
#[derive(Debug, Default)]
pub struct Outstanding {
    ops: alloc::collections::BTreeSet<OpId>,
    /// Cancelled by the core: an answer may still come (the work finished before it was
    /// stopped), once.
    cancelled: alloc::collections::BTreeSet<OpId>,
}

impl Outstanding {
    /// The core asked for `op`.
    pub fn started(&mut self, op: OpId) {
        let fresh = self.ops.insert(op);
        debug_assert!(fresh, "{op} handed to the driver twice");
    }

    /// The driver answers `op`: it must be one it was given and has not answered yet.
    pub fn answered(&mut self, op: OpId) {
        let known = self.ops.remove(&op) || self.cancelled.remove(&op);
        debug_assert!(known, "{op} answered twice, or never asked for");
    }

    /// The core cancelled `op`: the driver stops it, and may or may not answer it.
    pub fn cancelled(&mut self, op: OpId) {
        if self.ops.remove(&op) {
            self.cancelled.insert(op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ops_handed_out_count_as_issued() {
        let mut ops = OpIds::default();
        assert!(!ops.issued(OpId(1)));
        let op = ops.allocate();
        assert!(ops.issued(op));
        assert!(!ops.issued(OpId(0)) && !ops.issued(OpId(2)));
    }

    #[test]
    fn a_cancelled_op_may_still_be_answered_once() {
        let mut outstanding = Outstanding::default();
        outstanding.started(OpId(1));
        outstanding.cancelled(OpId(1));
        outstanding.answered(OpId(1));
    }

    #[test]
    #[should_panic(expected = "answered twice, or never asked for")]
    fn an_op_answered_twice_is_caught() {
        let mut outstanding = Outstanding::default();
        outstanding.started(OpId(1));
        outstanding.answered(OpId(1));
        outstanding.answered(OpId(1));
    }

    #[test]
    #[should_panic(expected = "handed to the driver twice")]
    fn an_op_handed_out_twice_is_caught() {
        let mut outstanding = Outstanding::default();
        outstanding.started(OpId(1));
        outstanding.started(OpId(1));
    }
}
