//! `libkv_store_wasm.so`: the `kv_store_v1` C ABI (vtable version 2) in
//! front of [`kvwasm_host`].
//!
//! Every entry point catches panics, checks its pointers and lengths, and
//! turns failures into a negative return (or NULL from `open`) with the
//! reason logged to stderr. Log level: `KVWASM_LOG` (default `warn`; a miss
//! on `get_*` is logged at `debug`).
//!
//! The `kv_store_v1 *` given to the consumer is a number, not an address:
//! the key of the handle in a process-wide [`registry`]. Every call looks it
//! up, so a closed, never-opened or garbage handle is refused with `-10`
//! rather than dereferenced, and `close` while other threads are in calls
//! on the same handle is safe: calls hold the handle until they return, and
//! `close` waits for them (up to the handle's call deadline).
//!
//! Log lines about failed calls are rate-limited per operation and code
//! (`kvwasm_host::log_limit`): a guest that fails every call cannot flood
//! the consumer's log.

mod registry;

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use kv_store_abi::{KvStore, VERSION_PREFETCH, Vtable};
use kvwasm_host::{ChunkInto, KvError, MallocBuffer};

static VTABLE: Vtable = Vtable {
    version: VERSION_PREFETCH,
    open: Some(open),
    close: Some(close),
    put_chunk: Some(put_chunk),
    get_chunk: Some(get_chunk),
    put_manifest: Some(put_manifest),
    get_manifest: Some(get_manifest),
    delete_manifest: Some(delete_manifest),
    prefetch_chunks: Some(prefetch_chunks),
};

/// The one symbol a consumer needs. Consumers call it once, when they load
/// the library: the one-time setup ([`kvwasm_host::prepare`]) is done here,
/// not in their first open.
#[unsafe(no_mangle)]
pub extern "C" fn kv_store_get_vtable() -> *const Vtable {
    static PREPARED: std::sync::Once = std::sync::Once::new();
    PREPARED.call_once(|| {
        init_logging();
        if catch_unwind(kvwasm_host::prepare).is_err() {
            tracing::error!("internal panic caught while preparing the library");
        }
    });
    &VTABLE
}

/// Run an entry point: no panic crosses the FFI boundary, every failure is
/// logged with the operation's name and becomes a negative code.
fn entry(op: &'static str, body: impl FnOnce() -> Result<i32, KvError>) -> i32 {
    let checked = || {
        kvwasm_host::engine::check_not_forked()?;
        body()
    };
    match catch_unwind(AssertUnwindSafe(checked)) {
        Ok(Ok(rc)) => rc,
        Ok(Err(err)) => {
            if err.is_miss() {
                tracing::debug!(op, code = err.code(), "{err}");
            } else if let Some(suppressed) = kvwasm_host::log_limit::admit((op, err.code())) {
                tracing::warn!(op, code = err.code(), suppressed, "{err}");
            }
            err.code()
        }
        Err(panic) => {
            tracing::error!(
                op,
                "internal panic caught at the C boundary: {}",
                panic_message(&panic)
            );
            -1
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("KVWASM_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // A host application may already have a subscriber; keep it.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Colours only for a terminal: engine logs are often files.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .try_init();
    });
}

fn bad(what: impl Into<String>) -> KvError {
    KvError::BadInput(what.into())
}

/// Most bytes in one hash (the WIT contract: 1 to 64).
const MAX_HASH_LEN: usize = 64;
/// Most hashes in one `prefetch_chunks` call.
const MAX_PREFETCH_HASHES: usize = 1 << 20;

/// A borrowed input buffer: NULL is allowed only with length 0.
///
/// # Safety
/// A non-NULL `ptr` points at `len` readable bytes for the call.
unsafe fn bytes<'a>(ptr: *const u8, len: usize, what: &str) -> Result<&'a [u8], KvError> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(bad(format!("{what} is NULL with length {len}")))
        };
    }
    span_ok(ptr, len, what)?;
    // SAFETY: per the contract above; `span_ok` holds.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// `len` bytes at a non-NULL `ptr` can be a Rust slice: at most
/// `isize::MAX` bytes, ending before the address space does. A length
/// beyond that cannot describe memory the caller owns, and a slice made of
/// it is undefined behaviour before any byte is touched: refused as bad
/// input instead.
fn span_ok(ptr: *const u8, len: usize, what: &str) -> Result<(), KvError> {
    let too_long = isize::try_from(len).is_err();
    if too_long || ptr.addr().checked_add(len).is_none() {
        return Err(bad(format!(
            "{what} of {len} bytes at {ptr:p} runs past the address space"
        )));
    }
    Ok(())
}

/// `hash_len` within 1..=[`MAX_HASH_LEN`].
fn hash_len_ok(len: usize) -> Result<(), KvError> {
    if len == 0 || len > MAX_HASH_LEN {
        return Err(bad(format!("hash_len {len} is outside 1..={MAX_HASH_LEN}")));
    }
    Ok(())
}

/// A hash: non-NULL, 1 to 64 bytes.
///
/// # Safety
/// As [`bytes`].
unsafe fn hash<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], KvError> {
    hash_len_ok(len)?;
    // SAFETY: forwarded.
    unsafe { bytes(ptr, len, "hash") }
}

/// A manifest name: non-NULL, NUL-terminated, UTF-8 (the guest applies the
/// naming rules).
///
/// # Safety
/// A non-NULL `ptr` points at a NUL-terminated string.
unsafe fn name<'a>(ptr: *const c_char) -> Result<&'a str, KvError> {
    if ptr.is_null() {
        return Err(bad("manifest name is NULL"));
    }
    // SAFETY: per the contract above.
    let name = unsafe { CStr::from_ptr(ptr) };
    name.to_str()
        .map_err(|_| bad(format!("manifest name {name:?} is not valid UTF-8")))
}

/// Hand a result buffer to the consumer (it frees it with `free`).
///
/// # Safety
/// `out` and `out_len` are valid for writes.
unsafe fn deliver(buffer: MallocBuffer, out: *mut *mut u8, out_len: *mut usize) -> i32 {
    let (ptr, len) = buffer.into_raw();
    // SAFETY: per the contract above.
    unsafe {
        *out = ptr;
        *out_len = len;
    }
    0
}

/// Check out-params before doing any work, and clear them.
///
/// # Safety
/// Non-NULL pointers are valid for writes.
unsafe fn out_params(out: *mut *mut u8, out_len: *mut usize) -> Result<(), KvError> {
    if out.is_null() || out_len.is_null() {
        return Err(bad("output pointer is NULL"));
    }
    // SAFETY: checked non-NULL; valid per the contract above.
    unsafe {
        *out = std::ptr::null_mut();
        *out_len = 0;
    }
    Ok(())
}

unsafe extern "C" fn open(uri: *const c_char) -> *mut KvStore {
    init_logging();
    let mut opened = std::ptr::null_mut();
    entry("open", || {
        if uri.is_null() {
            return Err(bad("URI is NULL"));
        }
        // SAFETY: the consumer passes a NUL-terminated string.
        let uri = unsafe { CStr::from_ptr(uri) }
            .to_str()
            .map_err(|_| bad("URI is not valid UTF-8"))?;
        let handle =
            kvwasm_host::open(uri).map_err(|e| KvError::Host(format!("open {uri:?}: {e}")))?;
        opened = registry::insert(handle);
        Ok(0)
    });
    opened
}

unsafe extern "C" fn close(store: *mut KvStore) {
    entry("close", || {
        if !store.is_null() {
            registry::close(store)?;
        }
        Ok(0)
    });
}

unsafe extern "C" fn put_chunk(
    store: *mut KvStore,
    hash_ptr: *const u8,
    hash_len: usize,
    data: *const u8,
    data_len: usize,
) -> i32 {
    entry("put_chunk", || {
        let store = registry::get(store)?;
        // SAFETY: the ABI's pointer contract, checked by the helpers.
        let (key, data) = unsafe { (hash(hash_ptr, hash_len)?, bytes(data, data_len, "data")?) };
        store.put_chunk(key, data).map(i32::from)
    })
}

unsafe extern "C" fn get_chunk(
    store: *mut KvStore,
    hash_ptr: *const u8,
    hash_len: usize,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> i32 {
    entry("get_chunk", || {
        let store = registry::get(store)?;
        // SAFETY: as above.
        unsafe {
            out_params(out, out_len)?;
            let buffer = store.get_chunk(hash(hash_ptr, hash_len)?)?;
            Ok(deliver(buffer, out, out_len))
        }
    })
}

/// Not part of `kv_store_v1`: an optional symbol a consumer looks up with
/// `dlsym` (other backends do not have it). `get_chunk` into the caller's
/// buffer `buf` of `cap` bytes, rather than a `malloc`'d block: a chunk the
/// guest reads from a file (`builtin:fs`) is `pread` straight into `buf`;
/// another guest's answer is copied into it.
///
/// Returns 0 with `*out_len` the chunk's length (its bytes at `buf`);
/// `-10` with `*out_len` the chunk's length (more than `cap`) when it does
/// not fit, `buf` then holding nothing meaningful; otherwise `get_chunk`'s
/// codes, `*out_len` 0; `buf`'s contents are unspecified on any failure.
/// `buf` may be NULL only with `cap` 0, and `cap` is at most `PTRDIFF_MAX`
/// without running past the address space (else `-10`); `out_len` must not
/// be NULL. The guest never sees `buf` after the call.
///
/// # Safety
/// `store` is a handle from `open` (or anything: it is looked up, not
/// dereferenced); `hash` points at `hash_len` readable bytes; a non-NULL
/// `buf` at `cap` writable bytes that nothing else reads or writes during
/// the call; a non-NULL `out_len` at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kv_store_wasm_get_chunk_into(
    store: *mut KvStore,
    hash_ptr: *const u8,
    hash_len: usize,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> i32 {
    entry("get_chunk_into", || {
        if out_len.is_null() {
            return Err(bad("output length pointer is NULL"));
        }
        // SAFETY: checked non-NULL; valid per the contract above.
        unsafe { *out_len = 0 };
        let store = registry::get(store)?;
        // SAFETY: as the ABI's pointer contract, checked by the helpers.
        let key = unsafe { hash(hash_ptr, hash_len)? };
        let target: &mut [u8] = if buf.is_null() {
            if cap != 0 {
                return Err(bad(format!("buffer is NULL with capacity {cap}")));
            }
            &mut []
        } else {
            span_ok(buf, cap, "buffer")?;
            // SAFETY: per the contract above; `span_ok` holds.
            unsafe { std::slice::from_raw_parts_mut(buf, cap) }
        };
        match store.get_chunk_into(key, target)? {
            ChunkInto::Read(len) => {
                // SAFETY: checked non-NULL above.
                unsafe { *out_len = len };
                Ok(0)
            }
            ChunkInto::TooSmall(len) => {
                // The length tells the caller how much room to make; the
                // refusal is logged as any bad input is.
                // SAFETY: checked non-NULL above.
                unsafe { *out_len = len };
                Err(bad(format!(
                    "the chunk is {len} bytes, more than the buffer's {cap}"
                )))
            }
        }
    })
}

unsafe extern "C" fn put_manifest(
    store: *mut KvStore,
    name_ptr: *const c_char,
    data: *const u8,
    data_len: usize,
) -> i32 {
    entry("put_manifest", || {
        let store = registry::get(store)?;
        // SAFETY: as above.
        let (name, data) = unsafe { (name(name_ptr)?, bytes(data, data_len, "data")?) };
        store.put_manifest(name, data).map(|()| 0)
    })
}

unsafe extern "C" fn get_manifest(
    store: *mut KvStore,
    name_ptr: *const c_char,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> i32 {
    entry("get_manifest", || {
        let store = registry::get(store)?;
        // SAFETY: as above.
        unsafe {
            out_params(out, out_len)?;
            let buffer = store.get_manifest(name(name_ptr)?)?;
            Ok(deliver(buffer, out, out_len))
        }
    })
}

unsafe extern "C" fn delete_manifest(store: *mut KvStore, name_ptr: *const c_char) -> i32 {
    entry("delete_manifest", || {
        let store = registry::get(store)?;
        // SAFETY: as above.
        let name = unsafe { name(name_ptr)? };
        store.delete_manifest(name).map(|()| 0)
    })
}

unsafe extern "C" fn prefetch_chunks(
    store: *mut KvStore,
    hashes: *const u8,
    hash_len: usize,
    n_hashes: usize,
) -> i32 {
    entry("prefetch_chunks", || {
        let store = registry::get(store)?;
        if n_hashes == 0 {
            return Ok(0);
        }
        hash_len_ok(hash_len)?;
        if n_hashes > MAX_PREFETCH_HASHES {
            return Err(bad(format!(
                "{n_hashes} hashes exceed the limit of {MAX_PREFETCH_HASHES} per prefetch"
            )));
        }
        let total = hash_len
            .checked_mul(n_hashes)
            .ok_or_else(|| bad(format!("{n_hashes} hashes of {hash_len} bytes overflow")))?;
        // SAFETY: as above.
        let flat = unsafe { bytes(hashes, total, "hashes")? };
        let hashes: Vec<Vec<u8>> = flat.chunks_exact(hash_len).map(<[u8]>::to_vec).collect();
        store.prefetch_chunks(&hashes).map(|()| 0)
    })
}
