//! Guest kinds that keep exactly one instance: fabrics and event
//! subscribers (and every later kind that holds state in its guest).
//!
//! The pattern is the same for all of them, so it lives here once: the
//! instance starts on demand, calls are made one at a time under the
//! backend's deadline and call gate and counted in its metrics, and an
//! instance that traps or overruns its deadline is discarded. The next call
//! starts a fresh one and [`OneInstance::generation`] changes, so a caller
//! that keeps state about the guest (a replay log, handles) knows to rebuild
//! or forget it.

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

    /// Whether calls back off after repeated lost instances, as a
    /// kv-store handle's do ([`Backoff`]).
    const BACKS_OFF: bool = true;

    /// Start an instance of `policy`'s component ([`Outcome::Lost`] when
    /// the guest trapped or overran the deadline while starting).
    fn start(policy: &Backend, deadline: Deadline) -> Outcome<Instance<Self>>;

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
    ) -> Outcome<Instance<G>> {
        let (mut store, fuel) = match sandbox::new_store(policy, "") {
            Ok(new) => new,
            Err(err) => return Outcome::Returned(Err(err)),
        };
        let started = sandbox::run(&mut store, deadline, fuel, async |s| {
            load(s).await.map(Ok::<_, KvError>)
        });
        started.map(|exports| Instance {
            store,
            exports,
            fuel,
        })
    }
}

/// A guest with one instance, safe to call from many threads: one call at
/// a time (the lock is held across the call on purpose).
pub(crate) struct OneInstance<G: GuestKind> {
    policy: Arc<Backend>,
    slot: Mutex<Slot<G>>,
}

/// The live instance (if any) and what is tied to it.
pub(crate) struct Slot<G: GuestKind> {
    instance: Option<Instance<G>>,
    /// Bumped whenever an instance is discarded.
    generation: u64,
    backoff: Backoff,
    tied: G::Tied,
}

/// One operation's access to the guest: the slot, under the lock, and the
/// operation's deadline.
pub(crate) struct Turn<'a, G: GuestKind> {
    slot: &'a mut Slot<G>,
    policy: &'a Backend,
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
                backoff: Backoff::default(),
                tied,
            }),
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

    /// Read what is tied to the live instance.
    pub(crate) fn with_tied<T>(&self, read: impl FnOnce(&G::Tied) -> T) -> T {
        read(&self.lock().tied)
    }

    /// Run one operation under the deadline and call gate, counted in the
    /// backend's metrics (`bytes_in`, and `bytes_out` of the result); a
    /// failure other than a miss is logged, rate-limited.
    pub(crate) fn operation<T>(
        &self,
        bytes_in: usize,
        bytes_out: impl FnOnce(&T) -> usize,
        call: impl FnOnce(&mut Turn<'_, G>) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let deadline = self.deadline();
        let result = self.policy.enter_call(deadline).and_then(|_slot| {
            let mut slot = self.lock();
            if G::BACKS_OFF {
                slot.backoff.check(G::KIND, &self.policy.name)?;
            }
            call(&mut self.turn(&mut slot, deadline))
        });
        if let Err(e) = &result
            && !e.is_miss()
        {
            crate::log_limit::warn(
                ("guest call failed", self.policy.name.as_str()),
                format_args!("{} {:?}: {e}", G::KIND, self.policy.name),
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
            deadline,
        }
    }

    fn turn<'a>(&'a self, slot: &'a mut Slot<G>, deadline: Deadline) -> Turn<'a, G> {
        Turn {
            slot,
            policy: &self.policy,
            deadline,
        }
    }

    fn deadline(&self) -> Deadline {
        Deadline::after_ms(self.policy.limits.call_timeout_ms)
    }

    fn lock(&self) -> MutexGuard<'_, Slot<G>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
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
                self.slot.backoff.succeeded();
                result
            }
            Outcome::Lost(err) => {
                tracing::warn!(
                    "{} {:?}: guest instance discarded after: {err}; a fresh one serves the \
                     next call",
                    G::KIND,
                    self.policy.name
                );
                self.slot.instance = None;
                self.slot.generation += 1;
                G::discarded(&mut self.slot.tied);
                self.lost(&err);
                Err(err)
            }
        }
    }

    /// The live instance, started if there is none. A start lost to a trap
    /// or the deadline counts for the back-off as a lost call does.
    fn instance(&mut self) -> Result<&mut Instance<G>, KvError> {
        if self.slot.instance.is_none() {
            let started = match G::start(self.policy, self.deadline) {
                Outcome::Returned(started) => started?,
                Outcome::Lost(err) => {
                    tracing::warn!(
                        "{} {:?}: instance lost while starting: {err}",
                        G::KIND,
                        self.policy.name
                    );
                    self.lost(&err);
                    return Err(err);
                }
            };
            self.slot.instance = Some(started);
        }
        Ok(self.slot.instance.as_mut().expect("just started"))
    }

    /// Count a lost instance for the back-off.
    fn lost(&mut self, why: &KvError) {
        if G::BACKS_OFF
            && let Some(backoff) = self.slot.backoff.lost(why)
        {
            backoff.log(&format!("{} {:?}", G::KIND, self.policy.name));
        }
    }
}
