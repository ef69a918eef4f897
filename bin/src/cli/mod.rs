//! The operator CLI: `agent job run FILE`, `agent job status`, `agent node status`, ... —
//! Nomad's commands and tables, over the HTTP API at `-address` or `NOMAD_ADDR` (default
//! `http://127.0.0.1:4646`). Exit codes: 0 done, 1 error, 2 `job run` with placement failures.

mod acl;
mod acl_login;
mod acl_roles;
mod alloc;
mod daily;
mod deployment;
mod dispatch;
mod exec;
mod job;
mod job_plan;
mod keyring;
mod logs;
mod namespace;
mod node;
mod operator;
mod periodic;
mod rootkeys;
mod scale;
mod server;
mod tls;
mod var_lock;
mod volume;
mod volume_snapshot;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

use alloc::{alloc_restart, alloc_signal, alloc_status, alloc_stop};
use job::{job_run, job_status, job_stop};
use node::{DrainOptions, node_drain, node_eligibility, node_status};
use server::{list_peers, server_members};
use volume::{plugin_status, volume_register, volume_status};

#[derive(Debug, Args)]
pub struct Global {
    /// HTTP address of an agent (default $NOMAD_ADDR, else http://127.0.0.1:4646).
    #[arg(long, global = true, value_name = "URL")]
    pub address: Option<String>,
    /// ACL token for every request (default $NOMAD_TOKEN).
    #[arg(long, global = true, value_name = "SECRET")]
    pub token: Option<String>,
    /// CA certificate to verify the agent's HTTPS certificate (default $NOMAD_CACERT).
    #[arg(long = "ca-cert", global = true, value_name = "PATH")]
    pub ca_cert: Option<String>,
    /// Client certificate to present (default $NOMAD_CLIENT_CERT).
    #[arg(long = "client-cert", global = true, value_name = "PATH")]
    pub client_cert: Option<String>,
    /// The client certificate's key (default $NOMAD_CLIENT_KEY).
    #[arg(long = "client-key", global = true, value_name = "PATH")]
    pub client_key: Option<String>,
    /// Skip verifying the agent's certificate (default $NOMAD_SKIP_VERIFY); not for production.
    #[arg(long = "tls-skip-verify", global = true)]
    pub tls_skip_verify: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Jobs: run, status, stop.
    #[command(subcommand)]
    Job(JobCommand),
    /// Allocations.
    #[command(subcommand)]
    Alloc(AllocCommand),
    /// Deployments: list, status, promote, fail, pause, resume.
    #[command(subcommand)]
    Deployment(deployment::DeploymentCommand),
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
    /// System maintenance: garbage collection, job summaries.
    #[command(subcommand)]
    System(SystemCommand),
    /// ACL bootstrap, policies and tokens.
    #[command(subcommand)]
    Acl(acl::AclCommand),
    /// A development CA and agent certificates.
    #[command(subcommand)]
    Tls(tls::TlsCommand),
    /// Evaluations: list, status.
    #[command(subcommand)]
    Eval(daily::EvalCommand),
    /// Variables: get, put, list, purge.
    #[command(subcommand)]
    Var(daily::VarCommand),
    /// Namespaces: list, status, inspect, apply, delete.
    #[command(subcommand)]
    Namespace(namespace::NamespaceCommand),
    /// The jobs, or the status of whatever an ID prefix names (job, allocation, node,
    /// evaluation, deployment).
    Status { id: Option<String> },
    /// Stream the agent's log lines from now on (Nomad's `monitor`).
    Monitor {
        /// The level to stream at: trace, debug, info, warn, error.
        #[arg(long = "log-level", default_value = "info")]
        log_level: String,
        /// Only when it is the agent's own client (Drover relays no monitor).
        #[arg(long = "node-id")]
        node_id: Option<String>,
        /// Only when it is the agent itself (or `leader` on it).
        #[arg(long = "server-id")]
        server_id: Option<String>,
    },
    /// Print the URL of the agent's web UI (Nomad's `ui`).
    Ui {
        /// Open this job's, node's or allocation's page: `ui <job id>`.
        id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Register a job from an HCL (or JSON) file and follow its placement.
    Run {
        file: String,
        /// Return once the job is submitted.
        #[arg(long)]
        detach: bool,
        /// Register only if the job's modify index is this one (from `job plan`; 0: only a
        /// new job).
        #[arg(long = "check-index")]
        check_index: Option<u64>,
    },
    /// What registering the job file would do: the scheduler's dry run and the diff.
    Plan {
        file: String,
        /// Show the diff (`-diff=false` to leave it out).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
        diff: bool,
    },
    /// List jobs, or show one.
    Status { id: Option<String> },
    /// Stop a job (and with -purge, remove it).
    Stop {
        id: String,
        #[arg(long)]
        purge: bool,
    },
    /// Register an earlier version of a job again, as its newest version.
    Revert { id: String, version: u64 },
    /// Periodic jobs: `periodic force`.
    #[command(subcommand)]
    Periodic(PeriodicCommand),
    /// Dispatch a parameterized job: a child with a payload (a file, or `-` for stdin) and
    /// meta.
    Dispatch {
        id: String,
        input: Option<String>,
        /// `key=value`, repeatable.
        #[arg(long)]
        meta: Vec<String>,
        /// A second dispatch with the same token, while its child lives, returns that child.
        #[arg(long = "idempotency-token")]
        idempotency_token: Option<String>,
        #[arg(long)]
        detach: bool,
    },
    #[command(flatten)]
    Daily(daily::DailyJobCommand),
    /// Change a task group's count (`<job> [<group>] <count>`; the group may be left out
    /// when the job has one), within its scaling policy.
    Scale {
        id: String,
        #[arg(num_args = 1..=2, required = true)]
        args: Vec<String>,
        #[arg(long)]
        detach: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PeriodicCommand {
    /// Launch a periodic job's child now, whatever its schedule says.
    Force {
        id: String,
        /// Return once the child is launched.
        #[arg(long)]
        detach: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AllocCommand {
    /// Show an allocation: its placement, task states and recent task events.
    Status {
        id: String,
        /// Full IDs and absolute times.
        #[arg(long)]
        verbose: bool,
    },
    /// Restart an allocation's task, or every running task (Nomad's `alloc restart`).
    Restart {
        id: String,
        /// The task to restart (also accepted as -task).
        task: Option<String>,
        #[arg(long = "task", value_name = "TASK")]
        task_flag: Option<String>,
    },
    /// Send a signal to an allocation's task, or every running task (Nomad's `alloc signal`).
    Signal {
        id: String,
        task: Option<String>,
        #[arg(long = "task", value_name = "TASK")]
        task_flag: Option<String>,
        /// The signal (default SIGKILL, as Nomad).
        #[arg(short = 's', value_name = "SIGNAL")]
        signal: Option<String>,
    },
    /// Run a command in a running task's context (Nomad's `alloc exec`); exits with its code.
    Exec {
        /// Pass stdin to the command (default true; -i=false to disable).
        #[arg(short = 'i', num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        interactive: Option<bool>,
        /// Allocate a pseudo-terminal (default: when stdin is a terminal; -t=false to disable).
        #[arg(short = 't', num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        tty: Option<bool>,
        #[arg(long = "task", value_name = "TASK")]
        task: Option<String>,
        id: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// List or print what is in an allocation's directory (Nomad's `alloc fs`).
    Fs {
        id: String,
        /// A path inside the allocation dir (default `/`).
        path: Option<String>,
        /// Show the file's details instead of its content.
        #[arg(long)]
        stat: bool,
    },
    /// Print (or follow) a task's stdout or stderr (Nomad's `alloc logs`).
    Logs {
        id: String,
        task: Option<String>,
        #[arg(long = "task", value_name = "TASK")]
        task_flag: Option<String>,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
        /// Follow the output as the task writes it.
        #[arg(short = 'f')]
        follow: bool,
        /// From the end: the last lines (-n, default 10) or bytes (-c).
        #[arg(long)]
        tail: bool,
        #[arg(short = 'n', value_name = "LINES")]
        lines: Option<usize>,
        #[arg(short = 'c', value_name = "BYTES")]
        bytes: Option<u64>,
    },
    /// Stop an allocation; the scheduler replaces it (Nomad's `alloc stop`).
    Stop {
        id: String,
        /// Return once the stop is submitted.
        #[arg(long)]
        detach: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    Status {
        id: Option<String>,
    },
    /// The servers this agent's client talks to (`-servers`), or set them
    /// (`-update-servers <address>...`).
    Config {
        #[arg(long)]
        servers: bool,
        #[arg(long = "update-servers", num_args = 1..)]
        update_servers: Vec<String>,
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
    Register { file: String },
    /// Create a CSI volume through its plugin's controller, then register it (the spec adds
    /// `capacity_min`, `capacity_max`, `snapshot_id`, `clone_id`, `topology_request`).
    Create { file: String },
    /// Delete a CSI volume in its plugin, then deregister it (refused while claimed).
    Delete {
        id: String,
        /// `key=value` secrets for the plugin's DeleteVolume (repeat for more).
        #[arg(long = "secret", value_name = "KEY=VALUE")]
        secrets: Vec<String>,
    },
    /// A volume's details, or every volume (with `--verbose`, also each controller plugin's
    /// external volumes).
    Status {
        id: Option<String>,
        #[arg(long)]
        verbose: bool,
    },
    /// Snapshots of CSI volumes, made and kept by their plugin.
    #[command(subcommand)]
    Snapshot(volume_snapshot::SnapshotCommand),
    Deregister {
        id: String,
        #[arg(long)]
        force: bool,
    },
    /// Release a volume's claims on a node.
    Detach { id: String, node: String },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    Status { id: Option<String> },
}

#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    Members,
    /// Join this server to others by their gossip address.
    Join(operator::JoinArgs),
    /// Mark a failed server left and remove it from the Raft configuration.
    #[command(name = "force-leave")]
    ForceLeave(operator::ForceLeaveArgs),
}

#[derive(Debug, Subcommand)]
pub enum SystemCommand {
    /// Remove every finished allocation, evaluation, deployment, stopped job and down node now.
    Gc,
    /// Rebuild every job's summary.
    #[command(subcommand)]
    Reconcile(ReconcileCommand),
}

#[derive(Debug, Subcommand)]
pub enum ReconcileCommand {
    /// Rebuild every job's summary from its allocations.
    Summaries,
}

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    #[command(subcommand)]
    Raft(RaftCommand),
    /// Dead server cleanup and server health.
    #[command(subcommand)]
    Autopilot(operator::AutopilotCommand),
    /// Gossip encryption.
    #[command(subcommand)]
    Gossip(keyring::GossipCommand),
    /// The root keyring that seals variables and volume secrets.
    #[command(subcommand)]
    Root(rootkeys::RootCommand),
}

#[derive(Debug, Subcommand)]
pub enum RaftCommand {
    #[command(name = "list-peers")]
    ListPeers,
    /// Remove a server from the Raft configuration.
    #[command(name = "remove-peer")]
    RemovePeer(operator::RemovePeerArgs),
}

/// A failed command: the message for stderr and the exit code.
struct Failure(String, u8);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure(error.to_string(), 1)
    }
}

#[derive(Clone)]
pub(super) struct Api {
    pub(super) base: String,
    /// The ACL token sent with every request (`-token`, `NOMAD_TOKEN`).
    pub(super) token: Option<String>,
    /// Requests go through it: HTTPS with the CLI's CA and certificate when given.
    pub(super) agent: ureq::Agent,
    /// The TLS client settings `agent` uses for `https://` (`alloc exec` dials `wss://` itself).
    pub(super) tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// A flag, else its environment variable, else nothing (empty counts as unset).
fn flag_or_env(flag: &Option<String>, env: &str) -> Option<String> {
    flag.clone()
        .or_else(|| std::env::var(env).ok())
        .filter(|value| !value.is_empty())
}

impl Api {
    fn new(global: &Global) -> Result<Api, Failure> {
        let base = flag_or_env(&global.address, "NOMAD_ADDR").unwrap_or_else(|| "http://127.0.0.1:4646".into());
        let tls = if base.starts_with("https://") {
            Some(Self::tls_for(global)?)
        } else {
            None
        };
        let builder = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10));
        let agent = match &tls {
            Some(config) => builder.tls_config(config.clone()).build(),
            None => builder.build(),
        };
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            token: flag_or_env(&global.token, "NOMAD_TOKEN"),
            agent,
            tls,
        })
    }

    /// Nomad's `-ca-cert -client-cert -client-key -tls-skip-verify` and their `NOMAD_*`
    /// variables.
    fn tls_for(global: &Global) -> Result<std::sync::Arc<rustls::ClientConfig>, Failure> {
        let ca = flag_or_env(&global.ca_cert, "NOMAD_CACERT").unwrap_or_default();
        let cert = flag_or_env(&global.client_cert, "NOMAD_CLIENT_CERT").unwrap_or_default();
        let key = flag_or_env(&global.client_key, "NOMAD_CLIENT_KEY").unwrap_or_default();
        let skip = global.tls_skip_verify
            || std::env::var("NOMAD_SKIP_VERIFY")
                .is_ok_and(|value| matches!(value.as_str(), "1" | "true" | "TRUE" | "True" | "t" | "T"));
        let settings = drover_host::tls::ClientTls {
            ca_file: &ca,
            cert_file: &cert,
            key_file: &key,
            verify: !skip,
        };
        let config = drover_host::tls::client_config(&settings)
            .map_err(|error| Failure(format!("Error setting up TLS: {error}"), 1))?;
        Ok(std::sync::Arc::new(config))
    }

    /// `request` with the ACL token, if any.
    pub(super) fn authorize(&self, request: ureq::Request) -> ureq::Request {
        match &self.token {
            Some(token) => request.set("X-Nomad-Token", token),
            None => request,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        self.call_with_headers(method, path, body, &[])
    }

    /// [`Self::call`] with extra request headers.
    fn call_with_headers(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, Failure> {
        let url = format!("{}{path}", self.base);
        let mut request = self.authorize(self.agent.request(method, &url).timeout(Duration::from_secs(30)));
        for (name, value) in headers {
            request = request.set(name, value);
        }
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

    /// [`Self::call`], with an answer of an error status kept apart as (status, body) so the
    /// caller decides by the status, not by a message's text.
    fn call_status(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Result<Value, (u16, String)>, Failure> {
        let url = format!("{}{path}", self.base);
        let request = self.authorize(self.agent.request(method, &url).timeout(Duration::from_secs(30)));
        let response = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match response {
            Ok(response) => {
                let text = response.into_string()?;
                Ok(Ok(serde_json::from_str(&text).unwrap_or(Value::String(text))))
            }
            Err(ureq::Error::Status(code, response)) => Ok(Err((
                code,
                response.into_string().unwrap_or_default().trim().to_string(),
            ))),
            Err(error) => Err(Failure(format!("Error querying {url}: {error}"), 1)),
        }
    }

    /// A call about job `id`: a 404 answer (by its status, not its text) in Nomad's words.
    fn job_call(&self, method: &str, path: &str, body: Option<&Value>, id: &str) -> Result<Value, Failure> {
        match self.call_status(method, path, body)? {
            Ok(value) => Ok(value),
            Err((404, _)) => Err(Failure(format!("No job(s) with prefix or id {id:?} found"), 1)),
            Err((code, text)) => Err(Failure(format!("Unexpected response code: {code} ({text})"), 1)),
        }
    }

    fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call("GET", path, None)
    }

    /// A GET read as one of the API's shared response types (`drover_http::api`).
    fn get_as<T: for<'de> serde::Deserialize<'de>>(&self, path: &str) -> Result<T, Failure> {
        let value = self.get(path)?;
        typed(path, &value)
    }
}

/// `value`, answered by `path`, as one of the API's shared response types.
fn typed<T: for<'de> serde::Deserialize<'de>>(path: &str, value: &Value) -> Result<T, Failure> {
    drover_http::api::read(value).map_err(|error| Failure(format!("Unexpected response from {path}: {error}"), 1))
}

/// The first eight characters of an ID (Nomad's short form).
fn short_id(id: &str) -> String {
    id.chars().take(8).collect()
}

/// Columns separated by two spaces, widths from the widest cell (Nomad's `columnize`).
pub(super) fn table(rows: &[Vec<String>]) -> String {
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

pub(super) fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Text made safe for a URL path segment or query value (job IDs hold `/`: a periodic
/// child's is `<parent>/periodic-<unix>`).
pub(super) fn escape(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// `/v1/job/<id>`, the ID escaped.
pub(super) fn job_path(id: &str) -> String {
    format!("/v1/job/{}", escape(id))
}

pub(super) fn short(id: &Value) -> String {
    short_id(&text(id))
}

pub fn run(global: Global, command: Command) -> ExitCode {
    let api = match Api::new(&global) {
        Ok(api) => api,
        Err(Failure(message, code)) => {
            eprintln!("{message}");
            return ExitCode::from(code);
        }
    };
    let result = match command {
        Command::Tls(command) => tls::run(command),
        Command::Job(JobCommand::Run {
            file,
            detach,
            check_index,
        }) => job_run(&api, &file, detach, check_index),
        Command::Job(JobCommand::Plan { file, diff }) => job_plan::job_plan(&api, &file, diff),
        Command::Job(JobCommand::Status { id }) => job_status(&api, id.as_deref()),
        Command::Job(JobCommand::Stop { id, purge }) => job_stop(&api, &id, purge),
        Command::Job(JobCommand::Revert { id, version }) => deployment::job_revert(&api, &id, version),
        Command::Job(JobCommand::Periodic(PeriodicCommand::Force { id, detach })) => periodic::force(&api, &id, detach),
        Command::Job(JobCommand::Dispatch {
            id,
            input,
            meta,
            idempotency_token,
            detach,
        }) => {
            let options = dispatch::DispatchOptions {
                meta,
                idempotency_token,
                detach,
            };
            dispatch::dispatch(&api, &id, input.as_deref(), options)
        }
        Command::Job(JobCommand::Scale { id, args, detach }) => scale::scale(&api, &id, &args, detach),
        Command::Job(JobCommand::Daily(command)) => daily::run_job(&api, command),
        Command::Eval(command) => daily::run_eval(&api, command),
        Command::Var(command) => daily::run_var(&api, command),
        Command::Namespace(command) => namespace::run(&api, command),
        Command::Monitor {
            log_level,
            node_id,
            server_id,
        } => daily::monitor(&api, &log_level, node_id.as_deref(), server_id.as_deref()),
        Command::Ui { id } => daily::ui(&api, id.as_deref()),
        Command::Status { id } => daily::status(&api, id.as_deref()),
        Command::Node(NodeCommand::Config {
            servers,
            update_servers,
        }) => daily::node_config(&api, servers, update_servers),
        Command::Deployment(command) => deployment::run(&api, command),
        Command::Alloc(AllocCommand::Status { id, verbose }) => alloc_status(&api, &id, verbose),
        Command::Alloc(AllocCommand::Stop { id, detach }) => alloc_stop(&api, &id, detach),
        Command::Alloc(AllocCommand::Fs { id, path, stat }) => logs::alloc_fs(&api, &id, path.as_deref(), stat),
        Command::Alloc(AllocCommand::Exec {
            interactive,
            tty,
            task,
            id,
            command,
        }) => exec::alloc_exec(&api, &id, task, command, interactive, tty),
        Command::Alloc(AllocCommand::Logs {
            id,
            task,
            task_flag,
            stderr,
            follow,
            tail,
            lines,
            bytes,
        }) => {
            let options = logs::LogsOptions {
                task: task_flag.or(task),
                stderr,
                follow,
                tail,
                lines,
                bytes,
            };
            logs::alloc_logs(&api, &id, options)
        }
        Command::Alloc(AllocCommand::Restart { id, task, task_flag }) => {
            alloc_restart(&api, &id, task_flag.or(task).as_deref())
        }
        Command::Alloc(AllocCommand::Signal {
            id,
            task,
            task_flag,
            signal,
        }) => alloc_signal(&api, &id, task_flag.or(task).as_deref(), signal.as_deref()),
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
        Command::Volume(VolumeCommand::Create { file }) => volume::volume_create(&api, &file),
        Command::Volume(VolumeCommand::Delete { id, secrets }) => volume::volume_delete(&api, &id, &secrets),
        Command::Volume(VolumeCommand::Status { id, verbose }) => volume_status(&api, id.as_deref(), verbose),
        Command::Volume(VolumeCommand::Snapshot(command)) => volume_snapshot::run(&api, command),
        Command::Volume(VolumeCommand::Deregister { id, force }) => api
            .call("DELETE", &format!("/v1/volume/csi/{id}?force={force}"), None)
            .map(|_| println!("Successfully deregistered volume {id:?}!")),
        Command::Volume(VolumeCommand::Detach { id, node }) => api
            .call("DELETE", &format!("/v1/volume/csi/{id}/detach?node={node}"), None)
            .map(|_| println!("Successfully detached volume {id:?} from node {node:?}")),
        Command::Plugin(PluginCommand::Status { id }) => plugin_status(&api, id.as_deref()),
        Command::Server(ServerCommand::Members) => server_members(&api),
        Command::Server(ServerCommand::Join(args)) => operator::join(&api, args),
        Command::Server(ServerCommand::ForceLeave(args)) => operator::force_leave(&api, args),
        Command::Operator(OperatorCommand::Raft(RaftCommand::RemovePeer(args))) => operator::remove_peer(&api, args),
        Command::Operator(OperatorCommand::Autopilot(command)) => operator::autopilot(&api, command),
        Command::System(SystemCommand::Gc) => api.call("PUT", "/v1/system/gc", None).map(|_| ()),
        Command::System(SystemCommand::Reconcile(ReconcileCommand::Summaries)) => api
            .call("PUT", "/v1/system/reconcile/summaries", None)
            .map(|_| println!("Reconciled summaries for all jobs")),
        Command::Operator(OperatorCommand::Raft(RaftCommand::ListPeers)) => list_peers(&api),
        Command::Operator(OperatorCommand::Gossip(command)) => keyring::run(&api, command),
        Command::Operator(OperatorCommand::Root(command)) => rootkeys::run(&api, command),
        Command::Acl(command) => acl::run(&api, command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message, code)) => {
            if !message.is_empty() {
                eprintln!("{message}");
            }
            ExitCode::from(code)
        }
    }
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
