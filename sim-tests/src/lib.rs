//! Seeded scenario suites for the full-agent simulation lane.
//!
//! Each scenario builds a cluster of whole agents (openraft, the production driver, the core)
//! inside madsim, derives every option from the seed (start order, start delays, which faults
//! and when), runs a fault phase and then a quiet phase in which a leader must emerge. Safety
//! invariants are checked after every event by `drover_io_sim::trace`.
//!
//! The code exists only under `--cfg madsim`; `tests/sim.rs` arranges that build itself.
//! [`turmoil_lane`] is the other way round: the production network stack on turmoil's
//! simulated network, in a normal build with `--cfg tokio_unstable` (`tests/turmoil.rs`).

#[cfg(madsim)]
pub mod bench;
#[cfg(madsim)]
pub mod cas_writers;
#[cfg(madsim)]
pub mod cli;
#[cfg(madsim)]
pub mod coverage;
pub mod knobs;
pub mod lanes;
#[cfg(madsim)]
pub mod real_clients;
#[cfg(madsim)]
pub mod runner;
#[cfg(madsim)]
pub mod scenarios;
#[cfg(madsim)]
pub mod shrink;
#[cfg(madsim)]
pub mod swarm;
#[cfg(not(madsim))]
pub mod turmoil_lane;
#[cfg(madsim)]
pub mod volume_churn;
#[cfg(madsim)]
pub mod zones;
