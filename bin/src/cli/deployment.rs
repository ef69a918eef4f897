//! `deployment list|status|promote|fail|pause|resume` and `job revert`, in Nomad's words and
//! tables; `job status` shows the latest deployment through [`latest_section`].

use clap::Subcommand;
use serde_json::{Value, json};

use drover_http::api::Deployment;

use super::{Api, Failure, short, short_id, table, text};

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
fn one(api: &Api, prefix: &str) -> Result<Deployment, Failure> {
    let list: Vec<Deployment> = api.get_as(&format!("/v1/deployments?prefix={prefix}"))?;
    match list.as_slice() {
        [] => Err(Failure(
            format!("No deployment(s) with prefix or ID {prefix:?} found"),
            1,
        )),
        [one] => Ok(one.clone()),
        many => match many.iter().find(|d| d.id == prefix) {
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

fn id(id: &str, verbose: bool) -> String {
    if verbose { id.to_string() } else { short_id(id) }
}

fn row(deployment: &Deployment, verbose: bool) -> Vec<String> {
    vec![
        id(&deployment.id, verbose),
        deployment.job_id.clone(),
        deployment.job_version.to_string(),
        deployment.status.clone(),
        deployment.status_description.clone(),
    ]
}

/// Nomad's `Deployed` table: `Auto Revert` when a group reverts, `Promoted` and `Canaries`
/// when a group has canaries.
fn deployed(deployment: &Deployment) -> String {
    let groups = &deployment.task_groups;
    let revert = groups.values().any(|g| g.auto_revert);
    let canaries = groups.values().any(|g| g.desired_canaries > 0);
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
    for (name, group) in groups {
        let mut cells = vec![name.clone()];
        if revert {
            cells.push(group.auto_revert.to_string());
        }
        if canaries {
            let wants = group.desired_canaries > 0;
            cells.push(if wants {
                group.promoted.to_string()
            } else {
                "N/A".into()
            });
        }
        cells.push(group.desired_total.to_string());
        if canaries {
            cells.push(group.desired_canaries.to_string());
        }
        cells.push(group.placed_allocs.to_string());
        cells.push(group.healthy_allocs.to_string());
        cells.push(group.unhealthy_allocs.to_string());
        let by = &group.require_progress_by;
        cells.push(if by.starts_with("0001-") {
            "N/A".into()
        } else {
            by.clone()
        });
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
    let latest: Option<Deployment> = api.get_as(&format!("{}/deployment", super::job_path(job_id)))?;
    let Some(latest) = latest else {
        return Ok(None);
    };
    let head = fields(&[
        ("ID", short_id(&latest.id)),
        ("Status", latest.status.clone()),
        ("Description", latest.status_description.clone()),
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
            let mut deployments: Vec<Deployment> = api.get_as("/v1/deployments")?;
            if deployments.is_empty() {
                println!("No deployments found");
                return Ok(());
            }
            deployments.sort_by_key(|d| std::cmp::Reverse(d.create_index));
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
                    ("ID", id(&deployment.id, verbose)),
                    ("Job ID", deployment.job_id.clone()),
                    ("Job Version", deployment.job_version.to_string()),
                    ("Status", deployment.status.clone()),
                    ("Description", deployment.status_description.clone()),
                ])
            );
            println!("\nDeployed\n{}", deployed(&deployment));
            Ok(())
        }
        DeploymentCommand::Promote { id: prefix, groups } => {
            let id = one(api, &prefix)?.id;
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
            let id = one(api, &prefix)?.id;
            update(
                api,
                &format!("/v1/deployment/fail/{id}"),
                json!({"DeploymentID": id}),
                &format!("Deployment {id:?} failed"),
            )
        }
        DeploymentCommand::Pause { id: prefix } | DeploymentCommand::Resume { id: prefix } => {
            let id = one(api, &prefix)?.id;
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
