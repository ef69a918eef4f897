//! ACLs in the HTTP API: the gate every request passes (`gate.rs`) and the `/v1/acl/*`
//! endpoints (`endpoints.rs`: bootstrap, policies, tokens; `roles.rs`: roles and one-time
//! tokens; `login.rs`: auth methods, binding rules and JWT login, with `oidc.rs` for OIDC
//! login and `idp.rs` for what is asked of identity providers).

pub mod endpoints;
pub mod gate;
mod idp;
pub(crate) mod login;
pub(crate) mod oidc;
pub(crate) mod roles;
