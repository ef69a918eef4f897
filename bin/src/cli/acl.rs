//! `agent acl ...`: Nomad's ACL commands and their output.

use clap::Subcommand;
use serde_json::{Value, json};

use drover_http::api;

use super::{Api, Failure, table, typed};

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Create the first management token (once; again only with the reset file).
    Bootstrap,
    #[command(subcommand)]
    Policy(PolicyCommand),
    #[command(subcommand)]
    Token(TokenCommand),
    #[command(subcommand)]
    Role(super::acl_roles::RoleCommand),
    #[command(subcommand, name = "auth-method")]
    AuthMethod(super::acl_login::AuthMethodCommand),
    #[command(subcommand, name = "binding-rule")]
    BindingRule(super::acl_login::BindingRuleCommand),
    /// Log in through an auth method (JWT or OIDC) for a token.
    Login(super::acl_login::LoginFlags),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create or update a policy from a file of rules.
    Apply {
        #[arg(long)]
        description: Option<String>,
        name: String,
        file: String,
    },
    Info {
        name: String,
    },
    List,
    Delete {
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    Create {
        #[arg(long)]
        name: Option<String>,
        /// client (default) or management.
        #[arg(long = "type", value_name = "TYPE")]
        token_type: Option<String>,
        /// A policy the token holds (repeat for more).
        #[arg(long = "policy", value_name = "POLICY")]
        policies: Vec<String>,
        /// A role the token links, by name (repeat for more).
        #[arg(long = "role-name", value_name = "NAME")]
        role_names: Vec<String>,
        /// A role the token links, by ID (repeat for more).
        #[arg(long = "role-id", value_name = "ID")]
        role_ids: Vec<String>,
        #[arg(long)]
        global: bool,
        /// Time to live (Go duration), after which the token stops working.
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
    },
    /// Change a token's name, type, policies or roles (what is not given is kept).
    Update {
        #[arg(long)]
        name: Option<String>,
        #[arg(long = "type", value_name = "TYPE")]
        token_type: Option<String>,
        #[arg(long = "policy", value_name = "POLICY")]
        policies: Vec<String>,
        #[arg(long = "role-name", value_name = "NAME")]
        role_names: Vec<String>,
        #[arg(long = "role-id", value_name = "ID")]
        role_ids: Vec<String>,
        accessor: String,
    },
    Info {
        accessor: String,
    },
    /// The token this command runs with.
    #[command(name = "self")]
    SelfInfo,
    List,
    Delete {
        accessor: String,
    },
}

pub(super) fn run(api: &Api, command: AclCommand) -> Result<(), Failure> {
    match command {
        AclCommand::Bootstrap => print_token(&typed(
            "/v1/acl/bootstrap",
            &api.call("POST", "/v1/acl/bootstrap", None)?,
        )?),
        AclCommand::Policy(PolicyCommand::Apply {
            description,
            name,
            file,
        }) => {
            let rules = std::fs::read_to_string(&file)
                .map_err(|error| Failure(format!("Error reading policy file {file:?}: {error}"), 1))?;
            let body = json!({"Name": name, "Description": description.unwrap_or_default(), "Rules": rules});
            api.call("PUT", &format!("/v1/acl/policy/{name}"), Some(&body))?;
            println!("Successfully wrote {name:?} ACL policy!");
            Ok(())
        }
        AclCommand::Policy(PolicyCommand::Info { name }) => {
            let policy: api::AclPolicy = api.get_as(&format!("/v1/acl/policy/{name}"))?;
            println!("Name        = {}", policy.name);
            println!("Description = {}", policy.description);
            println!("CreateIndex = {}", policy.create_index);
            println!("ModifyIndex = {}", policy.modify_index);
            println!("\nRules\n\n{}", policy.rules.unwrap_or_default());
            Ok(())
        }
        AclCommand::Policy(PolicyCommand::List) => {
            let policies: Vec<api::AclPolicy> = api.get_as("/v1/acl/policies")?;
            let mut rows = vec![vec!["Name".to_string(), "Description".to_string()]];
            for policy in policies {
                rows.push(vec![policy.name, policy.description]);
            }
            println!("{}", table(&rows));
            Ok(())
        }
        AclCommand::Policy(PolicyCommand::Delete { name }) => {
            api.call("DELETE", &format!("/v1/acl/policy/{name}"), None)?;
            println!("Successfully deleted {name:?} ACL policy!");
            Ok(())
        }
        AclCommand::Token(TokenCommand::Create {
            name,
            token_type,
            policies,
            role_names,
            role_ids,
            global,
            ttl,
        }) => {
            let roles = role_links(&role_ids, &role_names);
            let body = json!({
                "Name": name.unwrap_or_default(),
                "Type": token_type.unwrap_or_else(|| "client".into()),
                "Policies": policies,
                "Roles": roles,
                "Global": global,
                "ExpirationTTL": ttl.unwrap_or_default(),
            });
            print_token(&typed(
                "/v1/acl/token",
                &api.call("PUT", "/v1/acl/token", Some(&body))?,
            )?)
        }
        AclCommand::Token(TokenCommand::Update {
            name,
            token_type,
            policies,
            role_names,
            role_ids,
            accessor,
        }) => {
            let path = format!("/v1/acl/token/{accessor}");
            let held: api::AclToken = api.get_as(&path)?;
            let roles = if role_ids.is_empty() && role_names.is_empty() {
                serde_json::to_value(held.roles)?
            } else {
                json!(role_links(&role_ids, &role_names))
            };
            let body = json!({
                "AccessorID": accessor,
                "Name": name.unwrap_or(held.name),
                "Type": token_type.unwrap_or(held.token_type),
                "Policies": if policies.is_empty() { held.policies } else { policies },
                "Roles": roles,
            });
            print_token(&typed(&path, &api.call("POST", &path, Some(&body))?)?)
        }
        AclCommand::Token(TokenCommand::Info { accessor }) => {
            print_token(&api.get_as(&format!("/v1/acl/token/{accessor}"))?)
        }
        AclCommand::Token(TokenCommand::SelfInfo) => print_token(&api.get_as("/v1/acl/token/self")?),
        AclCommand::Token(TokenCommand::List) => {
            let tokens: Vec<api::AclToken> = api.get_as("/v1/acl/tokens")?;
            let mut rows = vec![vec![
                "Name".to_string(),
                "Type".to_string(),
                "Global".to_string(),
                "Accessor ID".to_string(),
                "Expired".to_string(),
            ]];
            let now = drover_http::rfc3339(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|since| since.as_millis() as u64)
                    .unwrap_or(0),
            );
            for token in tokens {
                let expired = expired(&token, &now).to_string();
                rows.push(vec![
                    token.name,
                    token.token_type,
                    token.global.to_string(),
                    token.accessor_id,
                    expired,
                ]);
            }
            println!("{}", table(&rows));
            Ok(())
        }
        AclCommand::Role(command) => super::acl_roles::run(api, command),
        AclCommand::AuthMethod(command) => super::acl_login::run_method(api, command),
        AclCommand::BindingRule(command) => super::acl_login::run_rule(api, command),
        AclCommand::Login(flags) => super::acl_login::login(api, flags),
        AclCommand::Token(TokenCommand::Delete { accessor }) => {
            api.call("DELETE", &format!("/v1/acl/token/{accessor}"), None)?;
            println!("Token {accessor} successfully deleted");
            Ok(())
        }
    }
}

/// A token's role links as the API takes them: by ID, then by name.
fn role_links(ids: &[String], names: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|id| json!({ "ID": id }))
        .chain(names.iter().map(|name| json!({ "Name": name })))
        .collect()
}

/// Whether `token` expired before `now` (both RFC 3339 in UTC as the API writes them, whose
/// text order is time order).
fn expired(token: &api::AclToken, now: &str) -> bool {
    token
        .expiration_time
        .as_deref()
        .is_some_and(|expiry| !expiry.is_empty() && expiry < now)
}

/// Nomad's token block (`formatKVACLToken`).
pub(super) fn print_token(token: &api::AclToken) -> Result<(), Failure> {
    let management = token.token_type == "management";
    let policies = if management {
        "n/a".to_string()
    } else {
        format!("[{}]", token.policies.join(" "))
    };
    let roles = if management {
        "n/a".to_string()
    } else {
        let names: Vec<&str> = token.roles.iter().map(|link| link.name.as_str()).collect();
        format!("[{}]", names.join(" "))
    };
    let expiry = token.expiration_time.clone().unwrap_or_else(|| "<none>".into());
    let rows = [
        ("Accessor ID", token.accessor_id.clone()),
        ("Secret ID", token.secret_id.clone().unwrap_or_default()),
        ("Name", token.name.clone()),
        ("Type", token.token_type.clone()),
        ("Global", token.global.to_string()),
        ("Create Time", token.create_time.clone()),
        ("Expiry Time", expiry),
        ("Create Index", token.create_index.to_string()),
        ("Modify Index", token.modify_index.to_string()),
        ("Policies", policies),
        ("Roles", roles),
    ];
    for (key, value) in rows {
        println!("{key:<12} = {value}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_expired_once_its_expiration_time_has_passed() {
        let now = drover_http::rfc3339(1_800_000_000_000);
        let at = |expiration_time: Option<u64>| api::AclToken {
            expiration_time: expiration_time.map(drover_http::rfc3339),
            ..api::AclToken::default()
        };
        assert!(expired(&at(Some(1_799_999_999_000)), &now));
        assert!(!expired(&at(Some(1_800_000_001_000)), &now));
        assert!(!expired(&at(None), &now));
    }
}
