//! The kinds of failure the servers answer with, decided where the failure is known.
//!
//! A reply's [`ErrorKind`] is all the HTTP layer needs to pick a status code, in one place
//! (`io-real/src/http/mod.rs`); no layer above the core reads an error's text to classify it.

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
    /// No leader, leadership lost, a peer or plugin unreachable or failing: the same request
    /// may succeed later (HTTP 500).
    Unavailable,
    /// The caller's token (or node secret) does not allow the request (HTTP 403, Nomad's
    /// `Permission denied`).
    PermissionDenied,
}
