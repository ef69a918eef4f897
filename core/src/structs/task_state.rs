//! A task's state as its client runs it, persists it, and reports it to the servers, which
//! store it on the allocation (`Allocation::task_states`) and show it as Nomad's `TaskStates`:
//! the state, whether it failed, its restarts, when it last started, restarted and finished,
//! and its last [`MAX_TASK_EVENTS`] events.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nomad keeps the last ten events per task.
pub const MAX_TASK_EVENTS: usize = 10;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskStatus {
    #[default]
    Pending,
    Running,
    Dead,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Dead => "dead",
        }
    }
}

/// Times are Unix nanoseconds of the client's wall clock; 0 is "never" (Nomad's zero time).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    pub state: TaskStatus,
    pub failed: bool,
    pub restarts: u32,
    #[serde(default)]
    pub last_restart: i64,
    /// The last time the task started (Nomad updates it at every start).
    #[serde(default)]
    pub started_at: i64,
    /// When the task last became dead.
    #[serde(default)]
    pub finished_at: i64,
    pub events: Vec<TaskEvent>,
}

impl TaskState {
    /// Appends `event`, keeping the last [`MAX_TASK_EVENTS`].
    pub fn push_event(&mut self, event: TaskEvent) {
        self.events.push(event);
        let len = self.events.len();
        if len > MAX_TASK_EVENTS {
            self.events.drain(..len - MAX_TASK_EVENTS);
        }
    }
}

/// A task event, with Nomad's type names (`Received`, `Task Setup`, `Started`, ...): its
/// `DisplayMessage` and the `Details` Nomad sets for its type (`exit_code`, `kill_timeout`,
/// `restart_reason`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    pub kind: String,
    pub message: String,
    /// Unix nanoseconds (Nomad's `Time`); 0 in records written before it was kept.
    #[serde(default)]
    pub time: i64,
    #[serde(default)]
    pub details: BTreeMap<String, String>,
}

impl TaskEvent {
    /// Whether the event fails the task (Nomad's `FailsTask` detail).
    pub fn fails_task(&self) -> bool {
        self.details.get("fails_task").is_some_and(|value| value == "true")
    }
}
