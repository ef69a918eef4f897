//! `agent operator gossip keyring`: list, install, use and remove gossip encryption keys on
//! every server, and `generate` a new key (Nomad's command and messages).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Api, Failure, table};

#[derive(Debug, Subcommand)]
pub enum GossipCommand {
    /// The gossip encryption keyring of the servers.
    Keyring(KeyringArgs),
}

#[derive(Debug, Args)]
pub struct KeyringArgs {
    /// Generate a new key (printed, not installed).
    #[command(subcommand)]
    pub action: Option<KeyringAction>,
    /// List the installed keys and how many servers hold each.
    #[arg(long)]
    pub list: bool,
    /// Install a key on every server (not yet used to encrypt).
    #[arg(long, value_name = "KEY")]
    pub install: Option<String>,
    /// Make an installed key the one every server encrypts with.
    #[arg(long = "use", value_name = "KEY")]
    pub use_key: Option<String>,
    /// Remove a key that is no longer primary from every server.
    #[arg(long, value_name = "KEY")]
    pub remove: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum KeyringAction {
    /// Print a new random 32-byte key, base64.
    Generate,
}

pub fn run(api: &Api, command: GossipCommand) -> Result<(), Failure> {
    let GossipCommand::Keyring(args) = command;
    if let Some(KeyringAction::Generate) = args.action {
        println!("{}", drover_io_real::keyring::generate_key());
        return Ok(());
    }
    let chosen = [
        args.list,
        args.install.is_some(),
        args.use_key.is_some(),
        args.remove.is_some(),
    ];
    if chosen.iter().filter(|&&set| set).count() != 1 {
        return Err(Failure(
            "Exactly one of -list, -install, -use, or -remove must be provided".into(),
            1,
        ));
    }
    if args.list {
        println!("==> Gathering installed encryption keys...");
        let answer = api.get("/v1/agent/keyring/list")?;
        failures(&answer)?;
        let total = answer["NumNodes"].as_u64().unwrap_or(0);
        let mut rows = vec![vec!["Key".to_string(), "Servers".to_string()]];
        if let Some(keys) = answer["Keys"].as_object() {
            for (key, count) in keys {
                rows.push(vec![key.clone(), format!("{}/{total}", count.as_u64().unwrap_or(0))]);
            }
        }
        println!("{}", table(&rows));
        return Ok(());
    }
    let (op, key, message) = if let Some(key) = args.install {
        ("install", key, "Installing new gossip encryption key...")
    } else if let Some(key) = args.use_key {
        ("use", key, "Changing primary gossip encryption key...")
    } else {
        let key = args.remove.unwrap_or_default();
        ("remove", key, "Removing gossip encryption key...")
    };
    println!("==> {message}");
    let answer = api.call("PUT", &format!("/v1/agent/keyring/{op}"), Some(&json!({ "Key": key })))?;
    failures(&answer)
}

/// The servers that did not apply the operation, as an error.
fn failures(answer: &Value) -> Result<(), Failure> {
    let Some(messages) = answer["Messages"].as_object().filter(|messages| !messages.is_empty()) else {
        return Ok(());
    };
    let lines: Vec<String> = messages
        .iter()
        .map(|(server, error)| format!("  {server}: {}", error.as_str().unwrap_or_default()))
        .collect();
    Err(Failure(
        format!("error: {} server(s) failed:\n{}", messages.len(), lines.join("\n")),
        1,
    ))
}
