//! Copy-on-write tables: cloning the state store costs a reference count per table.
//!
//! A snapshot (or any reader that wants a consistent view without holding the driver's lock)
//! clones the [`super::ServerState`] and encodes the clone at leisure. An apply that runs
//! meanwhile copies only the tables it writes, once ([`alloc::sync::Arc::make_mut`]); with no
//! clone alive, a write mutates in place as before.

use alloc::sync::Arc;
use core::fmt;
use core::ops::{Deref, DerefMut};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value shared between clones of the state until one of them writes to it. Serialises as
/// the value itself, so the state format does not change.
#[derive(Default)]
pub struct Shared<T>(Arc<T>);

impl<T> Shared<T> {
    pub fn new(value: T) -> Self {
        Shared(Arc::new(value))
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    /// Copies the value first when a clone of the state still holds it.
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Shared::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;

    #[test]
    fn a_clone_keeps_its_view_while_the_original_is_written() {
        let mut table: Shared<BTreeMap<u32, u32>> = Shared::default();
        table.insert(1, 1);
        let view = table.clone();
        table.insert(2, 2);
        assert_eq!(view.len(), 1, "the clone still sees the table as it was");
        assert_eq!(table.len(), 2);
        let before = Arc::as_ptr(&table.0);
        table.insert(3, 3);
        assert_eq!(Arc::as_ptr(&table.0), before, "unshared again: written in place");
    }
}
