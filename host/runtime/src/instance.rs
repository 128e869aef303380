//! One guest instance serving one open store, and typed calls into it.
//!
//! Every call runs under a [`Deadline`]: the epoch deadline is armed for
//! the time left, and the call's future is abandoned when the deadline
//! passes while it waits in a host import (see [`crate::deadline`]). A
//! call that traps (panic, out-of-memory abort, stack overflow, deadline)
//! or is abandoned leaves the instance unusable: [`Outcome::Lost`] tells
//! the pool to drop it and start a fresh one for the next call.

use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use crate::backend::Backend;
use crate::bindings::exports::kvwasm::kv_store::store::{Error as GuestError, GuestStore};
use crate::bindings::{BackendExports, PutOutcome};
use crate::capabilities::store_dirs::Identity;
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::payload::{self, MallocBuffer, Taken};
use crate::sandbox;
pub(crate) use crate::sandbox::Outcome;
use crate::state::HostState;

/// A live guest instance with its opened `store` resource.
pub(crate) struct Instance {
    /// Unique within the process, for the pool's flush bookkeeping.
    pub(crate) id: u64,
    store: Store<HostState>,
    bindings: BackendExports,
    handle: ResourceAny,
    /// Fuel per call, on a metered backend.
    fuel: Option<u64>,
    /// On a warm handle's pool: the store's directories when this instance
    /// opened them (its descriptors name those, whatever the paths name
    /// later).
    pub(crate) dirs_at_start: Option<Identity>,
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
        let pre = backend.component.store_pre()?;
        let (mut store, fuel) = sandbox::new_store(backend, namespace)?;
        let started = sandbox::run(&mut store, deadline, fuel, async |store| {
            let bindings = pre.instantiate_async(&mut *store).await?;
            let guest = bindings.kvwasm_kv_store_store();
            if backend.component.info.get().is_none() {
                let info = guest.call_info(&mut *store).await?;
                let _ = backend.component.info.set(info);
            }
            Ok(guest
                .store()
                .call_open(&mut *store, namespace)
                .await?
                .map(|handle| (bindings, handle)))
        });
        let (bindings, handle) = match started {
            Outcome::Returned(result) => result?,
            Outcome::Lost(err) => return Err(err),
        };
        Ok(Instance {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            store,
            bindings,
            handle,
            fuel,
            dirs_at_start: None,
        })
    }

    /// Run one guest method within `deadline` and classify the result.
    fn call<T: Send>(
        &mut self,
        deadline: Deadline,
        f: impl AsyncFnOnce(&GuestStore, &mut Store<HostState>, ResourceAny) -> CallResult<T> + Send,
    ) -> Outcome<T> {
        let guest = self.bindings.kvwasm_kv_store_store().store();
        let handle = self.handle;
        sandbox::run(&mut self.store, deadline, self.fuel, async |store| {
            f(&guest, store, handle).await
        })
    }

    /// Bytes of linear memory and tables this instance holds.
    pub(crate) fn memory_held(&self) -> usize {
        self.store.data().limits.memory_held()
    }

    pub(crate) fn put_chunk(
        &mut self,
        deadline: Deadline,
        hash: &[u8],
        data: &[u8],
    ) -> Outcome<PutOutcome> {
        self.call(deadline, async |guest, store, handle| {
            payload::resource::lend(store, data, async |store, data| {
                guest.call_put_chunk(store, handle, hash, data).await
            })
            .await?
        })
    }

    /// `get_chunk`: a block, or, under a `get_chunk_into`, maybe the chunk
    /// read into the caller's buffer.
    pub(crate) fn get_chunk(&mut self, deadline: Deadline, hash: &[u8]) -> Outcome<Taken> {
        self.call(deadline, async |guest, store, handle| {
            match guest.call_get_chunk(&mut *store, handle, hash).await? {
                Ok(payload) => Ok(Ok(payload::resource::take(store, payload)?)),
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
            payload::resource::lend(store, data, async |store, data| {
                guest.call_put_manifest(store, handle, name, data).await
            })
            .await?
        })
    }

    pub(crate) fn get_manifest(&mut self, deadline: Deadline, name: &str) -> Outcome<MallocBuffer> {
        self.call(deadline, async |guest, store, handle| {
            match guest.call_get_manifest(&mut *store, handle, name).await? {
                Ok(payload) => Ok(Ok(payload::resource::take(store, payload)?.into_block()?)),
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
        let handle = self.handle;
        let closed = sandbox::run(&mut self.store, deadline, self.fuel, async |store| {
            handle
                .resource_drop_async(store)
                .await
                .map(Ok::<(), KvError>)
        });
        match closed {
            Outcome::Returned(_) => {}
            Outcome::Lost(KvError::Timeout(_)) => crate::log_limit::warn(
                ("slow destructor", self.store.data().backend.as_ref()),
                format_args!(
                    "backend {:?}: a store's destructor ran past the {} ms deadline; \
                     its instance was discarded",
                    self.store.data().backend,
                    deadline.budget_ms()
                ),
            ),
            Outcome::Lost(e) => tracing::debug!("closing a guest store failed: {e}"),
        }
    }
}
