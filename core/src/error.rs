//! The kinds of failure the servers answer with, decided where the failure is known.
//!
//! A reply's [`ErrorKind`] is all the HTTP layer needs to pick a status code, in one place
//! (`io-real/http/src/lib.rs`); no layer above the core reads an error's text to classify it.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

/// What kind of failure an endpoint reply or a state-machine refusal is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The subject does not exist (HTTP 404).
    NotFound,
    /// The request itself is wrong: malformed, or against a rule that holds whatever the
    /// state (HTTP 400).
    Invalid,
    /// Refused in the current state: a volume in use, claims exhausted, a plugin in use (HTTP
    /// 500 with Nomad's `rpc error: ` prefix).
    #[default]
    Refused,
    /// Refused by a state expected to pass by itself: a volume's claims all held (by an
    /// allocation on its way out), a volume whose plugin is not healthy yet. HTTP 500 like
    /// [`ErrorKind::Refused`]; a client waits it out and retries.
    Busy,
    /// No leader, leadership lost, a peer or plugin unreachable or failing: the same request
    /// may succeed later (HTTP 500).
    Unavailable,
    /// A check-and-set index no longer current: the subject was modified since the caller
    /// read it (HTTP 409; autopilot's set-config answers `false`).
    Conflict,
    /// The caller's token (or node secret) does not allow the request (HTTP 403, Nomad's
    /// `Permission denied`).
    PermissionDenied,
}

/// Why a client could not carry out a server's CSI call (`ClientCSI.*`): what the servers'
/// CSI decisions need to know about it — try the next candidate, count a node as detached,
/// retry later. Carried over the wire beside the message Nomad shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CsiCallFailure {
    /// The node is not known, or runs no CSI plugins: another candidate may serve the call,
    /// and a node detach from it has nothing left to detach.
    UnknownNode,
    /// The plugin could not be reached (not registered on the node, its socket refusing):
    /// Nomad's `CSI client error (retryable)`.
    Unreachable,
    /// The plugin answered gRPC `FailedPrecondition`: the volume's state refuses the call for
    /// now; Nomad wraps it as retryable.
    FailedPrecondition,
    /// Any other failure of the plugin or the client.
    Other,
}

/// A failure's kind — what a decision reads — with the message the operator reads. Carried
/// over the wire as both; a bare message from an agent before the kind existed reads as
/// [`LegacyKind::BARE`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KindedError<K> {
    pub kind: K,
    pub message: String,
}

/// The kind a bare message from an older agent is read as.
pub trait LegacyKind: Copy {
    const BARE: Self;
}

impl<K> KindedError<K> {
    pub fn new(kind: K, message: impl Into<String>) -> Self {
        KindedError {
            kind,
            message: message.into(),
        }
    }
}

impl<K> core::fmt::Display for KindedError<K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<'de, K: LegacyKind + Deserialize<'de>> Deserialize<'de> for KindedError<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire<K> {
            Typed { kind: K, message: String },
            Bare(String),
        }
        Ok(match Wire::deserialize(deserializer)? {
            Wire::Typed { kind, message } => KindedError { kind, message },
            Wire::Bare(message) => KindedError::new(K::BARE, message),
        })
    }
}

/// A failure the driver reports to a server machine (a proposal, a Raft configuration
/// change, a DNS or Consul lookup), with the kind the driver read off the typed error it got.
pub type Failure = KindedError<ErrorKind>;

impl LegacyKind for ErrorKind {
    const BARE: Self = ErrorKind::Unavailable;
}

impl Failure {
    /// The same call may succeed later (no leader, a peer or service unreachable).
    pub fn unavailable(message: impl Into<String>) -> Self {
        KindedError::new(ErrorKind::Unavailable, message)
    }
}

/// A [`CsiCallFailure`] with the message the operator reads.
pub type CsiCallError = KindedError<CsiCallFailure>;

impl LegacyKind for CsiCallFailure {
    const BARE: Self = CsiCallFailure::Other;
}

impl CsiCallError {
    pub fn other(message: impl Into<String>) -> Self {
        CsiCallError::new(CsiCallFailure::Other, message)
    }

    /// Another candidate node may serve the call (the controller call's failover rule).
    pub fn next_candidate(&self) -> bool {
        matches!(self.kind, CsiCallFailure::UnknownNode | CsiCallFailure::Unreachable)
    }

    /// The caller may retry the whole call later.
    pub fn retryable(&self) -> bool {
        self.kind != CsiCallFailure::Other
    }
}

/// A failure with no kind the decisions care about.
impl From<String> for CsiCallError {
    fn from(message: String) -> Self {
        CsiCallError::other(message)
    }
}

impl From<&str> for CsiCallError {
    fn from(message: &str) -> Self {
        CsiCallError::other(message)
    }
}

/// Why a client could not answer a call about one of its allocations (logs, files, exec,
/// stats, signal, restart, GC): what the HTTP API picks its status from (Nomad's 404s and
/// 400s), decided where the failure is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocCallFailure {
    /// No such allocation on this client: the relay asks the node that runs it (404).
    UnknownAlloc,
    /// The allocation has no such task (404).
    UnknownTask,
    /// The path in the allocation dir names nothing (404; a file stream answers 400, as
    /// Nomad's does).
    NoSuchFile,
    /// Not servable as asked: a path escaping the allocation dir, a directory read as a file,
    /// a task not running, a driver without exec, an invalid signal (400).
    Invalid,
    /// Anything else: the node unreachable, a host failure (500).
    Failed,
}

/// An [`AllocCallFailure`] with the message the operator reads.
pub type AllocCallError = KindedError<AllocCallFailure>;

impl LegacyKind for AllocCallFailure {
    const BARE: Self = AllocCallFailure::Failed;
}

impl AllocCallError {
    /// Nomad's `Unknown allocation "<id>"`.
    pub fn unknown_alloc(alloc_id: &str) -> Self {
        AllocCallError::new(
            AllocCallFailure::UnknownAlloc,
            alloc::format!("Unknown allocation {alloc_id:?}"),
        )
    }

    /// Nomad's `unknown task name "<task>"`.
    pub fn unknown_task(task: &str) -> Self {
        AllocCallError::new(
            AllocCallFailure::UnknownTask,
            alloc::format!("unknown task name {task:?}"),
        )
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        AllocCallError::new(AllocCallFailure::Invalid, message)
    }

    pub fn failed(message: impl Into<String>) -> Self {
        AllocCallError::new(AllocCallFailure::Failed, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_read_bare_messages_of_older_agents() {
        let old: CsiCallError = serde_json::from_str("\"Unknown node n1\"").unwrap();
        assert_eq!(old, CsiCallError::other("Unknown node n1"));
        let typed = CsiCallError::new(CsiCallFailure::UnknownNode, "Unknown node n1");
        let back: CsiCallError = serde_json::from_str(&serde_json::to_string(&typed).unwrap()).unwrap();
        assert_eq!(back, typed);
        let old: AllocCallError = serde_json::from_str("\"boom\"").unwrap();
        assert_eq!(old.kind, AllocCallFailure::Failed);
        let typed = AllocCallError::unknown_task("web");
        let back: AllocCallError = serde_json::from_str(&serde_json::to_string(&typed).unwrap()).unwrap();
        assert_eq!(back, typed);
        assert_eq!(typed.message, "unknown task name \"web\"");
    }
}
