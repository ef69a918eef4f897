//! The records the server state store holds: nodes, jobs (as far as CSI needs them),
//! allocations, evaluations (shape only), CSI volumes and plugins.
//!
//! Storage shapes, serialized into snapshots; the HTTP layer renders Nomad's JSON shapes from
//! them (and redacts secrets). Times are milliseconds since the Unix epoch, stamped by the
//! proposer into the log entry.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::fmt;
use core::time::Duration;

use serde::{Deserialize, Serialize};

pub const DEFAULT_NAMESPACE: &str = "default";

mod allocation;
mod connect;
mod constraint;
mod csi;
mod deployment;
mod job;
mod kinds;
mod network;
mod node;
mod parameterized;
mod periodic;
mod reschedule;
mod scaling;
mod secrets;
mod status;
mod task;
mod task_state;
mod template;

pub use allocation::*;
pub use connect::*;
pub use constraint::*;
pub use csi::*;
pub use deployment::*;
pub use job::*;
pub use kinds::*;
pub use network::*;
pub use node::*;
pub use parameterized::*;
pub use periodic::*;
pub use reschedule::*;
pub use scaling::*;
pub use secrets::*;
pub use status::*;
pub use task::*;
pub use task_state::*;
pub use template::*;
