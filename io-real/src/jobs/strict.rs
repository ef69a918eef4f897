//! Job bodies read field by field: a field Drover does not take is refused by name, never
//! dropped. Go's JSON (and so Nomad) ignores unknown fields; a job registered with, say, a
//! block Drover has no field for would otherwise be accepted and read back without it — the
//! user told nothing.
//!
//! A field that asks for nothing passes: `null`, `false`, `0`, `""`, `[]`, `{}` (or an object
//! of only such members) — what Nomad's Go client sends for every field it has and the user
//! left unset — and the value Nomad's own canonicalisation fills in for fields this project
//! does not carry ([`NOMAD_DEFAULTS`]), which asks for no more than leaving the field out.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Nomad's canonical defaults of fields Drover does not carry: (the field's path from the
/// job, list indices as `*`; the value). A Go client that canonicalised its job before
/// sending it (`api.Job.Canonicalize`, or a job taken from Nomad's `/v1/jobs/parse`) sends
/// these though its user wrote none of them.
fn nomad_defaults() -> Vec<(&'static str, Value)> {
    vec![
        // The migrate block's health settings: Drover counts a migrated allocation healthy
        // once it runs (see core's drainer).
        ("TaskGroups.*.Migrate.HealthCheck", json!("checks")),
        ("TaskGroups.*.Migrate.MinHealthyTime", json!(10_000_000_000_i64)),
        ("TaskGroups.*.Migrate.HealthyDeadline", json!(300_000_000_000_i64)),
        ("TaskGroups.*.Services.*.OnUpdate", json!("require_healthy")),
        ("TaskGroups.*.Services.*.Checks.*.OnUpdate", json!("require_healthy")),
        ("TaskGroups.*.Tasks.*.Services.*.OnUpdate", json!("require_healthy")),
        (
            "TaskGroups.*.Tasks.*.Services.*.Checks.*.OnUpdate",
            json!("require_healthy"),
        ),
        ("Region", json!("global")),
    ]
}

/// Where a refused field sits, as `TaskGroups[0].EphemeralDisk`.
fn segments(path: &serde_ignored::Path, out: &mut Vec<Segment>) {
    match path {
        serde_ignored::Path::Root => {}
        serde_ignored::Path::Seq { parent, index } => {
            segments(parent, out);
            out.push(Segment::Index(*index));
        }
        serde_ignored::Path::Map { parent, key } => {
            segments(parent, out);
            out.push(Segment::Key(key.clone()));
        }
        serde_ignored::Path::Some { parent }
        | serde_ignored::Path::NewtypeStruct { parent }
        | serde_ignored::Path::NewtypeVariant { parent } => segments(parent, out),
    }
}

#[derive(Clone, Debug)]
enum Segment {
    Key(String),
    Index(usize),
}

fn render(segments: &[Segment]) -> String {
    let mut text = String::new();
    for segment in segments {
        match segment {
            Segment::Key(key) => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(key);
            }
            Segment::Index(index) => text.push_str(&format!("[{index}]")),
        }
    }
    text
}

fn lookup<'a>(mut value: &'a Value, segments: &[Segment]) -> Option<&'a Value> {
    for segment in segments {
        value = match segment {
            Segment::Key(key) => value.get(key.as_str())?,
            Segment::Index(index) => value.get(*index)?,
        };
    }
    Some(value)
}

/// Whether `value` asks for nothing: null, false, zero, empty, or an object of only such.
pub fn asks_nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(flag) => !flag,
        Value::Number(number) => number.as_f64() == Some(0.0),
        Value::String(text) => text.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(members) => members.values().all(asks_nothing),
    }
}

/// Whether the field at `segments` (below `skip` leading segments, the job's own path) holds
/// Nomad's canonical default for it.
fn is_nomad_default(segments: &[Segment], value: &Value) -> bool {
    let pattern: Vec<String> = segments
        .iter()
        .map(|segment| match segment {
            Segment::Key(key) => key.clone(),
            Segment::Index(_) => "*".into(),
        })
        .collect();
    let pattern = pattern.join(".");
    nomad_defaults()
        .iter()
        .any(|(path, default)| pattern.ends_with(path) && default == value)
}

/// `value` decoded as `T`, with the fields `T` has no place for as problems naming each
/// (`Job.TaskGroups[0].Foo: not a field Drover takes; …`), unless it asks for nothing.
/// `job_at`: how many leading segments lead to the job (1 for `{"Job": …}`).
pub fn decode<T: DeserializeOwned>(value: Value, job_at: usize) -> Result<(T, Vec<String>), serde_json::Error> {
    let mut ignored: Vec<Vec<Segment>> = Vec::new();
    let decoded: T = serde_ignored::deserialize(value.clone(), |path| {
        let mut found = Vec::new();
        segments(&path, &mut found);
        ignored.push(found);
    })?;
    let problems: Vec<String> = ignored
        .iter()
        .filter(|path| {
            let Some(found) = lookup(&value, path) else {
                return false;
            };
            !asks_nothing(found) && !is_nomad_default(&path[job_at.min(path.len())..], found)
        })
        .map(|path| {
            format!(
                "{}: not a field Drover takes; refused rather than dropped",
                render(path)
            )
        })
        .collect();
    Ok((decoded, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_named_unless_they_ask_for_nothing() {
        let body = json!({"Job": {
            "ID": "web",
            "Frobnicate": true,
            "VaultToken": "",
            "Spooky": {"Level": 0, "Names": []},
            "TaskGroups": [{
                "Name": "g",
                "Migrate": {"MaxParallel": 1, "HealthCheck": "checks", "MinHealthyTime": 10_000_000_000_i64},
                "Tasks": [{"Name": "t", "Driver": "raw_exec", "Unheard": {"Of": "yes"}, "Config": {"anything": 1}}]
            }]
        }});
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Body {
            #[allow(dead_code)]
            job: crate::jobs::ApiJob,
        }
        let problems = decode::<Body>(body, 1).unwrap().1;
        assert_eq!(
            problems,
            [
                "Job.Frobnicate: not a field Drover takes; refused rather than dropped",
                "Job.TaskGroups[0].Tasks[0].Unheard: not a field Drover takes; refused rather than dropped",
            ]
        );
        let migrate = json!({"Job": {"ID": "web", "TaskGroups": [{"Name": "g",
            "Migrate": {"MinHealthyTime": 1}, "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}});
        assert_eq!(
            decode::<Body>(migrate, 1).unwrap().1,
            ["Job.TaskGroups[0].Migrate.MinHealthyTime: not a field Drover takes; refused rather than dropped"],
            "a value other than Nomad's default asks for something"
        );
    }
}
