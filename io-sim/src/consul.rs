//! Simulated Consul: an in-memory catalog behind an agent that can be healthy, down (refuses at
//! once), hung (never answers) or slow (answers after the caller's deadline). Mirrors
//! `drover-io-real`'s `consul.rs`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_io_real::io::{Consul, ServiceRegistration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsulMode {
    Healthy,
    Down,
    Hang,
    Slow,
}

const HEALTHY_LATENCY: Duration = Duration::from_millis(3);
const SLOW_LATENCY: Duration = Duration::from_secs(12);

#[derive(Debug)]
struct State {
    mode: ConsulMode,
    services: BTreeMap<String, ServiceRegistration>,
    calls: u64,
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
                calls: 0,
            })),
        }
    }
}

impl SimConsul {
    pub fn set_mode(&self, mode: ConsulMode) {
        self.state.lock().expect("consul lock").mode = mode;
    }

    pub fn mode(&self) -> ConsulMode {
        self.state.lock().expect("consul lock").mode
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
}
