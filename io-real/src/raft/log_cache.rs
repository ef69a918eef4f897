//! The newest Raft log entries kept in memory, as written: replication and apply read what
//! was just appended, and would otherwise read it back from redb and decode it every time
//! (etcd's `unstable` entries and TiKV's entry cache do the same). Bounded by encoded bytes.
//! It holds exactly what the last successful writes put on disk: entries enter only after
//! their write committed, and truncation and purging remove them from both.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, PoisonError};

use openraft::Entry;

use super::TypeConfig;

/// Encoded bytes of entries kept (the newest win).
pub const LOG_CACHE_BYTES: usize = 8 << 20;

#[derive(Clone, Default)]
pub struct LogCache {
    inner: Arc<Mutex<Cached>>,
}

#[derive(Default)]
struct Cached {
    /// Index → (entry, its encoded size); contiguous.
    entries: BTreeMap<u64, (Entry<TypeConfig>, usize)>,
    bytes: usize,
}

impl LogCache {
    /// Entries just written, each with its encoded size. A gap after what is kept starts over.
    pub fn appended(&self, written: impl IntoIterator<Item = (Entry<TypeConfig>, usize)>) {
        let mut cached = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for (entry, size) in written {
            let index = entry.log_id.index;
            let contiguous = cached
                .entries
                .last_key_value()
                .is_none_or(|(last, _)| *last + 1 >= index);
            if !contiguous {
                cached.entries.clear();
                cached.bytes = 0;
            }
            // Rewriting an index drops it and everything after (a new leader's log).
            cached.remove_from(index);
            cached.entries.insert(index, (entry, size));
            cached.bytes += size;
        }
        while cached.bytes > LOG_CACHE_BYTES {
            let Some((_, (_, size))) = cached.entries.pop_first() else {
                break;
            };
            cached.bytes -= size;
        }
    }

    /// Entries from `index` on were removed from the log.
    pub fn truncated(&self, index: u64) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove_from(index);
    }

    /// Entries up to `index` were purged from the log.
    pub fn purged(&self, index: u64) {
        let mut cached = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((first, (_, size))) = cached.entries.first_key_value() {
            if *first > index {
                break;
            }
            let size = *size;
            cached.entries.pop_first();
            cached.bytes -= size;
        }
    }

    /// The entries `start..end` if every one of them is kept (`None` sends the reader to
    /// disk). An unbounded end is answered only when nothing past the newest kept entry can
    /// exist, which the cache cannot know, so it goes to disk too.
    pub fn range(&self, start: u64, end: Bound<u64>) -> Option<Vec<Entry<TypeConfig>>> {
        let last = match end {
            Bound::Included(end) => end,
            Bound::Excluded(0) => return Some(Vec::new()),
            Bound::Excluded(end) => end - 1,
            Bound::Unbounded => return None,
        };
        if last < start {
            return Some(Vec::new());
        }
        let cached = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (first, _) = cached.entries.first_key_value()?;
        let (newest, _) = cached.entries.last_key_value()?;
        if start < *first || last > *newest {
            return None;
        }
        Some(
            cached
                .entries
                .range(start..=last)
                .map(|(_, (entry, _))| entry.clone())
                .collect(),
        )
    }
}

impl Cached {
    fn remove_from(&mut self, index: u64) {
        let removed = self.entries.split_off(&index);
        self.bytes -= removed.values().map(|(_, size)| size).sum::<usize>();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    fn entry(term: u64, index: u64) -> (Entry<TypeConfig>, usize) {
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        };
        (entry, 100)
    }

    fn indexes(entries: Option<Vec<Entry<TypeConfig>>>) -> Option<Vec<(u64, u64)>> {
        entries.map(|entries| {
            entries
                .iter()
                .map(|entry| (entry.log_id.leader_id.term, entry.log_id.index))
                .collect()
        })
    }

    #[test]
    fn answers_only_ranges_it_holds_whole_and_follows_truncation_and_purging() {
        let cache = LogCache::default();
        cache.appended((1..=5).map(|index| entry(1, index)));
        assert_eq!(
            indexes(cache.range(2, Bound::Included(4))),
            Some(vec![(1, 2), (1, 3), (1, 4)])
        );
        assert_eq!(indexes(cache.range(0, Bound::Included(2))), None, "index 0 is not kept");
        assert_eq!(indexes(cache.range(4, Bound::Excluded(7))), None, "6 is not kept");
        assert_eq!(indexes(cache.range(4, Bound::Unbounded)), None);
        // A new leader's entry at 4 replaces 4 and 5.
        cache.appended([entry(2, 4)]);
        assert_eq!(indexes(cache.range(3, Bound::Included(4))), Some(vec![(1, 3), (2, 4)]));
        assert_eq!(indexes(cache.range(5, Bound::Included(5))), None);
        cache.truncated(4);
        assert_eq!(indexes(cache.range(4, Bound::Included(4))), None);
        cache.purged(2);
        assert_eq!(indexes(cache.range(2, Bound::Included(3))), None);
        assert_eq!(indexes(cache.range(3, Bound::Included(3))), Some(vec![(1, 3)]));
        // A gap (entries after a snapshot install) starts over.
        cache.appended([entry(3, 10)]);
        assert_eq!(indexes(cache.range(3, Bound::Included(3))), None);
        assert_eq!(indexes(cache.range(10, Bound::Included(10))), Some(vec![(3, 10)]));
    }

    #[test]
    fn keeps_the_newest_within_its_byte_bound() {
        let cache = LogCache::default();
        let count = (LOG_CACHE_BYTES / 100) as u64 + 10;
        cache.appended((1..=count).map(|index| entry(1, index)));
        assert_eq!(indexes(cache.range(1, Bound::Included(1))), None);
        assert!(cache.range(count - 5, Bound::Included(count)).is_some());
    }
}
