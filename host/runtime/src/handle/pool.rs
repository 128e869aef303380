//! The instances serving one handle.
//!
//! A guest instance runs one call at a time, so a handle keeps a small pool
//! and hands each call an idle instance, starting a new one while the pool
//! may grow. Every wait (for an idle instance, for the manifest turn, for
//! an instance another thread is using) is bounded by the waiting call's
//! [`Deadline`]. An instance always comes back through [`CheckedOut`]:
//! returned to the pool with its bookkeeping, or retired when lost.
//!
//! An instance left idle past its backend's `idle_release_ms` holding no
//! unflushed puts may be released ([`Pool::release_idle`], called by the
//! [`super::reaper`]), except the last one of a warm handle; the next call
//! that finds no idle instance starts one as any growing pool does. On a
//! warm handle's pool an instance is kept, or used again after an idle
//! gap, only while its store's directories are the ones it opened
//! ([`Warm::dirs`]); otherwise it goes as if released.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::durability::Durability;
use crate::backoff::Backoff;
use crate::capabilities::in_place::{FoundInPlace, InUse};
use crate::capabilities::store_dirs::StoreDirs;
use crate::deadline::Deadline;
use crate::engine::{ticks, ticks_in};
use crate::error::KvError;
use crate::instance::{Instance, Outcome};
use crate::metrics::BackendMetrics;

/// What a call did, for the durability bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CallKind {
    /// Changes nothing the handle tracks (gets, deletes, prefetches).
    Other,
    /// `put_chunk`: on success the instance may hold the chunk unflushed.
    Put,
    /// `flush` or `put_manifest`: on success everything the instance
    /// accepted is durable.
    Flush,
}

pub(super) struct Pool {
    state: Mutex<PoolState>,
    /// Signalled whenever an instance comes back or leaves, and when a
    /// manifest turn ends.
    changed: Condvar,
    max_instances: usize,
    /// `backend/namespace`, for log lines.
    label: String,
    /// When idle instances may be released (`None`: never).
    release: Option<Release>,
    /// Directories the host keeps open for this store's lookups, closed
    /// when no pool on the store has an instance.
    in_place: Option<Arc<FoundInPlace>>,
}

/// How a pool releases idle instances.
pub(super) struct Release {
    /// Idle time after which an instance may be released.
    pub(super) after: Duration,
    /// The backend's counters of releases and restarts.
    pub(super) metrics: Arc<BackendMetrics>,
    /// On a `builtin:fs` store whose backend keeps warm handles.
    pub(super) warm: Option<Warm>,
}

/// How a pool may keep a warm instance.
pub(super) struct Warm {
    /// The backend's `warm_handles`: of the pools of one `group`, the most
    /// recently used this many keep one instance.
    pub(super) handles: usize,
    /// The backend's name and the store's granted directory: every
    /// `wasm:///dir` store is backend `builtin:fs`, and one directory's
    /// saves must not cost another's its warm instance.
    pub(super) group: Arc<str>,
    /// The store's directories, noted when an instance starts and checked
    /// before it is kept or used again after an idle gap.
    pub(super) dirs: StoreDirs,
}

/// Largest instance a warm handle keeps through idle release: an idle
/// store's guest holds well under a MiB; one that grew past this gives its
/// memory back as any other idle instance does.
const WARM_MEMORY_MAX: usize = 16 << 20;

/// A pool that would keep a warm instance if it ranks high enough in its
/// group, as the reaper sees it.
pub(super) struct WarmRank<'a> {
    pub(super) group: &'a str,
    /// When the pool was last used, in epoch ticks.
    pub(super) last_used: u64,
    pub(super) warm_handles: usize,
}

/// An instance waiting in the pool, and since when (in epoch ticks, see
/// [`crate::engine::ticks`]: check-in is on every call's path). Boxed: an
/// instance is about 300 bytes, and every call moves it out of the pool
/// and back.
struct Idle {
    instance: Box<Instance>,
    since: u64,
}

impl Idle {
    /// Whether the release that is due (idle since before `now - after`,
    /// holding no unflushed puts) may take this instance.
    fn releasable(&self, now: u64, after: u64, durability: &Durability) -> bool {
        now.saturating_sub(self.since) > after && !durability.holds_puts(self.instance.id)
    }
}

pub(super) struct PoolState {
    idle: Vec<Idle>,
    /// Instances in existence: idle plus checked out.
    live: usize,
    /// Threads waiting on `Pool::changed`. Wakeups are skipped when there
    /// are none: `Condvar::notify_all` is a futex system call even with no
    /// waiter, on every call's check-in.
    waiters: usize,
    /// Calls waiting for an instance, served in arrival order.
    line: Line,
    manifest_in_progress: bool,
    pub(super) durability: Durability,
    backoff: Backoff,
    /// Instances released and not yet replaced by a start.
    released: usize,
    /// While there are live instances, on a store whose directories the
    /// host keeps open.
    dirs_in_use: Option<InUse>,
}

impl PoolState {
    /// An idle instance other than `own` holding puts due for a flush.
    fn take_idle_due(&mut self, own: u64, cutoff: u64) -> Option<Box<Instance>> {
        let at = self
            .idle
            .iter()
            .position(|i| self.durability.is_due(i.instance.id, own, cutoff))?;
        Some(self.idle.swap_remove(at).instance)
    }
}

impl Pool {
    pub(super) fn new(
        mut first: Instance,
        max_instances: usize,
        label: String,
        release: Option<Release>,
        in_place: Option<Arc<FoundInPlace>>,
    ) -> Pool {
        if let Some(warm) = release.as_ref().and_then(|r| r.warm.as_ref()) {
            first.dirs_at_start = Some(warm.dirs.identity());
        }
        Pool {
            state: Mutex::new(PoolState {
                idle: vec![Idle {
                    instance: Box::new(first),
                    since: ticks(),
                }],
                live: 1,
                waiters: 0,
                line: Line::default(),
                manifest_in_progress: false,
                durability: Durability::default(),
                backoff: Backoff::default(),
                released: 0,
                dirs_in_use: in_place.as_ref().map(FoundInPlace::in_use),
            }),
            changed: Condvar::new(),
            max_instances,
            label,
            release,
            in_place,
        }
    }

    /// `Err` while calls back off after repeated lost instances.
    pub(super) fn check_backoff(&self, backend: &str) -> Result<(), KvError> {
        self.lock().backoff.check("backend", backend)
    }

    /// How long an instance may stay idle before it may be released.
    pub(super) fn release_after(&self) -> Option<Duration> {
        self.release.as_ref().map(|r| r.after)
    }

    /// Where this pool ranks for a warm instance, if a release at `now`
    /// would take its last one and it could keep one (an instance of at
    /// most [`WARM_MEMORY_MAX`]). A pool in use, or not idle long enough,
    /// does not compete: it keeps an instance anyway.
    pub(super) fn warm_rank(&self, now: u64) -> Option<WarmRank<'_>> {
        let release = self.release.as_ref()?;
        let warm = release.warm.as_ref()?;
        let after = ticks_in(release.after);
        let state = self.lock();
        let all_releasable = state.live == state.idle.len()
            && state
                .idle
                .iter()
                .all(|i| i.releasable(now, after, &state.durability));
        let could_keep = state
            .idle
            .iter()
            .any(|i| i.instance.memory_held() <= WARM_MEMORY_MAX);
        (all_releasable && could_keep).then(|| WarmRank {
            group: &warm.group,
            last_used: state.idle.iter().map(|i| i.since).max().unwrap_or(0),
            warm_handles: warm.handles,
        })
    }

    /// Release the instances idle since before `now - after` (`now` in
    /// epoch ticks, [`crate::engine::ticks`]) that hold no
    /// unflushed puts (an idle instance runs no call). Returns how many.
    /// `keep_warm`: the pool is one of its group's most recently used
    /// ([`super::reaper`]) and keeps, if all its instances would go, the
    /// newest of at most [`WARM_MEMORY_MAX`], if the store's directories
    /// are still those it opened.
    ///
    /// A released instance is dropped without running its guest's `store`
    /// destructor: it holds nothing to flush, the host closes its sockets
    /// and descriptors, and no guest code runs on the release thread. So a
    /// slow or hostile destructor can neither hold up the releases of every
    /// other pool nor still be running after `kv_close` returned.
    pub(super) fn release_idle(&self, now: u64, keep_warm: bool) -> usize {
        let Some(release) = &self.release else {
            return 0;
        };
        let after = ticks_in(release.after);
        // Looked at before the lock: `stat`s on a slow filesystem must not
        // hold up the handle's calls.
        let warm = release.warm.as_ref().filter(|_| keep_warm);
        let dirs_now = warm.map(|w| w.dirs.identity());
        let expired: Vec<Box<Instance>> = {
            let mut state = self.lock();
            let PoolState {
                idle,
                durability,
                live,
                ..
            } = &mut *state;
            let mut expired: Vec<Idle> = idle
                .extract_if(.., |i| i.releasable(now, after, durability))
                .collect();
            if let (true, Some(dirs_now)) = (expired.len() == *live, &dirs_now) {
                expired.sort_unstable_by_key(|i| i.since);
                let newest_keepable = expired.iter().rposition(|i| {
                    i.instance.memory_held() <= WARM_MEMORY_MAX
                        && i.instance.dirs_at_start.as_ref() == Some(dirs_now)
                });
                // Its `since` stays: it still ranks by its real last use.
                idle.extend(newest_keepable.map(|at| expired.remove(at)));
            }
            let expired: Vec<Box<Instance>> = expired.into_iter().map(|i| i.instance).collect();
            state.live -= expired.len();
            state.released += expired.len();
            if !expired.is_empty() && state.live == 0 {
                // What the calls grew is given back too: an idle handle
                // keeps only what it cannot do without. Its hold on the
                // store's directories goes before anyone can see it idle
                // (a few `close`s).
                state.idle = Vec::new();
                state.durability.shrink();
                state.dirs_in_use = None;
            }
            if !expired.is_empty() {
                self.wake(&state);
            }
            expired
        };
        let count = expired.len();
        drop(expired);
        if count > 0 {
            release.metrics.released(count);
        }
        count
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Instances in existence.
    pub(super) fn live(&self) -> usize {
        self.lock().live
    }

    /// Wait until `ready` returns `Some`, or fail when `deadline` passes.
    fn wait_for<R>(
        &self,
        deadline: Deadline,
        mut ready: impl FnMut(&mut PoolState) -> Option<R>,
    ) -> Result<R, KvError> {
        let mut state = self.lock();
        loop {
            if let Some(found) = ready(&mut state) {
                return Ok(found);
            }
            state = self.wait(state, deadline)?;
        }
    }

    /// Sleep until the pool changes or `deadline` passes (`Err`).
    fn wait<'s>(
        &'s self,
        mut state: MutexGuard<'s, PoolState>,
        deadline: Deadline,
    ) -> Result<MutexGuard<'s, PoolState>, KvError> {
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(KvError::Timeout(deadline.budget_ms()));
        }
        state.waiters += 1;
        state = self
            .changed
            .wait_timeout(state, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        state.waiters -= 1;
        Ok(state)
    }

    /// Wait in line until `ready` returns `Some` on this call's turn, or
    /// fail when `deadline` passes. A call that finds no one waiting does
    /// not queue.
    fn wait_in_line<R>(
        &self,
        deadline: Deadline,
        mut ready: impl FnMut(&mut PoolState) -> Option<R>,
    ) -> Result<R, KvError> {
        let mut state = self.lock();
        let mut place = None;
        loop {
            if state.line.is_turn(place)
                && let Some(found) = ready(&mut state)
            {
                if let Some(place) = place {
                    state.line.leave(place);
                    // The next in line may find what is left.
                    self.wake(&state);
                }
                return Ok(found);
            }
            let place = *place.get_or_insert_with(|| state.line.join());
            state = match self.wait(state, deadline) {
                Ok(state) => state,
                Err(timeout) => {
                    let mut state = self.lock();
                    state.line.leave(place);
                    self.wake(&state);
                    return Err(timeout);
                }
            };
        }
    }

    /// Wake the waiting threads, if any, after `state` changed.
    fn wake(&self, state: &PoolState) {
        if state.waiters > 0 {
            self.changed.notify_all();
        }
    }

    /// An idle instance, else a new one from `start` while the pool may
    /// grow, else wait for one until `deadline`. A start that fails (the
    /// guest's `open` traps, overruns the deadline or refuses) counts as a
    /// lost instance for the back-off: otherwise such a guest would cost an
    /// instantiation on every call.
    pub(super) fn checkout(
        &self,
        deadline: Deadline,
        backend: &str,
        start: impl FnOnce() -> Result<Instance, KvError>,
    ) -> Result<CheckedOut<'_>, KvError> {
        // `(None, restart)`: the pool may grow, and the caller starts an
        // instance (`restart`: in place of a released one). The back-off
        // is checked again before a start: this call may have waited while
        // others lost instances.
        let (idle, mut restart) = self.wait_in_line(deadline, |state| {
            if let Some(idle) = state.idle.pop() {
                Some(Ok((Some(idle), false)))
            } else if state.live < self.max_instances {
                if let Err(refused) = state.backoff.check("backend", backend) {
                    return Some(Err(refused));
                }
                if state.live == 0 && state.dirs_in_use.is_none() {
                    state.dirs_in_use = self.in_place.as_ref().map(FoundInPlace::in_use);
                }
                state.live += 1;
                let restart = state.released > 0;
                state.released -= usize::from(restart);
                Some(Ok((None, restart)))
            } else {
                None
            }
        })??;
        let idle = match idle {
            Some(kept) if !self.still_reaches_its_store(&kept, ticks()) => {
                // Gone as if released; a new instance takes its place.
                drop(kept);
                if let Some(release) = &self.release {
                    release.metrics.released(1);
                }
                restart = true;
                None
            }
            idle => idle,
        };
        let instance = match idle {
            Some(idle) => idle.instance,
            None => {
                let started = start().inspect_err(|err| {
                    let mut state = self.lock();
                    state.live -= 1;
                    if state.live == 0 {
                        state.dirs_in_use = None;
                    }
                    state.released += usize::from(restart);
                    let backoff = state.backoff.lost(err);
                    self.wake(&state);
                    drop(state);
                    if let Some(backoff) = backoff {
                        backoff.log(&self.label);
                    }
                })?;
                if let (true, Some(release)) = (restart, &self.release) {
                    release.metrics.restarted();
                }
                let mut started = Box::new(started);
                if let Some(warm) = self.release.as_ref().and_then(|r| r.warm.as_ref()) {
                    started.dirs_at_start = Some(warm.dirs.identity());
                }
                started
            }
        };
        Ok(self.checked_out(instance))
    }

    /// Whether `idle`, on a warm handle's pool and idle past the release
    /// time (`now` in ticks), still reaches its store: its descriptors name
    /// the directories it opened, and the store's paths may name others by
    /// now (moved away, removed, replaced). Logged if not.
    fn still_reaches_its_store(&self, idle: &Idle, now: u64) -> bool {
        let Some(release) = &self.release else {
            return true;
        };
        let Some(warm) = &release.warm else {
            return true;
        };
        if now.saturating_sub(idle.since) <= ticks_in(release.after) {
            return true;
        }
        let same = idle.instance.dirs_at_start.as_ref() == Some(&warm.dirs.identity());
        if !same {
            tracing::info!(
                "{}: the store's directories changed while its warm instance idled; \
                 starting a new instance",
                self.label
            );
        }
        same
    }

    /// Take an instance other than `own` that holds puts made at or before
    /// `cutoff` unflushed, waiting for one in use until `deadline`; `None`
    /// when there is none left.
    pub(super) fn checkout_due(
        &self,
        own: u64,
        cutoff: u64,
        deadline: Deadline,
    ) -> Result<Option<CheckedOut<'_>>, KvError> {
        let found = self.wait_for(deadline, |state| {
            if !state.durability.any_due(own, cutoff) {
                return Some(None);
            }
            state.take_idle_due(own, cutoff).map(Some)
        })?;
        Ok(found.map(|instance| self.checked_out(instance)))
    }

    /// A `put_manifest` call begins: its ticket (see
    /// `Durability::take_loss`) and the cutoff of the puts it covers,
    /// released when the guard drops.
    pub(super) fn begin_manifest(&self) -> ManifestTicket<'_> {
        let mut state = self.lock();
        let ticket = state.durability.begin_manifest();
        let cutoff = state.durability.cutoff();
        ManifestTicket {
            pool: self,
            ticket,
            cutoff,
        }
    }

    /// This handle's turn to publish a manifest (one at a time), held until
    /// the guard drops.
    pub(super) fn manifest_turn(&self, deadline: Deadline) -> Result<ManifestTurn<'_>, KvError> {
        self.wait_for(deadline, |state| {
            (!state.manifest_in_progress).then(|| state.manifest_in_progress = true)
        })?;
        Ok(ManifestTurn { pool: self })
    }

    /// The idle instances, taken out (when the handle closes).
    pub(super) fn take_idle(&self) -> Vec<Instance> {
        let idle = std::mem::take(&mut self.lock().idle);
        idle.into_iter().map(|i| *i.instance).collect()
    }

    fn checked_out(&self, instance: Box<Instance>) -> CheckedOut<'_> {
        CheckedOut {
            pool: self,
            instance: Some(instance),
        }
    }

    /// Give a healthy instance back, with what its call did.
    fn checkin(&self, instance: Box<Instance>, kind: CallKind, succeeded: bool) {
        let since = ticks();
        let mut state = self.lock();
        state.backoff.succeeded();
        if succeeded {
            match kind {
                CallKind::Put => state.durability.put_accepted(instance.id),
                CallKind::Flush => state.durability.flushed(instance.id),
                CallKind::Other => {}
            }
        }
        self.park(state, instance, since);
    }

    /// Give back an instance no call ran on. It says nothing of the guest's
    /// health, so it leaves the back-off as it is.
    fn give_back_unused(&self, instance: Box<Instance>) {
        let since = ticks();
        self.park(self.lock(), instance, since);
    }

    fn park(&self, mut state: MutexGuard<'_, PoolState>, instance: Box<Instance>, since: u64) {
        state.idle.push(Idle { instance, since });
        self.wake(&state);
    }

    /// Forget an instance that is gone (lost to `why`, or dropped by a
    /// panic), and back off if that keeps happening.
    fn retire(&self, id: u64, why: &KvError) {
        let mut state = self.lock();
        state.live -= 1;
        if state.live == 0 {
            // Nothing left to hold the store's directories for.
            state.dirs_in_use = None;
        }
        let backoff = state.backoff.lost(why);
        state.durability.instance_lost(id);
        self.wake(&state);
        drop(state);
        if let Some(backoff) = backoff {
            backoff.log(&self.label);
        }
    }
}

/// A `put_manifest` call in flight.
pub(super) struct ManifestTicket<'p> {
    pool: &'p Pool,
    pub(super) ticket: u64,
    /// Puts completed before the call began.
    pub(super) cutoff: u64,
}

impl Drop for ManifestTicket<'_> {
    fn drop(&mut self) {
        self.pool.lock().durability.end_manifest(self.ticket);
    }
}

/// A handle's turn to publish a manifest.
pub(super) struct ManifestTurn<'p> {
    pool: &'p Pool,
}

impl Drop for ManifestTurn<'_> {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        state.manifest_in_progress = false;
        self.pool.wake(&state);
    }
}

/// An instance taken from the pool. Whatever happens, including a panic in
/// host code, it goes back to the pool or is retired, so the pool's count of
/// live instances never leaks and no caller waits for a slot in vain.
pub(super) struct CheckedOut<'p> {
    pool: &'p Pool,
    instance: Option<Box<Instance>>,
}

impl CheckedOut<'_> {
    pub(super) fn id(&self) -> u64 {
        self.instance.as_ref().map_or(0, |i| i.id)
    }

    /// Run `call`, then give the instance back or, if it was lost, retire it.
    pub(super) fn run<T>(
        mut self,
        kind: CallKind,
        call: impl FnOnce(&mut Instance) -> Outcome<T>,
    ) -> Result<T, KvError> {
        let instance = self.instance.as_mut().expect("checked out");
        let outcome = call(instance);
        let instance = self.instance.take().expect("checked out");
        match outcome {
            Outcome::Returned(result) => {
                self.pool.checkin(instance, kind, result.is_ok());
                result
            }
            Outcome::Lost(err) => {
                // The caller logs `err`; this records the replacement.
                tracing::info!(
                    "{}: guest instance discarded after: {err}; a fresh one serves the next call",
                    self.pool.label
                );
                let id = instance.id;
                drop(instance);
                self.pool.retire(id, &err);
                Err(err)
            }
        }
    }
}

impl Drop for CheckedOut<'_> {
    fn drop(&mut self) {
        if let Some(instance) = self.instance.take() {
            if std::thread::panicking() {
                // A panic unwound through `run`: the instance may be mid-call.
                let id = instance.id;
                drop(instance);
                self.pool.retire(
                    id,
                    &KvError::Host("the host panicked during the call".into()),
                );
            } else {
                // Never used (e.g. put_manifest's flush of others failed).
                self.pool.give_back_unused(instance);
            }
        }
    }
}

/// The calls waiting for an instance, in arrival order. An instance that
/// comes back goes to the longest waiter: otherwise a thread that checks an
/// instance in and straight out again (a writer in a loop) takes it back
/// before the waiters it woke are scheduled, and on a busy machine they can
/// starve until their deadline.
#[derive(Default)]
struct Line {
    next: u64,
    waiting: VecDeque<u64>,
}

impl Line {
    /// A place at the back of the line.
    fn join(&mut self) -> u64 {
        let place = self.next;
        self.next += 1;
        self.waiting.push_back(place);
        place
    }

    /// Whether the call at `place` (`None`: not in line) may take an
    /// instance now: it is first, or no one waits.
    fn is_turn(&self, place: Option<u64>) -> bool {
        self.waiting.front().copied() == place
    }

    /// Leave the line, served or given up.
    fn leave(&mut self, place: u64) {
        self.waiting.retain(|&p| p != place);
    }
}

#[cfg(test)]
mod tests {
    use super::Line;

    #[test]
    fn the_longest_waiter_is_served_first_and_newcomers_queue_behind_it() {
        let mut line = Line::default();
        assert!(line.is_turn(None), "no one waits: a newcomer goes ahead");
        let first = line.join();
        let second = line.join();
        assert!(!line.is_turn(None), "a newcomer may not overtake waiters");
        assert!(line.is_turn(Some(first)));
        assert!(!line.is_turn(Some(second)));
        line.leave(first);
        assert!(line.is_turn(Some(second)));
        line.leave(second);
        assert!(line.is_turn(None));
    }

    #[test]
    fn a_waiter_giving_up_lets_the_one_behind_it_move_up() {
        let mut line = Line::default();
        let first = line.join();
        let second = line.join();
        let third = line.join();
        line.leave(second);
        line.leave(first);
        assert!(line.is_turn(Some(third)));
    }
}
