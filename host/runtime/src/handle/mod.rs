//! An open store: what a C `kv_store_v1 *` refers to.
//!
//! A handle may be called from many threads at once. A guest instance runs
//! one call at a time, so a handle keeps a small [`pool`] of instances (up
//! to [`Backend::max_instances`] when the backend declares shared state,
//! else exactly one) and hands each call an idle one. No lock is held while
//! a guest runs; `put_manifest` calls take turns per handle.
//!
//! Every operation gets one [`Deadline`] (`call_timeout_ms`) covering all
//! it does: waiting for an instance, flushing others, the guest call.
//!
//! Visibility across instances: a backend may buffer chunks per instance
//! until `flush`. Before `put_manifest` runs on one instance, every other
//! instance that accepted a chunk before the manifest call began is flushed
//! (waiting for it if another thread is using it); chunks lost with an
//! instance fail the next manifest that covers them ([`durability`]). A
//! handle also reads its own writes: a `get_chunk` miss while other
//! instances hold earlier puts flushes them and asks again.
//!
//! Idle instances are released after the backend's `idle_release_ms` by
//! the [`reaper`], except those holding unflushed puts, those of backends
//! whose data lives in their instance, and the last one of a warm handle
//! (`warm_handles`, on `builtin:fs`); the next call starts one.

mod durability;
mod pool;
mod reaper;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use pool::{CallKind, CheckedOut, Pool, Release, Warm};

use crate::backend::Backend;
use crate::bindings::PutOutcome;
use crate::capabilities::dirs::DirGrant;
use crate::capabilities::in_place::FoundInPlace;
use crate::capabilities::store_dirs::StoreDirs;
use crate::component::{Builtin, ComponentSource};
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::instance::Instance;
use crate::payload::target::{ChunkInto, ReadTarget};
use crate::payload::{MallocBuffer, Taken};

/// Where the chunk calls of a tiered store's handle go: the tiered store
/// ([`crate::tiering`]) implements it over handles of its own, one per tier,
/// so this module does not depend on it. `Any`, so that the tiered store
/// finds itself behind a consumer's handle.
pub(crate) trait ChunkTiers: std::any::Any + Send + Sync {
    fn put_chunk(&self, hash: &[u8], data: &[u8]) -> Result<bool, KvError>;
    fn get_chunk(&self, hash: &[u8]) -> Result<Taken, KvError>;
    fn prefetch_chunks(&self, hashes: &[Vec<u8>]) -> Result<(), KvError>;
    /// A manifest named `name` is about to be read or published.
    fn note_manifest(&self, name: &str);
    /// Make every chunk put through any tier readable.
    fn flush(&self) -> Result<(), KvError>;
}

/// An open kv-store handle.
pub struct StoreHandle {
    backend: Arc<Backend>,
    namespace: String,
    pool: Arc<Pool>,
    /// On a tiered store's handle (this one serves its last tier, where
    /// manifests live): the tiers that chunk calls go to.
    tiered: Option<Box<dyn ChunkTiers>>,
    /// On a `builtin:fs` store: the chunks the host finds in place itself.
    in_place: Option<Arc<FoundInPlace>>,
}

/// Open handles on backends whose state lives inside their one instance,
/// by (backend, namespace).
type PrivateStateStores = HashMap<(usize, String), Weak<StoreHandle>>;
static PRIVATE_STATE: LazyLock<Mutex<PrivateStateStores>> = LazyLock::new(Default::default);

/// Open a handle on `namespace` for a consumer.
///
/// A backend that declares `shared-state: false` (the in-memory one) keeps
/// its data in its single instance. All handles on the same backend and
/// namespace then share one store while any of them is open, so a second
/// handle sees what the first published, as the ABI's visibility rule
/// expects of any backend. The store is gone when the last handle closes.
pub fn open_shared(backend: Arc<Backend>, namespace: &str) -> Result<Arc<StoreHandle>, KvError> {
    let shared_state = |b: &Backend| b.component.info.get().map(|i| i.shared_state);
    if shared_state(&backend) == Some(true) {
        return StoreHandle::open(backend, namespace).map(Arc::new);
    }
    // The Arc keeps the backend alive, so its address names it while the
    // entry can still be upgraded.
    let key = (Arc::as_ptr(&backend) as usize, namespace.to_owned());
    if let Some(open) = lock(&PRIVATE_STATE).get(&key).and_then(Weak::upgrade) {
        return Ok(open);
    }
    // Opened without the registry lock: opening runs guest code, and one
    // slow guest must not hold up every other open in the process.
    let handle = Arc::new(StoreHandle::open(backend.clone(), namespace)?);
    if shared_state(&backend) == Some(true) {
        return Ok(handle);
    }
    let mut stores = lock(&PRIVATE_STATE);
    if let Some(raced) = stores.get(&key).and_then(Weak::upgrade) {
        // Another thread opened the same store meanwhile: share theirs.
        return Ok(raced);
    }
    stores.retain(|_, store| store.strong_count() > 0);
    stores.insert(key, Arc::downgrade(&handle));
    Ok(handle)
}

impl StoreHandle {
    /// Open `namespace` on `backend`. The first instance starts now, so a
    /// bad namespace or a broken component fails here, not on first use.
    /// On a backend with shared state it may be released once idle.
    pub fn open(backend: Arc<Backend>, namespace: &str) -> Result<StoreHandle, KvError> {
        let call_timeout_ms = backend.limits_for(namespace).call_timeout_ms;
        let first = Instance::open(&backend, namespace, Deadline::after_ms(call_timeout_ms))?;
        let shared_state = backend.component.info.get().is_some_and(|i| i.shared_state);
        let max_instances = if shared_state {
            backend.max_instances.max(1)
        } else {
            1
        };
        let label = format!("backend {:?}, namespace {namespace:?}", backend.name);
        let in_place = Self::in_place(&backend, namespace);
        // A private-state backend's data lives in its instance: never released.
        let release = (shared_state && backend.idle_release_ms > 0).then(|| Release {
            after: std::time::Duration::from_millis(backend.idle_release_ms),
            metrics: backend.metrics.clone(),
            warm: Self::warm(&backend, namespace),
        });
        let pool = Arc::new(Pool::new(
            first,
            max_instances,
            label,
            release,
            in_place.clone(),
        ));
        if pool.release_after().is_some() {
            reaper::watch(&pool);
        }
        backend.start_publishing();
        Ok(StoreHandle {
            pool,
            backend,
            namespace: namespace.to_owned(),
            tiered: None,
            in_place,
        })
    }

    /// The chunks the host finds in place itself, on a `builtin:fs` store
    /// that syncs: with `durability = "none"` the guest syncs nothing, so
    /// the host has no sync record to answer from.
    fn in_place(backend: &Backend, namespace: &str) -> Option<Arc<FoundInPlace>> {
        let syncs = backend
            .grants
            .settings
            .values
            .get("durability")
            .map(String::as_str)
            != Some("none");
        let grant = Self::fs_data_grant(backend).filter(|_| syncs)?;
        FoundInPlace::for_store(&grant.host, namespace)
    }

    /// How the handle may keep a warm instance (`builtin:fs` only: the host
    /// knows its store's directories, to check before a kept instance is
    /// used again).
    fn warm(backend: &Backend, namespace: &str) -> Option<Warm> {
        let grant = Self::fs_data_grant(backend).filter(|_| backend.warm_handles > 0)?;
        Some(Warm {
            handles: backend.warm_handles,
            group: format!("{}\0{}", backend.name, grant.host.display()).into(),
            dirs: StoreDirs::new(&grant.host, namespace)?,
        })
    }

    /// The directory a `builtin:fs` backend stores in.
    fn fs_data_grant(backend: &Backend) -> Option<&DirGrant> {
        if !matches!(backend.source, ComponentSource::Builtin(Builtin::Fs)) {
            return None;
        }
        backend
            .grants
            .dirs
            .iter()
            .find(|d| d.guest == crate::capabilities::DATA_DIR)
    }

    /// This handle (on the last tier) as the front of `tiers`: chunk calls
    /// go to the tiers, manifests stay here.
    pub(crate) fn with_tiers(mut self, tiers: impl ChunkTiers) -> StoreHandle {
        self.tiered = Some(Box::new(tiers));
        self
    }

    /// The tiers this handle fronts, if it is a tiered store's.
    pub(crate) fn tiers(&self) -> Option<&dyn ChunkTiers> {
        self.tiered.as_deref()
    }

    /// Make every chunk accepted through this handle visible to other
    /// readers (and durable, where the medium allows), as a `put_manifest`
    /// does first.
    pub fn flush(&self) -> Result<(), KvError> {
        self.operation(
            "flush",
            0,
            |_| 0,
            |deadline| {
                let call = self.pool.begin_manifest();
                // No instance has id 0: every instance holding puts is due.
                self.flush_others(0, call.cutoff, deadline)?;
                self.pool
                    .lock()
                    .durability
                    .take_loss(call.cutoff, call.ticket)
            },
        )
    }

    /// Guest instances currently serving this handle (idle or busy).
    pub fn live_instances(&self) -> usize {
        self.pool.live()
    }

    /// Take an instance out of this handle's pool (the idle one used last,
    /// else a new one) and keep it, unused, until the guard drops: calls
    /// made meanwhile run on other instances. For tests that need calls
    /// spread over instances, which threads happening to overlap in time
    /// does not guarantee.
    #[doc(hidden)]
    pub fn hold_instance(&self) -> Result<impl Drop + '_, KvError> {
        self.checkout(Deadline::after_ms(self.limits().call_timeout_ms))
    }

    /// `put_chunk`: `Ok(true)` when the hash was already present.
    ///
    /// On a `builtin:fs` store, a chunk in place in a version the host
    /// synced is answered here, without a guest instance (see
    /// [`FoundInPlace`]).
    pub fn put_chunk(&self, hash: &[u8], data: &[u8]) -> Result<bool, KvError> {
        if let Some(tiers) = &self.tiered {
            return tiers.put_chunk(hash, data);
        }
        self.operation(
            "put_chunk",
            data.len(),
            |_| 0,
            |deadline| {
                self.check_payload(data)?;
                if let Some(in_place) = &self.in_place
                    && in_place.durable(hash, data.len())
                {
                    self.backend.metrics.put_found_in_place();
                    self.backend.publish_stored(hash);
                    return Ok(true);
                }
                self.checkout(deadline)?
                    .run(CallKind::Put, |i| i.put_chunk(deadline, hash, data))
                    .inspect(|_| self.backend.publish_stored(hash))
                    .map(|outcome| outcome == PutOutcome::AlreadyPresent)
            },
        )
    }

    /// `get_chunk`. A handle reads its own writes: on a miss while other
    /// instances hold chunks put earlier through this handle, those are
    /// flushed and the get is tried once more.
    pub fn get_chunk(&self, hash: &[u8]) -> Result<MallocBuffer, KvError> {
        self.get_chunk_taken(hash)?.into_block()
    }

    /// [`get_chunk`](StoreHandle::get_chunk) into `buf`: a guest that reads
    /// the chunk from a file (`builtin:fs`) has the host `pread` it straight
    /// into `buf`; another guest's answer is copied into it. On an error,
    /// and on [`ChunkInto::TooSmall`], `buf` holds nothing meaningful.
    pub fn get_chunk_into(&self, hash: &[u8], buf: &mut [u8]) -> Result<ChunkInto, KvError> {
        let cap = buf.len();
        let got = {
            // SAFETY: `buf` is borrowed mutably for this call and not
            // touched until the target is unset, at the end of this block.
            let _target = unsafe { ReadTarget::set(buf.as_mut_ptr(), cap) };
            self.get_chunk_taken(hash)?
        };
        match got {
            Taken::InTarget(len) => {
                self.backend.metrics.chunk_read_in_place();
                Ok(ChunkInto::Read(len))
            }
            Taken::Block(block) if block.len() > cap => Ok(ChunkInto::TooSmall(block.len())),
            Taken::Block(block) => {
                buf[..block.len()].copy_from_slice(block.as_slice());
                Ok(ChunkInto::Read(block.len()))
            }
        }
    }

    /// `get_chunk`, whose answer may be in this thread's `get_chunk_into`
    /// target, if one is set.
    pub(crate) fn get_chunk_taken(&self, hash: &[u8]) -> Result<Taken, KvError> {
        if let Some(tiers) = &self.tiered {
            return tiers.get_chunk(hash);
        }
        self.operation("get_chunk", 0, Taken::len, |deadline| {
            let instance = self.checkout(deadline)?;
            let id = instance.id();
            // Decided before the get (one lock, taken once the instance is
            // ours): a flush by another thread that ends during the get must
            // not make its miss look final.
            let (cutoff, others_hold_puts) = {
                let state = self.pool.lock();
                let cutoff = state.durability.cutoff();
                (cutoff, state.durability.any_due(id, cutoff))
            };
            match instance.run(CallKind::Other, |i| i.get_chunk(deadline, hash)) {
                Err(KvError::NotFound) if others_hold_puts => {
                    self.flush_others(id, cutoff, deadline)?;
                    self.checkout(deadline)?
                        .run(CallKind::Other, |i| i.get_chunk(deadline, hash))
                }
                other => other,
            }
        })
    }

    /// `put_manifest`: flush every instance that accepted chunks, then publish.
    pub fn put_manifest(&self, name: &str, data: &[u8]) -> Result<(), KvError> {
        if let Some(tiers) = &self.tiered {
            // Every chunk put through any tier is visible before the manifest.
            tiers.note_manifest(name);
            tiers.flush()?;
        }
        self.operation(
            "put_manifest",
            data.len(),
            |_| 0,
            |deadline| {
                self.check_payload(data)?;
                let call = self.pool.begin_manifest();
                let cutoff = call.cutoff;
                let _turn = self.pool.manifest_turn(deadline)?;
                let instance = self.checkout(deadline)?;
                self.flush_others(instance.id(), cutoff, deadline)?;
                // Checked after the flushes: an instance lost during them, or in
                // another thread's call since the cutoff, is seen here. The
                // instances still holding unflushed puts hold only later ones.
                self.pool.lock().durability.take_loss(cutoff, call.ticket)?;
                instance.run(CallKind::Flush, |i| i.put_manifest(deadline, name, data))
            },
        )
    }

    /// `get_manifest`.
    pub fn get_manifest(&self, name: &str) -> Result<MallocBuffer, KvError> {
        if let Some(tiers) = &self.tiered {
            tiers.note_manifest(name);
        }
        self.operation("get_manifest", 0, MallocBuffer::len, |deadline| {
            self.checkout(deadline)?
                .run(CallKind::Other, |i| i.get_manifest(deadline, name))
        })
    }

    /// `delete_manifest` (a missing name is success).
    pub fn delete_manifest(&self, name: &str) -> Result<(), KvError> {
        self.operation(
            "delete_manifest",
            0,
            |_| 0,
            |deadline| match self
                .checkout(deadline)?
                .run(CallKind::Other, |i| i.delete_manifest(deadline, name))
            {
                Err(KvError::NotFound) => Ok(()),
                other => other,
            },
        )
    }

    /// `prefetch_chunks`.
    pub fn prefetch_chunks(&self, hashes: &[Vec<u8>]) -> Result<(), KvError> {
        if let Some(tiers) = &self.tiered {
            return tiers.prefetch_chunks(hashes);
        }
        self.operation(
            "prefetch_chunks",
            0,
            |_| 0,
            |deadline| {
                self.checkout(deadline)?
                    .run(CallKind::Other, |i| i.prefetch_chunks(deadline, hashes))
            },
        )
    }

    /// The tenant this handle serves: the first namespace component.
    pub fn tenant(&self) -> &str {
        self.namespace.split('/').next().unwrap_or("")
    }

    /// The deadline the operations on this handle get.
    pub fn call_timeout_ms(&self) -> u64 {
        self.limits().call_timeout_ms
    }

    /// Run one operation within its deadline, behind the gates that may
    /// refuse it (the back-off after repeated traps, the backend's cap on
    /// concurrent calls), in a `guest_call` span with its backend, tenant,
    /// operation, bytes and result, counted in the backend's metrics.
    fn operation<T>(
        &self,
        op: &'static str,
        bytes_in: usize,
        bytes_out: impl FnOnce(&T) -> usize,
        call: impl FnOnce(Deadline) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let span = tracing::debug_span!(
            "guest_call",
            backend = %self.backend.name,
            tenant = self.tenant(),
            op,
            bytes_in,
            bytes_out = tracing::field::Empty,
            result = tracing::field::Empty,
        );
        let _entered = span.enter();
        let deadline = Deadline::after_ms(self.limits().call_timeout_ms);
        let backoff = self.pool.check_backoff(&self.backend.name);
        let result = backoff.and_then(|()| {
            let _slot = self.backend.enter_call(deadline)?;
            call(deadline)
        });
        let out = result.as_ref().map_or(0, bytes_out);
        span.record("bytes_out", out);
        span.record("result", result.as_ref().map_or_else(KvError::code, |_| 0));
        self.backend
            .metrics
            .record(bytes_in, out, result.as_ref().err());
        result
    }

    fn limits(&self) -> &crate::limits::Limits {
        self.backend.limits_for(&self.namespace)
    }

    /// Inputs obey the same size limit as outputs.
    fn check_payload(&self, data: &[u8]) -> Result<(), KvError> {
        let limits = self.limits();
        if data.len() as u64 > limits.max_payload_bytes() {
            return Err(KvError::Limit(format!(
                "payload of {} bytes exceeds the backend's limit of {} MiB",
                data.len(),
                limits.max_payload_mib
            )));
        }
        Ok(())
    }

    /// An instance for one call (see [`Pool::checkout`]).
    fn checkout(&self, deadline: Deadline) -> Result<CheckedOut<'_>, KvError> {
        self.pool.checkout(deadline, &self.backend.name, || {
            Instance::open(&self.backend, &self.namespace, deadline)
        })
    }

    /// Flush every instance other than `own` holding puts made at or before
    /// `cutoff`, waiting for those in use by other threads.
    fn flush_others(&self, own: u64, cutoff: u64, deadline: Deadline) -> Result<(), KvError> {
        while let Some(instance) = self.pool.checkout_due(own, cutoff, deadline)? {
            instance.run(CallKind::Flush, |i| i.flush(deadline))?;
        }
        Ok(())
    }
}

impl Drop for StoreHandle {
    /// Close the idle instances (no call is in flight: calls hold the
    /// handle), within one deadline for all of them.
    fn drop(&mut self) {
        let deadline = Deadline::after_ms(self.limits().call_timeout_ms);
        for instance in self.pool.take_idle() {
            instance.close(deadline);
        }
    }
}

/// Lock, recovering from poisoning: the protected state stays consistent
/// because no code path panics while holding these locks.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
