//! `agent server join|force-leave`, `agent operator raft remove-peer` and
//! `agent operator autopilot get-config|set-config|health` (Nomad's commands and messages).

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{Api, Failure, escape, table, text};

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// Gossip addresses of servers to join (ip or ip:port).
    #[arg(required = true)]
    pub addresses: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ForceLeaveArgs {
    /// Also forget the server entirely, rather than show it as left.
    #[arg(long)]
    pub prune: bool,
    /// The failed server's name, as `server members` shows it.
    pub node: String,
}

#[derive(Debug, Args)]
pub struct RemovePeerArgs {
    /// The peer's RPC address (ip:port).
    #[arg(long = "peer-address")]
    pub address: Option<String>,
    /// The peer's Raft id.
    #[arg(long = "peer-id")]
    pub id: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum AutopilotCommand {
    /// The cluster's autopilot settings.
    #[command(name = "get-config")]
    GetConfig,
    /// Change the cluster's autopilot settings (only those given).
    #[command(name = "set-config")]
    SetConfig(SetConfigArgs),
    /// The health of every server, as the leader sees it.
    Health {
        /// The answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct SetConfigArgs {
    #[arg(long = "cleanup-dead-servers")]
    pub cleanup_dead_servers: Option<bool>,
    #[arg(long = "max-trailing-logs")]
    pub max_trailing_logs: Option<u64>,
    #[arg(long = "min-quorum")]
    pub min_quorum: Option<u32>,
    #[arg(long = "last-contact-threshold")]
    pub last_contact_threshold: Option<String>,
    #[arg(long = "server-stabilization-time")]
    pub server_stabilization_time: Option<String>,
    #[arg(long = "enable-redundancy-zones")]
    pub enable_redundancy_zones: Option<bool>,
    #[arg(long = "disable-upgrade-migration")]
    pub disable_upgrade_migration: Option<bool>,
    #[arg(long = "enable-custom-upgrades")]
    pub enable_custom_upgrades: Option<bool>,
}

pub(super) fn join(api: &Api, args: JoinArgs) -> Result<(), Failure> {
    let query: Vec<String> = args
        .addresses
        .iter()
        .map(|address| format!("address={}", escape(address)))
        .collect();
    let answer = api
        .call("PUT", &format!("/v1/agent/join?{}", query.join("&")), None)
        .map_err(|Failure(error, code)| Failure(format!("Error joining: {error}"), code))?;
    let error = text(&answer["error"]);
    if !error.is_empty() {
        return Err(Failure(format!("Error joining: {error}"), 1));
    }
    println!("Joined {} servers successfully", text(&answer["num_joined"]));
    Ok(())
}

pub(super) fn force_leave(api: &Api, args: ForceLeaveArgs) -> Result<(), Failure> {
    let mut path = format!("/v1/agent/force-leave?node={}", escape(&args.node));
    if args.prune {
        path.push_str("&prune=true");
    }
    api.call("PUT", &path, None)
        .map(|_| ())
        .map_err(|Failure(error, code)| Failure(format!("Error force-leaving server {}: {error}", args.node), code))
}

pub(super) fn remove_peer(api: &Api, args: RemovePeerArgs) -> Result<(), Failure> {
    let (query, said) = match (&args.address, &args.id) {
        (Some(_), Some(_)) => {
            return Err(Failure("Cannot give both -peer-address and -peer-id".into(), 1));
        }
        (Some(address), None) => (format!("address={}", escape(address)), format!("address {address:?}")),
        (None, Some(id)) => (format!("id={}", escape(id)), format!("id {id:?}")),
        (None, None) => {
            return Err(Failure(
                "Missing peer identifier: give -peer-address or -peer-id".into(),
                1,
            ));
        }
    };
    api.call("DELETE", &format!("/v1/operator/raft/peer?{query}"), None)
        .map_err(|Failure(error, code)| Failure(format!("Error removing peer: {error}"), code))?;
    println!("Removed peer with {said}");
    Ok(())
}

pub(super) fn autopilot(api: &Api, command: AutopilotCommand) -> Result<(), Failure> {
    match command {
        AutopilotCommand::GetConfig => {
            let config = api.get("/v1/operator/autopilot/configuration")?;
            for key in [
                "CleanupDeadServers",
                "LastContactThreshold",
                "MaxTrailingLogs",
                "MinQuorum",
                "ServerStabilizationTime",
                "EnableRedundancyZones",
                "DisableUpgradeMigration",
                "EnableCustomUpgrades",
            ] {
                println!("{key} = {}", text(&config[key]));
            }
            Ok(())
        }
        AutopilotCommand::SetConfig(args) => set_config(api, args),
        AutopilotCommand::Health { json } => {
            let health = api.get("/v1/operator/autopilot/health")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&health)?);
            } else {
                print_health(&health);
            }
            Ok(())
        }
    }
}

/// Read, change what was given, write back only if nobody changed it meanwhile (Nomad's
/// check-and-set on `ModifyIndex`).
fn set_config(api: &Api, args: SetConfigArgs) -> Result<(), Failure> {
    let mut config = api.get("/v1/operator/autopilot/configuration")?;
    let index = config["ModifyIndex"].as_u64().unwrap_or(0);
    let fields = config
        .as_object_mut()
        .ok_or_else(|| Failure("unexpected autopilot configuration".into(), 1))?;
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            fields.insert(key.into(), value);
        }
    };
    set("CleanupDeadServers", args.cleanup_dead_servers.map(Value::from));
    set("MaxTrailingLogs", args.max_trailing_logs.map(Value::from));
    set("MinQuorum", args.min_quorum.map(Value::from));
    set("LastContactThreshold", args.last_contact_threshold.map(Value::from));
    set(
        "ServerStabilizationTime",
        args.server_stabilization_time.map(Value::from),
    );
    set("EnableRedundancyZones", args.enable_redundancy_zones.map(Value::from));
    set(
        "DisableUpgradeMigration",
        args.disable_upgrade_migration.map(Value::from),
    );
    set("EnableCustomUpgrades", args.enable_custom_upgrades.map(Value::from));
    let path = format!("/v1/operator/autopilot/configuration?cas={index}");
    let swapped = api
        .call("PUT", &path, Some(&config))
        .map_err(|Failure(error, code)| Failure(format!("Error setting Autopilot configuration: {error}"), code))?;
    if swapped.as_bool() == Some(true) {
        println!("Configuration updated!");
        Ok(())
    } else {
        Err(Failure(
            "Configuration could not be atomically updated, please try again".into(),
            1,
        ))
    }
}

fn print_health(health: &Value) {
    println!("Healthy: {}", text(&health["Healthy"]));
    println!("FailureTolerance: {}", text(&health["FailureTolerance"]));
    println!("Leader: {}", text(&health["Leader"]));
    println!("Voters:");
    for voter in health["Voters"].as_array().into_iter().flatten() {
        println!("   {}", text(voter));
    }
    println!();
    println!("Servers:");
    let columns = [
        "ID",
        "Name",
        "Address",
        "SerfStatus",
        "Version",
        "Leader",
        "Voter",
        "Healthy",
        "LastContact",
        "LastTerm",
        "LastIndex",
        "StableSince",
    ];
    let mut rows = vec![columns.iter().map(|c| c.to_string()).collect::<Vec<_>>()];
    for server in health["Servers"].as_array().into_iter().flatten() {
        rows.push(columns.iter().map(|c| text(&server[*c])).collect());
    }
    println!("{}", table(&rows));
}
