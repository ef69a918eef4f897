//! `agent node status|drain|eligibility`.

use std::time::Duration;

use serde_json::json;

use drover_http::api::NodeListStub;

use super::{Api, Failure, short, short_id, table, text};

pub(super) fn node_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let nodes: Vec<NodeListStub> = api.get_as("/v1/nodes")?;
    let mut rows = vec![
        ["ID", "DC", "Name", "Drivers", "Drain", "Eligibility", "Status"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for node in nodes {
        if id.is_some_and(|id| !node.id.starts_with(id)) {
            continue;
        }
        let drivers: Vec<&str> = node
            .drivers
            .iter()
            .filter(|(_, info)| info.healthy)
            .map(|(name, _)| name.as_str())
            .collect();
        rows.push(vec![
            short_id(&node.id),
            node.datacenter,
            node.name,
            drivers.join(","),
            node.drain.to_string(),
            node.scheduling_eligibility,
            node.status,
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

/// The one node whose ID is `prefix` or starts with it.
pub(super) fn resolve_node(api: &Api, prefix: &str) -> Result<String, Failure> {
    let nodes: Vec<NodeListStub> = api.get_as(&format!("/v1/nodes?prefix={prefix}"))?;
    let ids: Vec<String> = nodes.into_iter().map(|node| node.id).collect();
    match ids.as_slice() {
        [] => Err(Failure(format!("No node(s) with prefix or id {prefix:?} found"), 1)),
        [one] => Ok(one.clone()),
        _ if ids.iter().any(|id| id == prefix) => Ok(prefix.to_string()),
        many => Err(Failure(
            format!("Prefix matched multiple nodes\n\n{}", many.join("\n")),
            1,
        )),
    }
}

pub(super) struct DrainOptions {
    pub(super) enable: bool,
    pub(super) disable: bool,
    pub(super) deadline: Option<String>,
    pub(super) no_deadline: bool,
    pub(super) force: bool,
    pub(super) ignore_system: bool,
    pub(super) keep_ineligible: bool,
    pub(super) detach: bool,
}

pub(super) fn now_stamp() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    drover_http::rfc3339(millis)
}

pub(super) fn node_drain(api: &Api, prefix: &str, options: DrainOptions) -> Result<(), Failure> {
    if options.enable == options.disable {
        return Err(Failure("Either the '-enable' or '-disable' flag must be set".into(), 1));
    }
    let deadline_flags = [options.deadline.is_some(), options.no_deadline, options.force];
    if deadline_flags.iter().filter(|set| **set).count() > 1 {
        return Err(Failure(
            "Only one of -deadline, -no-deadline and -force may be given".into(),
            1,
        ));
    }
    let deadline = if options.force {
        -1
    } else if options.no_deadline {
        0
    } else {
        let text = options.deadline.as_deref().unwrap_or("1h");
        match drover_io_real::jobspec::parse_duration(text) {
            Some(nanos) if nanos > 0 => nanos,
            _ => {
                return Err(Failure(
                    format!("Failed to parse deadline {text:?}: not a positive duration such as \"1h\""),
                    1,
                ));
            }
        }
    };
    let id = resolve_node(api, prefix)?;
    if options.disable {
        let body = json!({ "NodeID": id, "DrainSpec": null, "MarkEligible": !options.keep_ineligible });
        api.call("PUT", &format!("/v1/node/{id}/drain"), Some(&body))
            .map_err(|Failure(message, code)| {
                Failure(format!("Error updating drain specification: {message}"), code)
            })?;
        println!("Node {id:?} drain strategy unset");
        return Ok(());
    }
    let body = json!({
        "NodeID": id,
        "DrainSpec": { "Deadline": deadline, "IgnoreSystemJobs": options.ignore_system },
        "MarkEligible": false,
    });
    let reply = api
        .call("PUT", &format!("/v1/node/{id}/drain"), Some(&body))
        .map_err(|Failure(message, code)| Failure(format!("Error updating drain specification: {message}"), code))?;
    println!("Node {id:?} drain strategy set");
    if options.detach {
        return Ok(());
    }
    monitor_drain(api, &id, reply["NodeModifyIndex"].as_u64().unwrap_or(0))
}

/// Follows a drain (Nomad's `MonitorDrain`): allocations marked, stopping, finished, until the
/// drain is complete (exit 0) or canceled (exit 1).
pub(super) fn monitor_drain(api: &Api, id: &str, set_at: u64) -> Result<(), Failure> {
    println!(
        "{}: Ctrl-C to stop monitoring: will not cancel the node drain",
        now_stamp()
    );
    let mut seen: std::collections::BTreeMap<String, (bool, String, String)> = std::collections::BTreeMap::new();
    let mut node_index = set_at.saturating_sub(1);
    let mut all_marked = false;
    loop {
        let node = api.get(&format!("/v1/node/{id}?index={node_index}&wait=2s"))?;
        node_index = node["ModifyIndex"].as_u64().unwrap_or(node_index);
        let allocs = api.get("/v1/allocations")?;
        let mut remaining = 0;
        let mut unmarked = 0;
        for alloc in allocs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|alloc| alloc["NodeID"] == id)
        {
            let alloc_id = short(&alloc["ID"]);
            let migrate = alloc["DesiredTransition"]["Migrate"] == true;
            let desired = text(&alloc["DesiredStatus"]);
            let status = text(&alloc["ClientStatus"]);
            let terminal = matches!(status.as_str(), "complete" | "failed" | "lost");
            if !terminal {
                remaining += 1;
                if !migrate {
                    unmarked += 1;
                }
            }
            let before = seen.get(&alloc_id).cloned();
            if let Some((was_marked, was_desired, was_status)) = &before {
                if migrate && !was_marked {
                    println!("{}: Alloc {alloc_id:?} marked for migration", now_stamp());
                }
                if desired == "stop" && was_desired != "stop" && migrate {
                    println!("{}: Alloc {alloc_id:?} draining", now_stamp());
                }
                if status != *was_status {
                    println!("{}: Alloc {alloc_id:?} status {was_status} -> {status}", now_stamp());
                }
            }
            seen.insert(alloc_id, (migrate, desired, status));
        }
        if node["DrainStrategy"].is_null() {
            let status = text(&node["LastDrain"]["Status"]);
            if status == "complete" {
                println!("{}: All allocations on node {id:?} have stopped", now_stamp());
                println!("{}: Drain complete for node {id:?}", now_stamp());
                return Ok(());
            }
            return Err(Failure(
                format!("{}: No drain strategy set for node {id:?}", now_stamp()),
                1,
            ));
        }
        if !all_marked && remaining > 0 && unmarked == 0 {
            all_marked = true;
            println!("{}: Node {id:?} has marked all allocations for migration", now_stamp());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

pub(super) fn node_eligibility(api: &Api, prefix: &str, enable: bool, disable: bool) -> Result<(), Failure> {
    if enable == disable {
        return Err(Failure("Either the '-enable' or '-disable' flag must be set".into(), 1));
    }
    let id = resolve_node(api, prefix)?;
    let eligibility = if enable { "eligible" } else { "ineligible" };
    api.call(
        "PUT",
        &format!("/v1/node/{id}/eligibility"),
        Some(&json!({ "NodeID": id, "Eligibility": eligibility })),
    )
    .map_err(|Failure(message, code)| Failure(format!("Error updating scheduling eligibility: {message}"), code))?;
    println!("Node {id:?} scheduling eligibility set: {eligibility} for scheduling");
    Ok(())
}
