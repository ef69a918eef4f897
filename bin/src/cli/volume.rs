//! `agent volume register|status` and `agent plugin status`.

use serde_json::{Value, json};

use super::{Api, Failure, short, table, text};

/// A volume spec file (`id`, `name`, `type = "csi"`, `plugin_id`, `external_id`,
/// `capability { access_mode attachment_mode }`, `mount_options`, `secrets`, `parameters`,
/// `context`) into the register body.
pub(super) fn volume_register(api: &Api, file: &str) -> Result<(), Failure> {
    let source = std::fs::read_to_string(file).map_err(|error| Failure(format!("Error reading {file}: {error}"), 1))?;
    drover_io_real::hcl_check::strings_terminated(&source)
        .map_err(|error| Failure(format!("Error parsing {file}: {error}"), 1))?;
    let spec: hcl::Value =
        hcl::from_str(&source).map_err(|error| Failure(format!("Error parsing {file}: {error}"), 1))?;
    let spec = serde_json::to_value(spec)?;
    let field = |key: &str| spec.get(key).cloned().unwrap_or(Value::Null);
    if field("type") != "csi" {
        return Err(Failure(format!("Error parsing {file}: type must be \"csi\""), 1));
    }
    let capabilities: Vec<Value> = match field("capability") {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        one => vec![one],
    }
    .iter()
    .map(|capability| json!({"AccessMode": capability["access_mode"], "AttachmentMode": capability["attachment_mode"]}))
    .collect();
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
    });
    let volume = strip_nulls(volume);
    api.call(
        "PUT",
        &format!("/v1/volume/csi/{id}"),
        Some(&json!({ "Volumes": [volume] })),
    )?;
    println!("Volume {id:?} registered");
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

pub(super) fn volume_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let Some(id) = id else {
        let volumes = api.get("/v1/volumes?type=csi")?;
        let mut rows = vec![
            ["ID", "Name", "Plugin ID", "Schedulable", "Access Mode"]
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>(),
        ];
        for volume in volumes.as_array().into_iter().flatten() {
            rows.push(vec![
                text(&volume["ID"]),
                text(&volume["Name"]),
                text(&volume["PluginID"]),
                text(&volume["Schedulable"]),
                text(&volume["AccessMode"]),
            ]);
        }
        println!("{}", table(&rows));
        return Ok(());
    };
    let volume = api.get(&format!("/v1/volume/csi/{id}"))?;
    println!(
        "{}",
        table(&[
            vec!["ID".into(), "=".into(), text(&volume["ID"])],
            vec!["Name".into(), "=".into(), text(&volume["Name"])],
            vec!["External ID".into(), "=".into(), text(&volume["ExternalID"])],
            vec!["Plugin ID".into(), "=".into(), text(&volume["PluginID"])],
            vec!["Provider".into(), "=".into(), text(&volume["Provider"])],
            vec!["Schedulable".into(), "=".into(), text(&volume["Schedulable"])],
            vec![
                "Controllers Healthy".into(),
                "=".into(),
                text(&volume["ControllersHealthy"])
            ],
            vec!["Nodes Healthy".into(), "=".into(), text(&volume["NodesHealthy"])],
            vec!["Access Mode".into(), "=".into(), text(&volume["AccessMode"])],
            vec!["Attachment Mode".into(), "=".into(), text(&volume["AttachmentMode"])],
        ])
        .replace("  =  ", " = ")
    );
    println!();
    println!("Allocations");
    let mut rows = vec![
        ["ID", "Node ID", "Access Mode", "Desired", "Status"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for alloc in volume["Allocations"].as_array().into_iter().flatten() {
        let mode = if volume["WriteAllocs"].get(text(&alloc["ID"])).is_some() {
            "write"
        } else {
            "read"
        };
        rows.push(vec![
            short(&alloc["ID"]),
            short(&alloc["NodeID"]),
            mode.into(),
            text(&alloc["DesiredStatus"]),
            text(&alloc["ClientStatus"]),
        ]);
    }
    if rows.len() == 1 {
        println!("No allocations placed");
    } else {
        println!("{}", table(&rows));
    }
    Ok(())
}

pub(super) fn plugin_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let Some(id) = id else {
        let plugins = api.get("/v1/plugins?type=csi")?;
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
        for plugin in plugins.as_array().into_iter().flatten() {
            rows.push(vec![
                text(&plugin["ID"]),
                text(&plugin["Provider"]),
                format!(
                    "{}/{}",
                    text(&plugin["ControllersHealthy"]),
                    text(&plugin["ControllersExpected"])
                ),
                format!("{}/{}", text(&plugin["NodesHealthy"]), text(&plugin["NodesExpected"])),
            ]);
        }
        println!("{}", table(&rows));
        return Ok(());
    };
    let plugin = api.get(&format!("/v1/plugin/csi/{id}"))?;
    println!(
        "{}",
        table(&[
            vec!["ID".into(), "=".into(), text(&plugin["ID"])],
            vec!["Provider".into(), "=".into(), text(&plugin["Provider"])],
            vec!["Version".into(), "=".into(), text(&plugin["Version"])],
            vec![
                "Controllers Healthy".into(),
                "=".into(),
                text(&plugin["ControllersHealthy"])
            ],
            vec![
                "Controllers Expected".into(),
                "=".into(),
                text(&plugin["ControllersExpected"])
            ],
            vec!["Nodes Healthy".into(), "=".into(), text(&plugin["NodesHealthy"])],
            vec!["Nodes Expected".into(), "=".into(), text(&plugin["NodesExpected"])],
        ])
        .replace("  =  ", " = ")
    );
    Ok(())
}
