//! Nomad Variables as `/v1/vars` and `/v1/var/:path` answer them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nomad's `VariableMetadata`: a variable without its items (`GET /v1/vars`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VariableMetadata {
    pub namespace: String,
    pub path: String,
    pub create_index: u64,
    /// The index a check-and-set write (`?cas=`) names.
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    pub modify_time: i64,
    /// Present while the variable is locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<VariableLock>,
}

/// Nomad's `VariableDecrypted`: a variable with its items in the clear.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Variable {
    pub namespace: String,
    pub path: String,
    pub items: BTreeMap<String, String>,
    pub create_index: u64,
    pub modify_index: u64,
    pub create_time: i64,
    pub modify_time: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<VariableLock>,
}

/// A variable's lock: its ID only in the holder's own answers (empty otherwise).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VariableLock {
    #[serde(rename = "ID")]
    pub id: String,
    /// Go durations.
    #[serde(rename = "TTL")]
    pub ttl: String,
    #[serde(rename = "LockDelay")]
    pub lock_delay: String,
}
