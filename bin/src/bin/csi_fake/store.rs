//! The plugin's records: volumes, their attachments and node-side state, and snapshots, in
//! `<state-dir>/fake-plugin.json`. Every change is read-modify-write under an exclusive
//! `flock` on `<state-dir>/.lock` and lands by rename, so a plugin killed mid-call (the
//! `--crash` switch) and plugins sharing one state dir (a controller and a node instance)
//! never see a torn or lost record. Volume data lives in `<state-dir>/volumes/<id>/`,
//! snapshot data in `<state-dir>/snapshots/<id>/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::Status;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VolumeRecord {
    pub name: String,
    pub capacity_bytes: i64,
    pub parameters: BTreeMap<String, String>,
    /// `snapshot:<id>` or `volume:<id>` when made from one.
    pub content_source: String,
    /// The topology segments it is accessible from (empty: everywhere).
    pub accessible_topology: Vec<BTreeMap<String, String>>,
    /// node id → attached read-only.
    pub attachments: BTreeMap<String, bool>,
    /// Staging paths and target paths it is staged and published at on this plugin's nodes.
    pub staged: BTreeSet<String>,
    pub published: BTreeMap<String, bool>,
    /// What the node side has grown its filesystem to (`NodeExpandVolume`).
    pub node_capacity_bytes: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SnapshotRecord {
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub created_unix_s: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// By volume id (the name it was created with).
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// By snapshot id (the name it was created with).
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

impl State {
    pub fn used_bytes(&self) -> i64 {
        self.volumes.values().map(|volume| volume.capacity_bytes).sum()
    }
}

pub struct Store {
    dir: PathBuf,
}

/// Holds the state dir's lock until dropped.
struct Locked(std::fs::File);

impl Drop for Locked {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; unlocking cannot fail in a way we could act on.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn internal(error: impl std::fmt::Display) -> Status {
    Status::internal(error.to_string())
}

impl Store {
    pub fn open(dir: &Path) -> std::io::Result<Store> {
        std::fs::create_dir_all(dir.join("volumes"))?;
        std::fs::create_dir_all(dir.join("snapshots"))?;
        Ok(Store { dir: dir.to_path_buf() })
    }

    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.dir.join("volumes").join(id)
    }

    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.dir.join("snapshots").join(id)
    }

    fn lock(&self) -> Result<Locked, Status> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(".lock"))
            .map_err(internal)?;
        // SAFETY: a valid open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(internal(std::io::Error::last_os_error()));
        }
        Ok(Locked(file))
    }

    fn path(&self) -> PathBuf {
        self.dir.join("fake-plugin.json")
    }

    fn load(&self) -> Result<State, Status> {
        match std::fs::read(self.path()) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|error| internal(format!("the plugin's records: {error}")))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(error) => Err(internal(error)),
        }
    }

    /// The state as it is now.
    pub fn read(&self) -> Result<State, Status> {
        let _lock = self.lock()?;
        self.load()
    }

    /// Runs `change` on the state and keeps what it made, unless it fails.
    pub fn update<R>(&self, change: impl FnOnce(&mut State) -> Result<R, Status>) -> Result<R, Status> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        let before = state.clone();
        let result = change(&mut state)?;
        if state != before {
            let temporary = self.dir.join("fake-plugin.json.tmp");
            std::fs::write(&temporary, serde_json::to_vec_pretty(&state).map_err(internal)?).map_err(internal)?;
            std::fs::rename(&temporary, self.path()).map_err(internal)?;
        }
        Ok(result)
    }
}

/// Copies the directory tree `from` into `to` (volume data into a snapshot and back).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Bytes in the files under `dir`.
pub fn used_bytes(dir: &Path) -> i64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => used_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |meta| meta.len() as i64),
            _ => 0,
        })
        .sum()
}
