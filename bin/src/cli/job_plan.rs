//! `job plan <file>`: the scheduler's dry run with Nomad's diff (`+`, `-`, `+/-` per job,
//! group, task, block and field), what would not be placed, and the `-check-index` to run
//! the job with. Exit codes are Nomad's: 0 when nothing would be created or destroyed, 1 when
//! something would, 255 on error.

use serde_json::{Value, json};

use std::collections::BTreeMap;

use drover_http::api;

use super::{Api, Failure, text, typed};

fn marker(kind: &str) -> &'static str {
    match kind {
        "Added" => "+ ",
        "Deleted" => "- ",
        "Edited" => "+/- ",
        _ => "",
    }
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn field_line(field: &Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let name = text(&field["Name"]);
    let (old, new) = (text(&field["Old"]), text(&field["New"]));
    let value = match text(&field["Type"]).as_str() {
        "Added" => format!("{new:?}"),
        "Deleted" => format!("{old:?}"),
        "Edited" => format!("{old:?} => {new:?}"),
        _ => format!("{new:?}"),
    };
    let notes: Vec<String> = list(&field["Annotations"]).iter().map(text).collect();
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!("{pad}{}{name}: {value}{notes}", marker(&text(&field["Type"])))
}

fn object_lines(object: &Value, indent: usize, out: &mut Vec<String>) {
    let pad = " ".repeat(indent);
    out.push(format!(
        "{pad}{}{} {{",
        marker(&text(&object["Type"])),
        text(&object["Name"])
    ));
    for field in list(&object["Fields"]) {
        out.push(field_line(field, indent + 2));
    }
    for inner in list(&object["Objects"]) {
        object_lines(inner, indent + 2, out);
    }
    out.push(format!("{pad}}}"));
}

fn members(value: &Value, indent: usize, out: &mut Vec<String>) {
    for field in list(&value["Fields"]) {
        out.push(field_line(field, indent));
    }
    for object in list(&value["Objects"]) {
        object_lines(object, indent, out);
    }
}

/// Nomad's plan diff, as lines.
pub fn diff_lines(diff: &Value) -> Vec<String> {
    let mut out = vec![format!("{}Job: {:?}", marker(&text(&diff["Type"])), text(&diff["ID"]))];
    members(diff, 0, &mut out);
    for group in list(&diff["TaskGroups"]) {
        let mut updates: Vec<String> = group["Updates"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(what, count)| format!("{} {what}", text(count)))
            .collect();
        updates.sort();
        let updates = if updates.is_empty() {
            String::new()
        } else {
            format!(" ({})", updates.join(", "))
        };
        out.push(format!(
            "{}Task Group: {:?}{updates}",
            marker(&text(&group["Type"])),
            text(&group["Name"])
        ));
        members(group, 2, &mut out);
        for task in list(&group["Tasks"]) {
            let notes: Vec<String> = list(&task["Annotations"]).iter().map(text).collect();
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join(", "))
            };
            out.push(format!(
                "  {}Task: {:?}{notes}",
                marker(&text(&task["Type"])),
                text(&task["Name"])
            ));
            members(task, 4, &mut out);
        }
    }
    out
}

/// The dry run's verdict: placed in full, or what could not be placed and why.
fn dry_run_lines(failed: Option<&BTreeMap<String, api::AllocMetric>>) -> Vec<String> {
    let Some(groups) = failed.filter(|groups| !groups.is_empty()) else {
        return vec!["- All tasks successfully allocated.".into()];
    };
    let mut out = vec!["- WARNING: Failed to place all allocations.".to_string()];
    for (group, metric) in groups {
        let failures = u64::from(metric.coalesced_failures) + 1;
        let noun = if failures == 1 { "allocation" } else { "allocations" };
        out.push(format!("  Task Group {group:?} (failed to place {failures} {noun}):"));
        for (reason, count) in &metric.constraint_filtered {
            out.push(format!("    * Constraint {reason:?}: {count} nodes excluded by filter"));
        }
        if metric.nodes_exhausted > 0 {
            out.push(format!("    * Resources exhausted on {} nodes", metric.nodes_exhausted));
        }
        for (dimension, count) in &metric.dimension_exhausted {
            out.push(format!("    * Dimension {dimension:?} exhausted on {count} nodes"));
        }
        if metric.nodes_evaluated == 0 {
            out.push("    * No nodes were eligible for evaluation".into());
        }
    }
    out
}

/// Whether the plan creates or destroys allocations (Nomad's exit code 1).
fn changes(plan: &api::JobPlanResponse) -> bool {
    plan.annotations.desired_tg_updates.values().any(|updates| {
        [
            updates.place,
            updates.stop,
            updates.migrate,
            updates.destructive_update,
            updates.canary,
        ]
        .iter()
        .any(|count| *count > 0)
    })
}

pub(super) fn job_plan(api: &Api, file: &str, diff: bool) -> Result<(), Failure> {
    let job = super::job::read_job_file(file).map_err(|Failure(message, _)| Failure(message, 255))?;
    let id = text(&job["ID"]);
    let path = format!("/v1/job/{id}/plan");
    let plan: api::JobPlanResponse = api
        .call("PUT", &path, Some(&json!({"Job": job, "Diff": diff})))
        .and_then(|answer| typed(&path, &answer))
        .map_err(|Failure(message, _)| Failure(format!("Error during plan: {message}"), 255))?;
    if diff {
        println!("{}", diff_lines(&plan.diff).join("\n"));
        println!();
    }
    println!("Scheduler dry-run:");
    println!("{}", dry_run_lines(plan.failed_tg_allocs.as_ref()).join("\n"));
    println!();
    let index = plan.job_modify_index;
    println!("Job Modify Index: {index}");
    println!("To submit the job with version verification run:");
    println!();
    println!("agent job run -check-index {index} {file}");
    println!();
    println!("When running the job with the check-index flag, the job will only be run if the");
    println!("job modify index given matches the server-side version. If the index has");
    println!("changed, another user has modified the job and the plan's results are");
    println!("potentially invalid.");
    if changes(&plan) {
        return Err(Failure(String::new(), 1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nomad's documented example (`nomad job plan` after changing the redis image).
    #[test]
    fn the_diff_reads_as_nomads_documented_example() {
        let diff = json!({
            "Type": "Edited", "ID": "example", "Fields": null, "Objects": null,
            "TaskGroups": [{
                "Type": "Edited", "Name": "cache", "Fields": null, "Objects": null,
                "Updates": {"create/destroy update": 1},
                "Tasks": [{
                    "Type": "Edited", "Name": "redis", "Fields": null,
                    "Annotations": ["forces create/destroy update"],
                    "Objects": [{
                        "Type": "Edited", "Name": "Config", "Objects": null,
                        "Fields": [{"Type": "Edited", "Name": "image", "Old": "redis:3.2", "New": "redis:4.0", "Annotations": null}],
                    }],
                }],
            }],
        });
        assert_eq!(
            diff_lines(&diff),
            vec![
                "+/- Job: \"example\"",
                "+/- Task Group: \"cache\" (1 create/destroy update)",
                "  +/- Task: \"redis\" (forces create/destroy update)",
                "    +/- Config {",
                "      +/- image: \"redis:3.2\" => \"redis:4.0\"",
                "    }",
            ]
        );
    }

    #[test]
    fn a_failed_placement_is_a_warning_with_its_reasons() {
        let failed: BTreeMap<String, api::AllocMetric> = serde_json::from_value(json!({"cache": {
            "CoalescedFailures": 1, "NodesEvaluated": 2, "NodesExhausted": 2,
            "ConstraintFiltered": {}, "DimensionExhausted": {"memory": 2}}}))
        .unwrap();
        assert_eq!(
            dry_run_lines(Some(&failed)),
            vec![
                "- WARNING: Failed to place all allocations.",
                "  Task Group \"cache\" (failed to place 2 allocations):",
                "    * Resources exhausted on 2 nodes",
                "    * Dimension \"memory\" exhausted on 2 nodes",
            ]
        );
        assert_eq!(dry_run_lines(None), vec!["- All tasks successfully allocated."]);
    }
}
