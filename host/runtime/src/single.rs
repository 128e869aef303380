//! Guest kinds that keep exactly one instance: fabrics and event
//! subscribers (and every later kind that holds state in its guest).
//!
//! The pattern is the same for all of them, so it lives here once: the
//! instance starts on demand, calls are made one at a time under the
//! backend's deadline and call gate and counted in its metrics, and an
//! instance that traps or overruns its deadline is discarded. The next call
//! starts a fresh one and [`OneInstance::generation`] changes, so a caller
//! that keeps state about the guest (a replay log, handles) knows to rebuild
//! or forget it. Instances lost (or failing to start) call after call back
//! off as a kv-store handle's do ([`Backoff`]).

use std::sync::{Arc, Mutex, MutexGuard};

use wasmtime::Store;

use crate::backend::Backend;
use crate::backoff::Backoff;
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::sandbox::{self, Outcome};
use crate::state::HostState;

/// What a guest kind provides: how to load its exports into a new store,
/// and what host-side state is tied to the live instance.
pub(crate) trait GuestKind: Sized + Send + Sync {
    /// The name in logs (`fabric`, `subscriber`).
    const KIND: &'static str;
    /// Host-side state that belongs with the live instance (for example the
    /// handles a fabric gave out).
    type Tied: Send;

    /// Start an instance of `policy`'s component.
    fn start(policy: &Backend, deadline: Deadline) -> Result<Instance<Self>, KvError>;

    /// Forget what belonged to an instance that was just discarded.
    fn discarded(_tied: &mut Self::Tied) {}
}

/// One live guest instance with its exports.
pub(crate) struct Instance<G> {
    store: Store<HostState>,
    exports: G,
    fuel: Option<u64>,
}

impl<G: Send + Sync> Instance<G> {
    /// A new store for `policy` in which `load` instantiates the component
    /// and looks up its exports, within `deadline`.
    pub(crate) fn start(
        policy: &Backend,
        deadline: Deadline,
        load: impl AsyncFnOnce(&mut Store<HostState>) -> wasmtime::Result<G> + Send,
    ) -> Result<Instance<G>, KvError> {
        let (mut store, fuel) = sandbox::new_store(policy, "")?;
        let started = sandbox::run(&mut store, deadline, fuel, async |s| {
            load(s).await.map(Ok::<_, KvError>)
        });
        match started {
            Outcome::Returned(exports) => Ok(Instance {
                store,
                exports: exports?,
                fuel,
            }),
            Outcome::Lost(err) => Err(err),
        }
    }
}

/// A guest with one instance, safe to call from many threads: one call at
/// a time (the lock is held across the call on purpose).
pub(crate) struct OneInstance<G: GuestKind> {
    policy: Arc<Backend>,
    slot: Mutex<Slot<G>>,
    /// Apart from the slot, whose lock is held across calls: a refusal
    /// waits for neither the slot nor the call gate.
    backoff: Mutex<Backoff>,
}

/// The live instance (if any) and what is tied to it.
pub(crate) struct Slot<G: GuestKind> {
    instance: Option<Instance<G>>,
    /// Bumped whenever an instance is discarded.
    generation: u64,
    tied: G::Tied,
}

/// One operation's access to the guest: the slot, under the lock, and the
/// operation's deadline.
pub(crate) struct Turn<'a, G: GuestKind> {
    slot: &'a mut Slot<G>,
    policy: &'a Backend,
    backoff: &'a Mutex<Backoff>,
    deadline: Deadline,
}

impl<G: GuestKind> OneInstance<G> {
    /// Run `policy`'s component, with its first instance started now so a
    /// broken component fails here.
    pub(crate) fn start(policy: Arc<Backend>, tied: G::Tied) -> Result<OneInstance<G>, KvError> {
        let guest = OneInstance {
            policy,
            slot: Mutex::new(Slot {
                instance: None,
                generation: 0,
                tied,
            }),
            backoff: Mutex::default(),
        };
        let deadline = guest.deadline();
        guest.turn(&mut guest.lock(), deadline).instance()?;
        Ok(guest)
    }

    pub(crate) fn policy(&self) -> &Arc<Backend> {
        &self.policy
    }

    /// Changes each time the instance is discarded.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Whether an instance is running now. None is after a loss, and while
    /// starts fail or calls back off.
    pub(crate) fn is_live(&self) -> bool {
        self.lock().instance.is_some()
    }

    /// Whether calls are refused now, backing off after repeated losses.
    pub(crate) fn backing_off(&self) -> bool {
        lock(&self.backoff).refusing()
    }

    /// Read what is tied to the live instance.
    pub(crate) fn with_tied<T>(&self, read: impl FnOnce(&G::Tied) -> T) -> T {
        read(&self.lock().tied)
    }

    /// Run one operation under the deadline and call gate, counted in the
    /// backend's metrics (`bytes_in`, and `bytes_out` of the result); a
    /// failure other than a miss is logged, at most one line per guest and
    /// code per second, its text cut to [`crate::log_limit::MAX_GUEST_TEXT`].
    pub(crate) fn operation<T>(
        &self,
        bytes_in: usize,
        bytes_out: impl FnOnce(&T) -> usize,
        call: impl FnOnce(&mut Turn<'_, G>) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        self.operation_by(self.deadline(), bytes_in, bytes_out, call)
    }

    /// [`OneInstance::operation`] under a deadline the caller set earlier
    /// (a request that waited for its turn has only the rest of it).
    pub(crate) fn operation_by<T>(
        &self,
        deadline: Deadline,
        bytes_in: usize,
        bytes_out: impl FnOnce(&T) -> usize,
        call: impl FnOnce(&mut Turn<'_, G>) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let backoff = lock(&self.backoff).check(G::KIND, &self.policy.name);
        let result = backoff.and_then(|()| {
            let _gate = self.policy.enter_call(deadline)?;
            let mut slot = self.lock();
            call(&mut self.turn(&mut slot, deadline))
        });
        if let Err(e) = &result
            && !e.is_miss()
        {
            crate::log_limit::warn(
                ("guest call failed", self.policy.name.as_str(), e.code()),
                format_args!(
                    "{} {:?}: {}",
                    G::KIND,
                    self.policy.name,
                    crate::log_limit::bounded(e.to_string())
                ),
            );
        }
        let out = result.as_ref().map_or(0, bytes_out);
        self.policy
            .metrics
            .record(bytes_in, out, result.as_ref().err());
        result
    }

    /// Exclusive access without the lock, for `Drop` of the owner: a turn
    /// under one fresh deadline.
    pub(crate) fn last_turn(&mut self) -> Turn<'_, G> {
        let deadline = self.deadline();
        Turn {
            slot: self.slot.get_mut().unwrap_or_else(|p| p.into_inner()),
            policy: &self.policy,
            backoff: &self.backoff,
            deadline,
        }
    }

    fn turn<'a>(&'a self, slot: &'a mut Slot<G>, deadline: Deadline) -> Turn<'a, G> {
        Turn {
            slot,
            policy: &self.policy,
            backoff: &self.backoff,
            deadline,
        }
    }

    /// A fresh deadline for one call: the backend's `call_timeout_ms`.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::after_ms(self.policy.limits.call_timeout_ms)
    }

    fn lock(&self) -> MutexGuard<'_, Slot<G>> {
        lock(&self.slot)
    }
}

impl<G: GuestKind> Turn<'_, G> {
    /// What is tied to the live instance.
    pub(crate) fn tied(&mut self) -> &mut G::Tied {
        &mut self.slot.tied
    }

    /// Whether an instance is running (one that was lost is not restarted
    /// by asking).
    pub(crate) fn is_live(&self) -> bool {
        self.slot.instance.is_some()
    }

    /// Whether the operation's deadline has passed.
    pub(crate) fn expired(&self) -> bool {
        self.deadline.remaining().is_zero()
    }

    /// Call the guest (starting an instance if there is none): `call` gets
    /// the store and the exports and returns the guest's answer. A guest
    /// error is returned as it is; a lost instance is discarded, with what
    /// was tied to it.
    pub(crate) fn call<T: Send, E: Into<KvError> + Send>(
        &mut self,
        call: impl AsyncFnOnce(&mut Store<HostState>, &G) -> wasmtime::Result<Result<T, E>> + Send,
    ) -> Result<T, KvError> {
        let deadline = self.deadline;
        let instance = self.instance()?;
        let exports = &instance.exports;
        let outcome = sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
            call(s, exports).await
        });
        match outcome {
            Outcome::Returned(result) => {
                lock(self.backoff).succeeded();
                result
            }
            Outcome::Lost(err) => {
                // The error quotes the guest's last stderr lines: cut, and
                // at most one line per guest and code per second, however
                // often a guest gets itself discarded.
                crate::log_limit::warn(
                    (
                        "guest instance discarded",
                        self.policy.name.as_str(),
                        err.code(),
                    ),
                    format_args!(
                        "{} {:?}: guest instance discarded after: {}; a fresh one serves the \
                         next call",
                        G::KIND,
                        self.policy.name,
                        crate::log_limit::bounded(err.to_string())
                    ),
                );
                self.slot.instance = None;
                self.slot.generation += 1;
                G::discarded(&mut self.slot.tied);
                self.lost(&err);
                Err(err)
            }
        }
    }

    /// The live instance, started if there is none. A start that fails
    /// counts for the back-off as a lost call does.
    fn instance(&mut self) -> Result<&mut Instance<G>, KvError> {
        if self.slot.instance.is_none() {
            // Checked again: this call may have waited for the slot while
            // other calls lost instances.
            lock(self.backoff).check(G::KIND, &self.policy.name)?;
            let started = G::start(self.policy, self.deadline).inspect_err(|err| {
                crate::log_limit::warn(
                    ("instance failed to start", self.policy.name.as_str()),
                    format_args!(
                        "{} {:?}: an instance failed to start: {}",
                        G::KIND,
                        self.policy.name,
                        crate::log_limit::bounded(err.to_string())
                    ),
                );
                self.lost(err);
            })?;
            self.slot.instance = Some(started);
        }
        Ok(self.slot.instance.as_mut().expect("just started"))
    }

    /// Count a lost instance (or a failed start) for the back-off.
    fn lost(&self, why: &KvError) {
        let started = lock(self.backoff).lost(why);
        if let Some(backoff) = started {
            backoff.log(&format!("{} {:?}", G::KIND, self.policy.name));
        }
    }
}

/// Lock, recovering from poisoning: no code path panics while holding
/// these locks.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
