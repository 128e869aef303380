//! The storage advisor's policy as plain Rust, with no WIT or WASI
//! dependency: the `advisor` guest wraps it, and its tests and the
//! shared-prompt simulation ([`sim`]) run it natively.
//!
//! The default policy is a frequency-aware LRU with prefix protection:
//!
//! * every chunk has a hit count that halves every `half_life` accesses
//!   (of the whole store), and a recency (the last access);
//! * a chunk read or written under `shared_manifests` distinct manifests
//!   (the sessions sharing a system prompt) is *protected*: it is demoted
//!   only when nothing else is left;
//! * when a tier is above its high-water mark, the coldest unprotected
//!   chunks (lowest decayed count, then least recent) leave it until it is
//!   back at the low-water mark; a chunk the advisor knows has a copy below
//!   is evicted rather than demoted (no copy needed);
//! * chunks read from a lower tier are promoted when they are protected or
//!   hot enough (`promote_hits`), into free room or in place of colder
//!   chunks.
//!
//! [`Mode::Lru`] is the baseline the benchmark compares against: the same
//! mechanics ordered by recency only, no counts, no protection, and chunks
//! read from a lower tier promoted into free room only (displacing others
//! on every read from below thrashes a tier smaller than one restore, and
//! scored below having no advisor at all).
//!
//! The policy learns where chunks are from the store itself: accesses name
//! the tier read, and the store reports every move it makes, on its own or
//! on advice ([`Policy::observe_moves`]). Advice is never assumed applied.

use std::collections::HashMap;

pub mod sim;

/// What happened to a chunk (a mirror of the WIT `access-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    Put,
    Hit,
    Miss,
    Gone,
}

/// One chunk-level event of the store's traffic (the WIT `chunk-access`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub kind: AccessKind,
    pub hash: Vec<u8>,
    pub len: u64,
    pub tier: u32,
    pub manifest: Option<String>,
}

/// How the store moved a chunk between its tiers (the WIT `move-kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveKind {
    /// Copied from `tier` one tier up; the copy in `tier` stays.
    Promoted,
    /// Moved from `tier` one tier down; the copy in `tier` is gone.
    Demoted,
    /// Removed from `tier`; a lower tier keeps a copy.
    Evicted,
}

/// One move the store made, on its own or on advice (the WIT `chunk-move`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub kind: MoveKind,
    pub hash: Vec<u8>,
    pub len: u64,
    /// The tier the chunk moved from.
    pub tier: u32,
}

/// What one tier holds (the WIT `tier-usage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierUsage {
    pub capacity_bytes: Option<u64>,
    pub used_bytes: u64,
}

/// The WIT `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Promote,
    Demote,
    Evict,
}

/// One piece of advice (the WIT `advice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub action: Action,
    pub tier: u32,
    pub hashes: Vec<Vec<u8>>,
}

/// Which ordering the policy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Frequency-aware LRU with prefix protection (the default).
    Frequency,
    /// Plain LRU: the baseline. Promotes into free room only; never
    /// worse than no advisor on the benchmark's traces (a test holds it).
    Lru,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "frequency" => Ok(Mode::Frequency),
            "lru" => Ok(Mode::Lru),
            _ => Err(format!("unknown policy {s:?} (known: frequency, lru)")),
        }
    }
}

/// The policy's knobs (the guest reads them from its settings; the table
/// is in docs/tiering.md).
#[derive(Debug, Clone, PartialEq)]
pub struct Knobs {
    pub mode: Mode,
    /// Demote when a tier is above this share of its capacity (percent).
    pub high_water_pct: u64,
    /// ... down to this share; promotions fill up to it too (percent).
    pub low_water_pct: u64,
    /// Accesses (of the whole store) after which a hit count halves.
    pub half_life: u64,
    /// Distinct manifests after which a chunk is a protected shared prefix.
    pub shared_manifests: usize,
    /// Decayed hits a chunk in a lower tier needs to be promoted.
    pub promote_hits: f64,
    /// Chunks named in one `advise` answer, over all its advice.
    pub max_moves: usize,
    /// Chunks tracked at most; beyond it the least recent are forgotten.
    pub max_tracked: usize,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            mode: Mode::Frequency,
            high_water_pct: 95,
            low_water_pct: 85,
            half_life: 4096,
            shared_manifests: 3,
            promote_hits: 2.0,
            max_moves: 1024,
            max_tracked: 1 << 20,
        }
    }
}

/// What the advisor knows about one chunk.
#[derive(Debug, Clone)]
struct Chunk {
    len: u64,
    /// The highest tier the chunk is believed to be in.
    tier: u32,
    /// A copy is believed to exist below `tier` (it was promoted or read
    /// from there), so leaving `tier` needs no copy.
    below: bool,
    /// Decayed hit count, as of access number `at`.
    score: f64,
    at: u64,
    /// The last access number: recency.
    last: u64,
    /// Hashes of distinct manifests seen with the chunk, at most
    /// `shared_manifests` of them.
    manifests: Vec<u64>,
    /// Read from a lower tier since the last advice.
    wanted: bool,
}

/// The advisor's state: what it knows of every tracked chunk.
#[derive(Debug)]
pub struct Policy {
    knobs: Knobs,
    chunks: HashMap<Vec<u8>, Chunk>,
    /// Accesses seen: the clock of decay and recency.
    clock: u64,
}

impl Policy {
    pub fn new(knobs: Knobs) -> Policy {
        Policy {
            knobs,
            chunks: HashMap::new(),
            clock: 0,
        }
    }

    pub fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    /// Chunks tracked now.
    pub fn tracked(&self) -> usize {
        self.chunks.len()
    }

    /// Whether `hash` is a protected shared chunk.
    pub fn is_protected(&self, hash: &[u8]) -> bool {
        self.chunks.get(hash).is_some_and(|c| self.protected(c))
    }

    /// Take in the store's accesses, in order.
    pub fn observe(&mut self, accesses: &[Access]) {
        for access in accesses {
            self.clock += 1;
            if access.kind == AccessKind::Gone {
                self.chunks.remove(&access.hash);
                continue;
            }
            if access.kind == AccessKind::Miss {
                continue;
            }
            let clock = self.clock;
            let half_life = self.knobs.half_life;
            let shared = self.knobs.shared_manifests;
            if !self.chunks.contains_key(&access.hash) {
                self.chunks.insert(
                    access.hash.clone(),
                    Chunk {
                        len: access.len,
                        tier: access.tier,
                        below: false,
                        score: 0.0,
                        at: clock,
                        last: clock,
                        manifests: Vec::new(),
                        wanted: false,
                    },
                );
            }
            let chunk = self.chunks.get_mut(&access.hash).expect("just ensured");
            chunk.len = access.len;
            chunk.score = decayed(chunk.score, chunk.at, clock, half_life) + 1.0;
            chunk.at = clock;
            chunk.last = clock;
            match access.kind {
                AccessKind::Put => chunk.tier = access.tier,
                _ => {
                    if access.tier > chunk.tier {
                        chunk.below = false;
                    }
                    chunk.wanted = access.tier > 0;
                    chunk.tier = access.tier;
                }
            }
            if let Some(manifest) = &access.manifest {
                let id = fnv1a(manifest.as_bytes());
                if chunk.manifests.len() < shared && !chunk.manifests.contains(&id) {
                    chunk.manifests.push(id);
                }
            }
        }
        self.forget_beyond_limit();
    }

    /// Take in the moves the store made, in order: where each chunk is now.
    /// Moves change no chunk's heat. A chunk the policy does not track is
    /// ignored (it learns it from its next access).
    pub fn observe_moves(&mut self, moves: &[Move]) {
        for m in moves {
            let Some(chunk) = self.chunks.get_mut(&m.hash) else {
                continue;
            };
            // `chunk.tier` is the hottest tier believed to hold the chunk;
            // a move out of a colder tier than that changes nothing.
            match m.kind {
                MoveKind::Promoted if m.tier >= 1 && chunk.tier >= m.tier => {
                    chunk.tier = m.tier - 1;
                    chunk.below = true;
                    chunk.wanted = false;
                }
                MoveKind::Demoted | MoveKind::Evicted if chunk.tier >= m.tier => {
                    chunk.tier = m.tier + 1;
                    chunk.below = false;
                }
                _ => {}
            }
        }
    }

    /// Advice for tiers in `usage` (hottest first). The advice is not
    /// assumed applied: where each chunk ends up is learned from the
    /// store's moves ([`Policy::observe_moves`]) and accesses, so a refused
    /// or failed move leaves nothing wrong behind.
    pub fn advise(&mut self, usage: &[TierUsage]) -> Vec<Advice> {
        let mut advice: Vec<Advice> = Vec::new();
        let mut moves = 0usize;
        for upper in 0..usage.len().saturating_sub(1) {
            let Some(capacity) = usage[upper].capacity_bytes else {
                continue;
            };
            let upper = upper as u32;
            let share = |pct: u64| (u128::from(capacity) * u128::from(pct) / 100) as i128;
            let (low, high) = (
                share(self.knobs.low_water_pct),
                share(self.knobs.high_water_pct),
            );
            let used = usage[upper as usize].used_bytes;
            // Bytes that may still enter the tier (negative: must leave).
            let mut room = low - i128::from(used);
            let over_high = i128::from(used) > high;

            let candidates = self.ranked(|c| c.tier == upper + 1 && c.wanted, true);
            if !over_high && candidates.is_empty() {
                continue; // nothing to do: skip ranking the whole tier
            }
            let mut victims = self.ranked(|c| c.tier == upper, false);
            victims.reverse(); // coldest last, for pop()
            let mut demoted: Vec<Vec<u8>> = Vec::new();
            let mut evicted: Vec<Vec<u8>> = Vec::new();
            let mut leave = |p: &Policy, hash: Vec<u8>, room: &mut i128| {
                let chunk = &p.chunks[&hash];
                *room += chunk.len as i128;
                if chunk.below {
                    evicted.push(hash);
                } else {
                    demoted.push(hash);
                }
            };
            if over_high {
                while room < 0 && moves < self.knobs.max_moves {
                    let Some(hash) = victims.pop() else { break };
                    leave(self, hash, &mut room);
                    moves += 1;
                }
            }

            let mut promoted = Vec::new();
            for hash in candidates {
                if moves >= self.knobs.max_moves {
                    break;
                }
                let chunk = &self.chunks[&hash];
                if self.knobs.mode == Mode::Frequency
                    && !self.protected(chunk)
                    && self.score(chunk) < self.knobs.promote_hits
                {
                    continue;
                }
                let len = chunk.len as i128;
                // Make room by displacing colder chunks, never a hotter one
                // (plain LRU promotes into free room only, see [`Mode::Lru`]).
                while room < len
                    && moves + 1 < self.knobs.max_moves
                    && self.knobs.mode == Mode::Frequency
                {
                    let Some(victim) = victims.last() else { break };
                    if !self.colder(&self.chunks[victim], &self.chunks[&hash]) {
                        break;
                    }
                    let victim = victims.pop().expect("just seen");
                    leave(self, victim, &mut room);
                    moves += 1;
                }
                if room < len {
                    break;
                }
                room -= len;
                moves += 1;
                // Asked for once: if the promotion is refused, the chunk's
                // next read from below asks again.
                self.chunks
                    .get_mut(&hash)
                    .expect("ranked from the map")
                    .wanted = false;
                promoted.push(hash);
            }
            for (action, tier, hashes) in [
                (Action::Demote, upper, demoted),
                (Action::Evict, upper, evicted),
                (Action::Promote, upper + 1, promoted),
            ] {
                if !hashes.is_empty() {
                    advice.push(Advice {
                        action,
                        tier,
                        hashes,
                    });
                }
            }
        }
        advice
    }

    /// Hashes of the tracked chunks `filter` keeps, hottest first (or
    /// coldest first when `hottest` is false).
    fn ranked(&self, filter: impl Fn(&Chunk) -> bool, hottest: bool) -> Vec<Vec<u8>> {
        // Keys computed once per chunk, not per comparison (decay is a powf).
        let mut ranked: Vec<(Heat, &Vec<u8>)> = self
            .chunks
            .iter()
            .filter(|(_, c)| filter(c))
            .map(|(h, c)| (self.heat(c), h))
            .collect();
        ranked.sort_unstable_by(|(ka, ha), (kb, hb)| ka.cmp(kb).then_with(|| ha.cmp(hb)));
        if hottest {
            ranked.reverse();
        }
        ranked.into_iter().map(|(_, h)| h.clone()).collect()
    }

    /// Whether `a` should leave a tier before `b`.
    fn colder(&self, a: &Chunk, b: &Chunk) -> bool {
        self.heat(a) < self.heat(b)
    }

    /// How much a chunk deserves its tier, in this policy's order.
    fn heat(&self, c: &Chunk) -> Heat {
        match self.knobs.mode {
            Mode::Lru => Heat(false, 0.0, c.last),
            Mode::Frequency => Heat(self.protected(c), self.score(c), c.last),
        }
    }

    fn protected(&self, chunk: &Chunk) -> bool {
        self.knobs.mode == Mode::Frequency && chunk.manifests.len() >= self.knobs.shared_manifests
    }

    fn score(&self, chunk: &Chunk) -> f64 {
        decayed(chunk.score, chunk.at, self.clock, self.knobs.half_life)
    }

    /// Forget the least recent tenth once over `max_tracked` (memory bound).
    fn forget_beyond_limit(&mut self) {
        if self.chunks.len() <= self.knobs.max_tracked {
            return;
        }
        let mut lasts: Vec<u64> = self.chunks.values().map(|c| c.last).collect();
        lasts.sort_unstable();
        let keep = self.knobs.max_tracked - self.knobs.max_tracked / 10;
        let cutoff = lasts[lasts.len() - keep];
        self.chunks.retain(|_, c| c.last >= cutoff);
    }
}

/// A chunk's rank: protected, then decayed hits, then recency (plain LRU
/// uses recency only). Scores are finite, so the order is total.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Heat(bool, f64, u64);

impl Eq for Heat {}

impl PartialOrd for Heat {
    fn partial_cmp(&self, other: &Heat) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Heat {
    fn cmp(&self, other: &Heat) -> std::cmp::Ordering {
        (self.0.cmp(&other.0))
            .then(self.1.total_cmp(&other.1))
            .then(self.2.cmp(&other.2))
    }
}

/// `score` at `at`, halved every `half_life` accesses until `now`.
fn decayed(score: f64, at: u64, now: u64, half_life: u64) -> f64 {
    score * 0.5f64.powf((now - at) as f64 / half_life.max(1) as f64)
}

/// A manifest name's identity: FNV-1a, enough to tell sessions apart.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
