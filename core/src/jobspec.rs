//! Job validation at registration: every problem of a jobspec, with Nomad's texts where the
//! reference gives them (§3.10 volume requests, §1.1 `csi_plugin`), so a bad job is refused
//! with the whole list and nothing is stored.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeSet;

use crate::structs::{AccessMode, AttachmentMode, Job, JobType, TaskGroup, VolumeRequest, VolumeType};

/// Nomad's bounds on `priority`.
pub const PRIORITY_MIN: u32 = 1;
pub const PRIORITY_MAX: u32 = 100;
pub const PRIORITY_DEFAULT: u32 = 50;

/// Every problem with `job`, in order; empty when it may be registered.
pub fn validate(job: &Job) -> Vec<String> {
    let mut errors = Vec::new();
    if job.id.is_empty() {
        errors.push("Missing job ID".to_string());
    } else if job.id.contains(' ') {
        errors.push("Job ID contains a space".to_string());
    } else if job.id.contains('\0') {
        errors.push("Job ID contains a null character".to_string());
    }
    if job.name.is_empty() {
        errors.push("Missing job name".to_string());
    }
    if job.namespace.is_empty() {
        errors.push("Job must be in a namespace".to_string());
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
    let mut names = BTreeSet::new();
    for (position, group) in job.task_groups.iter().enumerate() {
        if group.name.is_empty() {
            errors.push(format!("Job task group {} missing name", position + 1));
        } else if !names.insert(group.name.clone()) {
            errors.push(format!("Job task group {} redefines '{}'", position + 1, group.name));
        }
        for problem in validate_group(job, group) {
            errors.push(format!("Task group {} validation failed: {problem}", group.name));
        }
    }
    errors
}

fn validate_group(job: &Job, group: &TaskGroup) -> Vec<String> {
    let mut errors = Vec::new();
    if job.job_type == JobType::System && group.count > 1 {
        errors.push(format!(
            "Task group {} has count {}; system jobs run one allocation per node (count must be 0 or 1)",
            group.name, group.count
        ));
    }
    if group.tasks.is_empty() {
        errors.push("Missing tasks for task group".to_string());
    }
    for (alias, request) in &group.volumes {
        for problem in validate_volume(job, group, request) {
            errors.push(format!("Volume {alias}: {problem}"));
        }
    }
    let mut task_names = BTreeSet::new();
    for (position, task) in group.tasks.iter().enumerate() {
        if task.name.is_empty() {
            errors.push(format!("Task {} missing name", position + 1));
            continue;
        }
        if !task_names.insert(task.name.clone()) {
            errors.push(format!("Task {} redefines '{}'", position + 1, task.name));
        }
        let mut problems = Vec::new();
        if task.driver.is_empty() {
            problems.push("Missing task driver".to_string());
        }
        if task.resources.cpu < 1 {
            problems.push("Minimum CPU value is 1; got 0".to_string());
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
        for problem in problems {
            errors.push(format!("Task {} validation failed: {problem}", task.name));
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
    use crate::structs::{Task, TaskResources, VolumeMount};
    use alloc::collections::BTreeMap;

    fn job() -> Job {
        Job {
            id: "web".into(),
            name: "web".into(),
            namespace: "default".into(),
            priority: 50,
            task_groups: vec![TaskGroup {
                name: "g".into(),
                count: 2,
                tasks: vec![Task {
                    name: "t".into(),
                    driver: "exec".into(),
                    resources: TaskResources {
                        cpu: 100,
                        memory_mb: 300,
                        devices: Vec::new(),
                    },
                    ..Task::default()
                }],
                ..TaskGroup::default()
            }],
            ..Job::default()
        }
    }

    #[test]
    fn a_good_job_has_no_problems() {
        assert_eq!(validate(&job()), Vec::<String>::new());
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
}
