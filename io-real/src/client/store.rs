//! The client's durable records in a redb database: the plugin registry, each allocation
//! (with its job) and its runner state, and each task's runner state. Production opens a file
//! (`crate::disk::open_client_store`); the simulation hands in a database on its crash disk.

use std::collections::BTreeMap;
use std::sync::Arc;

use drover_core::client::alloc_runner::LocalAllocState;
use drover_core::client::client::SavedAlloc;
use drover_core::client::devices::DeviceReservations;
use drover_core::client::registry::Registry;
use drover_core::client::task_runner::LocalTaskState;
use drover_core::structs::{Allocation, Job};
use redb::{ReadableDatabase, TableDefinition};

const CLIENT: TableDefinition<&str, &[u8]> = TableDefinition::new("client_state");
pub const CLIENT_STATE_FILE: &str = "client.redb";

#[derive(Debug, thiserror::Error)]
pub enum ClientStoreError {
    #[error("cannot open client state {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("client state {key}: {reason}")]
    Io { key: String, reason: String },
}

/// The client's durable records: the plugin registry, each allocation (with its job) and its
/// runner state, and each task's runner state.
#[derive(Clone)]
pub struct ClientStore {
    db: Arc<redb::Database>,
}

impl ClientStore {
    /// The store over a database someone else opened (the simulation's crash disk).
    pub fn new(db: redb::Database) -> ClientStore {
        ClientStore { db: Arc::new(db) }
    }

    pub(crate) fn put<T: serde::Serialize>(&self, key: &str, value: &T) -> Result<(), ClientStoreError> {
        let fail = |reason: String| ClientStoreError::Io {
            key: key.to_string(),
            reason,
        };
        let bytes = drover_core::codec::encode(value);
        let txn = self.db.begin_write().map_err(|error| fail(error.to_string()))?;
        {
            let mut table = txn.open_table(CLIENT).map_err(|error| fail(error.to_string()))?;
            table
                .insert(key, bytes.as_slice())
                .map_err(|error| fail(error.to_string()))?;
        }
        txn.commit().map_err(|error| fail(error.to_string()))
    }

    /// Every record whose key starts with `prefix`, decoded; undecodable records are reported
    /// and skipped, never overwritten. Records of the unversioned form an earlier agent wrote
    /// are rewritten in the current format once read, so the next upgrade still reads them.
    fn scan<T: serde::de::DeserializeOwned + serde::Serialize>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, ClientStoreError> {
        let fail = |reason: String| ClientStoreError::Io {
            key: prefix.to_string(),
            reason,
        };
        let txn = self.db.begin_read().map_err(|error| fail(error.to_string()))?;
        let table = match txn.open_table(CLIENT) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(fail(error.to_string())),
        };
        let mut out = Vec::new();
        let mut unversioned = Vec::new();
        for entry in table.range(prefix..).map_err(|error| fail(error.to_string()))? {
            let (key, value) = entry.map_err(|error| fail(error.to_string()))?;
            let key = key.value().to_string();
            if !key.starts_with(prefix) {
                break;
            }
            match drover_core::codec::decode(value.value()) {
                Ok(decoded) => {
                    if !value.value().starts_with(&drover_core::codec::MAGIC) {
                        unversioned.push(out.len());
                    }
                    out.push((key, decoded));
                }
                Err(error) => tracing::error!(%key, %error, "client state record cannot be read; skipped"),
            }
        }
        drop(table);
        drop(txn);
        for at in unversioned {
            let (key, value) = &out[at];
            self.put(key, value)?;
            tracing::info!(%key, "client state record rewritten in the versioned state format");
        }
        Ok(out)
    }

    /// Drops every record of an allocation that is gone from the servers and this host.
    pub fn forget(&self, alloc_id: &str) -> Result<(), ClientStoreError> {
        let fail = |reason: String| ClientStoreError::Io {
            key: format!("alloc {alloc_id}"),
            reason,
        };
        let txn = self.db.begin_write().map_err(|error| fail(error.to_string()))?;
        {
            let mut table = txn.open_table(CLIENT).map_err(|error| fail(error.to_string()))?;
            for key in [format!("spec/{alloc_id}"), format!("alloc/{alloc_id}")] {
                table.remove(key.as_str()).map_err(|error| fail(error.to_string()))?;
            }
            let prefix = format!("task/{alloc_id}/");
            table
                .retain_in(prefix.as_str()..format!("task/{alloc_id}0").as_str(), |_, _| false)
                .map_err(|error| fail(error.to_string()))?;
        }
        txn.commit().map_err(|error| fail(error.to_string()))
    }

    /// The node's secret (Nomad's `SecretID`): made once, from the runtime's generator, and
    /// kept with the client's state, so the servers know the node across restarts. Clients
    /// present it when they ask for service identity tokens.
    pub fn secret_id(&self) -> Result<String, ClientStoreError> {
        if let Some((_, secret)) = self.scan::<String>("secret-id")?.into_iter().next() {
            return Ok(secret);
        }
        let secret = crate::runtime::random_uuid();
        self.put("secret-id", &secret)?;
        Ok(secret)
    }

    /// The device instances each task held when the agent stopped.
    pub fn devices(&self) -> Result<DeviceReservations, ClientStoreError> {
        Ok(self
            .scan::<DeviceReservations>("devices")?
            .into_iter()
            .next()
            .map(|(_, devices)| devices)
            .unwrap_or_default())
    }

    pub fn registry(&self) -> Result<Registry, ClientStoreError> {
        Ok(self
            .scan::<Registry>("registry")?
            .into_iter()
            .next()
            .map(|(_, registry)| registry)
            .unwrap_or_default())
    }

    /// Allocations with their jobs, runner states and task states.
    pub fn allocs(&self) -> Result<Vec<SavedAlloc>, ClientStoreError> {
        let specs: Vec<(String, (Allocation, Job))> = self.scan("spec/")?;
        let states: BTreeMap<String, LocalAllocState> = self
            .scan::<LocalAllocState>("alloc/")?
            .into_iter()
            .map(|(key, state)| (key["alloc/".len()..].to_string(), state))
            .collect();
        let mut tasks: BTreeMap<String, BTreeMap<String, LocalTaskState>> = BTreeMap::new();
        for (key, state) in self.scan::<LocalTaskState>("task/")? {
            if let Some((alloc, task)) = key["task/".len()..].split_once('/') {
                tasks
                    .entry(alloc.to_string())
                    .or_default()
                    .insert(task.to_string(), state);
            }
        }
        // Each allocation's record holds its job; the allocations of one job version share
        // one copy in memory, as they did before the restart.
        let mut jobs: BTreeMap<(String, String, u64), Arc<Job>> = BTreeMap::new();
        Ok(specs
            .into_iter()
            .map(|(_, (alloc, job))| {
                let job = jobs
                    .entry((job.namespace.clone(), job.id.clone(), job.job_modify_index))
                    .or_insert_with(|| Arc::new(job))
                    .clone();
                let state = states.get(&alloc.id).cloned().unwrap_or_default();
                let tasks = tasks.remove(&alloc.id).unwrap_or_default();
                (alloc, job, state, tasks)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_in(dir: &std::path::Path) -> ClientStore {
        ClientStore::new(redb::Database::create(dir.join(CLIENT_STATE_FILE)).unwrap())
    }

    #[test]
    fn store_round_trips_and_forgets_one_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path());
        for id in ["a1", "a10"] {
            let alloc = Allocation {
                id: id.into(),
                ..Allocation::default()
            };
            store.put(&format!("spec/{id}"), &(alloc, Job::default())).unwrap();
            store.put(&format!("alloc/{id}"), &LocalAllocState::default()).unwrap();
            store
                .put(&format!("task/{id}/web"), &LocalTaskState::default())
                .unwrap();
        }
        assert_eq!(store.allocs().unwrap().len(), 2);
        store.forget("a1").unwrap();
        let left = store.allocs().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0.id, "a10", "a prefix-sharing id is untouched");
        assert_eq!(left[0].3.len(), 1, "its task record is kept");
        // Device choices are a record of their own.
        let mut devices = DeviceReservations::new();
        devices.entry("a10".into()).or_default().insert(
            "web".into(),
            vec![drover_core::client::devices::DevicePick {
                plugin: "drover/gpu/fake".into(),
                ids: vec!["fake-gpu-1".into()],
            }],
        );
        store.put("devices", &devices).unwrap();
        // Reopening sees the same records (they are on disk, not in memory).
        drop(store);
        let reopened = open_in(dir.path());
        assert_eq!(reopened.allocs().unwrap().len(), 1);
        assert_eq!(reopened.devices().unwrap(), devices);
    }

    #[test]
    fn records_of_an_agent_from_before_the_versioned_format_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path());
        let alloc = Allocation {
            id: "old".into(),
            ..Allocation::default()
        };
        let mut task = LocalTaskState::default();
        task.state.restarts = 2;
        let records = [
            ("spec/old", postcard::to_allocvec(&(alloc, Job::default())).unwrap()),
            ("alloc/old", postcard::to_allocvec(&LocalAllocState::default()).unwrap()),
            ("task/old/web", postcard::to_allocvec(&task).unwrap()),
        ];
        let txn = store.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(CLIENT).unwrap();
            for (key, bytes) in &records {
                table.insert(*key, bytes.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
        let allocs = store.allocs().unwrap();
        assert_eq!(allocs.len(), 1);
        assert_eq!(allocs[0].0.id, "old");
        assert_eq!(allocs[0].3["web"].state.restarts, 2);
        // Reading rewrote them in the current format, so a later build still reads them.
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(CLIENT).unwrap();
        for (key, _) in &records {
            let stored = table.get(*key).unwrap().unwrap();
            assert!(
                stored.value().starts_with(&drover_core::codec::MAGIC),
                "{key} not rewritten"
            );
        }
        drop(table);
        drop(txn);
        assert_eq!(store.allocs().unwrap()[0].3["web"].state.restarts, 2);
    }

    #[test]
    fn the_node_secret_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let secret = open_in(dir.path()).secret_id().unwrap();
        assert_eq!(secret.len(), 36, "{secret}");
        assert_eq!(&secret[14..15], "4", "{secret}");
        let reopened = open_in(dir.path());
        assert_eq!(reopened.secret_id().unwrap(), secret);
    }
}
