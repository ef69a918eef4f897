//! `alloc exec`: a command run in a task's context, as a session of bounded steps so that it
//! travels like every other client request (`service::relay`): start it, send it input,
//! resize its terminal, read what it wrote (waiting a moment for more), cancel it.
//!
//! The command runs with what the task runs with: its environment and working directory
//! (`raw_exec`), and for `exec` also its mount namespace and root (`ProcessDriver::
//! exec_command`); in the task's cgroup either way. With a TTY it gets a pseudo-terminal of its
//! own, as its controlling terminal. A host's client runs the sessions (`drover_host::exec_sessions`);
//! sessions nobody reads for a minute are killed.

use serde::{Deserialize, Serialize};

use crate::logstream::base64_bytes;

/// One step of an exec session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecRequest {
    Start {
        alloc_id: String,
        task: String,
        command: Vec<String>,
        tty: bool,
    },
    Input {
        alloc_id: String,
        session: u64,
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
        close: bool,
    },
    Resize {
        alloc_id: String,
        session: u64,
        width: u16,
        height: u16,
    },
    /// What the command wrote since, waiting up to a second for something.
    Read {
        alloc_id: String,
        session: u64,
    },
    Cancel {
        alloc_id: String,
        session: u64,
    },
}

impl ExecRequest {
    pub fn alloc_id(&self) -> &str {
        match self {
            ExecRequest::Start { alloc_id, .. }
            | ExecRequest::Input { alloc_id, .. }
            | ExecRequest::Resize { alloc_id, .. }
            | ExecRequest::Read { alloc_id, .. }
            | ExecRequest::Cancel { alloc_id, .. } => alloc_id,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecReply {
    pub session: u64,
    #[serde(with = "base64_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "base64_bytes")]
    pub stderr: Vec<u8>,
    /// The command's exit code, once it exited and everything it wrote was read.
    pub exit: Option<i32>,
}
