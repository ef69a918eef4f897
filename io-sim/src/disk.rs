//! A simulated disk for redb: writes land in a volatile image and reach the durable image only
//! on `sync_data`. [`SimDisk::crash`] models power loss (unsynced writes vanish) or a process
//! kill (the OS page cache survives), or a power cut that tears writes: each sector written since
//! the last sync independently made it or did not. Handles opened before a crash are fenced off,
//! so a dying process can never write into its successor's disk.
//!
//! A disk can also go bad while its process runs ([`DiskFault`]): syncs fail with EIO (and, as
//! Linux's page cache does after a failed fsync, the dirty data is then marked clean without
//! having reached the platter — "fsyncgate"), the file system fills up, or every durable write
//! is slow.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};

#[derive(Debug, Default)]
struct Image {
    durable: Vec<u8>,
    volatile: Vec<u8>,
    /// Byte ranges written since the last sync.
    dirty: Vec<(u64, u64)>,
    epoch: u64,
    syncs: u64,
    fault: DiskFault,
    /// The end of the bytes ever written: blocks past it (a file grown by `set_len`) are
    /// holes, which a full file system cannot allocate.
    allocated: u64,
    /// Power was cut mid-sync: nothing reaches the disk any more until the process is gone.
    powered_off: bool,
}

/// What is wrong with a disk right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskFault {
    /// `sync_data` fails with EIO, and what it should have synced is silently dropped from the
    /// dirty set (it stays readable from the cache, and is lost on power loss).
    pub sync_errors: bool,
    /// The file system is full: writing where no block was allocated yet fails with ENOSPC.
    pub full: bool,
    /// Every durable write takes this long (a dying disk, a saturated volume).
    pub latency: Duration,
    /// Power is cut during the next sync: a seeded half of the sectors it was writing reach
    /// the platter, the rest do not, and the process gets no further.
    pub power_cut_on_sync: Option<u64>,
}

/// The size of a sector: the unit a torn write is torn at.
const SECTOR: u64 = 512;

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
    /// Power loss mid-write: each sector written since the last sync survives or not, as the
    /// seed draws, independently of the others and of the order it was written in.
    Torn(u64),
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
        let dirty: u64 = image.dirty.iter().map(|(_, len)| len).sum();
        let lost = match crash {
            Crash::LoseUnsynced => {
                image.volatile = image.durable.clone();
                dirty
            }
            Crash::KeepUnsynced => {
                image.durable = image.volatile.clone();
                0
            }
            Crash::Torn(seed) => {
                let kept = image.tear(seed);
                image.volatile = image.durable.clone();
                dirty.saturating_sub(kept)
            }
        };
        image.dirty.clear();
        // A new process starts with a working disk; a fault that outlives it is set again.
        image.fault = DiskFault::default();
        image.powered_off = false;
        lost
    }

    /// Makes the disk misbehave (or, with `DiskFault::default()`, behave again).
    pub fn set_fault(&self, fault: DiskFault) {
        self.image.lock().expect("disk lock").fault = fault;
    }

    /// What is wrong with the disk now.
    pub fn fault(&self) -> DiskFault {
        self.image.lock().expect("disk lock").fault
    }

    /// How long each durable write takes now.
    pub fn latency(&self) -> Duration {
        self.image.lock().expect("disk lock").fault.latency
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

impl Image {
    /// Copies a seeded half of the dirty sectors to the durable image; returns how many bytes
    /// made it.
    fn tear(&mut self, seed: u64) -> u64 {
        let mut rng = rand_chacha_03::ChaCha8Rng::seed_from_u64(seed);
        let len = self.volatile.len() as u64;
        self.durable.resize(self.volatile.len(), 0);
        let mut kept = 0;
        for &(offset, dirty_len) in &self.dirty {
            let end = (offset + dirty_len).min(len);
            let mut sector = offset / SECTOR * SECTOR;
            while sector < end {
                let from = sector.max(offset);
                let to = (sector + SECTOR).min(end);
                if rng.gen_bool(0.5) {
                    let range = from as usize..to as usize;
                    self.durable[range.clone()].copy_from_slice(&self.volatile[range]);
                    kept += to - from;
                }
                sector += SECTOR;
            }
        }
        kept
    }

    fn disk_full(&self) -> io::Error {
        io::Error::new(io::ErrorKind::StorageFull, "no space left on device (simulated)")
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
        if image.powered_off {
            return Err(io::Error::other("simulated power cut: the disk is gone"));
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
            Ok(())
        })?
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.with_image(|image| {
            image.syncs += 1;
            if let Some(seed) = image.fault.power_cut_on_sync {
                image.tear(seed);
                image.volatile = image.durable.clone();
                image.dirty.clear();
                image.powered_off = true;
                return Err(io::Error::other("simulated power cut during fsync"));
            }
            if image.fault.sync_errors {
                // Linux marks the pages clean after reporting the error once: a retried sync
                // "succeeds" without the data ever having been written.
                image.dirty.clear();
                return Err(io::Error::other("input/output error (simulated failed fsync)"));
            }
            let len = image.volatile.len();
            image.durable.resize(len, 0);
            for (offset, dirty_len) in std::mem::take(&mut image.dirty) {
                let start = (offset as usize).min(len);
                let end = ((offset + dirty_len) as usize).min(len);
                let (durable, volatile) = (&mut image.durable, &image.volatile);
                durable[start..end].copy_from_slice(&volatile[start..end]);
            }
            Ok(())
        })?
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.with_image(|image| {
            let start = offset as usize;
            let end = start + data.len();
            if end as u64 > image.allocated {
                if image.fault.full {
                    return Err(image.disk_full());
                }
                image.allocated = end as u64;
            }
            if end > image.volatile.len() {
                image.volatile.resize(end, 0);
            }
            image.volatile[start..end].copy_from_slice(data);
            image.dirty.push((offset, data.len() as u64));
            Ok(())
        })?
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
    fn a_power_cut_mid_commit_leaves_every_earlier_commit_readable() {
        for seed in 0..64 {
            let disk = SimDisk::new();
            let db = open(&disk);
            for key in 1..=20 {
                write(&db, key, redb::Durability::Immediate);
            }
            disk.set_fault(DiskFault {
                power_cut_on_sync: Some(seed),
                ..DiskFault::default()
            });
            let mut txn = db.begin_write().unwrap();
            txn.set_durability(redb::Durability::Immediate).unwrap();
            txn.open_table(TABLE).unwrap().insert(21, 21).unwrap();
            assert!(txn.commit().is_err(), "seed {seed}: the torn commit reported success");
            drop(db);
            disk.crash(Crash::KeepUnsynced);
            let keys = keys(&open(&disk));
            assert_eq!(keys[..20], (1..=20).collect::<Vec<_>>()[..], "seed {seed}");
        }
    }

    #[test]
    fn a_full_disk_refuses_new_blocks_and_a_failed_sync_forgets_its_data() {
        use redb::StorageBackend;
        let disk = SimDisk::new();
        let backend = disk.backend();
        backend.write(0, b"aaaa").unwrap();
        backend.sync_data().unwrap();
        disk.set_fault(DiskFault {
            full: true,
            ..DiskFault::default()
        });
        backend.set_len(4096).unwrap();
        backend.write(0, b"bbbb").unwrap();
        let full = backend.write(8, b"cccc").unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::StorageFull);
        disk.set_fault(DiskFault {
            sync_errors: true,
            ..DiskFault::default()
        });
        assert!(backend.sync_data().is_err());
        disk.set_fault(DiskFault::default());
        // fsyncgate: the retried sync succeeds, yet the data never reached the disk.
        backend.sync_data().unwrap();
        disk.crash(Crash::LoseUnsynced);
        let mut out = [0u8; 4];
        disk.backend().read(0, &mut out).unwrap();
        assert_eq!(&out, b"aaaa");
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
