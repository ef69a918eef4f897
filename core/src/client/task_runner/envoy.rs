//! The `envoy_bootstrap` hook (reference §5.2): a Connect sidecar task (`connect-proxy:<svc>`)
//! gets Envoy's bootstrap configuration in `secrets/envoy_bootstrap.json` before it starts,
//! written by `consul connect envoy ... -bootstrap -sidecar-for <service id>`.
//!
//! The service identity token the `consul_si_token` hook left in `secrets/si_token` (if any)
//! is read first and passed as `-token <secret>` (two arguments, as Nomad does). Consul
//! registers the sidecar asynchronously with the group's services, so a failed run is tried
//! again [`ENVOY_BOOTSTRAP_WAIT`] later, [`ENVOY_BOOTSTRAP_TRIES`] runs in all; the last
//! failure is recoverable (the restart policy decides). The task's environment gains
//! `NOMAD_ENVOY_ADMIN_ADDR_<service>`.
//!
//! Host networking: `-grpc-addr` is Consul's gRPC address (`consul { grpc_address }`), and
//! the admin API binds `127.0.0.2:<the service's port>` (unique per allocation on a host, as
//! later Nomad does in host mode), where bridge mode's `localhost:19000 + index` would
//! collide. In the allocation's own network (bridge mode), as Nomad: `-grpc-addr
//! unix://alloc/tmp/consul_grpc.sock` (the `consul_grpc_socket` hook's) and `localhost:19000 +
//! the service's index`.

use super::*;
use core::time::Duration;

use crate::client::services::group_service_id;
use crate::client::task_runner::sids::SI_TOKEN_FILE;

/// The bootstrap file in the task's `secrets` directory.
pub const ENVOY_BOOTSTRAP_FILE: &str = "envoy_bootstrap.json";
/// It may hold the service identity token, so it is read-only, as the token is.
pub const ENVOY_BOOTSTRAP_MODE: u32 = 0o440;
/// Runs of `consul connect envoy` before the hook fails.
pub const ENVOY_BOOTSTRAP_TRIES: u32 = 3;
/// The wait between two runs.
pub const ENVOY_BOOTSTRAP_WAIT: Duration = Duration::from_secs(2);
/// The prefix of the admin address variable (`NOMAD_ENVOY_ADMIN_ADDR_<service>`).
pub const ENVOY_ADMIN_ADDR_PREFIX: &str = "NOMAD_ENVOY_ADMIN_ADDR_";

/// Where the hook is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Reading the service identity token, if the sids hook wrote one.
    ReadingToken { op: OpId },
    /// Run `tries` (1-based) of the bootstrap command.
    Running {
        op: OpId,
        tries: u32,
        token: Option<String>,
    },
    Waiting {
        until: Instant,
        tries: u32,
        token: Option<String>,
    },
}

impl Step {
    pub(super) fn op(&self) -> Option<OpId> {
        match self {
            Step::ReadingToken { op } | Step::Running { op, .. } => Some(*op),
            Step::Waiting { .. } => None,
        }
    }
}

/// Nomad's `helper.CleanEnvVar(_, '_')`: anything not a letter, digit or `_` becomes `_`.
pub fn clean_env_var(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

impl TaskRunner {
    fn secrets_path(&self, file: &str) -> String {
        let dir = self.spec.paths.task_dir(&self.spec.alloc_id, &self.spec.task.name);
        paths::join(&paths::join(&dir, "secrets"), file)
    }

    fn envoy_io(&mut self, index: usize, step: impl FnOnce(OpId) -> Step, io: Io, ops: &mut OpIds) {
        let op = ops.allocate();
        self.phase = Phase::Envoy { index, step: step(op) };
        self.actions.push(TaskAction::Io { op, io });
    }

    /// The group service this sidecar fronts.
    fn proxied(&self) -> Option<&crate::structs::Service> {
        let name = crate::connect::proxied_service(&self.spec.task)?;
        self.spec.group.services.iter().find(|service| service.name == name)
    }

    /// Whether the group has a network of its own (bridge mode).
    fn own_network(&self) -> bool {
        self.spec
            .group
            .networks
            .first()
            .is_some_and(|network| network.mode == crate::structs::NETWORK_MODE_BRIDGE)
    }

    /// Consul's gRPC address as Envoy reaches it: in the allocation's own network, through
    /// the `consul_grpc_socket` hook's socket (a path relative to `/`, where `/alloc` is);
    /// else Consul's own.
    fn envoy_grpc_addr(&self) -> String {
        if self.own_network() {
            format!("unix://alloc/{}", paths::CONSUL_GRPC_SOCKET)
        } else {
            self.spec.consul.grpc_addr.clone()
        }
    }

    /// `127.0.0.2:<service port>` on the host's network (see the module doc); in the
    /// allocation's own, Nomad's `localhost:19000 + <the service's index>`, unique among the
    /// group's sidecars sharing it.
    fn envoy_admin_bind(&self, service: &crate::structs::Service) -> String {
        if self.own_network() {
            let index = self
                .spec
                .group
                .services
                .iter()
                .position(|other| other.name == service.name)
                .unwrap_or(0);
            return format!("localhost:{}", 19000 + index);
        }
        let port = self
            .spec
            .env
            .ports
            .iter()
            .find(|port| port.label == service.port_label)
            .map(|port| port.value)
            .or_else(|| service.port_label.parse().ok())
            .unwrap_or(19000);
        format!("127.0.0.2:{port}")
    }

    pub(super) fn envoy_prestart(&mut self, now: Instant, index: usize, ops: &mut OpIds) {
        if self.proxied().is_none() {
            let message = format!(
                "envoy_bootstrap: task {} does not front a group service",
                self.spec.task.name
            );
            self.prestart_failed(now, HookError::fatal(message), ops);
            return;
        }
        let path = self.secrets_path(SI_TOKEN_FILE);
        self.envoy_io(index, |op| Step::ReadingToken { op }, Io::ReadFile { path }, ops);
    }

    /// `consul connect envoy -grpc-addr .. -http-addr .. -admin-bind .. -bootstrap
    /// -sidecar-for <id> [-token <secret>] [-ca-file ..] [-client-cert ..] [-client-key ..]`,
    /// with Consul's TLS switches and auth in its environment.
    fn envoy_run(&mut self, index: usize, tries: u32, token: Option<String>, ops: &mut OpIds) {
        let service = self.proxied().cloned().expect("checked at prestart");
        let consul = &self.spec.consul;
        let grpc_addr = self.envoy_grpc_addr();
        let mut args: Vec<String> = [
            "connect",
            "envoy",
            "-grpc-addr",
            &grpc_addr,
            "-http-addr",
            &consul.http_addr,
            "-admin-bind",
            &self.envoy_admin_bind(&service),
            "-bootstrap",
            "-sidecar-for",
            &group_service_id(&self.spec.alloc_id, &self.spec.group.name, &service),
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        if let Some(token) = &token {
            args.push("-token".into());
            args.push(token.clone());
        }
        args.extend(consul.transport.cli_args());
        let io = Io::RunCommand {
            program: consul.binary.clone(),
            args,
            env: consul.transport.cli_env(),
            stdout_path: self.secrets_path(ENVOY_BOOTSTRAP_FILE),
            mode: ENVOY_BOOTSTRAP_MODE,
        };
        self.envoy_io(index, |op| Step::Running { op, tries, token }, io, ops);
    }

    pub(super) fn envoy_outcome(&mut self, now: Instant, index: usize, step: Step, outcome: Outcome, ops: &mut OpIds) {
        match step {
            Step::ReadingToken { .. } => match outcome {
                Ok(Reply::File(token)) => {
                    let token = token
                        .map(|token| token.trim().to_string())
                        .filter(|token| !token.is_empty());
                    self.envoy_run(index, 1, token, ops);
                }
                Ok(other) => self.envoy_failed(now, format!("unexpected reply {other:?}"), ops),
                Err(error) => self.envoy_failed(now, format!("failed to read SI token: {error}"), ops),
            },
            Step::Running { tries, token, .. } => match outcome {
                Ok(_) => self.envoy_done(now, index, ops),
                Err(error) if tries < ENVOY_BOOTSTRAP_TRIES => {
                    tracing::debug!(task = %self.spec.task.name, %error, tries, "envoy bootstrap failed; trying again");
                    self.phase = Phase::Envoy {
                        index,
                        step: Step::Waiting {
                            until: now + ENVOY_BOOTSTRAP_WAIT,
                            tries: tries + 1,
                            token,
                        },
                    };
                }
                Err(error) => self.envoy_failed(now, error.to_string(), ops),
            },
            Step::Waiting { .. } => {}
        }
    }

    pub(super) fn envoy_timeout(&mut self, now: Instant, ops: &mut OpIds) {
        if let Phase::Envoy {
            index,
            step: Step::Waiting {
                until,
                tries,
                ref token,
            },
        } = self.phase
            && now >= until
        {
            let token = token.clone();
            self.envoy_run(index, tries, token, ops);
        }
    }

    /// Bootstrapped: done for this task; the admin address stays in its environment.
    fn envoy_done(&mut self, now: Instant, index: usize, ops: &mut OpIds) {
        let service = self.proxied().cloned().expect("checked at prestart");
        let env = BTreeMap::from([(
            clean_env_var(&format!("{ENVOY_ADMIN_ADDR_PREFIX}{}", service.name)),
            self.envoy_admin_bind(&service),
        )]);
        self.hook_env.extend(env.clone());
        let state = HookState {
            prestart_done: true,
            env,
            ..HookState::default()
        };
        let name = TaskHook::EnvoyBootstrap.name();
        if self.local.hooks.get(name) != Some(&state) {
            self.local.hooks.insert(name.to_string(), state);
            self.persist();
        }
        self.next_hook(index);
        self.run_prestart(now, ops);
    }

    fn envoy_failed(&mut self, now: Instant, why: String, ops: &mut OpIds) {
        let message = format!("error creating bootstrap configuration for Connect proxy sidecar: {why}");
        self.prestart_failed(now, HookError::recoverable(message), ops);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_var_names_are_cleaned_as_nomad_does() {
        assert_eq!(
            clean_env_var("NOMAD_ENVOY_ADMIN_ADDR_count-api.v2"),
            "NOMAD_ENVOY_ADMIN_ADDR_count_api_v2"
        );
    }
}
