//! Which chunk is in which tier: the tiered store's index and its LRU
//! clock, and the puts each tier has not flushed yet.

use std::collections::{HashMap, HashSet, VecDeque};

/// Chunks moved per batch (one flush of the target per batch).
const BATCH: usize = 32;

/// Chunks put into a tier and not yet covered by a good flush, numbered in
/// the order they were put (flushes may run concurrently).
#[derive(Debug, Default)]
pub(super) struct Unflushed {
    /// Puts numbered so far.
    pub(super) puts: u64,
    hashes: VecDeque<(u64, Vec<u8>)>,
}

impl Unflushed {
    pub(super) fn push(&mut self, hash: &[u8]) {
        self.puts += 1;
        self.hashes.push_back((self.puts, hash.to_vec()));
    }

    /// Take the puts numbered up to `covered` (what a flush begun then
    /// covered; a concurrent flush may have taken some already).
    pub(super) fn take_through(&mut self, covered: u64) -> Vec<Vec<u8>> {
        let mut taken = Vec::new();
        while self.hashes.front().is_some_and(|(n, _)| *n <= covered) {
            taken.extend(self.hashes.pop_front().map(|(_, h)| h));
        }
        taken
    }
}

/// Where one chunk is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) len: u64,
    /// Bit `i`: tier `i` holds a whole copy.
    pub(super) tiers: u8,
    /// The index clock at the last put or read (LRU order).
    pub(super) last_use: u64,
    /// Being moved: no other move may take it.
    pub(super) busy: bool,
}

#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) chunks: HashMap<Vec<u8>, Entry>,
    pub(super) used: Vec<u64>,
    pub(super) count: Vec<u64>,
    /// Bytes promised to writes in flight, per tier.
    pub(super) reserved: Vec<u64>,
    clock: u64,
}

impl Index {
    /// An empty index over `tiers` tiers.
    pub(super) fn new(tiers: usize) -> Self {
        Index {
            used: vec![0; tiers],
            count: vec![0; tiers],
            reserved: vec![0; tiers],
            ..Index::default()
        }
    }

    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Tier `tier` holds `hash` (`len` bytes).
    pub(super) fn add(&mut self, hash: &[u8], len: u64, tier: usize) {
        let now = self.tick();
        let entry = self.chunks.entry(hash.to_vec()).or_insert(Entry {
            len,
            tiers: 0,
            last_use: now,
            busy: false,
        });
        if entry.tiers & (1 << tier) == 0 {
            entry.tiers |= 1 << tier;
            self.used[tier] += len;
            self.count[tier] += 1;
        }
    }

    /// Tier `tier` no longer holds `hash`.
    pub(super) fn remove(&mut self, hash: &[u8], tier: usize) {
        let Some(entry) = self.chunks.get_mut(hash) else {
            return;
        };
        if entry.tiers & (1 << tier) != 0 {
            entry.tiers &= !(1 << tier);
            self.used[tier] -= entry.len;
            self.count[tier] -= 1;
        }
        if entry.tiers == 0 {
            self.chunks.remove(hash);
        }
    }

    /// The least recently used idle chunks of `tier` not in `tried`,
    /// adding up to at least `bytes` (at most [`BATCH`]), marked busy.
    pub(super) fn pick_victims(
        &mut self,
        tier: usize,
        bytes: u64,
        tried: &HashSet<Vec<u8>>,
    ) -> Vec<(Vec<u8>, u64)> {
        let mut idle: Vec<(u64, &Vec<u8>)> = self
            .chunks
            .iter()
            .filter(|(h, e)| e.tiers & (1 << tier) != 0 && !e.busy && !tried.contains(*h))
            .map(|(h, e)| (e.last_use, h))
            .collect();
        idle.sort_unstable();
        let mut picked = Vec::new();
        let mut sum = 0;
        for (_, hash) in idle {
            if sum >= bytes || picked.len() >= BATCH {
                break;
            }
            let len = self.chunks[hash].len;
            picked.push((hash.clone(), len));
            sum += len;
        }
        for (hash, _) in &picked {
            if let Some(e) = self.chunks.get_mut(hash) {
                e.busy = true;
            }
        }
        picked
    }

    /// Whether room in `tier` may still free up without this thread: a
    /// chunk there is being moved, or a write into it is in flight (and
    /// its chunk will be a victim no one has tried yet).
    pub(super) fn in_flight(&self, tier: usize) -> bool {
        self.reserved[tier] > 0
            || self
                .chunks
                .values()
                .any(|e| e.busy && e.tiers & (1 << tier) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(n: u8) -> Vec<u8> {
        vec![n; 8]
    }

    #[test]
    fn a_chunk_is_counted_once_per_tier_and_forgotten_with_its_last_copy() {
        let mut index = Index::new(2);
        index.add(&hash(1), 100, 0);
        index.add(&hash(1), 100, 0);
        index.add(&hash(1), 100, 1);
        assert_eq!(
            (index.used.clone(), index.count.clone()),
            (vec![100, 100], vec![1, 1])
        );
        index.remove(&hash(1), 0);
        index.remove(&hash(1), 0);
        assert_eq!(
            (index.used.clone(), index.count.clone()),
            (vec![0, 100], vec![0, 1])
        );
        assert_eq!(index.chunks[&hash(1)].tiers, 0b10);
        index.remove(&hash(1), 1);
        assert!(index.chunks.is_empty());
        assert_eq!(index.used, vec![0, 0]);
        // Removing what is not there changes nothing.
        index.remove(&hash(9), 1);
        assert_eq!(index.count, vec![0, 0]);
    }

    #[test]
    fn victims_are_the_least_recently_used_idle_untried_chunks_covering_the_bytes() {
        let mut index = Index::new(2);
        for n in 1..=5 {
            index.add(&hash(n), 10, 0);
        }
        index.add(&hash(6), 10, 1);
        // A use makes chunk 1 the most recent.
        let now = index.tick();
        index.chunks.get_mut(&hash(1)).unwrap().last_use = now;
        let tried = HashSet::from([hash(2)]);
        let picked = index.pick_victims(0, 15, &tried);
        assert_eq!(picked, vec![(hash(3), 10), (hash(4), 10)]);
        assert!(picked.iter().all(|(h, _)| index.chunks[h].busy));
        // Busy chunks are not picked again; the tier now has a move in flight.
        assert!(index.in_flight(0));
        assert!(!index.in_flight(1));
        let next = index.pick_victims(0, 1_000, &tried);
        assert_eq!(next, vec![(hash(5), 10), (hash(1), 10)]);
        assert!(index.pick_victims(0, 1, &tried).is_empty());
    }

    #[test]
    fn a_pick_stops_at_one_batch() {
        let mut index = Index::new(1);
        for n in 0..(BATCH as u8 + 8) {
            index.add(&hash(n), 1, 0);
        }
        assert_eq!(
            index.pick_victims(0, u64::MAX, &HashSet::new()).len(),
            BATCH
        );
    }

    #[test]
    fn reserved_room_counts_as_a_write_in_flight() {
        let mut index = Index::new(2);
        assert!(!index.in_flight(0));
        index.reserved[0] = 4096;
        assert!(index.in_flight(0));
    }

    #[test]
    fn a_flush_takes_only_the_puts_it_covered() {
        let mut unflushed = Unflushed::default();
        unflushed.push(&hash(1));
        unflushed.push(&hash(2));
        let covered = unflushed.puts;
        unflushed.push(&hash(3));
        assert_eq!(unflushed.take_through(covered), vec![hash(1), hash(2)]);
        // A second flush that began at the same point takes nothing more.
        assert!(unflushed.take_through(covered).is_empty());
        assert_eq!(unflushed.take_through(unflushed.puts), vec![hash(3)]);
    }
}
