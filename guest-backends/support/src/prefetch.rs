//! What `prefetch-chunks` fetched for the gets that follow, and what it has
//! still to fetch.
//!
//! Values come back in waves (one round trip each) into a cache the gets
//! drain. Two bounds hold it:
//!
//! * all cached bytes: the operator's `prefetch_cache_mib`;
//! * cached bytes in linear memory (short values; long ones are host
//!   payloads): [`IN_GUEST_BYTES`]. A new instance's linear memory has no
//!   resident page, so every page a wave fills costs a page fault: 16 MiB
//!   of 4 KiB values held at once cost a restore 4,600 faults, about a
//!   third of its time. Bounded, the gets free what the next wave reuses.
//!
//! Hashes that did not fit stay *queued*, in the consumer's order. The get
//! of a queued hash fetches the next wave with that hash at its head, so a
//! restore larger than the cache costs a round trip per wave, not per
//! chunk. A new `prefetch-chunks` replaces the queue and evicts cached
//! values it does not name: leftovers of a restore that stopped early
//! cannot crowd out the next.

use std::collections::{HashMap, HashSet, VecDeque};

/// Most bytes of short values (held in linear memory) cached at once. Small
/// on purpose: a new instance faults in every page of linear memory it
/// grows into, and a restore of 4,096 × 4 KiB from Redis took about a
/// quarter less with waves of 1 MiB than of 4 MiB (more round trips, each
/// into memory already faulted in).
pub const IN_GUEST_BYTES: usize = 1 << 20;

/// The most keys one wave asks for.
pub const MAX_WAVE: usize = 4096;

/// The most hashes one `prefetch-chunks` queues; gets of the rest ask the
/// server alone.
pub const MAX_QUEUED: usize = 1 << 16;

/// A cached value: how many bytes, and whether they are in linear memory.
pub trait Cached {
    fn bytes(&self) -> usize;
    fn in_guest(&self) -> bool;
}

pub struct Prefetch<V> {
    cached: HashMap<Vec<u8>, V>,
    cached_bytes: usize,
    in_guest_bytes: usize,
    /// Hashes asked for and not fetched yet, in the order asked.
    queued: Queue,
    /// Since the last `prefetch-chunks`: values cached, their bytes, and
    /// the bytes of those in linear memory. The averages size the waves.
    fetched: u64,
    fetched_bytes: u64,
    fetched_in_guest_bytes: u64,
}

impl<V> Default for Prefetch<V> {
    fn default() -> Self {
        Prefetch {
            cached: HashMap::new(),
            cached_bytes: 0,
            in_guest_bytes: 0,
            queued: Queue::default(),
            fetched: 0,
            fetched_bytes: 0,
            fetched_in_guest_bytes: 0,
        }
    }
}

impl<V: Cached> Prefetch<V> {
    /// A new prefetch of `hashes`, in the order the gets will come: cached
    /// values it does not name are dropped, and the rest of it (duplicates
    /// once, at most [`MAX_QUEUED`]) replaces the queue.
    pub fn start(&mut self, hashes: Vec<Vec<u8>>) {
        let named: HashSet<&[u8]> = hashes.iter().map(Vec::as_slice).collect();
        let (mut bytes, mut in_guest) = (0, 0);
        self.cached.retain(|hash, value| {
            let keep = named.contains(hash.as_slice());
            if keep {
                bytes += value.bytes();
                in_guest += if value.in_guest() { value.bytes() } else { 0 };
            }
            keep
        });
        (self.cached_bytes, self.in_guest_bytes) = (bytes, in_guest);
        let mut queued = Queue::default();
        for hash in hashes {
            if queued.len() == MAX_QUEUED {
                break;
            }
            if !self.cached.contains_key(&hash) {
                queued.push_back(hash);
            }
        }
        self.queued = queued;
        (
            self.fetched,
            self.fetched_bytes,
            self.fetched_in_guest_bytes,
        ) = (0, 0, 0);
    }

    /// Whether `hash` waits for a wave.
    pub fn is_queued(&self, hash: &[u8]) -> bool {
        self.queued.contains(hash)
    }

    /// The hashes of the next round trip: `first` (a get's, if queued; its
    /// value is not cached) and then the queue's front, as many as both
    /// bounds have room for at the average sizes fetched so far
    /// (`first_wave` keys before anything was). Empty when nothing is
    /// queued or the cache has no room. Taken off the queue: give back
    /// with [`Prefetch::requeue`] what was fetched and not cached.
    pub fn next_wave(
        &mut self,
        first: Option<&[u8]>,
        first_wave: usize,
        budget: usize,
    ) -> Vec<Vec<u8>> {
        let mut wave: Vec<Vec<u8>> = first
            .filter(|hash| self.queued.remove(hash))
            .map(<[u8]>::to_vec)
            .into_iter()
            .collect();
        let room = budget.saturating_sub(self.cached_bytes) as u64;
        let room_in_guest = IN_GUEST_BYTES.saturating_sub(self.in_guest_bytes) as u64;
        // Whether a value will be long (a payload, no room in linear
        // memory) is known only once it is in: go by the averages. A wave
        // is never sized to bring what could not be kept.
        let more = match self.fetched_bytes.checked_div(self.fetched) {
            None if room > 0 && room_in_guest > 0 => first_wave as u64,
            None => 0,
            Some(average) => {
                let in_guest = self.fetched_in_guest_bytes / self.fetched;
                let by_guest = room_in_guest.checked_div(in_guest).unwrap_or(u64::MAX);
                (room / average.max(1)).min(by_guest)
            }
        };
        let want = wave.len() + usize::try_from(more).unwrap_or(MAX_WAVE).min(MAX_WAVE);
        while wave.len() < want {
            let Some(hash) = self.queued.pop_front() else {
                break;
            };
            wave.push(hash);
        }
        wave
    }

    /// Keep a fetched value for its get, if both bounds have room for it
    /// (a lone value always fits in linear memory). Given back otherwise.
    pub fn insert(&mut self, hash: Vec<u8>, value: V, budget: usize) -> Result<(), (Vec<u8>, V)> {
        let len = value.bytes();
        let in_guest = if value.in_guest() { len } else { 0 };
        let guest_full = self.in_guest_bytes > 0 && self.in_guest_bytes + in_guest > IN_GUEST_BYTES;
        if self.cached_bytes + len > budget || (in_guest > 0 && guest_full) {
            return Err((hash, value));
        }
        self.cached_bytes += len;
        self.in_guest_bytes += in_guest;
        self.fetched += 1;
        self.fetched_bytes += len as u64;
        self.fetched_in_guest_bytes += in_guest as u64;
        self.cached.insert(hash, value);
        Ok(())
    }

    /// Put hashes a wave fetched but could not cache back at the queue's
    /// front, in their order.
    pub fn requeue(&mut self, hashes: Vec<Vec<u8>>) {
        for hash in hashes.into_iter().rev() {
            self.queued.push_front(hash);
        }
    }

    /// Stop fetching ahead (a wave failed): the gets ask alone.
    pub fn forget_queue(&mut self) {
        self.queued = Queue::default();
    }

    /// The cached value of `hash`, taken out.
    pub fn take(&mut self, hash: &[u8]) -> Option<V> {
        let value = self.cached.remove(hash)?;
        self.cached_bytes -= value.bytes();
        if value.in_guest() {
            self.in_guest_bytes -= value.bytes();
        }
        Some(value)
    }

    /// The cached value of `hash`, left in place.
    pub fn get(&self, hash: &[u8]) -> Option<&V> {
        self.cached.get(hash)
    }
}

/// Hashes in order, with a set to find them: entries taken out of the
/// middle stay in `order` until they reach the front, where they are
/// skipped (the set no longer holds them).
#[derive(Default)]
struct Queue {
    order: VecDeque<Vec<u8>>,
    members: HashSet<Vec<u8>>,
}

impl Queue {
    fn len(&self) -> usize {
        self.members.len()
    }

    fn contains(&self, hash: &[u8]) -> bool {
        self.members.contains(hash)
    }

    fn push_back(&mut self, hash: Vec<u8>) {
        if self.members.insert(hash.clone()) {
            self.order.push_back(hash);
        }
    }

    fn push_front(&mut self, hash: Vec<u8>) {
        if self.members.insert(hash.clone()) {
            self.order.push_front(hash);
        }
    }

    fn pop_front(&mut self) -> Option<Vec<u8>> {
        while let Some(hash) = self.order.pop_front() {
            if self.members.remove(&hash) {
                return Some(hash);
            }
        }
        None
    }

    /// Take `hash` out, wherever it is; `false` if it was not queued.
    fn remove(&mut self, hash: &[u8]) -> bool {
        let removed = self.members.remove(hash);
        // Drop the entries taken out once they are most of `order`.
        if self.order.len() > 2 * self.members.len() + 1024 {
            let members = &self.members;
            self.order.retain(|h| members.contains(h));
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value of `len` bytes, in linear memory or not.
    struct Fake(usize, bool);

    impl Cached for Fake {
        fn bytes(&self) -> usize {
            self.0
        }
        fn in_guest(&self) -> bool {
            self.1
        }
    }

    const MIB: usize = 1 << 20;

    fn hash(i: usize) -> Vec<u8> {
        (i as u64).to_be_bytes().to_vec()
    }

    /// Fetch waves of values of `size` bytes until one is empty or does
    /// not fit, as `prefetch-chunks` does; returns the wave sizes.
    fn fill(p: &mut Prefetch<Fake>, size: usize, in_guest: bool, budget: usize) -> Vec<usize> {
        let mut waves = Vec::new();
        loop {
            let wave = p.next_wave(None, 32, budget);
            if wave.is_empty() {
                return waves;
            }
            waves.push(wave.len());
            let mut uncached = Vec::new();
            for h in wave {
                if !uncached.is_empty() {
                    uncached.push(h);
                } else if let Err((h, _)) = p.insert(h, Fake(size, in_guest), budget) {
                    uncached.push(h);
                }
            }
            if !uncached.is_empty() {
                p.requeue(uncached);
                return waves;
            }
        }
    }

    #[test]
    fn short_values_fill_linear_memory_up_to_its_bound_and_the_rest_waits() {
        let mut p = Prefetch::default();
        p.start((0..4096).map(hash).collect());
        let cap = IN_GUEST_BYTES / 4096;
        // 4 KiB values: 32, then as many as the bound holds; no wasted wave.
        assert_eq!(fill(&mut p, 4096, true, 128 * MIB), vec![32, cap - 32]);
        assert_eq!(p.in_guest_bytes, IN_GUEST_BYTES);
        assert!(p.is_queued(&hash(cap)) && !p.is_queued(&hash(cap - 1)));
        // A get of a queued hash: it heads the wave, which brings as many
        // more as the gets have freed room for.
        assert!(p.next_wave(Some(&hash(3000)), 32, 128 * MIB) == [hash(3000)]);
        assert!(p.take(&hash(0)).is_some());
        assert!(p.take(&hash(5)).is_some());
        assert_eq!(
            p.next_wave(Some(&hash(3001)), 32, 128 * MIB),
            [hash(3001), hash(cap), hash(cap + 1)]
        );
        // Each hash is asked for once.
        assert!(!p.is_queued(&hash(3000)) && !p.is_queued(&hash(cap + 1)));
        // A hash no longer queued heads no wave.
        assert_eq!(
            p.next_wave(Some(&hash(3000)), 32, 128 * MIB),
            [hash(cap + 2), hash(cap + 3)]
        );
    }

    #[test]
    fn long_values_are_bounded_by_the_cache_alone() {
        let mut p = Prefetch::default();
        p.start((0..200).map(hash).collect());
        // 1 MiB payloads: 32, then as many as the 128 MiB cache holds.
        assert_eq!(fill(&mut p, MIB, false, 128 * MIB), vec![32, 96]);
        assert_eq!((p.cached_bytes, p.in_guest_bytes), (128 * MIB, 0));
        assert_eq!(p.queued.len(), 72);
        assert!(p.next_wave(None, 32, 128 * MIB).is_empty(), "full");
        assert!(p.take(&hash(127)).is_some());
        assert_eq!(p.next_wave(None, 32, 128 * MIB), vec![hash(128)]);
    }

    #[test]
    fn a_value_that_does_not_fit_goes_back_to_the_front_in_order() {
        let mut p = Prefetch::default();
        p.start((0..10).map(hash).collect());
        let wave = p.next_wave(None, 4, 10 * MIB);
        assert_eq!(wave.len(), 4);
        for h in wave.iter().take(2) {
            assert!(p.insert(h.clone(), Fake(3 * MIB, false), 10 * MIB).is_ok());
        }
        // The third would exceed the 10 MiB cache.
        assert!(p.insert(hash(2), Fake(5 * MIB, false), 10 * MIB).is_err());
        p.requeue(vec![hash(2), hash(3)]);
        assert_eq!(p.queued.order.front(), Some(&hash(2)));
        assert_eq!(p.queued.len(), 8);
        // 4 MiB of room left, 3 MiB a value so far: one more.
        assert_eq!(p.next_wave(None, 4, 10 * MIB), [hash(2)]);
    }

    #[test]
    fn a_new_prefetch_replaces_the_queue_and_evicts_what_it_does_not_name() {
        let mut p = Prefetch::default();
        p.start((0..3000).map(hash).collect());
        fill(&mut p, 4096, true, 128 * MIB);
        // The consumer read 10 and moved on to another restore, which
        // names two of the cached values again.
        for i in 0..10 {
            assert!(p.take(&hash(i)).is_some());
        }
        p.start(vec![hash(20), hash(5000), hash(21), hash(5000)]);
        assert!(p.get(&hash(20)).is_some() && p.get(&hash(22)).is_none());
        assert_eq!((p.cached_bytes, p.in_guest_bytes), (2 * 4096, 2 * 4096));
        assert_eq!(p.queued.len(), 1);
        assert!(p.is_queued(&hash(5000)) && !p.is_queued(&hash(1500)));
        // Sized afresh: the first wave of this prefetch.
        assert_eq!(p.next_wave(None, 32, 128 * MIB), [hash(5000)]);
    }

    #[test]
    fn the_queue_is_bounded_and_hashes_taken_from_its_middle_are_not_fetched_twice() {
        let mut p: Prefetch<Fake> = Prefetch::default();
        p.start((0..MAX_QUEUED + 10).map(hash).collect());
        assert_eq!(p.queued.len(), MAX_QUEUED);
        assert!(
            p.is_queued(&hash(0)) && !p.is_queued(&hash(MAX_QUEUED)),
            "the first kept"
        );
        // Taken from the middle, then given back at the front: fetched once.
        let wave = p.next_wave(Some(&hash(500)), 2, 128 * MIB);
        assert_eq!(wave, [hash(500), hash(0), hash(1)]);
        p.requeue(wave);
        let mut seen = HashSet::new();
        loop {
            let wave = p.next_wave(None, MAX_WAVE, usize::MAX);
            if wave.is_empty() {
                break;
            }
            assert!(
                wave.into_iter().all(|h| seen.insert(h)),
                "a hash fetched twice"
            );
        }
        assert_eq!(seen.len(), MAX_QUEUED);
        // Stale entries do not pile up.
        assert!(p.queued.order.is_empty());
        p.start(vec![hash(1), hash(2)]);
        p.forget_queue();
        assert!(!p.is_queued(&hash(1)) && p.next_wave(Some(&hash(2)), 32, MIB).is_empty());
    }

    #[test]
    fn a_lone_short_value_always_fits_linear_memory() {
        let mut p = Prefetch::default();
        assert!(p.insert(hash(0), Fake(6 * MIB, true), 128 * MIB).is_ok());
        assert!(p.insert(hash(1), Fake(1, true), 128 * MIB).is_err());
        // Long values do not count against linear memory.
        assert!(p.insert(hash(2), Fake(MIB, false), 128 * MIB).is_ok());
        assert_eq!(p.get(&hash(0)).map(Fake::bytes), Some(6 * MIB));
        assert!(p.take(&hash(0)).is_some());
        assert_eq!(p.in_guest_bytes, 0);
        assert!(p.insert(hash(1), Fake(1, true), 128 * MIB).is_ok());
    }
}
