//! ACLs in the HTTP API: the gate every request passes (`gate.rs`) and the `/v1/acl/*`
//! endpoints (`endpoints.rs`).

pub mod endpoints;
pub mod gate;
