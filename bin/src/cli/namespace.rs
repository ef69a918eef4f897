//! `namespace list|status|inspect|apply|delete`: Nomad's namespace commands over
//! `/v1/namespaces` and `/v1/namespace/:name`.

use clap::Subcommand;
use serde_json::{Value, json};

use super::daily::{Format, key_values};
use super::{Api, Failure, escape, table, text};

#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Every namespace the token may see.
    List {
        #[command(flatten)]
        format: Format,
    },
    /// One namespace: its description and metadata.
    Status {
        name: String,
        #[command(flatten)]
        format: Format,
    },
    /// One namespace as the API's JSON (or through `-t`).
    Inspect {
        name: String,
        /// Print through this Go template (over the API's JSON).
        #[arg(short = 't', value_name = "TEMPLATE")]
        template: Option<String>,
    },
    /// Create or update a namespace.
    Apply {
        name: String,
        /// The namespace's description (kept as it is when not given).
        #[arg(long)]
        description: Option<String>,
        /// A `key=value` metadata entry (repeatable; replaces the metadata when given).
        #[arg(long = "meta")]
        meta: Vec<String>,
    },
    /// Delete a namespace with no job still running in it.
    Delete { name: String },
}

fn namespace(api: &Api, name: &str) -> Result<Value, Failure> {
    match api.call_status("GET", &format!("/v1/namespace/{}", escape(name)), None)? {
        Ok(found) => Ok(found),
        Err((404, _)) => Err(Failure(format!("Namespace {name:?} not found"), 1)),
        Err((code, text)) => Err(Failure(
            format!("Error retrieving namespace: Unexpected response code: {code} ({text})"),
            1,
        )),
    }
}

pub(super) fn run(api: &Api, command: NamespaceCommand) -> Result<(), Failure> {
    match command {
        NamespaceCommand::List { format } => {
            let listed = api.get("/v1/namespaces")?;
            if format.printed(&listed)? {
                return Ok(());
            }
            let mut rows = vec![vec!["Name".to_string(), "Description".to_string()]];
            for namespace in listed.as_array().into_iter().flatten() {
                rows.push(vec![text(&namespace["Name"]), text(&namespace["Description"])]);
            }
            println!("{}", table(&rows));
            Ok(())
        }
        NamespaceCommand::Status { name, format } => {
            let found = namespace(api, &name)?;
            if format.printed(&found)? {
                return Ok(());
            }
            println!(
                "{}",
                key_values(vec![
                    ("Name", text(&found["Name"])),
                    ("Description", text(&found["Description"])),
                    ("Quota", "<none>".into()),
                ])
            );
            if let Some(meta) = found["Meta"].as_object().filter(|meta| !meta.is_empty()) {
                println!("\nMetadata");
                println!(
                    "{}",
                    key_values(meta.iter().map(|(key, value)| (key.as_str(), text(value))).collect())
                );
            }
            Ok(())
        }
        NamespaceCommand::Inspect { name, template } => {
            let found = namespace(api, &name)?;
            let format = Format {
                json: template.is_none(),
                template,
            };
            format.printed(&found)?;
            Ok(())
        }
        NamespaceCommand::Apply {
            name,
            description,
            meta,
        } => {
            // An update keeps what it does not name, as Nomad's `namespace apply` does.
            let existing = match api.call_status("GET", &format!("/v1/namespace/{}", escape(&name)), None)? {
                Ok(found) => Some(found),
                Err((404, _)) => None,
                Err((code, text)) => return Err(Failure(format!("Unexpected response code: {code} ({text})"), 1)),
            };
            let mut body = json!({
                "Name": name,
                "Description": existing.as_ref().map(|found| found["Description"].clone()).unwrap_or(json!("")),
                "Meta": existing.as_ref().map(|found| found["Meta"].clone()).unwrap_or(Value::Null),
            });
            if let Some(description) = description {
                body["Description"] = json!(description);
            }
            if !meta.is_empty() {
                let mut map = serde_json::Map::new();
                for entry in &meta {
                    let Some((key, value)) = entry.split_once('=') else {
                        return Err(Failure(format!("Metadata {entry:?} is not key=value"), 1));
                    };
                    map.insert(key.to_string(), json!(value));
                }
                body["Meta"] = Value::Object(map);
            }
            match api.call_status("PUT", &format!("/v1/namespace/{}", escape(&name)), Some(&body))? {
                Ok(_) => {
                    println!("Successfully applied namespace {name:?}!");
                    Ok(())
                }
                Err((code, text)) => Err(Failure(
                    format!("Error applying namespace: Unexpected response code: {code} ({text})"),
                    1,
                )),
            }
        }
        NamespaceCommand::Delete { name } => {
            match api.call_status("DELETE", &format!("/v1/namespace/{}", escape(&name)), None)? {
                Ok(_) => {
                    println!("Successfully deleted namespace {name:?}!");
                    Ok(())
                }
                Err((code, text)) => Err(Failure(
                    format!("Error deleting namespace: Unexpected response code: {code} ({text})"),
                    1,
                )),
            }
        }
    }
}
