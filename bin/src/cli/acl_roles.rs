//! `agent acl role create|list|info|update|delete`: Nomad's ACL role commands and output.

use clap::Subcommand;
use serde_json::{Value, json};

use drover_http::api;

use super::{Api, Failure, table, typed};

#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Create a role holding one or more policies.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        description: Option<String>,
        /// A policy the role holds (repeat for more; at least one).
        #[arg(long = "policy", value_name = "POLICY")]
        policies: Vec<String>,
    },
    /// Show a role by ID (or by name with -by-name).
    Info {
        #[arg(long)]
        by_name: bool,
        role: String,
    },
    List {
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Change a role; what is not given is kept unless -no-merge.
    Update {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        description: Option<String>,
        #[arg(long = "policy", value_name = "POLICY")]
        policies: Vec<String>,
        #[arg(long)]
        no_merge: bool,
        id: String,
    },
    Delete {
        id: String,
    },
}

fn links(policies: &[String]) -> Value {
    Value::Array(policies.iter().map(|name| json!({ "Name": name })).collect())
}

pub(super) fn run(api: &Api, command: RoleCommand) -> Result<(), Failure> {
    match command {
        RoleCommand::Create {
            name,
            description,
            policies,
        } => {
            if policies.is_empty() {
                return Err(Failure(
                    "At least one policy name must be specified using the -policy flag".into(),
                    1,
                ));
            }
            let body =
                json!({"Name": name, "Description": description.unwrap_or_default(), "Policies": links(&policies)});
            print_role(&typed("/v1/acl/role", &api.call("POST", "/v1/acl/role", Some(&body))?)?);
            Ok(())
        }
        RoleCommand::Info { by_name, role } => {
            let path = if by_name {
                format!("/v1/acl/role/name/{role}")
            } else {
                format!("/v1/acl/role/{role}")
            };
            print_role(&api.get_as(&path)?);
            Ok(())
        }
        RoleCommand::List { prefix } => {
            let path = match prefix {
                Some(prefix) => format!("/v1/acl/roles?prefix={prefix}"),
                None => "/v1/acl/roles".into(),
            };
            let roles: Vec<api::AclRole> = api.get_as(&path)?;
            if roles.is_empty() {
                println!("No ACL roles found");
                return Ok(());
            }
            let mut rows = vec![["ID", "Name", "Description", "Policies"].map(String::from).to_vec()];
            for role in &roles {
                rows.push(vec![
                    role.id.clone(),
                    role.name.clone(),
                    description(&role.description),
                    policy_names(role).join(","),
                ]);
            }
            println!("{}", table(&rows));
            Ok(())
        }
        RoleCommand::Update {
            name,
            description,
            policies,
            no_merge,
            id,
        } => {
            let path = format!("/v1/acl/role/{id}");
            let held: api::AclRole = if no_merge {
                api::AclRole::default()
            } else {
                api.get_as(&path)?
            };
            let policies = if policies.is_empty() {
                policy_names(&held)
            } else {
                policies
            };
            let body = json!({
                "ID": id,
                "Name": name.unwrap_or(held.name),
                "Description": description.unwrap_or(held.description),
                "Policies": links(&policies),
            });
            print_role(&typed(&path, &api.call("POST", &path, Some(&body))?)?);
            Ok(())
        }
        RoleCommand::Delete { id } => {
            api.call("DELETE", &format!("/v1/acl/role/{id}"), None)?;
            println!("ACL role {id} successfully deleted");
            Ok(())
        }
    }
}

fn policy_names(role: &api::AclRole) -> Vec<String> {
    role.policies.iter().map(|link| link.name.clone()).collect()
}

fn description(text: &str) -> String {
    if text.is_empty() { "<none>".into() } else { text.into() }
}

/// Nomad's role block (`formatACLRole`).
fn print_role(role: &api::AclRole) {
    let rows = [
        ("ID", role.id.clone()),
        ("Name", role.name.clone()),
        ("Description", description(&role.description)),
        ("Policies", policy_names(role).join(",")),
        ("Create Index", role.create_index.to_string()),
        ("Modify Index", role.modify_index.to_string()),
    ];
    for (key, value) in rows {
        println!("{key:<12} = {value}");
    }
}
