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
/// At most this many task groups per job.
pub const GROUPS_MAX: usize = 100;
/// At most this many tasks per task group.
pub const TASKS_MAX: usize = 100;
/// The longest job ID, job name, group name or task name, in bytes.
pub const NAME_LEN_MAX: usize = 128;

/// The structural limits: checked first, and when one is broken nothing else is looked at
/// (a job with a million groups is not walked to list each one's problems).
pub fn structure(job: &Job) -> Vec<String> {
    if job.task_groups.len() > GROUPS_MAX {
        return vec![format!(
            "Job has {} task groups, more than the limit of {GROUPS_MAX} task groups per job",
            job.task_groups.len()
        )];
    }
    let mut errors = Vec::new();
    for group in &job.task_groups {
        if group.tasks.len() > TASKS_MAX {
            errors.push(format!(
                "Task group {} has {} tasks, more than the limit of {TASKS_MAX} tasks per group",
                shown(&group.name),
                group.tasks.len()
            ));
        }
    }
    // A group above its own limit is named by the group checks; the total counts it at that.
    let total: u64 = job
        .task_groups
        .iter()
        .map(|group| u64::from(group.count.min(GROUP_COUNT_MAX)))
        .sum();
    if total > JOB_COUNT_MAX {
        errors.push(format!(
            "Job asks for {total} allocations, more than the limit of {JOB_COUNT_MAX} allocations per job"
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
