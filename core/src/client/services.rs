//! Task services in the local Consul agent (Nomad's `ServiceClient`, fed by the task
//! `consul_services` hook): what should be registered for the tasks running on this client,
//! and how to bring the agent there.
//!
//! [`service_sync`](crate::client::service_sync) reads what the agent holds, asks
//! [`plan_sync`] for the difference and carries it out, on every change and periodically
//! (anti-entropy). Only services whose id
//! carries [`TASK_SERVICE_PREFIX`] are Nomad's: anything else in the agent is left alone, and
//! any of ours that no running task wants is removed — after a crash or an agent restart too,
//! but not those of an allocation still starting: one restored after an agent restart runs its
//! prerun hooks again before its services are wanted, and removing them meanwhile would take a
//! running allocation out of Consul (Nomad holds back such removals for a probation period
//! after start; we hold them per allocation, until it runs or stops).
//! With `enable_tag_override` tags changed through Consul's catalog are not drift (§5.3,
//! Nomad #2057); a real change of the service (name, port, meta, or its tags in a new job
//! version) still re-registers it with the job's tags.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use crate::structs::{AllocatedResources, Service, ServiceCheck};

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
    /// The service's `check` blocks that Consul runs (http, tcp, grpc).
    #[serde(default)]
    pub checks: Vec<CheckRegistration>,
    /// `connect {}` of a group service: the sidecar Consul registers with it, or native.
    #[serde(default)]
    pub connect: Option<ConnectRegistration>,
}

/// One check Consul runs against a service, with Nomad's check id.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckRegistration {
    pub id: String,
    pub name: String,
    /// `http`, `tcp` or `grpc`.
    pub check_type: String,
    pub port: u16,
    /// Empty: the agent's own address (as for the service).
    pub address: String,
    pub path: String,
    pub protocol: String,
    pub method: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Consul's `Status` at registration (`""`: Consul's default).
    #[serde(default)]
    pub initial_status: String,
    #[serde(default)]
    pub grpc_service: String,
    #[serde(default)]
    pub grpc_use_tls: bool,
    #[serde(default)]
    pub tls_skip_verify: bool,
    #[serde(default)]
    pub header: BTreeMap<String, Vec<String>>,
}

/// How a Connect service is registered: native, or with a sidecar proxy service Consul
/// derives from the parent (id `<parent id>-sidecar-proxy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnectRegistration {
    pub native: bool,
    pub sidecar: Option<SidecarRegistration>,
}

/// The sidecar proxy's registration (Consul's `Connect.SidecarService`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SidecarRegistration {
    /// The proxy's public port (the injected `connect-proxy-<service>` dynamic port).
    pub port: u16,
    pub tags: Vec<String>,
    /// Where the proxy reaches the service it fronts.
    pub local_service_address: String,
    pub local_service_port: u16,
    pub upstreams: Vec<crate::connect::ConsulUpstream>,
    pub config: BTreeMap<String, crate::structs::ConfigValue>,
}

/// The id suffix of the sidecar service Consul registers for a Connect service.
pub const SIDECAR_SUFFIX: &str = "-sidecar-proxy";

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

/// Nomad's group service id: `_nomad-task-<alloc>-group-<group>-<service>-<port label>`.
pub fn group_service_id(alloc_id: &str, group: &str, service: &Service) -> String {
    service_id(alloc_id, &format!("group-{group}"), service)
}

/// Nomad's check id: `_nomad-check-<hash of the service id and the check>`.
pub fn check_id(service_id: &str, check: &ServiceCheck) -> String {
    let text = format!(
        "{service_id}|{}|{}|{}|{}|{}|{}|{:?}|{:?}",
        check.name,
        check.check_type,
        check.port_label,
        check.path,
        check.protocol,
        check.method,
        check.interval,
        check.timeout
    );
    format!("_nomad-check-{:016x}", fnv(&text))
}

fn fnv(text: &str) -> u64 {
    crate::hash::Fnv1a::default().bytes(text.as_bytes()).finish()
}

/// The registrations for one running task's `service` blocks. A service's `port` label is
/// resolved against the allocation's ports (the task's own network first, then the group's)
/// and registered at the host address and port, as Nomad's `address_mode = "auto"`/`"host"`
/// do; a number is a literal port. A `canary` allocation's services carry their
/// `canary_tags` in place of their `tags`, when they have some (Nomad's `canary_tags`).
pub fn registrations(
    alloc_id: &str,
    task: &str,
    services: &[Service],
    ports: &AllocatedResources,
    canary: bool,
) -> Vec<TaskServiceRegistration> {
    services
        .iter()
        .map(|service| registration(service_id(alloc_id, task, service), task, service, ports, canary))
        .collect()
}

/// The registrations for an allocation's group `service` blocks (Nomad registers them when
/// the allocation starts running, before and apart from its tasks); ports resolve against
/// the group's network.
pub fn group_registrations(
    alloc_id: &str,
    group: &str,
    services: &[Service],
    ports: &AllocatedResources,
    canary: bool,
    bridge: bool,
) -> Vec<TaskServiceRegistration> {
    services
        .iter()
        .map(|service| {
            let mut registration = registration(group_service_id(alloc_id, group, service), "", service, ports, canary);
            registration.connect = service
                .connect
                .as_ref()
                .map(|connect| connect_registration(service, connect, &registration, ports, bridge));
            registration
        })
        .collect()
}

/// The port a group service binds inside its allocation's own network: its label's `to`
/// port (or the host port, unmapped), or the literal number Nomad's Connect jobs write
/// (`port = "9001"`).
fn port_inside(label: &str, ports: &AllocatedResources) -> u16 {
    match ports.port("", label) {
        Some(allocated) => u16::try_from(allocated.task_port()).unwrap_or(allocated.value),
        None => label.parse().unwrap_or(0),
    }
}

/// A port label (or literal number) as the host port and its address.
fn resolve(task: &str, label: &str, ports: &AllocatedResources) -> (u16, String) {
    match ports.port(task, label) {
        Some(allocated) => (allocated.value, allocated.host_ip.clone()),
        None => (label.parse().unwrap_or(0), String::new()),
    }
}

fn registration(
    id: String,
    task: &str,
    service: &Service,
    ports: &AllocatedResources,
    canary: bool,
) -> TaskServiceRegistration {
    let (port, address) = resolve(task, &service.port_label, ports);
    let checks = service
        .checks
        .iter()
        .filter(|check| check.requires_port())
        .map(|check| {
            let (port, address) = if check.port_label.is_empty() {
                (port, address.clone())
            } else {
                resolve(task, &check.port_label, ports)
            };
            CheckRegistration {
                id: check_id(&id, check),
                name: check.name.clone(),
                check_type: check.check_type.clone(),
                port,
                address,
                path: check.path.clone(),
                protocol: check.protocol.clone(),
                method: check.method.clone(),
                interval_ms: check.interval.as_millis() as u64,
                timeout_ms: check.timeout.as_millis() as u64,
                initial_status: check.initial_status.clone(),
                grpc_service: check.grpc_service.clone(),
                grpc_use_tls: check.grpc_use_tls,
                tls_skip_verify: check.tls_skip_verify,
                header: check.header.clone(),
            }
        })
        .collect();
    TaskServiceRegistration {
        id,
        name: service.name.clone(),
        tags: if canary && !service.canary_tags.is_empty() {
            service.canary_tags.clone()
        } else {
            service.tags.clone()
        },
        meta: service.meta.clone(),
        enable_tag_override: service.enable_tag_override,
        port,
        address,
        checks,
        connect: None,
    }
}

/// The proxy listens on its dynamic port. Host networking: it reaches the service at the
/// service's own host address and port; in the allocation's own network (`bridge`), on
/// 127.0.0.1 at the port the service binds there, as Nomad registers it.
fn connect_registration(
    service: &Service,
    connect: &crate::connect::ConsulConnect,
    parent: &TaskServiceRegistration,
    ports: &AllocatedResources,
    bridge: bool,
) -> ConnectRegistration {
    let sidecar = connect.sidecar_service.as_ref().map(|sidecar| {
        let label = if sidecar.port.is_empty() {
            format!("{}-{}", crate::connect::CONNECT_PROXY_PREFIX, service.name)
        } else {
            sidecar.port.clone()
        };
        let proxy = sidecar.proxy.clone().unwrap_or_default();
        SidecarRegistration {
            port: resolve("", &label, ports).0,
            tags: if sidecar.tags.is_empty() {
                service.tags.clone()
            } else {
                sidecar.tags.clone()
            },
            local_service_address: if proxy.local_service_address.is_empty() {
                if parent.address.is_empty() || bridge {
                    "127.0.0.1".to_string()
                } else {
                    parent.address.clone()
                }
            } else {
                proxy.local_service_address
            },
            local_service_port: if proxy.local_service_port != 0 {
                proxy.local_service_port
            } else if bridge {
                port_inside(&service.port_label, ports)
            } else {
                parent.port
            },
            upstreams: proxy.upstreams,
            config: proxy.config,
        }
    });
    ConnectRegistration {
        native: connect.native,
        sidecar,
    }
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

/// What the client wants of the agent at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// The services to hold, by id.
    pub services: BTreeMap<String, TaskServiceRegistration>,
    /// Allocations still starting (prerun, not asked to stop): whatever the agent holds of
    /// theirs stays until they run or stop.
    pub starting: BTreeSet<String>,
}

impl Wanted {
    /// Just these services, no allocation starting.
    pub fn only(services: BTreeMap<String, TaskServiceRegistration>) -> Self {
        Wanted {
            services,
            starting: BTreeSet::new(),
        }
    }

    /// Whether `id` belongs to an allocation still starting.
    fn starting_owns(&self, id: &str) -> bool {
        let Some(rest) = id.strip_prefix(TASK_SERVICE_PREFIX) else {
            return false;
        };
        self.starting.iter().any(|alloc| {
            rest.strip_prefix(alloc.as_str())
                .is_some_and(|tail| tail.starts_with('-'))
        })
    }
}

/// Compares by id, in id order.
pub fn plan_sync(wanted: &Wanted, registered: &BTreeMap<String, RegisteredService>) -> SyncPlan {
    let desired = &wanted.services;
    let has_sidecar =
        |want: &TaskServiceRegistration| want.connect.as_ref().is_some_and(|connect| connect.sidecar.is_some());
    let register = desired
        .values()
        .filter(|want| match registered.get(&want.id) {
            None => true,
            Some(have) => {
                have.name != want.name
                    || have.port != want.port
                    || have.meta != want.meta
                    || (!want.enable_tag_override && have.tags != want.tags)
                    // Consul lost the sidecar it derived from this service: register again.
                    || (has_sidecar(want) && !registered.contains_key(&format!("{}{SIDECAR_SUFFIX}", want.id)))
            }
        })
        .cloned()
        .collect();
    // A sidecar is Consul's, derived from its parent: it stays while the parent is wanted.
    let is_desired = |id: &str| {
        desired.contains_key(id)
            || id
                .strip_suffix(SIDECAR_SUFFIX)
                .and_then(|parent| desired.get(parent))
                .is_some_and(has_sidecar)
    };
    let deregister = registered
        .keys()
        .filter(|id| id.starts_with(TASK_SERVICE_PREFIX) && !is_desired(id) && !wanted.starting_owns(id))
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
        registrations("a1", "web", services, &AllocatedResources::default(), false)
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
        let plan = plan_sync(&Wanted::only(want.clone()), &have);
        assert_eq!(plan.register, vec![want[id].clone()]);
        assert_eq!(plan.deregister, vec!["_nomad-task-gone-web-api-8080".to_string()]);
    }

    #[test]
    fn services_of_an_allocation_still_starting_stay_until_it_runs_or_stops() {
        // After an agent restart the restored allocation `a1` runs its prerun hooks again;
        // its services and the sidecar Consul derived are left alone meanwhile. `a10` shares
        // the prefix but is another allocation, and not starting: its service goes.
        let have = BTreeMap::from([
            (
                "_nomad-task-a1-group-api-api-http".to_string(),
                RegisteredService::default(),
            ),
            (
                "_nomad-task-a1-group-api-api-http-sidecar-proxy".to_string(),
                RegisteredService::default(),
            ),
            ("_nomad-task-a10-web-api-8080".to_string(), RegisteredService::default()),
        ]);
        let starting = Wanted {
            services: BTreeMap::new(),
            starting: BTreeSet::from(["a1".to_string()]),
        };
        assert_eq!(
            plan_sync(&starting, &have).deregister,
            vec!["_nomad-task-a10-web-api-8080".to_string()]
        );
        // Once it stops (or runs without them), they go.
        assert_eq!(plan_sync(&Wanted::default(), &have).deregister.len(), 3);
    }

    /// A canary's services carry their `canary_tags` instead of their tags, when they have
    /// some; once promoted (no longer a canary), their tags.
    #[test]
    fn a_canary_registers_its_canary_tags() {
        let service = |canary_tags: &[&str]| Service {
            name: "web".into(),
            tags: vec!["v1".into()],
            canary_tags: canary_tags.iter().map(|tag| tag.to_string()).collect(),
            ..Service::default()
        };
        let tags = |canary: bool, service: Service| {
            registrations(
                "a1",
                "t",
                core::slice::from_ref(&service),
                &AllocatedResources::default(),
                canary,
            )[0]
            .tags
            .clone()
        };
        assert_eq!(tags(true, service(&["canary"])), ["canary"]);
        assert_eq!(tags(false, service(&["canary"])), ["v1"]);
        assert_eq!(tags(true, service(&[])), ["v1"], "no canary tags: its tags");
        let group = group_registrations(
            "a1",
            "g",
            &[service(&["canary"])],
            &AllocatedResources::default(),
            true,
            false,
        );
        assert_eq!(group[0].tags, ["canary"]);
    }

    #[test]
    fn tag_drift_is_left_alone_only_with_enable_tag_override() {
        for (override_tags, expect_register) in [(false, true), (true, false)] {
            let want = desired(&[service("api", &["v1"], override_tags)]);
            let registration = want.values().next().unwrap();
            let have = BTreeMap::from([(registration.id.clone(), held(registration, &["edited-in-consul"]))]);
            assert_eq!(
                !plan_sync(&Wanted::only(want.clone()), &have).register.is_empty(),
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
        assert_eq!(plan_sync(&Wanted::only(want.clone()), &have).register.len(), 1);
        // In sync: nothing to do.
        let have = BTreeMap::from([(registration.id.clone(), held(registration, &["v1"]))]);
        assert!(plan_sync(&Wanted::only(want.clone()), &have).is_empty());
    }

    #[test]
    fn a_connect_group_service_registers_its_sidecar_and_checks() {
        use crate::connect::{ConsulConnect, ConsulSidecarService};
        use crate::structs::AllocatedPort;
        let service = Service {
            name: "count-api".into(),
            port_label: "http".into(),
            checks: vec![
                ServiceCheck {
                    name: "alive".into(),
                    check_type: "http".into(),
                    path: "/health".into(),
                    interval: core::time::Duration::from_secs(10),
                    timeout: core::time::Duration::from_secs(2),
                    ..ServiceCheck::default()
                },
                ServiceCheck {
                    name: "script".into(),
                    check_type: "script".into(),
                    command: "/bin/true".into(),
                    ..ServiceCheck::default()
                },
            ],
            connect: Some(ConsulConnect {
                sidecar_service: Some(ConsulSidecarService::default()),
                ..ConsulConnect::default()
            }),
            ..Service::default()
        };
        let port = |label: &str, value| AllocatedPort {
            label: label.into(),
            value,
            to: 0,
            host_ip: "10.0.0.5".into(),
        };
        let ports = AllocatedResources {
            ports: vec![port("http", 9001), port("connect-proxy-count-api", 21000)],
            ..AllocatedResources::default()
        };
        let registrations = group_registrations("a1", "api", core::slice::from_ref(&service), &ports, false, false);
        let [registration] = registrations.as_slice() else {
            panic!("{registrations:?}")
        };
        assert_eq!(registration.id, "_nomad-task-a1-group-api-count-api-http");
        assert_eq!((registration.port, registration.address.as_str()), (9001, "10.0.0.5"));
        // Script checks are run by Nomad, not Consul: only the http check is registered.
        let [check] = registration.checks.as_slice() else {
            panic!("{:?}", registration.checks)
        };
        assert_eq!(
            (check.check_type.as_str(), check.port, check.interval_ms),
            ("http", 9001, 10_000)
        );
        assert!(check.id.starts_with("_nomad-check-"));
        let sidecar = registration
            .connect
            .as_ref()
            .and_then(|connect| connect.sidecar.clone())
            .unwrap();
        assert_eq!(sidecar.port, 21000);
        assert_eq!(
            (sidecar.local_service_address.as_str(), sidecar.local_service_port),
            ("10.0.0.5", 9001)
        );
        // In the allocation's own network the proxy reaches the service on its loopback, at
        // the port it binds there: a label's `to`, or Nomad's literal `port = "9001"`.
        let mut bridged = ports.clone();
        bridged.ports[0].to = 8080;
        let inside = |service: &Service, ports: &AllocatedResources| {
            let registrations = group_registrations("a1", "api", core::slice::from_ref(service), ports, false, true);
            let sidecar = registrations[0].connect.as_ref().unwrap().sidecar.clone().unwrap();
            (sidecar.local_service_address, sidecar.local_service_port, sidecar.port)
        };
        assert_eq!(inside(&service, &bridged), ("127.0.0.1".to_string(), 8080, 21000));
        let literal = Service {
            port_label: "9001".into(),
            ..service.clone()
        };
        assert_eq!(inside(&literal, &bridged), ("127.0.0.1".to_string(), 9001, 21000));

        // The sidecar Consul derived is ours while its parent is wanted; a lost one is
        // re-created by registering the parent again; once the parent goes, so does it.
        let want = BTreeMap::from([(registration.id.clone(), registration.clone())]);
        let sidecar_id = format!("{}{SIDECAR_SUFFIX}", registration.id);
        let parent = held(registration, &[]);
        let both = BTreeMap::from([
            (registration.id.clone(), parent.clone()),
            (sidecar_id.clone(), RegisteredService::default()),
        ]);
        assert!(plan_sync(&Wanted::only(want.clone()), &both).is_empty());
        let parent_only = BTreeMap::from([(registration.id.clone(), parent)]);
        assert_eq!(plan_sync(&Wanted::only(want.clone()), &parent_only).register.len(), 1);
        let plan = plan_sync(&Wanted::default(), &both);
        assert_eq!(plan.deregister, vec![registration.id.clone(), sidecar_id]);
    }
}
