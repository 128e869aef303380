//! One guest instance serving one open store, and typed calls into it.
//!
//! Every call runs under a [`Deadline`]: the epoch deadline is armed for
//! the time left, and the call's future is abandoned when the deadline
//! passes while it waits in a host import (see [`crate::deadline`]). A
//! call that traps (panic, out-of-memory abort, stack overflow, deadline)
//! or is abandoned leaves the instance unusable: [`Outcome::Lost`] tells
//! the pool to drop it and start a fresh one for the next call.

use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::ResourceAny;
use wasmtime::{Store, Trap};

use crate::backend::Backend;
use crate::bindings::exports::kvwasm::kv_store::store::{Error as GuestError, GuestStore};
use crate::bindings::{BackendExports, PutOutcome};
use crate::capabilities::http::HttpPolicy;
use crate::deadline::{self, Deadline};
use crate::engine::Metering;
use crate::error::KvError;
use crate::guest_log::GuestStderr;
use crate::payload::{self, MallocBuffer};
use crate::state::HostState;

/// How a call into a guest ended.
pub(crate) enum Outcome<T> {
    /// The guest returned (a value or its own error); the instance is healthy.
    Returned(Result<T, KvError>),
    /// The instance trapped or was abandoned at the deadline: drop it.
    Lost(KvError),
}

/// A live guest instance with its opened `store` resource.
pub(crate) struct Instance {
    /// Unique within the process, for the pool's flush bookkeeping.
    pub(crate) id: u64,
    store: Store<HostState>,
    bindings: BackendExports,
    handle: ResourceAny,
    /// Fuel per call, on a metered backend.
    fuel: Option<u64>,
}

type CallResult<T> = wasmtime::Result<Result<T, GuestError>>;

impl Instance {
    /// Instantiate `backend`'s component and open `namespace` in it, all
    /// within `deadline`. The first instance of a component also asks the
    /// guest for its [`BackendInfo`](crate::BackendInfo).
    pub(crate) fn open(
        backend: &Backend,
        namespace: &str,
        deadline: Deadline,
    ) -> Result<Instance, KvError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let limits = backend.limits_for(namespace);
        let stderr = GuestStderr::new(&backend.name);
        let wasi = backend
            .grants
            .wasi_ctx(stderr.clone(), &backend.metrics)
            .map_err(|e| KvError::host("cannot apply the backend's grants", e))?;
        let mut table = wasmtime::component::ResourceTable::new();
        table.set_max_capacity(limits.max_resources);
        let state = HostState {
            backend: backend.name.as_str().into(),
            list_dirs: backend.grants.list_dirs,
            wasi,
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            http_policy: HttpPolicy {
                grant: backend.grants.http.clone(),
                metrics: backend.metrics.clone(),
            },
            settings: backend.config_vars.clone(),
            table,
            limits: limits.instance_limits(),
            stderr,
        };
        let mut store = Store::new(backend.component.engine, state);
        store.limiter(|s| &mut s.limits);
        // On a metered engine every call needs a budget; tenants that set
        // none get an unlimited one.
        let fuel = match backend.component.metering {
            Metering::Fuel => Some(limits.fuel.unwrap_or(u64::MAX)),
            Metering::Off => None,
        };
        arm(&mut store, deadline, fuel);
        let started = deadline::block_on(deadline, async {
            let bindings = backend
                .component
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| lost(&store, e, deadline))?;
            let guest = bindings.kvwasm_kv_store_store();
            if backend.component.info.get().is_none() {
                let info = guest
                    .call_info(&mut store)
                    .await
                    .map_err(|e| lost(&store, e, deadline))?;
                let _ = backend.component.info.set(info);
            }
            let handle = guest
                .store()
                .call_open(&mut store, namespace)
                .await
                .map_err(|e| lost(&store, e, deadline))??;
            Ok((bindings, handle))
        });
        let (bindings, handle) = started.unwrap_or(Err(KvError::Timeout(deadline.budget_ms())))?;
        Ok(Instance {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            store,
            bindings,
            handle,
            fuel,
        })
    }

    /// Run one guest method within `deadline` and classify the result.
    fn call<T>(
        &mut self,
        deadline: Deadline,
        f: impl AsyncFnOnce(&GuestStore, &mut Store<HostState>, ResourceAny) -> CallResult<T>,
    ) -> Outcome<T> {
        arm(&mut self.store, deadline, self.fuel);
        let guest = self.bindings.kvwasm_kv_store_store().store();
        let store = &mut self.store;
        match deadline::block_on(deadline, f(&guest, store, self.handle)) {
            None => Outcome::Lost(KvError::Timeout(deadline.budget_ms())),
            Some(Ok(result)) => Outcome::Returned(result.map_err(KvError::from)),
            Some(Err(err)) => Outcome::Lost(lost(&self.store, err, deadline)),
        }
    }

    pub(crate) fn put_chunk(
        &mut self,
        deadline: Deadline,
        hash: &[u8],
        data: &[u8],
    ) -> Outcome<PutOutcome> {
        self.call(deadline, async |guest, store, handle| {
            payload::lend(store, data, async |store, data| {
                guest.call_put_chunk(store, handle, hash, data).await
            })
            .await?
        })
    }

    pub(crate) fn get_chunk(&mut self, deadline: Deadline, hash: &[u8]) -> Outcome<MallocBuffer> {
        self.call(deadline, async |guest, store, handle| {
            match guest.call_get_chunk(&mut *store, handle, hash).await? {
                Ok(payload) => Ok(Ok(payload::take(store, payload)?)),
                Err(e) => Ok(Err(e)),
            }
        })
    }

    pub(crate) fn put_manifest(
        &mut self,
        deadline: Deadline,
        name: &str,
        data: &[u8],
    ) -> Outcome<()> {
        self.call(deadline, async |guest, store, handle| {
            payload::lend(store, data, async |store, data| {
                guest.call_put_manifest(store, handle, name, data).await
            })
            .await?
        })
    }

    pub(crate) fn get_manifest(&mut self, deadline: Deadline, name: &str) -> Outcome<MallocBuffer> {
        self.call(deadline, async |guest, store, handle| {
            match guest.call_get_manifest(&mut *store, handle, name).await? {
                Ok(payload) => Ok(Ok(payload::take(store, payload)?)),
                Err(e) => Ok(Err(e)),
            }
        })
    }

    pub(crate) fn delete_manifest(&mut self, deadline: Deadline, name: &str) -> Outcome<()> {
        self.call(deadline, async |guest, store, handle| {
            guest.call_delete_manifest(store, handle, name).await
        })
    }

    pub(crate) fn prefetch_chunks(
        &mut self,
        deadline: Deadline,
        hashes: &[Vec<u8>],
    ) -> Outcome<()> {
        self.call(deadline, async |guest, store, handle| {
            guest.call_prefetch_chunks(store, handle, hashes).await
        })
    }

    pub(crate) fn flush(&mut self, deadline: Deadline) -> Outcome<()> {
        self.call(deadline, async |guest, store, handle| {
            guest.call_flush(store, handle).await
        })
    }

    /// Drop the guest's `store` resource (running its destructor, e.g. to
    /// close connections) before the instance goes away; a destructor still
    /// running at `deadline` is abandoned with the instance.
    pub(crate) fn close(mut self, deadline: Deadline) {
        arm(&mut self.store, deadline, self.fuel);
        let handle = self.handle;
        match deadline::block_on(deadline, handle.resource_drop_async(&mut self.store)) {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::debug!("closing a guest store failed: {e:#}"),
            None => crate::log_limit::warn(
                ("slow destructor", self.store.data().backend.as_ref()),
                format_args!(
                    "backend {:?}: a store's destructor ran past the {} ms deadline; \
                     its instance was discarded",
                    self.store.data().backend,
                    deadline.budget_ms()
                ),
            ),
        }
    }
}

/// Arm the epoch deadline and the fuel budget for the next call, and start
/// it with a clean out-of-memory flag.
fn arm(store: &mut Store<HostState>, deadline: Deadline, fuel: Option<u64>) {
    store.set_epoch_deadline(deadline.epoch_ticks());
    store.data_mut().limits.memory_denied = false;
    if let Some(fuel) = fuel {
        store
            .set_fuel(fuel)
            .expect("fuel is set only on a metered backend's engine");
    }
}

/// Describe a trap (or other fatal error) that ended an instance, in one
/// line: the trap code, not the wasm backtrace.
fn lost(store: &Store<HostState>, err: wasmtime::Error, deadline: Deadline) -> KvError {
    let trap = err.downcast_ref::<Trap>();
    if trap == Some(&Trap::Interrupt) {
        return KvError::Timeout(deadline.budget_ms());
    }
    if trap == Some(&Trap::OutOfFuel) {
        return KvError::Limit("the call used up its fuel budget".into());
    }
    if let Some(wasmtime::component::ResourceTableError::Full) = err.downcast_ref() {
        return KvError::Limit(format!(
            "the instance already holds its maximum of {} resources (files, sockets, \
             payloads...; `max_resources`)",
            store.data().table.max_capacity()
        ));
    }
    let mut what = trap.map_or_else(
        || crate::log_limit::bounded(format!("{err:#}")),
        Trap::to_string,
    );
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
