//! The port variables of a task's environment (Nomad's `addPorts`, `buildPortEnv` and the
//! other-task `addPort`), and the cleaning of their names.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use crate::structs::AllocatedPort;

fn join_host_port(ip: &str, port: impl core::fmt::Display) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The variables of the group network's ports, as every task of the allocation sees them:
/// `NOMAD_ADDR_`, `NOMAD_HOST_ADDR_`, `NOMAD_IP_`, `NOMAD_HOST_IP_`, `NOMAD_HOST_PORT_` (the
/// host's), `NOMAD_PORT_` and `NOMAD_ALLOC_PORT_` (what the task binds: `to` when mapped).
pub fn shared(vars: &mut BTreeMap<String, String>, ports: &[AllocatedPort]) {
    for port in ports {
        let label = &port.label;
        let addr = join_host_port(&port.host_ip, port.value);
        vars.insert(format!("NOMAD_ADDR_{label}"), addr.clone());
        vars.insert(format!("NOMAD_HOST_ADDR_{label}"), addr);
        vars.insert(format!("NOMAD_IP_{label}"), port.host_ip.clone());
        vars.insert(format!("NOMAD_HOST_IP_{label}"), port.host_ip.clone());
        vars.insert(format!("NOMAD_PORT_{label}"), port.task_port().to_string());
        vars.insert(format!("NOMAD_ALLOC_PORT_{label}"), port.task_port().to_string());
        vars.insert(format!("NOMAD_HOST_PORT_{label}"), port.value.to_string());
    }
}

/// The variables of the task's own `resources { network {} }` ports.
pub fn own(vars: &mut BTreeMap<String, String>, ports: &[AllocatedPort]) {
    for port in ports {
        let label = &port.label;
        let family = if port.host_ip.contains(':') {
            "NOMAD_IPv6_"
        } else {
            "NOMAD_IPv4_"
        };
        vars.insert(format!("NOMAD_IP_{label}"), port.host_ip.clone());
        vars.insert(format!("{family}{label}"), port.host_ip.clone());
        vars.insert(format!("NOMAD_HOST_PORT_{label}"), port.value.to_string());
        vars.insert(format!("NOMAD_ADDR_{label}"), join_host_port(&port.host_ip, port.value));
        vars.insert(format!("NOMAD_PORT_{label}"), port.value.to_string());
    }
}

/// The variables of another task's own ports: `NOMAD_{ADDR,IP,PORT}_<task>_<label>`.
pub fn other_task(vars: &mut BTreeMap<String, String>, task: &str, ports: &[AllocatedPort]) {
    for port in ports {
        let label = &port.label;
        vars.insert(
            format!("NOMAD_ADDR_{task}_{label}"),
            join_host_port(&port.host_ip, port.value),
        );
        vars.insert(format!("NOMAD_IP_{task}_{label}"), port.host_ip.clone());
        vars.insert(format!("NOMAD_PORT_{task}_{label}"), port.value.to_string());
    }
}

/// Prefixes whose variable names are cleaned (Nomad #2405): labels, task names and meta keys
/// may hold characters a shell variable cannot.
const CLEANED_PREFIXES: [&str; 5] = [
    "NOMAD_ADDR_",
    "NOMAD_IP_",
    "NOMAD_PORT_",
    "NOMAD_HOST_PORT_",
    "NOMAD_META_",
];

/// `label` with every character but letters, digits and `_` replaced by `_` (Nomad's
/// `CleanEnvVar`).
pub fn clean_label(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

/// `name` with every character but letters, digits and `_` replaced by `_` when it has one of
/// the cleaned prefixes (Nomad's `CleanEnvVar`).
pub fn clean_name(name: &str) -> String {
    if !CLEANED_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
        return name.to_string();
    }
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(label: &str, value: u16, to: i32) -> AllocatedPort {
        AllocatedPort {
            label: label.into(),
            value,
            to,
            host_ip: "10.0.0.5".into(),
        }
    }

    #[test]
    fn shared_ports_give_the_task_port_and_the_hosts() {
        let mut vars = BTreeMap::new();
        shared(&mut vars, &[port("http", 23456, 0), port("db", 24000, 5432)]);
        assert_eq!(vars["NOMAD_PORT_http"], "23456");
        assert_eq!(vars["NOMAD_ALLOC_PORT_http"], "23456");
        assert_eq!(vars["NOMAD_HOST_PORT_http"], "23456");
        assert_eq!(vars["NOMAD_IP_http"], "10.0.0.5");
        assert_eq!(vars["NOMAD_HOST_IP_http"], "10.0.0.5");
        assert_eq!(vars["NOMAD_ADDR_http"], "10.0.0.5:23456");
        assert_eq!(vars["NOMAD_HOST_ADDR_http"], "10.0.0.5:23456");
        assert_eq!(vars["NOMAD_PORT_db"], "5432", "a mapped port is the one the task binds");
        assert_eq!(vars["NOMAD_HOST_PORT_db"], "24000");
        assert_eq!(
            vars["NOMAD_ADDR_db"], "10.0.0.5:24000",
            "the address is always the host's"
        );
    }

    #[test]
    fn task_ports_and_other_tasks_ports() {
        let mut vars = BTreeMap::new();
        own(&mut vars, &[port("metrics", 21000, 0)]);
        other_task(&mut vars, "sidecar", &[port("admin", 21001, 0)]);
        assert_eq!(vars["NOMAD_PORT_metrics"], "21000");
        assert_eq!(vars["NOMAD_IPv4_metrics"], "10.0.0.5");
        assert_eq!(vars["NOMAD_ADDR_sidecar_admin"], "10.0.0.5:21001");
        assert_eq!(vars["NOMAD_PORT_sidecar_admin"], "21001");
    }

    #[test]
    fn names_with_prefixes_are_cleaned() {
        assert_eq!(clean_name("NOMAD_PORT_http-api"), "NOMAD_PORT_http_api");
        assert_eq!(clean_name("NOMAD_META_team.owner"), "NOMAD_META_team_owner");
        assert_eq!(clean_name("MY-VAR"), "MY-VAR", "only Nomad's prefixed names");
        let mut vars = BTreeMap::new();
        own(
            &mut vars,
            &[AllocatedPort {
                host_ip: "::1".into(),
                ..port("h", 1, 0)
            }],
        );
        assert_eq!(vars["NOMAD_ADDR_h"], "[::1]:1");
        assert_eq!(vars["NOMAD_IPv6_h"], "::1");
    }
}
