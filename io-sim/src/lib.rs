//! The simulated world Drover's real driver runs in under `--cfg madsim`.
//!
//! Files mirror `drover-io-real`: [`net`] (agent RPC and gossip over madsim's network), [`disk`]
//! (a redb backend that loses unsynced writes on a crash), [`consul`] (a catalog that can be
//! down, hang or be slow) and [`csi`] (CSI plugins on client nodes that fail, hang or are slow
//! on command), [`host`] (the host a production client runs on: tasks, mounts, its CSI plugin
//! process and its faults), [`task_files`] (a host's allocation directories as real files, with a
//! hostile task planting links in them). [`trace`] records every agent and plugin event with its virtual time and runs
//! the [`invariants`] after each one (counting their checks); [`coverage`] counts the core's state
//! machine transitions and rare paths per run; [`cluster`] starts, kills, restarts and
//! partitions agents; [`rogue`] is a machine with a client's certificate making a server's
//! call.
//!
//! Everything here but [`turmoil`] (the turmoil lane: the production network stack on turmoil's
//! simulated network, in a normal build), [`disk`], [`trace`] and [`invariants`] exists only in
//! the madsim build.

pub mod client_node;
#[cfg(madsim)]
pub mod cluster;
pub mod consul;
#[cfg(madsim)]
pub mod coverage;
pub mod csi;
pub mod disk;
pub mod engine;
pub mod host;
pub mod invariants;
#[cfg(madsim)]
pub mod net;
#[cfg(madsim)]
pub mod rogue;
pub mod task_files;
pub mod trace;
#[cfg(not(madsim))]
pub mod turmoil;
