//! The instances serving one handle.
//!
//! A guest instance runs one call at a time, so a handle keeps a small pool
//! and hands each call an idle instance, starting a new one while the pool
//! may grow. Every wait (for an idle instance, for the manifest turn, for
//! an instance another thread is using) is bounded by the waiting call's
//! [`Deadline`]. An instance always comes back through [`CheckedOut`]:
//! returned to the pool with its bookkeeping, or retired when lost.

use std::sync::{Condvar, Mutex, MutexGuard};

use super::backoff::Backoff;
use super::durability::Durability;
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::instance::{Instance, Outcome};

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
}

pub(super) struct PoolState {
    idle: Vec<Instance>,
    /// Instances in existence: idle plus checked out.
    live: usize,
    /// Threads waiting on `Pool::changed`. Wakeups are skipped when there
    /// are none: `Condvar::notify_all` is a futex system call even with no
    /// waiter, on every call's check-in.
    waiters: usize,
    manifest_in_progress: bool,
    pub(super) durability: Durability,
    pub(super) backoff: Backoff,
}

impl PoolState {
    /// An idle instance other than `own` holding puts due for a flush.
    fn take_idle_due(&mut self, own: u64, cutoff: u64) -> Option<Instance> {
        let at = self
            .idle
            .iter()
            .position(|i| self.durability.is_due(i.id, own, cutoff))?;
        Some(self.idle.swap_remove(at))
    }
}

impl Pool {
    pub(super) fn new(first: Instance, max_instances: usize, label: String) -> Pool {
        Pool {
            state: Mutex::new(PoolState {
                idle: vec![first],
                live: 1,
                waiters: 0,
                manifest_in_progress: false,
                durability: Durability::default(),
                backoff: Backoff::default(),
            }),
            changed: Condvar::new(),
            max_instances,
            label,
        }
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
        }
    }

    /// Wake the waiting threads, if any, after `state` changed.
    fn wake(&self, state: &PoolState) {
        if state.waiters > 0 {
            self.changed.notify_all();
        }
    }

    /// An idle instance, else a new one from `start` while the pool may
    /// grow, else wait for one until `deadline`.
    pub(super) fn checkout(
        &self,
        deadline: Deadline,
        start: impl FnOnce() -> Result<Instance, KvError>,
    ) -> Result<CheckedOut<'_>, KvError> {
        // `Some(None)`: the pool may grow, and the caller starts an instance.
        let idle = self.wait_for(deadline, |state| {
            if let Some(instance) = state.idle.pop() {
                Some(Some(instance))
            } else if state.live < self.max_instances {
                state.live += 1;
                Some(None)
            } else {
                None
            }
        })?;
        let instance = match idle {
            Some(instance) => instance,
            None => start().inspect_err(|_| {
                let mut state = self.lock();
                state.live -= 1;
                self.wake(&state);
            })?,
        };
        Ok(self.checked_out(instance))
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
        std::mem::take(&mut self.lock().idle)
    }

    fn checked_out(&self, instance: Instance) -> CheckedOut<'_> {
        CheckedOut {
            pool: self,
            instance: Some(instance),
        }
    }

    /// Give a healthy instance back, with what its call did.
    fn checkin(&self, instance: Instance, kind: CallKind, succeeded: bool) {
        let mut state = self.lock();
        state.backoff.succeeded();
        if succeeded {
            match kind {
                CallKind::Put => state.durability.put_accepted(instance.id),
                CallKind::Flush => state.durability.flushed(instance.id),
                CallKind::Other => {}
            }
        }
        state.idle.push(instance);
        self.wake(&state);
    }

    /// Forget an instance that is gone (lost, or dropped by a panic), and
    /// back off if that keeps happening.
    fn retire(&self, id: u64) {
        let mut state = self.lock();
        state.live -= 1;
        state.backoff.lost(&self.label);
        state.durability.instance_lost(id);
        self.wake(&state);
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
    instance: Option<Instance>,
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
                self.pool.retire(id);
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
                self.pool.retire(id);
            } else {
                // Never used (e.g. put_manifest's flush of others failed).
                self.pool.checkin(instance, CallKind::Other, false);
            }
        }
    }
}
