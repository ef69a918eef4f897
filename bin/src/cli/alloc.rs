//! `agent alloc status`: an allocation as Nomad's CLI lays it out, with a section per task
//! (its state, start and finish, restarts) and its recent events, newest first.

use serde_json::Value;

use drover_http::api::{self, AllocListStub, TaskState};
use drover_io_real::jobs::ApiJob;

use super::{Api, Failure, escape, short, table, text, typed};

pub(super) fn resolve_alloc(api: &Api, prefix: &str) -> Result<Value, Failure> {
    let allocs = api.get(&format!("/v1/allocations?prefix={prefix}"))?;
    let matches: Vec<&Value> = allocs.as_array().into_iter().flatten().collect();
    match matches.as_slice() {
        [one] => api.get(&format!("/v1/allocation/{}", text(&one["ID"]))),
        [] => Err(Failure(
            format!("No allocation(s) with prefix or id {prefix:?} found"),
            1,
        )),
        _ => Err(Failure(
            format!("Prefix matched multiple allocations ({})", matches.len()),
            1,
        )),
    }
}

pub(super) fn alloc_status(api: &Api, id: &str, verbose: bool) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let stub: AllocListStub = super::typed("/v1/allocation", &alloc)?;
    let id_of = |id: &str| if verbose { id.to_string() } else { super::short_id(id) };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as i64);
    let when = |nanos: i64| {
        if verbose {
            format_unix_nanos(nanos)
        } else {
            ago(nanos, now)
        }
    };
    println!(
        "{}",
        table(&[
            vec!["ID".into(), "=".into(), stub.id.clone()],
            vec!["Eval ID".into(), "=".into(), id_of(&stub.eval_id)],
            vec!["Name".into(), "=".into(), stub.name.clone()],
            vec!["Node ID".into(), "=".into(), id_of(&stub.node_id)],
            vec!["Node Name".into(), "=".into(), stub.node_name.clone()],
            vec!["Job ID".into(), "=".into(), stub.job_id.clone()],
            vec!["Job Version".into(), "=".into(), text(&alloc["Job"]["Version"])],
            vec!["Client Status".into(), "=".into(), stub.client_status.clone()],
            vec![
                "Client Description".into(),
                "=".into(),
                or_none(stub.client_description.clone())
            ],
            vec!["Desired Status".into(), "=".into(), stub.desired_status.clone()],
            vec![
                "Desired Description".into(),
                "=".into(),
                or_none(stub.desired_description.clone())
            ],
            vec!["Created".into(), "=".into(), when(stub.create_time)],
            vec!["Modified".into(), "=".into(), when(stub.modify_time)],
            vec![
                "Previous Allocation".into(),
                "=".into(),
                text(&alloc["PreviousAllocation"])
            ],
        ])
        .replace("  =  ", " = ")
    );
    let networks = alloc["AllocatedResources"]["Shared"]["Networks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for network in networks {
        let mut rows = vec![vec!["Label".to_string(), "Dynamic".into(), "Address".into()]];
        for (key, dynamic) in [("ReservedPorts", "no"), ("DynamicPorts", "yes")] {
            for port in network[key].as_array().into_iter().flatten() {
                let address = format!("{}:{}", text(&network["IP"]), text(&port["Value"]));
                let mapped = match port["To"].as_i64() {
                    Some(to) if to > 0 && to != port["Value"].as_i64().unwrap_or(0) => format!("{address} -> {to}"),
                    _ => address,
                };
                rows.push(vec![format!("*{}", text(&port["Label"])), dynamic.into(), mapped]);
            }
        }
        println!(
            "\nAllocation Addresses (mode = {:?}):\n{}",
            text(&network["Mode"]),
            table(&rows)
        );
    }
    for (task, state) in stub.task_states.iter().flatten() {
        println!();
        let volumes = task_volumes(api, &alloc, task, verbose);
        print!("{}", task_section(task, state, &volumes));
    }
    Ok(())
}

/// The volumes a task mounts, as Nomad's `outputTaskVolumes`: host volumes by source and
/// read-only, CSI volumes by ID and read-only (verbose: with the volume's plugin, provider,
/// schedulability and mount options, read from the volume).
fn task_volumes(api: &Api, alloc: &Value, task: &str, verbose: bool) -> String {
    let Ok(job) = typed::<ApiJob>("the allocation's job", &alloc["Job"]) else {
        return String::new();
    };
    let group_name = text(&alloc["TaskGroup"]);
    let Some(group) = job.task_groups.iter().find(|group| group.name == group_name) else {
        return String::new();
    };
    let Some(spec) = group.tasks.iter().find(|spec| spec.name == task) else {
        return String::new();
    };
    let mut host = vec![vec!["ID".to_string(), "Read Only".into()]];
    let mut csi = if verbose {
        vec![
            ["ID", "Plugin", "Provider", "Schedulable", "Read Only", "Mount Options"]
                .iter()
                .map(|header| header.to_string())
                .collect::<Vec<_>>(),
        ]
    } else {
        vec![vec!["ID".to_string(), "Read Only".into()]]
    };
    for mount in &spec.volume_mounts {
        let Some(request) = group.volumes.get(&mount.volume) else {
            continue;
        };
        let source = request.source.clone();
        let read_only = (mount.read_only || request.read_only).to_string();
        match request.volume_type.as_str() {
            "host" => host.push(vec![source, read_only]),
            "csi" if verbose => {
                let volume: Option<api::CsiVolume> = api
                    .get_as(&format!(
                        "/v1/volume/csi/{}?namespace={}",
                        escape(&source),
                        escape(&text(&alloc["Namespace"]))
                    ))
                    .ok();
                let mount_options = match &request.mount_options {
                    None => "<none>".to_string(),
                    Some(options) => format!(
                        "fs_type: {}; flags: {}",
                        options.fs_type,
                        options.mount_flags.join(", ")
                    ),
                };
                let (plugin, provider, schedulable) = volume.map_or_else(Default::default, |volume| {
                    (volume.plugin_id, volume.provider, volume.schedulable.to_string())
                });
                csi.push(vec![source, plugin, provider, schedulable, read_only, mount_options]);
            }
            "csi" => csi.push(vec![source, read_only]),
            _ => {}
        }
    }
    let mut out = String::new();
    if host.len() > 1 {
        out.push_str(&format!("Host Volumes:\n{}\n\n", table(&host)));
    }
    if csi.len() > 1 {
        out.push_str(&format!("CSI Volumes:\n{}\n\n", table(&csi)));
    }
    out
}

/// `alloc stop`: the evaluation that replaces the allocation, followed as `job run` does.
pub(super) fn alloc_stop(api: &Api, id: &str, detach: bool) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let reply = api.call("PUT", &format!("/v1/allocation/{}/stop", text(&alloc["ID"])), None)?;
    let eval_id = text(&reply["EvalID"]);
    if detach {
        println!("{eval_id}");
        return Ok(());
    }
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    super::job::monitor(api, &eval_id, reply["Index"].as_u64().unwrap_or(0))
}

/// `alloc restart`: the task (or every running task) restarts on its client.
pub(super) fn alloc_restart(api: &Api, id: &str, task: Option<&str>) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let body = serde_json::json!({ "TaskName": task.unwrap_or_default() });
    api.call(
        "PUT",
        &format!("/v1/client/allocation/{}/restart", text(&alloc["ID"])),
        Some(&body),
    )?;
    Ok(())
}

/// `alloc signal`: the signal reaches the task (or every running task) on its client.
pub(super) fn alloc_signal(api: &Api, id: &str, task: Option<&str>, signal: Option<&str>) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let body = serde_json::json!({ "Task": task.unwrap_or_default(), "Signal": signal.unwrap_or("SIGKILL") });
    api.call(
        "PUT",
        &format!("/v1/client/allocation/{}/signal", text(&alloc["ID"])),
        Some(&body),
    )?;
    Ok(())
}

fn or_none(text: String) -> String {
    if text.is_empty() { "<none>".into() } else { text }
}

/// One task's section: `Task "t" is "running"`, its times and restarts, and its recent events
/// newest first (Nomad's `outputTaskStatus`).
fn task_section(task: &str, state: &TaskState, volumes: &str) -> String {
    let mut out = format!("Task {task:?} is {:?}\n", state.state);
    out.push_str(volumes);
    let go_time = |stamp: &str| match stamp {
        stamp if !stamp.is_empty() && !stamp.starts_with("0001-") => {
            stamp
                .split('.')
                .next()
                .unwrap_or(stamp)
                .trim_end_matches('Z')
                .to_string()
                + "Z"
        }
        _ => "N/A".to_string(),
    };
    out.push_str("Task Events:\n");
    out.push_str(
        &table(&[
            vec!["Started At".into(), "=".into(), go_time(&state.started_at)],
            vec!["Finished At".into(), "=".into(), go_time(&state.finished_at)],
            vec!["Total Restarts".into(), "=".into(), state.restarts.to_string()],
            vec!["Last Restart".into(), "=".into(), go_time(&state.last_restart)],
        ])
        .replace("  =  ", " = "),
    );
    out.push_str("\n\nRecent Events:\n");
    let mut rows = vec![vec!["Time".to_string(), "Type".into(), "Description".into()]];
    for event in state.events.iter().rev() {
        rows.push(vec![
            format_unix_nanos(event.time),
            event.kind.clone(),
            event.display_message.clone(),
        ]);
    }
    out.push_str(&table(&rows));
    out.push('\n');
    out
}

/// A Unix time in nanoseconds as Nomad's CLI prints it (ISO 8601, seconds, UTC).
pub(super) fn format_unix_nanos(nanos: i64) -> String {
    if nanos < 1_000_000_000 {
        return String::new();
    }
    let stamp = drover_http::rfc3339((nanos / 1_000_000) as u64);
    format!("{}Z", stamp.split('.').next().unwrap_or(&stamp))
}

/// How long ago `nanos` was, as Nomad's `prettyTimeDiff` says it: the two largest units.
fn ago(nanos: i64, now: i64) -> String {
    if nanos < 1_000_000_000 {
        return String::new();
    }
    let mut secs = (now - nanos).max(0) / 1_000_000_000;
    if secs == 0 {
        return "just now".into();
    }
    let mut parts = Vec::new();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size {
            parts.push(format!("{}{unit}", secs / size));
            secs %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    format!("{} ago", parts.join(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_task_section_lists_its_times_and_events_newest_first() {
        // Read as the CLI reads an answer: the fields it has, defaults for the rest.
        let state: TaskState = drover_http::api::read(&json!({
            "State": "dead",
            "Failed": true,
            "Restarts": 1,
            "StartedAt": "2026-11-24T10:00:01.250Z",
            "FinishedAt": "2026-11-24T10:00:09.000Z",
            "LastRestart": "0001-01-01T00:00:00Z",
            "Events": [
                {"Type": "Received", "Time": 1_795_514_400_000_000_000i64, "DisplayMessage": "Task received by client"},
                {"Type": "Terminated", "Time": 1_795_514_409_000_000_000i64, "DisplayMessage": "Exit Code: 3"},
            ],
        }))
        .unwrap();
        let section = task_section("t", &state, "");
        assert_eq!(
            section,
            "Task \"t\" is \"dead\"\n\
             Task Events:\n\
             Started At     = 2026-11-24T10:00:01Z\n\
             Finished At    = 2026-11-24T10:00:09Z\n\
             Total Restarts = 1\n\
             Last Restart   = N/A\n\
             \n\
             Recent Events:\n\
             Time                  Type        Description\n\
             2026-11-24T10:00:09Z  Terminated  Exit Code: 3\n\
             2026-11-24T10:00:00Z  Received    Task received by client\n"
        );
    }

    #[test]
    fn ages_read_as_nomad_says_them() {
        let now = 1_795_514_400_000_000_000i64;
        let secs = |n: i64| now - n * 1_000_000_000;
        assert_eq!(ago(secs(0), now), "just now");
        assert_eq!(ago(secs(42), now), "42s ago");
        assert_eq!(ago(secs(5 * 60 + 3), now), "5m3s ago");
        assert_eq!(ago(secs(26 * 3600 + 120), now), "1d2h ago");
        assert_eq!(ago(0, now), "");
    }
}
