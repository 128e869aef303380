//! Advice from the storage advisor: each advised move validated (known,
//! in the named tier, not the last copy, room in the target, under the
//! rate limit), then applied with the same copy-verify-remove order as the
//! store's own moves.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::{TieredStore, lock};
use crate::error::KvError;
use crate::tiering::advisor::AdvisedStore;
use crate::tiering::contract::{Access, Action, Advice, AdviceReport, AdviceSink, TierUsage};

/// Distinct refusal reasons reported per batch of advice.
const MAX_REASONS: usize = 8;
/// Hashes looked at per batch of advice; the rest are refused.
pub const MAX_ADVISED_HASHES: usize = 4096;

/// An advised move admitted by [`TieredStore::claim`]: the chunk's length,
/// and the tier where room was reserved for it, if any.
#[derive(Debug, Clone, Copy)]
struct Claim {
    len: u64,
    reserved: Option<usize>,
}

/// Moves per second the advisor may cause.
#[derive(Debug)]
pub(super) struct Rate {
    pub(super) window: Instant,
    pub(super) chunks: u64,
    pub(super) bytes: u64,
}

impl TieredStore {
    /// Under the advice rate limit, count one more move of `len` bytes.
    fn admit_move(&self, len: u64) -> bool {
        let mut rate = lock(&self.rate);
        if rate.window.elapsed() >= Duration::from_secs(1) {
            *rate = Rate {
                window: Instant::now(),
                chunks: 0,
                bytes: 0,
            };
        }
        let first = rate.chunks == 0;
        if rate.chunks + 1 > self.config.max_moves_per_sec
            || (!first && rate.bytes + len > self.config.max_move_bytes_per_sec)
        {
            return false;
        }
        rate.chunks += 1;
        rate.bytes += len;
        true
    }

    /// Validate one advised chunk move and mark it busy: `Ok(len)`, or why
    /// it is refused.
    fn claim(&self, action: Action, tier: usize, hash: &[u8]) -> Result<Claim, &'static str> {
        let mut index = lock(&self.index);
        let last = self.last();
        let target = match action {
            Action::Promote if tier == 0 => return Err("promote from tier 0"),
            Action::Promote => Some(tier - 1),
            Action::Demote if tier == last => return Err("demote from the last tier"),
            Action::Demote => Some(tier + 1),
            Action::Evict if tier == last => return Err("evict from the last tier"),
            Action::Evict => None,
        };
        let entry = *index.chunks.get(hash).ok_or("unknown hash")?;
        if entry.tiers & (1 << tier) == 0 {
            return Err("chunk not in that tier");
        }
        if entry.busy {
            return Err("chunk already being moved");
        }
        match (action, target) {
            (Action::Evict, _) if entry.tiers & !(1 << tier) == 0 => {
                return Err("evicting the last copy");
            }
            (Action::Promote, Some(to)) if entry.tiers & (1 << to) != 0 => {
                return Err("already in the target tier");
            }
            _ => {}
        }
        let mut reserved = None;
        if let Some(to) = target
            && let Some(capacity) = self.tiers[to].capacity
            && entry.tiers & (1 << to) == 0
        {
            if index.used[to] + index.reserved[to] + entry.len > capacity {
                return Err("target tier full");
            }
            index.reserved[to] += entry.len;
            reserved = Some(to);
        }
        if !self.admit_move(entry.len) {
            if let Some(to) = reserved {
                index.reserved[to] -= entry.len;
            }
            return Err("over the move rate limit");
        }
        if let Some(e) = index.chunks.get_mut(hash) {
            e.busy = true;
        }
        Ok(Claim {
            len: entry.len,
            reserved,
        })
    }

    /// Apply one claimed move (see [`Self::claim`]).
    fn apply_one(
        &self,
        action: Action,
        tier: usize,
        hash: &[u8],
        claim: Claim,
    ) -> Result<(), KvError> {
        // Give back exactly what the claim reserved (nothing when the
        // target tier already held a copy).
        let release = || {
            if let Some(to) = claim.reserved {
                lock(&self.index).reserved[to] -= claim.len;
            }
        };
        let result = match action {
            Action::Evict => self.evict(tier, hash),
            Action::Demote => {
                release();
                let deadline = self.deadline(tier);
                self.demote_busy(tier, &[(hash.to_vec(), claim.len)], deadline)
                    .map(drop)
            }
            Action::Promote => {
                let result = self.copy_up(tier, hash);
                release();
                result
            }
        };
        if let Some(e) = lock(&self.index).chunks.get_mut(hash) {
            e.busy = false;
        }
        self.room.notify_all();
        result
    }

    /// Copy `hash` from `tier` to `tier - 1` (room already reserved) and
    /// verify it; the lower copy stays.
    fn copy_up(&self, tier: usize, hash: &[u8]) -> Result<(), KvError> {
        let to = tier - 1;
        let data = self.tiers[tier].handle.get_chunk(hash)?;
        self.tiers[to].handle.put_chunk(hash, data.as_slice())?;
        self.flush_tier(to)?;
        if self.verify(to, hash, data.as_slice())? {
            lock(&self.index).add(hash, data.len() as u64, to);
            self.record_move(Action::Promote, hash, data.len() as u64, tier);
            self.metrics.promotions.fetch_add(1, Relaxed);
            self.metrics
                .moved_bytes
                .fetch_add(data.len() as u64, Relaxed);
        } else {
            self.discard_bad_copy(to, hash)?;
        }
        Ok(())
    }

    /// Remove `tier`'s copy of `hash` once another tier's copy reads back
    /// whole.
    fn evict(&self, tier: usize, hash: &[u8]) -> Result<(), KvError> {
        let (others, len) = {
            let index = lock(&self.index);
            let e = index.chunks.get(hash).ok_or(KvError::NotFound)?;
            (e.tiers & !(1 << tier), e.len)
        };
        let keeper = others.trailing_zeros() as usize;
        let copy = self.tiers[keeper].handle.get_chunk(hash)?;
        if copy.len() as u64 != len {
            return Err(KvError::Io(format!(
                "tier {:?} holds a copy of the wrong length; nothing evicted",
                self.tiers[keeper].name
            )));
        }
        self.remove_copy(hash, tier)?;
        self.record_move(Action::Evict, hash, len, tier);
        self.metrics.evictions.fetch_add(1, Relaxed);
        Ok(())
    }
}

impl AdvisedStore for TieredStore {
    fn drain_accesses(&self, max: usize) -> Vec<Access> {
        TieredStore::drain_accesses(self, max)
    }

    fn record_decisions(&self, lines: Vec<String>) {
        TieredStore::record_decisions(self, lines)
    }
}

impl AdviceSink for TieredStore {
    /// Validate every advised chunk (known, in the named tier, not the last
    /// copy, room in the target, under the rate limit) and apply the ones
    /// that pass; refusals are counted with their reasons.
    fn apply(&self, advice: Vec<Advice>) -> AdviceReport {
        let mut report = AdviceReport::default();
        let mut reasons: Vec<(String, u64)> = Vec::new();
        let mut refuse = |why: String, n: u64, report: &mut AdviceReport| {
            report.refused += n;
            match reasons.iter().position(|(r, _)| *r == why) {
                Some(at) => reasons[at].1 += n,
                None if reasons.len() < MAX_REASONS => reasons.push((why, n)),
                None => {}
            }
        };
        let mut seen = 0;
        for Advice {
            action,
            tier,
            hashes,
        } in advice
        {
            let tier = tier as usize;
            for hash in hashes {
                seen += 1;
                if seen > MAX_ADVISED_HASHES {
                    refuse("too many hashes in one batch".into(), 1, &mut report);
                    continue;
                }
                if tier >= self.tiers.len() {
                    refuse(format!("no tier {tier}"), 1, &mut report);
                    continue;
                }
                let claim = match self.claim(action, tier, &hash) {
                    Ok(claim) => claim,
                    Err(why) => {
                        refuse(format!("{action:?}: {why}"), 1, &mut report);
                        continue;
                    }
                };
                match self.apply_one(action, tier, &hash, claim) {
                    Ok(()) => report.applied += 1,
                    Err(e) => refuse(format!("{action:?} failed: {e}"), 1, &mut report),
                }
            }
        }
        self.metrics.refused.fetch_add(report.refused, Relaxed);
        report.reasons = reasons
            .into_iter()
            .map(|(why, n)| format!("{n} x {why}"))
            .collect();
        self.publish_usage();
        self.write_status();
        report
    }

    fn usage(&self) -> Vec<TierUsage> {
        let index = lock(&self.index);
        self.tiers
            .iter()
            .enumerate()
            .map(|(i, t)| TierUsage {
                name: t.name.clone(),
                capacity_bytes: t.capacity,
                used_bytes: index.used[i],
                chunks: index.count[i],
            })
            .collect()
    }
}
