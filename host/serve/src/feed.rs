//! The feed: sources → one fan-out task → a bounded queue per guest → one
//! std thread per guest calling `on-batch`.
//!
//! Sources never wait for a guest: the fan-out only appends to the log and
//! offers each batch to each queue. A batch that does not fit a guest's
//! queue (it is full, or the batch is larger than the queue) is deferred:
//! the guest's thread takes it, and every later batch until it catches up,
//! from the log instead, in order and in `on-batch` calls of at most
//! `batch_events`. Only a deferred batch the log no longer holds is lost;
//! the guest is then marked diverged (`/health`, `/metrics`). Every call
//! into a guest (batches from its thread, API requests from
//! `spawn_blocking`) goes through its [`GuestCell`], which first rebuilds a
//! replaced instance from the log.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak, mpsc};

use kvwasm_host::KvError;
use kvwasm_host::backoff::Backoff;
use kvwasm_host::deadline::Deadline;
use kvwasm_host::subscriber::{Event, Request, Response, Subscriber};

use crate::log::{Entry, EventLog, RESTORE};

/// What the feed needs of a subscriber guest; [`Subscriber`] in service,
/// anything in tests.
pub trait Guest: Send + Sync {
    fn name(&self) -> &str;
    /// Whether it answers API requests (exports `http-api`).
    fn serves_http(&self) -> bool;
    /// May rewrite `events` in place ([`Subscriber::on_batch`]).
    fn on_batch(&self, events: &mut [Event]) -> Result<(), KvError>;
    /// Events shared with the log ([`Subscriber::replay`]).
    fn replay(&self, events: &[Event]) -> Result<(), KvError>;
    /// Answer `request` within `deadline`.
    fn handle(&self, request: &Request, deadline: Deadline) -> Result<Response, KvError>;
    /// A fresh deadline for one call (its `call_timeout_ms`).
    fn deadline(&self) -> Deadline;
    /// Changes when the instance was replaced by an empty one.
    fn generation(&self) -> u64;
    /// Whether an instance is running ([`Subscriber::is_live`]).
    fn is_live(&self) -> bool;
    /// Whether calls are refused now ([`Subscriber::backing_off`]).
    fn backing_off(&self) -> bool;
}

impl Guest for Subscriber {
    fn name(&self) -> &str {
        Subscriber::name(self)
    }
    fn serves_http(&self) -> bool {
        Subscriber::serves_http(self)
    }
    fn on_batch(&self, events: &mut [Event]) -> Result<(), KvError> {
        Subscriber::on_batch(self, events)
    }
    fn replay(&self, events: &[Event]) -> Result<(), KvError> {
        Subscriber::replay(self, events)
    }
    fn handle(&self, request: &Request, deadline: Deadline) -> Result<Response, KvError> {
        Subscriber::handle_by(self, request, deadline)
    }
    fn deadline(&self) -> Deadline {
        Subscriber::deadline(self)
    }
    fn generation(&self) -> u64 {
        Subscriber::generation(self)
    }
    fn is_live(&self) -> bool {
        Subscriber::is_live(self)
    }
    fn backing_off(&self) -> bool {
        Subscriber::backing_off(self)
    }
}

/// A rebuild that loses its instance again skips the entry that killed it
/// and starts over, at most this many times.
const REBUILD_ATTEMPTS: usize = 4;

/// Counters of one guest, for `/metrics`.
#[derive(Debug, Default)]
pub struct GuestStats {
    /// Events waiting in its queue.
    pub queued: AtomicUsize,
    pub delivered: AtomicU64,
    /// Events this guest will never get: deferred, then gone from the log.
    pub dropped: AtomicU64,
    /// Events that did not fit its queue, taken from the log instead.
    pub deferred: AtomicU64,
    pub batches: AtomicU64,
    pub batch_errors: AtomicU64,
    pub rebuilds: AtomicU64,
    /// Back-offs started: 3 instances lost in a row (see [`GuestCell`]).
    pub backoffs: AtomicU64,
}

/// One guest, its rebuild state and its counters.
///
/// Its own back-off counts the instances lost in a row between calls that
/// succeed live (a batch delivered, a request answered): the guest's
/// sandbox cannot, as the rebuild after each loss replays calls that
/// succeed. While it refuses, nothing is rebuilt (batches wait in the log)
/// and requests are answered at once.
pub struct GuestCell {
    guest: Arc<dyn Guest>,
    log: Arc<EventLog>,
    pub stats: GuestStats,
    batch_events: usize,
    /// This guest keeps the log bounded by dumping itself (the indexer).
    compacts: bool,
    /// Held across rebuilds and calls; a request waits for it no longer
    /// than its own deadline.
    state: parking_lot::Mutex<CellState>,
    backoff: Mutex<Backoff>,
    /// Batches to take from the log rather than the queue (the first did
    /// not fit), and their events; `None` while the queue carries them.
    deferred: Mutex<Option<(RangeInclusive<u64>, usize)>>,
    /// Events were lost to this guest: its state no longer follows the
    /// sources. An API guest answers nothing but `/restore` (and the
    /// registrations) until a `/restore` replaces its state.
    diverged: AtomicBool,
    /// Notified when the guest diverges, or a peer it could be rebuilt
    /// from is registered (the service's rebuild task waits on it).
    rebuild_wanted: tokio::sync::Notify,
}

struct CellState {
    /// The instance generation the guest's state was built for; `None`
    /// when it holds nothing the log does not (no instance would start).
    generation: Option<u64>,
    /// Event batches the last rebuild replayed (skipped when dequeued).
    replayed: Option<RangeInclusive<u64>>,
    /// The last event batch delivered.
    applied: u64,
    /// Log entries that killed a fresh instance during a rebuild.
    poisoned: HashSet<u64>,
    /// A log base whose restore killed a fresh instance during a rebuild.
    poisoned_base: Option<Weak<Vec<u8>>>,
}

impl GuestCell {
    pub(crate) fn new(
        guest: Arc<dyn Guest>,
        log: Arc<EventLog>,
        batch_events: usize,
        compacts: bool,
    ) -> GuestCell {
        let generation = guest.generation();
        GuestCell {
            guest,
            log,
            stats: GuestStats::default(),
            batch_events,
            compacts,
            state: parking_lot::Mutex::new(CellState {
                generation: Some(generation),
                replayed: None,
                applied: 0,
                poisoned: HashSet::new(),
                poisoned_base: None,
            }),
            deferred: Mutex::default(),
            diverged: AtomicBool::new(false),
            rebuild_wanted: tokio::sync::Notify::new(),
            backoff: Mutex::default(),
        }
    }

    /// An instance was lost (in a live call, or rebuilding).
    fn lost(&self, why: &KvError) {
        let started = self.backoff().lost(why);
        if let Some(started) = started {
            self.stats.backoffs.fetch_add(1, Relaxed);
            started.log(&format!("subscriber {:?}", self.name()));
        }
    }

    /// Whether a call refused now would be: no rebuild is worth trying.
    fn backing_off(&self) -> bool {
        self.backoff().refusing()
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether events were lost to this guest (see [`GuestCell::handle`]).
    pub fn diverged(&self) -> bool {
        self.diverged.load(Relaxed)
    }

    /// Its state no longer follows the sources: refuse answers, and wake
    /// the rebuild.
    pub(crate) fn mark_diverged(&self) {
        self.diverged.store(true, Relaxed);
        self.rebuild_wanted.notify_one();
    }

    /// Wake the rebuild task (a peer was registered).
    pub(crate) fn want_rebuild(&self) {
        self.rebuild_wanted.notify_one();
    }

    /// Until [`GuestCell::mark_diverged`] or [`GuestCell::want_rebuild`]
    /// (at once if one came since the last wait).
    pub(crate) async fn rebuild_wanted(&self) {
        self.rebuild_wanted.notified().await;
    }

    /// Take the deferred batches from the log and deliver them; those the
    /// log no longer holds are lost to this guest, which is marked
    /// diverged.
    fn catch_up(&self) {
        let Some((range, events)) = self
            .deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        match self.log.batches_in(&range) {
            Some(batches) => self.deliver(&batches),
            None => {
                self.stats.dropped.fetch_add(events as u64, Relaxed);
                self.mark_diverged();
                let until = if self.serves_http() {
                    "until it is rebuilt from a peer's /dump or a POST /restore replaces it"
                } else {
                    "until the service restarts (a subscriber without http-api cannot be \
                     restored)"
                };
                kvwasm_host::log_limit::warn(
                    ("diverged", self.name()),
                    format_args!(
                        "subscriber {:?}: {events} events did not fit its queue and the log no \
                         longer holds them (log_events); its state has diverged {until}",
                        self.name()
                    ),
                );
            }
        }
    }

    pub fn name(&self) -> &str {
        self.guest.name()
    }

    pub fn serves_http(&self) -> bool {
        self.guest.serves_http()
    }

    /// Ask the guest's API within the guest's `call_timeout_ms`, counted
    /// from now: waiting for other calls (and a rebuild) uses it up, and
    /// the request is refused when it is gone. An accepted state change is
    /// logged for replay. Refused while no instance would start (a fresh
    /// one would answer from an empty state) and while backing off.
    pub fn handle(&self, request: Request) -> Result<Response, KvError> {
        let deadline = self.guest.deadline();
        self.backoff().check("subscriber", self.name())?;
        if self.diverged() && !is_state_change(&request) {
            return Err(KvError::Unavailable(format!(
                "subscriber {:?} lost events (its queue was full and the log no longer held \
                 them): its answers would be wrong until it is rebuilt from a peer's /dump \
                 (automatically while peers are registered) or a POST /restore replaces its \
                 state",
                self.name()
            )));
        }
        let Some(mut state) = self.state.try_lock_for(deadline.remaining()) else {
            return Err(KvError::Timeout(deadline.budget_ms()));
        };
        if !self.ensure_current(&mut state) {
            return Err(KvError::Unavailable(format!(
                "subscriber {:?} has no running instance; it is rebuilt from the event log \
                 once one starts",
                self.name()
            )));
        }
        if deadline.remaining().is_zero() {
            return Err(KvError::Timeout(deadline.budget_ms()));
        }
        let response = self.guest.handle(&request, deadline);
        match &response {
            Ok(_) => self.backoff().succeeded(),
            Err(e) if !self.holds_state(&state) => {
                state.generation = None;
                self.lost(e);
            }
            Err(_) => {}
        }
        let response = response?;
        if is_logged(&request, response.status) {
            if request.path == RESTORE {
                self.diverged.store(false, Relaxed);
            }
            self.log.push(Entry::Request(Arc::new(request)));
        }
        Ok(response)
    }

    /// Deliver queued batches (in queue order) in `on-batch` calls of at
    /// most `batch_events` events.
    fn deliver(&self, items: &[Batch]) {
        let mut state = self.lock();
        if !self.ensure_current(&mut state) {
            // No instance would start. Every item is in the log: the
            // rebuild replays them once one does.
            return;
        }
        let fresh = items
            .iter()
            .filter(|(seq, _)| !state.replayed.as_ref().is_some_and(|r| r.contains(seq)));
        let mut merged: Vec<Event> = Vec::with_capacity(self.batch_events);
        let mut last = 0;
        let mut current = true;
        'items: for (seq, events) in fresh {
            for chunk in events.chunks(self.batch_events) {
                if merged.len() + chunk.len() > self.batch_events {
                    current = self.call_on_batch(&mut merged, &state);
                    if !current {
                        break 'items;
                    }
                }
                merged.extend_from_slice(chunk);
            }
            last = *seq;
        }
        if current {
            current = self.call_on_batch(&mut merged, &state);
        }
        if !current {
            // Lost mid-delivery, or no instance would start: every item is
            // in the log, so the rebuild replays them all (and no later
            // batch reaches a fresh instance before it).
            state.generation = None;
            self.ensure_current(&mut state);
            return;
        }
        state.applied = state.applied.max(last);
        if self.compacts && self.log.over_limit() {
            self.compact(&state);
        }
    }

    /// Deliver `merged` (then empty it). `false` when the guest's state is
    /// no longer the one `state` was built for: the instance was lost, or
    /// none would start.
    fn call_on_batch(&self, merged: &mut Vec<Event>, state: &CellState) -> bool {
        if merged.is_empty() {
            return true;
        }
        self.stats.batches.fetch_add(1, Relaxed);
        self.stats.delivered.fetch_add(merged.len() as u64, Relaxed);
        let result = self.guest.on_batch(merged);
        merged.clear();
        if let Err(e) = result {
            self.stats.batch_errors.fetch_add(1, Relaxed);
            kvwasm_host::log_limit::warn(
                ("on-batch failed", self.name()),
                format_args!("subscriber {:?}: on-batch failed: {e}", self.name()),
            );
            let holds = self.holds_state(state);
            if !holds {
                self.lost(&e);
            }
            return holds;
        }
        self.backoff().succeeded();
        true
    }

    /// Whether the instance still holds the state `state` was built for:
    /// it runs, and it is the generation that was built. After a failed
    /// call, no instance with the same generation means its start failed.
    fn holds_state(&self, state: &CellState) -> bool {
        self.guest.is_live() && state.generation == Some(self.guest.generation())
    }

    /// Replace the log's oldest events by the guest's own `/dump`.
    fn compact(&self, state: &CellState) {
        let dump = request("GET", "/dump", Vec::new());
        let why = match self.guest.handle(&dump, self.guest.deadline()) {
            Ok(r) if r.status == 200 => return self.log.compact(r.body, state.applied),
            Ok(r) => format!("answered {}", r.status),
            Err(e) => format!("failed: {e}"),
        };
        kvwasm_host::log_limit::warn(
            ("compacting", self.name()),
            format_args!(
                "subscriber {:?}: /dump {why} while compacting the log",
                self.name()
            ),
        );
    }

    /// If the instance was replaced since the guest's state was built (or
    /// the state was lost with it), replay the log into a new one. `false`
    /// when no instance would start (its start failed, or calls back off
    /// after repeated losses): the guest holds nothing, and the next call
    /// tries again.
    fn ensure_current(&self, state: &mut CellState) -> bool {
        for _ in 0..REBUILD_ATTEMPTS {
            let generation = self.guest.generation();
            if state.generation == Some(generation) {
                return true;
            }
            if self.backing_off() || (!self.guest.is_live() && self.guest.backing_off()) {
                // The start, or the call after it, would be refused: not
                // worth a snapshot.
                state.generation = None;
                return false;
            }
            let snapshot = self.log.snapshot();
            state.replayed = snapshot.covers();
            let base = snapshot.base.as_ref().filter(|base| {
                !state
                    .poisoned_base
                    .as_ref()
                    .is_some_and(|p| p.ptr_eq(&Arc::downgrade(base)))
            });
            match self.rebuild(base, &snapshot, &state.poisoned, generation) {
                Rebuilt::Done => {
                    state.generation = Some(generation);
                    return true;
                }
                Rebuilt::Killed(Some(seq), why) => {
                    kvwasm_host::log_limit::warn(
                        ("poisoned log entry", self.name()),
                        format_args!(
                            "subscriber {:?}: log entry {seq} lost the instance again; \
                             skipping it",
                            self.name()
                        ),
                    );
                    self.lost(&why);
                    state.poisoned.insert(seq);
                }
                Rebuilt::Killed(None, why) => {
                    kvwasm_host::log_limit::warn(
                        ("poisoned log base", self.name()),
                        format_args!(
                            "subscriber {:?}: restoring the log's base lost the instance \
                             again; replaying without it",
                            self.name()
                        ),
                    );
                    self.lost(&why);
                    state.poisoned_base = base.map(Arc::downgrade);
                }
                Rebuilt::NoInstance => {
                    state.generation = None;
                    return false;
                }
            }
        }
        kvwasm_host::log_limit::warn(
            ("rebuild gave up", self.name()),
            format_args!(
                "subscriber {:?}: gave up rebuilding after {REBUILD_ATTEMPTS} attempts",
                self.name()
            ),
        );
        state.generation = Some(self.guest.generation());
        true
    }

    /// Restore `base`, then replay `snapshot`'s entries (but the
    /// `poisoned` ones) into the instance, which is at `generation` or not
    /// yet started.
    fn rebuild(
        &self,
        base: Option<&Arc<Vec<u8>>>,
        snapshot: &crate::log::Snapshot,
        poisoned: &HashSet<u64>,
        generation: u64,
    ) -> Rebuilt {
        self.stats.rebuilds.fetch_add(1, Relaxed);
        kvwasm_host::log_limit::warn(
            ("rebuilding", self.name()),
            format_args!(
                "subscriber {:?}: rebuilding a replaced instance from the log ({} entries)",
                self.name(),
                snapshot.entries.len()
            ),
        );
        // After a failed call: the instance was lost (`Killed`), none would
        // start (`NoInstance`), or the guest refused and lives on (`None`).
        let gone = |why: KvError| {
            if self.guest.generation() != generation {
                Some(Rebuilt::Killed(None, why))
            } else if !self.guest.is_live() {
                Some(Rebuilt::NoInstance)
            } else {
                None
            }
        };
        let http = self.guest.serves_http();
        if http && let Some(base) = base {
            let restore = request("POST", RESTORE, base.to_vec());
            if let Err(e) = self.guest.handle(&restore, self.guest.deadline()) {
                kvwasm_host::log_limit::warn(
                    ("restoring the log's base", self.name()),
                    format_args!(
                        "subscriber {:?}: restoring the log's base: {e}",
                        self.name()
                    ),
                );
                if let Some(gone) = gone(e) {
                    return gone;
                }
            }
        }
        let entries = snapshot
            .entries
            .iter()
            .filter(|(seq, _)| !poisoned.contains(seq));
        for (seq, entry) in entries {
            let result = match entry {
                Entry::Events(events) => events
                    .chunks(self.batch_events)
                    .try_for_each(|chunk| self.guest.replay(chunk)),
                Entry::Request(r) if http => self.guest.handle(r, self.guest.deadline()).map(drop),
                Entry::Request(_) => Ok(()),
            };
            if let Err(e) = result {
                match gone(e) {
                    Some(Rebuilt::Killed(_, why)) => return Rebuilt::Killed(Some(*seq), why),
                    Some(gone) => return gone,
                    None => {}
                }
            }
        }
        Rebuilt::Done
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, CellState> {
        self.state.lock()
    }
}

/// How a rebuild ended.
enum Rebuilt {
    /// Every entry was offered to the instance.
    Done,
    /// The instance was lost (why), replaying the entry given (`None`:
    /// restoring the base).
    Killed(Option<u64>, KvError),
    /// No instance would start.
    NoInstance,
}

/// State-changing API calls, replayed into a replaced instance.
fn is_logged(request: &Request, status: u16) -> bool {
    is_state_change(request) && (200..300).contains(&status)
}

fn is_state_change(request: &Request) -> bool {
    request.method == "POST"
        && matches!(request.path.as_str(), "/register" | "/unregister" | RESTORE)
}

pub(crate) fn request(method: &str, path: &str, body: Vec<u8>) -> Request {
    Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        body,
    }
}

/// An event batch with its log sequence number.
type Batch = (u64, Arc<[Event]>);

/// What a guest's queue carries.
pub(crate) enum Queued {
    Batch(Batch),
    /// Batches were deferred: take them from the log.
    FromLog,
}

/// The queues and the threads draining them.
pub(crate) struct Feed {
    pub cells: Vec<Arc<GuestCell>>,
    queues: Vec<mpsc::Sender<Queued>>,
    queue_events: usize,
    pub log: Arc<EventLog>,
    pub events_in: AtomicU64,
}

impl Feed {
    /// Cells for `guests` (the API guest, if any, first: it compacts the
    /// log) and their queues; the threads start with [`Feed::start`].
    pub fn new(
        guests: Vec<Arc<dyn Guest>>,
        settings: &crate::ServeConfig,
    ) -> (Feed, Vec<mpsc::Receiver<Queued>>) {
        let compacted = guests.first().is_some_and(|g| g.serves_http());
        let log = Arc::new(EventLog::new(settings.log_events, compacted));
        let mut cells = Vec::new();
        let mut queues = Vec::new();
        let mut receivers = Vec::new();
        for (i, guest) in guests.into_iter().enumerate() {
            let compacts = i == 0 && compacted;
            cells.push(Arc::new(GuestCell::new(
                guest,
                log.clone(),
                settings.batch_events,
                compacts,
            )));
            let (tx, rx) = mpsc::channel();
            queues.push(tx);
            receivers.push(rx);
        }
        let feed = Feed {
            cells,
            queues,
            queue_events: settings.queue_events,
            log,
            events_in: AtomicU64::new(0),
        };
        (feed, receivers)
    }

    /// Log `events` and offer them to every guest's queue.
    pub fn fan_out(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let n = events.len();
        self.events_in.fetch_add(n as u64, Relaxed);
        let events: Arc<[Event]> = events.into();
        let seq = self.log.push(Entry::Events(events.clone()));
        for (cell, queue) in self.cells.iter().zip(&self.queues) {
            // Held while queueing: the guest's thread takes the deferred
            // range under it, so no batch overtakes one deferred before it.
            let mut deferred = cell.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((range, events)) = deferred.as_mut() {
                *range = *range.start()..=seq;
                *events += n;
                cell.stats.deferred.fetch_add(n as u64, Relaxed);
                continue;
            }
            let queued = &cell.stats.queued;
            let admitted = queued
                .fetch_update(Relaxed, Relaxed, |q| {
                    (q + n <= self.queue_events).then_some(q + n)
                })
                .is_ok();
            let sent = if admitted {
                queue.send(Queued::Batch((seq, events.clone())))
            } else {
                *deferred = Some((seq..=seq, n));
                cell.stats.deferred.fetch_add(n as u64, Relaxed);
                queue.send(Queued::FromLog)
            };
            if sent.is_err() {
                // The guest's thread is gone (the service is stopping).
                if admitted {
                    queued.fetch_sub(n, Relaxed);
                }
                cell.stats.dropped.fetch_add(n as u64, Relaxed);
            }
        }
    }

    /// One thread per guest draining its queue.
    pub fn start(&self, receivers: Vec<mpsc::Receiver<Queued>>) -> anyhow::Result<()> {
        for (cell, rx) in self.cells.iter().zip(receivers) {
            let cell = cell.clone();
            std::thread::Builder::new()
                .name(format!("kvwasm-feed-{}", cell.name()))
                .spawn(move || drain(&cell, &rx))?;
        }
        Ok(())
    }
}

/// Take whatever is queued (up to about a batch), deliver it, repeat until
/// the feed is gone. Deferred batches are taken from the log in their turn.
fn drain(cell: &GuestCell, rx: &mpsc::Receiver<Queued>) {
    let mut next = rx.recv().ok();
    while let Some(first) = next.take() {
        let mut items = Vec::new();
        let mut taken = 0;
        let mut item = Some(first);
        while let Some(Queued::Batch(batch)) = item {
            taken += batch.1.len();
            items.push(batch);
            item = None;
            if taken < cell.batch_events {
                item = rx.try_recv().ok();
            }
        }
        cell.stats.queued.fetch_sub(taken, Relaxed);
        if !items.is_empty() {
            cell.deliver(&items);
        }
        if let Some(Queued::FromLog) = item {
            cell.catch_up();
        }
        next = rx.recv().ok();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The feed against an in-memory guest that can be made to lose its
    //! instance, like a trapping guest.

    use super::*;
    use kvwasm_host::subscriber::{EventData, SourceKind};
    use std::time::{Duration, Instant};

    /// Keeps the ids of the events it was given and the registrations;
    /// `/dump` and `/restore` move the ids as JSON. Any batch holding an
    /// event with id `TRAP` loses the instance while `traps` > 0; so does
    /// a request with body `trap`, and one with body `hang` waits for
    /// `hang` first. After a loss, the next `failed_starts` calls fail
    /// without an instance, as when a start traps or calls back off.
    #[derive(Default)]
    pub(crate) struct Recorder {
        pub state: Mutex<(u64, Vec<u64>, Vec<String>)>,
        pub batch_sizes: Mutex<Vec<usize>>,
        pub traps: AtomicUsize,
        /// `POST /restore` calls still to lose the instance.
        pub restore_traps: AtomicUsize,
        pub failed_starts: AtomicUsize,
        /// What `backing_off` answers, and how often it was asked.
        pub backing_off: std::sync::atomic::AtomicBool,
        pub backing_off_asked: AtomicUsize,
        /// No instance is running (after a loss, until a start succeeds).
        pub down: std::sync::atomic::AtomicBool,
        pub gate: Mutex<()>,
        pub hang: Mutex<()>,
        /// Requests handled (replays included) and hanging now.
        pub handled: AtomicUsize,
        pub hanging: AtomicUsize,
        /// Each call's deadline; 0: 10 s.
        pub timeout_ms: AtomicU64,
    }

    pub(crate) const TRAP: u64 = 666;

    impl Recorder {
        pub fn ids(&self) -> Vec<u64> {
            self.state.lock().unwrap().1.clone()
        }
        fn lose(&self) -> KvError {
            let mut s = self.state.lock().unwrap();
            *s = (s.0 + 1, Vec::new(), Vec::new());
            self.down.store(true, Relaxed);
            KvError::Trapped("unreachable".into())
        }
        /// Start an instance if none is running, unless this start fails.
        fn start(&self) -> Result<(), KvError> {
            if self.down.load(Relaxed) {
                if take_one(&self.failed_starts) {
                    return Err(KvError::Trapped("the start trapped".into()));
                }
                self.down.store(false, Relaxed);
            }
            Ok(())
        }
    }

    /// Decrement `count` if it is above zero; whether it was.
    fn take_one(count: &AtomicUsize) -> bool {
        count
            .fetch_update(Relaxed, Relaxed, |t| t.checked_sub(1))
            .is_ok()
    }

    impl Guest for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn serves_http(&self) -> bool {
            true
        }
        fn on_batch(&self, events: &mut [Event]) -> Result<(), KvError> {
            self.replay(events)
        }
        fn replay(&self, events: &[Event]) -> Result<(), KvError> {
            let _gate = self.gate.lock().unwrap();
            self.start()?;
            if events.iter().any(|e| e.event_id == TRAP) && take_one(&self.traps) {
                return Err(self.lose());
            }
            self.batch_sizes.lock().unwrap().push(events.len());
            let mut s = self.state.lock().unwrap();
            s.1.extend(events.iter().map(|e| e.event_id));
            Ok(())
        }
        fn handle(&self, r: &Request, _deadline: Deadline) -> Result<Response, KvError> {
            self.handled.fetch_add(1, Relaxed);
            self.start()?;
            let body = String::from_utf8_lossy(&r.body).into_owned();
            if body == "hang" {
                self.hanging.fetch_add(1, Relaxed);
                drop(self.hang.lock().unwrap());
                self.hanging.fetch_sub(1, Relaxed);
            }
            if body == "trap" || (r.path == "/restore" && take_one(&self.restore_traps)) {
                return Err(self.lose());
            }
            let mut s = self.state.lock().unwrap();
            let (status, body) = match (r.method.as_str(), r.path.as_str()) {
                ("POST", "/register") if s.2.contains(&body) => {
                    (409, "{\"error\": \"dup\"}".into())
                }
                ("POST", "/register") => {
                    s.2.push(body);
                    (201, "{}".into())
                }
                ("GET", "/dump") => (200, serde_json::to_string(&s.1).unwrap()),
                ("POST", "/restore") => {
                    s.1 = serde_json::from_str(&body).unwrap();
                    (200, "{}".into())
                }
                ("GET", "/query") => (200, serde_json::to_string(&(&s.1, &s.2)).unwrap()),
                _ => (404, "{\"error\": \"no\"}".into()),
            };
            Ok(Response {
                status,
                content_type: None,
                body: body.into_bytes(),
            })
        }
        fn deadline(&self) -> Deadline {
            match self.timeout_ms.load(Relaxed) {
                0 => Deadline::after_ms(10_000),
                ms => Deadline::after_ms(ms),
            }
        }
        fn generation(&self) -> u64 {
            self.state.lock().unwrap().0
        }
        fn is_live(&self) -> bool {
            !self.down.load(Relaxed)
        }
        fn backing_off(&self) -> bool {
            self.backing_off_asked.fetch_add(1, Relaxed);
            self.backing_off.load(Relaxed)
        }
    }

    pub(crate) fn events(ids: impl IntoIterator<Item = u64>) -> Vec<Event> {
        ids.into_iter()
            .map(|event_id| Event {
                worker_id: 1,
                dp_rank: 0,
                event_id,
                source: SourceKind::Zmq,
                model: None,
                tenant: None,
                data: EventData::Cleared,
            })
            .collect()
    }

    fn settings(queue_events: usize, batch_events: usize, log_events: usize) -> crate::ServeConfig {
        crate::ServeConfig {
            queue_events,
            batch_events,
            log_events,
            ..Default::default()
        }
    }

    pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A started feed of one recorder that registered `w1`, its log
    /// bounded by `log_events`.
    fn registered(log_events: usize) -> (Arc<Recorder>, Feed, Arc<GuestCell>) {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, log_events));
        let cell = feed.cells[0].clone();
        cell.handle(request("POST", "/register", b"w1".to_vec()))
            .unwrap();
        feed.start(rx).unwrap();
        (guest, feed, cell)
    }

    /// What `/query` answers: the event ids and the registered workers.
    fn query(cell: &GuestCell) -> (Vec<u64>, Vec<String>) {
        let query = cell.handle(request("GET", "/query", Vec::new())).unwrap();
        serde_json::from_slice(&query.body).unwrap()
    }

    #[test]
    fn batches_are_merged_up_to_batch_events_and_a_full_queue_defers_to_the_log() {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(10, 4, 1000));
        // Not started: the queue fills up to 10 events; the batch that does
        // not fit, and every one after it (even one that would), are
        // deferred to the log.
        feed.fan_out(events(0..3));
        feed.fan_out(events(3..9));
        feed.fan_out(events(9..12));
        feed.fan_out(events(12..13));
        let stats = &feed.cells[0].stats;
        assert_eq!(stats.queued.load(Relaxed), 9);
        assert_eq!(stats.deferred.load(Relaxed), 4);
        feed.start(rx).unwrap();
        wait_for("delivery", || guest.ids().len() == 13);
        assert_eq!(
            guest.ids(),
            (0..13).collect::<Vec<_>>(),
            "each once, in order"
        );
        let sizes = guest.batch_sizes.lock().unwrap().clone();
        assert!(sizes.iter().all(|&s| s <= 4), "{sizes:?}");
        assert_eq!(feed.events_in.load(Relaxed), 13);
        assert_eq!(stats.queued.load(Relaxed), 0);
        assert_eq!(stats.dropped.load(Relaxed), 0);
        assert!(!feed.cells[0].diverged());
        // Queued again once caught up.
        feed.fan_out(events(13..14));
        wait_for("a queued batch", || guest.ids().len() == 14);
        assert_eq!(stats.deferred.load(Relaxed), 4);
    }

    /// A batch larger than the whole queue is delivered from the log in
    /// `batch_events` calls, and replayed the same way.
    #[test]
    fn a_batch_larger_than_the_queue_is_delivered_in_full_in_bounded_calls() {
        let (guest, feed, cell) = registered(1_000_000);
        let big = 80_000;
        feed.fan_out(events(0..big));
        feed.fan_out(events([big]));
        wait_for("delivery", || guest.ids().len() == big as usize + 1);
        assert_eq!(guest.ids(), (0..=big).collect::<Vec<_>>());
        assert_eq!(cell.stats.dropped.load(Relaxed), 0);
        // The last batch is deferred too unless the catch-up came first.
        assert!(cell.stats.deferred.load(Relaxed) >= big);
        let max_call = |g: &Recorder| g.batch_sizes.lock().unwrap().iter().copied().max();
        assert_eq!(max_call(&guest), Some(100));
        // The rebuild replays it in calls of the same size.
        guest.batch_sizes.lock().unwrap().clear();
        assert!(
            cell.handle(request("POST", "/x", b"trap".to_vec()))
                .is_err()
        );
        let (ids, _) = query(&cell);
        assert_eq!(ids.len(), big as usize + 1);
        assert_eq!(max_call(&guest), Some(100));
    }

    /// Deferred batches that the log dropped before the guest took them
    /// are lost to it: counted, and the guest is marked diverged (its
    /// API refuses) until a `/restore` replaces its state.
    #[test]
    fn deferred_batches_gone_from_the_log_mark_the_guest_diverged() {
        let guest = Arc::new(Recorder::default());
        // The recorder serves http, so the log holds up to 2 × 4 events
        // before it drops its oldest batches.
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(2, 100, 4));
        let cell = feed.cells[0].clone();
        feed.fan_out(events(0..2));
        feed.fan_out(events(2..7));
        feed.fan_out(events(7..11));
        assert_eq!(cell.stats.deferred.load(Relaxed), 9);
        feed.start(rx).unwrap();
        wait_for("the loss", || cell.diverged());
        assert_eq!(cell.stats.dropped.load(Relaxed), 9);
        match cell.handle(request("GET", "/query", Vec::new())) {
            Err(KvError::Unavailable(why)) => assert!(why.contains("lost events"), "{why}"),
            other => panic!("expected a refusal while diverged, got {other:?}"),
        }
        let restored = cell
            .handle(request("POST", RESTORE, b"[42]".to_vec()))
            .unwrap();
        assert_eq!(restored.status, 200);
        assert!(!cell.diverged());
        assert_eq!(query(&cell).0, [42]);
    }

    #[test]
    fn a_lost_instance_is_rebuilt_from_the_log_with_requests_in_order() {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, 1000));
        let cell = feed.cells[0].clone();
        assert_eq!(
            cell.handle(request("POST", "/register", b"w1".to_vec()))
                .unwrap()
                .status,
            201
        );
        // Refused: not logged.
        assert_eq!(
            cell.handle(request("POST", "/register", b"w1".to_vec()))
                .unwrap()
                .status,
            409
        );
        feed.start(rx).unwrap();
        feed.fan_out(events(0..5));
        wait_for("first batch", || guest.ids().len() == 5);
        guest.traps.store(1, Relaxed);
        feed.fan_out(events([5, TRAP, 7]));
        feed.fan_out(events(8..10));
        wait_for("rebuild", || {
            cell.stats.rebuilds.load(Relaxed) == 1 && guest.ids().len() == 10
        });
        let (ids, workers) = query(&cell);
        assert_eq!(
            ids,
            [0, 1, 2, 3, 4, 5, TRAP, 7, 8, 9],
            "each event exactly once"
        );
        assert_eq!(workers, ["w1"]);
        assert_eq!(guest.generation(), 1);
    }

    #[test]
    fn an_entry_that_kills_every_instance_is_skipped_on_rebuild() {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, 1000));
        feed.start(rx).unwrap();
        guest.traps.store(2, Relaxed);
        feed.fan_out(events([1, TRAP]));
        feed.fan_out(events([3]));
        wait_for("rebuild", || guest.ids() == [3]);
        let cell = &feed.cells[0];
        assert_eq!(cell.stats.rebuilds.load(Relaxed), 2);
        assert_eq!(guest.generation(), 2);
    }

    /// A rebuild whose instance will not start (its start traps, or calls
    /// back off) stops and is tried again later: no entry is skipped, no
    /// batch reaches a fresh instance ahead of the log, and the API refuses
    /// rather than answer from an empty state.
    #[test]
    fn a_rebuild_whose_instance_will_not_start_is_retried_not_skipped() {
        let (guest, feed, cell) = registered(1000);
        feed.fan_out(events(0..3));
        wait_for("first batch", || guest.ids().len() == 3);
        // The batch holding TRAP loses the instance; the next three starts
        // fail, then one succeeds.
        guest.traps.store(1, Relaxed);
        guest.failed_starts.store(3, Relaxed);
        feed.fan_out(events([3, TRAP]));
        wait_for("the failed rebuild", || {
            guest.failed_starts.load(Relaxed) == 2
        });
        match cell.handle(request("GET", "/query", Vec::new())) {
            Err(KvError::Unavailable(why)) => assert!(why.contains("no running instance"), "{why}"),
            other => panic!("expected a refusal while no instance starts, got {other:?}"),
        }
        assert_eq!(guest.failed_starts.load(Relaxed), 1);
        // While the guest backs off, a batch is not even worth a rebuild.
        guest.backing_off.store(true, Relaxed);
        let rebuilds = cell.stats.rebuilds.load(Relaxed);
        let asked = guest.backing_off_asked.load(Relaxed);
        feed.fan_out(events([5]));
        wait_for("the back-off consulted", || {
            guest.backing_off_asked.load(Relaxed) > asked
        });
        drop(cell.lock());
        assert_eq!(cell.stats.rebuilds.load(Relaxed), rebuilds);
        assert_eq!(guest.failed_starts.load(Relaxed), 1, "no start was tried");
        guest.backing_off.store(false, Relaxed);
        // This batch's rebuild fails to start too; it waits in the log.
        feed.fan_out(events([6]));
        wait_for("the last failed start", || {
            guest.failed_starts.load(Relaxed) == 0
        });
        feed.fan_out(events([7]));
        wait_for("the rebuild", || guest.ids().len() == 8);
        let (ids, workers) = query(&cell);
        assert_eq!(
            ids,
            [0, 1, 2, 3, TRAP, 5, 6, 7],
            "each event exactly once, in order"
        );
        assert_eq!(
            workers,
            ["w1"],
            "the registration was replayed, not skipped"
        );
    }

    /// A log base whose restore kills every fresh instance is skipped like
    /// a poisoned entry: the rebuild goes on with what the log holds after
    /// it.
    #[test]
    fn a_base_that_kills_every_instance_is_skipped_on_rebuild() {
        let (guest, feed, cell) = registered(4);
        feed.fan_out(events(0..3));
        feed.fan_out(events(3..6));
        wait_for("compaction", || feed.log.events() == 0);
        feed.fan_out(events(6..8));
        wait_for("later events", || guest.ids().len() == 8);
        guest.restore_traps.store(usize::MAX, Relaxed);
        assert!(
            cell.handle(request("POST", "/x", b"trap".to_vec()))
                .is_err()
        );
        let (ids, workers) = query(&cell);
        assert_eq!(ids, [6, 7], "the events after the base");
        assert_eq!(workers, ["w1"]);
        assert_eq!(cell.stats.rebuilds.load(Relaxed), 2);
    }

    #[test]
    fn past_log_events_the_log_is_compacted_into_a_dump_and_replay_restores_it() {
        let (guest, feed, cell) = registered(4);
        feed.fan_out(events(0..3));
        wait_for("first", || guest.ids().len() == 3);
        feed.fan_out(events(3..6));
        wait_for("second", || guest.ids().len() == 6);
        wait_for("compaction", || feed.log.events() == 0);
        feed.fan_out(events(6..8));
        wait_for("third", || guest.ids().len() == 8);
        assert_eq!(feed.log.events(), 2);
        // Lose the instance through the API: the next call rebuilds it from
        // the base dump, the registration and the later events.
        assert!(
            cell.handle(request("POST", "/x", b"trap".to_vec()))
                .is_err()
        );
        let (ids, workers) = query(&cell);
        assert_eq!(ids, (0..8).collect::<Vec<_>>());
        assert_eq!(workers, ["w1"]);
    }

    /// Requests queued behind a call that hangs give up at their own
    /// deadline: they are answered while the hung call still holds the
    /// guest (no verdict depends on how long anything took).
    #[test]
    fn requests_waiting_behind_a_hung_call_give_up_at_their_own_deadline() {
        let guest = Arc::new(Recorder::default());
        guest.timeout_ms.store(200, Relaxed);
        let (feed, _rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, 1000));
        let cell = feed.cells[0].clone();
        let hang = guest.hang.lock().unwrap();
        let hung = {
            let cell = cell.clone();
            std::thread::spawn(move || cell.handle(request("GET", "/query", b"hang".to_vec())))
        };
        wait_for("the hung call", || guest.hanging.load(Relaxed) == 1);
        let waiting: Vec<_> = (0..20)
            .map(|_| {
                let cell = cell.clone();
                std::thread::spawn(move || cell.handle(request("GET", "/query", Vec::new())))
            })
            .collect();
        for waiter in waiting {
            match waiter.join().unwrap() {
                Err(KvError::Timeout(200)) => {}
                other => panic!("expected a refusal at the deadline, got {other:?}"),
            }
        }
        assert_eq!(
            guest.hanging.load(Relaxed),
            1,
            "still hung when all were answered"
        );
        assert_eq!(
            guest.handled.load(Relaxed),
            1,
            "no waiter reached the guest"
        );
        drop(hang);
        assert_eq!(hung.join().unwrap().unwrap().status, 200);
    }

    /// A guest that loses its instance in every `on-batch` backs off after
    /// 3 losses, although each rebuild replays a `/register` that succeeds;
    /// while it backs off, nothing is rebuilt.
    #[test]
    fn batches_losing_every_instance_start_the_back_off_within_3_losses() {
        let (guest, feed, cell) = registered(1000);
        guest.traps.store(usize::MAX, Relaxed);
        // Lost live (1), and again replaying it (2): skipped.
        feed.fan_out(events([TRAP]));
        wait_for("the rebuild", || cell.stats.rebuilds.load(Relaxed) == 2);
        assert_eq!(cell.stats.backoffs.load(Relaxed), 0);
        // Lost live (3): the back-off starts. (Had its window passed
        // before the rebuild was tried, on a slow machine, that rebuild
        // loses one more instance, which starts one more back-off.)
        feed.fan_out(events([TRAP]));
        wait_for("the back-off", || cell.stats.backoffs.load(Relaxed) >= 1);
        drop(cell.lock());
        assert_eq!(
            guest.generation(),
            cell.stats.backoffs.load(Relaxed) + 2,
            "every loss from the 3rd in a row starts a back-off"
        );
    }

    /// The same for requests that lose the instance (a `/query` that
    /// traps), each after a rebuild replaying the registration.
    #[test]
    fn requests_losing_every_instance_start_the_back_off_within_3_losses() {
        let (guest, _feed, cell) = registered(1000);
        for _ in 0..3 {
            assert!(
                cell.handle(request("GET", "/query", b"trap".to_vec()))
                    .is_err()
            );
        }
        assert_eq!(cell.stats.backoffs.load(Relaxed), 1);
        assert_eq!(guest.generation(), 3);
        assert_eq!(
            cell.stats.rebuilds.load(Relaxed),
            2,
            "one per loss after the first"
        );
    }
}
