//! `POST /v1/search/fuzzy` (Nomad's `Search.FuzzySearch`): names containing the text, case
//! ignored, across jobs (and within them their groups, services, tasks, and the `image`,
//! `command` or `class` of their drivers), nodes, allocations, CSI plugins and variables.
//! As Nomad does with its default `search {}` settings: the text must be at least 2
//! characters, each context looks at its first 20 objects (`limit_query`) and returns at most
//! 100 matches (`limit_results`), `Truncations` saying where that cut anything off; matches
//! sort by where the text was found, then by length, then by name; each names the `Scope`
//! that finds its object (namespace, job, group, task; a node's ID; an allocation's ID).

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use drover_core::acl::Acl;
use drover_core::acl::policy::{cap, var_cap};
use drover_core::fsm::ServerState;
use drover_core::structs::Job;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{ApiError, QueryOptions, parse_body, query_headers};
use drover_io_real::driver::AgentHandle;

/// Nomad's `search { min_term_length limit_query limit_results }` defaults.
const MIN_TERM_LENGTH: usize = 2;
const LIMIT_QUERY: usize = 20;
const LIMIT_RESULTS: usize = 100;

/// The contexts a fuzzy search may be asked for.
const CONTEXTS: [&str; 6] = ["all", "jobs", "nodes", "allocs", "plugins", "variables"];

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct FuzzyBody {
    text: String,
    context: String,
    namespace: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Found {
    id: String,
    scope: Vec<String>,
    score: usize,
}

/// Where `text` (lower case) is in `name`, case ignored.
fn position(name: &str, text: &str) -> Option<usize> {
    name.to_lowercase().find(text)
}

fn found(name: &str, text: &str, scope: Vec<String>) -> Option<Found> {
    position(name, text).map(|score| Found {
        id: name.to_string(),
        scope,
        score,
    })
}

/// The matches within one job, by context.
fn job_matches(job: &Job, text: &str, out: &mut BTreeMap<&'static str, Vec<Found>>) {
    let ns = job.namespace.clone();
    let scope = |more: &[&str]| {
        let mut scope = vec![ns.clone(), job.id.clone()];
        scope.extend(more.iter().map(|part| part.to_string()));
        scope
    };
    let mut push = |context: &'static str, hit: Option<Found>| {
        if let Some(hit) = hit {
            out.entry(context).or_default().push(hit);
        }
    };
    push("jobs", found(&job.name, text, vec![ns.clone(), job.id.clone()]));
    for group in &job.task_groups {
        push("groups", found(&group.name, text, scope(&[])));
        for service in &group.services {
            push("services", found(&service.name, text, scope(&[&group.name])));
        }
        for task in &group.tasks {
            push("tasks", found(&task.name, text, scope(&[&group.name])));
            for service in &task.services {
                push(
                    "services",
                    found(&service.name, text, scope(&[&group.name, &task.name])),
                );
            }
            let (context, key) = match task.driver.as_str() {
                "docker" => ("images", "image"),
                "exec" | "raw_exec" => ("commands", "command"),
                "java" => ("classes", "class"),
                _ => continue,
            };
            if let Some(value) = task.config.get(key).and_then(|value| value.as_str()) {
                push(context, found(value, text, scope(&[&group.name, &task.name])));
            }
        }
    }
}

/// Nomad's order: where the text was found, then shorter names, then by name.
fn sort(matches: &mut [Found]) {
    matches.sort_by(|a, b| (a.score, a.id.len(), &a.id).cmp(&(b.score, b.id.len(), &b.id)));
}

/// Gathers the matches of the first [`LIMIT_QUERY`] objects: `matches` gives each one's,
/// by context; a context is truncated when more objects were left unsearched after a match,
/// or past [`LIMIT_RESULTS`].
fn gather<'a, T: 'a>(
    objects: impl Iterator<Item = &'a T>,
    mut matches: impl FnMut(&T, &mut BTreeMap<&'static str, Vec<Found>>),
    results: &mut BTreeMap<&'static str, Vec<Found>>,
    truncations: &mut BTreeMap<&'static str, bool>,
) {
    let mut objects = objects.peekable();
    let mut searched = 0;
    while let Some(object) = objects.next() {
        searched += 1;
        let mut found = BTreeMap::new();
        matches(object, &mut found);
        let limited = searched == LIMIT_QUERY && objects.peek().is_some();
        for (context, hits) in found {
            let kept = results.entry(context).or_default();
            for hit in hits {
                if kept.len() >= LIMIT_RESULTS {
                    truncations.insert(context, true);
                    break;
                }
                kept.push(hit);
            }
            if limited {
                truncations.insert(context, true);
            }
        }
        if searched == LIMIT_QUERY {
            break;
        }
    }
}

/// Whether `acl` lets the caller see a context's objects in `namespace`.
fn may_read(acl: Option<&Acl>, context: &str, namespace: &str) -> bool {
    let Some(acl) = acl else { return true };
    match context {
        "nodes" => acl.allows_node(false),
        "plugins" => acl.allows_plugin(true),
        "variables" => acl.allows_variable(namespace, "", var_cap::LIST),
        _ => acl.allows_namespace(namespace, cap::READ_JOB),
    }
}

fn search(
    state: &ServerState,
    asked: &[&str],
    namespace: &str,
    text: &str,
    acl: Option<&Acl>,
) -> (Map<String, Value>, Map<String, Value>) {
    let in_namespace = |ns: &str| namespace == "*" || ns == namespace;
    let wants = |context: &str| asked.contains(&context);
    let mut results = BTreeMap::new();
    let mut truncations = BTreeMap::new();
    if wants("jobs") {
        let jobs = state
            .jobs()
            .filter(|job| in_namespace(&job.namespace) && may_read(acl, "jobs", &job.namespace));
        gather(
            jobs,
            |job, out| job_matches(job, text, out),
            &mut results,
            &mut truncations,
        );
    }
    if wants("nodes") && may_read(acl, "nodes", namespace) {
        let nodes = state.nodes();
        let matches = |node: &drover_core::structs::Node, out: &mut BTreeMap<_, Vec<Found>>| {
            if let Some(hit) = found(&node.name, text, vec![node.id.clone()]) {
                out.entry("nodes").or_default().push(hit);
            }
        };
        gather(nodes, matches, &mut results, &mut truncations);
    }
    if wants("allocs") {
        let allocs = state
            .allocs()
            .filter(|alloc| in_namespace(&alloc.namespace) && may_read(acl, "allocs", &alloc.namespace));
        let matches = |alloc: &drover_core::structs::Allocation, out: &mut BTreeMap<_, Vec<Found>>| {
            if let Some(hit) = found(&alloc.name, text, vec![alloc.namespace.clone(), alloc.id.clone()]) {
                out.entry("allocs").or_default().push(hit);
            }
        };
        gather(allocs, matches, &mut results, &mut truncations);
    }
    if wants("plugins") && may_read(acl, "plugins", namespace) {
        let matches = |plugin: &drover_core::structs::CsiPlugin, out: &mut BTreeMap<_, Vec<Found>>| {
            if let Some(hit) = found(&plugin.id, text, Vec::new()) {
                out.entry("plugins").or_default().push(hit);
            }
        };
        gather(state.plugins(), matches, &mut results, &mut truncations);
    }
    if wants("variables") && may_read(acl, "variables", namespace) {
        let matches = |variable: &drover_core::fsm::Variable, out: &mut BTreeMap<_, Vec<Found>>| {
            let scope = vec![
                drover_core::structs::DEFAULT_NAMESPACE.to_string(),
                variable.path.clone(),
            ];
            if let Some(hit) = found(&variable.path, text, scope) {
                out.entry("variables").or_default().push(hit);
            }
        };
        gather(state.variables(), matches, &mut results, &mut truncations);
    }
    let mut matches = Map::new();
    for (context, mut found) in results {
        sort(&mut found);
        let found: Vec<Value> = found
            .into_iter()
            .map(|hit| json!({"ID": hit.id, "Scope": hit.scope}))
            .collect();
        matches.insert(context.to_string(), Value::Array(found));
    }
    let truncations = truncations
        .into_iter()
        .map(|(context, truncated)| (context.to_string(), Value::Bool(truncated)))
        .collect();
    (matches, truncations)
}

/// `POST /v1/search/fuzzy` `{"Text": "...", "Context": "all"}`.
pub async fn fuzzy_search(
    State(handle): State<AgentHandle>,
    Query(options): Query<QueryOptions>,
    acl: Option<Extension<Acl>>,
    body: axum::body::Bytes,
) -> Result<(axum::http::HeaderMap, axum::Json<Value>), ApiError> {
    let body: FuzzyBody = parse_body(&body, "fuzzy search request")?;
    let context = if body.context.is_empty() {
        "all"
    } else {
        body.context.as_str()
    };
    if !CONTEXTS.contains(&context) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("context {context:?} is not supported for fuzzy searching"),
        ));
    }
    let length = body.text.chars().count();
    if length < MIN_TERM_LENGTH {
        return Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("fuzzy search query must be at least {MIN_TERM_LENGTH} characters, got {length}"),
        ));
    }
    let asked: Vec<&'static str> = match context {
        "all" => CONTEXTS[1..].to_vec(),
        one => CONTEXTS.into_iter().filter(|known| *known == one).collect(),
    };
    let namespace = body
        .namespace
        .or_else(|| options.namespace.clone())
        .unwrap_or_else(|| drover_core::structs::DEFAULT_NAMESPACE.to_string());
    let acl = acl.map(|Extension(acl)| acl);
    if context != "all" && !may_read(acl.as_ref(), context, &namespace) {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            drover_core::acl::PERMISSION_DENIED.into(),
        ));
    }
    let text = body.text.to_lowercase();
    let read = super::read_list(&handle, move |state| {
        let (matches, truncations) = search(state, &asked, &namespace, &text, acl.as_ref());
        (state.last_applied().unwrap_or(0), matches, truncations)
    })
    .await;
    let Some((index, matches, truncations)) = read else {
        return Err(ApiError(StatusCode::NOT_IMPLEMENTED, "search needs a server".into()));
    };
    Ok((
        query_headers(&handle, index),
        axum::Json(json!({ "Matches": matches, "Truncations": truncations, "Index": index })),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_core::structs::{Task, TaskGroup};

    fn job(id: &str, groups: &[(&str, &[(&str, &str)])]) -> Job {
        Job {
            id: id.into(),
            name: id.into(),
            namespace: "default".into(),
            task_groups: groups
                .iter()
                .map(|(group, tasks)| TaskGroup {
                    name: group.to_string(),
                    tasks: tasks
                        .iter()
                        .map(|(task, command)| {
                            let mut task = Task {
                                name: task.to_string(),
                                driver: "raw_exec".into(),
                                ..Task::default()
                            };
                            task.config.insert(
                                "command".into(),
                                drover_core::structs::ConfigValue::String(command.to_string()),
                            );
                            task
                        })
                        .collect(),
                    ..TaskGroup::default()
                })
                .collect(),
            ..Job::default()
        }
    }

    #[test]
    fn matches_inside_jobs_sort_as_nomads_do_and_carry_their_scope() {
        let mut results = BTreeMap::new();
        let web = job("web-frontend", &[("web", &[("nginx", "/usr/sbin/nginx")])]);
        job_matches(&web, "web", &mut results);
        let api = job("api", &[("api-web", &[("server", "/bin/web-server")])]);
        job_matches(&api, "web", &mut results);
        let mut jobs = results.remove("jobs").unwrap();
        sort(&mut jobs);
        assert_eq!(
            jobs.iter().map(|hit| hit.id.as_str()).collect::<Vec<_>>(),
            vec!["web-frontend"]
        );
        let mut groups = results.remove("groups").unwrap();
        sort(&mut groups);
        // Found at 0 before found at 4.
        assert_eq!(
            groups
                .iter()
                .map(|hit| (hit.id.as_str(), hit.scope.clone()))
                .collect::<Vec<_>>(),
            vec![
                ("web", vec!["default".to_string(), "web-frontend".to_string()]),
                ("api-web", vec!["default".to_string(), "api".to_string()]),
            ]
        );
        let commands = results.remove("commands").unwrap();
        assert_eq!(commands[0].id, "/bin/web-server");
        assert_eq!(commands[0].scope, vec!["default", "api", "api-web", "server"]);
        assert!(!results.contains_key("tasks"), "no task is named like it");
    }

    #[test]
    fn only_the_first_objects_are_searched_and_the_cut_is_said() {
        let jobs: Vec<Job> = (0..25).map(|n| job(&format!("svc-{n:02}"), &[])).collect();
        let mut results = BTreeMap::new();
        let mut truncations = BTreeMap::new();
        gather(
            jobs.iter(),
            |job, out| job_matches(job, "svc", out),
            &mut results,
            &mut truncations,
        );
        assert_eq!(results["jobs"].len(), LIMIT_QUERY);
        assert_eq!(truncations.get("jobs"), Some(&true));
        let mut results = BTreeMap::new();
        let mut truncations = BTreeMap::new();
        gather(
            jobs[..3].iter(),
            |job, out| job_matches(job, "svc", out),
            &mut results,
            &mut truncations,
        );
        assert_eq!((results["jobs"].len(), truncations.get("jobs")), (3, None));
    }
}
