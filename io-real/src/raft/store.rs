//! Raft log, vote and snapshots in redb; the state machine is the core's pure [`ServerState`].
//!
//! One redb database per agent data dir holds three tables: the Raft log (index → entry),
//! Raft metadata (vote, committed, last purged, snapshot) and agent metadata (node id, boot
//! count, `bootstrapped`). Every write that openraft must be able to rely on is committed with
//! `Durability::Immediate` before it is acknowledged, so what was acknowledged survives a crash;
//! the simulated disk in io-sim drops everything that was not synced to prove it.

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use drover_core::bootstrap::BootState;
use drover_core::codec;
use drover_core::fsm::{Response, ServerState};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::changes::Changes;
use super::{ServerNode, TypeConfig};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const AGENT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("agent_meta");

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";
const KEY_SNAPSHOT_META: &str = "snapshot_meta";
const KEY_SNAPSHOT_DATA: &str = "snapshot_data";
const KEY_NODE_ID: &str = "node_id";
const KEY_BOOT_COUNT: &str = "boot_count";
const KEY_BOOTSTRAPPED: &str = "bootstrapped";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage error: {0}")]
    Redb(String),
    #[error("corrupt record {key}: {reason}")]
    Corrupt { key: String, reason: String },
}

fn redb_err(error: impl std::fmt::Display) -> StoreError {
    StoreError::Redb(error.to_string())
}

/// The agent's durable store, shared by the log store, the state machine and the driver.
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
    latency: Option<DiskLatency>,
}

impl Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("db", &self.db).finish_non_exhaustive()
    }
}

/// How long the disk under the store takes for one durable write right now. Real disks take
/// the time they take inside redb's fsync; a simulated disk cannot block its thread, so the
/// simulation says here how slow it is and Raft's durable writes wait that long first.
pub type DiskLatency = Arc<dyn Fn() -> std::time::Duration + Send + Sync>;

/// What the agent learns about itself from disk at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentRecord {
    pub node_id: u64,
    pub boot_count: u64,
    pub boot: BootState,
}

impl Store {
    pub fn new(db: Database) -> Result<Self, StoreError> {
        let txn = db.begin_write().map_err(redb_err)?;
        txn.open_table(LOG).map_err(redb_err)?;
        txn.open_table(RAFT_META).map_err(redb_err)?;
        txn.open_table(AGENT_META).map_err(redb_err)?;
        txn.commit().map_err(redb_err)?;
        Ok(Store {
            db: Arc::new(db),
            latency: None,
        })
    }

    /// The store on a disk this slow (the simulation's slow disks).
    pub fn with_latency(mut self, latency: Option<DiskLatency>) -> Self {
        self.latency = latency;
        self
    }

    /// Waits as long as the disk takes for a durable write.
    async fn pace(&self) {
        if let Some(latency) = &self.latency {
            let wait = latency();
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// A write transaction committed with `Durability::Immediate`: synced before `commit`
    /// returns, so what openraft is then told is durable is. Said explicitly rather than left
    /// to redb's default, because acknowledged log entries and votes depend on it.
    fn begin_durable_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        txn.set_durability(Durability::Immediate).map_err(redb_err)?;
        Ok(txn)
    }

    /// Reads (or on first start creates) the node id, counts this boot, and reports whether
    /// Raft state exists. `fresh_node_id` is used only when no id is stored yet.
    pub fn boot(&self, fresh_node_id: u64) -> Result<AgentRecord, StoreError> {
        let node_id = match self.get_agent::<u64>(KEY_NODE_ID)? {
            Some(id) => id,
            None => {
                self.put_agent(KEY_NODE_ID, &fresh_node_id)?;
                fresh_node_id
            }
        };
        let boot_count = self.get_agent::<u64>(KEY_BOOT_COUNT)?.unwrap_or(0) + 1;
        self.put_agent(KEY_BOOT_COUNT, &boot_count)?;
        let bootstrapped = self.get_agent::<bool>(KEY_BOOTSTRAPPED)?.unwrap_or(false);
        let last_log_index = self.last_log_id()?.map(|log_id| log_id.index);
        Ok(AgentRecord {
            node_id,
            boot_count,
            boot: BootState {
                last_log_index,
                bootstrapped,
            },
        })
    }

    pub fn set_bootstrapped(&self) -> Result<(), StoreError> {
        self.put_agent(KEY_BOOTSTRAPPED, &true)
    }

    pub(crate) fn last_log_id(&self) -> Result<Option<LogId<u64>>, StoreError> {
        let txn = self.db.begin_read().map_err(redb_err)?;
        let table = txn.open_table(LOG).map_err(redb_err)?;
        let last = match table.last().map_err(redb_err)? {
            Some((_, value)) => Some(decode::<Entry<TypeConfig>>("raft_log", value.value())?.log_id),
            None => None,
        };
        match last {
            Some(log_id) => Ok(Some(log_id)),
            None => self.get_raft::<LogId<u64>>(KEY_LAST_PURGED),
        }
    }

    /// Stores a snapshot (metadata as JSON, body as raw bytes) in one durable transaction.
    fn put_snapshot(&self, meta: &SnapshotMeta<u64, ServerNode>, data: &[u8]) -> Result<(), StoreError> {
        let meta = encode_record(meta);
        let txn = self.begin_durable_write()?;
        {
            let mut table = txn.open_table(RAFT_META).map_err(redb_err)?;
            table.insert(KEY_SNAPSHOT_META, meta.as_slice()).map_err(redb_err)?;
            table.insert(KEY_SNAPSHOT_DATA, data).map_err(redb_err)?;
        }
        txn.commit().map_err(redb_err)
    }

    fn get_snapshot(&self) -> Result<Option<StoredSnapshot>, StoreError> {
        let Some(meta) = self.get_raft::<SnapshotMeta<u64, ServerNode>>(KEY_SNAPSHOT_META)? else {
            return Ok(None);
        };
        let txn = self.db.begin_read().map_err(redb_err)?;
        let table = txn.open_table(RAFT_META).map_err(redb_err)?;
        let data = table
            .get(KEY_SNAPSHOT_DATA)
            .map_err(redb_err)?
            .map(|value| value.value().to_vec())
            .ok_or_else(|| StoreError::Corrupt {
                key: KEY_SNAPSHOT_DATA.into(),
                reason: "snapshot metadata without data".into(),
            })?;
        Ok(Some((meta, data)))
    }

    fn get_agent<T: for<'a> Deserialize<'a>>(&self, key: &str) -> Result<Option<T>, StoreError> {
        self.get(AGENT_META, key)
    }

    fn put_agent<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StoreError> {
        self.put(AGENT_META, key, value, Durability::Immediate)
    }

    fn get_raft<T: for<'a> Deserialize<'a>>(&self, key: &str) -> Result<Option<T>, StoreError> {
        self.get(RAFT_META, key)
    }

    fn get<T: for<'a> Deserialize<'a>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read().map_err(redb_err)?;
        let table = txn.open_table(table).map_err(redb_err)?;
        match table.get(key).map_err(redb_err)? {
            Some(value) => Ok(Some(decode(key, value.value())?)),
            None => Ok(None),
        }
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        value: &T,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let bytes = encode_record(value);
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        txn.set_durability(durability).map_err(redb_err)?;
        {
            let mut table = txn.open_table(table).map_err(redb_err)?;
            table.insert(key, bytes.as_slice()).map_err(redb_err)?;
        }
        txn.commit().map_err(redb_err)
    }
}

/// Every record of the store (log entries, vote, metadata) is a versioned state record
/// ([`codec`]): a later build reads it, an earlier one refuses it by name instead of misreading it.
fn encode_record<T: Serialize>(value: &T) -> Vec<u8> {
    codec::encode(value)
}

/// Reads a versioned record, or the bare JSON every record was before the store was versioned
/// (JSON never starts with the codec's magic byte `0xff`).
fn decode<T: for<'a> Deserialize<'a>>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: key.to_string(),
        reason,
    };
    if bytes.starts_with(&codec::MAGIC) {
        return codec::decode(bytes).map_err(|error| corrupt(error.to_string()));
    }
    serde_json::from_slice(bytes).map_err(|error| corrupt(error.to_string()))
}

/// One stored Raft log record into its entry, as the log reader reads it (the fuzz targets in
/// `io-real/http/fuzz` drive it with damaged records).
pub fn decode_log_record(bytes: &[u8]) -> Result<Entry<TypeConfig>, StoreError> {
    decode("raft_log", bytes)
}

/// A log entry as the log writer stores it.
pub fn encode_log_record(entry: &Entry<TypeConfig>) -> Vec<u8> {
    encode_record(entry)
}

/// A stored snapshot body into the state it holds, as a restart or an installed snapshot reads it.
pub fn decode_snapshot_record(bytes: &[u8]) -> Result<ServerState, StoreError> {
    decode_body(bytes).map(|body| body.state)
}

/// A snapshot body holding `state`, as the snapshot builder stores it (no log position, no
/// membership).
pub fn encode_snapshot_record(state: &ServerState) -> Vec<u8> {
    codec::encode(&SnapshotBodyRef {
        last_applied: None,
        membership: &StoredMembership::default(),
        state,
    })
}

/// A stored snapshot: its metadata and its body (a [`SnapshotBody`] record).
type StoredSnapshot = (SnapshotMeta<u64, ServerNode>, Vec<u8>);

/// Reads a snapshot body: a versioned record ([`drover_core::codec`]), or the unversioned
/// postcard form written before, whose state was itself postcard inside.
fn decode_body(data: &[u8]) -> Result<SnapshotBody, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: KEY_SNAPSHOT_DATA.into(),
        reason,
    };
    if data.starts_with(&codec::MAGIC) {
        return codec::decode(data).map_err(|error| corrupt(error.to_string()));
    }
    let body: UnversionedSnapshotBody = postcard::from_bytes(data).map_err(|error| corrupt(error.to_string()))?;
    Ok(SnapshotBody {
        last_applied: body.last_applied,
        membership: body.membership,
        state: ServerState::restore(&body.state).map_err(|error| corrupt(error.to_string()))?,
    })
}

fn io_read(error: StoreError) -> StorageError<u64> {
    StorageIOError::read(&error).into()
}

fn io_write(error: StoreError) -> StorageError<u64> {
    StorageIOError::write(&error).into()
}

/// Called with every vote openraft persists, after it is durable: Raft's exact state
/// transitions (a committed vote names the leader of its term), where the metrics channel
/// only samples the latest state.
pub type VoteHook = Arc<dyn Fn(&Vote<u64>) + Send + Sync>;

/// openraft's log storage over [`Store`].
#[derive(Clone)]
pub struct LogStore {
    store: Store,
    on_vote: Option<VoteHook>,
    /// Regression switches that skip a sync on purpose (simulation only).
    faults: drover_core::config::RaftFaults,
    /// The newest entries as written, shared by every reader of this log.
    cache: super::log_cache::LogCache,
    /// The committed id openraft last saved, not yet written: it rides along with the next
    /// durable write (entries, a truncation, a vote). A commit without a sync is lost by a
    /// crash all the same (redb persists it only with the next synced one), so this keeps
    /// its durability and saves a write transaction per commit on every server.
    committed: Arc<Mutex<Option<Option<LogId<u64>>>>>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("store", &self.store)
            .field("on_vote", &self.on_vote.is_some())
            .finish()
    }
}

impl LogStore {
    pub fn new(store: Store) -> Self {
        LogStore {
            store,
            on_vote: None,
            faults: drover_core::config::RaftFaults::default(),
            cache: super::log_cache::LogCache::default(),
            committed: Arc::default(),
        }
    }

    /// Re-creates the durability defects `faults` names (regression switches).
    pub fn with_faults(mut self, faults: drover_core::config::RaftFaults) -> Self {
        self.faults = faults;
        self
    }

    pub fn with_vote_hook(mut self, hook: VoteHook) -> Self {
        self.on_vote = Some(hook);
        self
    }

    fn read_range(&self, start: u64, end: Bound<u64>) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        if let Some(entries) = self.cache.range(start, end) {
            return Ok(entries);
        }
        let txn = self.store.db.begin_read().map_err(redb_err)?;
        let table = txn.open_table(LOG).map_err(redb_err)?;
        let range = match end {
            Bound::Included(end) => table.range(start..=end),
            Bound::Excluded(end) => table.range(start..end),
            Bound::Unbounded => table.range(start..),
        }
        .map_err(redb_err)?;
        let mut entries = Vec::new();
        for item in range {
            let (_, value) = item.map_err(redb_err)?;
            entries.push(decode("raft_log", value.value())?);
        }
        Ok(entries)
    }

    fn write_entries(&self, entries: Vec<Entry<TypeConfig>>) -> Result<(), StoreError> {
        let mut txn = self.store.begin_durable_write()?;
        if self.faults.unsynced_log {
            txn.set_durability(Durability::None).map_err(redb_err)?;
        }
        let mut sizes = Vec::with_capacity(entries.len());
        {
            let mut table = txn.open_table(LOG).map_err(redb_err)?;
            for entry in &entries {
                let bytes = encode_record(entry);
                table.insert(entry.log_id.index, bytes.as_slice()).map_err(redb_err)?;
                sizes.push(bytes.len());
            }
        }
        let committed = self.stage_committed(&txn)?;
        txn.commit().map_err(redb_err)?;
        self.committed_written(committed);
        self.cache.appended(entries.into_iter().zip(sizes));
        Ok(())
    }

    /// Adds the committed id waiting to be written to `txn`; returns it, for
    /// [`Self::committed_written`] once `txn` committed.
    fn stage_committed(&self, txn: &redb::WriteTransaction) -> Result<Option<Option<LogId<u64>>>, StoreError> {
        let pending = *self.committed.lock().expect("committed lock");
        if let Some(committed) = pending {
            let mut meta = txn.open_table(RAFT_META).map_err(redb_err)?;
            let bytes = encode_record(&committed);
            meta.insert(KEY_COMMITTED, bytes.as_slice()).map_err(redb_err)?;
        }
        Ok(pending)
    }

    /// Forgets the waiting committed id if it is still the one `txn` wrote.
    fn committed_written(&self, written: Option<Option<LogId<u64>>>) {
        let mut pending = self.committed.lock().expect("committed lock");
        if written.is_some() && *pending == written {
            *pending = None;
        }
    }

    /// One record of the Raft metadata, with the waiting committed id.
    fn put_meta<T: Serialize>(&self, key: &str, value: &T, durability: Durability) -> Result<(), StoreError> {
        let mut txn = self.store.db.begin_write().map_err(redb_err)?;
        txn.set_durability(durability).map_err(redb_err)?;
        {
            let mut meta = txn.open_table(RAFT_META).map_err(redb_err)?;
            let bytes = encode_record(value);
            meta.insert(key, bytes.as_slice()).map_err(redb_err)?;
        }
        let committed = self.stage_committed(&txn)?;
        txn.commit().map_err(redb_err)?;
        self.committed_written(committed);
        Ok(())
    }

    /// Purges the log up to `log_id`, but never past the stored snapshot: an entry goes only
    /// once a snapshot that covers it is on disk (read first: a snapshot only ever grows, so
    /// one written meanwhile only means less is purged now). openraft
    /// purges a follower's log when it installs a leader's snapshot without waiting for the
    /// install's write; should that write fail while the purge's lands (a failed fsync leaves
    /// the pages readable), the restarted server had neither (swarm seed 733). What is kept
    /// past openraft's purge point is never asked for, and goes at the next purge.
    fn purge_covered(&self, log_id: LogId<u64>) -> Result<(), StoreError> {
        let covered = self
            .store
            .get_raft::<SnapshotMeta<u64, ServerNode>>(KEY_SNAPSHOT_META)?
            .and_then(|snapshot| snapshot.last_log_id);
        let upto = match covered {
            Some(covered) if covered.index < log_id.index => covered,
            Some(_) => log_id,
            None => return Ok(()),
        };
        self.remove_range(..=upto.index, Some(upto))
    }

    fn remove_range(&self, range: impl RangeBounds<u64>, purged: Option<LogId<u64>>) -> Result<(), StoreError> {
        let txn = self.store.begin_durable_write()?;
        {
            let mut table = txn.open_table(LOG).map_err(redb_err)?;
            let keys: Vec<u64> = table
                .range(range)
                .map_err(redb_err)?
                .map(|item| item.map(|(key, _)| key.value()))
                .collect::<Result<_, _>>()
                .map_err(redb_err)?;
            for key in keys {
                table.remove(key).map_err(redb_err)?;
            }
            if let Some(purged) = purged {
                let mut meta = txn.open_table(RAFT_META).map_err(redb_err)?;
                let bytes = encode_record(&purged);
                meta.insert(KEY_LAST_PURGED, bytes.as_slice()).map_err(redb_err)?;
            }
        }
        let committed = self.stage_committed(&txn)?;
        txn.commit().map_err(redb_err)?;
        self.committed_written(committed);
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        let start = match range.start_bound() {
            Bound::Included(start) => *start,
            Bound::Excluded(start) => start + 1,
            Bound::Unbounded => 0,
        };
        self.read_range(start, range.end_bound().cloned()).map_err(io_read)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let last_purged_log_id = self.store.get_raft(KEY_LAST_PURGED).map_err(io_read)?;
        let last_log_id = self.store.last_log_id().map_err(io_read)?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.store.pace().await;
        let durability = if self.faults.unsynced_vote {
            Durability::None
        } else {
            Durability::Immediate
        };
        self.put_meta(KEY_VOTE, vote, durability)
            .map_err(|error| StorageIOError::write_vote(&error))?;
        if let Some(hook) = &self.on_vote {
            hook(vote);
        }
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.store
            .get_raft(KEY_VOTE)
            .map_err(|error| StorageIOError::read_vote(&error).into())
    }

    /// Committed is a hint that lets a restarted server re-apply its log at once; losing the
    /// latest value is harmless, so it is written with the next durable write, not on its own.
    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), StorageError<u64>> {
        *self.committed.lock().expect("committed lock") = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        if let Some(committed) = *self.committed.lock().expect("committed lock") {
            return Ok(committed);
        }
        Ok(self
            .store
            .get_raft::<Option<LogId<u64>>>(KEY_COMMITTED)
            .map_err(io_read)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        if entries.is_empty() {
            // Nothing to write, and every earlier append was synced before it returned.
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.store.pace().await;
        let result = self.write_entries(entries);
        match result {
            Err(error) if self.faults.swallow_log_write_errors => {
                tracing::warn!(%error, "failed to write log entries; carrying on (regression switch)");
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
                Err(io_write(error))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.store.pace().await;
        // Forgotten first: should the removal fail, the cache must not answer for the disk.
        self.cache.truncated(log_id.index);
        self.remove_range(log_id.index.., None).map_err(io_write)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.store.pace().await;
        self.cache.purged(log_id.index);
        if self.faults.purge_beyond_snapshot {
            return self.remove_range(..=log_id.index, Some(log_id)).map_err(io_write);
        }
        self.purge_covered(log_id).map_err(io_write)
    }
}

/// The applied state: the core FSM plus what openraft needs to know about it. Cloning it is
/// cheap (the FSM's tables are persistent maps).
#[derive(Clone, Debug, Default)]
pub struct Applied {
    pub state: ServerState,
    pub last_applied: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, ServerNode>,
    /// Set when applying an entry panicked: the state may be half-changed, so nothing more is
    /// applied (openraft stops on the storage error) and the agent says why; reads still answer.
    pub failure: Option<String>,
}

/// The applied state, shared by the state machine (its only writer) and every reader (HTTP,
/// the core's context, blocking queries), as immutable versions.
///
/// Readers never block the apply path (issue 19 §4). After each batch of entries the writer
/// publishes a new version; a reader takes the version current when it asks (a reference
/// count, under a lock that guards only the pointer) and reads it for as long as it likes,
/// while later applies build later versions beside it. A version costs O(1) to take and a write
/// O(log n) extra, because the tables are persistent maps ([`drover_core::fsm::PMap`]).
///
/// An apply that panics is caught ([`Applied::failure`] records it) and a poisoned pointer lock
/// is read through anyway ([`PoisonError::into_inner`]), so the agent never wedges.
#[derive(Clone, Debug, Default)]
pub struct AppliedState {
    published: Arc<RwLock<Arc<Applied>>>,
    /// Serialises writers (the state machine task and a snapshot install are one task in
    /// openraft, but nothing here relies on it), so no published version is lost.
    writer: Arc<Mutex<()>>,
}

impl AppliedState {
    fn new(applied: Applied) -> Self {
        AppliedState {
            published: Arc::new(RwLock::new(Arc::new(applied))),
            writer: Arc::default(),
        }
    }

    /// The latest published version, to read without holding anything up.
    pub fn snapshot(&self) -> Arc<Applied> {
        Arc::clone(&self.published.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn read<R>(&self, read: impl FnOnce(&Applied) -> R) -> R {
        read(&self.snapshot())
    }

    /// Builds the next version from the latest one and publishes it when `write` returns.
    fn write<R>(&self, write: impl FnOnce(&mut Applied) -> R) -> R {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = Applied::clone(&self.snapshot());
        let result = write(&mut next);
        *self.published.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        result
    }

    /// The index of the last applied log entry (0 before the first).
    pub fn last_applied_index(&self) -> u64 {
        self.read(|applied| applied.last_applied.map(|log| log.index).unwrap_or(0))
    }
}

/// Notified of every applied entry (used by the simulation's invariant checker).
/// Called with the state as it is right after the entry was applied.
/// Called after each applied entry with the state before and after it (a clone of the state
/// costs a few reference counts: its tables are persistent maps).
pub type ApplyHook = Arc<dyn Fn(u64, &Entry<TypeConfig>, &ServerState, &ServerState) + Send + Sync>;

/// A snapshot's body, as stored and as sent to other servers: a versioned record, so a server
/// of a later build reads it and one of an earlier build skips fields it does not know.
#[derive(Deserialize)]
struct SnapshotBody {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, ServerNode>,
    state: ServerState,
}

/// [`SnapshotBody`] by reference, to encode without copying the state.
#[derive(Serialize)]
struct SnapshotBodyRef<'a> {
    last_applied: Option<LogId<u64>>,
    membership: &'a StoredMembership<u64, ServerNode>,
    state: &'a ServerState,
}

/// The body written before the state format was versioned.
#[derive(Serialize, Deserialize)]
struct UnversionedSnapshotBody {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, ServerNode>,
    state: Vec<u8>,
}

/// openraft's state machine: a thin adapter that feeds committed entries to [`ServerState`].
#[derive(Clone)]
pub struct StateMachine {
    store: Store,
    applied: AppliedState,
    /// Bumped after every apply or install, for blocking queries.
    changes: Changes,
    on_apply: Option<ApplyHook>,
    snapshot_seq: Arc<AtomicU64>,
    /// Where apply timings go (`nomad.raft.fsm.apply`, `nomad.nomad.fsm.<command>`).
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl StateMachine {
    /// Apply timings go to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Restores the state from the stored snapshot, if any.
    pub fn open(store: Store, on_apply: Option<ApplyHook>) -> Result<Self, StoreError> {
        let mut applied = Applied::default();
        if let Some((meta, data)) = store.get_snapshot()? {
            let body = decode_body(&data)?;
            if !data.starts_with(&codec::MAGIC) {
                // Rewritten in the versioned format now, while this build can still read the
                // unversioned one (it reads only the shapes of its own time).
                let data = codec::encode(&SnapshotBodyRef {
                    last_applied: body.last_applied,
                    membership: &body.membership,
                    state: &body.state,
                });
                store.put_snapshot(&meta, &data)?;
                tracing::info!("Raft snapshot rewritten in the versioned state format");
            }
            applied.state = body.state;
            applied.last_applied = body.last_applied;
            applied.membership = body.membership;
        }
        Ok(StateMachine {
            store,
            applied: AppliedState::new(applied),
            changes: Changes::default(),
            on_apply,
            snapshot_seq: Arc::default(),
            metrics: None,
        })
    }

    /// Shared read access to the applied state for API reads.
    pub fn applied(&self) -> AppliedState {
        self.applied.clone()
    }

    /// Changes whenever the applied state changes.
    pub fn changes(&self) -> Changes {
        self.changes.clone()
    }

    fn notify(&self) {
        self.changes.bump();
    }

    fn install(&self, meta: &SnapshotMeta<u64, ServerNode>, data: Vec<u8>) -> Result<(), StoreError> {
        let body = decode_body(&data)?;
        self.store.put_snapshot(meta, &data)?;
        self.applied.write(|applied| {
            applied.state = body.state;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
            // A snapshot from the leader is a whole, sound state again.
            applied.failure = None;
        });
        self.notify();
        Ok(())
    }
}

impl StateMachine {
    /// Applies one entry to the version being built. A panic in the core's apply is caught here: the
    /// state may be half-changed, so it is recorded as the machine's failure and nothing more
    /// is applied; openraft stops on the error this returns.
    fn apply_one(&self, applied: &mut Applied, entry: &Entry<TypeConfig>) -> Result<Response, String> {
        if let Some(failure) = &applied.failure {
            return Err(failure.clone());
        }
        let index = entry.log_id.index;
        let before = self.on_apply.as_ref().map(|_| applied.state.clone());
        let started = tokio::time::Instant::now();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| match &entry.payload {
            EntryPayload::Normal(data) => applied.state.apply(index, data),
            EntryPayload::Blank => {
                applied.state.advance(index);
                Response::Done
            }
            EntryPayload::Membership(membership) => {
                applied.state.advance(index);
                applied.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                Response::Done
            }
        }));
        let response = match outcome {
            Ok(response) => response,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown panic");
                let failure = format!("applying Raft entry {index} failed: {message}");
                tracing::error!(index, %message, "the state machine failed; no further entries are applied");
                applied.failure = Some(failure.clone());
                return Err(failure);
            }
        };
        applied.last_applied = Some(entry.log_id);
        if let (Some(metrics), EntryPayload::Normal(data)) = (&self.metrics, &entry.payload) {
            let took = started.elapsed();
            metrics.sample("nomad.raft.fsm.apply", &[], took);
            metrics.sample(&format!("nomad.nomad.fsm.{}", data.command.name()), &[], took);
        }
        if let (Some(hook), Some(before)) = (&self.on_apply, &before) {
            hook(index, entry, before, &applied.state);
        }
        Ok(response)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        // The published version, encoded at leisure: applies and reads go on meanwhile.
        let (state, last_applied, membership, failure) = self.applied.read(|applied| {
            (
                applied.state.clone(),
                applied.last_applied,
                applied.membership.clone(),
                applied.failure.clone(),
            )
        });
        if let Some(failure) = failure {
            // A half-applied state must not reach the disk or another server as a snapshot.
            let error = StoreError::Redb(failure);
            return Err(StorageError::from(StorageIOError::write_snapshot(None, &error)));
        }
        let seq = self.snapshot_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match last_applied {
            Some(log_id) => format!("{}-{}-{seq}", log_id.leader_id, log_id.index),
            None => format!("none-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        // Encoding a large state takes seconds of CPU (a million allocations: ~3 s): in the
        // background at a lower priority, so no runtime worker (Raft heartbeats, the API)
        // waits behind it and writes keep their latency meanwhile.
        let store = self.store.clone();
        let written_meta = meta.clone();
        let data = crate::runtime::background("raft-snapshot", move || {
            let data = codec::encode(&SnapshotBodyRef {
                last_applied,
                membership: &written_meta.last_membership,
                state: &state,
            });
            drop(state);
            store.put_snapshot(&written_meta, &data).map(|()| data)
        })
        .await
        .unwrap_or_else(|| Err(StoreError::Redb("building the snapshot failed: its thread died".into())))
        .map_err(|error| StorageError::from(StorageIOError::write_snapshot(Some(meta.signature()), &error)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, ServerNode>), StorageError<u64>> {
        Ok(self
            .applied
            .read(|applied| (applied.last_applied, applied.membership.clone())))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // One version per batch: readers see a batch whole, and publishing costs once.
        let outcome = self.applied.write(|applied| {
            let mut responses = Vec::new();
            for entry in entries {
                match self.apply_one(applied, &entry) {
                    Ok(response) => responses.push(response),
                    Err(failure) => return Err((entry.log_id, failure)),
                }
            }
            Ok(responses)
        });
        self.notify();
        outcome.map_err(|(log_id, failure)| {
            let error = StoreError::Redb(failure);
            StorageError::from(StorageIOError::apply(log_id, &error))
        })
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, ServerNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        self.install(meta, snapshot.into_inner())
            .map_err(|error| StorageError::from(StorageIOError::write_snapshot(Some(meta.signature()), &error)))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let stored = self.store.get_snapshot().map_err(io_read)?;
        Ok(stored.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_core::fsm::Command;
    use std::collections::BTreeMap;

    fn state() -> ServerState {
        let mut state = ServerState::default();
        let command = Command::VariableUpsert {
            path: "app".into(),
            items: BTreeMap::from([("k".into(), "v".into())]).into(),
            cas: None,
            lock_id: None,
        };
        state.apply(1, &drover_core::fsm::Entry { at_unix_ms: 1, command });
        state
    }

    fn meta() -> SnapshotMeta<u64, ServerNode> {
        SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), 1)),
            last_membership: StoredMembership::default(),
            snapshot_id: "1-1-1".into(),
        }
    }

    fn raft_entry(index: u64, path: &str) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(drover_core::fsm::Entry {
                at_unix_ms: index,
                command: Command::VariableUpsert {
                    path: path.into(),
                    items: BTreeMap::from([("k".into(), "v".into())]).into(),
                    cas: None,
                    lock_id: None,
                },
            }),
        }
    }

    /// A log entry and a vote as builds before the versioned store wrote them (bare JSON),
    /// and a log entry in state format v1, exactly as written: every later build reads them.
    const LEGACY_ENTRY_JSON: &str = r#"{"log_id":{"leader_id":1,"index":5},"payload":{"Normal":{"at_unix_ms":5,"command":{"VariableUpsert":{"path":"a","items":{"k":"v"}}}}}}"#;
    const LEGACY_VOTE_JSON: &str = r#"{"leader_id":{"term":3,"voted_for":2},"committed":true}"#;
    const V1_ENTRY_HEX: &str = "ff4452560163000000f054a2666c6f675f6964a2696c65616465725f69640165696e64657805677061796c6f6164a1664e6f726d616ca26a61745f756e69785f6d730567636f6d6d616e64a16e5661726961626c65557073657274a264706174686161656974656d73a1616b6176";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn log_records_of_earlier_builds_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let txn = store.db.begin_write().unwrap();
        {
            let mut log = txn.open_table(LOG).unwrap();
            log.insert(5, LEGACY_ENTRY_JSON.as_bytes()).unwrap();
            log.insert(6, hex(V1_ENTRY_HEX).as_slice()).unwrap();
            let mut meta = txn.open_table(RAFT_META).unwrap();
            meta.insert(KEY_VOTE, LEGACY_VOTE_JSON.as_bytes()).unwrap();
        }
        txn.commit().unwrap();

        let mut log = LogStore::new(store);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let entries = runtime.block_on(log.try_get_log_entries(5..7)).unwrap();
        assert_eq!(entries.len(), 2);
        for entry in &entries {
            assert_eq!(entry.payload, raft_entry(5, "a").payload);
        }
        assert_eq!(entries[0].log_id, raft_entry(5, "a").log_id);
        let vote = runtime.block_on(log.read_vote()).unwrap();
        assert_eq!(vote, Some(Vote::new_committed(3, 2)));
        // What this build writes is the versioned form.
        assert_eq!(encode_record(&raft_entry(5, "a")), hex(V1_ENTRY_HEX));
    }

    /// A reader holding a version does not hold up applies, and keeps seeing its version.
    #[test]
    fn a_reader_holding_a_version_neither_blocks_applies_nor_sees_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let mut machine = StateMachine::open(store, None).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(machine.apply([raft_entry(1, "a")])).unwrap();
        let applied = machine.applied();
        let held = applied.snapshot();
        // Applied on this same thread while the version is held: a lock held by the reader
        // would deadlock here.
        runtime
            .block_on(machine.apply([raft_entry(2, "b"), raft_entry(3, "c")]))
            .unwrap();
        assert!(held.state.variable("a").is_some());
        assert!(held.state.variable("b").is_none(), "a held version does not change");
        assert_eq!(held.last_applied.map(|log| log.index), Some(1));
        assert_eq!(applied.last_applied_index(), 3);
        assert!(applied.read(|a| a.state.variable("c").is_some()));
    }

    /// A panic inside the core's apply (here its own out-of-order assertion) must not wedge the
    /// agent: the lock stays usable, reads answer, and nothing more is applied.
    #[test]
    fn a_panicking_apply_is_a_failure_not_a_wedged_lock() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let mut machine = StateMachine::open(store, None).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(machine.apply([raft_entry(2, "a")])).unwrap();
        let error = runtime
            .block_on(machine.apply([raft_entry(1, "b")]))
            .expect_err("an out-of-order apply fails");
        assert!(error.to_string().contains("apply"), "{error}");
        let applied = machine.applied();
        let failure = applied.read(|a| a.failure.clone()).expect("the failure is recorded");
        assert!(failure.contains("apply out of order"), "{failure}");
        assert_eq!(applied.last_applied_index(), 2, "reads still answer");
        assert!(applied.read(|a| a.state.variable("a").is_some()));
        runtime
            .block_on(machine.apply([raft_entry(3, "c")]))
            .expect_err("nothing is applied after a failure");
        assert!(applied.read(|a| a.state.variable("c").is_none()));
        // A state that may be half-applied is not snapshotted.
        assert!(runtime.block_on(machine.build_snapshot()).is_err());
    }

    #[test]
    fn a_snapshot_of_the_unversioned_form_and_of_the_current_one_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let legacy = postcard::to_allocvec(&UnversionedSnapshotBody {
            last_applied: meta().last_log_id,
            membership: StoredMembership::default(),
            state: postcard::to_allocvec(&state()).unwrap(),
        })
        .unwrap();
        store.put_snapshot(&meta(), &legacy).unwrap();
        let mut machine = StateMachine::open(store.clone(), None).unwrap();
        assert_eq!(machine.applied().read(|a| a.state.clone()), state());
        let (_, rewritten) = store.get_snapshot().unwrap().unwrap();
        assert!(
            rewritten.starts_with(&codec::MAGIC),
            "opening rewrites it in the versioned format"
        );

        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let snapshot = runtime.block_on(machine.build_snapshot()).unwrap();
        assert!(snapshot.snapshot.get_ref().starts_with(&codec::MAGIC));
        let reopened = StateMachine::open(store.clone(), None).unwrap();
        assert_eq!(reopened.applied().read(|a| a.state.clone()), state());
        assert_eq!(reopened.applied().read(|a| a.last_applied), meta().last_log_id);

        store.put_snapshot(&meta(), b"\xffDRV\x09").unwrap();
        let error = StateMachine::open(store, None)
            .err()
            .expect("a newer format is refused");
        assert!(error.to_string().contains("newer Drover (state format v9"), "{error}");
    }

    /// A slow disk slows every durable Raft write: the vote, truncation and purging each wait
    /// out the disk's latency before they write (only a lower bound is checked: a sleep never
    /// ends early, so this cannot fail by luck).
    #[test]
    fn a_slow_disk_delays_every_durable_raft_write() {
        let dir = tempfile::tempdir().unwrap();
        let asked = Arc::new(AtomicU64::new(0));
        let latency: DiskLatency = {
            let asked = asked.clone();
            Arc::new(move || {
                asked.fetch_add(1, Ordering::SeqCst);
                std::time::Duration::from_millis(40)
            })
        };
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap())
            .unwrap()
            .with_latency(Some(latency));
        let mut log = LogStore::new(store);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let log_id = LogId::new(openraft::CommittedLeaderId::new(1, 1), 1);
            for step in 0..3 {
                let started = std::time::Instant::now();
                match step {
                    0 => log.save_vote(&Vote::new(1, 1)).await.unwrap(),
                    1 => log.truncate(log_id).await.unwrap(),
                    _ => log.purge(log_id).await.unwrap(),
                }
                assert!(
                    started.elapsed() >= std::time::Duration::from_millis(40),
                    "write {step} did not wait for the disk"
                );
            }
        });
        assert_eq!(asked.load(Ordering::SeqCst), 3);
    }

    /// openraft's committed id is kept in memory and written with the next durable write (a
    /// commit on its own would not be durable either), so a restarted server reads what was
    /// synced and the running one what was saved.
    #[test]
    fn the_committed_id_is_written_with_the_next_durable_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let mut log = LogStore::new(store.clone());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let at = |index| Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index));
        let on_disk = || runtime.block_on(LogStore::new(store.clone()).read_committed()).unwrap();
        runtime.block_on(log.save_committed(at(2))).unwrap();
        assert_eq!(runtime.block_on(log.read_committed()).unwrap(), at(2));
        assert_eq!(on_disk(), None);
        log.write_entries(vec![raft_entry(1, "a")]).unwrap();
        assert_eq!(on_disk(), at(2));
        runtime.block_on(log.save_committed(at(3))).unwrap();
        runtime.block_on(log.save_vote(&Vote::new(1, 1))).unwrap();
        assert_eq!(on_disk(), at(3));
        runtime.block_on(log.save_committed(at(4))).unwrap();
        runtime
            .block_on(log.truncate(LogId::new(openraft::CommittedLeaderId::new(1, 1), 5)))
            .unwrap();
        assert_eq!(on_disk(), at(4));
        assert_eq!(runtime.block_on(log.read_committed()).unwrap(), at(4));
    }

    /// What the log reader answers follows the disk through writes, a new leader's rewrite,
    /// truncation and purging (the in-memory cache is filled and emptied with it).
    #[test]
    fn the_log_reader_follows_the_disk_through_truncation_and_purging() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let mut log = LogStore::new(store);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let paths = |log: &LogStore, end: u64| -> Vec<String> {
            log.read_range(1, Bound::Included(end))
                .unwrap()
                .iter()
                .map(|entry| match &entry.payload {
                    EntryPayload::Normal(entry) => match &entry.command {
                        Command::VariableUpsert { path, .. } => format!("{}:{path}", entry.at_unix_ms),
                        other => panic!("unexpected {other:?}"),
                    },
                    other => panic!("unexpected {other:?}"),
                })
                .collect()
        };
        log.write_entries((1..=4).map(|index| raft_entry(index, "old")).collect())
            .unwrap();
        assert_eq!(paths(&log, 4), ["1:old", "2:old", "3:old", "4:old"]);
        // A new leader rewrites 3 onwards.
        log.write_entries(vec![raft_entry(3, "new")]).unwrap();
        assert_eq!(paths(&log, 3), ["1:old", "2:old", "3:new"]);
        runtime.block_on(async {
            log.truncate(LogId::new(openraft::CommittedLeaderId::new(1, 1), 3))
                .await
                .unwrap();
        });
        assert_eq!(paths(&log, 3), ["1:old", "2:old"]);
        // A snapshot covers entry 1, so it may go.
        log.store
            .put_snapshot(&meta(), &encode_snapshot_record(&state()))
            .unwrap();
        runtime.block_on(async {
            log.purge(LogId::new(openraft::CommittedLeaderId::new(1, 1), 1))
                .await
                .unwrap();
        });
        let rest = log.read_range(1, Bound::Included(2)).unwrap();
        assert_eq!(rest.iter().map(|entry| entry.log_id.index).collect::<Vec<_>>(), [2]);
        // A second reader of the same log sees the same.
        let mut reader = runtime.block_on(log.get_log_reader());
        let read = runtime.block_on(reader.try_get_log_entries(2..=2)).unwrap();
        assert_eq!(read.len(), 1);
    }

    /// The log is purged only as far as the stored snapshot covers it (swarm seed 733: a
    /// follower's purge landed while the snapshot it installed did not).
    #[test]
    fn the_log_is_never_purged_past_the_stored_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(Database::create(dir.path().join("raft.db")).unwrap()).unwrap();
        let mut log = LogStore::new(store);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let at = |index| LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
        log.write_entries((1..=4).map(|index| raft_entry(index, "a")).collect())
            .unwrap();
        let kept = |log: &LogStore| -> Vec<u64> {
            log.read_range(1, Bound::Included(4))
                .unwrap()
                .iter()
                .map(|entry| entry.log_id.index)
                .collect()
        };
        // No snapshot: nothing goes, and nothing is recorded as purged.
        runtime.block_on(log.purge(at(3))).unwrap();
        assert_eq!(kept(&log), [1, 2, 3, 4]);
        assert_eq!(runtime.block_on(log.get_log_state()).unwrap().last_purged_log_id, None);
        // A snapshot up to 1: only entry 1 goes, and the purge point says so.
        log.store
            .put_snapshot(&meta(), &encode_snapshot_record(&state()))
            .unwrap();
        runtime.block_on(log.purge(at(3))).unwrap();
        assert_eq!(kept(&log), [2, 3, 4]);
        assert_eq!(
            runtime.block_on(log.get_log_state()).unwrap().last_purged_log_id,
            Some(at(1))
        );
    }
}
