use super::*;
use crate::structs::{JobType, NetworkResource, ServiceCheck};
use core::time::Duration;

fn connect_job(connect: ConsulConnect, networks: Vec<NetworkResource>) -> Job {
    let app = Task {
        name: "app".into(),
        driver: "raw_exec".into(),
        resources: TaskResources {
            cpu: 100,
            memory_mb: 64,
            ..TaskResources::default()
        },
        ..Task::default()
    };
    Job {
        id: "countdash".into(),
        name: "countdash".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "api".into(),
            count: 1,
            tasks: vec![app],
            networks,
            services: vec![Service {
                name: "count-api".into(),
                port_label: "http".into(),
                address_mode: "auto".into(),
                connect: Some(connect),
                ..Service::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn host_network() -> Vec<NetworkResource> {
    vec![NetworkResource {
        mode: "host".into(),
        dynamic_ports: vec![Port {
            label: "http".into(),
            ..Port::default()
        }],
        ..NetworkResource::default()
    }]
}

fn sidecar() -> ConsulConnect {
    ConsulConnect {
        sidecar_service: Some(ConsulSidecarService {
            proxy: Some(ConsulProxy {
                upstreams: vec![ConsulUpstream {
                    destination_name: "count-db".into(),
                    local_bind_port: 8080,
                    datacenter: String::new(),
                }],
                ..ConsulProxy::default()
            }),
            ..ConsulSidecarService::default()
        }),
        ..ConsulConnect::default()
    }
}

#[test]
fn a_sidecar_service_gets_nomads_injected_proxy_task_and_port() {
    let mut job = connect_job(sidecar(), host_network());
    mutate(&mut job).unwrap();
    let group = &job.task_groups[0];
    assert_eq!(group.tasks.len(), 2);
    let proxy = &group.tasks[1];
    assert_eq!(proxy.name, "connect-proxy-count-api");
    assert_eq!(proxy.kind, "connect-proxy:count-api");
    assert_eq!(proxied_service(proxy), Some("count-api"));
    assert!(is_connect_task(proxy) && !is_connect_task(&group.tasks[0]));
    assert_eq!(proxy.driver, "docker");
    assert_eq!(proxy.config["image"], ConfigValue::String(SIDECAR_IMAGE.into()));
    // Host networking: Envoy binds the proxy's host port itself.
    assert_eq!(proxy.config["network_mode"], ConfigValue::String("host".into()));
    let ConfigValue::List(args) = &proxy.config["args"] else {
        panic!("args")
    };
    assert_eq!(args[1], ConfigValue::String(ENVOY_BOOTSTRAP_PATH.into()));
    assert_eq!((proxy.resources.cpu, proxy.resources.memory_mb), (250, 128));
    assert_eq!(
        proxy.lifecycle,
        Some(TaskLifecycle {
            hook: "prestart".into(),
            sidecar: true
        })
    );
    assert_eq!(proxy.constraints[0].ltarget, "${attr.consul.version}");
    let labels: Vec<&str> = group.networks[0].ports().map(|port| port.label.as_str()).collect();
    assert_eq!(labels, ["http", "connect-proxy-count-api"]);
    assert_eq!(group.networks[0].dynamic_ports[1].to, -1);
    assert!(
        crate::jobspec::validate(&job).is_empty(),
        "{:?}",
        crate::jobspec::validate(&job)
    );
    // Registering the mutated job again changes nothing (no second task, no second port).
    let again = {
        let mut again = job.clone();
        mutate(&mut again).unwrap();
        again
    };
    assert_eq!(again, job);
}

#[test]
fn sidecar_task_overrides_merge_into_the_injected_task() {
    let mut connect = sidecar();
    let mut config = BTreeMap::new();
    config.insert("command".to_string(), ConfigValue::String("/usr/bin/envoy".into()));
    connect.sidecar_task = Some(SidecarTask {
        driver: "raw_exec".into(),
        config,
        env: [("LEVEL".to_string(), "debug".to_string())].into_iter().collect(),
        resources: Some(TaskResources {
            cpu: 100,
            memory_mb: 32,
            ..TaskResources::default()
        }),
        kill_timeout: Some(Duration::from_secs(2)),
        ..SidecarTask::default()
    });
    let mut job = connect_job(connect, host_network());
    mutate(&mut job).unwrap();
    let proxy = &job.task_groups[0].tasks[1];
    assert_eq!(proxy.driver, "raw_exec");
    // Another driver's config does not keep Docker's image and args.
    assert_eq!(proxy.config.keys().collect::<Vec<_>>(), ["command"]);
    assert_eq!(proxy.env["LEVEL"], "debug");
    assert_eq!((proxy.resources.cpu, proxy.resources.memory_mb), (100, 32));
    assert_eq!(proxy.kill_timeout, Duration::from_secs(2));
    assert_eq!(proxy.kind, "connect-proxy:count-api", "the kind is never overridden");
}

#[test]
fn a_task_already_named_like_the_sidecar_gets_a_stable_suffix() {
    let mut job = connect_job(sidecar(), host_network());
    job.task_groups[0].tasks[0].name = "connect-proxy-count-api".into();
    mutate(&mut job).unwrap();
    let names: Vec<&str> = job.task_groups[0].tasks.iter().map(|task| task.name.as_str()).collect();
    assert_eq!(names[0], "connect-proxy-count-api");
    assert!(
        names[1].starts_with("connect-proxy-count-api-") && names[1].len() == 30,
        "{names:?}"
    );
    let mut again = connect_job(sidecar(), host_network());
    again.task_groups[0].tasks[0].name = "connect-proxy-count-api".into();
    mutate(&mut again).unwrap();
    assert_eq!(again, job);
}

#[test]
fn a_native_service_marks_its_task_and_names_it() {
    let native = ConsulConnect {
        native: true,
        ..ConsulConnect::default()
    };
    let mut job = connect_job(native.clone(), host_network());
    mutate(&mut job).unwrap();
    let group = &job.task_groups[0];
    assert_eq!(group.tasks.len(), 1);
    assert_eq!(group.tasks[0].kind, "connect-native:count-api");
    assert!(is_connect_task(&group.tasks[0]));
    assert_eq!(group.services[0].task_name, "app");
    // Two tasks and no `task`: ambiguous, in Nomad's words.
    let mut two = connect_job(native, host_network());
    let mut other = two.task_groups[0].tasks[0].clone();
    other.name = "other".into();
    two.task_groups[0].tasks.push(other);
    assert_eq!(
        mutate(&mut two),
        Err("task for Consul Connect Native service api->count-api is ambiguous and must be set".into())
    );
    two.task_groups[0].services[0].task_name = "missing".into();
    assert_eq!(
        mutate(&mut two),
        Err("task missing named by Consul Connect Native service api->count-api does not exist".into())
    );
}

#[test]
fn invalid_connect_groups_are_named_with_nomads_texts() {
    // No network: nothing injected, and validation says why.
    let mut job = connect_job(sidecar(), Vec::new());
    mutate(&mut job).unwrap();
    assert_eq!(job.task_groups[0].tasks.len(), 1);
    let errors = crate::jobspec::validate(&job);
    assert!(
        errors.contains(
            &"Task group api validation failed: Consul Connect sidecars require exactly 1 network, found 0 in group \"api\""
                .to_string()
        ),
        "{errors:?}"
    );
    // Both a sidecar and native.
    let mut both = sidecar();
    both.native = true;
    let job = connect_job(both, host_network());
    let errors = crate::jobspec::validate(&job);
    assert!(
        errors.iter().any(|error| error
            .contains("Consul Connect must be exclusively native, make use of a sidecar, or represent a Gateway")),
        "{errors:?}"
    );
    // No port for the proxy to forward to; a tcp check.
    let mut job = connect_job(sidecar(), host_network());
    job.task_groups[0].services[0].port_label.clear();
    job.task_groups[0].services[0].checks.push(ServiceCheck {
        name: "alive".into(),
        check_type: "tcp".into(),
        port_label: "http".into(),
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(2),
        ..ServiceCheck::default()
    });
    let errors = validate_group(&job.task_groups[0]);
    assert_eq!(
        errors,
        [
            "Consul Connect sidecar service \"count-api\" requires a port label",
            "Check alive invalid: tcp checks are not valid for Connect enabled services"
        ]
    );
    // A group service on a port the group does not have.
    let mut job = connect_job(sidecar(), host_network());
    job.task_groups[0].services[0].port_label = "admin".into();
    let errors = crate::jobspec::validate(&job);
    assert!(
        errors.contains(
            &"Task group api validation failed: port label \"admin\" referenced by services count-api does not exist"
                .to_string()
        ),
        "{errors:?}"
    );
}

#[test]
fn lifecycle_hooks_are_checked() {
    let mut job = connect_job(sidecar(), host_network());
    job.task_groups[0].tasks[0].lifecycle = Some(TaskLifecycle {
        hook: "prerun".into(),
        sidecar: false,
    });
    assert_eq!(
        crate::jobspec::validate(&job),
        [
            "Task group api validation failed: Task app validation failed: Lifecycle validation failed: invalid hook: prerun"
        ]
    );
}
