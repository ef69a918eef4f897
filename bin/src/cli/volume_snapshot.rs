//! `volume snapshot create|delete|list` (Nomad 1.1+), and the external-volume listings of
//! `volume status -verbose` and `plugin status`: the plugin's own records, asked through the
//! cluster (`/v1/volumes/snapshot`, `/v1/volumes/external`).

use clap::Subcommand;
use serde_json::{Value, json};

use drover_http::api;

use super::{Api, Failure, table, text, typed};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a registered volume in its plugin: `<volume id> [snapshot name]`.
    Create {
        volume_id: String,
        name: Option<String>,
        /// `key=value` parameters for the plugin's CreateSnapshot (repeat for more).
        #[arg(long = "parameter", value_name = "KEY=VALUE")]
        parameters: Vec<String>,
        /// `key=value` secrets for the plugin (repeat for more).
        #[arg(long = "secret", value_name = "KEY=VALUE")]
        secrets: Vec<String>,
        /// Full volume ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Delete a snapshot in its plugin: `<plugin id> <snapshot id>`.
    Delete {
        plugin_id: String,
        snapshot_id: String,
        #[arg(long = "secret", value_name = "KEY=VALUE")]
        secrets: Vec<String>,
    },
    /// The snapshots a plugin lists (`-plugin` is an ID or prefix of one plugin).
    List {
        #[arg(long)]
        plugin: Option<String>,
        #[arg(long = "per-page")]
        per_page: Option<u32>,
        #[arg(long = "page-token")]
        page_token: Option<String>,
        #[arg(long = "secret", value_name = "KEY=VALUE")]
        secrets: Vec<String>,
        #[arg(long)]
        verbose: bool,
    },
}

/// `KEY=VALUE` flags as a map, with the flag's name in the error.
fn pairs(flag: &str, values: &[String]) -> Result<serde_json::Map<String, Value>, Failure> {
    values
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() && !pair.contains(',') => {
                Ok((key.to_string(), Value::String(value.to_string())))
            }
            _ => Err(Failure(
                format!("Error: -{flag} wants KEY=VALUE without commas, got {pair:?}"),
                1,
            )),
        })
        .collect()
}

/// The `X-Nomad-CSI-Secrets` header for `-secret` flags.
fn secrets_header(secrets: &[String]) -> Result<Vec<(&'static str, String)>, Failure> {
    let map = pairs("secret", secrets)?;
    if map.is_empty() {
        return Ok(Vec::new());
    }
    let joined: Vec<String> = map
        .iter()
        .map(|(key, value)| format!("{key}={}", text(value)))
        .collect();
    Ok(vec![("X-Nomad-CSI-Secrets", joined.join(","))])
}

fn limit(value: &str, length: usize) -> String {
    value.chars().take(length).collect()
}

/// Nomad's snapshot table: `Snapshot ID  Volume ID  Size  Create Time  Ready?`.
fn snapshot_table(snapshots: &[api::CsiSnapshot], verbose: bool) -> String {
    let length = if verbose { 30 } else { 12 };
    let mut rows = vec![
        ["Snapshot ID", "Volume ID", "Size", "Create Time", "Ready?"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for snapshot in snapshots {
        let seconds = u64::try_from(snapshot.create_time).unwrap_or(0);
        rows.push(vec![
            snapshot.id.clone(),
            limit(&snapshot.external_source_volume_id, length),
            drover_core::humanize::ibytes(snapshot.size_bytes),
            drover_http::rfc3339(seconds.saturating_mul(1000)).replace(".000Z", "Z"),
            snapshot.is_ready.to_string(),
        ]);
    }
    table(&rows)
}

pub(super) fn run(api: &Api, command: SnapshotCommand) -> Result<(), Failure> {
    match command {
        SnapshotCommand::Create {
            volume_id,
            name,
            parameters,
            secrets,
            verbose,
        } => {
            // CSI's CreateSnapshot requires a name (plugins refuse none): one is made from the
            // volume and the time when the operator gives none.
            let name = name.unwrap_or_else(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs());
                format!("{volume_id}-snapshot-{now}")
            });
            let body = json!({ "Snapshots": [{
                "SourceVolumeID": volume_id,
                "Name": name,
                "Parameters": pairs("parameter", &parameters)?,
                "Secrets": pairs("secret", &secrets)?,
            }]});
            let path = "/v1/volumes/snapshot";
            let made: api::CsiSnapshotListResponse = typed(path, &api.call("PUT", path, Some(&body))?)?;
            println!("{}", snapshot_table(&made.snapshots, verbose));
            Ok(())
        }
        SnapshotCommand::Delete {
            plugin_id,
            snapshot_id,
            secrets,
        } => {
            let headers = secrets_header(&secrets)?;
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let path = format!("/v1/volumes/snapshot?plugin_id={plugin_id}&snapshot_id={snapshot_id}");
            api.call_with_headers("DELETE", &path, None, &headers)?;
            println!("Deleted snapshot {snapshot_id}.");
            Ok(())
        }
        SnapshotCommand::List {
            plugin,
            per_page,
            page_token,
            secrets,
            verbose,
        } => {
            let plugin_id = one_plugin(api, plugin.as_deref().unwrap_or(""))?;
            let headers = secrets_header(&secrets)?;
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut path = format!("/v1/volumes/snapshot?plugin_id={plugin_id}");
            if let Some(per_page) = per_page {
                path.push_str(&format!("&per_page={per_page}"));
            }
            if let Some(token) = page_token {
                path.push_str(&format!("&next_token={token}"));
            }
            let page: api::CsiSnapshotListResponse =
                typed(&path, &api.call_with_headers("GET", &path, None, &headers)?)?;
            if page.snapshots.is_empty() {
                println!("No snapshots found");
            } else {
                println!("{}", snapshot_table(&page.snapshots, verbose));
            }
            let next = page.next_token;
            if !next.is_empty() {
                println!(
                    "\nResults have been paginated. To get the next page run:\n\nagent volume snapshot list --plugin {plugin_id} --page-token {next}"
                );
            }
            Ok(())
        }
    }
}

/// The one plugin whose ID is or starts with `prefix` (Nomad's "Prefix matched multiple").
fn one_plugin(api: &Api, prefix: &str) -> Result<String, Failure> {
    let plugins: Vec<api::CsiPluginListStub> = api.get_as(&format!("/v1/plugins?type=csi&prefix={prefix}"))?;
    let ids: Vec<String> = plugins.into_iter().map(|plugin| plugin.id).collect();
    match ids.as_slice() {
        [] => Err(Failure(format!("No plugins(s) with prefix or ID {prefix:?} found"), 1)),
        [one] => Ok(one.clone()),
        many if many.iter().any(|id| id == prefix) => Ok(prefix.to_string()),
        many => Err(Failure(
            format!("Prefix matched multiple plugins\n\n{}", many.join("\n")),
            1,
        )),
    }
}

/// Every page of a plugin's external volumes as Nomad's table (`External ID  Condition
/// Nodes`), or `None` when the plugin lists none; an error when the plugin cannot list.
pub(super) fn external_volumes(api: &Api, plugin_id: &str) -> Result<Option<String>, Failure> {
    let mut rows = vec![
        ["External ID", "Condition", "Nodes"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    let mut token = String::new();
    loop {
        let mut path = format!("/v1/volumes/external?plugin_id={plugin_id}&per_page=30");
        if !token.is_empty() {
            path.push_str(&format!("&next_token={token}"));
        }
        let page: api::CsiVolumeListExternalResponse = api.get_as(&path)?;
        for volume in page.volumes {
            let condition = if volume.is_abnormal {
                format!("Abnormal ({})", volume.status)
            } else {
                "OK".to_string()
            };
            rows.push(vec![
                volume.external_id,
                limit(&condition, 20),
                volume.published_external_node_ids.join(","),
            ]);
        }
        token = page.next_token;
        if token.is_empty() {
            break;
        }
    }
    Ok((rows.len() > 1).then(|| table(&rows)))
}
