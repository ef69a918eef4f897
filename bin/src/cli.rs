//! The operator CLI: `agent job run FILE`, `agent job status`, `agent node status`, ... —
//! Nomad's commands and tables, over the HTTP API at `-address` or `NOMAD_ADDR` (default
//! `http://127.0.0.1:4646`). Exit codes: 0 done, 1 error, 2 `job run` with placement failures.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct Global {
    /// HTTP address of an agent (default $NOMAD_ADDR, else http://127.0.0.1:4646).
    #[arg(long, global = true, value_name = "URL")]
    pub address: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Jobs: run, status, stop.
    #[command(subcommand)]
    Job(JobCommand),
    /// Allocations.
    #[command(subcommand)]
    Alloc(AllocCommand),
    /// Client nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// CSI volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// CSI plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Servers.
    #[command(subcommand)]
    Server(ServerCommand),
    /// Cluster operations.
    #[command(subcommand)]
    Operator(OperatorCommand),
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Register a job from an HCL (or JSON) file and follow its placement.
    Run {
        file: String,
        /// Return once the job is submitted.
        #[arg(long)]
        detach: bool,
    },
    /// List jobs, or show one.
    Status { id: Option<String> },
    /// Stop a job (and with -purge, remove it).
    Stop {
        id: String,
        #[arg(long)]
        purge: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AllocCommand {
    Status { id: String },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    Status {
        id: Option<String>,
    },
    /// Drain a node: move its allocations elsewhere (system and CSI plugin jobs last), or
    /// cancel a drain. Follows the drain until it completes unless -detach.
    Drain {
        /// Node ID (or a unique prefix).
        id: String,
        #[arg(long)]
        enable: bool,
        #[arg(long)]
        disable: bool,
        /// How long before every remaining allocation is stopped (Go duration, default 1h).
        #[arg(long, value_name = "DURATION")]
        deadline: Option<String>,
        /// No deadline: wait for every allocation to migrate.
        #[arg(long)]
        no_deadline: bool,
        /// Stop everything at once.
        #[arg(long)]
        force: bool,
        /// Leave system jobs (and CSI plugin jobs) running on the node.
        #[arg(long)]
        ignore_system: bool,
        /// With -disable: leave the node ineligible for new placements.
        #[arg(long)]
        keep_ineligible: bool,
        /// Return once the drain is set.
        #[arg(long)]
        detach: bool,
        /// Do not ask for confirmation (there is no prompt; accepted for Nomad's scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Mark a node eligible or ineligible for new placements.
    Eligibility {
        id: String,
        #[arg(long)]
        enable: bool,
        #[arg(long)]
        disable: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Register a CSI volume from an HCL file (`id`, `name`, `type`, `plugin_id`, ...).
    Register {
        file: String,
    },
    Status {
        id: Option<String>,
    },
    Deregister {
        id: String,
        #[arg(long)]
        force: bool,
    },
    /// Release a volume's claims on a node.
    Detach {
        id: String,
        node: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    Status { id: Option<String> },
}

#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    Members,
}

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    #[command(subcommand)]
    Raft(RaftCommand),
}

#[derive(Debug, Subcommand)]
pub enum RaftCommand {
    #[command(name = "list-peers")]
    ListPeers,
}

/// A failed command: the message for stderr and the exit code.
struct Failure(String, u8);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure(error.to_string(), 1)
    }
}

struct Api {
    base: String,
}

impl Api {
    fn new(address: Option<String>) -> Api {
        let base = address
            .or_else(|| std::env::var("NOMAD_ADDR").ok())
            .unwrap_or_else(|| "http://127.0.0.1:4646".into());
        Api {
            base: base.trim_end_matches('/').to_string(),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let url = format!("{}{path}", self.base);
        let request = ureq::request(method, &url).timeout(Duration::from_secs(30));
        let response = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match response {
            Ok(response) => {
                let text = response.into_string()?;
                Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
            }
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                Err(Failure(
                    format!("Unexpected response code: {code} ({})", text.trim()),
                    1,
                ))
            }
            Err(error) => Err(Failure(format!("Error querying {url}: {error}"), 1)),
        }
    }

    fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call("GET", path, None)
    }
}

/// Columns separated by two spaces, widths from the widest cell (Nomad's `columnize`).
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    if c + 1 == row.len() {
                        cell.clone()
                    } else {
                        format!("{cell:width$}", width = widths[c])
                    }
                })
                .collect();
            cells.join("  ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn short(id: &Value) -> String {
    text(id).chars().take(8).collect()
}

pub fn run(global: Global, command: Command) -> ExitCode {
    let api = Api::new(global.address);
    let result = match command {
        Command::Job(JobCommand::Run { file, detach }) => job_run(&api, &file, detach),
        Command::Job(JobCommand::Status { id }) => job_status(&api, id.as_deref()),
        Command::Job(JobCommand::Stop { id, purge }) => job_stop(&api, &id, purge),
        Command::Alloc(AllocCommand::Status { id }) => alloc_status(&api, &id),
        Command::Node(NodeCommand::Status { id }) => node_status(&api, id.as_deref()),
        Command::Node(NodeCommand::Drain {
            id,
            enable,
            disable,
            deadline,
            no_deadline,
            force,
            ignore_system,
            keep_ineligible,
            detach,
            yes: _,
        }) => {
            let options = DrainOptions {
                enable,
                disable,
                deadline,
                no_deadline,
                force,
                ignore_system,
                keep_ineligible,
                detach,
            };
            node_drain(&api, &id, options)
        }
        Command::Node(NodeCommand::Eligibility { id, enable, disable }) => node_eligibility(&api, &id, enable, disable),
        Command::Volume(VolumeCommand::Register { file }) => volume_register(&api, &file),
        Command::Volume(VolumeCommand::Status { id }) => volume_status(&api, id.as_deref()),
        Command::Volume(VolumeCommand::Deregister { id, force }) => api
            .call("DELETE", &format!("/v1/volume/csi/{id}?force={force}"), None)
            .map(|_| println!("Successfully deregistered volume {id:?}!")),
        Command::Volume(VolumeCommand::Detach { id, node }) => api
            .call("DELETE", &format!("/v1/volume/csi/{id}/detach?node={node}"), None)
            .map(|_| println!("Successfully detached volume {id:?} from node {node:?}")),
        Command::Plugin(PluginCommand::Status { id }) => plugin_status(&api, id.as_deref()),
        Command::Server(ServerCommand::Members) => server_members(&api),
        Command::Operator(OperatorCommand::Raft(RaftCommand::ListPeers)) => list_peers(&api),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message, code)) => {
            eprintln!("{message}");
            ExitCode::from(code)
        }
    }
}

fn job_run(api: &Api, file: &str, detach: bool) -> Result<(), Failure> {
    let source = std::fs::read_to_string(file).map_err(|error| Failure(format!("Error reading {file}: {error}"), 1))?;
    let job = if file.ends_with(".json") {
        let value: Value = serde_json::from_str(&source)?;
        value.get("Job").cloned().unwrap_or(value)
    } else {
        let parsed = crate::jobspec::parse(&source).map_err(|problems| {
            Failure(
                format!("Error parsing job file from {file}:\n{}", problems.join("\n")),
                1,
            )
        })?;
        serde_json::to_value(parsed)?
    };
    let reply = api.call("PUT", "/v1/jobs", Some(&json!({ "Job": job })))?;
    let eval_id = text(&reply["EvalID"]);
    if detach {
        println!("Job registration successful");
        println!("Evaluation ID: {eval_id}");
        return Ok(());
    }
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    monitor(api, &eval_id, reply["EvalCreateIndex"].as_u64().unwrap_or(0))
}

/// Follows an evaluation (and the blocked one it leaves) until it is done; exit code 2 when
/// something could not be placed. The first read blocks until the server answering has
/// applied the write that created the evaluation (`created_at`): a follower may not have it
/// yet when the leader acknowledged the write.
fn monitor(api: &Api, eval_id: &str, created_at: u64) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut path = format!(
        "/v1/evaluation/{eval_id}?index={}&wait=30s",
        created_at.saturating_sub(1)
    );
    let eval = loop {
        let eval = api.get(&path)?;
        path = format!("/v1/evaluation/{eval_id}");
        if eval["Status"] != "pending" || Instant::now() > deadline {
            break eval;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("    Evaluation triggered by job {:?}", text(&eval["JobID"]));
    let allocs = api.get(&format!("/v1/job/{}/allocations", text(&eval["JobID"])))?;
    for alloc in allocs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["EvalID"] == eval_id)
    {
        println!(
            "    Allocation {:?} created: node {:?}, group {:?}",
            short(&alloc["ID"]),
            short(&alloc["NodeID"]),
            text(&alloc["TaskGroup"])
        );
    }
    println!(
        "    Evaluation status changed: \"pending\" -> {:?}",
        text(&eval["Status"])
    );
    let failed = eval["FailedTGAllocs"].as_object().filter(|failed| !failed.is_empty());
    if let Some(failed) = failed {
        println!(
            "==> Evaluation {:?} finished with status {:?} but failed to place all allocations:",
            short(&eval["ID"]),
            text(&eval["Status"])
        );
        for (group, metric) in failed {
            let queued = eval["QueuedAllocations"][group].as_u64().unwrap_or(0);
            let plural = if queued == 1 { "" } else { "s" };
            println!("    Task Group {group:?} (failed to place {queued} allocation{plural}):");
            for (reason, count) in metric["ConstraintFiltered"].as_object().into_iter().flatten() {
                println!("      * Constraint {reason:?}: {count} nodes excluded by filter");
            }
            for (dimension, count) in metric["DimensionExhausted"].as_object().into_iter().flatten() {
                println!("      * Resources exhausted on {count} nodes");
                println!("      * Dimension {dimension:?} exhausted on {count} nodes");
            }
        }
        if !text(&eval["BlockedEval"]).is_empty() {
            println!(
                "    Evaluation {:?} waiting for additional capacity to place remainder",
                short(&eval["BlockedEval"])
            );
        }
        return Err(Failure(String::new(), 2));
    }
    println!(
        "==> Evaluation {:?} finished with status {:?}",
        short(&eval["ID"]),
        text(&eval["Status"])
    );
    Ok(())
}

fn job_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let Some(id) = id else {
        let jobs = api.get("/v1/jobs")?;
        let mut rows = vec![vec![
            "ID".into(),
            "Type".into(),
            "Priority".into(),
            "Status".into(),
            "Submit Date".into(),
        ]];
        for job in jobs.as_array().into_iter().flatten() {
            rows.push(vec![
                text(&job["ID"]),
                text(&job["Type"]),
                text(&job["Priority"]),
                text(&job["Status"]),
                job["SubmitTime"]
                    .as_i64()
                    .map(|nanos| drover_io_real::http::rfc3339((nanos / 1_000_000) as u64))
                    .unwrap_or_default(),
            ]);
        }
        if rows.len() == 1 {
            println!("No running jobs");
        } else {
            println!("{}", table(&rows));
        }
        return Ok(());
    };
    let job = api.get(&format!("/v1/job/{id}")).map_err(|Failure(message, code)| {
        if message.contains("404") {
            Failure(format!("No job(s) with prefix or id {id:?} found"), 1)
        } else {
            Failure(message, code)
        }
    })?;
    let summary = api.get("/v1/jobs")?;
    println!(
        "{}",
        table(&[
            vec!["ID".into(), "=".into(), text(&job["ID"])],
            vec!["Name".into(), "=".into(), text(&job["Name"])],
            vec!["Type".into(), "=".into(), text(&job["Type"])],
            vec!["Priority".into(), "=".into(), text(&job["Priority"])],
            vec![
                "Datacenters".into(),
                "=".into(),
                job["Datacenters"]
                    .as_array()
                    .map(|d| d.iter().map(text).collect::<Vec<_>>().join(","))
                    .unwrap_or_default()
            ],
            vec!["Status".into(), "=".into(), text(&job["Status"])],
            vec!["Version".into(), "=".into(), text(&job["Version"])],
        ])
        .replace("  =  ", " = ")
    );
    println!();
    println!("Summary");
    let mut rows = vec![
        [
            "Task Group",
            "Queued",
            "Starting",
            "Running",
            "Failed",
            "Complete",
            "Lost",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    if let Some(stub) = summary.as_array().into_iter().flatten().find(|stub| stub["ID"] == id) {
        for (group, counts) in stub["JobSummary"]["Summary"].as_object().into_iter().flatten() {
            rows.push(vec![
                group.clone(),
                text(&counts["Queued"]),
                text(&counts["Starting"]),
                text(&counts["Running"]),
                text(&counts["Failed"]),
                text(&counts["Complete"]),
                text(&counts["Lost"]),
            ]);
        }
    }
    println!("{}", table(&rows));
    println!();
    println!("Allocations");
    let allocs = api.get(&format!("/v1/job/{id}/allocations"))?;
    let mut rows = vec![
        ["ID", "Node ID", "Task Group", "Version", "Desired", "Status"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for alloc in allocs.as_array().into_iter().flatten() {
        rows.push(vec![
            short(&alloc["ID"]),
            short(&alloc["NodeID"]),
            text(&alloc["TaskGroup"]),
            text(&alloc["JobVersion"]),
            text(&alloc["DesiredStatus"]),
            text(&alloc["ClientStatus"]),
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

fn job_stop(api: &Api, id: &str, purge: bool) -> Result<(), Failure> {
    let reply = api
        .call("DELETE", &format!("/v1/job/{id}?purge={purge}"), None)
        .map_err(|Failure(message, code)| {
            if message.contains("404") {
                Failure(format!("No job(s) with prefix or id {id:?} found"), 1)
            } else {
                Failure(message, code)
            }
        })?;
    println!("==> Monitoring evaluation {:?}", short(&reply["EvalID"]));
    monitor(
        api,
        &text(&reply["EvalID"]),
        reply["EvalCreateIndex"].as_u64().unwrap_or(0),
    )
}

fn resolve_alloc(api: &Api, prefix: &str) -> Result<Value, Failure> {
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

fn alloc_status(api: &Api, id: &str) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    println!(
        "{}",
        table(&[
            vec!["ID".into(), "=".into(), text(&alloc["ID"])],
            vec!["Eval ID".into(), "=".into(), short(&alloc["EvalID"])],
            vec!["Name".into(), "=".into(), text(&alloc["Name"])],
            vec!["Node ID".into(), "=".into(), short(&alloc["NodeID"])],
            vec!["Node Name".into(), "=".into(), text(&alloc["NodeName"])],
            vec!["Job ID".into(), "=".into(), text(&alloc["JobID"])],
            vec!["Job Version".into(), "=".into(), text(&alloc["JobVersion"])],
            vec!["Client Status".into(), "=".into(), text(&alloc["ClientStatus"])],
            vec!["Desired Status".into(), "=".into(), text(&alloc["DesiredStatus"])],
            vec![
                "Desired Description".into(),
                "=".into(),
                text(&alloc["DesiredDescription"])
            ],
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
    Ok(())
}

fn node_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
    let nodes = api.get("/v1/nodes")?;
    let mut rows = vec![
        ["ID", "DC", "Name", "Drivers", "Drain", "Eligibility", "Status"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for node in nodes.as_array().into_iter().flatten() {
        if id.is_some_and(|id| !text(&node["ID"]).starts_with(id)) {
            continue;
        }
        let drivers: Vec<String> = node["Drivers"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, info)| info["Healthy"] == true)
            .map(|(name, _)| name.clone())
            .collect();
        rows.push(vec![
            short(&node["ID"]),
            text(&node["Datacenter"]),
            text(&node["Name"]),
            drivers.join(","),
            text(&node["Drain"]),
            text(&node["SchedulingEligibility"]),
            text(&node["Status"]),
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

/// The one node whose ID is `prefix` or starts with it.
fn resolve_node(api: &Api, prefix: &str) -> Result<String, Failure> {
    let nodes = api.get(&format!("/v1/nodes?prefix={prefix}"))?;
    let ids: Vec<String> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .map(|node| text(&node["ID"]))
        .collect();
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

struct DrainOptions {
    enable: bool,
    disable: bool,
    deadline: Option<String>,
    no_deadline: bool,
    force: bool,
    ignore_system: bool,
    keep_ineligible: bool,
    detach: bool,
}

fn now_stamp() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    drover_io_real::http::rfc3339(millis)
}

fn node_drain(api: &Api, prefix: &str, options: DrainOptions) -> Result<(), Failure> {
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
        match crate::jobspec::parse_duration(text) {
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
fn monitor_drain(api: &Api, id: &str, set_at: u64) -> Result<(), Failure> {
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

fn node_eligibility(api: &Api, prefix: &str, enable: bool, disable: bool) -> Result<(), Failure> {
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

/// A volume spec file (`id`, `name`, `type = "csi"`, `plugin_id`, `external_id`,
/// `capability { access_mode attachment_mode }`, `mount_options`, `secrets`, `parameters`,
/// `context`) into the register body.
fn volume_register(api: &Api, file: &str) -> Result<(), Failure> {
    let source = std::fs::read_to_string(file).map_err(|error| Failure(format!("Error reading {file}: {error}"), 1))?;
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

fn strip_nulls(value: Value) -> Value {
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

fn volume_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
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

fn plugin_status(api: &Api, id: Option<&str>) -> Result<(), Failure> {
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

fn server_members(api: &Api) -> Result<(), Failure> {
    let members = api.get("/v1/agent/members")?;
    let leader = api.get("/v1/status/leader").map(|v| text(&v)).unwrap_or_default();
    let mut rows = vec![
        [
            "Name",
            "Address",
            "Port",
            "Status",
            "Leader",
            "Raft Version",
            "Build",
            "Datacenter",
            "Region",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    for member in members["Members"].as_array().into_iter().flatten() {
        let tags = &member["Tags"];
        let is_leader = !leader.is_empty() && leader == format!("{}:{}", text(&member["Addr"]), text(&tags["port"]));
        rows.push(vec![
            text(&member["Name"]),
            text(&member["Addr"]),
            text(&member["Port"]),
            text(&member["Status"]),
            is_leader.to_string(),
            "3".into(),
            text(&tags["build"]),
            text(&tags["dc"]),
            text(&tags["region"]),
        ]);
    }
    println!("{}", table(&rows));
    Ok(())
}

fn list_peers(api: &Api) -> Result<(), Failure> {
    let peers = api.get("/v1/status/peers")?;
    let leader = api.get("/v1/status/leader").map(|v| text(&v)).unwrap_or_default();
    let mut rows = vec![
        ["Address", "Leader", "Voter"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    for peer in peers.as_array().into_iter().flatten() {
        rows.push(vec![text(peer), (text(peer) == leader).to_string(), "true".into()]);
    }
    println!("{}", table(&rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_like_columnize() {
        let rows = vec![
            vec!["ID".to_string(), "Status".to_string()],
            vec!["web-long".to_string(), "running".to_string()],
        ];
        assert_eq!(table(&rows), "ID        Status\nweb-long  running");
    }
}
