//! `agent acl ...`: Nomad's ACL commands and their output.

use clap::Subcommand;
use serde_json::{Value, json};

use super::{Api, Failure, table, text};

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
        AclCommand::Bootstrap => print_token(&api.call("POST", "/v1/acl/bootstrap", None)?),
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
            let policy = api.get(&format!("/v1/acl/policy/{name}"))?;
            println!("Name        = {}", text(&policy["Name"]));
            println!("Description = {}", text(&policy["Description"]));
            println!("CreateIndex = {}", text(&policy["CreateIndex"]));
            println!("ModifyIndex = {}", text(&policy["ModifyIndex"]));
            println!("\nRules\n\n{}", text(&policy["Rules"]));
            Ok(())
        }
        AclCommand::Policy(PolicyCommand::List) => {
            let policies = api.get("/v1/acl/policies")?;
            let mut rows = vec![vec!["Name".to_string(), "Description".to_string()]];
            for policy in policies.as_array().into_iter().flatten() {
                rows.push(vec![text(&policy["Name"]), text(&policy["Description"])]);
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
            print_token(&api.call("PUT", "/v1/acl/token", Some(&body))?)
        }
        AclCommand::Token(TokenCommand::Update {
            name,
            token_type,
            policies,
            role_names,
            role_ids,
            accessor,
        }) => {
            let held = api.get(&format!("/v1/acl/token/{accessor}"))?;
            let roles = if role_ids.is_empty() && role_names.is_empty() {
                held["Roles"].as_array().cloned().unwrap_or_default()
            } else {
                role_links(&role_ids, &role_names)
            };
            let body = json!({
                "AccessorID": accessor,
                "Name": name.unwrap_or_else(|| text(&held["Name"])),
                "Type": token_type.unwrap_or_else(|| text(&held["Type"])),
                "Policies": if policies.is_empty() { held["Policies"].clone() } else { json!(policies) },
                "Roles": roles,
            });
            print_token(&api.call("POST", &format!("/v1/acl/token/{accessor}"), Some(&body))?)
        }
        AclCommand::Token(TokenCommand::Info { accessor }) => {
            print_token(&api.get(&format!("/v1/acl/token/{accessor}"))?)
        }
        AclCommand::Token(TokenCommand::SelfInfo) => print_token(&api.get("/v1/acl/token/self")?),
        AclCommand::Token(TokenCommand::List) => {
            let tokens = api.get("/v1/acl/tokens")?;
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
            for token in tokens.as_array().into_iter().flatten() {
                rows.push(vec![
                    text(&token["Name"]),
                    text(&token["Type"]),
                    text(&token["Global"]),
                    text(&token["AccessorID"]),
                    expired(token, &now).to_string(),
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
fn expired(token: &Value, now: &str) -> bool {
    token["ExpirationTime"]
        .as_str()
        .is_some_and(|expiry| !expiry.is_empty() && expiry < now)
}

/// Nomad's token block (`formatKVACLToken`).
pub(super) fn print_token(token: &Value) -> Result<(), Failure> {
    let policies = if token["Type"] == "management" {
        "n/a".to_string()
    } else {
        let names: Vec<String> = token["Policies"].as_array().into_iter().flatten().map(text).collect();
        format!("[{}]", names.join(" "))
    };
    let roles = if token["Type"] == "management" {
        "n/a".to_string()
    } else {
        let names: Vec<String> = token["Roles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|link| text(&link["Name"]))
            .collect();
        format!("[{}]", names.join(" "))
    };
    let expiry = match &token["ExpirationTime"] {
        Value::Null => "<none>".to_string(),
        other => text(other),
    };
    let rows = [
        ("Accessor ID", text(&token["AccessorID"])),
        ("Secret ID", text(&token["SecretID"])),
        ("Name", text(&token["Name"])),
        ("Type", text(&token["Type"])),
        ("Global", text(&token["Global"])),
        ("Create Time", text(&token["CreateTime"])),
        ("Expiry Time", expiry),
        ("Create Index", text(&token["CreateIndex"])),
        ("Modify Index", text(&token["ModifyIndex"])),
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
        let at = |ms: u64| json!({ "ExpirationTime": drover_http::rfc3339(ms) });
        assert!(expired(&at(1_799_999_999_000), &now));
        assert!(!expired(&at(1_800_000_001_000), &now));
        assert!(!expired(&json!({ "ExpirationTime": null }), &now));
    }
}
