//! What one registration may ask of the cluster, and which names may become paths.
//!
//! Every job is stored through Raft and then scheduled on every leader to come, so a job that
//! asks for too much is a poison entry: one registration of `Count = 1e9` made the scheduler
//! allocate 24 GB, and every restart on the same data dir aborted again. The limits here are
//! checked before anything is proposed, each with a text naming it.
//!
//! Names follow Nomad's rules (`Job ID contains a space`, `Task name cannot include slashes`,
//! ...) and go further where a name becomes a directory on a client: a task's working dir is
//! `<alloc_dir>/<alloc>/<task>`, so a task named `..` or `../../tmp/x` would run outside its
//! allocation. The client checks again before it builds a path (`client::paths`).

#[allow(unused_imports)]
use crate::prelude::*;

use crate::structs::Job;

/// At most this many allocations per task group.
pub const GROUP_COUNT_MAX: u32 = 10_000;
/// At most this many allocations per job, over all its groups.
pub const JOB_COUNT_MAX: u64 = 50_000;
const _: () = assert!(
    GROUP_COUNT_MAX as u64 <= JOB_COUNT_MAX,
    "one group's count fits a job's"
);
/// At most this many task groups per job.
pub const GROUPS_MAX: usize = 100;
/// At most this many tasks per task group.
pub const TASKS_MAX: usize = 100;
/// The longest job ID, job name, group name or task name, in bytes.
pub const NAME_LEN_MAX: usize = 128;

/// What one job may ask, as a server is configured (`server { job_max_group_count
/// job_max_count job_max_groups job_max_group_tasks }`); the defaults are the constants above.
/// The leader's scheduler schedules a stored job up to the same limits, so a job stored under
/// higher ones (an earlier configuration) never makes it build more than these allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobLimits {
    pub group_count: u32,
    pub job_count: u64,
    pub groups: usize,
    pub tasks: usize,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            group_count: GROUP_COUNT_MAX,
            job_count: JOB_COUNT_MAX,
            groups: GROUPS_MAX,
            tasks: TASKS_MAX,
        }
    }
}

/// The structural limits: checked first, and when one is broken nothing else is looked at
/// (a job with a million groups is not walked to list each one's problems).
pub fn structure(job: &Job, limits: &JobLimits) -> Vec<String> {
    if job.task_groups.len() > limits.groups {
        return vec![format!(
            "Job has {} task groups, more than the limit of {} task groups per job",
            job.task_groups.len(),
            limits.groups
        )];
    }
    let mut errors = Vec::new();
    for group in &job.task_groups {
        if group.tasks.len() > limits.tasks {
            errors.push(format!(
                "Task group {} has {} tasks, more than the limit of {} tasks per group",
                shown(&group.name),
                group.tasks.len(),
                limits.tasks
            ));
        }
    }
    // A group above its own limit is named by the group checks; the total counts it at that.
    let total: u64 = job
        .task_groups
        .iter()
        .map(|group| u64::from(group.count.min(limits.group_count)))
        .sum();
    if total > limits.job_count {
        errors.push(format!(
            "Job asks for {total} allocations, more than the limit of {} allocations per job",
            limits.job_count
        ));
    }
    errors
}

/// Nomad's job ID rules, plus control characters, `.`/`..` path segments and a length.
pub fn job_id(id: &str) -> Option<String> {
    if id.is_empty() {
        Some("Missing job ID".to_string())
    } else if id.contains(' ') {
        Some("Job ID contains a space".to_string())
    } else if id.contains('\0') {
        Some("Job ID contains a null character".to_string())
    } else if id.chars().any(char::is_control) {
        Some("Job ID contains a control character".to_string())
    } else if id.len() > NAME_LEN_MAX {
        Some(format!(
            "Job ID is {} bytes long, more than the limit of {NAME_LEN_MAX}",
            id.len()
        ))
    } else if id.split('/').any(|segment| segment == "." || segment == "..") {
        Some("Job ID cannot contain a \".\" or \"..\" path segment".to_string())
    } else {
        None
    }
}

/// Nomad's job name rules, plus control characters and a length.
pub fn job_name(name: &str) -> Option<String> {
    if name.contains('\0') {
        Some("Job Name contains a null character".to_string())
    } else if name.chars().any(char::is_control) {
        Some("Job Name contains a control character".to_string())
    } else if name.len() > NAME_LEN_MAX {
        Some(format!(
            "Job Name is {} bytes long, more than the limit of {NAME_LEN_MAX}",
            name.len()
        ))
    } else {
        None
    }
}

/// A group or task name that is not empty (checked by the caller, with Nomad's texts); `what`
/// is "Task group" or "Task". Task names become directories, so neither may be `.` or `..`.
pub fn component(what: &str, name: &str) -> Option<String> {
    if name.contains('/') || name.contains('\\') {
        Some(format!("{what} name cannot include slashes"))
    } else if name.contains('\0') {
        Some(format!("{what} name cannot include null characters"))
    } else if name.chars().any(char::is_control) {
        Some(format!("{what} name cannot include control characters"))
    } else if name == "." || name == ".." {
        Some(format!("{what} name cannot be \"{name}\""))
    } else if name.len() > NAME_LEN_MAX {
        Some(format!(
            "{what} name is {} bytes long, more than the limit of {NAME_LEN_MAX}",
            name.len()
        ))
    } else {
        None
    }
}

/// A name as an error text may show it: at most 64 characters, control characters escaped.
pub fn shown(name: &str) -> String {
    let mut text: String = name.chars().take(64).flat_map(char::escape_debug).collect();
    if name.chars().count() > 64 {
        text.push_str("...");
    }
    text
}
