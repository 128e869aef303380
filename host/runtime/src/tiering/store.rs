//! The tiered store: ordered tiers behind one kv_store_v1 handle
//! (docs/tiering.md).
//!
//! * `put_chunk` lands in tier 0 (or, for a chunk larger than a tier's
//!   whole capacity, the first tier that can hold it); dedup is answered
//!   across all tiers.
//! * `get_chunk`/`prefetch_chunks` read the fastest tier holding the chunk.
//! * Manifests live in the last tier, the durable one; a `put_manifest`
//!   first flushes every tier, so its chunks are readable from some tier.
//! * A move copies, flushes and reads back the copy before the source copy
//!   is removed, so at every instant some tier holds a whole copy; the last
//!   tier never loses anything.
//! * Tier 0 never exceeds its capacity: room is reserved before a write,
//!   and a put that would overflow demotes the least recently used chunks
//!   first. A background thread keeps tier 0 at its low-water mark.
//!
//! The index (which chunk is in which tier) is rebuilt at open by listing
//! every `builtin:fs` tier; a last tier that cannot be listed is learned
//! lazily (a chunk unknown to the index is looked up there).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak, mpsc};
use std::time::{Duration, Instant};

use super::advisor::{AdvisedStore, Advisor, AdvisorLoop, AdvisorStatus};
use super::config::TieredConfig;
use super::fs_tier::FsTier;
use super::{Access, AccessKind, Action, Advice, AdviceReport, AdviceSink, TierUsage};
use crate::error::KvError;
use crate::handle::{StoreHandle, open_shared};
use crate::metrics::{TierGauges, TierMetrics};
use crate::payload::MallocBuffer;

/// Longest manifest name attributed to access records.
const MAX_NOTED_NAME: usize = 255;
/// Access records kept for the advisor before the oldest are dropped.
const MAX_ACCESSES: usize = 1 << 16;
/// Decisions kept for `kvwasm tier status`.
const MAX_DECISIONS: usize = 32;
/// Chunks moved per batch (one flush of the target per batch).
const BATCH: usize = 32;
/// Distinct refusal reasons reported per batch of advice.
const MAX_REASONS: usize = 8;
/// Hashes looked at per batch of advice; the rest are refused.
pub const MAX_ADVISED_HASHES: usize = 4096;
/// The status file in tier 0's chunk directory (never a chunk: chunks
/// live in the `0`..`f` subdirectories).
const STATUS_FILE: &str = "tier-status";

/// One tier: a plain handle on its backend, plus how the host lists and
/// removes chunks there.
struct Tier {
    name: String,
    handle: Arc<StoreHandle>,
    capacity: Option<u64>,
    /// Set for `builtin:fs` tiers (required of all but the last).
    fs: Option<FsTier>,
    /// Chunks put into this tier since its last successful flush: if a
    /// flush reports them lost, the index must stop claiming them.
    unflushed: Mutex<Unflushed>,
}

/// Chunks put into a tier and not yet covered by a good flush, numbered in
/// the order they were put (flushes may run concurrently).
#[derive(Debug, Default)]
struct Unflushed {
    /// Puts numbered so far.
    puts: u64,
    hashes: VecDeque<(u64, Vec<u8>)>,
}

impl Unflushed {
    fn push(&mut self, hash: &[u8]) {
        self.puts += 1;
        self.hashes.push_back((self.puts, hash.to_vec()));
    }

    /// Take the puts numbered up to `covered` (what a flush begun then
    /// covered; a concurrent flush may have taken some already).
    fn take_through(&mut self, covered: u64) -> Vec<Vec<u8>> {
        let mut taken = Vec::new();
        while self.hashes.front().is_some_and(|(n, _)| *n <= covered) {
            taken.extend(self.hashes.pop_front().map(|(_, h)| h));
        }
        taken
    }
}

/// Where one chunk is.
#[derive(Debug, Clone, Copy)]
struct Entry {
    len: u64,
    /// Bit `i`: tier `i` holds a whole copy.
    tiers: u8,
    /// The index clock at the last put or read (LRU order).
    last_use: u64,
    /// Being moved: no other move may take it.
    busy: bool,
}

#[derive(Debug, Default)]
struct Index {
    chunks: HashMap<Vec<u8>, Entry>,
    used: Vec<u64>,
    count: Vec<u64>,
    /// Bytes promised to writes in flight, per tier.
    reserved: Vec<u64>,
    clock: u64,
}

impl Index {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Tier `tier` holds `hash` (`len` bytes).
    fn add(&mut self, hash: &[u8], len: u64, tier: usize) {
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
    fn remove(&mut self, hash: &[u8], tier: usize) {
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
    fn pick_victims(
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
    fn in_flight(&self, tier: usize) -> bool {
        self.reserved[tier] > 0
            || self
                .chunks
                .values()
                .any(|e| e.busy && e.tiers & (1 << tier) != 0)
    }
}

/// An advised move admitted by [`TieredStore::claim`]: the chunk's length,
/// and the tier where room was reserved for it, if any.
#[derive(Debug, Clone, Copy)]
struct Claim {
    len: u64,
    reserved: Option<usize>,
}

/// Moves per second the advisor may cause.
#[derive(Debug)]
struct Rate {
    window: Instant,
    chunks: u64,
    bytes: u64,
}

/// A tiered store open on one namespace. Its [`StoreHandle`] (see
/// [`open_tiered`]) is what consumers call; this is what the advisor side
/// and `kvwasm tier status` use.
pub struct TieredStore {
    /// `<entry name>/<namespace>`, for logs and metrics.
    label: String,
    config: TieredConfig,
    tiers: Vec<Tier>,
    /// Whether the last tier was listed (else it is learned lazily).
    last_listed: bool,
    index: Mutex<Index>,
    /// Signalled when reserved room is given back or a move ends.
    room: Condvar,
    rate: Mutex<Rate>,
    metrics: Arc<TierMetrics>,
    accesses: Mutex<VecDeque<Access>>,
    decisions: Mutex<VecDeque<String>>,
    /// Chunk copies removed so far: a read that missed everywhere while
    /// this changed looks again.
    removals: AtomicU64,
    /// A tier reported chunks it had accepted as lost (found by any flush,
    /// the demoter's included): the next manifest publication fails.
    lost: AtomicBool,
    /// Where the live figures are written for `kvwasm tier status`.
    status_file: Option<PathBuf>,
}

/// A tiered store as its consumer's handle holds it. Dropping it (the last
/// close) stops the background demoter and waits for a pass in progress,
/// so the tiers are released when the handle closes, not a pass later.
pub(crate) struct Front {
    store: Arc<TieredStore>,
    /// The advisor loop, when the entry names an advisor: ended first.
    advisor: Option<AdvisorLoop>,
    /// Dropped first: wakes the demoter to end it.
    stop: Option<mpsc::Sender<()>>,
    demoter: Option<std::thread::JoinHandle<()>>,
}

impl Front {
    pub(crate) fn store(&self) -> &Arc<TieredStore> {
        &self.store
    }

    /// The advisor loop's counters and last round, if the store has one.
    pub(crate) fn advisor_status(&self) -> Option<AdvisorStatus> {
        self.advisor.as_ref().map(AdvisorLoop::status)
    }

    /// Run an advisor round now (observe, advise, apply); false without an
    /// advisor.
    pub(crate) fn advisor_round(&self) -> bool {
        self.advisor.as_ref().map(AdvisorLoop::round).is_some()
    }
}

impl std::ops::Deref for Front {
    type Target = TieredStore;

    fn deref(&self) -> &TieredStore {
        &self.store
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.advisor.take();
        self.stop.take();
        if let Some(demoter) = self.demoter.take() {
            let _ = demoter.join();
        }
    }
}

/// Open tiered stores by (config file, entry, namespace): every open of the
/// same store in a process shares one index and one capacity budget.
type OpenStores = HashMap<(PathBuf, String, String), Weak<StoreHandle>>;
static OPEN: LazyLock<Mutex<OpenStores>> = LazyLock::new(Default::default);

/// Open the tiered entry `name` of the config at `path` on `namespace`
/// (what `wasm://<name>/<namespace>` opens when the entry has `tiers`).
pub fn open_tiered(path: &Path, name: &str, namespace: &str) -> Result<Arc<StoreHandle>, KvError> {
    let key = (path.to_owned(), name.to_owned(), namespace.to_owned());
    let mut open = lock(&OPEN);
    if let Some(handle) = open.get(&key).and_then(Weak::upgrade) {
        return Ok(handle);
    }
    // Opened under the lock: two racing opens must not build two indexes
    // over the same tiers.
    let handle = TieredStore::open(path, name, namespace)?;
    open.retain(|_, h| h.strong_count() > 0);
    open.insert(key, Arc::downgrade(&handle));
    Ok(handle)
}

/// Whether entry `name` of the config at `path` is a tiered store (the
/// file parsed once per process, as for backends: a changed config applies
/// to the next process).
pub fn is_tiered(path: &Path, name: &str) -> Result<bool, String> {
    let config = crate::config::cached_config(path)?;
    Ok(config
        .backends
        .get(name)
        .is_some_and(|b| !b.tiers.is_empty()))
}

impl TieredStore {
    fn open(path: &Path, name: &str, namespace: &str) -> Result<Arc<StoreHandle>, KvError> {
        let config = crate::config::cached_config(path).map_err(KvError::Host)?;
        let tiered = TieredConfig::of(&config, name)
            .map_err(KvError::Host)?
            .ok_or_else(|| KvError::Host(format!("backend {name:?} is not a tiered store")))?;
        let mut tiers = Vec::new();
        let mut last_backend = None;
        for (tier, capacity) in tiered.tiers.iter().zip(&tiered.capacities) {
            let backend = crate::config::cached_backend(path, tier).map_err(KvError::Host)?;
            last_backend = Some(backend.clone());
            let handle = open_shared(backend.clone(), namespace)?;
            let fs = match config.backends[tier].component.as_str() {
                "builtin:fs" => Some(FsTier::new(&backend, namespace).map_err(KvError::Host)?),
                _ => None,
            };
            tiers.push(Tier {
                unflushed: Mutex::default(),
                name: tier.clone(),
                handle,
                capacity: *capacity,
                fs,
            });
        }
        let n = tiers.len();
        let mut index = Index {
            used: vec![0; n],
            count: vec![0; n],
            reserved: vec![0; n],
            ..Index::default()
        };
        for (i, tier) in tiers.iter().enumerate() {
            if let Some(fs) = &tier.fs {
                for (hash, len) in fs.list().map_err(KvError::Io)? {
                    index.add(&hash, len, i);
                }
            }
        }
        let metrics = Arc::new(TierMetrics {
            tiers: tiers
                .iter()
                .map(|t| TierGauges {
                    name: t.name.clone(),
                    capacity_bytes: t.capacity,
                    ..TierGauges::default()
                })
                .collect(),
            ..TierMetrics::default()
        });
        let label = format!("{name}/{namespace}");
        crate::metrics::register_tiered(&label, &metrics);
        let status_file = tiers[0].fs.as_ref().map(|fs| fs.dir().join(STATUS_FILE));
        let (demoter_stop, stopped) = mpsc::channel();
        let store = Arc::new(TieredStore {
            label,
            last_listed: tiers[n - 1].fs.is_some(),
            tiers,
            index: Mutex::new(index),
            room: Condvar::new(),
            rate: Mutex::new(Rate {
                window: Instant::now(),
                chunks: 0,
                bytes: 0,
            }),
            metrics,
            accesses: Mutex::default(),
            decisions: Mutex::default(),
            removals: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            status_file,
            config: tiered,
        });
        store.publish_usage();
        let advisor = match &store.config.advisor {
            Some(advisor) => {
                let advisor = Advisor::from_config(&config, advisor)?;
                let weak: Weak<TieredStore> = Arc::downgrade(&store);
                let loop_config = store.config.advisor_loop.clone();
                Some(AdvisorLoop::start(advisor, weak, loop_config)?)
            }
            None => None,
        };
        let front = Front {
            advisor,
            demoter: store.start_demoter(stopped),
            stop: Some(demoter_stop),
            store,
        };
        // The consumer's handle is a plain one on the last tier (manifests),
        // its chunk calls turned to the tiers.
        let last = last_backend.expect("two tiers or more");
        Ok(Arc::new(
            StoreHandle::open(last, namespace)?.with_tiers(front),
        ))
    }

    /// The tiered entry's settings (the advisor side reads `advisor` and
    /// its knobs here).
    pub fn config(&self) -> &TieredConfig {
        &self.config
    }

    /// `<entry name>/<namespace>`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The live counters (also served in `/metrics`).
    pub fn metrics(&self) -> &Arc<TierMetrics> {
        &self.metrics
    }

    /// Take up to `max` of the oldest access records (for the advisor).
    pub fn drain_accesses(&self, max: usize) -> Vec<Access> {
        let mut log = lock(&self.accesses);
        let n = max.min(log.len());
        log.drain(..n).collect()
    }

    /// Record what the advisor decided (one line each), for `kvwasm tier
    /// status`; the last [`MAX_DECISIONS`] are kept.
    pub fn record_decisions(&self, lines: impl IntoIterator<Item = String>) {
        let mut kept = lock(&self.decisions);
        for line in lines {
            if kept.len() == MAX_DECISIONS {
                kept.pop_front();
            }
            kept.push_back(line);
        }
        drop(kept);
        self.write_status();
    }

    /// The advisor's last decisions, oldest first.
    pub fn decisions(&self) -> Vec<String> {
        lock(&self.decisions).iter().cloned().collect()
    }

    fn last(&self) -> usize {
        self.tiers.len() - 1
    }

    fn record(&self, kind: AccessKind, hash: &[u8], len: u64, tier: usize) {
        // Only an advisor reads the log: without one it is not kept.
        if self.config.advisor.is_none() {
            return;
        }
        self.log_access(Access {
            kind,
            hash: hash.to_vec(),
            len,
            tier: tier as u32,
            manifest: LAST_MANIFEST.with_borrow(|m| {
                m.as_ref()
                    .filter(|(store, _)| *store == self as *const _ as usize)
                    .map(|(_, name)| name.clone())
            }),
        });
    }

    /// Tell the advisor (if any) that the store moved `hash` out of (or,
    /// promoting, up from) `tier`: without it, the advisor believes its
    /// chunks are where it last saw them, and advises moves the store
    /// must refuse.
    fn record_move(&self, action: Action, hash: &[u8], len: u64, tier: usize) {
        if self.config.advisor.is_none() {
            return;
        }
        self.log_access(Access {
            kind: AccessKind::Moved(action),
            hash: hash.to_vec(),
            len,
            tier: tier as u32,
            manifest: None,
        });
    }

    /// Keep `access` for the advisor: the oldest is dropped (and counted)
    /// beyond [`MAX_ACCESSES`].
    fn log_access(&self, access: Access) {
        let mut log = lock(&self.accesses);
        if log.len() == MAX_ACCESSES {
            log.pop_front();
            self.metrics.accesses_dropped.fetch_add(1, Relaxed);
        }
        log.push_back(access);
    }

    /// A manifest was read or written on this thread: the chunk calls that
    /// follow are attributed to it.
    pub(crate) fn note_manifest(&self, name: &str) {
        // Called before the guest checks the name: a name longer than any
        // backend accepts is not kept (each access record clones it).
        let name = (name.len() <= MAX_NOTED_NAME).then(|| name.to_owned());
        LAST_MANIFEST.set(name.map(|name| (self as *const _ as usize, name)));
    }

    /// Copy the index's figures into the gauges.
    fn publish_usage(&self) {
        let index = lock(&self.index);
        for (i, g) in self.metrics.tiers.iter().enumerate() {
            g.used_bytes.store(index.used[i], Relaxed);
            g.chunks.store(index.count[i], Relaxed);
        }
    }

    pub(crate) fn put_chunk(&self, hash: &[u8], data: &[u8]) -> Result<bool, KvError> {
        let len = data.len() as u64;
        let held = {
            let mut index = lock(&self.index);
            let now = index.tick();
            index.chunks.get_mut(hash).map(|entry| {
                entry.last_use = now;
                (entry.len, entry.tiers.trailing_zeros() as usize)
            })
        };
        if let Some((held_len, tier)) = held {
            // Nothing stored, but a use all the same (the store's LRU
            // clock counts it; so must the advisor's).
            self.record(AccessKind::Put, hash, held_len, tier);
            return Ok(true);
        }
        let last = self.last();
        if !self.last_listed {
            // The last tier may hold it from an earlier process.
            match self.tiers[last].handle.get_chunk(hash) {
                Ok(found) => {
                    lock(&self.index).add(hash, found.len() as u64, last);
                    self.publish_usage();
                    self.record(AccessKind::Put, hash, found.len() as u64, last);
                    return Ok(true);
                }
                Err(KvError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        // The first tier that can hold it at all (a chunk larger than tier
        // 0's whole capacity goes further down rather than failing).
        let tier = (0..last)
            .find(|&t| self.tiers[t].capacity.is_some_and(|c| c >= len))
            .unwrap_or(last);
        let reserved = self.tiers[tier].capacity.is_some();
        if reserved {
            self.reserve(tier, len, self.deadline(tier))?;
        }
        let result = self.tiers[tier].handle.put_chunk(hash, data);
        if result.is_ok() {
            lock(&self.tiers[tier].unflushed).push(hash);
        }
        {
            let mut index = lock(&self.index);
            if reserved {
                index.reserved[tier] -= len;
            }
            if result.is_ok() {
                index.add(hash, len, tier);
            }
        }
        self.room.notify_all();
        self.publish_usage();
        if result.is_ok() {
            self.record(AccessKind::Put, hash, len, tier);
        }
        result
    }

    pub(crate) fn get_chunk(&self, hash: &[u8]) -> Result<MallocBuffer, KvError> {
        for _ in 0..2 {
            let removals = self.removals.load(Relaxed);
            let known = {
                let mut index = lock(&self.index);
                let now = index.tick();
                index.chunks.get_mut(hash).map_or(0, |e| {
                    e.last_use = now;
                    e.tiers
                })
            };
            // The tiers the index names first, then the others: a move in
            // flight may have just put it somewhere else.
            let all = 0..self.tiers.len();
            let order = all
                .clone()
                .filter(|t| known & (1 << t) != 0)
                .chain(all.filter(|t| known & (1 << t) == 0));
            let mut failure = None;
            for t in order {
                match self.tiers[t].handle.get_chunk(hash) {
                    Ok(found) => {
                        let len = found.len() as u64;
                        if known & (1 << t) == 0 {
                            // Learned (a last tier not listed at open), unless
                            // a move of it is under way and owns its entry.
                            let mut index = lock(&self.index);
                            if !index.chunks.get(hash).is_some_and(|e| e.busy) {
                                index.add(hash, len, t);
                            }
                            drop(index);
                            self.publish_usage();
                        }
                        self.metrics.tiers[t].hits.fetch_add(1, Relaxed);
                        self.record(AccessKind::Hit, hash, len, t);
                        return Ok(found);
                    }
                    Err(KvError::NotFound) => {}
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            if self.removals.load(Relaxed) == removals {
                break;
            }
        }
        self.metrics.misses.fetch_add(1, Relaxed);
        self.record(AccessKind::Miss, hash, 0, 0);
        Err(KvError::NotFound)
    }

    pub(crate) fn prefetch_chunks(&self, hashes: &[Vec<u8>]) -> Result<(), KvError> {
        let mut groups = vec![Vec::new(); self.tiers.len()];
        {
            let index = lock(&self.index);
            for hash in hashes {
                let tier = index
                    .chunks
                    .get(hash)
                    .map_or(self.last(), |e| e.tiers.trailing_zeros() as usize);
                groups[tier].push(hash.clone());
            }
        }
        for (tier, group) in groups.iter().enumerate() {
            if !group.is_empty() {
                self.tiers[tier].handle.prefetch_chunks(group)?;
            }
        }
        Ok(())
    }

    /// Make every chunk put through any tier visible (and durable where
    /// the medium allows): before a manifest is published.
    pub(crate) fn flush(&self) -> Result<(), KvError> {
        let flushed = (0..self.tiers.len()).try_for_each(|tier| self.flush_tier(tier));
        // This call reports a loss, whether it found it now or another
        // flush (the demoter's, say) found it earlier.
        let lost = self.lost.swap(false, Relaxed);
        flushed?;
        if lost {
            return Err(KvError::Io(format!(
                "{}: a tier lost chunks it had accepted (see the log); they are no longer \
                 counted as stored: put them again before publishing a manifest",
                self.label
            )));
        }
        Ok(())
    }

    /// Flush one tier. If it reports accepted chunks lost, the index stops
    /// claiming the ones put since its last good flush that are not there
    /// (so a re-put writes them again) and the next manifest fails, whoever
    /// flushed first (the demoter, an advised move, a consumer).
    fn flush_tier(&self, tier: usize) -> Result<(), KvError> {
        let covered = lock(&self.tiers[tier].unflushed).puts;
        let result = self.tiers[tier].handle.flush();
        let flushed = lock(&self.tiers[tier].unflushed).take_through(covered);
        if let Err(e) = &result {
            let fs = self.tiers[tier].fs.as_ref();
            let mut index = lock(&self.index);
            for hash in &flushed {
                if !fs.is_some_and(|fs| fs.holds(hash))
                    && !index.chunks.get(hash).is_some_and(|e| e.busy)
                {
                    index.remove(hash, tier);
                }
            }
            drop(index);
            self.lost.store(true, Relaxed);
            self.publish_usage();
            crate::log_limit::warn(
                ("tier flush failed", self.label.as_str(), e.code()),
                format_args!(
                    "{}: flushing tier {:?} failed: {e}; its unflushed chunks are no longer \
                     counted as stored",
                    self.label, self.tiers[tier].name
                ),
            );
        }
        result
    }

    fn deadline(&self, tier: usize) -> Instant {
        Instant::now() + Duration::from_millis(self.tiers[tier].handle.call_timeout_ms())
    }

    /// Reserve `len` bytes in `tier` (which has a capacity), demoting its
    /// least recently used chunks first if they would not fit.
    ///
    /// Each chunk is tried at most once per reservation: one that cannot
    /// be moved (its read or its copy failed) is not picked again, so when
    /// nothing can leave the tier the write is refused at once, with the
    /// reason logged, rather than retried until its deadline. It waits
    /// (until `deadline`, never polling) only while room may still free up
    /// without it: chunks there being moved, writes into it in flight.
    fn reserve(&self, tier: usize, len: u64, deadline: Instant) -> Result<(), KvError> {
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

    fn demote_busy(
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
    fn verify(&self, tier: usize, hash: &[u8], expected: &[u8]) -> Result<bool, KvError> {
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
    fn remove_copy(&self, hash: &[u8], tier: usize) -> Result<(), KvError> {
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
    fn start_demoter(
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

    /// A copy in `tier` read back wrong: remove it (where the host can)
    /// so neither a reader nor a later move trusts it.
    fn discard_bad_copy(&self, tier: usize, hash: &[u8]) -> Result<(), KvError> {
        lock(&self.index).remove(hash, tier);
        match &self.tiers[tier].fs {
            Some(fs) if tier != self.last() => {
                self.flush_tier(tier)?;
                fs.delete(hash).map_err(KvError::Io)
            }
            _ => Ok(()),
        }
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

    /// The figures `kvwasm tier status` shows.
    pub fn status(&self) -> TierStatus {
        let m = &self.metrics;
        TierStatus {
            usage: self.usage(),
            hits: m.tiers.iter().map(|t| t.hits.load(Relaxed)).collect(),
            misses: m.misses.load(Relaxed),
            promotions: m.promotions.load(Relaxed),
            demotions: m.demotions.load(Relaxed),
            evictions: m.evictions.load(Relaxed),
            moved_bytes: m.moved_bytes.load(Relaxed),
            verify_failures: m.verify_failures.load(Relaxed),
            refused: m.refused.load(Relaxed),
            decisions: self.decisions(),
        }
    }

    /// Write [`Self::status`] where `kvwasm tier status` finds it (tier 0's
    /// chunk directory), replacing the previous one whole.
    fn write_status(&self) {
        let Some(path) = &self.status_file else {
            return;
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let text = self.status().to_lines().join("\n") + "\n";
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            crate::log_limit::warn(
                ("tier status", self.label.as_str()),
                format_args!("{}: cannot write {}: {e}", self.label, path.display()),
            );
        }
    }

    /// The figures the last process that used this store wrote, if any.
    pub fn saved_status(&self) -> Option<TierStatus> {
        let text = std::fs::read_to_string(self.status_file.as_ref()?).ok()?;
        TierStatus::from_lines(&text)
    }
}

impl Drop for TieredStore {
    /// The final figures, if this process used the store at all (a
    /// `kvwasm tier status` that only looked must not erase them).
    fn drop(&mut self) {
        let s = self.status();
        let reads = s.hits.iter().sum::<u64>() + s.misses;
        if reads + s.promotions + s.demotions + s.evictions + s.refused > 0
            || !s.decisions.is_empty()
        {
            self.write_status();
        }
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

/// What `kvwasm tier status` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierStatus {
    pub usage: Vec<TierUsage>,
    /// Reads served per tier.
    pub hits: Vec<u64>,
    pub misses: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub evictions: u64,
    pub moved_bytes: u64,
    pub verify_failures: u64,
    pub refused: u64,
    pub decisions: Vec<String>,
}

impl TierStatus {
    /// `key value` lines (the status file's format).
    pub fn to_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .usage
            .iter()
            .zip(&self.hits)
            .map(|(u, hits)| {
                format!(
                    "tier {} {} {} {} {hits}",
                    u.name,
                    u.capacity_bytes.map_or("-".into(), |c| c.to_string()),
                    u.used_bytes,
                    u.chunks
                )
            })
            .collect();
        for (key, value) in [
            ("misses", self.misses),
            ("promotions", self.promotions),
            ("demotions", self.demotions),
            ("evictions", self.evictions),
            ("moved_bytes", self.moved_bytes),
            ("verify_failures", self.verify_failures),
            ("refused", self.refused),
        ] {
            lines.push(format!("{key} {value}"));
        }
        lines.extend(self.decisions.iter().map(|d| format!("decision {d}")));
        lines
    }

    /// Parse [`Self::to_lines`]; `None` if any line is malformed.
    pub fn from_lines(text: &str) -> Option<TierStatus> {
        let mut status = TierStatus {
            usage: Vec::new(),
            hits: Vec::new(),
            misses: 0,
            promotions: 0,
            demotions: 0,
            evictions: 0,
            moved_bytes: 0,
            verify_failures: 0,
            refused: 0,
            decisions: Vec::new(),
        };
        for line in text.lines() {
            let (key, rest) = line.split_once(' ')?;
            let number = || rest.parse::<u64>().ok();
            match key {
                "tier" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    let [name, capacity, used, chunks, hits] = f.as_slice() else {
                        return None;
                    };
                    status.usage.push(TierUsage {
                        name: (*name).to_owned(),
                        capacity_bytes: capacity.parse().ok(),
                        used_bytes: used.parse().ok()?,
                        chunks: chunks.parse().ok()?,
                    });
                    status.hits.push(hits.parse().ok()?);
                }
                "misses" => status.misses = number()?,
                "promotions" => status.promotions = number()?,
                "demotions" => status.demotions = number()?,
                "evictions" => status.evictions = number()?,
                "moved_bytes" => status.moved_bytes = number()?,
                "verify_failures" => status.verify_failures = number()?,
                "refused" => status.refused = number()?,
                "decision" => status.decisions.push(rest.to_owned()),
                _ => return None,
            }
        }
        Some(status)
    }
}

thread_local! {
    /// The store and manifest this thread last read or wrote.
    static LAST_MANIFEST: RefCell<Option<(usize, String)>> = const { RefCell::new(None) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
