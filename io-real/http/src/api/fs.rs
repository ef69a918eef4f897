//! An allocation's files as `/v1/client/fs/*` answers them.

use serde::{Deserialize, Serialize};

/// Nomad's `AllocFileInfo`: one entry of a directory listing, or one file's stat.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocFileInfo {
    pub name: String,
    pub is_dir: bool,
    /// Bytes.
    pub size: u64,
    /// As Go prints a `FileMode` (`-rw-r--r--`, `drwxr-xr-x`).
    pub file_mode: String,
    /// RFC 3339.
    pub mod_time: String,
}

/// Nomad's `StreamFrame`: one piece of a streamed file or log, frames back to back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct StreamFrame {
    pub file: String,
    /// Where in the file the data starts.
    pub offset: u64,
    /// Base64.
    pub data: String,
    /// `file deleted` or `file truncated` when that happened; empty otherwise.
    pub file_event: String,
}
