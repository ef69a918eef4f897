//! Drover's decisions, as sans-IO state machines.
//!
//! Every machine has the same shape: `handle(now, Input)`, `handle_timeout(now)`,
//! `poll_action() -> Option<Action>`, `poll_timeout() -> Option<Instant>`. Time enters only as
//! the `now` argument ([`time::Instant`]); randomness only as a seed handed in; every action that
//! starts I/O carries an [`op::OpId`] and its outcome returns as an input with the same id.
//!
//! Architecture invariant: this crate has no async, no clock, no threads, no files and no
//! sockets, and iterates only ordered collections. `tests/it/purity.rs` checks the dependency tree.

#![no_std]
#![forbid(unsafe_code)]
extern crate alloc;
#[cfg(test)]
extern crate std;

/// What `std`'s prelude would give us, from `alloc`.
#[allow(unused_imports)]
mod prelude {
    pub use alloc::string::{String, ToString};
    pub use alloc::vec::Vec;
    pub use alloc::{format, vec};
}

pub mod acl;
pub mod agent;
pub mod autopilot;
pub mod bexpr;
pub mod bootstrap;
pub mod client;
pub mod codec;
pub mod config;
pub mod connect;
pub mod cover;
pub mod csi;
pub mod deploy;
pub mod drainer;
pub mod driverspec;
pub mod election;
pub mod error;
pub mod fsm;
pub mod gc;
pub mod goduration;
pub mod hash;
pub mod heartbeat;
pub mod humanize;
pub mod jobspec;
pub mod membership;
pub mod op;
pub mod periodic;
pub mod rpc;
pub mod scheduler;
pub mod server;
pub mod structs;
pub mod taskenv;
/// Builders for tests and benches (this crate's tests, or the `testkit` feature).
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod time;

pub use time::Instant;
