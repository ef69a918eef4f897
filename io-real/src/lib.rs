//! Drover's driver and its production I/O.
//!
//! Everything here runs in both worlds. [`driver`] runs the core machines against the narrow
//! traits in [`io`]; [`raft`] adapts openraft to the core FSM and to redb; [`runtime`] is the
//! openraft runtime that works under tokio and madsim alike; [`client`] is the client driver.
//! What only a host has (the gRPC transport and sockets, TLS, Consul's HTTP API, CSI over unix
//! sockets, the process drivers, the agent config file) is in `drover-host` (`io-real/host`),
//! and the HTTP API in `drover-http` (`io-real/http`); io-sim supplies the simulated
//! counterparts.

pub mod alloc_files;
pub mod allocfs;
pub mod buggify;
pub mod client;
pub mod clock;
pub mod confined;
pub mod containers;
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
pub mod shared_mounts;
pub mod template;

pub mod logbus;
pub mod logmon;
pub mod logstream;
pub mod metrics;
pub mod taskexec;
