//! ACL tokens, policies, roles, auth methods and binding rules as `/v1/acl/*` answers them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nomad's `ACLToken`. The secret is shown only to whoever made or may manage the token.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclToken {
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    #[serde(rename = "SecretID", skip_serializing_if = "Option::is_none")]
    pub secret_id: Option<String>,
    pub name: String,
    /// `client` or `management`.
    #[serde(rename = "Type")]
    pub token_type: String,
    pub policies: Vec<String>,
    pub roles: Vec<AclTokenRoleLink>,
    pub global: bool,
    /// RFC 3339.
    pub create_time: String,
    /// RFC 3339; null when the token never expires.
    pub expiration_time: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A role a token holds, by ID with its current name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclTokenRoleLink {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
}

/// Nomad's `ACLPolicy`; the list (`GET /v1/acl/policies`) leaves out the rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclPolicy {
    pub name: String,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Nomad's `ACLRole`: a named set of policies tokens link to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclRole {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub description: String,
    pub policies: Vec<AclRolePolicyLink>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A policy a role holds, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclRolePolicyLink {
    pub name: String,
}

/// Nomad's `ACLAuthMethodListStub` (`GET /v1/acl/auth-methods`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AuthMethodListStub {
    pub name: String,
    /// `OIDC` or `JWT`.
    #[serde(rename = "Type")]
    pub method_type: String,
    pub default: bool,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Nomad's `ACLAuthMethod` (`GET /v1/acl/auth-method/:name`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AuthMethod {
    pub name: String,
    #[serde(rename = "Type")]
    pub method_type: String,
    /// `local` or `global`.
    pub token_locality: String,
    pub token_name_format: String,
    /// A Go duration (`1h0m0s`).
    #[serde(rename = "MaxTokenTTL")]
    pub max_token_ttl: String,
    pub default: bool,
    pub config: AuthMethodConfig,
    /// RFC 3339.
    pub create_time: String,
    pub modify_time: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// How an auth method checks an identity and reads its claims (Nomad's `ACLAuthMethodConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthMethodConfig {
    #[serde(rename = "JWTValidationPubKeys")]
    pub jwt_validation_pub_keys: Vec<String>,
    #[serde(rename = "JWKSURL")]
    pub jwks_url: String,
    #[serde(rename = "JWKSCACert")]
    pub jwks_ca_cert: String,
    #[serde(rename = "OIDCDiscoveryURL")]
    pub oidc_discovery_url: String,
    #[serde(rename = "OIDCClientID")]
    pub oidc_client_id: String,
    #[serde(rename = "OIDCClientSecret")]
    pub oidc_client_secret: String,
    #[serde(rename = "OIDCEnablePKCE")]
    pub oidc_enable_pkce: bool,
    #[serde(rename = "OIDCDisableUserInfo")]
    pub oidc_disable_userinfo: bool,
    #[serde(rename = "OIDCScopes")]
    pub oidc_scopes: Vec<String>,
    #[serde(rename = "BoundAudiences")]
    pub bound_audiences: Vec<String>,
    #[serde(rename = "BoundIssuer")]
    pub bound_issuer: Vec<String>,
    #[serde(rename = "AllowedRedirectURIs")]
    pub allowed_redirect_uris: Vec<String>,
    #[serde(rename = "DiscoveryCaPem")]
    pub discovery_ca_pem: Vec<String>,
    #[serde(rename = "SigningAlgs")]
    pub signing_algs: Vec<String>,
    /// Go durations.
    #[serde(rename = "ExpirationLeeway")]
    pub expiration_leeway: String,
    #[serde(rename = "NotBeforeLeeway")]
    pub not_before_leeway: String,
    #[serde(rename = "ClockSkewLeeway")]
    pub clock_skew_leeway: String,
    #[serde(rename = "ClaimMappings")]
    pub claim_mappings: BTreeMap<String, String>,
    #[serde(rename = "ListClaimMappings")]
    pub list_claim_mappings: BTreeMap<String, String>,
    #[serde(rename = "VerboseLogging")]
    pub verbose_logging: bool,
}

/// Nomad's `ACLBindingRule`: which identities an auth method's logins bind to what.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct BindingRule {
    #[serde(rename = "ID")]
    pub id: String,
    pub description: String,
    pub auth_method: String,
    pub selector: String,
    /// `role`, `policy` or `management`.
    pub bind_type: String,
    pub bind_name: String,
    /// RFC 3339.
    pub create_time: String,
    pub modify_time: String,
    pub create_index: u64,
    pub modify_index: u64,
}
