//! Drover on a real host: what only a host has, never built in the simulation.
//!
//! The process drivers and their cgroups ([`drivers`]), the executor a production client runs
//! tasks, devices and CSI plugins with ([`executor`]), CSI over a plugin's unix socket
//! ([`csi`], [`csi_check`]), the agent RPC's gRPC transport and the sockets it and the HTTP API
//! listen on ([`net`], [`sockets`]), mutual TLS ([`tls`]), Consul's HTTP API ([`consul`]), the
//! agent config file ([`agent_config`]) and the redb files ([`disk`]). `drover-io-real` holds
//! what runs in both worlds; io-sim puts its simulated network, disk and Consul where these go.

pub mod acl_policy;
pub mod agent_config;
pub mod attach;
pub mod consul;
pub mod csi;
pub mod csi_check;
mod csi_lifecycle;
pub mod disk;
pub mod drivers;
pub mod exec_sessions;
pub mod executor;
pub mod limits;
pub mod memory;
pub mod net;
pub mod nsexec;
pub mod socket_proxy;
pub mod sockets;
pub mod tls;

pub use executor::{HostExecutor, client_identity, host_networks, host_resources, interfaces};
