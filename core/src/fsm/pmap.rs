//! Persistent (immutable, structurally shared) ordered maps for the state store's tables.
//!
//! Issue 19 §4: readers must never block the apply path. The driver publishes an immutable
//! copy of the state after every apply, and readers work on the copy they took for as long as
//! they like. For that copy to cost nothing, cloning a table is O(1) (a reference count) and a
//! write after a clone copies only the path from the root to the entry it changes, O(log n),
//! never the whole table. The copy-on-write `Arc<BTreeMap>` used before copied the whole
//! table on the first write after a clone: a million-allocation table per apply while any
//! reader held a snapshot.
//!
//! [`PMap`] wraps `rpds`' red-black tree (no_std, `Arc` nodes) with the subset of `BTreeMap`'s
//! API the state machine uses, so the tables read as before. It serialises as a plain map, so
//! the snapshot format is unchanged.

use core::borrow::Borrow;
use core::fmt;
use core::marker::PhantomData;
use core::ops::RangeBounds;

use rpds::RedBlackTreeMapSync;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::prelude::*;

/// An ordered map whose clones share structure: cloning is O(1), and writing to one clone
/// copies O(log n) nodes and leaves every other clone as it was.
pub struct PMap<K, V>(RedBlackTreeMapSync<K, V>);

impl<K: Ord, V> Default for PMap<K, V> {
    fn default() -> Self {
        PMap(RedBlackTreeMapSync::new_sync())
    }
}

impl<K: Ord, V> Clone for PMap<K, V> {
    fn clone(&self) -> Self {
        PMap(self.0.clone())
    }
}

impl<K: Ord, V> PMap<K, V> {
    pub fn get<Q: ?Sized + Ord>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.0.get(key)
    }

    pub fn contains_key<Q: ?Sized + Ord>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.0.size()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> {
        self.0.iter()
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> {
        self.0.keys()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.0.values()
    }

    /// Entries whose keys fall in `range`, in order.
    pub fn range<Q, R>(&self, range: R) -> impl DoubleEndedIterator<Item = (&K, &V)>
    where
        K: Borrow<Q>,
        Q: ?Sized + Ord,
        R: RangeBounds<Q>,
    {
        self.0.range(range)
    }
}

impl<K: Ord + Clone, V: Clone> PMap<K, V> {
    /// Inserts or replaces; unlike `BTreeMap::insert` it does not hand back the old value
    /// (that would cost a clone): use [`PMap::replace`] when it is wanted.
    pub fn insert(&mut self, key: K, value: V) {
        self.0.insert_mut(key, value);
    }

    /// Inserts or replaces, returning the value that was there.
    pub fn replace(&mut self, key: K, value: V) -> Option<V> {
        let old = self.0.get(&key).cloned();
        self.0.insert_mut(key, value);
        old
    }

    /// Removes the entry, returning its value (a clone of the shared value).
    pub fn remove<Q: ?Sized + Ord>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let old = self.0.get(key).cloned()?;
        self.0.remove_mut(key);
        Some(old)
    }

    /// Removes the entry without cloning its value; whether there was one.
    pub fn delete<Q: ?Sized + Ord>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.remove_mut(key)
    }

    /// The value to write in place: the path to it is copied first if another clone shares it.
    pub fn get_mut<Q: ?Sized + Ord>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        // rpds copies the path even when the key is absent; look first.
        if !self.0.contains_key(key) {
            return None;
        }
        self.0.get_mut(key)
    }

    /// `entry(key).or_insert_with(make)`.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        if !self.0.contains_key(&key) {
            self.0.insert_mut(key.clone(), make());
        }
        self.0.get_mut(&key).expect("just inserted")
    }

    /// Calls `update`, in key order, on the values `wanted` picks: only those are copied.
    pub fn update_where(&mut self, mut wanted: impl FnMut(&K, &V) -> bool, mut update: impl FnMut(&K, &mut V)) {
        let keys: Vec<K> = self
            .0
            .iter()
            .filter(|(k, v)| wanted(k, v))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(value) = self.0.get_mut(&key) {
                update(&key, value);
            }
        }
    }

    /// Keeps only the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        let gone: Vec<K> = self
            .0
            .iter()
            .filter(|(k, v)| !keep(k, v))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.0.remove_mut(&key);
        }
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for PMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(items: I) -> Self {
        let mut map = PMap::default();
        for (key, value) in items {
            map.insert(key, value);
        }
        map
    }
}

impl<K: Ord, V: PartialEq> PartialEq for PMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.0.ptr_eq(&other.0) || (self.len() == other.len() && self.iter().eq(other.iter()))
    }
}

impl<K: Ord, V: Eq> Eq for PMap<K, V> {}

impl<K: Ord + fmt::Debug, V: fmt::Debug> fmt::Debug for PMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord + Serialize, V: Serialize> Serialize for PMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, K, V> Deserialize<'de> for PMap<K, V>
where
    K: Ord + Clone + Deserialize<'de>,
    V: Clone + Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);

        impl<'de, K, V> Visitor<'de> for MapVisitor<K, V>
        where
            K: Ord + Clone + Deserialize<'de>,
            V: Clone + Deserialize<'de>,
        {
            type Value = PMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = PMap::default();
                while let Some((key, value)) = access.next_entry()? {
                    map.insert(key, value);
                }
                Ok(map)
            }
        }

        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    #[test]
    fn a_clone_keeps_its_view_while_the_original_is_written() {
        let mut table: PMap<u32, u32> = (0..1000).map(|n| (n, n)).collect();
        let view = table.clone();
        table.insert(2000, 2000);
        *table.get_mut(&5).unwrap() = 50;
        assert!(table.delete(&7));
        assert_eq!(view.len(), 1000, "the clone still sees the table as it was");
        assert_eq!(view.get(&5), Some(&5));
        assert_eq!(view.get(&7), Some(&7));
        assert_eq!(table.len(), 1000);
        assert_eq!(table.get(&5), Some(&50));
        assert_eq!(table.get(&7), None);
    }

    #[test]
    fn serialises_exactly_as_the_btreemap_it_replaces() {
        let plain: BTreeMap<(String, String), u64> = [(("b".into(), "x".into()), 2), (("a".into(), "y".into()), 1)]
            .into_iter()
            .collect();
        let table: PMap<(String, String), u64> = plain.clone().into_iter().collect();
        let mut table_bytes = Vec::new();
        ciborium::into_writer(&table, &mut table_bytes).unwrap();
        let mut plain_bytes = Vec::new();
        ciborium::into_writer(&plain, &mut plain_bytes).unwrap();
        assert_eq!(table_bytes, plain_bytes);
        let back: PMap<(String, String), u64> = ciborium::from_reader(plain_bytes.as_slice()).unwrap();
        assert_eq!(back, table);
    }

    #[test]
    fn map_helpers_behave_like_btreemaps() {
        let mut table: PMap<u32, u32> = (0..10).map(|n| (n, n)).collect();
        table.retain(|k, _| k % 2 == 0);
        assert_eq!(table.keys().copied().collect::<Vec<_>>(), [0, 2, 4, 6, 8]);
        table.update_where(|k, _| *k < 8, |_, v| *v += 1);
        assert_eq!(table.values().copied().collect::<Vec<_>>(), [1, 3, 5, 7, 8]);
        *table.get_or_insert_with(3, || 30) += 1;
        assert_eq!(table.get(&3), Some(&31));
        assert_eq!(table.replace(3, 0), Some(31));
        assert_eq!(table.remove(&3), Some(0));
        assert_eq!(table.range(2..=6).map(|(k, _)| *k).collect::<Vec<_>>(), [2, 4, 6]);
        assert_eq!(table.get_mut(&100), None);
    }
}
