//! The daily commands Nomad users reach for: `job init|validate|inspect|history|allocs|eval`,
//! `eval list|status`, `var get|put|list|purge` (`var lock` is `var_lock.rs`), the top-level `status` and `node config`.
//! Each that prints an object takes Nomad's `-json` (the API's JSON, indented as Nomad's)
//! and `-t` (a Go template over that JSON, rendered with gtmpl as Nomad renders it).

use std::collections::HashMap;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use drover_http::api::{self, Evaluation};

use super::alloc::format_unix_nanos;
use super::{Api, Failure, escape, job_path, short, table, text, typed};

/// `-json` and `-t`: the object as JSON, or through a Go template, instead of the table.
#[derive(Debug, Default, Clone, Args)]
pub struct Format {
    /// Print the API's JSON.
    #[arg(long = "json")]
    pub json: bool,
    /// Print through this Go template (over the API's JSON).
    #[arg(short = 't', value_name = "TEMPLATE")]
    pub template: Option<String>,
}

impl Format {
    /// Prints `value` as asked and returns true, or returns false for the caller's table.
    pub(super) fn printed(&self, value: &Value) -> Result<bool, Failure> {
        if self.json && self.template.is_some() {
            return Err(Failure("Both json and template formatting are not allowed".into(), 1));
        }
        if self.json {
            println!("{}", indented(value));
            return Ok(true);
        }
        if let Some(template) = &self.template {
            println!("{}", go_template(template, value)?);
            return Ok(true);
        }
        Ok(false)
    }
}

/// JSON indented by four spaces, as Nomad's `-json` prints it.
fn indented(value: &Value) -> String {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(value, &mut serializer).expect("JSON serializes");
    String::from_utf8(out).expect("JSON is UTF-8")
}

fn gtmpl_value(value: &Value) -> gtmpl::Value {
    match value {
        Value::Null => gtmpl::Value::Nil,
        Value::Bool(flag) => gtmpl::Value::from(*flag),
        Value::Number(number) => match (number.as_i64(), number.as_u64(), number.as_f64()) {
            (Some(int), _, _) => gtmpl::Value::from(int),
            (None, Some(uint), _) => gtmpl::Value::from(uint),
            (_, _, Some(float)) => gtmpl::Value::from(float),
            _ => gtmpl::Value::Nil,
        },
        Value::String(text) => gtmpl::Value::from(text.clone()),
        Value::Array(items) => gtmpl::Value::Array(items.iter().map(gtmpl_value).collect()),
        Value::Object(members) => gtmpl::Value::Map(
            members
                .iter()
                .map(|(key, value)| (key.clone(), gtmpl_value(value)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

/// `template` executed over `value` (Nomad: `template.New("format").Parse(t)`).
pub(super) fn go_template(template: &str, value: &Value) -> Result<String, Failure> {
    let mut parsed = gtmpl::Template::default();
    parsed
        .parse(template)
        .map_err(|error| Failure(format!("Error formatting the data: {error}"), 1))?;
    parsed
        .render(&gtmpl::Context::from(gtmpl_value(value)))
        .map_err(|error| Failure(format!("Error formatting the data: {error}"), 1))
}

pub(super) fn key_values(rows: Vec<(&str, String)>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(key, value)| vec![key.to_string(), "=".into(), value])
        .collect();
    table(&rows).replace("  =  ", " = ")
}

// --- job ------------------------------------------------------------------------------

/// The example `job init` writes: a job that runs on `agent -dev` as it is (no image to pull).
const EXAMPLE_JOB: &str = r#"# An example job: a service of two allocations, each a shell that says hello every ten
# seconds. `agent job run example.nomad.hcl` runs it on `agent -dev` as it is. Every block
# is documented as Nomad documents it: https://developer.hashicorp.com/nomad/docs/job-specification
job "example" {
  # Where it may run ("*" matches every datacenter).
  datacenters = ["*"]
  type        = "service"

  update {
    max_parallel     = 1
    min_healthy_time = "10s"
    healthy_deadline = "3m"
    auto_revert      = false
  }

  group "hello" {
    count = 2

    restart {
      attempts = 2
      interval = "30m"
      delay    = "15s"
      mode     = "fail"
    }

    reschedule {
      delay          = "30s"
      delay_function = "exponential"
      max_delay      = "1h"
      unlimited      = true
    }

    task "say" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo hello from $NOMAD_ALLOC_NAME; sleep 10; done"]
      }

      resources {
        cpu    = 50 # MHz
        memory = 32 # MB
      }
    }
  }
}
"#;

/// The shortest job `job init -short` writes.
const SHORT_JOB: &str = r#"job "example" {
  group "hello" {
    task "say" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo hello; sleep 10; done"]
      }
    }
  }
}
"#;

#[derive(Debug, Subcommand)]
pub enum DailyJobCommand {
    /// Write an example job file (example.nomad.hcl) to start from.
    Init {
        file: Option<String>,
        /// The shortest job, without comments.
        #[arg(long)]
        short: bool,
    },
    /// Check a job file as a registration would, registering nothing.
    Validate { file: String },
    /// The job as the servers store it (JSON, or through -t).
    Inspect {
        id: String,
        /// That version of the job.
        #[arg(long)]
        version: Option<u64>,
        #[arg(short = 't', value_name = "TEMPLATE")]
        template: Option<String>,
        /// Accepted as Nomad's is: inspect prints JSON anyway.
        #[arg(long = "json")]
        json: bool,
    },
    /// The job's versions, newest first.
    History {
        id: String,
        /// Only this version.
        #[arg(long)]
        version: Option<u64>,
        /// Show each version's diff from the one before.
        #[arg(short = 'p')]
        diffs: bool,
        #[command(flatten)]
        format: Format,
    },
    /// The job's allocations.
    Allocs {
        id: String,
        #[command(flatten)]
        format: Format,
    },
    /// Evaluate the job again (after a node came back, say).
    Eval {
        id: String,
        /// Reschedule its failed allocations now, whatever their delay.
        #[arg(long = "force-reschedule")]
        force_reschedule: bool,
        /// Return once the evaluation is created.
        #[arg(long)]
        detach: bool,
    },
}

pub(super) fn run_job(api: &Api, command: DailyJobCommand) -> Result<(), Failure> {
    match command {
        DailyJobCommand::Init { file, short } => job_init(file.as_deref(), short),
        DailyJobCommand::Validate { file } => job_validate(api, &file),
        DailyJobCommand::Inspect {
            id,
            version,
            template,
            json: _,
        } => job_inspect(api, &id, version, template.as_deref()),
        DailyJobCommand::History {
            id,
            version,
            diffs,
            format,
        } => job_history(api, &id, version, diffs, &format),
        DailyJobCommand::Allocs { id, format } => job_allocs(api, &id, &format),
        DailyJobCommand::Eval {
            id,
            force_reschedule,
            detach,
        } => job_eval(api, &id, force_reschedule, detach),
    }
}

fn job_init(file: Option<&str>, short: bool) -> Result<(), Failure> {
    let file = file.unwrap_or("example.nomad.hcl");
    if std::path::Path::new(file).exists() {
        return Err(Failure(format!("Job '{file}' already exists"), 1));
    }
    let content = if short { SHORT_JOB } else { EXAMPLE_JOB };
    std::fs::write(file, content).map_err(|error| Failure(format!("Failed to write '{file}': {error}"), 1))?;
    println!("Example job file written to {file}");
    Ok(())
}

fn job_validate(api: &Api, file: &str) -> Result<(), Failure> {
    let job = super::job::read_job_file(file)?;
    let path = "/v1/validate/job";
    let answer: api::JobValidateResponse = typed(path, &api.call("PUT", path, Some(&json!({ "Job": job })))?)?;
    let errors = answer.validation_errors;
    if !errors.is_empty() {
        let listed: Vec<String> = errors.iter().map(|error| format!("    * {error}")).collect();
        return Err(Failure(
            format!(
                "Job validation errors:\n{} error(s) occurred:\n\n{}",
                errors.len(),
                listed.join("\n")
            ),
            1,
        ));
    }
    println!("Job validation successful");
    Ok(())
}

fn job_inspect(api: &Api, id: &str, version: Option<u64>, template: Option<&str>) -> Result<(), Failure> {
    let job = match version {
        None => api.job_call("GET", &job_path(id), None, id)?,
        Some(version) => {
            let versions = api.job_call("GET", &format!("{}/versions", job_path(id)), None, id)?;
            versions["Versions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|job| job["Version"].as_u64() == Some(version))
                .cloned()
                .ok_or_else(|| Failure(format!("Error finding job version: version {version} not found"), 1))?
        }
    };
    match template {
        Some(template) => println!("{}", go_template(template, &job)?),
        None => println!("{}", indented(&json!({ "Job": job }))),
    }
    Ok(())
}

fn job_history(api: &Api, id: &str, version: Option<u64>, diffs: bool, format: &Format) -> Result<(), Failure> {
    let path = format!("{}/versions?diffs={diffs}", job_path(id));
    let answer = api.job_call("GET", &path, None, id)?;
    let versions: Vec<Value> = answer["Versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|job| version.is_none_or(|wanted| job["Version"].as_u64() == Some(wanted)))
        .cloned()
        .collect();
    if version.is_some() && versions.is_empty() {
        return Err(Failure(
            format!(
                "Error finding job version: version {} not found",
                version.unwrap_or_default()
            ),
            1,
        ));
    }
    let shown = if version.is_some() {
        versions[0].clone()
    } else {
        Value::Array(versions.clone())
    };
    if format.printed(&shown)? {
        return Ok(());
    }
    let diffs = answer["Diffs"].as_array().cloned().unwrap_or_default();
    let sections: Vec<String> = versions
        .iter()
        .enumerate()
        .map(|(at, job)| {
            let mut section = key_values(vec![
                ("Version", text(&job["Version"])),
                ("Stable", text(&job["Stable"])),
                (
                    "Submit Date",
                    format_unix_nanos(job["SubmitTime"].as_i64().unwrap_or(0)),
                ),
            ]);
            if let Some(diff) = diffs.get(at).filter(|_| version.is_none())
                && diff["Type"] != "None"
            {
                section.push_str(&format!("\nDiff         =\n{}", indented(diff)));
            }
            section
        })
        .collect();
    println!("{}", sections.join("\n\n"));
    Ok(())
}

fn job_allocs(api: &Api, id: &str, format: &Format) -> Result<(), Failure> {
    let path = format!("{}/allocations", job_path(id));
    let answer = api.job_call("GET", &path, None, id)?;
    if format.printed(&answer)? {
        return Ok(());
    }
    let allocs: Vec<api::AllocListStub> = typed(&path, &answer)?;
    let mut rows = vec![
        [
            "ID",
            "Node ID",
            "Task Group",
            "Version",
            "Desired",
            "Status",
            "Created",
            "Modified",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    for alloc in allocs {
        rows.push(vec![
            super::short_id(&alloc.id),
            super::short_id(&alloc.node_id),
            alloc.task_group,
            alloc.job_version.to_string(),
            alloc.desired_status,
            alloc.client_status,
            format_unix_nanos(alloc.create_time),
            format_unix_nanos(alloc.modify_time),
        ]);
    }
    if rows.len() == 1 {
        println!("No allocations placed");
    } else {
        println!("{}", table(&rows));
    }
    Ok(())
}

fn job_eval(api: &Api, id: &str, force_reschedule: bool, detach: bool) -> Result<(), Failure> {
    let body = json!({"JobID": id, "EvalOptions": {"ForceReschedule": force_reschedule}});
    let reply = api.job_call("PUT", &format!("{}/evaluate", job_path(id)), Some(&body), id)?;
    let eval_id = text(&reply["EvalID"]);
    if detach {
        println!("Created eval ID: {:?}", short(&reply["EvalID"]));
        return Ok(());
    }
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    super::job::monitor(api, &eval_id, reply["EvalCreateIndex"].as_u64().unwrap_or(0))
}

// --- eval -----------------------------------------------------------------------------

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Evaluations, newest first.
    List {
        /// Only this job's.
        #[arg(long)]
        job: Option<String>,
        /// Only those in this status (pending, complete, failed, blocked, canceled).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// One evaluation: what triggered it and what it could not place.
    Status {
        id: String,
        #[command(flatten)]
        format: Format,
    },
}

pub(super) fn run_eval(api: &Api, command: EvalCommand) -> Result<(), Failure> {
    match command {
        EvalCommand::List { job, status, format } => eval_list(api, job.as_deref(), status.as_deref(), &format),
        EvalCommand::Status { id, format } => eval_status(api, &id, &format),
    }
}

fn eval_list(api: &Api, job: Option<&str>, status: Option<&str>, format: &Format) -> Result<(), Failure> {
    let mut filters = Vec::new();
    if let Some(job) = job {
        filters.push(format!("JobID == {job:?}"));
    }
    if let Some(status) = status {
        filters.push(format!("Status == {status:?}"));
    }
    let path = if filters.is_empty() {
        "/v1/evaluations".to_string()
    } else {
        format!("/v1/evaluations?filter={}", escape(&filters.join(" and ")))
    };
    let evals = api.get(&path)?;
    if format.printed(&evals)? {
        return Ok(());
    }
    let mut rows = vec![
        [
            "ID",
            "Priority",
            "Triggered By",
            "Job ID",
            "Namespace",
            "Node ID",
            "Status",
            "Placement Failures",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    let evals: Vec<Evaluation> = super::typed(&path, &evals)?;
    for eval in evals {
        let failures =
            eval.failed_tg_allocs.as_ref().is_some_and(|failed| !failed.is_empty()) || !eval.blocked_eval.is_empty();
        rows.push(vec![
            super::short_id(&eval.id),
            eval.priority.to_string(),
            eval.triggered_by,
            eval.job_id,
            eval.namespace,
            super::short_id(&eval.node_id),
            eval.status,
            failures.to_string(),
        ]);
    }
    if rows.len() == 1 {
        println!("No evals found");
    } else {
        println!("{}", table(&rows));
    }
    Ok(())
}

fn eval_status(api: &Api, id: &str, format: &Format) -> Result<(), Failure> {
    let eval = match api.call_status("GET", &format!("/v1/evaluation/{}", escape(id)), None)? {
        Ok(eval) => eval,
        Err((404, _)) => return Err(Failure(format!("No evaluation(s) with prefix or id {id:?} found"), 1)),
        Err((code, text)) => return Err(Failure(format!("Unexpected response code: {code} ({text})"), 1)),
    };
    if format.printed(&eval)? {
        return Ok(());
    }
    let eval: Evaluation = super::typed("/v1/evaluation", &eval)?;
    let failed = eval.failed_tg_allocs.clone().unwrap_or_default();
    println!(
        "{}",
        key_values(vec![
            ("ID", eval.id.clone()),
            ("Create Time", format_unix_nanos(eval.create_time)),
            ("Modify Time", format_unix_nanos(eval.modify_time)),
            ("Status", eval.status.clone()),
            ("Status Description", eval.status_description.clone()),
            ("Type", eval.eval_type.clone()),
            ("TriggeredBy", eval.triggered_by.clone()),
            ("Job ID", eval.job_id.clone()),
            ("Namespace", eval.namespace.clone()),
            ("Priority", eval.priority.to_string()),
            ("Placement Failures", (!failed.is_empty()).to_string()),
            ("Previous Eval", eval.previous_eval.clone()),
            ("Next Eval", eval.next_eval.clone()),
            ("Blocked Eval", eval.blocked_eval.clone()),
        ])
    );
    if !failed.is_empty() {
        println!("\n==> Failed Placements");
        for (group, metrics) in failed {
            println!(
                "Task Group {group:?} (failed to place {} allocation(s)):",
                u64::from(metrics.coalesced_failures) + 1
            );
            for (what, count) in &metrics.dimension_exhausted {
                println!("  * Resources exhausted on {count} nodes: {what}");
            }
            for (what, count) in &metrics.constraint_filtered {
                println!("  * Constraint {what:?}: {count} nodes excluded by filter");
            }
        }
    }
    Ok(())
}

// --- var ------------------------------------------------------------------------------

#[derive(Debug, Subcommand)]
pub enum VarCommand {
    /// A variable's items.
    Get {
        path: String,
        /// Only this item's value.
        #[arg(long)]
        item: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// Write a variable: `key=value` items (all of them: the variable is replaced).
    Put {
        path: String,
        items: Vec<String>,
        /// Write only if the variable's modify index is this one (0: only if there is none).
        #[arg(long = "check-index")]
        check_index: Option<u64>,
        #[command(flatten)]
        format: Format,
    },
    /// Variables whose path starts with the prefix.
    List {
        prefix: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// Run a command while holding the variable's lock.
    Lock(super::var_lock::VarLock),
    /// Delete a variable.
    Purge {
        path: String,
        /// Delete only if the variable's modify index is this one.
        #[arg(long = "check-index")]
        check_index: Option<u64>,
    },
}

fn var_path(path: &str) -> String {
    let segments: Vec<String> = path.trim_matches('/').split('/').map(escape).collect();
    format!("/v1/var/{}", segments.join("/"))
}

/// `method path` for a variable, with Nomad's words for a missing one and a check-and-set
/// conflict, decided by the answer's status.
fn var_call(api: &Api, method: &str, url: &str, body: Option<&Value>, path: &str) -> Result<Value, Failure> {
    match api.call_status(method, url, body)? {
        Ok(value) => Ok(value),
        Err((404, _)) => Err(Failure("Variable not found".to_string(), 1)),
        Err((409, text)) => Err(Failure(
            format!("Check-and-Set conflict on variable {path:?}: {text}"),
            1,
        )),
        Err((code, text)) => Err(Failure(format!("Unexpected response code: {code} ({text})"), 1)),
    }
}

pub(super) fn run_var(api: &Api, command: VarCommand) -> Result<(), Failure> {
    match command {
        VarCommand::Lock(lock) => super::var_lock::run(api, lock),
        VarCommand::Get { path, item, format } => {
            let answer = var_call(api, "GET", &var_path(&path), None, &path)?;
            let variable: api::Variable = typed(&var_path(&path), &answer)?;
            if let Some(item) = item {
                let value = variable
                    .items
                    .get(&item)
                    .ok_or_else(|| Failure(format!("Variable at {path:?} has no item {item:?}"), 1))?;
                println!("{value}");
                return Ok(());
            }
            if format.printed(&answer)? {
                return Ok(());
            }
            print_variable(&variable);
            Ok(())
        }
        VarCommand::Put {
            path,
            items,
            check_index,
            format,
        } => {
            let mut map = serde_json::Map::new();
            for item in &items {
                let Some((key, value)) = item.split_once('=') else {
                    return Err(Failure(format!("Item {item:?} is not key=value"), 1));
                };
                map.insert(key.to_string(), Value::String(value.to_string()));
            }
            if map.is_empty() {
                return Err(Failure("A variable needs at least one key=value item".into(), 1));
            }
            let mut url = var_path(&path);
            if let Some(index) = check_index {
                url.push_str(&format!("?cas={index}"));
            }
            let body = json!({"Path": path.trim_matches('/'), "Items": map});
            let answer = var_call(api, "PUT", &url, Some(&body), &path)?;
            if format.printed(&answer)? {
                return Ok(());
            }
            let written: api::Variable = typed(&url, &answer)?;
            println!("Created variable {:?} with modify index {}", path, written.modify_index);
            Ok(())
        }
        VarCommand::List { prefix, format } => {
            let prefix = prefix.unwrap_or_default();
            let url = format!("/v1/vars?prefix={}", escape(&prefix));
            let answer = api.get(&url)?;
            if format.printed(&answer)? {
                return Ok(());
            }
            let listed: Vec<api::VariableMetadata> = typed(&url, &answer)?;
            let mut rows = vec![vec!["Namespace".to_string(), "Path".into(), "Last Updated".into()]];
            for variable in listed {
                rows.push(vec![
                    variable.namespace,
                    variable.path,
                    format_unix_nanos(variable.modify_time),
                ]);
            }
            if rows.len() == 1 {
                println!("No matching variables found");
            } else {
                println!("{}", table(&rows));
            }
            Ok(())
        }
        VarCommand::Purge { path, check_index } => {
            let mut url = var_path(&path);
            if let Some(index) = check_index {
                url.push_str(&format!("?cas={index}"));
            }
            var_call(api, "DELETE", &url, None, &path)?;
            println!("Successfully purged variable {path:?}!");
            Ok(())
        }
    }
}

fn print_variable(variable: &api::Variable) {
    println!(
        "{}",
        key_values(vec![
            ("Namespace", variable.namespace.clone()),
            ("Path", variable.path.clone()),
            ("Create Time", format_unix_nanos(variable.create_time)),
            ("Check Index", variable.modify_index.to_string()),
        ])
    );
    println!("\nItems");
    println!(
        "{}",
        key_values(
            variable
                .items
                .iter()
                .map(|(key, value)| (key.as_str(), value.clone()))
                .collect()
        )
    );
}

// --- status and node config -----------------------------------------------------------

/// `status [<id prefix>]`: the job list, or the status of whatever the prefix names (a job,
/// an allocation, a node, an evaluation or a deployment), as Nomad's top-level `status`.
pub(super) fn status(api: &Api, prefix: Option<&str>) -> Result<(), Failure> {
    let Some(prefix) = prefix else {
        return super::job::job_status(api, None);
    };
    let found = api.call("PUT", "/v1/search", Some(&json!({"Prefix": prefix, "Context": "all"})))?;
    let matches = |context: &str| -> Vec<String> {
        found["Matches"][context]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect()
    };
    for context in ["jobs", "allocs", "nodes", "evals", "deployment"] {
        let ids = matches(context);
        match ids.as_slice() {
            [] => continue,
            [id] => {
                return match context {
                    "jobs" => super::job::job_status(api, Some(id)),
                    "allocs" => super::alloc_status(api, id, false),
                    "nodes" => super::node_status(api, Some(id)),
                    "evals" => eval_status(api, id, &Format::default()),
                    _ => super::deployment::run(
                        api,
                        super::deployment::DeploymentCommand::Status {
                            id: id.clone(),
                            verbose: false,
                        },
                    ),
                };
            }
            several if prefix != several[0] => {
                return Err(Failure(
                    format!("Prefix matched multiple {context}:\n\n{}", several.join("\n")),
                    1,
                ));
            }
            _ => {}
        }
    }
    Err(Failure(format!("No matches found for prefix {prefix:?}"), 1))
}

/// `node config -servers` (the servers this agent's client talks to) and
/// `node config -update-servers <addr>...`.
pub(super) fn node_config(api: &Api, servers: bool, update: Vec<String>) -> Result<(), Failure> {
    if !update.is_empty() {
        let query: Vec<String> = update
            .iter()
            .map(|address| format!("address={}", escape(address)))
            .collect();
        api.call("PUT", &format!("/v1/agent/servers?{}", query.join("&")), None)?;
        println!("Updated server list");
        return Ok(());
    }
    if !servers {
        return Err(Failure(
            "Must specify -servers or -update-servers\nUsage: agent node config [-servers | -update-servers <address>...]"
                .into(),
            1,
        ));
    }
    let listed = api.get("/v1/agent/servers")?;
    for server in listed.as_array().into_iter().flatten() {
        println!("{}", text(server));
    }
    Ok(())
}

// --- monitor, ui ----------------------------------------------------------------------

/// `monitor`: the agent's log lines, as they come, until the agent or the reader stops.
pub(super) fn monitor(api: &Api, level: &str, node_id: Option<&str>, server_id: Option<&str>) -> Result<(), Failure> {
    let mut url = format!("{}/v1/agent/monitor?plain=true&log_level={}", api.base, escape(level));
    if let Some(node) = node_id {
        url.push_str(&format!("&node_id={}", escape(node)));
    }
    if let Some(server) = server_id {
        url.push_str(&format!("&server_id={}", escape(server)));
    }
    // No overall timeout: the stream lasts as long as the operator watches.
    let response = match api.authorize(api.agent.get(&url)).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(code, response)) => {
            let body = response.into_string().unwrap_or_default();
            return Err(Failure(
                format!(
                    "Error starting monitor: Unexpected response code: {code} ({})",
                    body.trim()
                ),
                1,
            ));
        }
        Err(error) => return Err(Failure(format!("Error starting monitor: {error}"), 1)),
    };
    let mut reader = response.into_reader();
    let mut out = std::io::stdout().lock();
    // A closed pipe (`monitor | head`) ends it quietly, as the stream ending does.
    let _ = std::io::copy(&mut reader, &mut out);
    Ok(())
}

/// `ui`: where the agent's web UI is (or the page of a job by ID) — once the agent says it
/// serves one; an agent without a UI is said to have none rather than sent to a 404.
pub(super) fn ui(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let url = match id {
        Some(id) => format!("{}/ui/jobs/{}", api.base, escape(id)),
        None => format!("{}/ui/", api.base),
    };
    match api.authorize(api.agent.get(&format!("{}/ui/", api.base))).call() {
        Ok(_) => {
            println!("Opening URL {url:?}");
            Ok(())
        }
        Err(ureq::Error::Status(404, _)) => Err(Failure(format!("The agent at {} serves no web UI", api.base), 1)),
        Err(error) => Err(Failure(format!("Error reaching the agent: {error}"), 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_json_print_as_nomads_do() {
        let value = json!({"ID": "web", "TaskGroups": [{"Name": "g", "Count": 3}], "Stop": false});
        assert_eq!(
            go_template("{{.ID}} {{range .TaskGroups}}{{.Name}}={{.Count}}{{end}}", &value)
                .unwrap_or_else(|Failure(message, _)| panic!("{message}")),
            "web g=3"
        );
        assert!(go_template("{{.ID", &value).is_err());
        assert_eq!(indented(&json!({"A": [1]})), "{\n    \"A\": [\n        1\n    ]\n}");
        let both = Format {
            json: true,
            template: Some("{{.ID}}".into()),
        };
        assert!(both.printed(&value).is_err());
    }

    #[test]
    fn the_example_jobs_parse_and_validate() {
        for example in [EXAMPLE_JOB, SHORT_JOB] {
            let job = drover_io_real::jobspec::parse(example).unwrap().to_job().unwrap();
            assert!(drover_core::jobspec::validate(&job).is_empty());
        }
    }

    #[test]
    fn variable_paths_are_escaped_segment_by_segment() {
        assert_eq!(var_path("/app/db config/"), "/v1/var/app/db%20config");
    }
}
