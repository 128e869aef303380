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
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak, mpsc};
use std::time::{Duration, Instant};

use super::advisor::{Advisor, AdvisorLoop, AdvisorStatus};
use super::config::TieredConfig;
use super::contract::{Access, AccessKind, Action, AdviceSink};
use super::fs_tier::FsTier;
use crate::error::KvError;
use crate::handle::{ChunkTiers, StoreHandle, open_shared};
use crate::metrics::{TierGauges, TierMetrics};
use crate::payload::Taken;

mod advice;
mod index;
mod moves;

use super::status::TierStatus;
pub use advice::MAX_ADVISED_HASHES;
use advice::Rate;
use index::{Index, Unflushed};

/// Longest manifest name attributed to access records.
const MAX_NOTED_NAME: usize = 255;
/// Access records kept for the advisor before the oldest are dropped.
const MAX_ACCESSES: usize = 1 << 16;
/// Decisions kept for `kvwasm tier status`.
const MAX_DECISIONS: usize = 32;
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
struct Front {
    store: Arc<TieredStore>,
    /// The advisor loop, when the entry names an advisor: ended first.
    advisor: Option<AdvisorLoop>,
    /// Dropped first: wakes the demoter to end it.
    stop: Option<mpsc::Sender<()>>,
    demoter: Option<std::thread::JoinHandle<()>>,
}

impl Front {
    fn store(&self) -> &Arc<TieredStore> {
        &self.store
    }

    /// The advisor loop's counters and last round, if the store has one.
    fn advisor_status(&self) -> Option<AdvisorStatus> {
        self.advisor.as_ref().map(AdvisorLoop::status)
    }

    /// Run an advisor round now (observe, advise, apply); false without an
    /// advisor.
    fn advisor_round(&self) -> bool {
        self.advisor.as_ref().map(AdvisorLoop::round).is_some()
    }
}

impl ChunkTiers for Front {
    fn put_chunk(&self, hash: &[u8], data: &[u8]) -> Result<bool, KvError> {
        self.store.put_chunk(hash, data)
    }

    fn get_chunk(&self, hash: &[u8]) -> Result<Taken, KvError> {
        self.store.get_chunk(hash)
    }

    fn prefetch_chunks(&self, hashes: &[Vec<u8>]) -> Result<(), KvError> {
        self.store.prefetch_chunks(hashes)
    }

    fn note_manifest(&self, name: &str) {
        self.store.note_manifest(name)
    }

    fn flush(&self) -> Result<(), KvError> {
        self.store.flush()
    }
}

/// What a consumer's handle tells of the tiered store behind it.
impl StoreHandle {
    fn front(&self) -> Option<&Front> {
        let tiers: &dyn std::any::Any = self.tiers()?;
        tiers.downcast_ref()
    }

    /// The tiered store behind this handle, if it is one.
    pub fn tiered(&self) -> Option<&Arc<TieredStore>> {
        self.front().map(Front::store)
    }

    /// A tiered store's advisor loop: its counters and last round (`None`
    /// without an advisor).
    pub fn advisor_status(&self) -> Option<AdvisorStatus> {
        self.front().and_then(Front::advisor_status)
    }

    /// Run a tiered store's advisor round now (observe, advise, apply);
    /// false without an advisor.
    pub fn advisor_round(&self) -> bool {
        self.front().is_some_and(Front::advisor_round)
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
        let mut index = Index::new(n);
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

    /// The chunk from the first tier that has it (into this thread's
    /// `get_chunk_into` target, if one is set and the tier reads it there).
    pub(crate) fn get_chunk(&self, hash: &[u8]) -> Result<Taken, KvError> {
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
                match self.tiers[t].handle.get_chunk_taken(hash) {
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

thread_local! {
    /// The store and manifest this thread last read or wrote.
    static LAST_MANIFEST: RefCell<Option<(usize, String)>> = const { RefCell::new(None) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
