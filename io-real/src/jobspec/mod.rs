//! HCL jobspecs (Nomad's block names) into the API job form the HTTP API takes. Parsed with
//! hcl-rs into a value tree, then walked by hand so every problem — an unknown key, a value of
//! the wrong type, a bad duration — is reported with where it is, all at once.

use std::collections::BTreeMap;

use crate::jobs::{
    ApiAffinity, ApiConstraint, ApiCsiPluginConfig, ApiDevice, ApiDispatchPayloadConfig, ApiJob, ApiLogConfig,
    ApiMigrate, ApiMountOptions, ApiNetworkResource, ApiParameterizedJobConfig, ApiPeriodicConfig, ApiPort,
    ApiReschedulePolicy, ApiResources, ApiRestartPolicy, ApiScalingPolicy, ApiService, ApiServiceCheck, ApiSpread,
    ApiSpreadTarget, ApiTask, ApiTaskGroup, ApiTemplate, ApiUpdateStrategy, ApiVolumeMount, ApiVolumeRequest,
};
use serde_json::{Map, Value};

mod connect;

/// Where a value sits, for error messages (`job "web" group "g" task "t"`).
struct Walker {
    problems: Vec<String>,
}

type Object = Map<String, Value>;

impl Walker {
    fn problem(&mut self, at: &str, message: impl std::fmt::Display) {
        self.problems.push(format!("{at}: {message}"));
    }

    fn object<'a>(&mut self, at: &str, value: &'a Value) -> Option<&'a Object> {
        match value {
            Value::Object(map) => Some(map),
            _ => {
                self.problem(at, "expected a block");
                None
            }
        }
    }

    /// Keys this block understands; anything else is named.
    fn known(&mut self, at: &str, block: &Object, keys: &[&str]) {
        for key in block.keys() {
            if !keys.contains(&key.as_str()) {
                self.problem(at, format!("unsupported key {key:?}"));
            }
        }
    }

    /// A string; a number or boolean written where text is expected is taken as its text, as
    /// Nomad's HCL converts it (`port = 8080`, `value = true`).
    fn string(&mut self, at: &str, block: &Object, key: &str) -> Option<String> {
        match block.get(key)? {
            Value::String(text) => Some(text.clone()),
            Value::Number(number) => Some(number.to_string()),
            Value::Bool(flag) => Some(flag.to_string()),
            _ => {
                self.problem(at, format!("{key} must be a string"));
                None
            }
        }
    }

    /// A boolean; `"true"` and `"false"` written as strings are converted, as Nomad's HCL
    /// does.
    fn boolean(&mut self, at: &str, block: &Object, key: &str) -> Option<bool> {
        match block.get(key)? {
            Value::Bool(flag) => Some(*flag),
            Value::String(text) if text == "true" => Some(true),
            Value::String(text) if text == "false" => Some(false),
            _ => {
                self.problem(at, format!("{key} must be true or false"));
                None
            }
        }
    }

    /// A number, or a string holding one (`count = "3"`, which Nomad's HCL converts).
    fn numeric(block: &Object, key: &str) -> Option<Option<serde_json::Number>> {
        Some(match block.get(key)? {
            Value::Number(number) => Some(number.clone()),
            Value::String(text) => serde_json::from_str::<serde_json::Number>(text.trim()).ok(),
            _ => None,
        })
    }

    fn number(&mut self, at: &str, block: &Object, key: &str) -> Option<u32> {
        match Self::numeric(block, key)? {
            Some(number) if number.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)) => {
                number.as_u64().map(|n| n as u32)
            }
            _ => {
                self.problem(at, format!("{key} must be a non-negative whole number"));
                None
            }
        }
    }

    fn integer(&mut self, at: &str, block: &Object, key: &str) -> Option<i64> {
        match Self::numeric(block, key)? {
            Some(number) if number.as_i64().is_some() => number.as_i64(),
            _ => {
                self.problem(at, format!("{key} must be a whole number"));
                None
            }
        }
    }

    /// `network { mode mbits port "<label>" { static to host_network } }` blocks: a port
    /// with `static` is reserved, one without is dynamic.
    fn networks(&mut self, at: &str, block: &Object) -> Vec<ApiNetworkResource> {
        self.repeated(at, block, "network")
            .into_iter()
            .map(|network| {
                let at = format!("{at} network");
                self.known(&at, network, &["mode", "mbits", "port"]);
                let mut api = ApiNetworkResource {
                    mode: self.string(&at, network, "mode").unwrap_or_default(),
                    mbits: self.number(&at, network, "mbits"),
                    ..ApiNetworkResource::default()
                };
                for (label, port) in self.labeled(&at, network, "port") {
                    let at = format!("{at} port {label:?}");
                    self.known(&at, port, &["static", "to", "host_network"]);
                    let fixed = self.integer(&at, port, "static");
                    let parsed = ApiPort {
                        value: fixed.unwrap_or(0),
                        to: self.integer(&at, port, "to").unwrap_or(0),
                        host_network: self.string(&at, port, "host_network").unwrap_or_default(),
                        label,
                    };
                    match fixed {
                        Some(_) => api.reserved_ports.push(parsed),
                        None => api.dynamic_ports.push(parsed),
                    }
                }
                api
            })
            .collect()
    }

    fn strings(&mut self, at: &str, block: &Object, key: &str) -> Option<Vec<String>> {
        match block.get(key)? {
            Value::Array(items)
                if items
                    .iter()
                    .all(|item| item.is_string() || item.is_number() || item.is_boolean()) =>
            {
                Some(
                    items
                        .iter()
                        .map(|item| match item {
                            Value::String(text) => text.clone(),
                            other => other.to_string(),
                        })
                        .collect(),
                )
            }
            _ => {
                self.problem(at, format!("{key} must be a list of strings"));
                None
            }
        }
    }

    /// A Go duration (`"30s"`, `"1m30s"`, `"250ms"`) as nanoseconds.
    fn duration(&mut self, at: &str, block: &Object, key: &str) -> Option<i64> {
        let text = self.string(at, block, key)?;
        match parse_duration(&text) {
            Some(nanos) => Some(nanos),
            None => {
                self.problem(at, format!("{key} {text:?} is not a duration such as \"30s\""));
                None
            }
        }
    }

    /// Labeled blocks (`task "a" {}`): label → block, in file order.
    fn labeled<'a>(&mut self, at: &str, block: &'a Object, key: &str) -> Vec<(String, &'a Object)> {
        let Some(value) = block.get(key) else {
            return Vec::new();
        };
        let Some(map) = self.object(&format!("{at} {key}"), value) else {
            return Vec::new();
        };
        map.iter()
            .filter_map(|(label, inner)| {
                let inner = self.object(&format!("{at} {key} {label:?}"), inner)?;
                Some((label.clone(), inner))
            })
            .collect()
    }

    /// Unlabeled blocks that may repeat (`volume_mount {}`).
    fn repeated<'a>(&mut self, at: &str, block: &'a Object, key: &str) -> Vec<&'a Object> {
        match block.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|item| self.object(&format!("{at} {key}"), item))
                .collect(),
            Some(value) => self.object(&format!("{at} {key}"), value).into_iter().collect(),
        }
    }

    /// A block of string values (`env {}`, `meta {}`); numbers and booleans become text.
    fn string_map(&mut self, at: &str, block: &Object, key: &str) -> BTreeMap<String, String> {
        let Some(map) = self.single(at, block, key) else {
            return BTreeMap::new();
        };
        map.iter()
            .filter_map(|(name, value)| match value {
                Value::String(text) => Some((name.clone(), text.clone())),
                Value::Number(number) => Some((name.clone(), number.to_string())),
                Value::Bool(flag) => Some((name.clone(), flag.to_string())),
                _ => {
                    self.problem(&format!("{at} {key}"), format!("{name} must be a string"));
                    None
                }
            })
            .collect()
    }

    /// `constraint { attribute operator value }` blocks, with Nomad's shorthands
    /// `distinct_hosts = true` and `distinct_property = "${meta.rack}"`; the operator defaults
    /// to `=`.
    fn constraints(&mut self, at: &str, block: &Object) -> Vec<ApiConstraint> {
        let mut out = Vec::new();
        for constraint in self.repeated(at, block, "constraint") {
            let at = format!("{at} constraint");
            self.known(
                &at,
                constraint,
                &[
                    "attribute",
                    "operator",
                    "value",
                    "distinct_hosts",
                    "distinct_property",
                    "regexp",
                    "version",
                    "semver",
                    "set_contains",
                ],
            );
            let mut parsed = ApiConstraint {
                ltarget: self.string(&at, constraint, "attribute").unwrap_or_default(),
                rtarget: self.string(&at, constraint, "value").unwrap_or_default(),
                operand: self.string(&at, constraint, "operator").unwrap_or_else(|| "=".into()),
            };
            if let Some((operand, value)) =
                self.operator_shorthand(&at, constraint, &["regexp", "version", "semver", "set_contains"])
            {
                parsed.operand = operand;
                parsed.rtarget = value;
            }
            if self.boolean(&at, constraint, "distinct_hosts") == Some(true) {
                parsed.operand = "distinct_hosts".into();
            }
            if let Some(property) = self.string(&at, constraint, "distinct_property") {
                parsed.operand = "distinct_property".into();
                parsed.ltarget = property;
            }
            out.push(parsed);
        }
        out
    }

    /// `affinity { attribute operator value weight }` blocks (operator `=`, weight 50 by
    /// default, as Nomad's).
    fn affinities(&mut self, at: &str, block: &Object) -> Vec<ApiAffinity> {
        let mut out = Vec::new();
        for affinity in self.repeated(at, block, "affinity") {
            let at = format!("{at} affinity");
            self.known(
                &at,
                affinity,
                &[
                    "attribute",
                    "operator",
                    "value",
                    "weight",
                    "regexp",
                    "version",
                    "semver",
                    "set_contains_any",
                    "set_contains_all",
                ],
            );
            let shorthand = self.operator_shorthand(
                &at,
                affinity,
                &["regexp", "version", "semver", "set_contains_any", "set_contains_all"],
            );
            let weight = self.integer(&at, affinity, "weight").map_or(50, |weight| {
                weight.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
            });
            let mut parsed = ApiAffinity {
                ltarget: self.string(&at, affinity, "attribute").unwrap_or_default(),
                rtarget: self.string(&at, affinity, "value").unwrap_or_default(),
                operand: self.string(&at, affinity, "operator").unwrap_or_else(|| "=".into()),
                weight,
            };
            if let Some((operand, value)) = shorthand {
                parsed.operand = operand;
                parsed.rtarget = value;
            }
            out.push(parsed);
        }
        out
    }

    /// Nomad's operator shorthands (`regexp = "^r[0-9]$"` for `operator = "regexp"` and
    /// `value = "^r[0-9]$"`): the one written, if any, as (operator, value). Two at once, or
    /// one beside `operator`, is a contradiction and named.
    fn operator_shorthand(&mut self, at: &str, block: &Object, keys: &[&str]) -> Option<(String, String)> {
        let written: Vec<&str> = keys.iter().copied().filter(|key| block.contains_key(*key)).collect();
        match written.as_slice() {
            [] => None,
            [key] => {
                if block.contains_key("operator") {
                    self.problem(at, format!("give {key} or operator, not both"));
                }
                let value = self.string(at, block, key)?;
                Some(((*key).to_string(), value))
            }
            several => {
                self.problem(at, format!("only one of {} may be given", several.join(", ")));
                None
            }
        }
    }

    /// An `update` block (job or group level), fields left unset where not written.
    fn update(&mut self, at: &str, block: &Object) -> Option<ApiUpdateStrategy> {
        let update = self.single(at, block, "update")?;
        let at = format!("{at} update");
        self.known(
            &at,
            update,
            &[
                "max_parallel",
                "health_check",
                "min_healthy_time",
                "healthy_deadline",
                "progress_deadline",
                "auto_revert",
                "auto_promote",
                "canary",
                "stagger",
            ],
        );
        Some(ApiUpdateStrategy {
            stagger: self.duration(&at, update, "stagger"),
            max_parallel: self.number(&at, update, "max_parallel").map(i64::from),
            health_check: self.string(&at, update, "health_check"),
            min_healthy_time: self.duration(&at, update, "min_healthy_time"),
            healthy_deadline: self.duration(&at, update, "healthy_deadline"),
            progress_deadline: self.duration(&at, update, "progress_deadline"),
            canary: self.number(&at, update, "canary").map(i64::from),
            auto_revert: self.boolean(&at, update, "auto_revert"),
            auto_promote: self.boolean(&at, update, "auto_promote"),
        })
    }

    /// A `periodic` block: `cron` (or a one-element `crons`), `prohibit_overlap`,
    /// `time_zone`, `enabled`.
    fn periodic(&mut self, at: &str, block: &Object) -> Option<ApiPeriodicConfig> {
        let periodic = self.single(at, block, "periodic")?;
        let at = format!("{at} periodic");
        self.known(
            &at,
            periodic,
            &["cron", "crons", "prohibit_overlap", "time_zone", "enabled"],
        );
        let mut spec = self.string(&at, periodic, "cron");
        if let Some(crons) = self.strings(&at, periodic, "crons") {
            match (crons.as_slice(), &spec) {
                ([one], None) => spec = Some(one.clone()),
                _ => self.problem(&at, "give one cron spec: cron, or crons with one element"),
            }
        }
        Some(ApiPeriodicConfig {
            enabled: self.boolean(&at, periodic, "enabled"),
            spec,
            spec_type: None,
            prohibit_overlap: self.boolean(&at, periodic, "prohibit_overlap"),
            time_zone: self.string(&at, periodic, "time_zone"),
        })
    }

    /// A `reschedule` block (job or group level), fields left unset where not written.
    fn reschedule(&mut self, at: &str, block: &Object) -> Option<ApiReschedulePolicy> {
        let reschedule = self.single(at, block, "reschedule")?;
        let at = format!("{at} reschedule");
        self.known(
            &at,
            reschedule,
            &[
                "attempts",
                "interval",
                "delay",
                "delay_function",
                "max_delay",
                "unlimited",
            ],
        );
        Some(ApiReschedulePolicy {
            attempts: self.integer(&at, reschedule, "attempts"),
            interval: self.duration(&at, reschedule, "interval"),
            delay: self.duration(&at, reschedule, "delay"),
            delay_function: self.string(&at, reschedule, "delay_function"),
            max_delay: self.duration(&at, reschedule, "max_delay"),
            unlimited: self.boolean(&at, reschedule, "unlimited"),
        })
    }

    /// `spread { attribute weight target "<value>" { percent } }` blocks (job or group level).
    fn spreads(&mut self, at: &str, block: &Object) -> Vec<ApiSpread> {
        self.repeated(at, block, "spread")
            .into_iter()
            .map(|spread| {
                let at = format!("{at} spread");
                self.known(&at, spread, &["attribute", "weight", "target"]);
                let spread_target = self
                    .labeled(&at, spread, "target")
                    .into_iter()
                    .map(|(value, target)| {
                        let at = format!("{at} target {value:?}");
                        self.known(&at, target, &["percent", "value"]);
                        ApiSpreadTarget {
                            percent: self.integer(&at, target, "percent").unwrap_or(0),
                            value,
                        }
                    })
                    .collect();
                ApiSpread {
                    attribute: self.string(&at, spread, "attribute").unwrap_or_default(),
                    weight: self.integer(&at, spread, "weight"),
                    spread_target,
                }
            })
            .collect()
    }

    /// A `migrate` block (job or group level).
    /// A group's or task's `restart { attempts interval delay mode }`.
    fn restart(&mut self, at: &str, block: &Object) -> Option<ApiRestartPolicy> {
        let restart = self.single(at, block, "restart")?;
        let at = format!("{at} restart");
        self.known(&at, restart, &["attempts", "interval", "delay", "mode"]);
        Some(ApiRestartPolicy {
            attempts: self.number(&at, restart, "attempts"),
            interval: self.duration(&at, restart, "interval"),
            delay: self.duration(&at, restart, "delay"),
            mode: self.string(&at, restart, "mode"),
        })
    }

    fn migrate(&mut self, at: &str, block: &Object) -> Option<ApiMigrate> {
        let migrate = self.single(at, block, "migrate")?;
        let at = format!("{at} migrate");
        self.known(&at, migrate, &["max_parallel"]);
        Some(ApiMigrate {
            max_parallel: self.number(&at, migrate, "max_parallel"),
        })
    }

    fn single<'a>(&mut self, at: &str, block: &'a Object, key: &str) -> Option<&'a Object> {
        let found = self.repeated(at, block, key);
        if found.len() > 1 {
            self.problem(at, format!("only one {key} block is allowed"));
        }
        found.into_iter().next()
    }
}

/// Go's duration syntax (`drover_core::goduration`), in nanoseconds.
pub fn parse_duration(text: &str) -> Option<i64> {
    drover_core::goduration::parse_nanos(text).ok()
}

/// Parses one jobspec file: exactly one `job "<id>" {}` block.
pub fn parse(text: &str) -> Result<ApiJob, Vec<String>> {
    let body = crate::hcl_check::parse_body(text).map_err(|error| vec![format!("error parsing jobspec: {error}")])?;
    let value: hcl::Value = hcl::from_body(body).map_err(|error| vec![format!("error parsing jobspec: {error}")])?;
    let value = serde_json::to_value(&value).map_err(|error| vec![error.to_string()])?;
    let mut walker = Walker { problems: Vec::new() };
    let Some(root) = walker.object("jobspec", &value) else {
        return Err(walker.problems);
    };
    walker.known("jobspec", root, &["job"]);
    let jobs = walker.labeled("jobspec", root, "job");
    if jobs.len() != 1 {
        walker.problem("jobspec", format!("expected one job block, found {}", jobs.len()));
        return Err(walker.problems);
    }
    let (id, block) = &jobs[0];
    let at = format!("job {id:?}");
    walker.known(
        &at,
        block,
        &[
            "name",
            "namespace",
            "region",
            "type",
            "priority",
            "datacenters",
            "meta",
            "constraint",
            "affinity",
            "update",
            "periodic",
            "parameterized",
            "group",
            "all_at_once",
            "reschedule",
            "migrate",
            "spread",
        ],
    );
    let update = walker.update(&at, block);
    let periodic = walker.periodic(&at, block);
    let parameterized_job = walker.single(&at, block, "parameterized").map(|parameterized| {
        let at = format!("{at} parameterized");
        walker.known(&at, parameterized, &["payload", "meta_required", "meta_optional"]);
        ApiParameterizedJobConfig {
            payload: walker.string(&at, parameterized, "payload").unwrap_or_default(),
            meta_required: walker.strings(&at, parameterized, "meta_required"),
            meta_optional: walker.strings(&at, parameterized, "meta_optional"),
        }
    });
    let job = ApiJob {
        id: id.clone(),
        name: walker.string(&at, block, "name").unwrap_or_default(),
        namespace: walker.string(&at, block, "namespace").unwrap_or_default(),
        region: walker.string(&at, block, "region").unwrap_or_default(),
        job_type: walker.string(&at, block, "type").unwrap_or_default(),
        priority: walker.number(&at, block, "priority"),
        datacenters: walker.strings(&at, block, "datacenters").unwrap_or_default(),
        meta: walker.string_map(&at, block, "meta"),
        constraints: walker.constraints(&at, block),
        affinities: walker.affinities(&at, block),
        task_groups: walker
            .labeled(&at, block, "group")
            .into_iter()
            .map(|(name, group)| parse_group(&mut walker, &format!("{at} group {name:?}"), name, group))
            .collect(),
        update,
        periodic,
        parameterized_job,
        all_at_once: walker.boolean(&at, block, "all_at_once").unwrap_or(false),
        spreads: walker.spreads(&at, block),
        reschedule: walker.reschedule(&at, block),
        migrate: walker.migrate(&at, block),
        ..ApiJob::default()
    };
    if walker.problems.is_empty() {
        Ok(job)
    } else {
        Err(walker.problems)
    }
}

fn parse_group(walker: &mut Walker, at: &str, name: String, block: &Object) -> ApiTaskGroup {
    walker.known(
        at,
        block,
        &[
            "count",
            "meta",
            "constraint",
            "affinity",
            "volume",
            "restart",
            "migrate",
            "update",
            "network",
            "service",
            "task",
            "scaling",
            "reschedule",
            "spread",
            "shutdown_delay",
            "stop_after_client_disconnect",
            "ephemeral_disk",
        ],
    );
    let update = walker.update(at, block);
    let ephemeral_disk = walker.single(at, block, "ephemeral_disk").map(|disk| {
        let at = format!("{at} ephemeral_disk");
        walker.known(&at, disk, &["size", "sticky", "migrate"]);
        crate::jobs::ApiEphemeralDisk {
            size_mb: walker.number(&at, disk, "size").map(u64::from),
            sticky: walker.boolean(&at, disk, "sticky").unwrap_or(false),
            migrate: walker.boolean(&at, disk, "migrate").unwrap_or(false),
        }
    });
    let scaling = walker.single(at, block, "scaling").map(|scaling| {
        let at = format!("{at} scaling");
        walker.known(&at, scaling, &["min", "max", "enabled", "policy", "type"]);
        ApiScalingPolicy {
            policy_type: walker.string(&at, scaling, "type"),
            min: walker.integer(&at, scaling, "min"),
            max: walker.integer(&at, scaling, "max"),
            enabled: walker.boolean(&at, scaling, "enabled"),
            policy: walker
                .single(&at, scaling, "policy")
                .map(|policy| policy.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            ..ApiScalingPolicy::default()
        }
    });
    let migrate = walker.migrate(at, block);
    let reschedule_policy = walker.reschedule(at, block);
    let restart_policy = walker.restart(at, block);
    let volumes = walker
        .labeled(at, block, "volume")
        .into_iter()
        .map(|(alias, volume)| {
            let at = format!("{at} volume {alias:?}");
            walker.known(
                &at,
                volume,
                &[
                    "type",
                    "source",
                    "read_only",
                    "access_mode",
                    "attachment_mode",
                    "per_alloc",
                    "mount_options",
                ],
            );
            let mount_options = walker.single(&at, volume, "mount_options").map(|options| {
                let at = format!("{at} mount_options");
                walker.known(&at, options, &["fs_type", "mount_flags"]);
                ApiMountOptions {
                    fs_type: walker.string(&at, options, "fs_type").unwrap_or_default(),
                    mount_flags: walker.strings(&at, options, "mount_flags").unwrap_or_default(),
                }
            });
            let request = ApiVolumeRequest {
                name: alias.clone(),
                volume_type: walker.string(&at, volume, "type").unwrap_or_default(),
                source: walker.string(&at, volume, "source").unwrap_or_default(),
                read_only: walker.boolean(&at, volume, "read_only").unwrap_or(false),
                access_mode: walker.string(&at, volume, "access_mode").unwrap_or_default(),
                attachment_mode: walker.string(&at, volume, "attachment_mode").unwrap_or_default(),
                mount_options,
                per_alloc: walker.boolean(&at, volume, "per_alloc").unwrap_or(false),
            };
            (alias, request)
        })
        .collect();
    ApiTaskGroup {
        spreads: walker.spreads(at, block),
        shutdown_delay: walker.duration(at, block, "shutdown_delay"),
        stop_after_client_disconnect: walker.duration(at, block, "stop_after_client_disconnect"),
        ephemeral_disk,
        scaling,
        reschedule_policy,
        name,
        count: walker.number(at, block, "count"),
        tasks: walker
            .labeled(at, block, "task")
            .into_iter()
            .map(|(name, task)| parse_task(walker, &format!("{at} task {name:?}"), name, task))
            .collect(),
        volumes,
        restart_policy,
        migrate,
        update,
        meta: walker.string_map(at, block, "meta"),
        constraints: walker.constraints(at, block),
        affinities: walker.affinities(at, block),
        networks: walker.networks(at, block),
        services: walker
            .repeated(at, block, "service")
            .into_iter()
            .map(|service| parse_service(walker, &format!("{at} service"), service, true))
            .collect(),
    }
}

fn parse_task(walker: &mut Walker, at: &str, name: String, block: &Object) -> ApiTask {
    walker.known(
        at,
        block,
        &[
            "driver",
            "config",
            "env",
            "meta",
            "constraint",
            "affinity",
            "resources",
            "volume_mount",
            "csi_plugin",
            "kill_timeout",
            "service",
            "template",
            "lifecycle",
            "logs",
            "dispatch_payload",
            "kill_signal",
            "leader",
            "restart",
            "shutdown_delay",
        ],
    );
    let dispatch_payload = walker.single(at, block, "dispatch_payload").map(|payload| {
        let at = format!("{at} dispatch_payload");
        walker.known(&at, payload, &["file"]);
        ApiDispatchPayloadConfig {
            file: walker.string(&at, payload, "file").unwrap_or_default(),
        }
    });
    let log_config = walker.single(at, block, "logs").map(|logs| {
        let at = format!("{at} logs");
        walker.known(&at, logs, &["max_files", "max_file_size"]);
        ApiLogConfig {
            max_files: walker.number(&at, logs, "max_files"),
            max_file_size_mb: walker.number(&at, logs, "max_file_size"),
        }
    });
    let config: BTreeMap<String, Value> = walker
        .single(at, block, "config")
        .map(|config| config.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let env = walker.string_map(at, block, "env");
    let resources = walker
        .single(at, block, "resources")
        .map(|resources| parse_resources(walker, &format!("{at} resources"), resources));
    let volume_mounts = walker
        .repeated(at, block, "volume_mount")
        .into_iter()
        .map(|mount| {
            let at = format!("{at} volume_mount");
            walker.known(&at, mount, &["volume", "destination", "read_only", "propagation_mode"]);
            ApiVolumeMount {
                volume: walker.string(&at, mount, "volume").unwrap_or_default(),
                destination: walker.string(&at, mount, "destination").unwrap_or_default(),
                read_only: walker.boolean(&at, mount, "read_only").unwrap_or(false),
                propagation_mode: walker.string(&at, mount, "propagation_mode").unwrap_or_default(),
            }
        })
        .collect();
    let csi_plugin_config = walker.single(at, block, "csi_plugin").map(|plugin| {
        let at = format!("{at} csi_plugin");
        walker.known(
            &at,
            plugin,
            &["id", "type", "mount_dir", "stage_publish_base_dir", "health_timeout"],
        );
        ApiCsiPluginConfig {
            id: walker.string(&at, plugin, "id").unwrap_or_default(),
            plugin_type: walker.string(&at, plugin, "type").unwrap_or_default(),
            mount_dir: walker.string(&at, plugin, "mount_dir").unwrap_or_default(),
            stage_publish_base_dir: walker.string(&at, plugin, "stage_publish_base_dir").unwrap_or_default(),
            health_timeout: walker.duration(&at, plugin, "health_timeout"),
        }
    });
    let services = walker
        .repeated(at, block, "service")
        .into_iter()
        .map(|service| parse_service(walker, &format!("{at} service"), service, false))
        .collect();
    let templates = walker
        .repeated(at, block, "template")
        .into_iter()
        .map(|template| parse_template(walker, &format!("{at} template"), template))
        .collect();
    ApiTask {
        services,
        templates,
        driver: walker.string(at, block, "driver").unwrap_or_default(),
        config,
        env,
        meta: walker.string_map(at, block, "meta"),
        constraints: walker.constraints(at, block),
        affinities: walker.affinities(at, block),
        resources,
        volume_mounts,
        csi_plugin_config,
        kill_timeout: walker.duration(at, block, "kill_timeout"),
        lifecycle: walker
            .single(at, block, "lifecycle")
            .map(|lifecycle| connect::parse_lifecycle(walker, &format!("{at} lifecycle"), lifecycle)),
        kind: String::new(),
        log_config,
        dispatch_payload,
        kill_signal: walker.string(at, block, "kill_signal").unwrap_or_default(),
        leader: walker.boolean(at, block, "leader").unwrap_or(false),
        restart_policy: walker.restart(at, block),
        shutdown_delay: walker.duration(at, block, "shutdown_delay").unwrap_or(0),
        name,
    }
}

/// `resources { cpu cores memory memory_max device network }`.
fn parse_resources(walker: &mut Walker, at: &str, resources: &Object) -> ApiResources {
    walker.known(
        at,
        resources,
        &["cpu", "cores", "memory", "memory_max", "device", "network"],
    );
    ApiResources {
        networks: walker.networks(at, resources),
        cpu: walker.number(at, resources, "cpu"),
        cores: walker.number(at, resources, "cores"),
        memory_mb: walker.number(at, resources, "memory"),
        memory_max_mb: walker.number(at, resources, "memory_max"),
        devices: walker
            .labeled(at, resources, "device")
            .into_iter()
            .map(|(name, device)| {
                let at = format!("{at} device {name:?}");
                walker.known(&at, device, &["count"]);
                ApiDevice {
                    count: walker.number(&at, device, "count"),
                    name,
                }
            })
            .collect(),
    }
}

/// `template { data source destination perms env change_mode change_signal splay
/// left_delimiter right_delimiter }`.
fn parse_template(walker: &mut Walker, at: &str, block: &Object) -> ApiTemplate {
    walker.known(
        at,
        block,
        &[
            "data",
            "source",
            "destination",
            "perms",
            "env",
            "change_mode",
            "change_signal",
            "splay",
            "left_delimiter",
            "right_delimiter",
        ],
    );
    ApiTemplate {
        embedded_tmpl: walker.string(at, block, "data"),
        source_path: walker.string(at, block, "source"),
        dest_path: walker.string(at, block, "destination"),
        perms: walker.string(at, block, "perms"),
        envvars: walker.boolean(at, block, "env"),
        change_mode: walker.string(at, block, "change_mode"),
        change_signal: walker.string(at, block, "change_signal"),
        splay: walker.duration(at, block, "splay"),
        left_delim: walker.string(at, block, "left_delimiter"),
        right_delim: walker.string(at, block, "right_delimiter"),
    }
}

/// `service { name port address_mode tags canary_tags enable_tag_override meta {} check {} }`,
/// and in a group also `task` and `connect {}`.
fn parse_service(walker: &mut Walker, at: &str, block: &Object, in_group: bool) -> ApiService {
    let mut keys = vec![
        "name",
        "port",
        "address_mode",
        "tags",
        "canary_tags",
        "enable_tag_override",
        "meta",
        "check",
    ];
    if in_group {
        keys.extend(["task", "connect"]);
    }
    walker.known(at, block, &keys);
    let checks = walker
        .repeated(at, block, "check")
        .into_iter()
        .map(|check| {
            let at = format!("{at} check");
            walker.known(
                &at,
                check,
                &[
                    "name",
                    "type",
                    "command",
                    "args",
                    "path",
                    "protocol",
                    "method",
                    "port",
                    "interval",
                    "timeout",
                    "initial_status",
                    "grpc_service",
                    "grpc_use_tls",
                    "tls_skip_verify",
                    "header",
                ],
            );
            let header = walker.single(&at, check, "header").map(|header| {
                header
                    .iter()
                    .map(|(name, values)| {
                        let values = match values {
                            serde_json::Value::Array(values) => values
                                .iter()
                                .map(|value| value.as_str().map(str::to_string))
                                .collect::<Option<Vec<String>>>(),
                            _ => None,
                        };
                        if values.is_none() {
                            walker.problem(&format!("{at} header"), format!("{name:?} must be a list of strings"));
                        }
                        (name.clone(), values.unwrap_or_default())
                    })
                    .collect()
            });
            ApiServiceCheck {
                name: walker.string(&at, check, "name").unwrap_or_default(),
                check_type: walker.string(&at, check, "type").unwrap_or_default(),
                command: walker.string(&at, check, "command").unwrap_or_default(),
                args: walker.strings(&at, check, "args").unwrap_or_default(),
                path: walker.string(&at, check, "path").unwrap_or_default(),
                protocol: walker.string(&at, check, "protocol").unwrap_or_default(),
                method: walker.string(&at, check, "method").unwrap_or_default(),
                port_label: walker.string(&at, check, "port").unwrap_or_default(),
                interval: walker.duration(&at, check, "interval").unwrap_or_default(),
                timeout: walker.duration(&at, check, "timeout").unwrap_or_default(),
                initial_status: walker.string(&at, check, "initial_status").unwrap_or_default(),
                grpc_service: walker.string(&at, check, "grpc_service").unwrap_or_default(),
                grpc_use_tls: walker.boolean(&at, check, "grpc_use_tls").unwrap_or(false),
                tls_skip_verify: walker.boolean(&at, check, "tls_skip_verify").unwrap_or(false),
                header: header.unwrap_or_default(),
            }
        })
        .collect();
    ApiService {
        name: walker.string(at, block, "name").unwrap_or_default(),
        port_label: walker.string(at, block, "port").unwrap_or_default(),
        address_mode: walker.string(at, block, "address_mode").unwrap_or_default(),
        tags: walker.strings(at, block, "tags").unwrap_or_default(),
        canary_tags: walker.strings(at, block, "canary_tags").unwrap_or_default(),
        enable_tag_override: walker.boolean(at, block, "enable_tag_override").unwrap_or(false),
        meta: walker.string_map(at, block, "meta"),
        checks,
        task_name: walker.string(at, block, "task").unwrap_or_default(),
        connect: walker
            .single(at, block, "connect")
            .map(|connect| connect::parse_connect(walker, &format!("{at} connect"), connect)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_core::structs::{AccessMode, ConfigValue, CsiPluginType, JobType, VolumeType};

    #[test]
    fn a_plugin_job_and_a_consumer_parse_into_the_core_job() {
        let job = parse(
            r#"
job "plugin" {
  type        = "system"
  datacenters = ["dc1"]
  group "nodes" {
    task "plugin" {
      driver = "raw_exec"
      config {
        command = "drover-csi-fake"
        args    = ["--endpoint", "${CSI_ENDPOINT}"]
      }
      csi_plugin {
        id             = "fake"
        type           = "monolith"
        mount_dir      = "/csi"
        health_timeout = "1m30s"
      }
      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        assert_eq!(job.job_type, JobType::System);
        let task = &job.task_groups[0].tasks[0];
        let plugin = task.csi_plugin.as_ref().unwrap();
        assert_eq!(
            (plugin.id.as_str(), plugin.plugin_type),
            ("fake", CsiPluginType::Monolith)
        );
        assert_eq!(plugin.health_timeout.as_secs(), 90);
        assert_eq!(
            task.config["args"],
            ConfigValue::List(vec![
                ConfigValue::String("--endpoint".into()),
                ConfigValue::String("${CSI_ENDPOINT}".into())
            ])
        );

        let job = parse(
            r#"
job "writer" {
  group "g" {
    count = 1
    volume "data" {
      type            = "csi"
      source          = "vol0"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      mount_options {
        fs_type = "ext4"
      }
    }
    task "w" {
      driver = "exec"
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
      kill_timeout = "2s"
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        let request = &job.task_groups[0].volumes["data"];
        assert_eq!(request.volume_type, VolumeType::Csi);
        assert_eq!(request.access_mode, AccessMode::SingleNodeWriter);
        assert_eq!(request.mount_options.as_ref().unwrap().fs_type, "ext4");
        assert_eq!(job.task_groups[0].tasks[0].volume_mounts[0].destination, "/data");
        assert_eq!(job.task_groups[0].tasks[0].kill_timeout.as_secs(), 2);
    }

    #[test]
    fn meta_blocks_at_every_level_reach_the_core_job_and_come_back_from_the_api() {
        let job = parse(
            r#"
job "web" {
  meta {
    owner = "job-team"
    tier  = "1"
  }
  group "g" {
    meta { tier = "2" }
    task "t" {
      driver = "raw_exec"
      meta { owner = "task-team" }
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        assert_eq!(job.meta["owner"], "job-team");
        assert_eq!(job.task_groups[0].meta["tier"], "2");
        assert_eq!(job.task_groups[0].tasks[0].meta["owner"], "task-team");
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        assert_eq!(api.to_job().unwrap(), job);
    }

    #[test]
    fn network_blocks_parse_static_and_dynamic_ports_and_round_trip_through_the_api() {
        let job = parse(
            r#"
job "web" {
  group "g" {
    network {
      mode = "host"
      port "http" { static = 8080 }
      port "admin" {}
      port "db" { to = 5432 }
    }
    task "t" {
      driver = "raw_exec"
      resources {
        network {
          mbits = 10
          port "metrics" {}
        }
      }
      service {
        name = "web"
        port = "http"
      }
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        let network = &job.task_groups[0].networks[0];
        assert_eq!(network.mode, "host");
        assert_eq!(
            network
                .reserved_ports
                .iter()
                .map(|p| (p.label.as_str(), p.value))
                .collect::<Vec<_>>(),
            [("http", 8080)]
        );
        assert_eq!(
            network
                .dynamic_ports
                .iter()
                .map(|p| (p.label.as_str(), p.to))
                .collect::<Vec<_>>(),
            [("admin", 0), ("db", 5432)]
        );
        let task = &job.task_groups[0].tasks[0];
        assert_eq!(task.resources.networks[0].dynamic_ports[0].label, "metrics");
        assert_eq!(task.resources.networks[0].mbits, 10);
        assert_eq!(drover_core::jobspec::validate(&job), Vec::<String>::new());
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        let json = serde_json::to_value(&api).unwrap();
        assert_eq!(json["TaskGroups"][0]["Networks"][0]["ReservedPorts"][0]["Value"], 8080);
        assert_eq!(json["TaskGroups"][0]["Networks"][0]["DynamicPorts"][1]["To"], 5432);
        assert_eq!(api.to_job().unwrap(), job);
    }

    #[test]
    fn constraints_and_affinities_parse_with_nomads_shorthands_and_defaults() {
        let job = parse(
            r#"
job "web" {
  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }
  affinity {
    attribute = "${meta.rack}"
    value     = "r1"
  }
  group "g" {
    constraint {
      distinct_hosts = true
    }
    constraint {
      distinct_property = "${meta.rack}"
      value             = 2
    }
    task "t" {
      driver = "raw_exec"
      resources {
        cpu        = 100
        memory     = 128
        memory_max = 256
      }
      constraint {
        attribute = "${attr.nomad.version}"
        operator  = "version"
        value     = ">= 1.0"
      }
      affinity {
        attribute = "${node.class}"
        operator  = "!="
        value     = "spot"
        weight    = -30
      }
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        let constraint = |l: &str, o: &str, r: &str| drover_core::structs::Constraint {
            ltarget: l.into(),
            rtarget: r.into(),
            operand: o.into(),
        };
        assert_eq!(job.constraints, [constraint("${attr.kernel.name}", "=", "linux")]);
        assert_eq!(job.affinities[0].weight, 50);
        assert_eq!(
            job.task_groups[0].constraints,
            [
                constraint("", "distinct_hosts", ""),
                constraint("${meta.rack}", "distinct_property", "2")
            ]
        );
        let task = &job.task_groups[0].tasks[0];
        assert_eq!(
            task.constraints,
            [constraint("${attr.nomad.version}", "version", ">= 1.0")]
        );
        assert_eq!(
            (task.affinities[0].operand.as_str(), task.affinities[0].weight),
            ("!=", -30)
        );
        assert_eq!((task.resources.memory_mb, task.resources.memory_max_mb), (128, 256));
        assert!(
            drover_core::jobspec::validate(&job).is_empty(),
            "{:?}",
            drover_core::jobspec::validate(&job)
        );
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        assert_eq!(api.to_job().unwrap(), job);
    }

    /// What Nomad's HCL takes and Drover refused: the operator shorthands (`regexp = …`,
    /// `version`, `semver`, `set_contains`, and for affinities `set_contains_any|all`),
    /// numbers and booleans written as strings (and a number where text is expected, such as
    /// a service `port = 8080`), a count left unset beside `scaling { min }`, and the mock
    /// driver by its Nomad name.
    #[test]
    fn nomads_shorthands_and_hcl_type_conversions_are_taken() {
        let job = parse(
            r#"
job "web" {
  priority = "70"
  all_at_once = "false"
  constraint {
    attribute = "${attr.kernel.name}"
    regexp    = "[Ll]inux"
  }
  constraint {
    attribute = "${attr.nomad.version}"
    semver    = ">= 1.1.0"
  }
  affinity {
    attribute        = "${meta.tags}"
    set_contains_any = "ssd,nvme"
    weight           = "40"
  }
  group "g" {
    scaling {
      min = 3
      max = 10
    }
    constraint {
      attribute    = "${meta.zones}"
      set_contains = "a"
    }
    task "t" {
      driver = "mock_driver"
      resources {
        cpu    = "200"
        memory = 64
      }
      service {
        port         = 8080
        address_mode = "driver"
      }
      volume_mount {
        volume      = "v"
        destination = "/v"
        read_only   = "true"
      }
    }
    volume "v" {
      type   = "host"
      source = "data"
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        let constraint = |l: &str, o: &str, r: &str| drover_core::structs::Constraint {
            ltarget: l.into(),
            rtarget: r.into(),
            operand: o.into(),
        };
        assert_eq!(job.priority, 70);
        assert_eq!(
            job.constraints,
            [
                constraint("${attr.kernel.name}", "regexp", "[Ll]inux"),
                constraint("${attr.nomad.version}", "semver", ">= 1.1.0")
            ]
        );
        assert_eq!(
            (
                job.affinities[0].operand.as_str(),
                job.affinities[0].rtarget.as_str(),
                job.affinities[0].weight
            ),
            ("set_contains_any", "ssd,nvme", 40)
        );
        let group = &job.task_groups[0];
        assert_eq!(group.count, 3, "count starts at scaling's min");
        assert_eq!(group.constraints, [constraint("${meta.zones}", "set_contains", "a")]);
        let task = &group.tasks[0];
        assert_eq!(task.driver, "mock_driver");
        assert_eq!(task.resources.cpu, 200);
        assert_eq!(task.services[0].port_label, "8080");
        assert!(task.volume_mounts[0].read_only);
        assert!(
            drover_core::jobspec::validate(&job).is_empty(),
            "{:?}",
            drover_core::jobspec::validate(&job)
        );
        let problems = parse(
            r#"
job "web" {
  group "g" {
    count = "many"
    constraint {
      attribute = "${attr.kernel.name}"
      regexp    = "linux"
      version   = "1"
    }
    task "t" {
      driver = "raw_exec"
    }
  }
}
"#,
        )
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "job \"web\" group \"g\": count must be a non-negative whole number",
                "job \"web\" group \"g\" constraint: only one of regexp, version may be given",
            ]
        );
    }

    /// `reschedule` and `migrate` at job level are laid under each group's (which read them
    /// back, as Nomad's do), over the job type's default; a bad delay function is named.
    #[test]
    fn job_and_group_reschedule_and_migrate_blocks_merge_into_each_group() {
        use drover_core::structs::{DelayFunction, ReschedulePolicy};
        let job = parse(
            r#"
job "web" {
  all_at_once = true
  reschedule {
    delay          = "10s"
    delay_function = "fibonacci"
    max_delay      = "2m"
  }
  migrate {
    max_parallel = 2
  }
  spread {
    attribute = "${node.datacenter}"
    weight    = 100
    target "dc1" {
      percent = 70
    }
    target "dc2" {
      percent = 30
    }
  }
  group "a" {
    spread {
      attribute = "${meta.rack}"
    }
    reschedule {
      attempts  = 4
      interval  = "1h"
      unlimited = false
    }
    task "t" {
      driver = "raw_exec"
    }
  }
  group "b" {
    migrate {
      max_parallel = 3
    }
    task "t" {
      driver = "raw_exec"
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap();
        assert!(job.all_at_once);
        assert_eq!(job.spreads[0].weight, 100);
        assert_eq!(
            job.spreads[0]
                .targets
                .iter()
                .map(|t| (t.value.as_str(), t.percent))
                .collect::<Vec<_>>(),
            [("dc1", 70), ("dc2", 30)]
        );
        let a = &job.task_groups[0];
        assert_eq!(
            (a.spreads[0].attribute.as_str(), a.spreads[0].weight),
            ("${meta.rack}", drover_core::structs::SPREAD_WEIGHT_DEFAULT)
        );
        assert_eq!(
            a.reschedule_policy,
            Some(ReschedulePolicy {
                attempts: 4,
                interval: std::time::Duration::from_secs(3_600),
                delay: std::time::Duration::from_secs(10),
                delay_function: DelayFunction::Fibonacci,
                max_delay: std::time::Duration::from_secs(120),
                unlimited: false,
            })
        );
        assert_eq!(a.migrate().max_parallel, 2, "the job's migrate");
        let b = &job.task_groups[1];
        assert_eq!(
            b.reschedule_policy.unwrap().attempts,
            ReschedulePolicy::SERVICE.attempts
        );
        assert!(b.reschedule_policy.unwrap().unlimited);
        assert_eq!(b.migrate().max_parallel, 3, "the group's own");
        assert!(
            drover_core::jobspec::validate(&job).is_empty(),
            "{:?}",
            drover_core::jobspec::validate(&job)
        );
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        assert_eq!(api.to_job().unwrap(), job);
        let wire = serde_json::to_value(&api).unwrap();
        assert_eq!(wire["AllAtOnce"], true);
        assert_eq!(wire["TaskGroups"][0]["ReschedulePolicy"]["DelayFunction"], "fibonacci");
        assert_eq!(wire["TaskGroups"][0]["ReschedulePolicy"]["Attempts"], 4);
        assert_eq!(wire["Spreads"][0]["SpreadTarget"][1]["Percent"], 30);

        // A system job has no policy unless one is written, which validation refuses.
        let system = parse(
            r#"
job "sys" {
  type = "system"
  group "g" {
    reschedule {
      delay_function = "linear"
    }
    task "t" {
      driver = "raw_exec"
    }
  }
}
"#,
        )
        .unwrap()
        .to_job()
        .unwrap_err();
        assert_eq!(
            system,
            ["Invalid delay function \"linear\", must be one of [\"constant\" \"exponential\" \"fibonacci\"]"]
        );
    }

    /// `leader` and `kill_signal` are kept and come back; two leaders, or a signal no one
    /// knows, are refused by validation with what is wrong.
    #[test]
    fn leader_and_kill_signal_round_trip_and_are_validated() {
        let spec = |signal: &str, second_leader: bool| {
            format!(
                "job \"w\" {{\n  group \"g\" {{\n    task \"main\" {{\n      driver = \"raw_exec\"\n      leader = true\n      kill_signal = \"{signal}\"\n    }}\n    task \"side\" {{\n      driver = \"raw_exec\"\n      leader = {second_leader}\n    }}\n  }}\n}}\n"
            )
        };
        let job = parse(&spec("SIGTERM", false)).unwrap().to_job().unwrap();
        let main = &job.task_groups[0].tasks[0];
        assert_eq!((main.leader, main.kill_signal.as_str()), (true, "SIGTERM"));
        assert!(
            drover_core::jobspec::validate(&job).is_empty(),
            "{:?}",
            drover_core::jobspec::validate(&job)
        );
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        let wire = serde_json::to_value(&api).unwrap();
        assert_eq!(wire["TaskGroups"][0]["Tasks"][0]["KillSignal"], "SIGTERM");
        assert_eq!(wire["TaskGroups"][0]["Tasks"][0]["Leader"], true);
        assert_eq!(api.to_job().unwrap(), job);
        let bad = parse(&spec("SIGWHAT", true)).unwrap().to_job().unwrap();
        let problems = drover_core::jobspec::validate(&bad).join("\n");
        assert!(problems.contains("Only one task may be marked as leader"), "{problems}");
        assert!(problems.contains("kill_signal \"SIGWHAT\""), "{problems}");
    }

    /// A task's `restart` block is laid over its group's, field by field (and a group's over
    /// its job type's default), kept, and read back; a task without one follows its group.
    #[test]
    fn a_tasks_restart_block_is_laid_over_its_groups_and_round_trips() {
        let job = parse(
            "job \"w\" {\n  type = \"batch\"\n  group \"g\" {\n    restart {\n      attempts = 5\n    }\n    task \"own\" {\n      driver = \"raw_exec\"\n      restart {\n        delay = \"3s\"\n        mode = \"delay\"\n      }\n    }\n    task \"plain\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n",
        )
        .unwrap()
        .to_job()
        .unwrap();
        let group = &job.task_groups[0];
        let batch = drover_core::structs::RestartPolicy::BATCH;
        let group_policy = group.restart_policy.unwrap();
        assert_eq!(
            (group_policy.attempts, group_policy.delay),
            (5, batch.delay),
            "over the batch default"
        );
        let own = group.tasks[0].restart_policy.unwrap();
        assert_eq!(own.attempts, 5, "the group's attempts");
        assert_eq!(own.delay, std::time::Duration::from_secs(3));
        assert_eq!(own.mode, drover_core::structs::RestartMode::Delay);
        assert_eq!(own.interval, batch.interval);
        assert_eq!(group.tasks[1].restart_policy, None);
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        let wire = serde_json::to_value(&api).unwrap();
        assert_eq!(
            wire["TaskGroups"][0]["Tasks"][0]["RestartPolicy"]["Delay"],
            3_000_000_000_i64
        );
        assert_eq!(wire["TaskGroups"][0]["Tasks"][0]["RestartPolicy"]["Attempts"], 5);
        assert_eq!(api.to_job().unwrap(), job);
    }

    /// `shutdown_delay` on a group and a task is kept and read back (JSON: nanoseconds).
    #[test]
    fn shutdown_delays_round_trip() {
        let job = parse(
            "job \"w\" {\n  group \"g\" {\n    shutdown_delay = \"2s\"\n    stop_after_client_disconnect = \"90s\"\n    task \"t\" {\n      driver = \"raw_exec\"\n      shutdown_delay = \"5s\"\n    }\n  }\n}\n",
        )
        .unwrap()
        .to_job()
        .unwrap();
        let group = &job.task_groups[0];
        assert_eq!(group.shutdown_delay, Some(std::time::Duration::from_secs(2)));
        assert_eq!(
            group.stop_after_client_disconnect,
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(group.tasks[0].shutdown_delay, std::time::Duration::from_secs(5));
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        let wire = serde_json::to_value(&api).unwrap();
        assert_eq!(wire["TaskGroups"][0]["ShutdownDelay"], 2_000_000_000_i64);
        assert_eq!(wire["TaskGroups"][0]["StopAfterClientDisconnect"], 90_000_000_000_i64);
        assert_eq!(wire["TaskGroups"][0]["Tasks"][0]["ShutdownDelay"], 5_000_000_000_i64);
        assert_eq!(api.to_job().unwrap(), job);
    }

    /// `ephemeral_disk { size }` is kept and read back (JSON `EphemeralDisk.SizeMB`); `sticky`
    /// and `migrate`, not honoured, are refused by name rather than stored and ignored.
    #[test]
    fn ephemeral_disk_size_round_trips_and_sticky_is_refused() {
        let spec = |extra: &str| {
            format!(
                "job \"w\" {{\n  group \"g\" {{\n    ephemeral_disk {{\n      size = 500\n{extra}    }}\n    task \"t\" {{\n      driver = \"raw_exec\"\n    }}\n  }}\n}}\n"
            )
        };
        let job = parse(&spec("")).unwrap().to_job().unwrap();
        let disk = job.task_groups[0].ephemeral_disk.unwrap();
        assert_eq!((disk.size_mb, disk.sticky, disk.migrate), (500, false, false));
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        let wire = serde_json::to_value(&api).unwrap();
        assert_eq!(wire["TaskGroups"][0]["EphemeralDisk"]["SizeMB"], 500);
        assert_eq!(api.to_job().unwrap(), job);
        let refused = parse(&spec("      sticky = true\n"))
            .unwrap()
            .to_job()
            .unwrap_err()
            .join("\n");
        assert!(refused.contains("ephemeral_disk: sticky is not supported"), "{refused}");
    }

    #[test]
    fn services_and_checks_parse_into_canonical_core_services() {
        let api = parse(
            r#"
job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      service {
        tags                = ["a", "b"]
        enable_tag_override = true
        meta {
          version = 2
        }
        check {
          type     = "script"
          command  = "/bin/true"
          interval = "10s"
          timeout  = "2s"
        }
      }
      service {
        name         = "${JOB}-admin"
        port         = "9090"
        address_mode = "driver"
        check {
          name     = "admin alive"
          type     = "tcp"
          interval = "5s"
          timeout  = "1s"
        }
      }
    }
  }
}
"#,
        )
        .unwrap();
        let job = api.to_job().unwrap();
        let errors = drover_core::jobspec::validate(&job);
        assert_eq!(errors.len(), 1, "only the script check is refused: {errors:?}");
        assert_eq!(
            errors[0],
            format!(
                "Task group g validation failed: Task t validation failed: {}: check \"service: \\\"web-g-t\\\" check\"",
                drover_core::jobspec::SCRIPT_CHECKS_REFUSED
            )
        );
        let services = &job.task_groups[0].tasks[0].services;
        assert_eq!(services.len(), 2);
        assert_eq!(services[0].name, "web-g-t");
        assert_eq!(services[0].tags, ["a", "b"]);
        assert!(services[0].enable_tag_override);
        assert_eq!(services[0].meta["version"], "2");
        assert_eq!(services[0].checks[0].name, "service: \"web-g-t\" check");
        assert_eq!(services[0].checks[0].interval.as_secs(), 10);
        assert_eq!(services[1].name, "web-admin");
        assert_eq!(services[1].checks[0].check_type, "tcp");
        // The API form round-trips what the core stores.
        let back = crate::jobs::ApiJob::from_job(&job, "pending").to_job().unwrap();
        assert_eq!(back.task_groups[0].tasks[0].services, *services);

        let bad = parse(
            r#"
job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      service {
        port = "http"
        connect {}
        check {
          type     = "http"
          interval = "500ms"
          timeout  = "1s"
        }
      }
    }
  }
}
"#,
        );
        assert_eq!(
            bad.unwrap_err(),
            ["job \"web\" group \"g\" task \"t\" service: unsupported key \"connect\""]
        );
    }

    #[test]
    fn every_problem_is_named_with_where_it_is() {
        let problems = parse(
            r#"
job "web" {
  colour = "blue"
  group "g" {
    count = "two"
    task "t" {
      driver       = "exec"
      kill_timeout = "soon"
      resources { disk = 10 }
    }
  }
}
"#,
        )
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "job \"web\": unsupported key \"colour\"",
                "job \"web\" group \"g\": count must be a non-negative whole number",
                "job \"web\" group \"g\" task \"t\" resources: unsupported key \"disk\"",
                "job \"web\" group \"g\" task \"t\": kill_timeout \"soon\" is not a duration such as \"30s\"",
            ]
        );
        assert!(parse("job {").unwrap_err()[0].starts_with("error parsing jobspec"));
        assert_eq!(parse_duration("1m30s"), Some(90_000_000_000));
        assert_eq!(parse_duration("250ms"), Some(250_000_000));
    }

    #[test]
    fn cores_are_read_and_take_the_place_of_cpu() {
        let job = |resources: &str| {
            parse(&format!(
                "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"docker\"\n      config {{\n        image = \"busybox\"\n      }}\n      resources {{\n{resources}\n      }}\n    }}\n  }}\n}}\n"
            ))
            .unwrap()
            .to_job()
            .unwrap()
        };
        let pinned = job("        cores  = 2\n        memory = 256");
        let resources = &pinned.task_groups[0].tasks[0].resources;
        // No default CPU beside cores (Nomad's canonicalisation): validation passes.
        assert_eq!((resources.cores, resources.cpu), (2, 0));
        assert!(
            drover_core::jobspec::validate(&pinned).is_empty(),
            "{:?}",
            drover_core::jobspec::validate(&pinned)
        );
        let api = crate::jobs::ApiJob::from_job(&pinned, "pending");
        assert_eq!(api.to_job().unwrap(), pinned);
        let both = job("        cores = 2\n        cpu   = 500");
        assert!(
            drover_core::jobspec::validate(&both)
                .iter()
                .any(|problem| problem.ends_with("Task can only ask for 'cpu' or 'cores' resource, not both.")),
            "{:?}",
            drover_core::jobspec::validate(&both)
        );
    }
}
