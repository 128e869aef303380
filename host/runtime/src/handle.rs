//! An open store: what a C `kv_store_v1 *` points at.
//!
//! A handle may be called from many threads at once. A guest instance runs
//! one call at a time, so a handle keeps a small pool of instances (up to
//! [`Backend::max_instances`] when the backend declares shared state, else
//! exactly one) and hands each call an idle one. No lock is held while a
//! guest runs, except that `put_manifest` calls are serialised per handle.
//!
//! Visibility across instances: a backend may buffer chunks per instance
//! until `flush`. Before `put_manifest` runs on one instance, every other
//! instance that accepted a chunk before the manifest call began is flushed
//! (waiting for it if another thread is using it). If an instance holding
//! unflushed chunks is lost to a trap, the next `put_manifest` fails, so a
//! manifest never publishes chunks that were dropped. A handle also reads
//! its own writes: a `get_chunk` miss while other instances hold earlier
//! puts flushes them and asks again.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::bindings::PutOutcome;
use crate::error::KvError;
use crate::instance::{Instance, Outcome};
use crate::payload::MallocBuffer;

/// An open kv-store handle.
pub struct StoreHandle {
    backend: Arc<Backend>,
    namespace: String,
    max_instances: usize,
    pool: Mutex<Pool>,
    returned: Condvar,
    manifest_lock: Mutex<()>,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Instance>,
    /// Instances in existence: idle plus checked out.
    live: usize,
    /// Sequence number of completed chunk puts.
    puts: u64,
    /// Instance id → sequence number of its oldest unflushed put.
    unflushed: HashMap<u64, u64>,
    /// An instance with unflushed puts trapped since the last manifest.
    lost_unflushed: bool,
    /// Calls in a row whose instance was lost (trap or deadline).
    lost_streak: u32,
    /// While set and in the future, calls are refused instead of starting
    /// yet another instance that will trap: repeated traps back off.
    retry_at: Option<Instant>,
}

/// Losses in a row before calls back off.
const BACKOFF_AFTER: u32 = 3;
/// First back-off; it doubles with every further loss, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

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
    pub fn open(backend: Arc<Backend>, namespace: &str) -> Result<StoreHandle, KvError> {
        let first = Instance::open(&backend, namespace)?;
        let shared_state = backend.component.info.get().is_some_and(|i| i.shared_state);
        let max_instances = if shared_state {
            backend.max_instances.max(1)
        } else {
            1
        };
        Ok(StoreHandle {
            backend,
            namespace: namespace.to_owned(),
            max_instances,
            pool: Mutex::new(Pool {
                idle: vec![first],
                live: 1,
                ..Pool::default()
            }),
            returned: Condvar::new(),
            manifest_lock: Mutex::new(()),
        })
    }

    /// Guest instances currently serving this handle (idle or busy).
    pub fn live_instances(&self) -> usize {
        lock(&self.pool).live
    }

    /// `put_chunk`: `Ok(true)` when the hash was already present.
    pub fn put_chunk(&self, hash: &[u8], data: &[u8]) -> Result<bool, KvError> {
        self.observe(
            "put_chunk",
            data.len(),
            |_| 0,
            || {
                self.check_payload(data)?;
                self.with_instance(true, |i| i.put_chunk(hash, data))
                    .map(|outcome| outcome == PutOutcome::AlreadyPresent)
            },
        )
    }

    /// `get_chunk`. A handle reads its own writes: on a miss while other
    /// instances hold chunks put earlier through this handle, those are
    /// flushed and the get is tried once more.
    pub fn get_chunk(&self, hash: &[u8]) -> Result<MallocBuffer, KvError> {
        self.observe("get_chunk", 0, MallocBuffer::len, || {
            let cutoff = lock(&self.pool).puts;
            let instance = self.checkout()?;
            let id = instance.id();
            match instance.run(false, |i| i.get_chunk(hash)) {
                Err(KvError::NotFound) if self.unflushed_elsewhere(id, cutoff) => {
                    self.flush_others(id, cutoff)?;
                    self.with_instance(false, |i| i.get_chunk(hash))
                }
                other => other,
            }
        })
    }

    /// `put_manifest`: flush every instance that accepted chunks, then publish.
    pub fn put_manifest(&self, name: &str, data: &[u8]) -> Result<(), KvError> {
        self.observe(
            "put_manifest",
            data.len(),
            |_| 0,
            || self.publish_manifest(name, data),
        )
    }

    fn publish_manifest(&self, name: &str, data: &[u8]) -> Result<(), KvError> {
        self.check_payload(data)?;
        let _serial = lock(&self.manifest_lock);
        let cutoff = {
            let mut pool = lock(&self.pool);
            if std::mem::take(&mut pool.lost_unflushed) {
                return Err(KvError::Io(
                    "a backend instance holding unflushed chunks of this handle trapped; \
                     put the chunks again before publishing a manifest"
                        .into(),
                ));
            }
            pool.puts
        };
        let instance = self.checkout()?;
        let id = instance.id();
        self.flush_others(id, cutoff)?;
        let result = instance.run(false, |i| i.put_manifest(name, data));
        if result.is_ok() {
            // The guest flushed its own chunks as part of put-manifest.
            lock(&self.pool).unflushed.remove(&id);
        }
        result
    }

    /// `get_manifest`.
    pub fn get_manifest(&self, name: &str) -> Result<MallocBuffer, KvError> {
        self.observe("get_manifest", 0, MallocBuffer::len, || {
            self.with_instance(false, |i| i.get_manifest(name))
        })
    }

    /// `delete_manifest` (a missing name is success).
    pub fn delete_manifest(&self, name: &str) -> Result<(), KvError> {
        self.observe(
            "delete_manifest",
            0,
            |_| 0,
            || match self.with_instance(false, |i| i.delete_manifest(name)) {
                Err(KvError::NotFound) => Ok(()),
                other => other,
            },
        )
    }

    /// `prefetch_chunks`.
    pub fn prefetch_chunks(&self, hashes: &[Vec<u8>]) -> Result<(), KvError> {
        self.observe(
            "prefetch_chunks",
            0,
            |_| 0,
            || self.with_instance(false, |i| i.prefetch_chunks(hashes)),
        )
    }

    /// The tenant this handle serves: the first namespace component.
    pub fn tenant(&self) -> &str {
        self.namespace.split('/').next().unwrap_or("")
    }

    /// Run one operation: a `guest_call` span with its backend, tenant,
    /// operation, bytes and result; the per-backend counters; the back-off
    /// after repeated traps; and the backend's cap on concurrent calls.
    fn observe<T>(
        &self,
        op: &'static str,
        bytes_in: usize,
        bytes_out: impl FnOnce(&T) -> usize,
        call: impl FnOnce() -> Result<T, KvError>,
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
        let result = self.backing_off().and_then(|()| {
            let patience = Duration::from_millis(self.limits().call_timeout_ms);
            let _slot = self.backend.enter_call(patience)?;
            call()
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

    /// `Err` while this handle backs off after repeated lost instances.
    fn backing_off(&self) -> Result<(), KvError> {
        let pool = lock(&self.pool);
        match pool.retry_at {
            Some(at) if at > Instant::now() => Err(KvError::Unavailable(format!(
                "backend {:?} lost {} instances in a row (traps or deadlines); \
                 calls are refused for another {} ms",
                self.backend.name,
                pool.lost_streak,
                at.saturating_duration_since(Instant::now()).as_millis()
            ))),
            _ => Ok(()),
        }
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

    fn with_instance<T>(
        &self,
        is_put: bool,
        call: impl FnOnce(&mut Instance) -> Outcome<T>,
    ) -> Result<T, KvError> {
        self.checkout()?.run(is_put, call)
    }

    /// An idle instance, a new one if the pool may grow, else wait.
    fn checkout(&self) -> Result<CheckedOut<'_>, KvError> {
        let mut pool = lock(&self.pool);
        loop {
            if let Some(instance) = pool.idle.pop() {
                return Ok(CheckedOut::new(self, instance));
            }
            if pool.live < self.max_instances {
                pool.live += 1;
                drop(pool);
                return match Instance::open(&self.backend, &self.namespace) {
                    Ok(instance) => Ok(CheckedOut::new(self, instance)),
                    Err(e) => {
                        lock(&self.pool).live -= 1;
                        self.returned.notify_all();
                        Err(e)
                    }
                };
            }
            pool = self.returned.wait(pool).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Give a healthy instance back, recording an accepted put.
    fn checkin(&self, instance: Instance, accepted_put: bool) {
        let mut pool = lock(&self.pool);
        pool.lost_streak = 0;
        pool.retry_at = None;
        if accepted_put {
            pool.puts += 1;
            let seq = pool.puts;
            pool.unflushed.entry(instance.id).or_insert(seq);
        }
        pool.idle.push(instance);
        self.returned.notify_all();
    }

    /// Forget an instance that is gone (trapped, or dropped by a panic), and
    /// back off if that keeps happening.
    fn retire(&self, id: u64) {
        let mut pool = lock(&self.pool);
        pool.live -= 1;
        pool.lost_streak += 1;
        if pool.lost_streak >= BACKOFF_AFTER {
            let doublings = (pool.lost_streak - BACKOFF_AFTER).min(16);
            let wait = FIRST_BACKOFF
                .saturating_mul(1 << doublings)
                .min(MAX_BACKOFF);
            pool.retry_at = Some(Instant::now() + wait);
            tracing::warn!(
                backend = %self.backend.name,
                namespace = %self.namespace,
                lost = pool.lost_streak,
                "backing off for {} ms after repeated traps",
                wait.as_millis()
            );
        }
        pool.lost_unflushed |= pool.unflushed.remove(&id).is_some();
        self.returned.notify_all();
    }

    /// Whether an instance other than `own` holds puts made at or before
    /// `cutoff` that it has not flushed.
    fn unflushed_elsewhere(&self, own: u64, cutoff: u64) -> bool {
        let pool = lock(&self.pool);
        pool.unflushed
            .iter()
            .any(|(id, seq)| *id != own && *seq <= cutoff)
    }

    /// Flush every instance other than `own` holding puts made at or before
    /// `cutoff`, waiting for those in use by other threads.
    fn flush_others(&self, own: u64, cutoff: u64) -> Result<(), KvError> {
        loop {
            let mut pool = lock(&self.pool);
            let instance = loop {
                let due =
                    |id: &u64| *id != own && pool.unflushed.get(id).is_some_and(|s| *s <= cutoff);
                if !pool.unflushed.keys().any(due) {
                    return Ok(());
                }
                match pool.idle.iter().position(|i| due(&i.id)) {
                    Some(at) => break pool.idle.swap_remove(at),
                    None => pool = self.returned.wait(pool).unwrap_or_else(|p| p.into_inner()),
                }
            };
            drop(pool);
            let id = instance.id;
            CheckedOut::new(self, instance).run(false, Instance::flush)?;
            lock(&self.pool).unflushed.remove(&id);
        }
    }
}

/// An instance taken from the pool. Whatever happens, including a panic in
/// host code, it goes back to the pool or is retired, so the pool's count of
/// live instances never leaks and no caller waits forever for a slot.
struct CheckedOut<'h> {
    handle: &'h StoreHandle,
    instance: Option<Instance>,
}

impl<'h> CheckedOut<'h> {
    fn new(handle: &'h StoreHandle, instance: Instance) -> CheckedOut<'h> {
        CheckedOut {
            handle,
            instance: Some(instance),
        }
    }

    fn id(&self) -> u64 {
        self.instance.as_ref().map_or(0, |i| i.id)
    }

    /// Run `call`, then give the instance back or, if it was lost, retire it.
    fn run<T>(
        mut self,
        is_put: bool,
        call: impl FnOnce(&mut Instance) -> Outcome<T>,
    ) -> Result<T, KvError> {
        let instance = self.instance.as_mut().expect("checked out");
        let outcome = call(instance);
        let instance = self.instance.take().expect("checked out");
        match outcome {
            Outcome::Returned(result) => {
                self.handle.checkin(instance, is_put && result.is_ok());
                result
            }
            Outcome::Lost(err) => {
                // The caller logs `err`; this records the replacement.
                tracing::info!(
                    backend = %self.handle.backend.name,
                    namespace = %self.handle.namespace,
                    "guest instance discarded after: {err}; a fresh one serves the next call"
                );
                let id = instance.id;
                drop(instance);
                self.handle.retire(id);
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
                self.handle.retire(id);
            } else {
                // Never used (e.g. put_manifest's flush of others failed).
                self.handle.checkin(instance, false);
            }
        }
    }
}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut lock(&self.pool).idle);
        for instance in idle {
            instance.close();
        }
    }
}

/// Lock, recovering from poisoning: the protected state stays consistent
/// because no code path panics while holding these locks.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
