//! One subscriber guest as the feed and the HTTP API call it: its
//! [`GuestCell`] serialises the calls, rebuilds a lost instance from the
//! event log (the last compacted base, then every logged batch and
//! state-changing request, in order), compacts the log through the guest,
//! and keeps the guest's back-off and divergence.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use kvwasm_host::KvError;
use kvwasm_host::backoff::Backoff;
use kvwasm_host::deadline::Deadline;
use kvwasm_host::subscriber::{Event, Request, Response, Subscriber};

use crate::log::{Entry, EventLog, RESTORE};

/// An event batch with its log sequence number.
pub(crate) type Batch = (u64, Arc<[Event]>);

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
    pub(crate) batch_events: usize,
    /// This guest keeps the log bounded by dumping itself (the indexer).
    compacts: bool,
    /// Held across rebuilds and calls; a request waits for it no longer
    /// than its own deadline.
    state: parking_lot::Mutex<CellState>,
    backoff: Mutex<Backoff>,
    /// Batches to take from the log rather than the queue (the first did
    /// not fit), and their events; `None` while the queue carries them.
    pub(crate) deferred: Mutex<Option<(RangeInclusive<u64>, usize)>>,
    /// Events were lost to this guest: its state no longer follows the
    /// sources. An API guest answers nothing but `/restore` (and the
    /// registrations) until a `/restore` replaces its state.
    diverged: AtomicBool,
    /// Notified when the guest diverges, or a peer it could be rebuilt
    /// from is registered (the service's rebuild task waits on it).
    rebuild_wanted: tokio::sync::Notify,
}

pub(crate) struct CellState {
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
    pub(crate) fn catch_up(&self) {
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
    pub(crate) fn deliver(&self, items: &[Batch]) {
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

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, CellState> {
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
