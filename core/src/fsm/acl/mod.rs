//! ACL tokens and policies in the state store, and the one-time bootstrap; roles and
//! one-time tokens in `roles.rs`.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

use super::pmap::PMap;
use super::{Response, Table};
use crate::acl::auth::{AuthMethod, BindingRule};
use crate::acl::{AclPolicy, AclRole, AclToken, OneTimeToken};
use crate::error::ErrorKind;

mod login;
mod roles;

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
    /// Roles by ID, and their IDs by name (names are unique).
    roles: PMap<String, AclRole>,
    role_names: PMap<String, String>,
    /// One-time tokens by their secret.
    one_time: PMap<String, OneTimeToken>,
    /// Auth methods by name, binding rules by ID (`login.rs`).
    auth_methods: PMap<String, AuthMethod>,
    binding_rules: PMap<String, BindingRule>,
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
    /// Creates or updates roles: an existing ID is an update, an unknown one a new role; every
    /// name unique and every policy existing, or nothing is written.
    RolesUpsert {
        roles: Vec<AclRole>,
    },
    RolesDelete {
        ids: Vec<String>,
    },
    /// A one-time token for an existing token; expired ones are dropped on the way.
    OneTimeUpsert {
        token: OneTimeToken,
    },
    /// Spends a one-time token (and every other of the same ACL token): refused with Nomad's
    /// `Permission denied` when it is unknown, expired, or its token is gone.
    OneTimeExchange {
        secret: crate::structs::SecretText,
    },
    /// Creates or updates auth methods by name; at most one is the default.
    AuthMethodsUpsert {
        methods: Vec<AuthMethod>,
    },
    /// Deletes auth methods and every binding rule naming them.
    AuthMethodsDelete {
        names: Vec<String>,
    },
    /// Creates or updates binding rules by ID; each rule's method exists and never changes.
    BindingRulesUpsert {
        rules: Vec<BindingRule>,
    },
    BindingRulesDelete {
        ids: Vec<String>,
    },
}

/// Counts only: the tables hold every token's secret.
impl core::fmt::Debug for AclState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AclState")
            .field("policies", &self.policies.len())
            .field("tokens", &self.tokens.len())
            .field("roles", &self.roles.len())
            .field("one_time", &self.one_time.len())
            .field("auth_methods", &self.auth_methods.len())
            .field("binding_rules", &self.binding_rules.len())
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

    /// The policy names `token` holds, its own and its roles' (missing roles skipped), sorted.
    pub fn token_policy_names(&self, token: &AclToken) -> Vec<String> {
        let roles = token.roles.iter().filter_map(|id| self.roles.get(id));
        let names: alloc::collections::BTreeSet<&String> = token
            .policies
            .iter()
            .chain(roles.flat_map(|role| &role.policies))
            .collect();
        names.into_iter().cloned().collect()
    }

    /// Applies `command` at `index` (the entry stamped `at_ms`), recording the changed tables.
    pub(super) fn apply(&mut self, index: u64, at_ms: u64, command: &AclCommand, changed: &mut Vec<Table>) -> Response {
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
                if let Some(missing) = tokens
                    .iter()
                    .flat_map(|token| &token.roles)
                    .find(|id| !self.roles.contains_key(*id))
                {
                    return Response::Error(ErrorKind::Invalid, format!("cannot find role {missing}"));
                }
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
                    self.drop_one_time_of(accessor, changed);
                }
                changed.push(Table::AclTokens);
                Response::Done
            }
            AclCommand::RolesUpsert { roles } => self.upsert_roles(index, roles, changed),
            AclCommand::RolesDelete { ids } => self.delete_roles(ids, changed),
            AclCommand::OneTimeUpsert { token } => self.upsert_one_time(index, at_ms, token, changed),
            AclCommand::OneTimeExchange { secret } => self.exchange_one_time(at_ms, secret.expose(), changed),
            AclCommand::AuthMethodsUpsert { methods } => self.upsert_auth_methods(index, methods, changed),
            AclCommand::AuthMethodsDelete { names } => self.delete_auth_methods(names, changed),
            AclCommand::BindingRulesUpsert { rules } => self.upsert_binding_rules(index, rules, changed),
            AclCommand::BindingRulesDelete { ids } => self.delete_binding_rules(ids, changed),
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
            AclCommand::RolesUpsert { roles } => roles.iter().try_for_each(AclRole::validate),
            AclCommand::BindingRulesUpsert { rules } => rules.iter().try_for_each(BindingRule::validate),
            AclCommand::AuthMethodsUpsert { methods } => methods.iter().try_for_each(|method| {
                crate::acl::validate_policy_name(&method.name).map_err(|_| format!("invalid name '{}'", method.name))
            }),
            AclCommand::PoliciesDelete { .. }
            | AclCommand::TokensDelete { .. }
            | AclCommand::RolesDelete { .. }
            | AclCommand::OneTimeUpsert { .. }
            | AclCommand::OneTimeExchange { .. }
            | AclCommand::AuthMethodsDelete { .. }
            | AclCommand::BindingRulesDelete { .. } => Ok(()),
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

/// Tokens resolved against the tables (an upward call from `acl` would make a cycle: the
/// policy language is below the state machine, the tables that hold policies in it).
impl AclState {
    /// The ACL of the request carrying `secret` (empty: no token, the anonymous policy), from
    /// the applied state at cluster time `now_ms`.
    pub fn resolve(&self, secret: &str, now_ms: u64) -> Result<crate::acl::Acl, crate::acl::ResolveError> {
        let acl = self;
        if secret.is_empty() {
            return Ok(crate::acl::Acl::from_policies(
                acl.policy(crate::acl::ANONYMOUS_POLICY).map(|policy| &policy.parsed),
            ));
        }
        let token = acl.token_by_secret(secret).ok_or(crate::acl::ResolveError::NotFound)?;
        if token.expired(now_ms) {
            return Err(crate::acl::ResolveError::Expired);
        }
        Ok(match token.token_type {
            crate::acl::TokenType::Management => crate::acl::Acl::management(),
            crate::acl::TokenType::Client => crate::acl::Acl::from_policies(
                acl.token_policy_names(token)
                    .iter()
                    .filter_map(|name| acl.policy(name))
                    .map(|policy| &policy.parsed),
            ),
        })
    }

    /// [`Self::resolve`], as the rules an agent without the state compiles itself.
    pub fn resolve_rules(
        &self,
        secret: &str,
        now_ms: u64,
    ) -> Result<crate::acl::ResolvedToken, crate::acl::ResolveError> {
        let acl = self;
        if secret.is_empty() {
            return Ok(crate::acl::ResolvedToken {
                policies: acl
                    .policy(crate::acl::ANONYMOUS_POLICY)
                    .map(|policy| policy.parsed.clone())
                    .into_iter()
                    .collect(),
                ..crate::acl::ResolvedToken::default()
            });
        }
        let token = acl.token_by_secret(secret).ok_or(crate::acl::ResolveError::NotFound)?;
        if token.expired(now_ms) {
            return Err(crate::acl::ResolveError::Expired);
        }
        Ok(crate::acl::ResolvedToken {
            management: token.token_type == crate::acl::TokenType::Management,
            policies: acl
                .token_policy_names(token)
                .iter()
                .filter_map(|name| acl.policy(name))
                .map(|policy| policy.parsed.clone())
                .collect(),
            expires_ms: token.expiration_time_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{PERMISSION_DENIED, PolicyRules, TokenType};
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
            roles: Vec::new(),
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
        let acl = state.acl().resolve("s1", 1_000).unwrap();
        assert!(acl.allows_node(false) && !acl.allows_node(true) && !acl.is_management());
        assert_eq!(state.acl().resolve("s1", 5_000), Err(crate::acl::ResolveError::Expired));
        assert_eq!(state.acl().resolve("nope", 0), Err(crate::acl::ResolveError::NotFound));
        assert!(
            !state.acl().resolve("", 0).unwrap().allows_node(false),
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
        assert!(state.acl().resolve("s1", 1_000).unwrap().allows_node(true));
        apply(
            &mut state,
            4,
            AclCommand::TokensDelete {
                accessor_ids: vec!["a1".into()],
            },
        );
        assert_eq!(
            state.acl().resolve("s1", 1_000),
            Err(crate::acl::ResolveError::NotFound)
        );
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
            Err("client token missing policies or roles".into())
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
        let exchange = AclCommand::OneTimeExchange {
            secret: crate::structs::SecretText("s3cr3t".into()),
        };
        assert!(!format!("{exchange:?}").contains("s3cr3t"));
    }

    fn role(id: &str, name: &str, policies: &[&str]) -> AclRole {
        AclRole {
            id: id.into(),
            name: name.into(),
            description: String::new(),
            policies: policies.iter().map(|policy| (*policy).to_string()).collect(),
            create_index: 0,
            modify_index: 0,
        }
    }

    #[test]
    fn roles_lend_their_policies_to_the_tokens_linking_them() {
        let mut state = ServerState::default();
        let upsert = |roles: Vec<AclRole>| AclCommand::RolesUpsert { roles };
        assert_eq!(
            apply(&mut state, 1, upsert(vec![role("r1", "ops", &["nodes"])])),
            Response::Error(ErrorKind::Invalid, "cannot find policy nodes".into())
        );
        apply(
            &mut state,
            2,
            AclCommand::PoliciesUpsert {
                policies: vec![policy("nodes", "write")],
            },
        );
        assert_eq!(
            apply(&mut state, 3, upsert(vec![role("r1", "ops", &["nodes", "nodes"])])),
            Response::Done
        );
        assert_eq!(state.acl().role_by_name("ops").unwrap().policies, ["nodes"]);
        assert_eq!(
            apply(&mut state, 4, upsert(vec![role("r2", "ops", &["nodes"])])),
            Response::Error(ErrorKind::Invalid, "role with name ops already exists".into())
        );
        let mut linked = token("a1", "s1", TokenType::Client, &[]);
        linked.roles = vec!["r9".into()];
        assert_eq!(
            apply(
                &mut state,
                5,
                AclCommand::TokensUpsert {
                    tokens: vec![linked.clone()]
                }
            ),
            Response::Error(ErrorKind::Invalid, "cannot find role r9".into())
        );
        linked.roles = vec!["r1".into()];
        assert_eq!(
            apply(&mut state, 6, AclCommand::TokensUpsert { tokens: vec![linked] }),
            Response::Done
        );
        assert!(state.acl().resolve("s1", 0).unwrap().allows_node(true));
        // Renamed in place: the link holds; the old name is free again.
        assert_eq!(
            apply(&mut state, 7, upsert(vec![role("r1", "operators", &["nodes"])])),
            Response::Done
        );
        assert!(state.acl().role_by_name("ops").is_none());
        let renamed = state.acl().role("r1").unwrap();
        assert_eq!((renamed.create_index, renamed.modify_index), (3, 7));
        assert!(state.acl().resolve("s1", 0).unwrap().allows_node(true));
        apply(&mut state, 8, AclCommand::RolesDelete { ids: vec!["r1".into()] });
        assert!(
            !state.acl().resolve("s1", 0).unwrap().allows_node(false),
            "a deleted role grants nothing"
        );
        assert_eq!(state.table_index(Table::AclRoles), 8);
        let restored = ServerState::restore(&state.snapshot()).unwrap();
        assert_eq!(restored.acl(), state.acl());
    }

    #[test]
    fn a_one_time_token_is_spent_once_and_only_before_it_expires() {
        let mut state = ServerState::default();
        apply(
            &mut state,
            1,
            AclCommand::TokensUpsert {
                tokens: vec![token("a1", "s1", TokenType::Management, &[])],
            },
        );
        let ott = |secret: &str, expires_at_ms| OneTimeToken {
            one_time_secret_id: secret.into(),
            accessor_id: "a1".into(),
            expires_at_ms,
            create_index: 0,
            modify_index: 0,
        };
        let at = |state: &mut ServerState, index, at_unix_ms, command| {
            state.apply(
                index,
                &Entry {
                    at_unix_ms,
                    command: Command::Acl(command),
                },
            )
        };
        let exchange = |secret: &str| AclCommand::OneTimeExchange {
            secret: crate::structs::SecretText(secret.into()),
        };
        at(
            &mut state,
            2,
            1_000,
            AclCommand::OneTimeUpsert {
                token: ott("o1", 2_000),
            },
        );
        at(
            &mut state,
            3,
            1_000,
            AclCommand::OneTimeUpsert {
                token: ott("o2", 2_000),
            },
        );
        let denied = Response::Error(ErrorKind::PermissionDenied, PERMISSION_DENIED.into());
        assert_eq!(at(&mut state, 4, 2_000, exchange("o1")), denied, "expired");
        assert_eq!(at(&mut state, 5, 1_500, exchange("o1")), Response::Done);
        assert_eq!(at(&mut state, 6, 1_500, exchange("o1")), denied, "spent");
        assert!(
            state.acl().one_time_token("o2").is_none(),
            "the token's others go with it"
        );
        // A later one-time token sweeps the expired.
        at(
            &mut state,
            7,
            1_000,
            AclCommand::OneTimeUpsert {
                token: ott("o3", 1_100),
            },
        );
        at(
            &mut state,
            8,
            5_000,
            AclCommand::OneTimeUpsert {
                token: ott("o4", 9_000),
            },
        );
        assert!(state.acl().one_time_token("o3").is_none());
        assert!(!format!("{:?}", state.acl().one_time_token("o4")).contains("o4"));
        apply(
            &mut state,
            9,
            AclCommand::TokensDelete {
                accessor_ids: vec!["a1".into()],
            },
        );
        assert!(state.acl().one_time_token("o4").is_none());
        let mut orphan = ott("o5", 9_000);
        orphan.accessor_id = "gone".into();
        assert_eq!(
            at(&mut state, 10, 1_000, AclCommand::OneTimeUpsert { token: orphan }),
            denied
        );
    }
}
