//! Job validation at registration: every problem of a jobspec, with Nomad's texts where the
//! reference gives them (§3.10 volume requests, §1.1 `csi_plugin`), so a bad job is refused
//! with the whole list and nothing is stored.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use crate::structs::{
    AccessMode, Affinity, AttachmentMode, Constraint, Job, JobType, Service, Task, TaskGroup, VolumeRequest, VolumeType,
};

/// Nomad's bounds on `priority`.
pub const PRIORITY_MIN: u32 = 1;
pub const PRIORITY_MAX: u32 = 100;
/// At most this many allocations per task group: what one registration can ask the scheduler
/// to build and place. A job stored above it (by an earlier build) is scheduled up to it.
pub use limits::GROUP_COUNT_MAX;

pub mod limits;
pub const PRIORITY_DEFAULT: u32 = 50;
const _: () = assert!(
    PRIORITY_MIN <= PRIORITY_DEFAULT && PRIORITY_DEFAULT <= PRIORITY_MAX,
    "the default priority is a valid one"
);

/// Every problem with `job` under the default limits, in order; empty when it may be
/// registered.
pub fn validate(job: &Job) -> Vec<String> {
    validate_within(job, &limits::JobLimits::default())
}

/// Nomad's admission of a job being registered: its name defaults to its ID, the mutators run
/// (Connect sidecars), then validation sees what would be stored. Every problem, in order.
pub fn admit(job: &mut Job, limits: &limits::JobLimits) -> Vec<String> {
    if job.name.is_empty() {
        job.name = job.id.clone();
    }
    let mut errors = Vec::new();
    if let Err(error) = crate::connect::mutate(job) {
        errors.push(error);
    }
    errors.extend(validate_within(job, limits));
    errors
}

/// Every problem with `job` under `limits`, in order.
pub fn validate_within(job: &Job, limits: &limits::JobLimits) -> Vec<String> {
    let mut errors = limits::structure(job, limits);
    if !errors.is_empty() {
        return errors;
    }
    errors.extend(limits::job_id(&job.id));
    if job.name.is_empty() {
        errors.push("Missing job name".to_string());
    } else {
        errors.extend(limits::job_name(&job.name));
    }
    if job.namespace.is_empty() {
        errors.push("Job must be in a namespace".to_string());
    } else if let Err(error) = crate::structs::check_namespace(&job.namespace) {
        errors.push(error);
    }
    if !(PRIORITY_MIN..=PRIORITY_MAX).contains(&job.priority) {
        errors.push(format!("Job priority must be between [{PRIORITY_MIN}, {PRIORITY_MAX}]"));
    }
    if job.datacenters.iter().any(String::is_empty) {
        errors.push("Job datacenter must be non-empty string".to_string());
    }
    if job.task_groups.is_empty() {
        errors.push("Missing job task groups".to_string());
    }
    errors.extend(placement_rules(&job.constraints, &job.affinities));
    errors.extend(job.spreads.iter().flat_map(crate::structs::Spread::problems));
    let mut names = BTreeSet::new();
    for (position, group) in job.task_groups.iter().enumerate() {
        if group.name.is_empty() {
            errors.push(format!("Job task group {} missing name", position + 1));
        } else if !names.insert(group.name.clone()) {
            errors.push(format!(
                "Job task group {} redefines '{}'",
                position + 1,
                limits::shown(&group.name)
            ));
        }
        let problems = limits::component("Task group", &group.name)
            .filter(|_| !group.name.is_empty())
            .into_iter()
            .chain(validate_group(job, group, limits));
        for problem in problems {
            errors.push(format!(
                "Task group {} validation failed: {problem}",
                limits::shown(&group.name)
            ));
        }
    }
    errors
}

fn validate_group(job: &Job, group: &TaskGroup, limits: &limits::JobLimits) -> Vec<String> {
    let mut errors = Vec::new();
    if job.job_type == JobType::System && group.count > 1 {
        errors.push(format!(
            "Task group {} has count {}; system jobs run one allocation per node (count must be 0 or 1)",
            group.name, group.count
        ));
    }
    if group.count > limits.group_count {
        errors.push(format!(
            "Task group count {} is more than the limit of {} allocations per group",
            group.count, limits.group_count
        ));
    }
    if group.tasks.is_empty() {
        errors.push("Missing tasks for task group".to_string());
    }
    if let Some(update) = &group.update {
        match job.job_type {
            JobType::Service | JobType::System => errors.extend(update.problems()),
            JobType::Batch => errors.push(format!(
                "Job type {:?} does not allow update block",
                job.job_type.as_str()
            )),
        }
    }
    if let Some(scaling) = &group.scaling {
        errors.extend(scaling.problems(group.count));
    }
    if let Some(policy) = &group.reschedule_policy {
        if job.job_type == JobType::System {
            errors.push("System jobs should not have a reschedule policy".into());
        } else {
            errors.extend(
                policy
                    .problems()
                    .into_iter()
                    .map(|problem| format!("Task group {}: reschedule: {problem}", group.name)),
            );
        }
    }
    errors.extend(placement_rules(&group.constraints, &group.affinities));
    errors.extend(group.spreads.iter().flat_map(crate::structs::Spread::problems));
    errors.extend(crate::structs::validate_networks(group));
    let group_ports: BTreeSet<String> = group
        .networks
        .iter()
        .flat_map(crate::structs::NetworkResource::ports)
        .map(|port| port.label.clone())
        .collect();
    // In a network of its own a group service may name the port it binds there by number
    // (Nomad's Connect jobs: `port = "9001"`).
    let own_network = group
        .networks
        .first()
        .is_some_and(|network| network.mode == crate::structs::NETWORK_MODE_BRIDGE);
    errors.extend(validate_services(&group.services, &group_ports, own_network));
    errors.extend(crate::connect::validate_group(group));
    for (alias, request) in &group.volumes {
        for problem in validate_volume(job, group, request) {
            errors.push(format!("Volume {alias}: {problem}"));
        }
    }
    if group.tasks.iter().filter(|task| task.leader).count() > 1 {
        errors.push("Only one task may be marked as leader".into());
    }
    let mut task_names = BTreeSet::new();
    for (position, task) in group.tasks.iter().enumerate() {
        if task.name.is_empty() {
            errors.push(format!("Task {} missing name", position + 1));
            continue;
        }
        if !task_names.insert(task.name.clone()) {
            errors.push(format!(
                "Task {} redefines '{}'",
                position + 1,
                limits::shown(&task.name)
            ));
        }
        let mut problems: Vec<String> = limits::component("Task", &task.name).into_iter().collect();
        if task.driver.is_empty() {
            problems.push("Missing task driver".to_string());
        }
        problems.extend(
            crate::driverspec::check(&task.driver, &task.config)
                .iter()
                .map(ToString::to_string),
        );
        if !task.kill_signal.is_empty() && crate::structs::signal_number(&task.kill_signal).is_none() {
            problems.push(format!(
                "kill_signal {:?} is not a signal this agent knows",
                task.kill_signal
            ));
        }
        if task.resources.cores > 0 && task.resources.cpu > 0 {
            problems.push("Task can only ask for 'cpu' or 'cores' resource, not both.".to_string());
        } else if task.resources.cpu < 1 && task.resources.cores == 0 {
            problems.push("Minimum CPU value is 1; got 0".to_string());
        }
        let max = task.resources.memory_max_mb;
        if max > 0 && max < task.resources.memory_mb {
            problems.push(format!(
                "MemoryMaxMB value ({max}) should be larger than MemoryMB value ({})",
                task.resources.memory_mb
            ));
        }
        if task.resources.memory_mb < 10 {
            problems.push(format!(
                "Minimum MemoryMB value is 10; got {}",
                task.resources.memory_mb
            ));
        }
        for (mount_position, mount) in task.volume_mounts.iter().enumerate() {
            if !group.volumes.contains_key(&mount.volume) {
                problems.push(format!(
                    "Volume Mount ({mount_position}) references undefined volume {}",
                    mount.volume
                ));
            }
            if mount.destination.is_empty() {
                problems.push(format!("Volume Mount ({mount_position}) has an empty destination"));
            }
        }
        if let Some(plugin) = &task.csi_plugin {
            problems.extend(plugin.validate());
        }
        problems.extend(validate_services(
            &task.services,
            &crate::structs::port_labels(group, task),
            false,
        ));
        if let Some(lifecycle) = &task.lifecycle
            && let Err(problem) = lifecycle.validate()
        {
            problems.push(format!("Lifecycle validation failed: {problem}"));
        }
        problems.extend(validate_templates(task));
        problems.extend(task.logs.validate());
        problems.extend(placement_rules(&task.constraints, &task.affinities));
        for problem in problems {
            errors.push(format!(
                "Task {} validation failed: {problem}",
                limits::shown(&task.name)
            ));
        }
    }
    errors
}

/// Nomad's template checks in `Task.Validate`: each template valid, no destination twice.
fn validate_templates(task: &Task) -> Vec<String> {
    let mut errors = Vec::new();
    let mut destinations: BTreeMap<&str, usize> = BTreeMap::new();
    for (position, template) in task.templates.iter().enumerate() {
        for problem in template.validate() {
            errors.push(format!("Template {} validation failed: {problem}", position + 1));
        }
        if let Some(other) = destinations.get(template.dest_path.as_str()) {
            errors.push(format!("Template {} has same destination as {other}", position + 1));
        } else {
            destinations.insert(&template.dest_path, position + 1);
        }
    }
    errors
}

/// Every problem of a level's `constraint` and `affinity` blocks, numbered from 1 as Nomad's.
fn placement_rules(constraints: &[Constraint], affinities: &[Affinity]) -> Vec<String> {
    let mut errors = Vec::new();
    for (position, constraint) in constraints.iter().enumerate() {
        for problem in constraint.validate() {
            errors.push(format!("Constraint {} validation failed: {problem}", position + 1));
        }
    }
    for (position, affinity) in affinities.iter().enumerate() {
        for problem in affinity.validate() {
            errors.push(format!("Affinity {} validation failed: {problem}", position + 1));
        }
    }
    errors
}

/// Why a `script` check is refused: Drover does not run them yet (Consul TTL checks fed by
/// a command run in the task).
pub const SCRIPT_CHECKS_REFUSED: &str = "script checks are not supported by Drover yet; use an http, tcp or grpc check";

/// Nomad's `validateServices`: each service valid, no name twice on one port, no check name
/// twice in a service, and every port label one of `task_ports` (the group network's and the
/// task's own) — or a literal port number with `address_mode = "driver"`, or in a group's own
/// network (`numbers_inside`).
fn validate_services(services: &[Service], task_ports: &BTreeSet<String>, numbers_inside: bool) -> Vec<String> {
    let mut errors = Vec::new();
    let mut known = BTreeSet::new();
    let mut ports: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (position, service) in services.iter().enumerate() {
        let problems = service.validate();
        if !problems.is_empty() {
            errors.push(format!(
                "service[{position}] {:?} validation failed: {}",
                service.name,
                problems.join("; ")
            ));
        }
        if !known.insert((service.name.as_str(), service.port_label.as_str())) {
            errors.push(format!("service {:?} is duplicate", service.name));
        }
        let mut checks = BTreeSet::new();
        for check in &service.checks {
            if !checks.insert(check.name.as_str()) {
                errors.push(format!("check {:?} is duplicate", check.name));
            }
            // Accepted and never run would be a health check silently dropped.
            if check.check_type == "script" {
                errors.push(format!("{SCRIPT_CHECKS_REFUSED}: check {:?}", check.name));
            }
            if !check.port_label.is_empty() {
                ports
                    .entry(check.port_label.as_str())
                    .or_default()
                    .insert(service.name.as_str());
            }
        }
        if service.port_label.is_empty()
            || ((service.address_mode == "driver" || numbers_inside) && service.port_label.parse::<u16>().is_ok())
        {
            continue;
        }
        ports
            .entry(service.port_label.as_str())
            .or_default()
            .insert(service.name.as_str());
    }
    for (label, services) in ports {
        if !task_ports.contains(label) {
            let names: Vec<&str> = services.into_iter().collect();
            errors.push(format!(
                "port label {label:?} referenced by services {} does not exist",
                names.join(", ")
            ));
        }
    }
    errors
}

/// §3.10.
fn validate_volume(job: &Job, group: &TaskGroup, request: &VolumeRequest) -> Vec<String> {
    let mut errors = Vec::new();
    if request.source.is_empty() {
        errors.push("volume has an empty source".to_string());
    }
    if request.per_alloc && job.job_type == JobType::System {
        errors.push("volume cannot be per_alloc for system or sysbatch jobs".to_string());
    }
    match request.volume_type {
        VolumeType::Host => {
            if request.mount_options.is_some() {
                errors.push("host volumes cannot have mount options".to_string());
            }
            match request.access_mode {
                AccessMode::Unknown
                | AccessMode::SingleNodeWriter
                | AccessMode::MultiNodeSingleWriter
                | AccessMode::MultiNodeMultiWriter => {}
                AccessMode::SingleNodeReader => {
                    if !request.read_only {
                        errors.push(format!("{} volumes must be read-only", request.access_mode));
                    }
                }
                other => errors.push(format!("host volumes cannot have an access mode of {other}")),
            }
        }
        VolumeType::Csi => {
            match request.attachment_mode {
                AttachmentMode::Unknown => errors.push("CSI volumes must have an attachment mode".to_string()),
                AttachmentMode::BlockDevice if request.mount_options.is_some() => {
                    errors.push("block devices cannot have mount options".to_string());
                }
                _ => {}
            }
            let many = group.count > 1 && !request.per_alloc;
            match request.access_mode {
                AccessMode::Unknown => errors.push("CSI volumes must have an access mode".to_string()),
                AccessMode::SingleNodeReader => {
                    if !request.read_only {
                        errors.push(format!("{} volumes must be read-only", request.access_mode));
                    }
                    if many {
                        errors.push(format!(
                            "volume with {} access mode allows only one reader",
                            request.access_mode
                        ));
                    }
                }
                AccessMode::SingleNodeWriter => {
                    if many {
                        errors.push(format!(
                            "volume with {} access mode allows only one reader or writer",
                            request.access_mode
                        ));
                    }
                }
                AccessMode::MultiNodeReader => {
                    if !request.read_only {
                        errors.push(format!("{} volumes must be read-only", request.access_mode));
                    }
                }
                AccessMode::MultiNodeSingleWriter => {
                    if !request.read_only && many {
                        errors.push(format!(
                            "volume with {} access mode allows only one writer",
                            request.access_mode
                        ));
                    }
                }
                AccessMode::MultiNodeMultiWriter => {}
            }
        }
    }
    errors
}

/// Nomad's multierror text: `N error(s) occurred:` and one `\t* ` line per problem.
pub fn format_errors(errors: &[String]) -> String {
    let head = if errors.len() == 1 {
        "1 error occurred:".to_string()
    } else {
        format!("{} errors occurred:", errors.len())
    };
    let mut text = head;
    for error in errors {
        text.push_str("\n\t* ");
        text.push_str(error);
    }
    text.push_str("\n\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{ConfigValue, Task, VolumeMount};
    use alloc::collections::BTreeMap;

    /// Issue 54 §9: a job's namespace is held to Nomad's names, refused by name.
    #[test]
    fn a_malformed_namespace_is_refused_by_name() {
        for namespace in ["../x", "a\nb", "a/b", "x y"] {
            let errors = validate_within(
                &Job {
                    namespace: namespace.into(),
                    ..job()
                },
                &limits::JobLimits::default(),
            );
            let refused = crate::structs::check_namespace(namespace).expect_err(namespace);
            assert_eq!(errors, vec![refused], "{namespace:?}");
        }
        for namespace in ["default", "team-a", "Prod2"] {
            let errors = validate_within(
                &Job {
                    namespace: namespace.into(),
                    ..job()
                },
                &limits::JobLimits::default(),
            );
            assert!(errors.is_empty(), "{namespace:?}: {errors:?}");
        }
    }

    fn job() -> Job {
        crate::testkit::job("web", JobType::Service)
            .with_count(2)
            .with_memory(300)
    }

    /// Issue 57 §1: a docker task's config is held to the docker driver's keys at admission.
    #[test]
    fn a_docker_tasks_unknown_config_key_is_refused_by_name() {
        let mut job = job().with_driver("docker");
        let config = &mut job.task_groups[0].tasks[0].config;
        config.insert("image".into(), ConfigValue::String("busybox:1".into()));
        assert!(validate(&job).is_empty(), "{:?}", validate(&job));
        job.task_groups[0].tasks[0]
            .config
            .insert("entry_point".into(), ConfigValue::List(Vec::new()));
        assert_eq!(
            validate(&job),
            vec![
                "Task group g validation failed: Task t validation failed: config: An argument named \"entry_point\" \
                 is not expected here. Did you mean \"entrypoint\"?"
                    .to_string()
            ]
        );
    }

    #[test]
    fn bad_constraints_and_affinities_are_named_with_their_level_and_position() {
        let mut job = job();
        job.constraints.push(Constraint {
            ltarget: "${attr.kernel.name}".into(),
            rtarget: "linux".into(),
            operand: "=".into(),
        });
        job.constraints.push(Constraint {
            ltarget: "${attr.kernel.name}".into(),
            rtarget: "(".into(),
            operand: "regexp".into(),
        });
        job.task_groups[0].affinities.push(Affinity {
            ltarget: "${meta.rack}".into(),
            rtarget: "r1".into(),
            operand: "=".into(),
            weight: 300,
        });
        job.task_groups[0].tasks[0].constraints.push(Constraint {
            ltarget: "${attr.x}".into(),
            rtarget: "1".into(),
            operand: "near".into(),
        });
        let errors = validate(&job);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with("Constraint 2 validation failed: Regular expression failed to compile: "),
            "{errors:?}"
        );
        assert_eq!(
            errors[1..],
            [
                "Task group g validation failed: Affinity 1 validation failed: Affinity weight must be within the range [-100,100]",
                "Task group g validation failed: Task t validation failed: Constraint 1 validation failed: Unknown constraint type \"near\"",
            ]
        );
    }

    #[test]
    fn update_blocks_are_checked_with_nomads_texts() {
        use crate::structs::UpdateStrategy;
        use core::time::Duration;
        let mut bad = job();
        bad.task_groups[0].update = Some(alloc::boxed::Box::new(UpdateStrategy {
            health_check: "vibes".into(),
            auto_promote: true,
            min_healthy_time: Duration::from_secs(600),
            ..UpdateStrategy::default()
        }));
        assert_eq!(
            validate(&bad),
            vec![
                "Task group g validation failed: Invalid health check given: \"vibes\"",
                "Task group g validation failed: Auto Promote requires a Canary count greater than zero",
                "Task group g validation failed: Minimum healthy time must be less than healthy deadline: 10m0s > 5m0s",
            ]
        );
        let mut batch = job();
        batch.job_type = JobType::Batch;
        batch.task_groups[0].update = Some(alloc::boxed::Box::default());
        assert_eq!(
            validate(&batch),
            vec!["Task group g validation failed: Job type \"batch\" does not allow update block"]
        );
        let mut good = job();
        good.task_groups[0].update = Some(alloc::boxed::Box::default());
        assert!(validate(&good).is_empty());
    }

    #[test]
    fn a_good_job_has_no_problems() {
        assert_eq!(validate(&job()), Vec::<String>::new());
    }

    #[test]
    fn a_count_above_the_limit_is_refused_by_name_and_the_limit_itself_is_allowed() {
        let mut job = job();
        job.task_groups[0].count = GROUP_COUNT_MAX;
        assert_eq!(validate(&job), Vec::<String>::new());
        job.task_groups[0].count = 1_000_000_000;
        assert_eq!(
            validate(&job),
            [
                "Task group g validation failed: Task group count 1000000000 is more than the limit of 10000 allocations per group"
            ]
        );
    }

    #[test]
    fn names_that_would_escape_a_directory_are_refused_with_nomads_texts() {
        let task_named = |name: &str| {
            let mut job = job();
            job.task_groups[0].tasks[0].name = name.into();
            validate(&job)
        };
        assert_eq!(
            task_named("../../../../tmp/x"),
            [
                "Task group g validation failed: Task ../../../../tmp/x validation failed: Task name cannot include slashes"
            ]
        );
        assert_eq!(
            task_named(".."),
            ["Task group g validation failed: Task .. validation failed: Task name cannot be \"..\""]
        );
        assert_eq!(
            task_named("a\nb"),
            [
                "Task group g validation failed: Task a\\nb validation failed: Task name cannot include control characters"
            ]
        );
        let mut job = job();
        job.task_groups[0].name = "a/b".into();
        assert_eq!(
            validate(&job),
            ["Task group a/b validation failed: Task group name cannot include slashes"]
        );
        for (id, problem) in [
            ("../x", "Job ID cannot contain a \".\" or \"..\" path segment"),
            ("a\nb", "Job ID contains a control character"),
            ("a b", "Job ID contains a space"),
        ] {
            let mut job = self::job();
            job.id = id.into();
            assert_eq!(validate(&job), [problem], "{id:?}");
        }
        let mut job = self::job();
        job.id = "a".repeat(1_500_000);
        assert_eq!(
            validate(&job),
            ["Job ID is 1500000 bytes long, more than the limit of 128"]
        );
        // Nomad's dispatched and periodic children hold a slash; an ID may too.
        job.id = "batch/periodic-1700000000".into();
        assert_eq!(validate(&job), Vec::<String>::new());
    }

    #[test]
    fn a_job_too_big_to_schedule_is_refused_naming_the_limit_before_anything_else_is_walked() {
        let mut job = job();
        let group = job.task_groups[0].clone();
        job.task_groups = (0..5_000)
            .map(|index| TaskGroup {
                name: format!("g{index}"),
                // Broken in every group: not listed, the limit is.
                count: 1_000_000_000,
                ..group.clone()
            })
            .collect();
        assert_eq!(
            validate(&job),
            ["Job has 5000 task groups, more than the limit of 100 task groups per job"]
        );
        let mut job = self::job();
        let task = job.task_groups[0].tasks[0].clone();
        job.task_groups[0].tasks = (0..101)
            .map(|index| Task {
                name: format!("t{index}"),
                ..task.clone()
            })
            .collect();
        assert_eq!(
            validate(&job),
            ["Task group g has 101 tasks, more than the limit of 100 tasks per group"]
        );
        let mut job = self::job();
        job.task_groups = (0..6)
            .map(|index| TaskGroup {
                name: format!("g{index}"),
                count: GROUP_COUNT_MAX,
                ..group.clone()
            })
            .collect();
        assert_eq!(
            validate(&job),
            ["Job asks for 60000 allocations, more than the limit of 50000 allocations per job"]
        );
        job.task_groups.truncate(5);
        assert_eq!(validate(&job), Vec::<String>::new());
    }

    #[test]
    fn templates_are_checked_with_nomads_texts() {
        use crate::structs::Template;
        let mut bad = job();
        let template = |dest: &str| Template {
            embedded_tmpl: "x".into(),
            dest_path: dest.into(),
            ..Template::default()
        };
        bad.task_groups[0].tasks[0].templates = vec![template("local/a"), template(""), template("local/a")];
        assert_eq!(
            validate(&bad),
            [
                "Task group g validation failed: Task t validation failed: Template 2 validation failed: Must specify a destination for the template",
                "Task group g validation failed: Task t validation failed: Template 3 has same destination as 1",
            ]
        );
    }

    #[test]
    fn every_problem_is_listed() {
        let mut bad = job();
        bad.priority = 0;
        let group = &mut bad.task_groups[0];
        group.volumes = BTreeMap::from([(
            "data".to_string(),
            VolumeRequest {
                name: "data".into(),
                volume_type: VolumeType::Csi,
                source: "vol".into(),
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::Unknown,
                ..VolumeRequest::default()
            },
        )]);
        group.tasks[0].driver.clear();
        group.tasks[0].volume_mounts = vec![VolumeMount {
            volume: "nope".into(),
            destination: "/data".into(),
            ..VolumeMount::default()
        }];
        let errors = validate(&bad);
        assert_eq!(
            errors,
            [
                "Job priority must be between [1, 100]",
                "Task group g validation failed: Volume data: CSI volumes must have an attachment mode",
                "Task group g validation failed: Volume data: volume with single-node-writer access mode allows only one reader or writer",
                "Task group g validation failed: Task t validation failed: Missing task driver",
                "Task group g validation failed: Task t validation failed: Volume Mount (0) references undefined volume nope",
            ]
        );
        assert!(format_errors(&errors).starts_with("5 errors occurred:\n\t* Job priority"));
    }

    #[test]
    fn services_are_canonicalised_and_checked_with_nomads_texts() {
        use crate::structs::{Service, ServiceCheck};
        use core::time::Duration;
        let mut good = Service {
            name: "${JOB}-api".into(),
            checks: vec![ServiceCheck {
                check_type: "script".into(),
                command: "/bin/true".into(),
                interval: Duration::from_secs(10),
                timeout: Duration::from_secs(2),
                ..ServiceCheck::default()
            }],
            ..Service::default()
        };
        good.canonicalize("web", "g", "t");
        assert_eq!(good.name, "web-api");
        assert_eq!(good.address_mode, "auto");
        assert_eq!(good.checks[0].name, "service: \"web-api\" check");
        let mut unnamed = Service::default();
        unnamed.canonicalize("web", "g", "t");
        assert_eq!(unnamed.name, "web-g-t");

        let mut ok = job();
        ok.task_groups[0].tasks[0].services = vec![good.clone(), unnamed];
        // Valid by Nomad's rules; Drover refuses the script check by name, and nothing else.
        assert_eq!(
            validate(&ok),
            [format!(
                "Task group g validation failed: Task t validation failed: {SCRIPT_CHECKS_REFUSED}: check \"service: \\\"web-api\\\" check\""
            )]
        );

        let check = |check_type: &str, interval_ms: u64, timeout_ms: u64| ServiceCheck {
            check_type: check_type.into(),
            path: "/health".into(),
            interval: Duration::from_millis(interval_ms),
            timeout: Duration::from_millis(timeout_ms),
            ..ServiceCheck::default()
        };
        assert_eq!(
            check("http", 500, 1000).validate(),
            Err("interval (500ms) cannot be lower than 1s".to_string())
        );
        assert_eq!(
            check("tcp", 1000, 0).validate(),
            Err("missing required value timeout. Timeout cannot be less than 1s".to_string())
        );
        assert_eq!(
            check("udp", 1000, 1000).validate(),
            Err("invalid type (\"udp\"), must be one of \"grpc\", \"tcp\", \"http\", \"script\"".to_string())
        );
        assert_eq!(check("http", 1000, 1000).validate(), Ok(()));
        let initial = |status: &str| ServiceCheck {
            initial_status: status.into(),
            ..check("http", 1000, 1000)
        };
        assert_eq!(initial("warning").validate(), Ok(()));
        assert_eq!(
            initial("ok").validate(),
            Err(
                "invalid initial check state (ok), must be one of \"passing\", \"warning\", \"critical\" or empty"
                    .to_string()
            )
        );

        let mut bad = job();
        let mut http = good.clone();
        http.name = "bad_name".into();
        http.checks = vec![ServiceCheck {
            name: "alive".into(),
            check_type: "http".into(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(1),
            ..ServiceCheck::default()
        }];
        // Nomad's own refusals, so without the script check Drover refuses on top of them.
        let mut plain = good.clone();
        plain.checks.clear();
        let mut ported = plain.clone();
        ported.port_label = "http".into();
        bad.task_groups[0].tasks[0].services = vec![http, plain.clone(), plain, ported];
        let prefix = "Task group g validation failed: Task t validation failed: ";
        assert_eq!(
            validate(&bad),
            [
                format!(
                    "{prefix}service[0] \"bad_name\" validation failed: Service name must be valid per RFC 1123 and can \
                     contain only alphanumeric characters or dashes: \"bad_name\"; Check alive invalid: check requires a \
                     port but neither check nor service \"bad_name\" have a port"
                ),
                format!("{prefix}service \"web-api\" is duplicate"),
                format!("{prefix}port label \"http\" referenced by services web-api does not exist"),
            ]
        );
    }

    #[test]
    fn networks_are_checked_with_nomads_texts_and_service_ports_resolve_against_them() {
        use crate::structs::{NetworkResource, Port, Service};
        let port = |label: &str, value: u16, to: i32| Port {
            label: label.into(),
            value,
            to,
            ..Port::default()
        };
        let mut good = job();
        good.task_groups[0].networks = vec![NetworkResource {
            reserved_ports: vec![port("http", 8080, 0)],
            dynamic_ports: vec![port("admin", 0, -1)],
            ..NetworkResource::default()
        }];
        good.task_groups[0].tasks[0].resources.networks = vec![NetworkResource {
            dynamic_ports: vec![port("metrics", 0, 0)],
            ..NetworkResource::default()
        }];
        good.task_groups[0].tasks[0].services = vec![
            Service {
                name: "web".into(),
                port_label: "http".into(),
                ..Service::default()
            },
            Service {
                name: "metrics".into(),
                port_label: "metrics".into(),
                ..Service::default()
            },
        ];
        assert_eq!(validate(&good), Vec::<String>::new());

        let mut bad = good.clone();
        let group = &mut bad.task_groups[0];
        group.networks[0].mode = "cni/mynet".into();
        group.networks[0].dynamic_ports.push(port("http", 0, -2));
        group.networks[0].reserved_ports.push(port("again", 8080, 70000));
        group.tasks[0].resources.networks[0]
            .reserved_ports
            .push(port("admin", 9090, 0));
        let prefix = "Task group g validation failed: ";
        assert_eq!(
            validate(&bad),
            [
                format!(
                    "{prefix}network mode \"cni/mynet\" is not supported: Drover runs tasks in the host's network, \
                     or a group of containers in a network of its own (mode \"bridge\"); CNI networking is not \
                     available"
                ),
                format!("{prefix}Static port 8080 already reserved by taskgroup network:http"),
                format!("{prefix}Port \"again\" cannot be mapped to a port (70000) greater than 65535"),
                format!("{prefix}Port label http already in use by taskgroup network"),
                format!("{prefix}Port \"http\" cannot be mapped to negative value -2"),
                format!("{prefix}Port label admin already in use by taskgroup network"),
            ]
        );

        // A network of its own: for a group of containers only.
        let mut bridge = good.clone();
        bridge.task_groups[0].networks[0].mode = "bridge".into();
        bridge.task_groups[0].tasks[0].driver = "docker".into();
        bridge.task_groups[0].tasks[0]
            .config
            .insert("image".into(), crate::structs::ConfigValue::String("busybox".into()));
        assert_eq!(validate(&bridge), Vec::<String>::new());
        // There a group service may name the port it binds inside by number, as Nomad's
        // Connect jobs do; on the host's network it may not.
        let numbered = Service {
            name: "count-api".into(),
            port_label: "9001".into(),
            ..Service::default()
        };
        bridge.task_groups[0].services.push(numbered.clone());
        assert_eq!(validate(&bridge), Vec::<String>::new());
        let mut hosted = good.clone();
        hosted.task_groups[0].services.push(numbered);
        assert_eq!(
            validate(&hosted),
            [format!(
                "{prefix}port label \"9001\" referenced by services count-api does not exist"
            )]
        );
        let mut named = bridge.clone();
        named.task_groups[0].tasks[0]
            .config
            .insert("hostname".into(), crate::structs::ConfigValue::String("cache".into()));
        assert_eq!(
            validate(&named),
            [format!(
                "{prefix}hostname cannot be set on task \"t\": the tasks of a group with network mode \
                 \"bridge\" share the group's network"
            )]
        );
        bridge.task_groups[0].tasks[0].driver = "raw_exec".into();
        let errors = validate(&bridge);
        assert!(
            errors.contains(&format!(
                "{prefix}network mode \"bridge\" needs every task of the group to run in a container: task \
                 \"t\" uses driver \"raw_exec\""
            )),
            "{errors:?}"
        );
    }
}
