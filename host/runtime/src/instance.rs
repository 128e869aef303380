//! One guest instance serving one open store, and typed calls into it.
//!
//! Every call re-arms the epoch deadline. A call that traps (panic,
//! out-of-memory abort, stack overflow, deadline) poisons the instance:
//! wasmtime refuses to enter it again, so [`Outcome::Lost`] tells the pool to
//! drop it and start a fresh one for the next call.

use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::ResourceAny;
use wasmtime::{Store, Trap};

use crate::backend::Backend;
use crate::bindings::exports::kvwasm::kv_store::store::{Error as GuestError, GuestStore};
use crate::bindings::{FilesystemBackend, PutOutcome};
use crate::capabilities::http::HttpPolicy;
use crate::engine::Metering;
use crate::error::KvError;
use crate::guest_log::GuestStderr;
use crate::payload::{self, MallocBuffer};
use crate::state::HostState;

/// How a call into a guest ended.
pub(crate) enum Outcome<T> {
    /// The guest returned (a value or its own error); the instance is healthy.
    Returned(Result<T, KvError>),
    /// The instance is poisoned and must be dropped.
    Lost(KvError),
}

/// A live guest instance with its opened `store` resource.
pub(crate) struct Instance {
    /// Unique within the process, for the pool's flush bookkeeping.
    pub(crate) id: u64,
    store: Store<HostState>,
    bindings: FilesystemBackend,
    handle: ResourceAny,
    deadline_ticks: u64,
    timeout_ms: u64,
    /// Fuel per call, on a metered backend.
    fuel: Option<u64>,
}

type CallResult<T> = wasmtime::Result<Result<T, GuestError>>;

impl Instance {
    /// Instantiate `backend`'s component and open `namespace` in it. The
    /// first instance of a component also asks the guest for its
    /// [`BackendInfo`](crate::BackendInfo).
    pub(crate) fn open(backend: &Backend, namespace: &str) -> Result<Instance, KvError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let limits = backend.limits_for(namespace);
        let stderr = GuestStderr::new(&backend.name);
        let wasi = backend
            .grants
            .wasi_ctx(stderr.clone(), &backend.metrics)
            .map_err(|e| KvError::host("cannot apply the backend's grants", e))?;
        let state = HostState {
            wasi,
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            http_policy: HttpPolicy {
                grant: backend.grants.http.clone(),
                metrics: backend.metrics.clone(),
            },
            settings: backend.config_vars.clone(),
            table: Default::default(),
            limits: limits.instance_limits(),
            stderr,
        };
        let mut store = Store::new(backend.component.engine, state);
        store.limiter(|s| &mut s.limits);
        let deadline_ticks = limits.deadline_ticks();
        let timeout_ms = limits.call_timeout_ms;
        store.set_epoch_deadline(deadline_ticks);
        // On a metered engine every call needs a budget; tenants that set
        // none get an unlimited one.
        let fuel = match backend.component.metering {
            Metering::Fuel => Some(limits.fuel.unwrap_or(u64::MAX)),
            Metering::Off => None,
        };
        refuel(&mut store, fuel);
        let bindings = backend
            .component
            .pre
            .instantiate(&mut store)
            .map_err(|e| lost(&store, e, timeout_ms))?;
        let guest = bindings.kvwasm_kv_store_store();
        if backend.component.info.get().is_none() {
            let info = guest
                .call_info(&mut store)
                .map_err(|e| lost(&store, e, timeout_ms))?;
            let _ = backend.component.info.set(info);
            store.set_epoch_deadline(deadline_ticks);
            refuel(&mut store, fuel);
        }
        let handle = guest
            .store()
            .call_open(&mut store, namespace)
            .map_err(|e| lost(&store, e, timeout_ms))??;
        let instance = Instance {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            store,
            bindings,
            handle,
            deadline_ticks,
            timeout_ms,
            fuel,
        };
        Ok(instance)
    }

    /// Run one guest method under the deadline and classify the result.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&GuestStore, &mut Store<HostState>, ResourceAny) -> CallResult<T>,
    ) -> Outcome<T> {
        self.store.set_epoch_deadline(self.deadline_ticks);
        refuel(&mut self.store, self.fuel);
        let guest = self.bindings.kvwasm_kv_store_store().store();
        match f(&guest, &mut self.store, self.handle) {
            Ok(result) => Outcome::Returned(result.map_err(KvError::from)),
            Err(err) => Outcome::Lost(lost(&self.store, err, self.timeout_ms)),
        }
    }

    pub(crate) fn put_chunk(&mut self, hash: &[u8], data: &[u8]) -> Outcome<PutOutcome> {
        self.call(|guest, store, handle| {
            payload::lend(store, data, |store, data| {
                guest.call_put_chunk(store, handle, hash, data)
            })?
        })
    }

    pub(crate) fn get_chunk(&mut self, hash: &[u8]) -> Outcome<MallocBuffer> {
        self.call(
            |guest, store, handle| match guest.call_get_chunk(&mut *store, handle, hash)? {
                Ok(payload) => Ok(Ok(payload::take(store, payload)?)),
                Err(e) => Ok(Err(e)),
            },
        )
    }

    pub(crate) fn put_manifest(&mut self, name: &str, data: &[u8]) -> Outcome<()> {
        self.call(|guest, store, handle| {
            payload::lend(store, data, |store, data| {
                guest.call_put_manifest(store, handle, name, data)
            })?
        })
    }

    pub(crate) fn get_manifest(&mut self, name: &str) -> Outcome<MallocBuffer> {
        self.call(|guest, store, handle| {
            match guest.call_get_manifest(&mut *store, handle, name)? {
                Ok(payload) => Ok(Ok(payload::take(store, payload)?)),
                Err(e) => Ok(Err(e)),
            }
        })
    }

    pub(crate) fn delete_manifest(&mut self, name: &str) -> Outcome<()> {
        self.call(|guest, store, handle| guest.call_delete_manifest(store, handle, name))
    }

    pub(crate) fn prefetch_chunks(&mut self, hashes: &[Vec<u8>]) -> Outcome<()> {
        self.call(|guest, store, handle| guest.call_prefetch_chunks(store, handle, hashes))
    }

    pub(crate) fn flush(&mut self) -> Outcome<()> {
        self.call(|guest, store, handle| guest.call_flush(store, handle))
    }

    /// Drop the guest's `store` resource (running its destructor, e.g. to
    /// close connections) before the instance goes away.
    pub(crate) fn close(mut self) {
        self.store.set_epoch_deadline(self.deadline_ticks);
        if let Err(e) = self.handle.resource_drop(&mut self.store) {
            tracing::debug!("closing a guest store failed: {e:#}");
        }
    }
}

/// A fresh fuel budget for the next call, on a metered backend.
fn refuel(store: &mut Store<HostState>, fuel: Option<u64>) {
    if let Some(fuel) = fuel {
        store
            .set_fuel(fuel)
            .expect("fuel is set only on a metered backend's engine");
    }
}

/// Describe a trap (or other fatal error) that ended an instance, in one
/// line: the trap code, not the wasm backtrace.
fn lost(store: &Store<HostState>, err: wasmtime::Error, timeout_ms: u64) -> KvError {
    let trap = err.downcast_ref::<Trap>();
    if trap == Some(&Trap::Interrupt) {
        return KvError::Timeout(timeout_ms);
    }
    if trap == Some(&Trap::OutOfFuel) {
        return KvError::Limit("the call used up its fuel budget".into());
    }
    let mut what = trap.map_or_else(|| format!("{err:#}"), Trap::to_string);
    if let Some(words) = store.data().stderr.last_words() {
        what = format!("{what}; guest stderr: {words}");
    }
    if store.data().limits.memory_denied {
        KvError::Trapped(format!(
            "out of memory: the memory limit was reached ({what})"
        ))
    } else {
        KvError::Trapped(what)
    }
}
