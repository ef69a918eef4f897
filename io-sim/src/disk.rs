//! A simulated disk for redb: writes land in a volatile image and reach the durable image only
//! on `sync_data`. [`SimDisk::crash`] models power loss (unsynced writes vanish) or a process
//! kill (the OS page cache survives). Handles opened before a crash are fenced off, so a dying
//! process can never write into its successor's disk.

use std::io;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct Image {
    durable: Vec<u8>,
    volatile: Vec<u8>,
    /// Byte ranges written since the last sync.
    dirty: Vec<(u64, u64)>,
    epoch: u64,
    syncs: u64,
}

/// One node's disk; outlives the node's process across kills and restarts.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    image: Arc<Mutex<Image>>,
}

/// What a crash does to unsynced data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// Power loss: everything not synced is lost.
    LoseUnsynced,
    /// The process dies but the OS keeps its page cache: unsynced writes survive.
    KeepUnsynced,
}

impl SimDisk {
    pub fn new() -> Self {
        SimDisk::default()
    }

    /// A handle that tells whether this disk still exists, without keeping it alive.
    pub fn probe(&self) -> DiskProbe {
        DiskProbe(Arc::downgrade(&self.image))
    }

    /// A storage backend for a new process incarnation.
    pub fn backend(&self) -> SimDiskBackend {
        let epoch = self.image.lock().expect("disk lock").epoch;
        SimDiskBackend {
            disk: self.clone(),
            epoch,
        }
    }

    /// The process using this disk died; returns how many dirty bytes were lost.
    pub fn crash(&self, crash: Crash) -> u64 {
        let mut image = self.image.lock().expect("disk lock");
        image.epoch += 1;
        let lost = image.dirty.iter().map(|(_, len)| len).sum();
        match crash {
            Crash::LoseUnsynced => image.volatile = image.durable.clone(),
            Crash::KeepUnsynced => image.durable = image.volatile.clone(),
        }
        image.dirty.clear();
        if crash == Crash::KeepUnsynced { 0 } else { lost }
    }

    /// Number of `sync_data` calls so far (for tests and figures).
    pub fn syncs(&self) -> u64 {
        self.image.lock().expect("disk lock").syncs
    }
}

/// Observes a disk's lifetime: a run whose disks outlive it has leaked its simulated world.
#[derive(Clone, Debug)]
pub struct DiskProbe(std::sync::Weak<Mutex<Image>>);

impl DiskProbe {
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

#[derive(Debug)]
pub struct SimDiskBackend {
    disk: SimDisk,
    epoch: u64,
}

impl SimDiskBackend {
    fn with_image<R>(&self, f: impl FnOnce(&mut Image) -> R) -> io::Result<R> {
        let mut image = self.disk.image.lock().expect("disk lock");
        if image.epoch != self.epoch {
            return Err(io::Error::other("simulated disk detached: its process crashed"));
        }
        Ok(f(&mut image))
    }
}

impl redb::StorageBackend for SimDiskBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.with_image(|image| image.volatile.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.with_image(|image| {
            let start = offset as usize;
            let end = start + out.len();
            if end > image.volatile.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of the disk",
                ));
            }
            out.copy_from_slice(&image.volatile[start..end]);
            Ok(())
        })?
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.with_image(|image| {
            let old = image.volatile.len() as u64;
            image.volatile.resize(len as usize, 0);
            if len > old {
                image.dirty.push((old, len - old));
            }
        })
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.with_image(|image| {
            image.syncs += 1;
            let len = image.volatile.len();
            image.durable.resize(len, 0);
            for (offset, dirty_len) in std::mem::take(&mut image.dirty) {
                let start = (offset as usize).min(len);
                let end = ((offset + dirty_len) as usize).min(len);
                let (durable, volatile) = (&mut image.durable, &image.volatile);
                durable[start..end].copy_from_slice(&volatile[start..end]);
            }
        })
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.with_image(|image| {
            let start = offset as usize;
            let end = start + data.len();
            if end > image.volatile.len() {
                image.volatile.resize(end, 0);
            }
            image.volatile[start..end].copy_from_slice(data);
            image.dirty.push((offset, data.len() as u64));
        })
    }
}

/// Opens the redb database on `disk`, as a process does on start; a disk that no longer opens
/// after a crash is a violation, recorded under `name`.
pub fn open_db(disk: &SimDisk, recorder: &crate::trace::Recorder, name: &str) -> Option<redb::Database> {
    match redb::Builder::new().create_with_backend(disk.backend()) {
        Ok(db) => Some(db),
        Err(error) => {
            recorder.violate("durable state reopens after a crash", format!("{name}: {error}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const TABLE: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn open(disk: &SimDisk) -> redb::Database {
        redb::Builder::new()
            .create_with_backend(disk.backend())
            .expect("database opens")
    }

    fn write(db: &redb::Database, key: u64, durability: redb::Durability) {
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(durability).unwrap();
        txn.open_table(TABLE).unwrap().insert(key, key).unwrap();
        txn.commit().unwrap();
    }

    fn keys(db: &redb::Database) -> Vec<u64> {
        let txn = db.begin_read().unwrap();
        let Ok(table) = txn.open_table(TABLE) else {
            return vec![];
        };
        use redb::ReadableTable;
        table.iter().unwrap().map(|item| item.unwrap().0.value()).collect()
    }

    #[test]
    fn power_loss_drops_unsynced_bytes_and_a_process_kill_keeps_them() {
        use redb::StorageBackend;
        for (crash, expected) in [
            (Crash::LoseUnsynced, b"aaaa\0\0\0\0"),
            (Crash::KeepUnsynced, b"aaaabbbb"),
        ] {
            let disk = SimDisk::new();
            let backend = disk.backend();
            backend.write(0, b"aaaa").unwrap();
            backend.sync_data().unwrap();
            backend.write(4, b"bbbb").unwrap();
            disk.crash(crash);
            let after = disk.backend();
            let mut out = [0u8; 8];
            after.set_len(8).unwrap();
            after.read(0, &mut out).unwrap();
            assert_eq!(&out, expected, "{crash:?}");
        }
    }

    #[test]
    fn synced_commits_survive_power_loss_and_the_database_reopens() {
        let disk = SimDisk::new();
        let db = open(&disk);
        write(&db, 1, redb::Durability::Immediate);
        write(&db, 2, redb::Durability::None);
        disk.crash(Crash::LoseUnsynced);
        drop(db);
        let db = open(&disk);
        assert_eq!(keys(&db), vec![1]);
        write(&db, 3, redb::Durability::Immediate);
        drop(db);
        assert_eq!(keys(&open(&disk)), vec![1, 3]);
    }

    #[test]
    fn a_crashed_process_cannot_write_any_more() {
        let disk = SimDisk::new();
        let backend = disk.backend();
        disk.crash(Crash::LoseUnsynced);
        use redb::StorageBackend;
        assert!(backend.write(0, b"late").is_err());
        assert!(backend.sync_data().is_err());
    }
}
