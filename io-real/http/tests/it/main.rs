//! io-real's integration tests: the production driver, HTTP API, TLS, Consul and cgroups against real parts.
//!
//! One binary per crate (each former `tests/<name>.rs` is a module here), so the workspace links
//! a few test binaries rather than one per file.

mod acl;
mod acl_login;
mod cgroups;
mod consul;
mod consul_tls;
mod csi_api;
mod drivers;
mod http_limits;
mod secrets_in_logs;
mod support;
mod tls;
