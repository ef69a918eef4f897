//! Simulated Consul: an in-memory catalog behind an agent that can be healthy, down (refuses at
//! once), hung (never answers) or slow (answers after the caller's deadline). Mirrors
//! `drover-io-real`'s `consul.rs`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::services::{RegisteredService, SIDECAR_SUFFIX, TaskServiceRegistration};
use drover_core::rpc::{ConsulAclCall, ConsulAclError, ConsulAclReply};
use drover_io_real::client::TaskServices;
use drover_io_real::io::{BoxFuture, Consul, ServiceRegistration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsulMode {
    Healthy,
    Down,
    Hang,
    Slow,
    /// Agents answer; ACL calls fail now and then: a third with a 500 before doing anything,
    /// a third after doing it (the answer is lost: a created token Consul keeps).
    Flaky,
}

const HEALTHY_LATENCY: Duration = Duration::from_millis(3);
const SLOW_LATENCY: Duration = Duration::from_secs(12);

#[derive(Debug)]
struct State {
    mode: ConsulMode,
    services: BTreeMap<String, ServiceRegistration>,
    /// Task services each node's local agent holds: node → id → service.
    agents: BTreeMap<String, BTreeMap<String, RegisteredService>>,
    /// The checks of those services: node → check id → (service id, whether it has run).
    /// Like Consul's, a new check is `critical` until it has run, here until the first read
    /// after its registration; then it passes.
    checks: BTreeMap<String, BTreeMap<String, (String, bool)>>,
    /// ACL tokens alive: accessor → (secret, description, service identity).
    tokens: BTreeMap<String, SimToken>,
    /// Numbers the tokens (deterministic ids).
    tokens_made: u64,
    calls: u64,
    /// `consul connect envoy -bootstrap` fails whatever the mode (the agent answers 500).
    envoy_refused: bool,
}

/// A service identity token the simulated Consul holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimToken {
    pub secret_id: String,
    pub description: String,
    pub service_name: String,
}

/// One Consul cluster shared by every agent of a run.
#[derive(Clone, Debug)]
pub struct SimConsul {
    state: Arc<Mutex<State>>,
}

impl Default for SimConsul {
    fn default() -> Self {
        SimConsul {
            state: Arc::new(Mutex::new(State {
                mode: ConsulMode::Healthy,
                services: BTreeMap::new(),
                agents: BTreeMap::new(),
                checks: BTreeMap::new(),
                tokens: BTreeMap::new(),
                tokens_made: 0,
                calls: 0,
                envoy_refused: false,
            })),
        }
    }
}

impl SimConsul {
    /// The ACL tokens alive, by accessor (for invariants).
    pub fn tokens(&self) -> BTreeMap<String, SimToken> {
        self.state.lock().expect("consul lock").tokens.clone()
    }

    /// How many ACL tokens Consul ever created.
    pub fn tokens_made(&self) -> u64 {
        self.state.lock().expect("consul lock").tokens_made
    }

    pub fn set_mode(&self, mode: ConsulMode) {
        self.state.lock().expect("consul lock").mode = mode;
    }

    /// While `refused`, every client's Envoy bootstrap fails (Consul's agent answers 500).
    pub fn refuse_envoy_bootstrap(&self, refused: bool) {
        self.state.lock().expect("consul lock").envoy_refused = refused;
    }

    pub fn mode(&self) -> ConsulMode {
        self.state.lock().expect("consul lock").mode
    }

    /// The local Consul agent of one client node (its task services).
    pub fn agent(&self, node: &str) -> SimConsulAgent {
        SimConsulAgent {
            consul: self.clone(),
            node: node.to_string(),
        }
    }

    /// Task service ids every node's agent holds: (node, id).
    pub fn task_services(&self) -> Vec<(String, String)> {
        let state = self.state.lock().expect("consul lock");
        state
            .agents
            .iter()
            .flat_map(|(node, services)| services.keys().map(move |id| (node.clone(), id.clone())))
            .collect()
    }

    /// A node's machine died with its local agent: the catalog drops the node's services,
    /// as Consul reaps a failed node.
    pub fn lose_agent(&self, node: &str) {
        self.state.lock().expect("consul lock").agents.remove(node);
    }

    pub fn calls(&self) -> u64 {
        self.state.lock().expect("consul lock").calls
    }

    /// Waits as the current mode says; `Err` when Consul refuses.
    async fn gate(&self) -> Result<(), String> {
        let mode = {
            let mut state = self.state.lock().expect("consul lock");
            state.calls += 1;
            state.mode
        };
        match mode {
            ConsulMode::Healthy => {
                tokio::time::sleep(HEALTHY_LATENCY).await;
                Ok(())
            }
            ConsulMode::Down => {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Err("dial tcp 127.0.0.1:8500: connect: connection refused".to_string())
            }
            ConsulMode::Hang => std::future::pending().await,
            ConsulMode::Slow => {
                tokio::time::sleep(SLOW_LATENCY).await;
                Ok(())
            }
            ConsulMode::Flaky => {
                tokio::time::sleep(HEALTHY_LATENCY).await;
                Ok(())
            }
        }
    }
}

impl Consul for SimConsul {
    async fn catalog_service(&self, service: &str, tag: &str) -> Result<Vec<SocketAddr>, String> {
        self.gate().await?;
        let state = self.state.lock().expect("consul lock");
        Ok(state
            .services
            .values()
            .filter(|registration| registration.name == service && registration.tags.iter().any(|t| t == tag))
            .map(|registration| registration.addr)
            .collect())
    }

    async fn register_service(&self, registration: ServiceRegistration) -> Result<(), String> {
        self.gate().await?;
        let mut state = self.state.lock().expect("consul lock");
        state.services.insert(registration.id.clone(), registration);
        Ok(())
    }

    async fn acl_call(&self, call: ConsulAclCall) -> Result<ConsulAclReply, ConsulAclError> {
        self.gate().await.map_err(|message| ConsulAclError {
            message,
            retryable: true,
            not_found: false,
        })?;
        let flake = (self.mode() == ConsulMode::Flaky).then(|| drover_io_real::runtime::random::<u8>() % 3);
        let server_error = || ConsulAclError {
            message: "Unexpected response code: 500 (rpc error: Raft leadership lost)".into(),
            retryable: true,
            not_found: false,
        };
        if flake == Some(0) {
            return Err(server_error());
        }
        let result = self.acl_apply(call);
        if flake == Some(1) {
            return Err(ConsulAclError {
                message: "read tcp 127.0.0.1:8500: connection reset by peer".into(),
                ..server_error()
            });
        }
        result
    }
}

impl SimConsul {
    fn acl_apply(&self, call: ConsulAclCall) -> Result<ConsulAclReply, ConsulAclError> {
        let mut state = self.state.lock().expect("consul lock");
        match call {
            ConsulAclCall::CreateToken {
                description,
                service_name,
            } => {
                state.tokens_made += 1;
                let n = state.tokens_made;
                let accessor_id = format!("00000000-0000-0000-0000-{n:012x}");
                let secret_id = format!("ffffffff-0000-0000-0000-{n:012x}");
                state.tokens.insert(
                    accessor_id.clone(),
                    SimToken {
                        secret_id: secret_id.clone(),
                        description,
                        service_name,
                    },
                );
                Ok(ConsulAclReply::Created { accessor_id, secret_id })
            }
            ConsulAclCall::ListTokens => Ok(ConsulAclReply::Tokens(
                state
                    .tokens
                    .iter()
                    .map(|(accessor_id, token)| drover_core::rpc::ConsulToken {
                        accessor_id: accessor_id.clone(),
                        description: token.description.clone(),
                    })
                    .collect(),
            )),
            ConsulAclCall::RevokeToken { accessor_id } => match state.tokens.remove(&accessor_id) {
                Some(_) => Ok(ConsulAclReply::Revoked),
                None => Err(ConsulAclError {
                    message: format!("/v1/acl/token/{accessor_id}: HTTP 404: ACL not found"),
                    retryable: false,
                    not_found: true,
                }),
            },
        }
    }
}

/// One node's local Consul agent, as the client's service sync sees it (same modes as the
/// cluster: down, hung or slow agents fail or stall the sync).
#[derive(Clone, Debug)]
pub struct SimConsulAgent {
    consul: SimConsul,
    node: String,
}

impl SimConsulAgent {
    /// What `consul connect envoy -bootstrap -sidecar-for <id> [-token <secret>]` prints: the
    /// agent must hold the sidecar Consul derived from service `sidecar_for`, and a token must
    /// be one Consul knows, for that service.
    pub async fn envoy_bootstrap(&self, sidecar_for: &str, token: Option<&str>) -> Result<String, String> {
        self.consul.gate().await?;
        let state = self.consul.state.lock().expect("consul lock");
        if state.envoy_refused {
            return Err("failed fetch proxy config from local agent: Unexpected response code: 500".into());
        }
        let sidecar_id = format!("{sidecar_for}{SIDECAR_SUFFIX}");
        let Some(sidecar) = state
            .agents
            .get(&self.node)
            .and_then(|services| services.get(&sidecar_id))
        else {
            return Err(format!("No sidecar proxy registered for {sidecar_for}"));
        };
        if let Some(secret) = token {
            let service = sidecar.name.trim_end_matches(SIDECAR_SUFFIX);
            match state.tokens.values().find(|token| token.secret_id == secret) {
                Some(token) if token.service_name == service => {}
                Some(token) => {
                    return Err(format!(
                        "Permission denied: token for {:?} used for {service:?}",
                        token.service_name
                    ));
                }
                None => return Err("ACL not found".to_string()),
            }
        }
        Ok(serde_json::json!({
            "node": {"id": sidecar_id, "cluster": sidecar.name},
            "token": token.unwrap_or_default(),
        })
        .to_string())
    }
}

impl TaskServices for SimConsulAgent {
    fn agent_services(&self) -> BoxFuture<Result<BTreeMap<String, RegisteredService>, String>> {
        let agent = self.clone();
        Box::pin(async move {
            agent.consul.gate().await?;
            let state = agent.consul.state.lock().expect("consul lock");
            Ok(state.agents.get(&agent.node).cloned().unwrap_or_default())
        })
    }

    fn register(&self, registration: TaskServiceRegistration, _address: IpAddr) -> BoxFuture<Result<(), String>> {
        let agent = self.clone();
        Box::pin(async move {
            agent.consul.gate().await?;
            let mut state = agent.consul.state.lock().expect("consul lock");
            let checks = state.checks.entry(agent.node.clone()).or_default();
            // Registered again, a check keeps its status, as in Consul's agent.
            checks.retain(|id, (service, _)| {
                *service != registration.id || registration.checks.iter().any(|check| check.id == *id)
            });
            for check in &registration.checks {
                checks
                    .entry(check.id.clone())
                    .or_insert_with(|| (registration.id.clone(), false));
            }
            let services = state.agents.entry(agent.node.clone()).or_default();
            // Like Consul's agent, a Connect sidecar is registered with its parent.
            if let Some(sidecar) = registration
                .connect
                .as_ref()
                .and_then(|connect| connect.sidecar.as_ref())
            {
                services.insert(
                    format!("{}{SIDECAR_SUFFIX}", registration.id),
                    RegisteredService {
                        name: format!("{}{SIDECAR_SUFFIX}", registration.name),
                        tags: sidecar.tags.clone(),
                        meta: BTreeMap::new(),
                        port: sidecar.port,
                    },
                );
            }
            services.insert(
                registration.id.clone(),
                RegisteredService {
                    name: registration.name,
                    tags: registration.tags,
                    meta: registration.meta,
                    port: registration.port,
                },
            );
            Ok(())
        })
    }

    fn deregister(&self, id: String) -> BoxFuture<Result<(), String>> {
        let agent = self.clone();
        Box::pin(async move {
            agent.consul.gate().await?;
            let mut state = agent.consul.state.lock().expect("consul lock");
            if let Some(services) = state.agents.get_mut(&agent.node) {
                services.remove(&id);
                services.remove(&format!("{id}{SIDECAR_SUFFIX}"));
            }
            if let Some(checks) = state.checks.get_mut(&agent.node) {
                checks.retain(|_, (service, _)| *service != id);
            }
            Ok(())
        })
    }

    fn agent_checks(&self) -> BoxFuture<Result<BTreeMap<String, String>, String>> {
        let agent = self.clone();
        Box::pin(async move {
            agent.consul.gate().await?;
            let mut state = agent.consul.state.lock().expect("consul lock");
            let checks = state.checks.entry(agent.node.clone()).or_default();
            Ok(checks
                .iter_mut()
                .map(|(id, (_, ran))| {
                    let status = if core::mem::replace(ran, true) {
                        "passing"
                    } else {
                        "critical"
                    };
                    (id.clone(), status.to_string())
                })
                .collect())
        })
    }

    fn fingerprint(&self) -> BoxFuture<Result<BTreeMap<String, String>, String>> {
        let agent = self.clone();
        Box::pin(async move {
            agent.consul.gate().await?;
            Ok([
                ("consul.server", "false"),
                ("consul.version", SIM_CONSUL_VERSION),
                ("consul.revision", "sim"),
                ("unique.consul.name", agent.node.as_str()),
                ("consul.datacenter", "dc1"),
                ("consul.connect", "true"),
                ("consul.grpc", "8502"),
            ]
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect())
        })
    }

    fn supported_proxies(&self) -> BoxFuture<Result<BTreeMap<String, Vec<String>>, String>> {
        let agent = self.clone();
        Box::pin(async move {
            agent.consul.gate().await?;
            // Consul 1.9.5's own list.
            let envoy = ["1.16.2", "1.15.3", "1.14.6", "1.13.7"];
            Ok(BTreeMap::from([(
                "envoy".to_string(),
                envoy.iter().map(|version| version.to_string()).collect(),
            )]))
        })
    }
}

/// The version the simulated agents report (`${attr.consul.version}`).
pub const SIM_CONSUL_VERSION: &str = "1.9.5";
