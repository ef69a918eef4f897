//! Nomad's ACL system: policies written in Nomad's policy language, tokens that hold them, and
//! the compiled [`Acl`] every endpoint asks before it acts.
//!
//! - `policy.rs`: a policy's rules, checked and expanded (`policy = "read"` → capabilities).
//! - `compiled.rs`: a token's policies merged into one object answering capability checks.
//! - [`resolve`]: a request's secret → its ACL, from the replicated state (`fsm/acl.rs`).
//!
//! Tokens and policies are Raft entries like any other; what resolves a token is the state
//! every server applied, so a revoked token stops working on every server at the same index.

#[allow(unused_imports)]
use crate::prelude::*;

use core::fmt;

use serde::{Deserialize, Serialize};

pub mod auth;
mod compiled;
pub mod policy;
pub mod roles;

pub use compiled::{Acl, Level, glob_matches};
pub use policy::{HostVolumeRule, NamespaceRule, PolicyRules, VariableRule};
pub use roles::{AclRole, OneTimeToken};

/// The policy requests without a token get, when it exists (Nomad's `anonymous`).
pub const ANONYMOUS_POLICY: &str = "anonymous";

/// Nomad's texts.
pub const PERMISSION_DENIED: &str = "Permission denied";
pub const TOKEN_NOT_FOUND: &str = "ACL token not found";
pub const TOKEN_EXPIRED: &str = "ACL token expired";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclPolicy {
    pub name: String,
    pub description: String,
    /// The HCL as written (what `acl policy info` shows).
    pub rules: String,
    /// What the HCL says, checked and expanded.
    pub parsed: PolicyRules,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenType {
    #[default]
    Client,
    Management,
}

impl TokenType {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenType::Client => "client",
            TokenType::Management => "management",
        }
    }
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclToken {
    pub accessor_id: String,
    pub secret_id: String,
    pub name: String,
    pub token_type: TokenType,
    pub policies: Vec<String>,
    /// The IDs of the roles the token links to (their policies are the token's too).
    #[serde(default)]
    pub roles: Vec<String>,
    pub global: bool,
    pub create_time_ms: u64,
    /// When the token stops working (cluster time, ms); `None`: never.
    pub expiration_time_ms: Option<u64>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The secret never shows: a token's `Debug` is safe to log.
impl fmt::Debug for AclToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclToken")
            .field("accessor_id", &self.accessor_id)
            .field("secret_id", &crate::structs::REDACTED)
            .field("name", &self.name)
            .field("token_type", &self.token_type)
            .field("policies", &self.policies)
            .field("roles", &self.roles)
            .field("global", &self.global)
            .field("expiration_time_ms", &self.expiration_time_ms)
            .finish()
    }
}

impl AclToken {
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expiration_time_ms.is_some_and(|at| at <= now_ms)
    }

    /// Nomad's checks on a token to create or update: a client token names policies or roles,
    /// a management token neither.
    pub fn validate(&self) -> Result<(), String> {
        let linked = !self.policies.is_empty() || !self.roles.is_empty();
        match self.token_type {
            TokenType::Client if !linked => Err("client token missing policies or roles".into()),
            TokenType::Management if linked => {
                Err("management token cannot be associated with policies or roles".into())
            }
            _ if self.name.len() > 256 => Err("token name too long".into()),
            _ => Ok(()),
        }
    }
}

/// Nomad's policy names: `^[a-zA-Z0-9-]{1,128}$`.
pub fn validate_policy_name(name: &str) -> Result<(), String> {
    if !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(())
    } else {
        Err(format!("invalid name '{}'", crate::jobspec::limits::shown(name)))
    }
}

/// Why a request's token gives it no ACL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolveError {
    NotFound,
    Expired,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResolveError::NotFound => TOKEN_NOT_FOUND,
            ResolveError::Expired => TOKEN_EXPIRED,
        })
    }
}

/// A token resolved for an agent that holds no ACL tables (a client-only agent asking a
/// server, as Nomad's `ACL.ResolveToken`): what it needs to build the [`Acl`] itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedToken {
    pub management: bool,
    /// The rules of the token's policies that exist (the anonymous policy for no token).
    pub policies: Vec<PolicyRules>,
    /// When the token expires (cluster time, ms), if it does.
    pub expires_ms: Option<u64>,
}

impl ResolvedToken {
    pub fn acl(&self) -> Acl {
        if self.management {
            Acl::management()
        } else {
            Acl::from_policies(&self.policies)
        }
    }
}
