//! CSI control-plane rules and machines of the server.
//!
//! - [`claims`]: claim capacity per access mode and the claim/release transition (§3.4),
//!   applied inside the FSM.
//! - [`unpublish`]: the checkpointed release walk (§3.5) as a pure next-step function.
//! - [`routing`]: which clients can serve a controller RPC (§3.7).
//! - [`watcher`]: the leader's volume watcher and CSI GC core jobs (§3.6, §3.8).

pub mod claims;
pub mod routing;
pub mod unpublish;
pub mod watcher;
