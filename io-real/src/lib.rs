//! Drover's driver and its production I/O.
//!
//! [`driver`] runs the core machines against the narrow traits in [`io`]; [`raft`] adapts
//! openraft to the core FSM and to redb; [`runtime`] is the openraft runtime that works under
//! tokio and madsim alike; [`client`] is the client driver, run in both worlds. The
//! production implementations (tonic transport, redb files,
//! Consul's HTTP API, the HTTP API server) are compiled only outside the simulation.

#[cfg(not(madsim))]
pub mod acl_policy;
#[cfg(not(madsim))]
pub mod agent_config;
pub mod allocfs;
#[cfg(not(madsim))]
pub mod attach;
pub mod buggify;
pub mod client;
pub mod clock;
pub mod confined;
pub mod devices;
pub mod driver;
pub mod drivers;
pub mod events;
pub mod exec;
pub mod facts;
pub mod hcl_check;
pub mod io;
pub mod jobs;
pub mod jobspec;
pub mod keyring;
pub mod logfile;
pub mod periodic;
pub mod raft;
pub mod rootkeys;
pub mod runtime;
pub mod service;
#[cfg(not(madsim))]
pub mod sockets;
pub mod template;

#[cfg(not(madsim))]
pub mod consul;
#[cfg(not(madsim))]
pub mod csi;
#[cfg(not(madsim))]
pub mod csi_check;
#[cfg(not(madsim))]
mod csi_lifecycle;
#[cfg(not(madsim))]
pub mod disk;
#[cfg(not(madsim))]
pub mod http;
pub mod logbus;
pub mod logmon;
pub mod logstream;
#[cfg(not(madsim))]
pub mod memory;
pub mod metrics;
#[cfg(not(madsim))]
pub mod net;
#[cfg(not(madsim))]
pub mod nsexec;
pub mod taskexec;
#[cfg(not(madsim))]
pub mod tls;
