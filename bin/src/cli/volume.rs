//! `agent volume register|create|delete|status` and `agent plugin status`.

use serde_json::{Value, json};

use super::{Api, Failure, short_id, table, text, typed, volume_snapshot};
use drover_core::humanize::ibytes;
use drover_http::api;

/// A volume spec file (`id`, `name`, `type = "csi"`, `plugin_id`, `external_id`,
/// `capability { access_mode attachment_mode }`, `mount_options`, `secrets`, `parameters`,
/// `context`, and for `create`: `capacity_min`, `capacity_max`, `snapshot_id`, `clone_id`,
/// `topology_request { required { topology { segments {} } } preferred { ... } }`) into the
/// body Nomad's API takes, and its id.
fn volume_spec(file: &str) -> Result<(String, Value), Failure> {
    let source = std::fs::read_to_string(file).map_err(|error| Failure(format!("Error reading {file}: {error}"), 1))?;
    let body = drover_io_real::hcl_check::parse_body(&source)
        .map_err(|error| Failure(format!("Error parsing {file}: {error}"), 1))?;
    let spec: hcl::Value =
        hcl::from_body(body).map_err(|error| Failure(format!("Error parsing {file}: {error}"), 1))?;
    let spec = serde_json::to_value(spec)?;
    let field = |key: &str| spec.get(key).cloned().unwrap_or(Value::Null);
    if field("type") != "csi" {
        return Err(Failure(format!("Error parsing {file}: type must be \"csi\""), 1));
    }
    let capabilities: Vec<Value> = blocks(field("capability"))
        .iter()
        .map(|capability| json!({"AccessMode": capability["access_mode"], "AttachmentMode": capability["attachment_mode"]}))
        .collect();
    let capacity = |key: &str| -> Result<Value, Failure> {
        match field(key) {
            Value::Null => Ok(Value::Null),
            Value::Number(bytes) => Ok(Value::Number(bytes)),
            Value::String(text) => parse_bytes(&text)
                .map(Value::from)
                .map_err(|error| Failure(format!("Error parsing {file}: {key}: {error}"), 1)),
            other => Err(Failure(
                format!("Error parsing {file}: {key} must be a size, not {other}"),
                1,
            )),
        }
    };
    let id = text(&field("id"));
    let volume = json!({
        "ID": id,
        "Name": field("name"),
        "ExternalID": field("external_id"),
        "PluginID": field("plugin_id"),
        "Namespace": field("namespace"),
        "RequestedCapabilities": capabilities,
        "MountOptions": field("mount_options").as_object().map(|options| json!({"FSType": options.get("fs_type"), "MountFlags": options.get("mount_flags")})),
        "Secrets": field("secrets"),
        "Parameters": field("parameters"),
        "Context": field("context"),
        "RequestedCapacityMin": capacity("capacity_min")?,
        "RequestedCapacityMax": capacity("capacity_max")?,
        "SnapshotID": field("snapshot_id"),
        "CloneID": field("clone_id"),
        "RequestedTopologies": topology_request(&field("topology_request")),
    });
    Ok((id, strip_nulls(volume)))
}

/// An HCL block that may appear once or many times, as a list.
fn blocks(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        one => vec![one],
    }
}

/// `topology_request { required { topology { segments {..} } } preferred { .. } }`.
fn topology_request(request: &Value) -> Value {
    if request.is_null() {
        return Value::Null;
    }
    let topologies = |key: &str| -> Vec<Value> {
        blocks(request.get(key).cloned().unwrap_or(Value::Null))
            .iter()
            .flat_map(|group| blocks(group.get("topology").cloned().unwrap_or(Value::Null)))
            .map(|topology| json!({"Segments": topology.get("segments").cloned().unwrap_or(json!({}))}))
            .collect()
    };
    json!({"Required": topologies("required"), "Preferred": topologies("preferred")})
}

/// A size as Nomad's volume specs write it (go-humanize's `ParseBytes`): `10GiB`, `500 MB`,
/// `1G`, `2048`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a size"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "ki" | "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mi" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "ti" | "tib" => 1024f64.powi(4),
        other => return Err(format!("unknown unit {other:?} in {text:?}")),
    };
    let bytes = number * multiplier;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

pub(super) fn volume_register(api: &Api, file: &str) -> Result<(), Failure> {
    let (id, volume) = volume_spec(file)?;
    api.call(
        "PUT",
        &format!("/v1/volume/csi/{id}"),
        Some(&json!({ "Volumes": [volume] })),
    )?;
    println!("Volume {id:?} registered");
    Ok(())
}

/// `volume create`: the plugin makes the volume, the cluster registers it.
pub(super) fn volume_create(api: &Api, file: &str) -> Result<(), Failure> {
    let (id, volume) = volume_spec(file)?;
    let answer = api.call(
        "PUT",
        &format!("/v1/volume/csi/{id}/create"),
        Some(&json!({ "Volumes": [volume] })),
    )?;
    let created: Vec<api::CsiVolume> = typed("the volume create answer", &answer["Volumes"])?;
    for volume in created {
        println!("Created external volume {} with ID {}", volume.external_id, volume.id);
    }
    Ok(())
}

/// `volume delete`: the plugin deletes the volume, the cluster deregisters it.
pub(super) fn volume_delete(api: &Api, id: &str, secrets: &[String]) -> Result<(), Failure> {
    if let Some(bad) = secrets.iter().find(|pair| !pair.contains('=') || pair.contains(',')) {
        return Err(Failure(
            format!("Error: -secret wants KEY=VALUE without commas, got {bad:?}"),
            1,
        ));
    }
    let header = secrets.join(",");
    let headers: Vec<(&str, &str)> = if header.is_empty() {
        Vec::new()
    } else {
        vec![("X-Nomad-CSI-Secrets", header.as_str())]
    };
    api.call_with_headers("DELETE", &format!("/v1/volume/csi/{id}/delete"), None, &headers)?;
    println!("Successfully deleted volume {id:?}!");
    Ok(())
}

pub(super) fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

pub(super) fn volume_status(api: &Api, id: Option<&str>, verbose: bool) -> Result<(), Failure> {
    let Some(id) = id else {
        let volumes: Vec<api::CsiVolumeListStub> = api.get_as("/v1/volumes?type=csi")?;
        let mut rows = vec![
            ["ID", "Name", "Plugin ID", "Schedulable", "Access Mode"]
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>(),
        ];
        for volume in volumes {
            rows.push(vec![
                volume.id,
                volume.name,
                volume.plugin_id,
                volume.schedulable.to_string(),
                volume.access_mode,
            ]);
        }
        println!("{}", table(&rows));
        return if verbose { external_listings(api) } else { Ok(()) };
    };
    let volume: api::CsiVolume = api.get_as(&format!("/v1/volume/csi/{id}"))?;
    let mount_options = match &volume.mount_options {
        Some(options) => format!(
            "fs_type: {} flags: {}",
            options.fs_type,
            serde_json::to_string(&options.mount_flags)?
        ),
        None => "<none>".into(),
    };
    let rows: Vec<(&str, String)> = vec![
        ("ID", volume.id.clone()),
        ("Name", volume.name.clone()),
        ("Namespace", volume.namespace.clone()),
        ("External ID", volume.external_id.clone()),
        ("Plugin ID", volume.plugin_id.clone()),
        ("Provider", volume.provider.clone()),
        ("Version", volume.provider_version.clone()),
        ("Capacity", ibytes(volume.capacity)),
        ("Schedulable", volume.schedulable.to_string()),
        ("Controllers Healthy", volume.controllers_healthy.to_string()),
        ("Controllers Expected", volume.controllers_expected.to_string()),
        ("Nodes Healthy", volume.nodes_healthy.to_string()),
        ("Nodes Expected", volume.nodes_expected.to_string()),
        ("Access Mode", volume.access_mode.clone()),
        ("Attachment Mode", volume.attachment_mode.clone()),
        ("Mount Options", mount_options),
    ];
    for (key, value) in rows {
        println!("{key:<20} = {value}");
    }
    let topologies: Vec<Vec<String>> = volume
        .topologies
        .iter()
        .enumerate()
        .map(|(at, topology)| {
            let segments: Vec<String> = topology
                .segments
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            vec![format!("{:02}", at + 1), segments.join(", ")]
        })
        .collect();
    if !topologies.is_empty() {
        println!("\nTopologies");
        let mut rows = vec![vec!["Topology".to_string(), "Segments".to_string()]];
        rows.extend(topologies);
        println!("{}", table(&rows));
    }
    println!();
    println!("Allocations");
    let mut rows = vec![
        ["ID", "Node ID", "Access Mode", "Desired", "Status"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for alloc in &volume.allocations {
        let mode = if volume.write_allocs.contains_key(&alloc.id) {
            "write"
        } else {
            "read"
        };
        rows.push(vec![
            short_id(&alloc.id),
            short_id(&alloc.node_id),
            mode.into(),
            alloc.desired_status.clone(),
            alloc.client_status.clone(),
        ]);
    }
    if rows.len() == 1 {
        println!("No allocations placed");
    } else {
        println!("{}", table(&rows));
    }
    Ok(())
}

/// Each healthy controller plugin's external volumes (Nomad's `volume status -verbose`): a
/// plugin that cannot list is reported and skipped, and the command then fails.
fn external_listings(api: &Api) -> Result<(), Failure> {
    let plugins: Vec<api::CsiPluginListStub> = api.get_as("/v1/plugins?type=csi")?;
    let mut failed = None;
    for plugin in plugins {
        if !plugin.controller_required || plugin.controllers_healthy < 1 {
            continue;
        }
        let id = plugin.id;
        match volume_snapshot::external_volumes(api, &id) {
            Ok(Some(listing)) => println!("\n{listing}"),
            Ok(None) => {}
            Err(Failure(error, code)) => {
                eprintln!("Error querying CSI external volumes for plugin {id:?}: {error}");
                failed = Some(Failure(String::new(), code));
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

pub(super) fn plugin_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let Some(id) = id else {
        let plugins: Vec<api::CsiPluginListStub> = api.get_as("/v1/plugins?type=csi")?;
        let mut rows = vec![
            [
                "ID",
                "Provider",
                "Controllers Healthy/Expected",
                "Nodes Healthy/Expected",
            ]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
        ];
        for plugin in plugins {
            rows.push(vec![
                plugin.id,
                plugin.provider,
                format!("{}/{}", plugin.controllers_healthy, plugin.controllers_expected),
                format!("{}/{}", plugin.nodes_healthy, plugin.nodes_expected),
            ]);
        }
        println!("{}", table(&rows));
        return Ok(());
    };
    let plugin: api::CsiPlugin = api.get_as(&format!("/v1/plugin/csi/{id}"))?;
    let facts = [
        ("ID", plugin.id.clone()),
        ("Provider", plugin.provider.clone()),
        ("Version", plugin.version.clone()),
        ("Controllers Healthy", plugin.controllers_healthy.to_string()),
        ("Controllers Expected", plugin.controllers_expected.to_string()),
        ("Nodes Healthy", plugin.nodes_healthy.to_string()),
        ("Nodes Expected", plugin.nodes_expected.to_string()),
    ];
    let rows: Vec<Vec<String>> = facts
        .into_iter()
        .map(|(key, value)| vec![key.into(), "=".into(), value])
        .collect();
    println!("{}", table(&rows).replace("  =  ", " = "));
    let volumes: Vec<api::CsiVolumeListStub> = api.get_as(&format!("/v1/volumes?type=csi&plugin_id={id}"))?;
    let mut rows = vec![
        ["ID", "Name", "Schedulable", "Access Mode"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for volume in volumes {
        rows.push(vec![
            volume.id,
            volume.name,
            volume.schedulable.to_string(),
            volume.access_mode,
        ]);
    }
    println!("\nVolumes");
    if rows.len() == 1 {
        println!("No volumes registered");
    } else {
        println!("{}", table(&rows));
    }
    // The plugin's own listing, registered or not, when its controller can list.
    let lists = plugin.controllers.values().any(|info| {
        info.controller_info
            .as_ref()
            .is_some_and(|controller| controller.supports_list_volumes)
    });
    if lists {
        println!("\nExternal Volumes");
        match volume_snapshot::external_volumes(api, id)? {
            Some(listing) => println!("{listing}"),
            None => println!("No external volumes"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_nomads_volume_specs_write_them() {
        assert_eq!(parse_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes("500 MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("1g"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("2048"), Ok(2048));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        assert!(parse_bytes("ten GB").is_err());
        assert!(parse_bytes("5 parsecs").unwrap_err().contains("unknown unit"));
    }
}
