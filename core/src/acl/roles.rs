//! ACL roles (Nomad 1.4): a named set of policies a token links to by the role's ID, so the
//! policies of many tokens change in one place; and one-time tokens (Nomad 1.1), a short-lived
//! secret that is exchanged once for the token that made it (the UI's sign-in link).

#[allow(unused_imports)]
use crate::prelude::*;

use core::fmt;

use serde::{Deserialize, Serialize};

/// Nomad's `maxACLRoleDescriptionLength`.
pub const ROLE_DESCRIPTION_MAX: usize = 256;
/// How long a one-time token lasts (Nomad's 10 minutes).
pub const ONE_TIME_TOKEN_TTL_MS: u64 = 10 * 60 * 1_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclRole {
    /// Drawn when the role is made; never changes (tokens link to it).
    pub id: String,
    /// Unique among roles; may change (a token's link does not).
    pub name: String,
    pub description: String,
    /// Policy names, deduplicated, each existing when the role was written.
    pub policies: Vec<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl AclRole {
    /// Nomad's `ACLRole.Validate`: the static checks (the policies' existence is the state's).
    pub fn validate(&self) -> Result<(), String> {
        super::validate_policy_name(&self.name)?;
        if self.description.len() > ROLE_DESCRIPTION_MAX {
            return Err(format!("description longer than {ROLE_DESCRIPTION_MAX}"));
        }
        if self.policies.is_empty() {
            return Err("at least one policy should be specified".into());
        }
        Ok(())
    }

    /// The role with its policy links deduplicated, first mention kept (Nomad's order).
    pub fn deduplicated(mut self) -> AclRole {
        let mut seen = alloc::collections::BTreeSet::new();
        self.policies.retain(|name| seen.insert(name.clone()));
        self
    }
}

/// A one-time token: its secret is exchanged once, within [`ONE_TIME_TOKEN_TTL_MS`], for the
/// ACL token whose holder asked for it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OneTimeToken {
    pub one_time_secret_id: String,
    pub accessor_id: String,
    pub expires_at_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The secret never shows.
impl fmt::Debug for OneTimeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneTimeToken")
            .field("one_time_secret_id", &crate::structs::REDACTED)
            .field("accessor_id", &self.accessor_id)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, policies: &[&str]) -> AclRole {
        AclRole {
            id: "r1".into(),
            name: name.into(),
            description: String::new(),
            policies: policies.iter().map(|p| (*p).to_string()).collect(),
            create_index: 0,
            modify_index: 0,
        }
    }

    #[test]
    fn a_role_needs_a_valid_name_a_policy_and_a_short_description() {
        assert_eq!(role("ops", &["a"]).validate(), Ok(()));
        assert_eq!(
            role("bad name", &["a"]).validate(),
            Err("invalid name 'bad name'".into())
        );
        assert_eq!(
            role("ops", &[]).validate(),
            Err("at least one policy should be specified".into())
        );
        let mut long = role("ops", &["a"]);
        long.description = "x".repeat(257);
        assert_eq!(long.validate(), Err("description longer than 256".into()));
        assert_eq!(role("ops", &["b", "a", "b"]).deduplicated().policies, ["b", "a"]);
    }
}
