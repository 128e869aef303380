//! A two-tier store simulated in memory, driven by a shared-prompt trace,
//! to measure a policy's restore hit ratio in the hot tier (docs/tiering.md,
//! docs/benchmarks.md). The store applies advice under the host's rules
//! (promote only into room, evict only where a copy is below) and, like
//! the real store, never lets the hot tier exceed its capacity: a put that
//! would overflow asks for advice first and, if that frees nothing,
//! demotes the oldest hot chunk itself.

use std::collections::HashMap;

use crate::{Access, AccessKind, Action, Advice, Knobs, Policy, TierUsage};

/// The trace: `sessions` sessions sharing `prefix_chunks` chunks of system
/// prompt, each with `unique_chunks` of its own, saved once and then
/// restored `turns` times in a seeded random order. Every `scan_every`
/// turns a one-off request writes and reads back `scan_chunks` chunks no
/// one reads again. The hot tier holds `hot_pct` percent of the sessions'
/// data.
#[derive(Debug, Clone)]
pub struct Workload {
    pub sessions: u32,
    pub prefix_chunks: u32,
    pub unique_chunks: u32,
    pub chunk_bytes: u64,
    pub turns: u32,
    pub scan_every: u32,
    pub scan_chunks: u32,
    pub hot_pct: u64,
    pub seed: u64,
}

impl Default for Workload {
    /// The demo's shape (12 layers, K and V, 3072 prompt tokens and 1024
    /// own tokens per session in 1024-token chunks: 72 shared chunks and 24
    /// own), 10 sessions, a hot tier of 30%.
    fn default() -> Workload {
        Workload {
            sessions: 10,
            prefix_chunks: 72,
            unique_chunks: 24,
            chunk_bytes: 1 << 20,
            turns: 200,
            scan_every: 2,
            scan_chunks: 24,
            hot_pct: 30,
            seed: 0x5eed,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Chunk reads of session restores, and those served by the hot tier.
    pub restore_reads: u64,
    pub hot_hits: u64,
    /// Shared prompt chunks in the hot tier at the end, of `prefix_chunks`.
    pub prefix_hot_at_end: u32,
    /// The hot tier's capacity and the most it ever held.
    pub capacity: u64,
    pub max_hot_bytes: u64,
    /// Chunks moved between tiers (advised or forced).
    pub moves: u64,
    /// Reads that found no tier with the chunk (must stay 0).
    pub lost: u64,
}

impl Outcome {
    pub fn hit_ratio(&self) -> f64 {
        self.hot_hits as f64 / self.restore_reads.max(1) as f64
    }
}

/// Run `workload` against a store advised by a policy with `knobs`.
pub fn run(workload: &Workload, knobs: Knobs) -> Outcome {
    let w = workload;
    let data = u64::from(w.prefix_chunks + w.sessions * w.unique_chunks) * w.chunk_bytes;
    let mut store = Store {
        policy: Policy::new(knobs),
        capacity: data / 100 * w.hot_pct,
        chunks: HashMap::new(),
        used: 0,
        inserted: 0,
        pending: Vec::new(),
        outcome: Outcome::default(),
    };
    store.outcome.capacity = store.capacity;
    let prefix: Vec<Vec<u8>> = (0..w.prefix_chunks).map(|i| key(b'p', 0, i)).collect();
    let session = |s: u32| -> Vec<Vec<u8>> {
        let own = (0..w.unique_chunks).map(move |i| key(b's', s, i));
        prefix.iter().cloned().chain(own).collect()
    };
    for s in 0..w.sessions {
        let name = format!("session-{s}");
        for hash in session(s) {
            store.put(hash, w.chunk_bytes, &name);
        }
        store.tick(0);
    }
    let mut rng = w.seed | 1;
    for turn in 0..w.turns {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let s = (rng % u64::from(w.sessions)) as u32;
        let name = format!("session-{s}");
        for hash in session(s) {
            let hot = store.get(&hash, &name);
            store.outcome.restore_reads += 1;
            store.outcome.hot_hits += u64::from(hot);
        }
        if w.scan_every > 0 && turn % w.scan_every == 0 {
            let name = format!("oneoff-{turn}");
            let scan: Vec<Vec<u8>> = (0..w.scan_chunks).map(|i| key(b'o', turn, i)).collect();
            for hash in &scan {
                store.put(hash.clone(), w.chunk_bytes, &name);
            }
            for hash in &scan {
                store.get(hash, &name);
            }
        }
        store.tick(0);
    }
    store.outcome.prefix_hot_at_end = prefix_hot(&store, w.prefix_chunks);
    store.outcome
}

fn prefix_hot(store: &Store, prefix_chunks: u32) -> u32 {
    (0..prefix_chunks)
        .filter(|i| store.chunks.get(&key(b'p', 0, *i)).is_some_and(|c| c.hot))
        .count() as u32
}

fn key(kind: u8, owner: u32, index: u32) -> Vec<u8> {
    let mut k = vec![kind];
    k.extend_from_slice(&owner.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// Where a chunk is: the hot tier, the cold tier, or both.
struct Place {
    len: u64,
    hot: bool,
    cold: bool,
    /// Put order, for the store's own fallback demotion.
    inserted: u64,
}

struct Store {
    policy: Policy,
    capacity: u64,
    chunks: HashMap<Vec<u8>, Place>,
    used: u64,
    inserted: u64,
    /// Accesses not yet handed to the policy.
    pending: Vec<Access>,
    outcome: Outcome,
}

impl Store {
    fn put(&mut self, hash: Vec<u8>, len: u64, manifest: &str) {
        if self.chunks.contains_key(&hash) {
            return; // dedup across tiers: nothing stored
        }
        while self.used + len > self.capacity {
            let before = self.used;
            self.tick(len);
            if self.used == before {
                self.force_demotion();
            }
        }
        self.inserted += 1;
        self.chunks.insert(
            hash.clone(),
            Place {
                len,
                hot: true,
                cold: false,
                inserted: self.inserted,
            },
        );
        self.used += len;
        self.outcome.max_hot_bytes = self.outcome.max_hot_bytes.max(self.used);
        self.access(AccessKind::Put, hash, len, 0, manifest);
    }

    /// Read `hash`; whether the hot tier served it.
    fn get(&mut self, hash: &[u8], manifest: &str) -> bool {
        let Some(place) = self.chunks.get(hash) else {
            self.outcome.lost += 1;
            return false;
        };
        let (hot, len) = (place.hot, place.len);
        self.access(
            AccessKind::Hit,
            hash.to_vec(),
            len,
            u32::from(!hot),
            manifest,
        );
        hot
    }

    fn access(&mut self, kind: AccessKind, hash: Vec<u8>, len: u64, tier: u32, manifest: &str) {
        self.pending.push(Access {
            kind,
            hash,
            len,
            tier,
            manifest: Some(manifest.to_owned()),
        });
    }

    /// One round of the advisor loop: observe, advise, apply. `waiting`
    /// bytes of puts count as used, as the real store reports them.
    fn tick(&mut self, waiting: u64) {
        self.policy.observe(&std::mem::take(&mut self.pending));
        let usage = [
            TierUsage {
                capacity_bytes: Some(self.capacity),
                used_bytes: self.used + waiting,
            },
            TierUsage {
                capacity_bytes: None,
                used_bytes: 0,
            },
        ];
        for advice in self.policy.advise(&usage) {
            self.apply(advice);
        }
    }

    fn apply(&mut self, advice: Advice) {
        for hash in advice.hashes {
            let Some(place) = self.chunks.get_mut(&hash) else {
                continue;
            };
            match (advice.action, advice.tier) {
                (Action::Demote, 0) | (Action::Evict, 0) if place.hot => {
                    if advice.action == Action::Evict && !place.cold {
                        continue; // the last copy stays
                    }
                    place.hot = false;
                    place.cold = true;
                    self.used -= place.len;
                    self.outcome.moves += 1;
                }
                (Action::Promote, 1) if !place.hot && self.used + place.len <= self.capacity => {
                    place.hot = true;
                    self.used += place.len;
                    self.outcome.moves += 1;
                }
                _ => {}
            }
        }
        self.outcome.max_hot_bytes = self.outcome.max_hot_bytes.max(self.used);
    }

    /// The store's own way out when advice freed nothing: the oldest put.
    fn force_demotion(&mut self) {
        let oldest = self
            .chunks
            .iter_mut()
            .filter(|(_, p)| p.hot)
            .min_by_key(|(_, p)| p.inserted)
            .map(|(_, p)| p)
            .expect("the hot tier is over capacity, so not empty");
        oldest.hot = false;
        oldest.cold = true;
        self.used -= oldest.len;
        self.outcome.moves += 1;
    }
}
