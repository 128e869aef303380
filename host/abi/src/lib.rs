//! The `kv_store_v1` C ABI (vtable version 2), as specified in
//! `kv-store-abi.txt`: the `#[repr(C)]` vtable a backend exports, and, with
//! the `loader` feature, a [`Library`] that loads a backend the way the
//! reference consumers do.

use std::ffi::c_char;

#[cfg(feature = "loader")]
mod loader;
#[cfg(feature = "loader")]
pub use loader::{Buffer, Handle, Library, LoadError, library_file_name};

/// Opaque backend handle (`kv_store_v1 *`).
#[repr(C)]
pub struct KvStore {
    _private: [u8; 0],
}

/// The symbol every backend exports.
pub const GET_VTABLE_SYMBOL: &str = "kv_store_get_vtable";
/// Vtable version that adds `prefetch_chunks`.
pub const VERSION_PREFETCH: u32 = 2;

pub type OpenFn = unsafe extern "C" fn(uri: *const c_char) -> *mut KvStore;
pub type CloseFn = unsafe extern "C" fn(store: *mut KvStore);
pub type PutChunkFn = unsafe extern "C" fn(
    store: *mut KvStore,
    hash: *const u8,
    hash_len: usize,
    data: *const u8,
    data_len: usize,
) -> i32;
pub type GetChunkFn = unsafe extern "C" fn(
    store: *mut KvStore,
    hash: *const u8,
    hash_len: usize,
    out_data: *mut *mut u8,
    out_len: *mut usize,
) -> i32;
pub type PutManifestFn = unsafe extern "C" fn(
    store: *mut KvStore,
    name: *const c_char,
    data: *const u8,
    data_len: usize,
) -> i32;
pub type GetManifestFn = unsafe extern "C" fn(
    store: *mut KvStore,
    name: *const c_char,
    out_data: *mut *mut u8,
    out_len: *mut usize,
) -> i32;
pub type DeleteManifestFn = unsafe extern "C" fn(store: *mut KvStore, name: *const c_char) -> i32;
pub type PrefetchChunksFn = unsafe extern "C" fn(
    store: *mut KvStore,
    hashes: *const u8,
    hash_len: usize,
    n_hashes: usize,
) -> i32;

/// `kv_store_vtable`, field for field.
#[repr(C)]
pub struct Vtable {
    pub version: u32,
    pub open: Option<OpenFn>,
    pub close: Option<CloseFn>,
    pub put_chunk: Option<PutChunkFn>,
    pub get_chunk: Option<GetChunkFn>,
    pub put_manifest: Option<PutManifestFn>,
    pub get_manifest: Option<GetManifestFn>,
    pub delete_manifest: Option<DeleteManifestFn>,
    /// Version 2 and later.
    pub prefetch_chunks: Option<PrefetchChunksFn>,
}

/// `const kv_store_vtable * kv_store_get_vtable(void)`.
pub type GetVtableFn = unsafe extern "C" fn() -> *const Vtable;

/// Not part of `kv_store_v1`: an optional symbol of `libkv_store_wasm.so`
/// (other backends do not export it), `get_chunk` into the caller's buffer.
pub const GET_CHUNK_INTO_SYMBOL: &str = "kv_store_wasm_get_chunk_into";
/// [`GET_CHUNK_INTO_SYMBOL`]'s signature: 0 with `*out_len` the chunk's
/// length, its bytes at `buf`; `-10` with `*out_len` > `cap` (the chunk's
/// length) when it does not fit; `get_chunk`'s codes otherwise (and `-10`
/// for a `cap` past `PTRDIFF_MAX` or the end of the address space). `buf`'s
/// contents are unspecified after any failure.
pub type GetChunkIntoFn = unsafe extern "C" fn(
    store: *mut KvStore,
    hash: *const u8,
    hash_len: usize,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> i32;
