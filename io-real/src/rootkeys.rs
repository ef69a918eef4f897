//! The servers' root keyring, as Nomad's encrypter: variables and CSI volume secrets are sealed
//! with AES-256-GCM under the cluster's active root key before they are proposed, so Raft's log
//! and its snapshots (in `drover.redb`, and sent between servers) hold ciphertext only.
//!
//! Which keys exist, and which is active, is in the replicated state (`fsm::rootkeys`). The key
//! material is not: each server keeps it in its keystore, `<data_dir>/server/keystore/<key
//! id>.nks.json` (0600, Nomad's place and name), and servers hand it to each other over agent
//! RPC (server certificates only, under mutual TLS) — the service's `rootkeys` part. A copy of
//! the database alone therefore opens nothing.
//!
//! A sealed map is `nonce ‖ ciphertext ‖ tag` of the map's JSON, with the key id as the
//! additional data, held in the core's sealed-map form (`structs::Sealed`).
//!
//! Runs in both worlds: key ids, keys and nonces come from the runtime's generator (seeded in
//! a simulation), and a simulated server keeps its keystore in memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use drover_core::structs::{Sealed, Secrets};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

/// The keystore's directory under `<data_dir>/server/`.
pub const KEYSTORE_DIR: &str = "keystore";
/// A key file's suffix (Nomad's).
const KEY_FILE_SUFFIX: &str = ".nks.json";
/// The only algorithm (Nomad's name for it).
pub const ALGORITHM: &str = "aes256-gcm";
const KEY_LEN: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RootKeyError {
    #[error("root key {0} is not in this server's keystore, and no other server has it")]
    Missing(String),
    #[error("sealed value under root key {key_id} does not open: {reason}")]
    Open { key_id: String, reason: String },
    #[error("keystore file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("root key material for {0} is malformed")]
    Malformed(String),
    #[error("sealing needs a root key: {0}")]
    NoActiveKey(String),
}

/// One root key: its id, when it was made, and the key itself. `Debug` shows the id only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootKeyMaterial {
    #[serde(rename = "KeyID")]
    pub key_id: String,
    #[serde(rename = "Algorithm")]
    pub algorithm: String,
    #[serde(rename = "CreateTime")]
    pub create_time_unix_ms: u64,
    /// Base64 of the key's 32 bytes.
    #[serde(rename = "Key")]
    pub key: String,
}

impl std::fmt::Debug for RootKeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootKeyMaterial")
            .field("key_id", &self.key_id)
            .field("key", &drover_core::structs::REDACTED)
            .finish()
    }
}

impl RootKeyMaterial {
    /// A new random key.
    pub fn generate(now_unix_ms: u64) -> RootKeyMaterial {
        let bytes: [u8; KEY_LEN] = crate::runtime::random();
        RootKeyMaterial {
            key_id: crate::runtime::random_uuid(),
            algorithm: ALGORITHM.to_string(),
            create_time_unix_ms: now_unix_ms,
            key: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }

    fn cipher(&self) -> Result<LessSafeKey, RootKeyError> {
        let malformed = || RootKeyError::Malformed(self.key_id.clone());
        if self.algorithm != ALGORITHM {
            return Err(malformed());
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.key)
            .map_err(|_| malformed())?;
        if bytes.len() != KEY_LEN {
            return Err(malformed());
        }
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| malformed())?;
        Ok(LessSafeKey::new(unbound))
    }
}

struct Held {
    material: RootKeyMaterial,
    cipher: Arc<LessSafeKey>,
}

/// One server's keystore: every root key it holds, by id. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Keystore {
    /// Where keys are kept (`None`: in memory, as in a simulation).
    dir: Option<PathBuf>,
    keys: Arc<Mutex<BTreeMap<String, Held>>>,
    /// Held while this server makes a new root key, so concurrent first writes make one.
    creating: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Keystore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keystore")
            .field("dir", &self.dir)
            .field("keys", &self.key_ids())
            .finish()
    }
}

impl Keystore {
    /// The keystore under `dir`, every key file in it read; `dir` is made (0700) if missing.
    pub fn open(dir: &Path) -> Result<Keystore, RootKeyError> {
        let file_error = |path: &Path, reason: String| RootKeyError::File {
            path: path.display().to_string(),
            reason,
        };
        create_private_dir(dir).map_err(|error| file_error(dir, error.to_string()))?;
        let keystore = Keystore {
            dir: Some(dir.to_path_buf()),
            ..Keystore::default()
        };
        let entries = std::fs::read_dir(dir).map_err(|error| file_error(dir, error.to_string()))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.to_string_lossy().ends_with(KEY_FILE_SUFFIX))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|error| file_error(&path, error.to_string()))?;
            let material: RootKeyMaterial =
                serde_json::from_str(&text).map_err(|error| file_error(&path, error.to_string()))?;
            let cipher = material
                .cipher()
                .map_err(|error| file_error(&path, error.to_string()))?;
            keystore.hold(material, cipher);
        }
        Ok(keystore)
    }

    /// A keystore kept in memory only.
    pub fn in_memory() -> Keystore {
        Keystore::default()
    }

    /// Held while a new root key is made and distributed.
    pub async fn creating(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.creating.lock().await
    }

    fn hold(&self, material: RootKeyMaterial, cipher: LessSafeKey) {
        let held = Held {
            material: material.clone(),
            cipher: Arc::new(cipher),
        };
        self.keys.lock().expect("keystore lock").insert(material.key_id, held);
    }

    /// Keeps `material` (written to the keystore first, so a key in use is never only in
    /// memory). Holding a key already held changes nothing.
    pub fn insert(&self, material: RootKeyMaterial) -> Result<(), RootKeyError> {
        let cipher = material.cipher()?;
        if drover_core::fsm::rootkeys::check_key_id(&material.key_id).is_err() {
            return Err(RootKeyError::Malformed(material.key_id));
        }
        if self.material(&material.key_id).is_some() {
            return Ok(());
        }
        if let Some(dir) = &self.dir {
            let path = dir.join(format!("{}{KEY_FILE_SUFFIX}", material.key_id));
            write_private(&path, &serde_json::to_vec_pretty(&material).expect("key serializes")).map_err(|error| {
                RootKeyError::File {
                    path: path.display().to_string(),
                    reason: error.to_string(),
                }
            })?;
        }
        self.hold(material, cipher);
        Ok(())
    }

    pub fn material(&self, key_id: &str) -> Option<RootKeyMaterial> {
        let keys = self.keys.lock().expect("keystore lock");
        keys.get(key_id).map(|held| held.material.clone())
    }

    pub fn key_ids(&self) -> Vec<String> {
        self.keys.lock().expect("keystore lock").keys().cloned().collect()
    }

    fn cipher(&self, key_id: &str) -> Option<Arc<LessSafeKey>> {
        let keys = self.keys.lock().expect("keystore lock");
        keys.get(key_id).map(|held| held.cipher.clone())
    }

    /// `secrets` sealed under `key_id`; a map already sealed is returned as it is.
    pub fn seal(&self, key_id: &str, secrets: &Secrets) -> Result<Secrets, RootKeyError> {
        if secrets.is_sealed() {
            return Ok(secrets.clone());
        }
        let cipher = self
            .cipher(key_id)
            .ok_or_else(|| RootKeyError::Missing(key_id.to_string()))?;
        let nonce_bytes: [u8; NONCE_LEN] = crate::runtime::random();
        let mut data = serde_json::to_vec(&secrets.0).expect("a map serializes");
        cipher
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(key_id.as_bytes()),
                &mut data,
            )
            .map_err(|_| RootKeyError::Malformed(key_id.to_string()))?;
        let mut sealed = nonce_bytes.to_vec();
        sealed.extend_from_slice(&data);
        Ok(Secrets::from_sealed(&Sealed {
            key_id: key_id.to_string(),
            data: sealed,
        }))
    }

    /// The key a sealed map needs, if this keystore lacks it (`None`: plain, or held).
    pub fn lacks(&self, secrets: &Secrets) -> Option<String> {
        match secrets.sealed() {
            Some(Ok(sealed)) if self.cipher(&sealed.key_id).is_none() => Some(sealed.key_id),
            _ => None,
        }
    }

    /// `secrets` opened; a plain map is returned as it is.
    pub fn open_map(&self, secrets: &Secrets) -> Result<Secrets, RootKeyError> {
        let sealed = match secrets.sealed() {
            None => return Ok(secrets.clone()),
            Some(Err(reason)) => {
                return Err(RootKeyError::Open {
                    key_id: String::new(),
                    reason: reason.to_string(),
                });
            }
            Some(Ok(sealed)) => sealed,
        };
        let cipher = self
            .cipher(&sealed.key_id)
            .ok_or_else(|| RootKeyError::Missing(sealed.key_id.clone()))?;
        let failed = |reason: &str| RootKeyError::Open {
            key_id: sealed.key_id.clone(),
            reason: reason.to_string(),
        };
        if sealed.data.len() < NONCE_LEN {
            return Err(failed("too short"));
        }
        let (nonce, body) = sealed.data.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| failed("bad nonce"))?;
        let mut body = body.to_vec();
        let plain = cipher
            .open_in_place(nonce, Aad::from(sealed.key_id.as_bytes()), &mut body)
            .map_err(|_| failed("authentication failed"))?;
        let map: BTreeMap<String, String> = serde_json::from_slice(plain).map_err(|_| failed("not a map"))?;
        Ok(Secrets(map))
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Writes `bytes` to `path` readable by its owner only, whole or not at all (a temporary file
/// renamed over it).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Secrets {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_sealed_map_holds_no_plaintext_and_opens_with_its_key_only() {
        let keystore = Keystore::in_memory();
        let key = RootKeyMaterial::generate(1);
        keystore.insert(key.clone()).unwrap();
        let plain = map(&[("password", "hunter2-marker")]);
        let sealed = keystore.seal(&key.key_id, &plain).unwrap();
        assert!(sealed.is_sealed());
        assert!(!serde_json::to_string(&sealed).unwrap().contains("hunter2"));
        assert_eq!(keystore.open_map(&sealed).unwrap(), plain);
        // Sealing twice gives different ciphertexts (fresh nonces).
        assert_ne!(keystore.seal(&key.key_id, &plain).unwrap(), sealed);

        let other = Keystore::in_memory();
        assert_eq!(other.lacks(&sealed), Some(key.key_id.clone()));
        assert_eq!(other.open_map(&sealed), Err(RootKeyError::Missing(key.key_id.clone())));
        let imposter = RootKeyMaterial {
            key_id: key.key_id.clone(),
            ..RootKeyMaterial::generate(2)
        };
        other.insert(imposter).unwrap();
        assert!(matches!(other.open_map(&sealed), Err(RootKeyError::Open { .. })));
    }

    #[test]
    fn a_tampered_value_is_refused() {
        let keystore = Keystore::in_memory();
        let key = RootKeyMaterial::generate(1);
        keystore.insert(key.clone()).unwrap();
        let sealed = keystore.seal(&key.key_id, &map(&[("k", "v")])).unwrap();
        let mut inner = sealed.sealed().unwrap().unwrap();
        let last = inner.data.len() - 1;
        inner.data[last] ^= 1;
        let tampered = Secrets::from_sealed(&inner);
        assert_eq!(
            keystore.open_map(&tampered),
            Err(RootKeyError::Open {
                key_id: key.key_id.clone(),
                reason: "authentication failed".into()
            })
        );
    }

    #[test]
    fn keys_are_kept_owner_only_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store_dir = dir.path().join("server").join(KEYSTORE_DIR);
        let keystore = Keystore::open(&store_dir).unwrap();
        let key = RootKeyMaterial::generate(7);
        keystore.insert(key.clone()).unwrap();
        let sealed = keystore.seal(&key.key_id, &map(&[("k", "v")])).unwrap();
        let file = store_dir.join(format!("{}{KEY_FILE_SUFFIX}", key.key_id));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(&store_dir).unwrap().permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert!(format!("{key:?}").contains("[REDACTED]"));
        assert!(!format!("{key:?}").contains(&key.key));

        let reopened = Keystore::open(&store_dir).unwrap();
        assert_eq!(reopened.key_ids(), vec![key.key_id.clone()]);
        assert_eq!(reopened.open_map(&sealed).unwrap(), map(&[("k", "v")]));
    }

    #[test]
    fn malformed_material_is_refused_by_name() {
        let keystore = Keystore::in_memory();
        let mut key = RootKeyMaterial::generate(1);
        key.key = base64::engine::general_purpose::STANDARD.encode([0u8; 16]);
        assert_eq!(
            keystore.insert(key.clone()),
            Err(RootKeyError::Malformed(key.key_id.clone()))
        );
        let mut traversal = RootKeyMaterial::generate(1);
        traversal.key_id = "../../etc/x".into();
        assert!(matches!(keystore.insert(traversal), Err(RootKeyError::Malformed(_))));
    }
}
