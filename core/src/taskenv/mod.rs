//! The task environment (Nomad's `client/taskenv`): the variables every task gets, and the
//! `${...}` interpolation of jobspec strings against them and against the node.
//!
//! A task's environment is built in Nomad's order, later layers winning: the runtime variables
//! (`NOMAD_ALLOC_ID`, `NOMAD_TASK_DIR`, `NOMAD_META_*`, ...), then what hooks add (a device
//! reservation's variables, a plugin's `CSI_ENDPOINT`), then the task's own `env` block, whose
//! values are themselves interpolated against everything before them.
//!
//! Interpolation replaces `${name}` where `name` is a variable of the environment
//! (`${NOMAD_ALLOC_INDEX}`), `env["NAME"]` (the same, HCL2's spelling), or a node value:
//! `attr.<key>`, `meta.<key>`, `node.unique.id`, `node.unique.name`, `node.datacenter`,
//! `node.region`, `node.class`. Anything else stays as written, as Nomad leaves it: a typo
//! shows up in the task's own output instead of vanishing.

mod ports;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::structs::{AllocatedPort, ConfigValue, Node, Service, ServiceCheck};

/// The node a task runs on, as interpolation sees it: its record and the agent's region.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEnv {
    pub node: Node,
    pub region: String,
}

impl NodeEnv {
    /// `node.region`, or any [`node_variable`].
    pub fn lookup(&self, name: &str) -> Option<&str> {
        if name == "node.region" {
            return Some(&self.region);
        }
        node_variable(&self.node, name)
    }
}

/// The node value a variable names: `node.unique.id`, `node.unique.name`, `node.datacenter`,
/// `node.class`, `attr.<key>` (fingerprinted attributes), `meta.<key>` (the client's `meta`).
/// One table for task interpolation and for the scheduler's constraints.
pub fn node_variable<'a>(node: &'a Node, name: &str) -> Option<&'a str> {
    let value = match name {
        "node.unique.id" => &node.id,
        "node.unique.name" => &node.name,
        "node.datacenter" => &node.datacenter,
        "node.class" => &node.node_class,
        _ => {
            if let Some(key) = name.strip_prefix("attr.") {
                node.attributes.get(key)?
            } else {
                node.meta.get(name.strip_prefix("meta.")?)?
            }
        }
    };
    Some(value)
}

/// Where the task finds its directories: inside its own root for drivers that isolate the
/// filesystem (`/alloc`, `/local`, `/secrets`), host paths otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskDirs {
    pub alloc: String,
    pub local: String,
    pub secrets: String,
}

/// Everything a task's environment is built from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskEnvSpec {
    pub alloc_id: String,
    pub alloc_name: String,
    pub alloc_index: u32,
    pub job_id: String,
    pub job_name: String,
    pub namespace: String,
    pub group: String,
    pub task: String,
    /// The task's MHz: its `cpu`, or its reserved cores' share of the node's.
    pub cpu_mhz: u32,
    /// The node's cores reserved for the task (`resources { cores }`), if it asked for any.
    pub cores: Vec<u32>,
    pub memory_mb: u32,
    /// 0: no `memory_max`.
    pub memory_max_mb: u32,
    pub dirs: TaskDirs,
    /// Job, group and task `meta` merged, the task's winning.
    pub meta: BTreeMap<String, String>,
    /// Variables from hooks (devices, CSI plugin supervisor), before the task's `env`.
    pub hook_env: BTreeMap<String, String>,
    /// The task's `env` block, not yet interpolated.
    pub task_env: BTreeMap<String, String>,
    /// The group network's ports, as allocated.
    pub ports: Vec<AllocatedPort>,
    /// Ports of tasks' own networks, by task (this one's and the others').
    pub task_ports: BTreeMap<String, Vec<AllocatedPort>>,
    /// The Connect upstreams of the group's services: destination and local bind port.
    pub upstreams: Vec<(String, u16)>,
}

/// A task's variables and its node, ready to interpolate with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEnv<'a> {
    vars: BTreeMap<String, String>,
    node: &'a NodeEnv,
}

/// `job`, `group` and `task` meta merged, the innermost winning (Nomad's `CombinedTaskMeta`).
pub fn combined_meta(
    job: &BTreeMap<String, String>,
    group: &BTreeMap<String, String>,
    task: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut meta = job.clone();
    meta.extend(group.iter().map(|(key, value)| (key.clone(), value.clone())));
    meta.extend(task.iter().map(|(key, value)| (key.clone(), value.clone())));
    meta
}

impl<'a> TaskEnv<'a> {
    /// Builds the environment of one task on `node`.
    pub fn build(spec: &TaskEnvSpec, node: &'a NodeEnv) -> TaskEnv<'a> {
        let mut env = TaskEnv {
            vars: BTreeMap::new(),
            node,
        };
        let runtime = [
            ("NOMAD_ALLOC_ID", spec.alloc_id.clone()),
            ("NOMAD_SHORT_ALLOC_ID", spec.alloc_id.chars().take(8).collect()),
            ("NOMAD_ALLOC_NAME", spec.alloc_name.clone()),
            ("NOMAD_ALLOC_INDEX", spec.alloc_index.to_string()),
            ("NOMAD_JOB_ID", spec.job_id.clone()),
            ("NOMAD_JOB_NAME", spec.job_name.clone()),
            ("NOMAD_GROUP_NAME", spec.group.clone()),
            ("NOMAD_TASK_NAME", spec.task.clone()),
            ("NOMAD_NAMESPACE", spec.namespace.clone()),
            ("NOMAD_REGION", node.region.clone()),
            ("NOMAD_DC", node.node.datacenter.clone()),
            ("NOMAD_ALLOC_DIR", spec.dirs.alloc.clone()),
            ("NOMAD_TASK_DIR", spec.dirs.local.clone()),
            ("NOMAD_SECRETS_DIR", spec.dirs.secrets.clone()),
            ("NOMAD_CPU_LIMIT", spec.cpu_mhz.to_string()),
            ("NOMAD_MEMORY_LIMIT", spec.memory_mb.to_string()),
        ];
        for (name, value) in runtime {
            env.vars.insert(name.to_string(), value);
        }
        if spec.memory_max_mb > 0 {
            env.vars
                .insert("NOMAD_MEMORY_MAX_LIMIT".to_string(), spec.memory_max_mb.to_string());
        }
        if !spec.cores.is_empty() {
            env.vars
                .insert("NOMAD_CPU_CORES".to_string(), crate::structs::cpuset(&spec.cores));
        }
        // Nomad's order: the task's own network, then other tasks' ports, then the group's.
        if let Some(own) = spec.task_ports.get(&spec.task) {
            ports::own(&mut env.vars, own);
        }
        for (task, task_ports) in spec.task_ports.iter().filter(|(task, _)| **task != spec.task) {
            ports::other_task(&mut env.vars, task, task_ports);
        }
        ports::shared(&mut env.vars, &spec.ports);
        // Nomad's `SetUpstreams`: each upstream where its proxy listens, on the loopback.
        for (destination, port) in &spec.upstreams {
            let name = ports::clean_label(destination);
            env.vars
                .insert(format!("NOMAD_UPSTREAM_ADDR_{name}"), format!("127.0.0.1:{port}"));
            env.vars
                .insert(format!("NOMAD_UPSTREAM_IP_{name}"), "127.0.0.1".to_string());
            env.vars.insert(format!("NOMAD_UPSTREAM_PORT_{name}"), port.to_string());
        }
        // Nomad sets each meta key twice: as written and upper-cased.
        for (key, value) in &spec.meta {
            let value = env.interpolate(value);
            env.vars.insert(format!("NOMAD_META_{key}"), value.clone());
            env.vars.insert(format!("NOMAD_META_{}", key.to_uppercase()), value);
        }
        for (name, value) in &spec.hook_env {
            let value = env.interpolate(value);
            env.vars.insert(name.clone(), value);
        }
        for (name, value) in &spec.task_env {
            let value = env.interpolate(value);
            env.vars.insert(name.clone(), value);
        }
        // Names are cleaned last, as Nomad's: interpolation above saw them as written.
        env.vars = core::mem::take(&mut env.vars)
            .into_iter()
            .map(|(name, value)| (ports::clean_name(&name), value))
            .collect();
        env
    }

    /// The variables the task's process gets.
    pub fn vars(&self) -> &BTreeMap<String, String> {
        &self.vars
    }

    /// The value `${name}` stands for, if it is known.
    pub fn lookup(&self, name: &str) -> Option<&str> {
        let name = name.trim();
        if let Some(quoted) = name.strip_prefix("env[").and_then(|rest| rest.strip_suffix(']')) {
            let key = quoted.trim().strip_prefix('"')?.strip_suffix('"')?;
            return self.vars.get(key).map(String::as_str);
        }
        self.node
            .lookup(name)
            .or_else(|| self.vars.get(name).map(String::as_str))
    }

    /// `text` with every known `${...}` replaced; unknown ones and an unclosed `${` stay.
    pub fn interpolate(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            match self.lookup(&after[..end]) {
                Some(value) => out.push_str(value),
                None => out.push_str(&rest[start..start + 2 + end + 1]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// A driver `config` value with every string in it interpolated, map keys included.
    pub fn interpolate_value(&self, value: &ConfigValue) -> ConfigValue {
        match value {
            ConfigValue::String(text) => ConfigValue::String(self.interpolate(text)),
            ConfigValue::List(items) => {
                ConfigValue::List(items.iter().map(|item| self.interpolate_value(item)).collect())
            }
            ConfigValue::Map(map) => ConfigValue::Map(self.interpolate_config(map)),
            other => other.clone(),
        }
    }

    /// A `service` block with its names, tags, meta and checks interpolated (Nomad's
    /// `interpolateServices`).
    pub fn interpolate_service(&self, service: &Service) -> Service {
        let strings = |items: &[String]| items.iter().map(|item| self.interpolate(item)).collect();
        Service {
            name: self.interpolate(&service.name),
            port_label: self.interpolate(&service.port_label),
            address_mode: service.address_mode.clone(),
            tags: strings(&service.tags),
            canary_tags: strings(&service.canary_tags),
            enable_tag_override: service.enable_tag_override,
            meta: service
                .meta
                .iter()
                .map(|(key, value)| (self.interpolate(key), self.interpolate(value)))
                .collect(),
            checks: service
                .checks
                .iter()
                .map(|check| ServiceCheck {
                    name: self.interpolate(&check.name),
                    command: self.interpolate(&check.command),
                    args: strings(&check.args),
                    path: self.interpolate(&check.path),
                    protocol: self.interpolate(&check.protocol),
                    method: self.interpolate(&check.method),
                    port_label: self.interpolate(&check.port_label),
                    ..check.clone()
                })
                .collect(),
            connect: service.connect.clone(),
            task_name: service.task_name.clone(),
        }
    }

    /// A whole driver `config` block interpolated.
    pub fn interpolate_config(&self, config: &BTreeMap<String, ConfigValue>) -> BTreeMap<String, ConfigValue> {
        config
            .iter()
            .map(|(key, value)| (self.interpolate(key), self.interpolate_value(value)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeEnv {
        NodeEnv {
            node: Node {
                id: "9f1c".into(),
                name: "c1".into(),
                datacenter: "dc1".into(),
                node_class: "gpu".into(),
                attributes: [("kernel.name".to_string(), "linux".to_string())].into(),
                meta: [("rack".to_string(), "r7".to_string())].into(),
                ..Node::default()
            },
            region: "global".into(),
        }
    }

    fn spec() -> TaskEnvSpec {
        TaskEnvSpec {
            alloc_id: "0123456789abcdef".into(),
            alloc_name: "web.api[2]".into(),
            alloc_index: 2,
            job_id: "web".into(),
            job_name: "web".into(),
            namespace: "default".into(),
            group: "api".into(),
            task: "server".into(),
            cpu_mhz: 100,
            cores: Vec::new(),
            memory_mb: 300,
            memory_max_mb: 0,
            dirs: TaskDirs {
                alloc: "/alloc".into(),
                local: "/local".into(),
                secrets: "/secrets".into(),
            },
            meta: BTreeMap::new(),
            hook_env: BTreeMap::new(),
            task_env: BTreeMap::new(),
            ports: Vec::new(),
            task_ports: BTreeMap::new(),
            upstreams: Vec::new(),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn runtime_variables_follow_nomads_names() {
        let node_env = node();
        let env = TaskEnv::build(&spec(), &node_env);
        let vars = env.vars();
        assert_eq!(vars["NOMAD_ALLOC_ID"], "0123456789abcdef");
        assert_eq!(vars["NOMAD_SHORT_ALLOC_ID"], "01234567");
        assert_eq!(vars["NOMAD_ALLOC_NAME"], "web.api[2]");
        assert_eq!(vars["NOMAD_ALLOC_INDEX"], "2");
        assert_eq!(vars["NOMAD_JOB_ID"], "web");
        assert_eq!(vars["NOMAD_GROUP_NAME"], "api");
        assert_eq!(vars["NOMAD_TASK_NAME"], "server");
        assert_eq!(vars["NOMAD_NAMESPACE"], "default");
        assert_eq!(vars["NOMAD_REGION"], "global");
        assert_eq!(vars["NOMAD_DC"], "dc1");
        assert_eq!(vars["NOMAD_TASK_DIR"], "/local");
        assert_eq!(vars["NOMAD_ALLOC_DIR"], "/alloc");
        assert_eq!(vars["NOMAD_SECRETS_DIR"], "/secrets");
        assert_eq!(vars["NOMAD_CPU_LIMIT"], "100");
        assert_eq!(vars["NOMAD_MEMORY_LIMIT"], "300");
        assert!(!vars.contains_key("NOMAD_MEMORY_MAX_LIMIT"), "only with memory_max");
        let mut spec = spec();
        spec.memory_max_mb = 512;
        assert_eq!(TaskEnv::build(&spec, &node()).vars()["NOMAD_MEMORY_MAX_LIMIT"], "512");
        assert!(!vars.contains_key("NOMAD_CPU_CORES"), "only with reserved cores");
        spec.cores = vec![2, 0, 1, 5];
        assert_eq!(TaskEnv::build(&spec, &node()).vars()["NOMAD_CPU_CORES"], "0-2,5");
    }

    #[test]
    fn meta_is_merged_task_over_group_over_job_and_set_as_written_and_upper_cased() {
        let mut spec = spec();
        spec.meta = combined_meta(
            &map(&[("owner", "job"), ("tier", "job")]),
            &map(&[("tier", "group")]),
            &map(&[("owner", "task")]),
        );
        let node_env = node();
        let env = TaskEnv::build(&spec, &node_env);
        assert_eq!(env.vars()["NOMAD_META_owner"], "task");
        assert_eq!(env.vars()["NOMAD_META_OWNER"], "task");
        assert_eq!(env.vars()["NOMAD_META_tier"], "group");
    }

    #[test]
    fn the_task_env_is_interpolated_and_wins_over_hooks_and_runtime_variables() {
        let mut spec = spec();
        spec.hook_env = map(&[("CSI_ENDPOINT", "unix:///csi/csi.sock"), ("GPU", "hook")]);
        spec.task_env = map(&[
            ("DC", "Running on datacenter ${node.datacenter}"),
            ("GPU", "task"),
            ("NOMAD_TASK_NAME", "mine"),
            ("ENDPOINT", "${CSI_ENDPOINT}"),
        ]);
        let node_env = node();
        let env = TaskEnv::build(&spec, &node_env);
        assert_eq!(env.vars()["DC"], "Running on datacenter dc1");
        assert_eq!(env.vars()["GPU"], "task");
        assert_eq!(env.vars()["NOMAD_TASK_NAME"], "mine");
        assert_eq!(env.vars()["ENDPOINT"], "unix:///csi/csi.sock");
    }

    #[test]
    fn connect_upstreams_are_where_their_proxy_listens_as_countdash_reads_them() {
        let mut spec = spec();
        spec.upstreams = vec![("count-api".into(), 8080)];
        spec.task_env = map(&[("COUNTING_SERVICE_URL", "http://${NOMAD_UPSTREAM_ADDR_count_api}")]);
        let node_env = node();
        let env = TaskEnv::build(&spec, &node_env);
        assert_eq!(env.vars()["COUNTING_SERVICE_URL"], "http://127.0.0.1:8080");
        assert_eq!(env.vars()["NOMAD_UPSTREAM_IP_count_api"], "127.0.0.1");
        assert_eq!(env.vars()["NOMAD_UPSTREAM_PORT_count_api"], "8080");
    }

    #[test]
    fn interpolation_knows_node_values_env_lookups_and_leaves_the_unknown_alone() {
        let mut spec = spec();
        spec.hook_env = map(&[("CSI_ENDPOINT", "unix:///csi/csi.sock")]);
        let node_env = node();
        let env = TaskEnv::build(&spec, &node_env);
        let cases = [
            ("--endpoint=${CSI_ENDPOINT}", "--endpoint=unix:///csi/csi.sock"),
            ("node-${NOMAD_ALLOC_INDEX}", "node-2"),
            ("${env[\"NOMAD_JOB_ID\"]}", "web"),
            ("${ env[\"NOMAD_JOB_ID\"] }", "web"),
            ("${attr.kernel.name}/${meta.rack}", "linux/r7"),
            (
                "${node.unique.id} ${node.unique.name} ${node.class} ${node.region}",
                "9f1c c1 gpu global",
            ),
            ("${NOMAD_NO_SUCH}", "${NOMAD_NO_SUCH}"),
            ("${env[\"NO_SUCH\"]}", "${env[\"NO_SUCH\"]}"),
            ("${attr.no.such}", "${attr.no.such}"),
            ("half ${open", "half ${open"),
            ("$NOMAD_ALLOC_INDEX and $${x", "$NOMAD_ALLOC_INDEX and $${x"),
            ("", ""),
            ("${}", "${}"),
        ];
        for (text, want) in cases {
            assert_eq!(env.interpolate(text), want, "interpolating {text:?}");
        }
    }

    #[test]
    fn every_string_of_a_driver_config_is_interpolated() {
        let node_env = node();
        let env = TaskEnv::build(&spec(), &node_env);
        let config: BTreeMap<String, ConfigValue> = [
            (
                "command".to_string(),
                ConfigValue::String("${NOMAD_TASK_DIR}/run".into()),
            ),
            (
                "args".to_string(),
                ConfigValue::List(vec![
                    ConfigValue::String("--index=${NOMAD_ALLOC_INDEX}".into()),
                    ConfigValue::Int(7),
                ]),
            ),
            (
                "labels".to_string(),
                ConfigValue::Map(
                    [(
                        "${NOMAD_JOB_ID}".to_string(),
                        ConfigValue::List(vec![ConfigValue::String("${node.datacenter}".into())]),
                    )]
                    .into(),
                ),
            ),
            ("privileged".to_string(), ConfigValue::Bool(true)),
        ]
        .into();
        let out = env.interpolate_config(&config);
        assert_eq!(out["command"], ConfigValue::String("/local/run".into()));
        assert_eq!(
            out["args"],
            ConfigValue::List(vec![ConfigValue::String("--index=2".into()), ConfigValue::Int(7)])
        );
        assert_eq!(
            out["labels"],
            ConfigValue::Map(
                [(
                    "web".to_string(),
                    ConfigValue::List(vec![ConfigValue::String("dc1".into())])
                )]
                .into()
            )
        );
        assert_eq!(out["privileged"], ConfigValue::Bool(true));
    }

    #[test]
    fn services_are_registered_with_their_strings_interpolated() {
        let node_env = node();
        let env = TaskEnv::build(&spec(), &node_env);
        let service = Service {
            name: "web-${NOMAD_ALLOC_INDEX}".into(),
            port_label: "8080".into(),
            tags: vec!["dc-${node.datacenter}".into(), "${NOMAD_NO_SUCH}".into()],
            meta: [("rack".to_string(), "${meta.rack}".to_string())].into(),
            checks: vec![ServiceCheck {
                name: "alive ${NOMAD_TASK_NAME}".into(),
                check_type: "script".into(),
                command: "${NOMAD_TASK_DIR}/check".into(),
                args: vec!["--alloc=${NOMAD_ALLOC_ID}".into()],
                ..ServiceCheck::default()
            }],
            ..Service::default()
        };
        let out = env.interpolate_service(&service);
        assert_eq!(out.name, "web-2");
        assert_eq!(out.tags, ["dc-dc1", "${NOMAD_NO_SUCH}"]);
        assert_eq!(out.meta["rack"], "r7");
        assert_eq!(out.checks[0].name, "alive server");
        assert_eq!(out.checks[0].command, "/local/check");
        assert_eq!(out.checks[0].args, ["--alloc=0123456789abcdef"]);
        assert_eq!(out.checks[0].check_type, "script");
    }
}
