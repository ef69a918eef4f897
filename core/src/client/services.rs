//! Task services in the local Consul agent (Nomad's `ServiceClient`, fed by the task
//! `consul_services` hook): what should be registered for the tasks running on this client,
//! and how to bring the agent there.
//!
//! [`service_sync`](crate::client::service_sync) reads what the agent holds, asks
//! [`plan_sync`] for the difference and carries it out, on every change and periodically
//! (anti-entropy). Only services whose id
//! carries [`TASK_SERVICE_PREFIX`] are Nomad's: anything else in the agent is left alone, and
//! any of ours that no running task wants is removed — after a crash or an agent restart too.
//! With `enable_tag_override` tags changed through Consul's catalog are not drift (§5.3,
//! Nomad #2057); a real change of the service (name, port, meta, or its tags in a new job
//! version) still re-registers it with the job's tags.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use crate::structs::{AllocatedResources, Service};

/// Ids of task services registered by a client (Nomad 0.11's `_nomad-task-` prefix).
pub const TASK_SERVICE_PREFIX: &str = "_nomad-task-";

/// One service as the agent should hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskServiceRegistration {
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub meta: BTreeMap<String, String>,
    pub enable_tag_override: bool,
    /// The host port of the service's `port` label (or a literal port with
    /// `address_mode = "driver"`); 0 when the service names none.
    pub port: u16,
    /// The address of the port's network; empty: the agent's own address.
    #[serde(default)]
    pub address: String,
}

/// What the agent holds for one service id.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegisteredService {
    pub name: String,
    pub tags: Vec<String>,
    pub meta: BTreeMap<String, String>,
    pub port: u16,
}

/// Nomad's service id: `_nomad-task-<alloc>-<task>-<service>-<port label>`.
pub fn service_id(alloc_id: &str, task: &str, service: &Service) -> String {
    format!(
        "{TASK_SERVICE_PREFIX}{alloc_id}-{task}-{}-{}",
        service.name, service.port_label
    )
}

/// The registrations for one running task's `service` blocks. A service's `port` label is
/// resolved against the allocation's ports (the task's own network first, then the group's)
/// and registered at the host address and port, as Nomad's `address_mode = "auto"`/`"host"`
/// do; a number is a literal port.
pub fn registrations(
    alloc_id: &str,
    task: &str,
    services: &[Service],
    ports: &AllocatedResources,
) -> Vec<TaskServiceRegistration> {
    services
        .iter()
        .map(|service| {
            let (port, address) = match ports.port(task, &service.port_label) {
                Some(allocated) => (allocated.value, allocated.host_ip.clone()),
                None => (service.port_label.parse().unwrap_or(0), String::new()),
            };
            TaskServiceRegistration {
                id: service_id(alloc_id, task, service),
                name: service.name.clone(),
                tags: service.tags.clone(),
                meta: service.meta.clone(),
                enable_tag_override: service.enable_tag_override,
                port,
                address,
            }
        })
        .collect()
}

/// The calls that bring the agent from `registered` to `desired`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncPlan {
    pub register: Vec<TaskServiceRegistration>,
    pub deregister: Vec<String>,
}

impl SyncPlan {
    pub fn is_empty(&self) -> bool {
        self.register.is_empty() && self.deregister.is_empty()
    }
}

/// Compares by id, in id order.
pub fn plan_sync(
    desired: &BTreeMap<String, TaskServiceRegistration>,
    registered: &BTreeMap<String, RegisteredService>,
) -> SyncPlan {
    let register = desired
        .values()
        .filter(|want| match registered.get(&want.id) {
            None => true,
            Some(have) => {
                have.name != want.name
                    || have.port != want.port
                    || have.meta != want.meta
                    || (!want.enable_tag_override && have.tags != want.tags)
            }
        })
        .cloned()
        .collect();
    let deregister = registered
        .keys()
        .filter(|id| id.starts_with(TASK_SERVICE_PREFIX) && !desired.contains_key(*id))
        .cloned()
        .collect();
    SyncPlan { register, deregister }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, tags: &[&str], override_tags: bool) -> Service {
        Service {
            name: name.into(),
            port_label: "8080".into(),
            address_mode: "driver".into(),
            tags: tags.iter().map(|tag| tag.to_string()).collect(),
            enable_tag_override: override_tags,
            ..Service::default()
        }
    }

    fn desired(services: &[Service]) -> BTreeMap<String, TaskServiceRegistration> {
        registrations("a1", "web", services, &AllocatedResources::default())
            .into_iter()
            .map(|registration| (registration.id.clone(), registration))
            .collect()
    }

    fn held(registration: &TaskServiceRegistration, tags: &[&str]) -> RegisteredService {
        RegisteredService {
            name: registration.name.clone(),
            tags: tags.iter().map(|tag| tag.to_string()).collect(),
            meta: registration.meta.clone(),
            port: registration.port,
        }
    }

    #[test]
    fn missing_services_register_and_strays_of_ours_go() {
        let want = desired(&[service("api", &["v1"], false)]);
        let id = "_nomad-task-a1-web-api-8080";
        assert_eq!(want[id].port, 8080);
        let mut have = BTreeMap::new();
        have.insert(
            "_nomad-task-gone-web-api-8080".to_string(),
            RegisteredService::default(),
        );
        have.insert("consul".to_string(), RegisteredService::default());
        let plan = plan_sync(&want, &have);
        assert_eq!(plan.register, vec![want[id].clone()]);
        assert_eq!(plan.deregister, vec!["_nomad-task-gone-web-api-8080".to_string()]);
    }

    #[test]
    fn tag_drift_is_left_alone_only_with_enable_tag_override() {
        for (override_tags, expect_register) in [(false, true), (true, false)] {
            let want = desired(&[service("api", &["v1"], override_tags)]);
            let registration = want.values().next().unwrap();
            let have = BTreeMap::from([(registration.id.clone(), held(registration, &["edited-in-consul"]))]);
            assert_eq!(
                !plan_sync(&want, &have).register.is_empty(),
                expect_register,
                "enable_tag_override = {override_tags}"
            );
        }
        // A real change (the port) re-registers even with the override.
        let want = desired(&[service("api", &["v1"], true)]);
        let registration = want.values().next().unwrap();
        let mut stale = held(registration, &["edited-in-consul"]);
        stale.port = 9090;
        let have = BTreeMap::from([(registration.id.clone(), stale)]);
        assert_eq!(plan_sync(&want, &have).register.len(), 1);
        // In sync: nothing to do.
        let have = BTreeMap::from([(registration.id.clone(), held(registration, &["v1"]))]);
        assert!(plan_sync(&want, &have).is_empty());
    }
}
