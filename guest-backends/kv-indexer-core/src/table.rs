//! A hash table from block hashes to node ids: open addressing, linear
//! probing, backward-shift deletion, at most half full. The tree's hot
//! path is these lookups (a worker's engine-hash table, a node's children).
//! std's `HashMap` (hashbrown) scans groups of control bytes, 16 at a time
//! with SSE2 natively but 4 at a time with scalar bit tricks on wasm32,
//! where it made a third of the guest's ingest; here a probe is one key
//! compare, cheap on both.
//! The price is memory: 16 bytes a slot, so 32–64 bytes an entry where
//! hashbrown takes about 18–36.
//!
//! In a guest, every function entry and loop iteration also checks the
//! call's deadline (wasmtime's epoch check: ~17% of the indexer guest's
//! ingest time, docs/benchmarks.md). So the home slot, where most probes
//! end, is probed before any loop, and the wasm build inlines the lookups
//! (the native build keeps the compiler's choice).

use std::hash::BuildHasher;

use crate::fold::Fold;

/// A free slot's value (no node has this id: it is the tree's `DETACHED`).
const EMPTY: u32 = u32::MAX;

#[derive(Default)]
pub(crate) struct Table {
    /// (key, value); a power of two long, or empty.
    slots: Vec<(u64, u32)>,
    len: usize,
    hasher: Fold,
}

impl Table {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg_attr(target_family = "wasm", inline(always))]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        // The home slot outside the loop (module doc).
        let (k, v) = self.slots[i];
        if v == EMPTY {
            return None;
        }
        if k == key {
            return Some(v);
        }
        loop {
            i = (i + 1) & mask;
            let (k, v) = self.slots[i];
            if v == EMPTY {
                return None;
            }
            if k == key {
                return Some(v);
            }
        }
    }

    /// Set `key` to `value` (never `u32::MAX`); the previous value.
    #[cfg_attr(target_family = "wasm", inline(always))]
    pub(crate) fn insert(&mut self, key: u64, value: u32) -> Option<u32> {
        debug_assert_ne!(value, EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        // The home slot outside the loop (module doc).
        if self.slots[i].1 != EMPTY {
            if self.slots[i].0 == key {
                return Some(std::mem::replace(&mut self.slots[i].1, value));
            }
            loop {
                i = (i + 1) & mask;
                if self.slots[i].1 == EMPTY {
                    break;
                }
                if self.slots[i].0 == key {
                    return Some(std::mem::replace(&mut self.slots[i].1, value));
                }
            }
        }
        self.slots[i] = (key, value);
        self.len += 1;
        None
    }

    #[cfg_attr(target_family = "wasm", inline(always))]
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut hole = self.home(key);
        // The home slot outside the loop (module doc).
        if self.slots[hole].1 == EMPTY {
            return None;
        }
        while self.slots[hole].0 != key {
            hole = (hole + 1) & mask;
            if self.slots[hole].1 == EMPTY {
                return None;
            }
        }
        let removed = self.slots[hole].1;
        // Pull back every later entry of the run that may sit in the hole
        // (its home is not between the hole and itself), so no lookup
        // stops early at the freed slot.
        let mut j = (hole + 1) & mask;
        while self.slots[j].1 != EMPTY {
            let home = self.home(self.slots[j].0);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole].1 = EMPTY;
        self.len -= 1;
        Some(removed)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Every (key, value).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots.iter().copied().filter(|s| s.1 != EMPTY)
    }

    fn home(&self, key: u64) -> usize {
        self.hasher.hash_one(key) as usize & (self.slots.len() - 1)
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(4);
        let old = std::mem::replace(&mut self.slots, vec![(0, EMPTY); size]);
        self.len = 0;
        for (k, v) in old {
            if v != EMPTY {
                self.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Table;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Any sequence of inserts and removals (few distinct keys, so
        /// runs collide and wrap) leaves the table equal to a `HashMap`.
        #[test]
        fn behaves_like_a_hash_map(ops in prop::collection::vec((any::<bool>(), 0u64..64, 0u32..1000), 0..400)) {
            let (mut table, mut model) = (Table::default(), HashMap::new());
            for (insert, key, value) in ops {
                if insert {
                    prop_assert_eq!(table.insert(key, value), model.insert(key, value));
                } else {
                    prop_assert_eq!(table.remove(key), model.remove(&key));
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for key in 0..64 {
                prop_assert_eq!(table.get(key), model.get(&key).copied());
            }
            let mut values: Vec<u32> = table.values().collect();
            let mut expected: Vec<u32> = model.values().copied().collect();
            values.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(values, expected);
            let mut entries: Vec<(u64, u32)> = table.iter().collect();
            let mut expected: Vec<(u64, u32)> = model.into_iter().collect();
            entries.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(entries, expected);
        }
    }
}
