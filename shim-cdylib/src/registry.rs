//! Open handles, by the number the consumer holds.
//!
//! The `kv_store_v1 *` returned by `open` encodes a registry key (never
//! reused in a process), not an address. A call looks its handle up and
//! holds a reference for its duration, so:
//!
//! * a NULL, garbage, or already closed handle is `-10`, never a read of
//!   freed memory;
//! * `close` while other threads are in calls on the same handle removes it
//!   (new calls get `-10`), then waits for the calls in flight, up to the
//!   handle's call deadline plus a second, before releasing it. Calls still
//!   running then (a deadline cannot be missed by more than its slack)
//!   release it when they return.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use kv_store_abi::KvStore;
use kvwasm_host::{KvError, StoreHandle};

/// One consumer handle. (Handles on an in-memory backend share one
/// `StoreHandle`; each `open` still gets its own entry.)
type Entry = Arc<Arc<StoreHandle>>;

/// Keys are small integers the shim hands out, not attacker-chosen: the
/// fast non-keyed hash is fine, and every call looks one up.
type Handles = rustc_hash::FxHashMap<usize, Entry>;

static HANDLES: LazyLock<RwLock<Handles>> = LazyLock::new(Default::default);

/// Keys are multiplied by this, so the pointers look like aligned heap
/// pointers to consumers that check, and are never NULL.
const KEY_STRIDE: usize = 16;

/// Register a newly opened handle; its `kv_store_v1 *`.
pub(crate) fn insert(handle: Arc<StoreHandle>) -> *mut KvStore {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let key = NEXT.fetch_add(1, Ordering::Relaxed);
    write().insert(key, Arc::new(handle));
    // Integer-to-pointer on purpose: the pointer is an opaque name.
    (key * KEY_STRIDE) as *mut KvStore
}

/// The handle behind `ptr`, held for the caller's call.
pub(crate) fn get(ptr: *mut KvStore) -> Result<Entry, KvError> {
    let key = key(ptr)?;
    read().get(&key).cloned().ok_or_else(|| {
        KvError::BadInput(format!(
            "handle {ptr:p} is not open (closed, or never opened)"
        ))
    })
}

/// Remove `ptr`'s handle and release it once the calls in flight on it
/// have returned.
pub(crate) fn close(ptr: *mut KvStore) -> Result<(), KvError> {
    let key = key(ptr)?;
    let entry = write()
        .remove(&key)
        .ok_or_else(|| KvError::BadInput(format!("handle {ptr:p} is not open (closed twice?)")))?;
    let patience = Duration::from_millis(entry.call_timeout_ms()) + Duration::from_secs(1);
    let until = Instant::now() + patience;
    while Arc::strong_count(&entry) > 1 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    if Arc::strong_count(&entry) > 1 {
        tracing::warn!(
            "close: calls on this handle were still running after {} ms; \
             the last of them releases it",
            patience.as_millis()
        );
    }
    Ok(())
}

fn key(ptr: *mut KvStore) -> Result<usize, KvError> {
    let addr = ptr as usize;
    if addr == 0 {
        return Err(KvError::BadInput("NULL handle".into()));
    }
    if !addr.is_multiple_of(KEY_STRIDE) {
        return Err(KvError::BadInput(format!("handle {ptr:p} is not open")));
    }
    Ok(addr / KEY_STRIDE)
}

fn read() -> std::sync::RwLockReadGuard<'static, Handles> {
    HANDLES.read().unwrap_or_else(|p| p.into_inner())
}

fn write() -> std::sync::RwLockWriteGuard<'static, Handles> {
    HANDLES.write().unwrap_or_else(|p| p.into_inner())
}
