//! Nomad's job diff (`JobDiff`, `TaskGroupDiff`, `TaskDiff`, `ObjectDiff`, `FieldDiff`), as
//! `job plan` shows it, computed over the API form of the stored job and the planned one:
//! primitive values are fields, nested blocks and maps are objects (a block repeated — a
//! constraint, a service — is one object per entry, added or deleted whole), lists of
//! strings are sets, and groups and tasks are matched by name. Each diff is `Added`,
//! `Deleted`, `Edited` or `None`; only what changed is listed (Nomad's non-verbose diff),
//! but every group and task is, so the plan can say what happens to each.

use serde_json::{Map, Value, json};

use super::ApiJob;

/// Read-only or identifying fields that are not part of a job's spec.
const JOB_SKIPPED: &[&str] = &[
    "ID",
    "Status",
    "StatusDescription",
    "Version",
    "Stable",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
    "SubmitTime",
    "TaskGroups",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Added,
    Deleted,
    Edited,
    None,
}

impl Kind {
    fn text(self) -> &'static str {
        match self {
            Kind::Added => "Added",
            Kind::Deleted => "Deleted",
            Kind::Edited => "Edited",
            Kind::None => "None",
        }
    }

    fn of(old: Option<&Value>, new: Option<&Value>) -> Kind {
        match (old, new) {
            (None, Some(_)) => Kind::Added,
            (Some(_), None) => Kind::Deleted,
            (Some(a), Some(b)) if a != b => Kind::Edited,
            _ => Kind::None,
        }
    }
}

/// A value as Nomad's diff shows it: strings bare, everything else as JSON.
fn shown(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|value| !value.is_null())
}

fn nil_if_empty(items: Vec<Value>) -> Value {
    if items.is_empty() {
        Value::Null
    } else {
        Value::Array(items)
    }
}

/// A repeated block's singular name (`Constraints` → `Constraint`).
fn singular(name: &str) -> String {
    if let Some(stem) = name.strip_suffix("ies") {
        format!("{stem}y")
    } else if let Some(stem) = name.strip_suffix('s') {
        stem.to_string()
    } else {
        name.to_string()
    }
}

fn field(name: &str, old: Option<&Value>, new: Option<&Value>) -> Option<Value> {
    let kind = Kind::of(old, new);
    (kind != Kind::None).then(|| {
        json!({
            "Type": kind.text(),
            "Name": name,
            "Old": shown(old),
            "New": shown(new),
            "Annotations": Value::Null,
        })
    })
}

/// The fields and objects that differ between two JSON objects (`skip`ped keys aside).
fn members(
    old: Option<&Map<String, Value>>,
    new: Option<&Map<String, Value>>,
    skip: &[&str],
) -> (Vec<Value>, Vec<Value>) {
    let mut keys: Vec<&String> = old.into_iter().chain(new).flat_map(|map| map.keys()).collect();
    keys.sort();
    keys.dedup();
    let (mut fields, mut objects) = (Vec::new(), Vec::new());
    for key in keys.into_iter().filter(|key| !skip.contains(&key.as_str())) {
        let a = present(old.and_then(|map| map.get(key)));
        let b = present(new.and_then(|map| map.get(key)));
        match (a, b) {
            (Some(Value::Object(_)), _) | (_, Some(Value::Object(_))) => {
                objects.extend(object(key, a, b));
            }
            (Some(Value::Array(_)), _) | (_, Some(Value::Array(_))) => {
                let (list_fields, list_objects) = list(key, a, b);
                objects.extend(list_fields);
                objects.extend(list_objects);
            }
            _ => fields.extend(field(key, a, b)),
        }
    }
    (fields, objects)
}

/// A nested block or map as an object diff, or nothing when it is the same.
fn object(name: &str, old: Option<&Value>, new: Option<&Value>) -> Option<Value> {
    let kind = Kind::of(old, new);
    if kind == Kind::None {
        return None;
    }
    let (fields, objects) = members(old.and_then(Value::as_object), new.and_then(Value::as_object), &[]);
    Some(json!({
        "Type": kind.text(),
        "Name": name,
        "Fields": nil_if_empty(fields),
        "Objects": nil_if_empty(objects),
    }))
}

/// A list: of primitives, one object of the list's name with a field per item added or
/// deleted (a set, as Nomad's `stringSetDiff`); of blocks, an object per block added or
/// deleted.
fn list(name: &str, old: Option<&Value>, new: Option<&Value>) -> (Vec<Value>, Vec<Value>) {
    let empty = Vec::new();
    let a = old.and_then(Value::as_array).unwrap_or(&empty);
    let b = new.and_then(Value::as_array).unwrap_or(&empty);
    let blocks = a.iter().chain(b).any(Value::is_object);
    let gone: Vec<&Value> = a.iter().filter(|item| !b.contains(item)).collect();
    let came: Vec<&Value> = b.iter().filter(|item| !a.contains(item)).collect();
    if gone.is_empty() && came.is_empty() {
        return (Vec::new(), Vec::new());
    }
    if blocks {
        let name = singular(name);
        let objects = gone
            .into_iter()
            .filter_map(|item| object(&name, Some(item), None))
            .chain(came.into_iter().filter_map(|item| object(&name, None, Some(item))))
            .collect();
        return (Vec::new(), objects);
    }
    let fields: Vec<Value> = gone
        .into_iter()
        .filter_map(|item| field(name, Some(item), None))
        .chain(came.into_iter().filter_map(|item| field(name, None, Some(item))))
        .collect();
    let kind = match (a.is_empty(), b.is_empty()) {
        (true, false) => Kind::Added,
        (false, true) => Kind::Deleted,
        _ => Kind::Edited,
    };
    let set = json!({
        "Type": kind.text(),
        "Name": name,
        "Fields": nil_if_empty(fields),
        "Objects": Value::Null,
    });
    (vec![set], Vec::new())
}

/// What the plan does to one group, as its diff's `Updates` and its tasks' annotation.
#[derive(Clone, Debug, Default)]
pub struct GroupUpdates {
    /// Nomad's `Updates` (`create`, `destroy`, `create/destroy update`, `in-place update`,
    /// `migrate`, `canary`, `ignore`), nonzero counts only.
    pub updates: Vec<(&'static str, u64)>,
    pub destructive: bool,
    pub in_place: bool,
}

fn named<'a>(list: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    list?.as_array()?.iter().find(|item| item["Name"] == name)
}

fn names(old: Option<&Value>, new: Option<&Value>) -> Vec<String> {
    let mut names: Vec<String> = old
        .into_iter()
        .chain(new)
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|item| item["Name"].as_str().map(String::from))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|name| seen.insert(name.clone()));
    names
}

fn task_diff(name: &str, old: Option<&Value>, new: Option<&Value>, updates: &GroupUpdates) -> Value {
    let (fields, objects) = members(
        old.and_then(Value::as_object),
        new.and_then(Value::as_object),
        &["Name"],
    );
    let mut kind = Kind::of(old, new);
    if kind == Kind::Edited && fields.is_empty() && objects.is_empty() {
        kind = Kind::None;
    }
    let annotation = match kind {
        Kind::Added | Kind::Deleted => Some("forces create/destroy update"),
        Kind::Edited if updates.destructive => Some("forces create/destroy update"),
        Kind::Edited if updates.in_place => Some("forces in-place update"),
        _ => None,
    };
    json!({
        "Type": kind.text(),
        "Name": name,
        "Fields": nil_if_empty(fields),
        "Objects": nil_if_empty(objects),
        "Annotations": annotation.map_or(Value::Null, |text| json!([text])),
    })
}

fn group_diff(name: &str, old: Option<&Value>, new: Option<&Value>, updates: &GroupUpdates) -> Value {
    let (mut fields, objects) = members(
        old.and_then(Value::as_object),
        new.and_then(Value::as_object),
        &["Name", "Tasks"],
    );
    // A count change says what it forces.
    for field in &mut fields {
        if field["Name"] == "Count" {
            let before = field["Old"]
                .as_str()
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(0);
            let after = field["New"]
                .as_str()
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(0);
            let note = if after > before {
                "forces create"
            } else {
                "forces destroy"
            };
            field["Annotations"] = json!([note]);
        }
    }
    let old_tasks = old.map(|group| &group["Tasks"]);
    let new_tasks = new.map(|group| &group["Tasks"]);
    let tasks: Vec<Value> = names(old_tasks, new_tasks)
        .iter()
        .map(|task| task_diff(task, named(old_tasks, task), named(new_tasks, task), updates))
        .collect();
    let mut kind = Kind::of(old, new);
    let changed = !fields.is_empty() || !objects.is_empty() || tasks.iter().any(|task| task["Type"] != "None");
    if kind == Kind::Edited && !changed {
        kind = Kind::None;
    }
    let counts: Map<String, Value> = updates
        .updates
        .iter()
        .map(|(what, count)| (what.to_string(), json!(count)))
        .collect();
    json!({
        "Type": kind.text(),
        "Name": name,
        "Fields": nil_if_empty(fields),
        "Objects": nil_if_empty(objects),
        "Tasks": nil_if_empty(tasks),
        "Updates": if counts.is_empty() { Value::Null } else { Value::Object(counts) },
    })
}

/// The diff of `old` (the stored job, if any) and `new` (the planned one); `updates(group)`
/// says what the plan does to each group.
pub fn job_diff(old: Option<&ApiJob>, new: &ApiJob, updates: &dyn Fn(&str) -> GroupUpdates) -> Value {
    let old = old.map(|job| serde_json::to_value(job).expect("serializes"));
    let new = serde_json::to_value(new).expect("serializes");
    let (fields, objects) = members(old.as_ref().and_then(Value::as_object), new.as_object(), JOB_SKIPPED);
    let old_groups = old.as_ref().map(|job| &job["TaskGroups"]);
    let new_groups = Some(&new["TaskGroups"]);
    let groups: Vec<Value> = names(old_groups, new_groups)
        .iter()
        .map(|group| {
            group_diff(
                group,
                named(old_groups, group),
                named(new_groups, group),
                &updates(group),
            )
        })
        .collect();
    let kind = match &old {
        None => Kind::Added,
        Some(_) if fields.is_empty() && objects.is_empty() && groups.iter().all(|g| g["Type"] == "None") => Kind::None,
        Some(_) => Kind::Edited,
    };
    json!({
        "Type": kind.text(),
        "ID": new["ID"],
        "Fields": nil_if_empty(fields),
        "Objects": nil_if_empty(objects),
        "TaskGroups": nil_if_empty(groups),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(job: Value) -> ApiJob {
        serde_json::from_value(job).unwrap()
    }

    fn updates(_: &str) -> GroupUpdates {
        GroupUpdates {
            updates: vec![("create/destroy update", 1)],
            destructive: true,
            in_place: false,
        }
    }

    #[test]
    fn a_changed_config_value_is_an_edited_field_in_an_edited_object_and_forces_a_replacement() {
        let job = |image: &str, count: u32| {
            api(json!({
                "ID": "example", "Priority": 50, "Datacenters": ["dc1"],
                "TaskGroups": [{"Name": "cache", "Count": count, "Tasks": [{
                    "Name": "redis", "Driver": "docker", "Config": {"image": image, "port_map": [{"db": 6379}]}
                }]}]
            }))
        };
        let diff = job_diff(Some(&job("redis:3.2", 1)), &job("redis:4.0", 1), &updates);
        assert_eq!(diff["Type"], "Edited");
        assert_eq!(diff["Fields"], Value::Null, "unchanged fields are left out");
        let group = &diff["TaskGroups"][0];
        assert_eq!(
            (group["Name"].as_str(), group["Type"].as_str()),
            (Some("cache"), Some("Edited"))
        );
        assert_eq!(group["Updates"], json!({"create/destroy update": 1}));
        let task = &group["Tasks"][0];
        assert_eq!(task["Annotations"], json!(["forces create/destroy update"]));
        assert_eq!(
            task["Objects"],
            json!([{
                "Type": "Edited", "Name": "Config", "Objects": null,
                "Fields": [{"Type": "Edited", "Name": "image", "Old": "redis:3.2", "New": "redis:4.0", "Annotations": null}],
            }])
        );
        // A count change, and a datacenter added to the set.
        let mut more = job("redis:3.2", 3);
        more.datacenters.push("dc2".into());
        let diff = job_diff(Some(&job("redis:3.2", 1)), &more, &updates);
        assert_eq!(
            diff["TaskGroups"][0]["Fields"],
            json!([{"Type": "Edited", "Name": "Count", "Old": "1", "New": "3", "Annotations": ["forces create"]}])
        );
        assert_eq!(
            diff["Objects"],
            json!([{"Type": "Edited", "Name": "Datacenters", "Objects": null,
                    "Fields": [{"Type": "Added", "Name": "Datacenters", "Old": "", "New": "dc2", "Annotations": null}]}])
        );
        assert_eq!(diff["TaskGroups"][0]["Tasks"][0]["Type"], "None");
    }

    #[test]
    fn a_new_job_is_added_whole_and_the_same_job_is_no_change() {
        let job = api(
            json!({"ID": "web", "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "exec"}]}]}),
        );
        let added = job_diff(None, &job, &updates);
        assert_eq!(added["Type"], "Added");
        assert_eq!(added["TaskGroups"][0]["Type"], "Added");
        assert_eq!(added["TaskGroups"][0]["Tasks"][0]["Type"], "Added");
        let none = job_diff(Some(&job), &job, &|_| GroupUpdates::default());
        assert_eq!(none["Type"], "None");
        assert_eq!(none["TaskGroups"][0]["Type"], "None");
        assert_eq!(none["TaskGroups"][0]["Updates"], Value::Null);
    }
}
