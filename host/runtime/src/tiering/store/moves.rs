//! The store's own moves: room reserved in a tier with a capacity by
//! demoting its least recently used chunks, and the background demoter.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::{TieredStore, lock};
use crate::error::KvError;
use crate::tiering::contract::Action;

impl TieredStore {
    /// Reserve `len` bytes in `tier` (which has a capacity), demoting its
    /// least recently used chunks first if they would not fit.
    ///
    /// Each chunk is tried at most once per reservation: one that cannot
    /// be moved (its read or its copy failed) is not picked again, so when
    /// nothing can leave the tier the write is refused at once, with the
    /// reason logged, rather than retried until its deadline. It waits
    /// (until `deadline`, never polling) only while room may still free up
    /// without it: chunks there being moved, writes into it in flight.
    pub(super) fn reserve(&self, tier: usize, len: u64, deadline: Instant) -> Result<(), KvError> {
        let capacity = self.tiers[tier].capacity.expect("a tier with a capacity");
        let mut tried = HashSet::new();
        let mut stuck = 0u64;
        loop {
            let victims = {
                let mut index = lock(&self.index);
                let over = (index.used[tier] + index.reserved[tier] + len).saturating_sub(capacity);
                if over == 0 {
                    index.reserved[tier] += len;
                    return Ok(());
                }
                let victims = index.pick_victims(tier, over, &tried);
                if victims.is_empty() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if !index.in_flight(tier) || left.is_zero() {
                        drop(index);
                        return Err(self.full(tier, len, stuck));
                    }
                    let wait = left.min(Duration::from_millis(20));
                    drop(self.room.wait_timeout(index, wait));
                    continue;
                }
                victims
            };
            tried.extend(victims.iter().map(|(hash, _)| hash.clone()));
            let picked = victims.len() as u64;
            let moved = self.demote(tier, victims, deadline)?;
            stuck += picked.saturating_sub(moved);
        }
    }

    /// The refusal of a write of `len` bytes into `tier`, which is full and
    /// from which `stuck` chunks could not be moved; logged (rate-limited).
    fn full(&self, tier: usize, len: u64, stuck: u64) -> KvError {
        let name = &self.tiers[tier].name;
        let why = if stuck > 0 {
            format!(
                "tier {name:?} of {} is full and none of its chunks could be moved out \
                 ({stuck} tried failed; see the log): a write of {len} bytes is refused",
                self.label
            )
        } else {
            format!(
                "tier {name:?} of {} is full and nothing in it can be demoted: a write of \
                 {len} bytes is refused",
                self.label
            )
        };
        crate::log_limit::warn(("tier full", self.label.as_str()), format_args!("{why}"));
        KvError::Limit(why)
    }

    /// Move `victims` (marked busy) from `tier` one tier down: copy, flush
    /// the target, read each copy back and compare, and only then remove
    /// the source copy. A chunk the next tier already holds is only removed.
    fn demote(
        &self,
        tier: usize,
        victims: Vec<(Vec<u8>, u64)>,
        deadline: Instant,
    ) -> Result<u64, KvError> {
        let result = self.demote_busy(tier, &victims, deadline);
        let mut index = lock(&self.index);
        for (hash, _) in &victims {
            if let Some(e) = index.chunks.get_mut(hash) {
                e.busy = false;
            }
        }
        drop(index);
        self.room.notify_all();
        self.publish_usage();
        result
    }

    pub(super) fn demote_busy(
        &self,
        tier: usize,
        victims: &[(Vec<u8>, u64)],
        deadline: Instant,
    ) -> Result<u64, KvError> {
        let to = tier + 1;
        let mut copied = Vec::new();
        let mut moved = 0;
        for (hash, len) in victims {
            let below = lock(&self.index)
                .chunks
                .get(hash)
                .is_some_and(|e| e.tiers >> to != 0);
            if below {
                // A lower tier keeps a copy: drop this one.
                self.remove_copy(hash, tier)?;
                self.record_move(Action::Evict, hash, *len, tier);
                moved += 1;
                continue;
            }
            let data = match self.tiers[tier].handle.get_chunk(hash) {
                Ok(data) => data,
                Err(KvError::NotFound) => {
                    // Gone from under the index (removed by hand).
                    lock(&self.index).remove(hash, tier);
                    continue;
                }
                Err(e) => {
                    self.skip_victim(hash, tier, &e);
                    continue;
                }
            };
            if self.tiers[to].capacity.is_some() {
                self.reserve(to, *len, deadline)?;
            }
            let put = self.tiers[to].handle.put_chunk(hash, data.as_slice());
            if self.tiers[to].capacity.is_some() {
                let mut index = lock(&self.index);
                index.reserved[to] -= len;
                if put.is_ok() {
                    index.add(hash, *len, to);
                }
            }
            if let Err(e) = put {
                // One chunk the next tier refuses (too large for it, say)
                // must not stop every other move: it stays where it is.
                self.skip_victim(hash, tier, &e);
                continue;
            }
            copied.push((hash, data));
        }
        if copied.is_empty() {
            return Ok(moved);
        }
        if let Err(e) = self.flush_tier(to) {
            // None of the copies is trusted: the sources stay, and the index
            // keeps only copies whose files are there.
            let fs = self.tiers[to].fs.as_ref();
            let mut index = lock(&self.index);
            for (hash, _) in &copied {
                if !fs.is_some_and(|fs| fs.holds(hash)) {
                    index.remove(hash, to);
                }
            }
            return Err(e);
        }
        for (hash, data) in copied {
            if !self.verify(to, hash, data.as_slice())? {
                self.discard_bad_copy(to, hash)?;
                continue;
            }
            lock(&self.index).add(hash, data.len() as u64, to);
            self.remove_copy(hash, tier)?;
            self.record_move(Action::Demote, hash, data.len() as u64, tier);
            self.metrics.demotions.fetch_add(1, Relaxed);
            self.metrics
                .moved_bytes
                .fetch_add(data.len() as u64, Relaxed);
            moved += 1;
        }
        Ok(moved)
    }

    /// A chunk that could not be moved out of `tier`: counted, logged, and
    /// made the most recently used so the next pass picks other victims
    /// first.
    fn skip_victim(&self, hash: &[u8], tier: usize, error: &KvError) {
        self.metrics.move_failures.fetch_add(1, Relaxed);
        crate::log_limit::warn(
            ("tier move failed", self.label.as_str()),
            format_args!(
                "{}: a chunk stays in tier {:?}, moving it failed: {error}",
                self.label, self.tiers[tier].name
            ),
        );
        let mut index = lock(&self.index);
        let now = index.tick();
        if let Some(entry) = index.chunks.get_mut(hash) {
            entry.last_use = now;
        }
    }

    /// Whether tier `tier`'s copy of `hash` reads back as `expected`; a
    /// mismatch is counted and logged (the source is kept).
    pub(super) fn verify(
        &self,
        tier: usize,
        hash: &[u8],
        expected: &[u8],
    ) -> Result<bool, KvError> {
        let same = match self.tiers[tier].handle.get_chunk(hash) {
            Ok(back) => back.as_slice() == expected,
            Err(KvError::NotFound) => false,
            Err(e) => return Err(e),
        };
        if !same {
            self.metrics.verify_failures.fetch_add(1, Relaxed);
            crate::log_limit::warn(
                ("tier verify", self.label.as_str()),
                format_args!(
                    "{}: a chunk copied to tier {:?} read back wrong; the source copy is kept",
                    self.label, self.tiers[tier].name
                ),
            );
        }
        Ok(same)
    }

    /// Remove tier `tier`'s copy of `hash` (never the last tier's).
    pub(super) fn remove_copy(&self, hash: &[u8], tier: usize) -> Result<(), KvError> {
        let fs = self.tiers[tier]
            .fs
            .as_ref()
            .filter(|_| tier != self.last())
            .ok_or_else(|| KvError::Host(format!("tier {tier} keeps its chunks")))?;
        // The tier's instances sync what they were given before a file
        // of theirs goes (an fs instance's flush fails on a chunk it wrote
        // that is gone); a no-op when none holds unsynced puts.
        self.flush_tier(tier)?;
        // The file first, then its room in the index: the room is never
        // handed to another write while the bytes are still there. A reader
        // the index sends here finds it gone and looks in the other tiers.
        fs.delete(hash).map_err(KvError::Io)?;
        lock(&self.index).remove(hash, tier);
        self.removals.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Demote from every tier with a capacity down to its low-water mark
    /// (the background demoter's pass). Returns the chunks moved.
    pub fn demote_to_low_water(&self) -> Result<u64, KvError> {
        let mut moved = 0;
        for tier in 0..self.last() {
            let Some(capacity) = self.tiers[tier].capacity else {
                continue;
            };
            let low = capacity * self.config.low_water_pct / 100;
            // Each chunk once per pass: one that cannot move waits for the next.
            let mut tried = HashSet::new();
            loop {
                let victims = {
                    let mut index = lock(&self.index);
                    let over = index.used[tier].saturating_sub(low);
                    if over == 0 {
                        break;
                    }
                    index.pick_victims(tier, over, &tried)
                };
                if victims.is_empty() {
                    break;
                }
                tried.extend(victims.iter().map(|(hash, _)| hash.clone()));
                let done = self.demote(tier, victims, self.deadline(tier))?;
                if done == 0 {
                    break;
                }
                moved += done;
            }
        }
        if moved > 0 {
            self.write_status();
        }
        Ok(moved)
    }

    /// Run [`Self::demote_to_low_water`] every `demote_interval_ms` while
    /// the store is open; `stopped` disconnects when it closes, so the
    /// thread ends then rather than at its next wake-up.
    pub(super) fn start_demoter(
        self: &Arc<Self>,
        stopped: mpsc::Receiver<()>,
    ) -> Option<std::thread::JoinHandle<()>> {
        let store = Arc::downgrade(self);
        let every = Duration::from_millis(self.config.demote_interval_ms);
        let spawned = std::thread::Builder::new()
            .name("kvwasm-tier-demoter".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let Some(store) = store.upgrade() else { return };
                    if let Err(e) = store.demote_to_low_water() {
                        crate::log_limit::warn(
                            ("tier demoter", store.label.as_str()),
                            format_args!("{}: background demotion failed: {e}", store.label),
                        );
                    }
                }
            });
        spawned
            .inspect_err(|e| {
                tracing::warn!("{}: cannot start the background demoter: {e}", self.label)
            })
            .ok()
    }

    /// A copy in `tier` read back wrong: remove it (where the host can)
    /// so neither a reader nor a later move trusts it.
    pub(super) fn discard_bad_copy(&self, tier: usize, hash: &[u8]) -> Result<(), KvError> {
        lock(&self.index).remove(hash, tier);
        match &self.tiers[tier].fs {
            Some(fs) if tier != self.last() => {
                self.flush_tier(tier)?;
                fs.delete(hash).map_err(KvError::Io)
            }
            _ => Ok(()),
        }
    }
}
