//! `deployment list|status|promote|fail|pause|resume` and `job revert`, in Nomad's words and
//! tables; `job status` shows the latest deployment through [`latest_section`].

use clap::Subcommand;
use serde_json::{Value, json};

use super::{Api, Failure, short, table, text};

#[derive(Debug, Subcommand)]
pub enum DeploymentCommand {
    /// List deployments.
    List {
        /// Full IDs.
        #[arg(long)]
        verbose: bool,
    },
    /// Show a deployment (an ID or a unique prefix of one).
    Status {
        id: String,
        #[arg(long)]
        verbose: bool,
    },
    /// Promote a deployment's canaries (every group's, or the `--group`s named).
    Promote {
        id: String,
        #[arg(long = "group")]
        groups: Vec<String>,
    },
    /// Mark a deployment failed (rolling back if its groups `auto_revert`).
    Fail { id: String },
    /// Pause a deployment.
    Pause { id: String },
    /// Resume a paused deployment.
    Resume { id: String },
}

/// The one deployment whose ID is or starts with `prefix`.
fn one(api: &Api, prefix: &str) -> Result<Value, Failure> {
    let found = api.get(&format!("/v1/deployments?prefix={prefix}"))?;
    let list = found.as_array().cloned().unwrap_or_default();
    match list.as_slice() {
        [] => Err(Failure(
            format!("No deployment(s) with prefix or ID {prefix:?} found"),
            1,
        )),
        [one] => Ok(one.clone()),
        many => match many.iter().find(|d| text(&d["ID"]) == prefix) {
            Some(exact) => Ok(exact.clone()),
            None => {
                let mut rows = vec![header(&["ID", "Job ID", "Job Version", "Status", "Description"])];
                rows.extend(many.iter().map(|d| row(d, false)));
                Err(Failure(
                    format!("Prefix matched multiple deployments\n\n{}", table(&rows)),
                    1,
                ))
            }
        },
    }
}

fn header(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

fn id(value: &Value, verbose: bool) -> String {
    if verbose { text(value) } else { short(value) }
}

fn row(deployment: &Value, verbose: bool) -> Vec<String> {
    vec![
        id(&deployment["ID"], verbose),
        text(&deployment["JobID"]),
        text(&deployment["JobVersion"]),
        text(&deployment["Status"]),
        text(&deployment["StatusDescription"]),
    ]
}

/// Nomad's `Deployed` table: `Auto Revert` when a group reverts, `Promoted` and `Canaries`
/// when a group has canaries.
fn deployed(deployment: &Value) -> String {
    let groups = deployment["TaskGroups"].as_object().cloned().unwrap_or_default();
    let revert = groups.values().any(|g| g["AutoRevert"].as_bool() == Some(true));
    let canaries = groups.values().any(|g| g["DesiredCanaries"].as_u64().unwrap_or(0) > 0);
    let mut head = vec!["Task Group"];
    if revert {
        head.push("Auto Revert");
    }
    if canaries {
        head.push("Promoted");
    }
    head.push("Desired");
    if canaries {
        head.push("Canaries");
    }
    head.extend(["Placed", "Healthy", "Unhealthy", "Progress Deadline"]);
    let mut rows = vec![header(&head)];
    for (name, group) in &groups {
        let mut cells = vec![name.clone()];
        if revert {
            cells.push(text(&group["AutoRevert"]));
        }
        if canaries {
            let wants = group["DesiredCanaries"].as_u64().unwrap_or(0) > 0;
            cells.push(if wants { text(&group["Promoted"]) } else { "N/A".into() });
        }
        cells.push(text(&group["DesiredTotal"]));
        if canaries {
            cells.push(text(&group["DesiredCanaries"]));
        }
        cells.push(text(&group["PlacedAllocs"]));
        cells.push(text(&group["HealthyAllocs"]));
        cells.push(text(&group["UnhealthyAllocs"]));
        let by = text(&group["RequireProgressBy"]);
        cells.push(if by.starts_with("0001-") { "N/A".into() } else { by });
        rows.push(cells);
    }
    table(&rows)
}

fn fields(rows: &[(&str, String)]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(name, value)| vec![name.to_string(), "=".into(), value.clone()])
        .collect();
    table(&rows).replace("  =  ", " = ")
}

/// `job status`'s `Latest Deployment` section, or `None` when the job has none.
pub(super) fn latest_section(api: &Api, job_id: &str) -> Result<Option<String>, Failure> {
    let latest = api.get(&format!("{}/deployment", super::job_path(job_id)))?;
    if latest.is_null() {
        return Ok(None);
    }
    let head = fields(&[
        ("ID", short(&latest["ID"])),
        ("Status", text(&latest["Status"])),
        ("Description", text(&latest["StatusDescription"])),
    ]);
    Ok(Some(format!(
        "Latest Deployment\n{head}\n\nDeployed\n{}",
        deployed(&latest)
    )))
}

/// Sends a deployment write and says what came of it.
fn update(api: &Api, path: &str, body: Value, done: &str) -> Result<(), Failure> {
    let answer = api.call("PUT", path, Some(&body))?;
    println!("{done}");
    let eval = text(&answer["EvalID"]);
    if !eval.is_empty() {
        println!("==> Evaluation {:?} created", short(&answer["EvalID"]));
    }
    Ok(())
}

pub(super) fn run(api: &Api, command: DeploymentCommand) -> Result<(), Failure> {
    let pause = matches!(command, DeploymentCommand::Pause { .. });
    match command {
        DeploymentCommand::List { verbose } => {
            let list = api.get("/v1/deployments")?;
            let mut deployments = list.as_array().cloned().unwrap_or_default();
            if deployments.is_empty() {
                println!("No deployments found");
                return Ok(());
            }
            deployments.sort_by_key(|d| std::cmp::Reverse(d["CreateIndex"].as_u64().unwrap_or(0)));
            let mut rows = vec![header(&["ID", "Job ID", "Job Version", "Status", "Description"])];
            rows.extend(deployments.iter().map(|d| row(d, verbose)));
            println!("{}", table(&rows));
            Ok(())
        }
        DeploymentCommand::Status { id: prefix, verbose } => {
            let deployment = one(api, &prefix)?;
            println!(
                "{}",
                fields(&[
                    ("ID", id(&deployment["ID"], verbose)),
                    ("Job ID", text(&deployment["JobID"])),
                    ("Job Version", text(&deployment["JobVersion"])),
                    ("Status", text(&deployment["Status"])),
                    ("Description", text(&deployment["StatusDescription"])),
                ])
            );
            println!("\nDeployed\n{}", deployed(&deployment));
            Ok(())
        }
        DeploymentCommand::Promote { id: prefix, groups } => {
            let deployment = one(api, &prefix)?;
            let id = text(&deployment["ID"]);
            let body = if groups.is_empty() {
                json!({"DeploymentID": id, "All": true})
            } else {
                json!({"DeploymentID": id, "Groups": groups})
            };
            update(
                api,
                &format!("/v1/deployment/promote/{id}"),
                body,
                &format!("Deployment {id:?} promoted"),
            )
        }
        DeploymentCommand::Fail { id: prefix } => {
            let id = text(&one(api, &prefix)?["ID"]);
            update(
                api,
                &format!("/v1/deployment/fail/{id}"),
                json!({"DeploymentID": id}),
                &format!("Deployment {id:?} failed"),
            )
        }
        DeploymentCommand::Pause { id: prefix } | DeploymentCommand::Resume { id: prefix } => {
            let id = text(&one(api, &prefix)?["ID"]);
            let done = if pause {
                format!("Deployment {id:?} paused")
            } else {
                format!("Deployment {id:?} resumed")
            };
            update(
                api,
                &format!("/v1/deployment/pause/{id}"),
                json!({"DeploymentID": id, "Pause": pause}),
                &done,
            )
        }
    }
}

/// `job revert <job> <version>`.
pub(super) fn job_revert(api: &Api, job_id: &str, version: u64) -> Result<(), Failure> {
    let body = json!({"JobID": job_id, "JobVersion": version});
    let answer = api.call("PUT", &format!("{}/revert", super::job_path(job_id)), Some(&body))?;
    println!("Job {job_id:?} reverted to version {version}");
    let eval = text(&answer["EvalID"]);
    if !eval.is_empty() {
        println!("==> Evaluation {:?} created", short(&answer["EvalID"]));
    }
    Ok(())
}
