//! A two-tier store simulated in memory, driven by a shared-prompt trace,
//! to measure a policy's restore hit ratio in the hot tier (docs/tiering.md,
//! docs/benchmarks.md). The store behaves as the real one
//! (`kvwasm_host::tiering`): puts land in the hot tier, a put that would
//! overflow it first demotes the least recently used hot chunks (puts and
//! reads count as uses), reads never move anything by themselves, and
//! after each turn the background demoter brings the hot tier down to its
//! low-water mark (80% without an advisor, none with one) and the advisor,
//! if any, has a round. Advice is applied under the host's rules (promote
//! only into room, evict only where a copy is below), and every move the
//! store makes, on its own or on advice, is reported to the policy.

use std::collections::HashMap;

use crate::{Access, AccessKind, Action, Advice, Knobs, Move, MoveKind, Policy, TierUsage};

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
    /// Chunks moved between tiers (advised or the store's own).
    pub moves: u64,
    /// Advised chunks the store refused (not in that tier, no room...).
    pub refused: u64,
    /// Reads that found no tier with the chunk (must stay 0).
    pub lost: u64,
}

impl Outcome {
    pub fn hit_ratio(&self) -> f64 {
        self.hot_hits as f64 / self.restore_reads.max(1) as f64
    }
}

/// The store's background demoter target without an advisor (the tiered
/// entry's `low_water_pct` default); with one it is 100.
const LOW_WATER_PCT: u64 = 80;

/// Run `workload` against a store advised by a policy with `knobs`, or
/// with no advisor at all (`None`).
pub fn run(workload: &Workload, knobs: Option<Knobs>) -> Outcome {
    let w = workload;
    let data = u64::from(w.prefix_chunks + w.sessions * w.unique_chunks) * w.chunk_bytes;
    let capacity = data / 100 * w.hot_pct;
    let low_water = match knobs {
        Some(_) => capacity,
        None => capacity / 100 * LOW_WATER_PCT,
    };
    let mut store = Store {
        policy: knobs.map(Policy::new),
        capacity,
        low_water,
        chunks: HashMap::new(),
        used: 0,
        clock: 0,
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
        store.end_of_turn();
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
        store.end_of_turn();
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
    /// The store's clock at the last put or read (its LRU order).
    last_use: u64,
}

/// What the policy has not been told yet, in order.
enum Event {
    Access(Access),
    Move(Move),
}

struct Store {
    policy: Option<Policy>,
    capacity: u64,
    /// Where the background demoter brings the hot tier after each turn.
    low_water: u64,
    chunks: HashMap<Vec<u8>, Place>,
    used: u64,
    clock: u64,
    pending: Vec<Event>,
    outcome: Outcome,
}

impl Store {
    fn put(&mut self, hash: Vec<u8>, len: u64, manifest: &str) {
        self.clock += 1;
        if let Some(place) = self.chunks.get_mut(&hash) {
            // Deduplicated across tiers: nothing stored, but a use.
            place.last_use = self.clock;
            let (len, tier) = (place.len, u32::from(!place.hot));
            self.access(AccessKind::Put, hash, len, tier, manifest);
            return;
        }
        while self.used + len > self.capacity {
            self.demote_lru();
        }
        self.chunks.insert(
            hash.clone(),
            Place {
                len,
                hot: true,
                cold: false,
                last_use: self.clock,
            },
        );
        self.used += len;
        self.outcome.max_hot_bytes = self.outcome.max_hot_bytes.max(self.used);
        self.access(AccessKind::Put, hash, len, 0, manifest);
    }

    /// Read `hash`; whether the hot tier served it.
    fn get(&mut self, hash: &[u8], manifest: &str) -> bool {
        self.clock += 1;
        let Some(place) = self.chunks.get_mut(hash) else {
            self.outcome.lost += 1;
            return false;
        };
        place.last_use = self.clock;
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
        if self.policy.is_some() {
            self.pending.push(Event::Access(Access {
                kind,
                hash,
                len,
                tier,
                manifest: Some(manifest.to_owned()),
            }));
        }
    }

    /// The store's own demotion: the least recently used hot chunk.
    fn demote_lru(&mut self) {
        let victim = self
            .chunks
            .iter()
            .filter(|(_, p)| p.hot)
            .min_by_key(|(_, p)| p.last_use)
            .map(|(h, _)| h.clone())
            .expect("the hot tier is over capacity, so not empty");
        self.move_down(&victim);
    }

    /// Take `hash` out of the hot tier: a copy below makes it an eviction.
    fn move_down(&mut self, hash: &[u8]) {
        let place = self.chunks.get_mut(hash).expect("a known chunk");
        let kind = if place.cold {
            MoveKind::Evicted
        } else {
            MoveKind::Demoted
        };
        place.hot = false;
        place.cold = true;
        self.used -= place.len;
        let len = place.len;
        self.moved(kind, hash, len, 0);
    }

    fn moved(&mut self, kind: MoveKind, hash: &[u8], len: u64, tier: u32) {
        self.outcome.moves += 1;
        if self.policy.is_some() {
            self.pending.push(Event::Move(Move {
                kind,
                hash: hash.to_vec(),
                len,
                tier,
            }));
        }
    }

    /// After a turn: the background demoter, then the advisor's round
    /// (everything the store logged handed over in order; advice; apply).
    fn end_of_turn(&mut self) {
        while self.used > self.low_water {
            self.demote_lru();
        }
        let Some(mut policy) = self.policy.take() else {
            return;
        };
        let pending = std::mem::take(&mut self.pending);
        for run in
            pending.chunk_by(|a, b| matches!(a, Event::Move(_)) == matches!(b, Event::Move(_)))
        {
            let accesses: Vec<Access> = run
                .iter()
                .filter_map(|e| match e {
                    Event::Access(a) => Some(a.clone()),
                    Event::Move(_) => None,
                })
                .collect();
            let moves: Vec<Move> = run
                .iter()
                .filter_map(|e| match e {
                    Event::Move(m) => Some(m.clone()),
                    Event::Access(_) => None,
                })
                .collect();
            policy.observe(&accesses);
            policy.observe_moves(&moves);
        }
        let usage = [
            TierUsage {
                capacity_bytes: Some(self.capacity),
                used_bytes: self.used,
            },
            TierUsage {
                capacity_bytes: None,
                used_bytes: 0,
            },
        ];
        let advice = policy.advise(&usage);
        self.policy = Some(policy);
        for advice in advice {
            self.apply(advice);
        }
    }

    fn apply(&mut self, advice: Advice) {
        for hash in advice.hashes {
            let Some(place) = self.chunks.get_mut(&hash) else {
                self.outcome.refused += 1;
                continue;
            };
            let (hot, cold, len) = (place.hot, place.cold, place.len);
            match (advice.action, advice.tier) {
                (Action::Demote, 0) if hot => self.move_down(&hash),
                (Action::Evict, 0) if hot && cold => self.move_down(&hash),
                (Action::Promote, 1) if !hot && self.used + len <= self.capacity => {
                    place.hot = true;
                    self.used += len;
                    self.moved(MoveKind::Promoted, &hash, len, 1);
                }
                _ => self.outcome.refused += 1,
            }
        }
        self.outcome.max_hot_bytes = self.outcome.max_hot_bytes.max(self.used);
    }
}
