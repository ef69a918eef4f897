//! The agent's integration tests: real agents as child processes, real sockets, real CSI plugins.
//!
//! One binary per crate (each former `tests/<name>.rs` is a module here), so the workspace links
//! a few test binaries rather than one per file.

mod acl_cli;
mod alloc_logs;
mod alloc_ops;
mod autopilot;
mod cli;
mod client_csi;
mod client_restart;
mod cluster;
mod connect;
mod consul_discovery;
mod consul_services;
mod csi_cluster;
mod csi_conformance;
mod csi_plugin;
mod daily_cli;
mod demo;
mod deployments;
mod dev_shutdown;
mod docker;
mod events;
mod exec_helper;
mod job_plan;
mod jobs_api;
mod jobspec_fields;
mod memory;
mod node_down;
mod node_drain;
mod periodic;
mod ports;
mod remote_client;
mod root_keyring;
mod secure_cluster;
mod support;
mod templates;
mod tls_cli;
mod tls_reload;
mod var_locks;
mod variables_api;
mod volume_create;
