//! ACL tokens and policies in the state store, and the one-time bootstrap.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

use super::pmap::PMap;
use super::{Response, Table};
use crate::acl::{AclPolicy, AclToken};
use crate::rpc::ErrorKind;

/// The ACL tables: policies by name, tokens by accessor and by secret (both stored: a
/// request is resolved by its secret on every call).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AclState {
    policies: PMap<String, AclPolicy>,
    tokens: PMap<String, AclToken>,
    secrets: PMap<String, String>,
    /// The index the bootstrap was applied at; bootstrapping again needs it as the reset index.
    bootstrap_index: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AclCommand {
    /// The first management token; refused once done unless `reset_index` names the index
    /// the last bootstrap was applied at (Nomad's reset file).
    Bootstrap {
        token: AclToken,
        reset_index: u64,
    },
    PoliciesUpsert {
        policies: Vec<AclPolicy>,
    },
    PoliciesDelete {
        names: Vec<String>,
    },
    TokensUpsert {
        tokens: Vec<AclToken>,
    },
    TokensDelete {
        accessor_ids: Vec<String>,
    },
}

/// Counts only: the tables hold every token's secret.
impl core::fmt::Debug for AclState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AclState")
            .field("policies", &self.policies.len())
            .field("tokens", &self.tokens.len())
            .field("bootstrap_index", &self.bootstrap_index)
            .finish()
    }
}

impl AclState {
    pub fn policy(&self, name: &str) -> Option<&AclPolicy> {
        self.policies.get(name)
    }

    pub fn policies(&self) -> impl Iterator<Item = &AclPolicy> {
        self.policies.values()
    }

    pub fn token(&self, accessor_id: &str) -> Option<&AclToken> {
        self.tokens.get(accessor_id)
    }

    pub fn token_by_secret(&self, secret_id: &str) -> Option<&AclToken> {
        self.secrets
            .get(secret_id)
            .and_then(|accessor| self.tokens.get(accessor))
    }

    pub fn tokens(&self) -> impl Iterator<Item = &AclToken> {
        self.tokens.values()
    }

    pub fn bootstrap_index(&self) -> Option<u64> {
        self.bootstrap_index
    }

    /// Applies `command` at `index`, recording the changed tables in `changed`.
    pub(super) fn apply(&mut self, index: u64, command: &AclCommand, changed: &mut Vec<Table>) -> Response {
        match command {
            AclCommand::Bootstrap { token, reset_index } => {
                if let Some(done) = self.bootstrap_index
                    && *reset_index != done
                {
                    return Response::Error(
                        ErrorKind::Invalid,
                        format!("ACL bootstrap already done (reset index: {done})"),
                    );
                }
                self.bootstrap_index = Some(index);
                self.put_token(index, token.clone());
                changed.push(Table::AclTokens);
                Response::Done
            }
            AclCommand::PoliciesUpsert { policies } => {
                for policy in policies {
                    let create_index = self.policies.get(&policy.name).map_or(index, |held| held.create_index);
                    let mut policy = policy.clone();
                    policy.create_index = create_index;
                    policy.modify_index = index;
                    self.policies.insert(policy.name.clone(), policy);
                }
                changed.push(Table::AclPolicies);
                Response::Done
            }
            AclCommand::PoliciesDelete { names } => {
                for name in names {
                    self.policies.remove(name);
                }
                changed.push(Table::AclPolicies);
                Response::Done
            }
            AclCommand::TokensUpsert { tokens } => {
                for token in tokens {
                    self.put_token(index, token.clone());
                }
                changed.push(Table::AclTokens);
                Response::Done
            }
            AclCommand::TokensDelete { accessor_ids } => {
                for accessor in accessor_ids {
                    if let Some(token) = self.tokens.remove(accessor) {
                        self.secrets.remove(&token.secret_id);
                    }
                }
                changed.push(Table::AclTokens);
                Response::Done
            }
        }
    }

    /// Accepts `command` as a direct write, or says why not: every policy's name and rules
    /// valid, every token's shape valid.
    pub fn check(command: &AclCommand) -> Result<(), String> {
        match command {
            AclCommand::Bootstrap { token, .. } => match token.token_type {
                crate::acl::TokenType::Management => token.validate(),
                crate::acl::TokenType::Client => Err("the bootstrap token must be a management token".into()),
            },
            AclCommand::PoliciesUpsert { policies } => policies.iter().try_for_each(|policy| {
                crate::acl::validate_policy_name(&policy.name)?;
                let mut parsed = policy.parsed.clone();
                parsed.validate()?;
                if parsed == policy.parsed {
                    Ok(())
                } else {
                    Err(format!("policy {:?} was not stored as validated", policy.name))
                }
            }),
            AclCommand::TokensUpsert { tokens } => tokens.iter().try_for_each(AclToken::validate),
            AclCommand::PoliciesDelete { .. } | AclCommand::TokensDelete { .. } => Ok(()),
        }
    }

    fn put_token(&mut self, index: u64, mut token: AclToken) {
        if let Some(held) = self.tokens.get(&token.accessor_id) {
            token.create_index = held.create_index;
            let old_secret = held.secret_id.clone();
            self.secrets.remove(&old_secret);
        } else {
            token.create_index = index;
        }
        token.modify_index = index;
        self.secrets.insert(token.secret_id.clone(), token.accessor_id.clone());
        self.tokens.insert(token.accessor_id.clone(), token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{PolicyRules, TokenType, resolve};
    use crate::fsm::{Command, Entry, ServerState};

    fn apply(state: &mut ServerState, index: u64, command: AclCommand) -> Response {
        state.apply(
            index,
            &Entry {
                at_unix_ms: 1_000,
                command: Command::Acl(command),
            },
        )
    }

    fn token(accessor: &str, secret: &str, token_type: TokenType, policies: &[&str]) -> AclToken {
        AclToken {
            accessor_id: accessor.into(),
            secret_id: secret.into(),
            name: accessor.into(),
            token_type,
            policies: policies.iter().map(|policy| (*policy).to_string()).collect(),
            global: false,
            create_time_ms: 1_000,
            expiration_time_ms: None,
            create_index: 0,
            modify_index: 0,
        }
    }

    fn policy(name: &str, node: &str) -> AclPolicy {
        let mut parsed = PolicyRules {
            node: Some(node.into()),
            ..PolicyRules::default()
        };
        parsed.validate().unwrap();
        AclPolicy {
            name: name.into(),
            description: String::new(),
            rules: format!("node {{ policy = \"{node}\" }}"),
            parsed,
            create_index: 0,
            modify_index: 0,
        }
    }

    #[test]
    fn bootstrap_happens_once_unless_the_reset_index_names_it() {
        let mut state = ServerState::default();
        let root = token("a1", "s1", TokenType::Management, &[]);
        let bootstrap = |token: &AclToken, reset_index| AclCommand::Bootstrap {
            token: token.clone(),
            reset_index,
        };
        assert_eq!(apply(&mut state, 5, bootstrap(&root, 0)), Response::Done);
        let again = token("a2", "s2", TokenType::Management, &[]);
        assert_eq!(
            apply(&mut state, 6, bootstrap(&again, 0)),
            Response::Error(ErrorKind::Invalid, "ACL bootstrap already done (reset index: 5)".into())
        );
        assert!(
            state.acl().token("a2").is_none(),
            "nothing stored by a refused bootstrap"
        );
        assert_eq!(apply(&mut state, 7, bootstrap(&again, 5)), Response::Done);
        assert_eq!(state.acl().bootstrap_index(), Some(7));
        assert_eq!(state.acl().token_by_secret("s2").unwrap().accessor_id, "a2");
        assert_eq!(state.table_index(Table::AclTokens), 7);
    }

    #[test]
    fn tokens_resolve_by_secret_to_their_policies_until_deleted_or_expired() {
        let mut state = ServerState::default();
        apply(
            &mut state,
            1,
            AclCommand::PoliciesUpsert {
                policies: vec![policy("nodes", "read"), policy("anonymous", "deny")],
            },
        );
        let mut reader = token("a1", "s1", TokenType::Client, &["nodes"]);
        reader.expiration_time_ms = Some(5_000);
        apply(&mut state, 2, AclCommand::TokensUpsert { tokens: vec![reader] });
        let acl = resolve(&state, "s1", 1_000).unwrap();
        assert!(acl.allows_node(false) && !acl.allows_node(true) && !acl.is_management());
        assert_eq!(resolve(&state, "s1", 5_000), Err(crate::acl::ResolveError::Expired));
        assert_eq!(resolve(&state, "nope", 0), Err(crate::acl::ResolveError::NotFound));
        assert!(
            !resolve(&state, "", 0).unwrap().allows_node(false),
            "anonymous is denied"
        );
        // A policy updated in place keeps its create index; the token follows it.
        apply(
            &mut state,
            3,
            AclCommand::PoliciesUpsert {
                policies: vec![policy("nodes", "write")],
            },
        );
        let stored = state.acl().policy("nodes").unwrap();
        assert_eq!((stored.create_index, stored.modify_index), (1, 3));
        assert!(resolve(&state, "s1", 1_000).unwrap().allows_node(true));
        apply(
            &mut state,
            4,
            AclCommand::TokensDelete {
                accessor_ids: vec!["a1".into()],
            },
        );
        assert_eq!(resolve(&state, "s1", 1_000), Err(crate::acl::ResolveError::NotFound));
        // The tables survive a snapshot.
        let restored = ServerState::restore(&state.snapshot()).unwrap();
        assert_eq!(restored.acl(), state.acl());
    }

    #[test]
    fn direct_writes_are_checked_and_secrets_never_debug_printed() {
        let client_without_policies = AclCommand::TokensUpsert {
            tokens: vec![token("a", "s3cr3t", TokenType::Client, &[])],
        };
        assert_eq!(
            AclState::check(&client_without_policies),
            Err("client token missing policies".into())
        );
        let mut tampered = policy("p", "read");
        tampered.parsed.node = Some("admin".into());
        assert!(
            AclState::check(&AclCommand::PoliciesUpsert {
                policies: vec![tampered]
            })
            .is_err()
        );
        let mut state = ServerState::default();
        apply(
            &mut state,
            1,
            AclCommand::TokensUpsert {
                tokens: vec![token("a", "s3cr3t", TokenType::Management, &[])],
            },
        );
        assert!(!format!("{state:?}").contains("s3cr3t"));
        assert!(!format!("{:?}", state.acl().token("a")).contains("s3cr3t"));
    }
}
