//! ACLs in the HTTP API: the gate every request passes (`gate.rs`) and the `/v1/acl/*`
//! endpoints (`endpoints.rs`: bootstrap, policies, tokens; `roles.rs`: roles and one-time
//! tokens).

pub mod endpoints;
pub mod gate;
mod roles;
