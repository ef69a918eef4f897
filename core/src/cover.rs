//! Coverage points: what the simulation counts to say which states, transitions and rare
//! paths its runs reached (issue 20 §2).
//!
//! Each point is a `tracing` event at TRACE level under the target [`TARGET`]: free when no
//! subscriber wants it (production logs at INFO), counted per run by the simulation's
//! subscriber. The core stays pure: it says what happened, the driver's world decides whether
//! anyone listens.

/// The target every coverage event is emitted under.
pub const TARGET: &str = "drover::cover";

/// A state machine moved from state `from` to state `to` (nothing when they are the same).
pub fn transition(machine: &'static str, from: &'static str, to: &'static str) {
    if from != to {
        tracing::trace!(target: "drover::cover", machine, from, to);
    }
}

/// A path worth knowing was taken (a rare branch, a recovery).
pub fn point(name: &'static str) {
    tracing::trace!(target: "drover::cover", point = name);
}
