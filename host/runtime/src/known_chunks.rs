//! `known-chunks`: which chunks a backend's server acknowledged holding,
//! remembered by the host across the backend's instances.
//!
//! A remote backend (Redis, S3) answers `put-chunk` exactly by asking its
//! server about every hash it has not seen: one round trip per chunk. Its
//! instance remembers the answers, but idle release drops the instance
//! after `idle_release_ms`, so the first save after a pause asked again
//! for every chunk. The record lives here instead, one per [`Backend`]
//! (so never shared by two backends, nor by two config files naming the
//! same one) and, inside it, one per namespace: an instance reaches only
//! the namespace it opened ([`crate::state::HostState`] holds both), and
//! the WIT calls take no namespace.
//!
//! The host checks nothing against the server: an entry is what an
//! instance of this backend said. A hostile guest gains nothing from that:
//! only its own later instances, on the same namespace, read what it wrote
//! (it could keep the same bits in its own server), within a bound it
//! cannot raise, and it can evict only its own backend's entries.
//!
//! [`Backend`]: crate::Backend

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Hashes one `remember` or `forget` call may list: a call does bounded
/// work (the guest's deadline is not checked while the host runs).
pub(crate) const MAX_PER_CALL: usize = 4096;
/// Longest hash (the kv_store ABI allows 1 to 64 bytes).
const MAX_HASH_LEN: usize = 64;
/// Bytes counted for an entry beyond its hash: its slot in the table (a
/// boxed slice), control byte and spare capacity, and the allocator's
/// header and rounding.
const ENTRY_OVERHEAD: usize = 48;
/// Bytes counted for a namespace's record beyond its name and entries.
const RECORD_OVERHEAD: usize = 128;
/// Default bound of one backend's records, all namespaces together: about
/// 400,000 hashes of 32 bytes (400 GiB of 1 MiB chunks). Each entry
/// counts at least 49 bytes, so this also bounds entries (under 700,000).
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// One backend's records, by namespace.
#[derive(Debug)]
pub struct KnownChunks {
    max_bytes: usize,
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    by_namespace: HashMap<Arc<str>, HashSet<Box<[u8]>>>,
    /// Counted as above: the hashes, their overheads, the records'.
    bytes: usize,
}

impl Default for KnownChunks {
    fn default() -> KnownChunks {
        KnownChunks::with_max_bytes(DEFAULT_MAX_BYTES)
    }
}

impl KnownChunks {
    /// Records that forget everything when they would count more than
    /// `max_bytes` (0: remember nothing).
    pub fn with_max_bytes(max_bytes: usize) -> KnownChunks {
        KnownChunks {
            max_bytes,
            records: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an instance on `namespace` remembered `hash`.
    pub fn contains(&self, namespace: &str, hash: &[u8]) -> bool {
        self.lock()
            .by_namespace
            .get(namespace)
            .is_some_and(|record| record.contains(hash))
    }

    /// Remember `hashes` for `namespace`; none of them if there are more
    /// than [`MAX_PER_CALL`] or one is empty or longer than 64 bytes.
    /// Forgets every namespace's entries first if they would not fit.
    pub fn remember(&self, namespace: &Arc<str>, hashes: &[Vec<u8>]) {
        if hashes.is_empty()
            || hashes.len() > MAX_PER_CALL
            || hashes
                .iter()
                .any(|h| h.is_empty() || h.len() > MAX_HASH_LEN)
        {
            return;
        }
        let record_cost = RECORD_OVERHEAD + namespace.len();
        let most = record_cost
            + hashes
                .iter()
                .map(|h| h.len() + ENTRY_OVERHEAD)
                .sum::<usize>();
        if most > self.max_bytes {
            return;
        }
        let mut records = self.lock();
        if records.bytes + most > self.max_bytes {
            records.by_namespace.clear();
            records.bytes = 0;
        }
        let Records {
            by_namespace,
            bytes,
        } = &mut *records;
        let record = by_namespace.entry(namespace.clone()).or_insert_with(|| {
            *bytes += record_cost;
            HashSet::new()
        });
        for hash in hashes {
            if !record.contains(hash.as_slice()) {
                *bytes += hash.len() + ENTRY_OVERHEAD;
                record.insert(hash.as_slice().into());
            }
        }
    }

    /// Forget `hashes` for `namespace` (none if more than
    /// [`MAX_PER_CALL`]).
    pub fn forget(&self, namespace: &str, hashes: &[Vec<u8>]) {
        if hashes.len() > MAX_PER_CALL {
            return;
        }
        let mut records = self.lock();
        let Records {
            by_namespace,
            bytes,
        } = &mut *records;
        let Some(record) = by_namespace.get_mut(namespace) else {
            return;
        };
        for hash in hashes {
            if record.remove(hash.as_slice()) {
                *bytes -= hash.len() + ENTRY_OVERHEAD;
            }
        }
        if record.is_empty() {
            by_namespace.remove(namespace);
            *bytes -= RECORD_OVERHEAD + namespace.len();
        } else if record.capacity() > 4 * record.len().max(64) {
            // A set keeps its table when entries go: without this, filling
            // a record and forgetting most of it would hold memory the
            // bound no longer counts.
            record.shrink_to_fit();
        }
    }

    /// Forget everything remembered for `namespace`.
    pub fn forget_all(&self, namespace: &str) {
        let mut records = self.lock();
        if let Some(record) = records.by_namespace.remove(namespace) {
            let freed = RECORD_OVERHEAD
                + namespace.len()
                + record
                    .iter()
                    .map(|h| h.len() + ENTRY_OVERHEAD)
                    .sum::<usize>();
            records.bytes -= freed;
        }
    }

    /// Bytes counted against the bound now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Hashes remembered now, over all namespaces.
    pub fn entries(&self) -> usize {
        self.lock().by_namespace.values().map(HashSet::len).sum()
    }
}

/// The `known-chunks` interface on an instance's state.
mod host;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ns(name: &str) -> Arc<str> {
        name.into()
    }

    #[test]
    fn remembers_forgets_and_counts_what_it_holds() {
        let known = KnownChunks::default();
        let a = ns("team/a");
        known.remember(&a, &[vec![1; 32], vec![2; 32], vec![1; 32]]);
        assert!(known.contains("team/a", &[1; 32]));
        assert!(!known.contains("team/a", &[3; 32]));
        assert_eq!(known.entries(), 2);
        assert_eq!(
            known.bytes(),
            RECORD_OVERHEAD + 6 + 2 * (32 + ENTRY_OVERHEAD)
        );
        known.forget("team/a", &[vec![1; 32]]);
        assert!(!known.contains("team/a", &[1; 32]));
        known.forget_all("team/a");
        assert_eq!((known.entries(), known.bytes()), (0, 0));
        known.remember(&a, &[vec![4; 8]]);
        known.forget("team/a", &[vec![4; 8]]);
        assert_eq!(known.bytes(), 0, "an emptied record is dropped");
    }

    #[test]
    fn forgetting_most_of_a_record_gives_its_table_back() {
        let known = KnownChunks::default();
        let a = ns("a");
        let hashes: Vec<Vec<u8>> = (0..MAX_PER_CALL as u32)
            .map(|i| i.to_le_bytes().to_vec())
            .collect();
        known.remember(&a, &hashes);
        known.forget("a", &hashes[1..]);
        let records = known.lock();
        let record = &records.by_namespace["a"];
        assert_eq!(record.len(), 1);
        assert!(
            record.capacity() <= 4 * 64,
            "{} slots kept for one entry",
            record.capacity()
        );
    }

    #[test]
    fn a_call_over_its_limits_remembers_nothing() {
        let known = KnownChunks::default();
        let a = ns("");
        known.remember(&a, &[vec![1; 8], vec![2; 65]]);
        known.remember(&a, &[vec![1; 8], Vec::new()]);
        known.remember(&a, &vec![vec![1; 8]; MAX_PER_CALL + 1]);
        assert_eq!(known.entries(), 0);
        known.remember(&a, &vec![vec![1; 8]; MAX_PER_CALL]);
        assert_eq!(known.entries(), 1);
    }

    #[test]
    fn when_full_it_forgets_every_namespace_and_never_grows_past_its_bound() {
        let per_entry = 32 + ENTRY_OVERHEAD;
        let max = 2 * RECORD_OVERHEAD + 4 + 10 * per_entry;
        let known = KnownChunks::with_max_bytes(max);
        let (a, b) = (ns("a"), ns("b"));
        known.remember(&a, &(0..5u8).map(|i| vec![i; 32]).collect::<Vec<_>>());
        known.remember(&b, &(0..5u8).map(|i| vec![i; 32]).collect::<Vec<_>>());
        assert_eq!(known.entries(), 10);
        known.remember(&b, &[vec![9; 32]]);
        assert!(known.bytes() <= max);
        assert!(!known.contains("a", &[0; 32]), "forgotten when full");
        assert!(known.contains("b", &[9; 32]));
        assert_eq!(known.entries(), 1);
        // A call that alone would not fit leaves everything as it was.
        let huge: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 32]).collect();
        known.remember(&a, &huge);
        assert!(known.contains("b", &[9; 32]));
        let none = KnownChunks::with_max_bytes(0);
        none.remember(&a, &[vec![1; 8]]);
        assert_eq!(none.entries(), 0);
    }

    proptest! {
        /// Namespaces never share entries, whatever the two strings share,
        /// and forgetting in one leaves the other's: the record is keyed by
        /// the exact namespace an instance opened.
        #[test]
        fn namespaces_never_see_each_others_entries(
            first in "[a-zA-Z/._-]{0,12}",
            second in "[a-zA-Z/._-]{0,12}",
            hashes in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..=64), 1..32),
            forget_all in any::<bool>(),
        ) {
            prop_assume!(first != second);
            let known = KnownChunks::default();
            let (one, other) = (ns(&first), ns(&second));
            known.remember(&one, &hashes);
            for hash in &hashes {
                prop_assert!(known.contains(&first, hash));
                prop_assert!(!known.contains(&second, hash));
            }
            known.remember(&other, &hashes[..1]);
            if forget_all {
                known.forget_all(&second);
            } else {
                known.forget(&second, &hashes);
            }
            for hash in &hashes {
                prop_assert!(known.contains(&first, hash));
                prop_assert!(!known.contains(&second, hash));
            }
        }

        /// Whatever a guest sends, what is counted never passes the bound,
        /// and the count is exactly what is held.
        #[test]
        fn the_bound_holds_for_any_calls(
            calls in proptest::collection::vec(
                (0u8..3, proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..=70), 0..40), 0u8..3),
                1..40,
            ),
        ) {
            let max = 4096;
            let known = KnownChunks::with_max_bytes(max);
            let names = [ns("x"), ns("y/z"), ns("")];
            for (namespace, hashes, op) in &calls {
                let namespace = &names[usize::from(*namespace)];
                match op {
                    0 | 1 => known.remember(namespace, hashes),
                    _ => known.forget(namespace, hashes),
                }
                prop_assert!(known.bytes() <= max);
                let records = known.lock();
                let counted: usize = records
                    .by_namespace
                    .iter()
                    .map(|(n, r)| {
                        RECORD_OVERHEAD + n.len() + r.iter().map(|h| h.len() + ENTRY_OVERHEAD).sum::<usize>()
                    })
                    .sum();
                prop_assert_eq!(counted, records.bytes);
            }
        }
    }
}
