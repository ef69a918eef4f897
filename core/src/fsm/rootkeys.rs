//! The servers' root keyring as the state store knows it: which keys exist and which one seals
//! new writes (Nomad's `RootKeyMeta`). The key material is never here: each server keeps it
//! in its own keystore (the driver's `rootkeys`), outside Raft, so the log and the snapshots
//! hold ciphertext and key ids only.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

use super::pmap::PMap;
use super::{Response, Table};
use crate::error::ErrorKind;

/// Nomad's root key states: `active` seals every new write; `inactive` still opens what it
/// sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootKeyState {
    Active,
    Inactive,
}

impl RootKeyState {
    /// Nomad's text (`RootKeyMeta.State`).
    pub fn as_str(self) -> &'static str {
        match self {
            RootKeyState::Active => "active",
            RootKeyState::Inactive => "inactive",
        }
    }
}

/// One root key's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootKeyMeta {
    pub key_id: String,
    pub state: RootKeyState,
    pub create_time_unix_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RootKeys {
    keys: PMap<String, RootKeyMeta>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootKeyCommand {
    /// A key every server can now open (its material is already on a quorum of them) becomes
    /// the active one; the one before it turns inactive.
    Activate { key_id: String },
    /// Forgets an inactive key. Anything it still seals can no longer be opened.
    Delete { key_id: String },
}

/// A key id as servers make them (a UUID): letters, digits and `-`, at most 64 bytes.
pub fn check_key_id(key_id: &str) -> Result<(), String> {
    if key_id.is_empty() || key_id.len() > 64 || !key_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(format!("invalid root key id {key_id:?}"));
    }
    Ok(())
}

impl RootKeys {
    pub fn get(&self, key_id: &str) -> Option<&RootKeyMeta> {
        self.keys.get(key_id)
    }

    /// Every key, by id.
    pub fn iter(&self) -> impl Iterator<Item = &RootKeyMeta> {
        self.keys.values()
    }

    /// The key that seals new writes.
    pub fn active(&self) -> Option<&RootKeyMeta> {
        self.keys.values().find(|meta| meta.state == RootKeyState::Active)
    }

    pub(super) fn apply(&mut self, index: u64, at_unix_ms: u64, command: &RootKeyCommand) -> Response {
        match command {
            RootKeyCommand::Activate { key_id } => {
                let previous: Vec<String> = self
                    .keys
                    .values()
                    .filter(|meta| meta.state == RootKeyState::Active && meta.key_id != *key_id)
                    .map(|meta| meta.key_id.clone())
                    .collect();
                for id in previous {
                    if let Some(meta) = self.keys.get(&id) {
                        let meta = RootKeyMeta {
                            state: RootKeyState::Inactive,
                            modify_index: index,
                            ..meta.clone()
                        };
                        self.keys.insert(id, meta);
                    }
                }
                let meta = match self.keys.get(key_id) {
                    Some(existing) => RootKeyMeta {
                        state: RootKeyState::Active,
                        modify_index: index,
                        ..existing.clone()
                    },
                    None => RootKeyMeta {
                        key_id: key_id.clone(),
                        state: RootKeyState::Active,
                        create_time_unix_ms: at_unix_ms,
                        create_index: index,
                        modify_index: index,
                    },
                };
                self.keys.insert(key_id.clone(), meta);
                Response::Done
            }
            RootKeyCommand::Delete { key_id } => match self.keys.get(key_id) {
                None => Response::NotFound,
                Some(meta) if meta.state == RootKeyState::Active => Response::Error(
                    ErrorKind::Invalid,
                    "active root key cannot be deleted - call rotate first".into(),
                ),
                Some(_) => {
                    self.keys.remove(key_id);
                    Response::Done
                }
            },
        }
    }

    /// The table a command changes.
    pub(super) const TABLE: Table = Table::RootKeys;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activating_a_key_retires_the_active_one_and_the_active_one_cannot_be_deleted() {
        let mut keys = RootKeys::default();
        let activate = |id: &str| RootKeyCommand::Activate { key_id: id.into() };
        assert_eq!(keys.apply(3, 100, &activate("a")), Response::Done);
        assert_eq!(keys.active().unwrap().key_id, "a");
        assert_eq!(keys.apply(5, 200, &activate("b")), Response::Done);
        assert_eq!(keys.active().unwrap().key_id, "b");
        let a = keys.get("a").unwrap();
        assert_eq!(
            (a.state, a.create_index, a.modify_index),
            (RootKeyState::Inactive, 3, 5)
        );
        assert!(matches!(
            keys.apply(6, 300, &RootKeyCommand::Delete { key_id: "b".into() }),
            Response::Error(ErrorKind::Invalid, _)
        ));
        assert_eq!(
            keys.apply(7, 300, &RootKeyCommand::Delete { key_id: "a".into() }),
            Response::Done
        );
        assert_eq!(
            keys.apply(8, 300, &RootKeyCommand::Delete { key_id: "a".into() }),
            Response::NotFound
        );
        assert_eq!(keys.iter().count(), 1);
    }
}
