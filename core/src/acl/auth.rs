//! Single sign-on (Nomad 1.5): auth methods (`JWT`, `OIDC`) that vouch for who is logging in,
//! and binding rules that turn the claims of a verified login into an ACL token's roles,
//! policies or management.
//!
//! The driver verifies the JWT or completes the OIDC exchange (that needs keys, clocks and
//! HTTP); what the claims then grant is decided here, from the replicated state: [`claims`]
//! maps the verified claims as the method's `ClaimMappings` say, [`bind`] applies the method's
//! binding rules (go-bexpr selectors, `${value.x}` bind names), [`token_name`] names the token.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use core::fmt;
use core::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::goduration::format as go_duration;

/// Nomad's default token name: `JWT-<method>`.
pub const DEFAULT_TOKEN_NAME_FORMAT: &str = "${auth_method_type}-${auth_method_name}";
/// Nomad's `maxACLBindingRuleDescriptionLength`.
pub const RULE_DESCRIPTION_MAX: usize = 256;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthMethodType {
    #[default]
    Jwt,
    Oidc,
}

impl AuthMethodType {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMethodType::Jwt => "JWT",
            AuthMethodType::Oidc => "OIDC",
        }
    }

    pub fn parse(text: &str) -> Result<AuthMethodType, String> {
        match text {
            "JWT" => Ok(AuthMethodType::Jwt),
            "OIDC" => Ok(AuthMethodType::Oidc),
            other => Err(format!("invalid token type '{other}'")),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthMethod {
    pub name: String,
    pub method_type: AuthMethodType,
    /// `local` or `global`.
    pub token_locality: String,
    pub token_name_format: String,
    pub max_token_ttl_ms: u64,
    /// The method `agent acl login` uses when none is named; at most one.
    pub default: bool,
    pub config: AuthMethodConfig,
    pub create_time_ms: u64,
    pub modify_time_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Nomad's `ACLAuthMethodConfig` (durations in ms).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthMethodConfig {
    /// PEM public keys a JWT's signature is checked against.
    pub jwt_validation_pub_keys: Vec<String>,
    pub jwks_url: String,
    pub jwks_ca_cert: String,
    pub oidc_discovery_url: String,
    pub oidc_client_id: String,
    pub oidc_client_secret: String,
    pub oidc_enable_pkce: bool,
    pub oidc_disable_userinfo: bool,
    pub oidc_scopes: Vec<String>,
    pub bound_audiences: Vec<String>,
    pub bound_issuer: Vec<String>,
    pub allowed_redirect_uris: Vec<String>,
    pub discovery_ca_pem: Vec<String>,
    pub signing_algs: Vec<String>,
    pub expiration_leeway_ms: u64,
    pub not_before_leeway_ms: u64,
    pub clock_skew_leeway_ms: u64,
    /// Claim (a name, or a JSON pointer `/a/b`) → the `value.<name>` it is known by.
    pub claim_mappings: BTreeMap<String, String>,
    /// Claim → the `list.<name>` it is known by.
    pub list_claim_mappings: BTreeMap<String, String>,
    pub verbose_logging: bool,
}

/// The client secret never shows.
impl fmt::Debug for AuthMethodConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthMethodConfig")
            .field("jwks_url", &self.jwks_url)
            .field("oidc_discovery_url", &self.oidc_discovery_url)
            .field("oidc_client_id", &self.oidc_client_id)
            .field("oidc_client_secret", &crate::structs::REDACTED)
            .field("bound_audiences", &self.bound_audiences)
            .field("bound_issuer", &self.bound_issuer)
            .field("claim_mappings", &self.claim_mappings)
            .field("list_claim_mappings", &self.list_claim_mappings)
            .finish_non_exhaustive()
    }
}

impl AuthMethod {
    /// Nomad's `ACLAuthMethod.Validate`, with the cluster's token TTL bounds.
    pub fn validate(&self, min_ttl: Duration, max_ttl: Duration) -> Result<(), String> {
        if super::validate_policy_name(&self.name).is_err() {
            return Err(format!("invalid name '{}'", crate::jobspec::limits::shown(&self.name)));
        }
        if !matches!(self.token_locality.as_str(), "local" | "global") {
            return Err(format!("invalid token locality '{}'", self.token_locality));
        }
        let ttl = Duration::from_millis(self.max_token_ttl_ms);
        if ttl < min_ttl || ttl > max_ttl {
            return Err(format!(
                "invalid MaxTokenTTL value '{}' (should be between {} and {})",
                go_duration(ttl),
                go_duration(min_ttl),
                go_duration(max_ttl)
            ));
        }
        let config = &self.config;
        match self.method_type {
            AuthMethodType::Jwt => {
                let sources = [
                    !config.jwt_validation_pub_keys.is_empty(),
                    !config.jwks_url.is_empty(),
                    !config.oidc_discovery_url.is_empty(),
                ];
                if sources.iter().filter(|set| **set).count() != 1 {
                    return Err("invalid config: exactly one of JWTValidationPubKeys, JWKSURL or \
                                OIDCDiscoveryURL must be set for a JWT auth method"
                        .into());
                }
            }
            AuthMethodType::Oidc => {
                if config.oidc_discovery_url.is_empty() || config.oidc_client_id.is_empty() {
                    return Err("invalid config: an OIDC auth method needs OIDCDiscoveryURL and OIDCClientID".into());
                }
                if config.allowed_redirect_uris.is_empty() {
                    return Err("invalid config: an OIDC auth method needs AllowedRedirectURIs".into());
                }
            }
        }
        for (claim, name) in config.claim_mappings.iter().chain(&config.list_claim_mappings) {
            if claim.is_empty() || !valid_claim_name(name) {
                return Err(format!("invalid config: invalid claim mapping {claim:?} = {name:?}"));
            }
        }
        Ok(())
    }

    /// The values Nomad keeps from the stored method when an update leaves them out.
    pub fn merged(mut self, held: Option<&AuthMethod>) -> AuthMethod {
        if let Some(held) = held {
            if self.token_locality.is_empty() {
                self.token_locality.clone_from(&held.token_locality);
            }
            if self.token_name_format.is_empty() {
                self.token_name_format.clone_from(&held.token_name_format);
            }
            if self.max_token_ttl_ms == 0 {
                self.max_token_ttl_ms = held.max_token_ttl_ms;
            }
            self.create_time_ms = held.create_time_ms;
        }
        if self.token_name_format.is_empty() {
            self.token_name_format = DEFAULT_TOKEN_NAME_FORMAT.into();
        }
        self
    }
}

fn valid_claim_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BindType {
    #[default]
    Role,
    Policy,
    Management,
}

impl BindType {
    pub fn as_str(self) -> &'static str {
        match self {
            BindType::Role => "role",
            BindType::Policy => "policy",
            BindType::Management => "management",
        }
    }

    pub fn parse(text: &str) -> Result<BindType, String> {
        match text {
            "role" => Ok(BindType::Role),
            "policy" => Ok(BindType::Policy),
            "management" => Ok(BindType::Management),
            "" => Err("bind type is missing".into()),
            other => Err(format!("unsupported bind type: {other:?}")),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRule {
    pub id: String,
    pub description: String,
    pub auth_method: String,
    /// go-bexpr over `value.<name>` and `list.<name>`; empty matches every login.
    pub selector: String,
    pub bind_type: BindType,
    /// A role or policy name, `${value.x}` interpolated; empty for management.
    pub bind_name: String,
    pub create_time_ms: u64,
    pub modify_time_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

impl BindingRule {
    /// Nomad's `ACLBindingRule.Validate`.
    pub fn validate(&self) -> Result<(), String> {
        if self.auth_method.is_empty() {
            return Err("auth method is missing".into());
        }
        if self.description.len() > RULE_DESCRIPTION_MAX {
            return Err(format!("description longer than {RULE_DESCRIPTION_MAX}"));
        }
        match self.bind_type {
            BindType::Role | BindType::Policy if self.bind_name.is_empty() => {
                return Err("bind name is missing".into());
            }
            BindType::Management if !self.bind_name.is_empty() => return Err("bind name should be empty".into()),
            _ => {}
        }
        if !self.selector.is_empty() {
            crate::bexpr::Expr::parse(&self.selector).map_err(|error| format!("selector is invalid: {error}"))?;
        }
        Ok(())
    }
}

/// A login's claims as binding rules see them (Nomad's `ACLAuthClaims`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    pub value: BTreeMap<String, String>,
    pub list: BTreeMap<String, Vec<String>>,
}

impl Claims {
    /// The data a selector is evaluated against: `{"value": {...}, "list": {...}}`.
    pub fn selector_data(&self) -> Value {
        serde_json::json!({ "value": self.value, "list": self.list })
    }
}

/// A claim's text, as Nomad stringifies it (numbers truncated to integers).
fn claim_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Bool(flag) => Some(flag.to_string()),
        Value::Number(number) => Some(match number.as_i64() {
            Some(whole) => whole.to_string(),
            None => (number.as_f64().unwrap_or(0.0) as i64).to_string(),
        }),
        _ => None,
    }
}

/// A claim by name, or by JSON pointer when it starts with `/`.
fn claim<'a>(all: &'a Value, name: &str) -> Option<&'a Value> {
    if name.starts_with('/') {
        all.pointer(name)
    } else {
        all.get(name)
    }
}

/// The verified claims `all` (a JSON object), mapped as `config` says.
pub fn claims(config: &AuthMethodConfig, all: &Value) -> Result<Claims, String> {
    let mut out = Claims::default();
    for (source, target) in &config.claim_mappings {
        let Some(raw) = claim(all, source) else { continue };
        let text = claim_text(raw).ok_or_else(|| format!("error converting claim '{source}' to string"))?;
        out.value.insert(target.clone(), text);
    }
    for (source, target) in &config.list_claim_mappings {
        let Some(raw) = claim(all, source) else { continue };
        let items = match raw {
            Value::Array(items) => items.as_slice(),
            single => core::slice::from_ref(single),
        };
        let mut list = Vec::new();
        for item in items {
            let text = claim_text(item)
                .ok_or_else(|| format!("value {item} in {source:?} list claim could not be parsed as string"))?;
            if !text.is_empty() {
                list.push(text);
            }
        }
        out.list.insert(target.clone(), list);
    }
    Ok(out)
}

/// What a login grants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings {
    pub management: bool,
    /// Role IDs.
    pub roles: Vec<String>,
    pub policies: Vec<String>,
}

impl Bindings {
    pub fn none(&self) -> bool {
        !self.management && self.roles.is_empty() && self.policies.is_empty()
    }
}

/// `${name}` replaced by `vars[name]` (lower-cased when `lowercase`); an unknown name is an
/// error, as HIL's.
pub fn interpolate(template: &str, vars: &BTreeMap<String, String>, lowercase: bool) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated ${{ in {template:?}"))?;
        let name = after[..end].trim();
        let value = vars
            .get(name)
            .ok_or_else(|| format!("unknown variable accessed: {name}"))?;
        if lowercase {
            out.push_str(&value.to_lowercase());
        } else {
            out.push_str(value);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn value_vars(claims: &Claims) -> BTreeMap<String, String> {
    claims
        .value
        .iter()
        .map(|(name, value)| (format!("value.{name}"), value.clone()))
        .collect()
}

/// What binding reads of the ACL tables (the state machine's `AclState` holds them; this
/// module sits below it).
pub trait BindingTables {
    /// Every binding rule, in ID order.
    fn binding_rules(&self) -> impl Iterator<Item = &BindingRule>;
    /// The ID of the role of this name, if there is one.
    fn role_id(&self, name: &str) -> Option<&str>;
    fn has_policy(&self, name: &str) -> bool;
}

/// Applies `method`'s binding rules (in ID order) to `claims`: each matching rule binds the
/// role or policy it names, if it exists; a matching management rule makes a management
/// token and ends the search (Nomad's `Binder.Bind`).
pub fn bind(acl: &impl BindingTables, method: &AuthMethod, claims: &Claims) -> Result<Bindings, String> {
    let data = claims.selector_data();
    let vars = value_vars(claims);
    let mut bindings = Bindings::default();
    for rule in acl.binding_rules().filter(|rule| rule.auth_method == method.name) {
        let matched =
            rule.selector.is_empty() || crate::bexpr::Expr::parse(&rule.selector).is_ok_and(|expr| expr.matches(&data));
        if !matched {
            continue;
        }
        let name = interpolate(&rule.bind_name, &vars, true).map_err(|error| {
            format!(
                "cannot compute {:?} bind name for bind target: {error}",
                rule.bind_type.as_str()
            )
        })?;
        if rule.bind_type != BindType::Management && super::validate_policy_name(&name).is_err() {
            return Err(format!(
                "computed {:?} bind name for bind target is invalid: {name:?}",
                rule.bind_type.as_str()
            ));
        }
        match rule.bind_type {
            BindType::Role => {
                if let Some(role) = acl.role_id(&name)
                    && !bindings.roles.iter().any(|id| id == role)
                {
                    bindings.roles.push(role.to_string());
                }
            }
            BindType::Policy => {
                if acl.has_policy(&name) && !bindings.policies.contains(&name) {
                    bindings.policies.push(name);
                }
            }
            BindType::Management => {
                return Ok(Bindings {
                    management: true,
                    ..Bindings::default()
                });
            }
        }
    }
    Ok(bindings)
}

/// The name of a token a login makes (Nomad's `formatTokenName`).
pub fn token_name(method: &AuthMethod, claims: &Claims) -> Result<String, String> {
    let mut vars = value_vars(claims);
    vars.insert("auth_method_type".into(), method.method_type.as_str().into());
    vars.insert("auth_method_name".into(), method.name.clone());
    let format = if method.token_name_format.is_empty() {
        DEFAULT_TOKEN_NAME_FORMAT
    } else {
        &method.token_name_format
    };
    interpolate(format, &vars, false).map_err(|error| format!("failed to generate ACL token name: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{AclPolicy, AclRole, PolicyRules};
    use crate::fsm::acl::AclCommand;
    use crate::fsm::{Command, Entry, Response, ServerState};
    use crate::rpc::ErrorKind;
    use serde_json::json;

    fn apply(state: &mut ServerState, index: u64, command: AclCommand) -> Response {
        state.apply(
            index,
            &Entry {
                at_unix_ms: 1_000,
                command: Command::Acl(command),
            },
        )
    }

    fn method(name: &str, default: bool) -> AuthMethod {
        AuthMethod {
            name: name.into(),
            token_locality: "local".into(),
            max_token_ttl_ms: 3_600_000,
            default,
            config: AuthMethodConfig {
                jwt_validation_pub_keys: vec!["-----BEGIN PUBLIC KEY-----".into()],
                claim_mappings: [("email".into(), "email".into()), ("/org/team".into(), "team".into())].into(),
                list_claim_mappings: [("groups".into(), "groups".into())].into(),
                ..AuthMethodConfig::default()
            },
            ..AuthMethod::default()
        }
        .merged(None)
    }

    fn rule(id: &str, selector: &str, bind_type: BindType, bind_name: &str) -> BindingRule {
        BindingRule {
            id: id.into(),
            auth_method: "sso".into(),
            selector: selector.into(),
            bind_type,
            bind_name: bind_name.into(),
            ..BindingRule::default()
        }
    }

    #[test]
    fn methods_and_rules_are_checked_as_nomad_checks_them() {
        let (min, max) = (Duration::from_secs(60), Duration::from_secs(86_400));
        assert_eq!(method("sso", false).validate(min, max), Ok(()));
        let mut short = method("sso", false);
        short.max_token_ttl_ms = 0;
        assert_eq!(
            short.validate(min, max),
            Err("invalid MaxTokenTTL value '0s' (should be between 1m0s and 24h0m0s)".into())
        );
        let mut two_sources = method("sso", false);
        two_sources.config.jwks_url = "https://idp/jwks".into();
        assert!(two_sources.validate(min, max).unwrap_err().contains("exactly one of"));
        assert_eq!(
            rule("r", "", BindType::Management, "x").validate(),
            Err("bind name should be empty".into())
        );
        assert_eq!(
            rule("r", "", BindType::Role, "").validate(),
            Err("bind name is missing".into())
        );
        assert!(
            rule("r", "value.x ==", BindType::Role, "x")
                .validate()
                .unwrap_err()
                .starts_with("selector is invalid: ")
        );
        assert_eq!(BindType::parse("group"), Err("unsupported bind type: \"group\"".into()));
    }

    #[test]
    fn claims_are_mapped_bound_and_named_as_nomad_does() {
        let mut state = ServerState::default();
        let mut parsed = PolicyRules {
            node: Some("read".into()),
            ..PolicyRules::default()
        };
        parsed.validate().unwrap();
        let policy = AclPolicy {
            name: "eng-readers".into(),
            description: String::new(),
            rules: String::new(),
            parsed,
            create_index: 0,
            modify_index: 0,
        };
        apply(&mut state, 1, AclCommand::PoliciesUpsert { policies: vec![policy] });
        let role = AclRole {
            id: "role-1".into(),
            name: "platform".into(),
            description: String::new(),
            policies: vec!["eng-readers".into()],
            create_index: 0,
            modify_index: 0,
        };
        apply(&mut state, 2, AclCommand::RolesUpsert { roles: vec![role] });
        // A rule for a method that does not exist is refused; a second default too.
        assert_eq!(
            apply(
                &mut state,
                3,
                AclCommand::BindingRulesUpsert {
                    rules: vec![rule("b0", "", BindType::Role, "x")]
                }
            ),
            Response::Error(ErrorKind::Invalid, "ACL auth method sso not found".into())
        );
        apply(
            &mut state,
            4,
            AclCommand::AuthMethodsUpsert {
                methods: vec![method("sso", true)],
            },
        );
        assert_eq!(
            apply(
                &mut state,
                5,
                AclCommand::AuthMethodsUpsert {
                    methods: vec![method("other", true)]
                }
            ),
            Response::Error(ErrorKind::Invalid, "default method already exists: sso".into())
        );
        let rules = vec![
            rule(
                "b1",
                r#""eng" in list.groups"#,
                BindType::Policy,
                "${value.team}-readers",
            ),
            rule(
                "b2",
                r#"value.email matches "@example\\.com$""#,
                BindType::Role,
                "platform",
            ),
            rule("b3", r#""nobody" in list.groups"#, BindType::Management, ""),
            rule("b4", "", BindType::Role, "missing-role"),
        ];
        assert_eq!(
            apply(&mut state, 6, AclCommand::BindingRulesUpsert { rules }),
            Response::Done
        );

        let method = state.acl().auth_method("sso").unwrap().clone();
        let verified = json!({"email": "a@example.com", "org": {"team": "ENG"}, "groups": ["eng", 7, ""], "iat": 1});
        let claims = claims(&method.config, &verified).unwrap();
        assert_eq!(claims.value["team"], "ENG");
        assert_eq!(claims.list["groups"], ["eng", "7"]);
        let bindings = bind(state.acl(), &method, &claims).unwrap();
        assert_eq!(
            bindings,
            Bindings {
                management: false,
                roles: vec!["role-1".into()],
                policies: vec!["eng-readers".into()],
            },
            "bind names are lower-cased; a missing role binds nothing"
        );
        assert_eq!(token_name(&method, &claims).unwrap(), "JWT-sso");
        let mut named = method.clone();
        named.token_name_format = "${auth_method_name}-${value.email}".into();
        assert_eq!(token_name(&named, &claims).unwrap(), "sso-a@example.com");
        named.token_name_format = "${value.nope}".into();
        assert!(
            token_name(&named, &claims)
                .unwrap_err()
                .contains("unknown variable accessed: value.nope")
        );

        // Management ends the search; no match binds nothing.
        let admin = json!({"groups": ["nobody"]});
        let admin = bind(state.acl(), &method, &super::claims(&method.config, &admin).unwrap()).unwrap();
        assert!(admin.management && admin.roles.is_empty());
        apply(&mut state, 7, AclCommand::BindingRulesDelete { ids: vec!["b4".into()] });
        let stranger = super::claims(&method.config, &json!({"email": "x@elsewhere.org"})).unwrap();
        assert!(bind(state.acl(), &method, &stranger).unwrap().none());

        // A rule's method never changes; deleting the method takes its rules.
        let mut moved = rule("b1", "", BindType::Role, "platform");
        moved.auth_method = "other".into();
        apply(
            &mut state,
            8,
            AclCommand::AuthMethodsUpsert {
                methods: vec![self::method("other", false)],
            },
        );
        assert_eq!(
            apply(&mut state, 9, AclCommand::BindingRulesUpsert { rules: vec![moved] }),
            Response::Error(
                ErrorKind::Invalid,
                "cannot update auth method for binding rule, create a new rule instead".into()
            )
        );
        apply(
            &mut state,
            10,
            AclCommand::AuthMethodsDelete {
                names: vec!["sso".into()],
            },
        );
        assert_eq!(state.acl().binding_rules().count(), 0);
        assert!(!format!("{:?}", state.acl()).contains("secret"));
        let restored = ServerState::restore(&state.snapshot()).unwrap();
        assert_eq!(restored.acl(), state.acl());
    }
}
