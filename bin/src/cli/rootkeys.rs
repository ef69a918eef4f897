//! `agent operator root keyring list|rotate|remove`: the root keys that seal variables and
//! volume secrets (Nomad's commands, table and messages).

use clap::Subcommand;
use serde_json::Value;

use super::{Api, Failure, table, text};

#[derive(Debug, Subcommand)]
pub enum RootCommand {
    /// The root encryption keyring.
    #[command(subcommand)]
    Keyring(RootKeyringCommand),
}

#[derive(Debug, Subcommand)]
pub enum RootKeyringCommand {
    /// List the root keys and which one is active.
    List {
        /// Full key ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Make a new active root key; the old ones still open what they sealed.
    Rotate {
        #[arg(long)]
        verbose: bool,
    },
    /// Remove an inactive root key. What it sealed can no longer be read.
    Remove {
        #[arg(value_name = "KEY_ID")]
        key_id: String,
    },
}

pub fn run(api: &Api, command: RootCommand) -> Result<(), Failure> {
    let RootCommand::Keyring(command) = command;
    match command {
        RootKeyringCommand::List { verbose } => {
            let keys = api.get("/v1/operator/keyring/keys")?;
            let keys = keys.as_array().cloned().unwrap_or_default();
            if keys.is_empty() {
                println!("No keys found");
                return Ok(());
            }
            println!("{}", render(&keys, verbose));
        }
        RootKeyringCommand::Rotate { verbose } => {
            let answer = api.call("PUT", "/v1/operator/keyring/rotate", None)?;
            println!("{}", render(&[answer["Key"].clone()], verbose));
        }
        RootKeyringCommand::Remove { key_id } => {
            api.call("DELETE", &format!("/v1/operator/keyring/key/{key_id}"), None)?;
            println!("Removed encryption key {key_id}");
        }
    }
    Ok(())
}

/// Nomad's table: `Key`, `State`, `Create Time`; ids shortened unless `verbose`.
fn render(keys: &[Value], verbose: bool) -> String {
    let mut rows = vec![vec!["Key".to_string(), "State".to_string(), "Create Time".to_string()]];
    for key in keys {
        let id = text(&key["KeyID"]);
        rows.push(vec![
            if verbose { id } else { id.chars().take(8).collect() },
            text(&key["State"]),
            super::alloc::format_unix_nanos(key["CreateTime"].as_i64().unwrap_or(0)),
        ]);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_listed_as_nomad_lists_them() {
        let keys = serde_json::json!([
            {"KeyID": "f19f6029-0a1b-4c2d-8e3f-000000000001", "State": "active", "CreateTime": 1_657_566_876_000_000_000i64},
            {"KeyID": "aa000000-0a1b-4c2d-8e3f-000000000002", "State": "inactive", "CreateTime": 1_657_566_000_000_000_000i64},
        ]);
        let keys = keys.as_array().unwrap();
        assert_eq!(
            render(keys, false),
            "Key       State     Create Time\n\
             f19f6029  active    2022-07-11T19:14:36Z\n\
             aa000000  inactive  2022-07-11T19:00:00Z"
        );
        assert!(render(keys, true).contains("f19f6029-0a1b-4c2d-8e3f-000000000001"));
    }
}
