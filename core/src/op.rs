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
}
