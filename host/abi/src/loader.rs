//! Consumer side: load a backend exactly as llama.cpp and oMLX do, and call
//! it through safe wrappers.

use std::ffi::{CString, OsString};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};

use crate::{GET_VTABLE_SYMBOL, GetVtableFn, KvStore, VERSION_PREFETCH, Vtable};

/// Why a backend could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// `dlopen` failed.
    Open(libloading::Error),
    /// `kv_store_get_vtable` is missing.
    Symbol(libloading::Error),
    /// The vtable is NULL, older than version 1, or lacks a v1 entry.
    BadVtable(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Open(e) => write!(f, "cannot load backend library: {e}"),
            LoadError::Symbol(e) => write!(f, "backend library has no {GET_VTABLE_SYMBOL}: {e}"),
            LoadError::BadVtable(why) => write!(f, "backend vtable rejected: {why}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// `libkv_store_<scheme>.so` (`.dylib` on macOS).
pub fn library_file_name(scheme: &str) -> String {
    let ext = if cfg!(target_os = "macos") {
        "dylib"
    } else {
        "so"
    };
    format!("libkv_store_{scheme}.{ext}")
}

/// A loaded backend library and its vtable.
pub struct Library {
    vtable: &'static Vtable,
    path: OsString,
    // Keeps the code behind `vtable` mapped; must outlive every `Handle`.
    lib: libloading::Library,
}

impl Library {
    /// Load the backend for `scheme` the way the reference consumers do:
    /// `$KV_STORE_LIBRARY_PATH/libkv_store_<scheme>.so` if that file exists,
    /// else the bare name through the system loader.
    pub fn for_scheme(scheme: &str) -> Result<Library, LoadError> {
        let name = library_file_name(scheme);
        let candidate = std::env::var_os("KV_STORE_LIBRARY_PATH")
            .map(|dir| PathBuf::from(dir).join(&name))
            .filter(|p| p.is_file());
        match candidate {
            Some(path) => Library::open(path.as_os_str()),
            None => Library::open(name.as_ref()),
        }
    }

    /// Load the backend at `path` (a path, or a bare name for the loader).
    pub fn open(path: &std::ffi::OsStr) -> Result<Library, LoadError> {
        // SAFETY: loading a backend runs its initialisers; that is the
        // contract of kv_store_v1 plugins, exactly as in the consumers.
        let lib = unsafe { open_local(path) }.map_err(LoadError::Open)?;
        // SAFETY: the symbol has the signature the spec gives it.
        let get: libloading::Symbol<GetVtableFn> =
            unsafe { lib.get(GET_VTABLE_SYMBOL.as_bytes()) }.map_err(LoadError::Symbol)?;
        // SAFETY: calling the exported function as specified.
        let raw = unsafe { get() };
        // SAFETY: the spec says the vtable is static; we keep the library
        // loaded for as long as the reference is reachable through `self`.
        let vtable: &'static Vtable = unsafe { raw.as_ref() }
            .ok_or_else(|| LoadError::BadVtable("kv_store_get_vtable returned NULL".into()))?;
        if vtable.version < 1 {
            return Err(LoadError::BadVtable(format!("version {}", vtable.version)));
        }
        let complete = vtable.open.is_some()
            && vtable.close.is_some()
            && vtable.put_chunk.is_some()
            && vtable.get_chunk.is_some()
            && vtable.put_manifest.is_some()
            && vtable.get_manifest.is_some()
            && vtable.delete_manifest.is_some();
        if !complete {
            return Err(LoadError::BadVtable("a version 1 entry is NULL".into()));
        }
        Ok(Library {
            vtable,
            path: path.to_owned(),
            lib,
        })
    }

    /// Where the library was loaded from (as given to `dlopen`).
    pub fn path(&self) -> &Path {
        Path::new(&self.path)
    }

    /// The raw vtable.
    pub fn vtable(&self) -> &Vtable {
        self.vtable
    }

    /// `libkv_store_wasm.so`'s optional `get_chunk` into a caller's buffer
    /// ([`crate::GET_CHUNK_INTO_SYMBOL`]); `None` for backends without it.
    /// Like the vtable, valid while this `Library` is loaded.
    pub fn get_chunk_into(&self) -> Option<crate::GetChunkIntoFn> {
        // SAFETY: the symbol, where exported, has this signature.
        unsafe {
            self.lib
                .get::<crate::GetChunkIntoFn>(crate::GET_CHUNK_INTO_SYMBOL.as_bytes())
        }
        .ok()
        .map(|f| *f)
    }

    /// True when the vtable is v2 with `prefetch_chunks` (the consumers' check).
    pub fn has_prefetch(&self) -> bool {
        self.vtable.version >= VERSION_PREFETCH && self.vtable.prefetch_chunks.is_some()
    }

    /// `open(uri)`; `None` when the backend returned NULL.
    pub fn open_store(&self, uri: &str) -> Option<Handle<'_>> {
        let uri = CString::new(uri).ok()?;
        let open = self.vtable.open?;
        // SAFETY: valid NUL-terminated string, borrowed for the call.
        let raw = unsafe { open(uri.as_ptr()) };
        NonNull::new(raw).map(|raw| Handle { lib: self, raw })
    }
}

#[cfg(unix)]
unsafe fn open_local(path: &std::ffi::OsStr) -> Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
    // SAFETY: forwarded to the caller; RTLD_LOCAL as the consumers use.
    unsafe { Library::open(Some(path), RTLD_LAZY | RTLD_LOCAL) }.map(Into::into)
}

#[cfg(not(unix))]
unsafe fn open_local(path: &std::ffi::OsStr) -> Result<libloading::Library, libloading::Error> {
    // SAFETY: forwarded to the caller.
    unsafe { libloading::Library::new(path) }
}

/// An open `kv_store_v1 *`. Calls return the backend's raw code on failure.
/// `Sync`: the ABI requires handles to be callable from many threads.
pub struct Handle<'lib> {
    lib: &'lib Library,
    raw: NonNull<KvStore>,
}

// SAFETY: kv_store_v1 requires a handle to be safe to call from multiple
// threads concurrently; that is exactly what the conformance tests probe.
unsafe impl Send for Handle<'_> {}
// SAFETY: as above.
unsafe impl Sync for Handle<'_> {}

impl Handle<'_> {
    /// The raw handle, for tests that call the vtable with hostile arguments.
    pub fn as_ptr(&self) -> *mut KvStore {
        self.raw.as_ptr()
    }

    /// `put_chunk`: `Ok(false)` stored, `Ok(true)` already present.
    pub fn put_chunk(&self, hash: &[u8], data: &[u8]) -> Result<bool, i32> {
        let f = self.lib.vtable.put_chunk.expect("checked at load");
        // SAFETY: pointers and lengths come from live slices.
        let rc = unsafe {
            f(
                self.as_ptr(),
                hash.as_ptr(),
                hash.len(),
                data.as_ptr(),
                data.len(),
            )
        };
        match rc {
            0 => Ok(false),
            1 => Ok(true),
            rc => Err(rc),
        }
    }

    /// `get_chunk`.
    pub fn get_chunk(&self, hash: &[u8]) -> Result<Buffer, i32> {
        let f = self.lib.vtable.get_chunk.expect("checked at load");
        Buffer::fill(|out, len| {
            // SAFETY: pointers come from live slices and out-params.
            unsafe { f(self.as_ptr(), hash.as_ptr(), hash.len(), out, len) }
        })
    }

    /// `put_manifest`.
    pub fn put_manifest(&self, name: &str, data: &[u8]) -> Result<(), i32> {
        let f = self.lib.vtable.put_manifest.expect("checked at load");
        let name = c_name(name)?;
        // SAFETY: as above.
        status(unsafe { f(self.as_ptr(), name.as_ptr(), data.as_ptr(), data.len()) })
    }

    /// `get_manifest`.
    pub fn get_manifest(&self, name: &str) -> Result<Buffer, i32> {
        let f = self.lib.vtable.get_manifest.expect("checked at load");
        let name = c_name(name)?;
        Buffer::fill(|out, len| {
            // SAFETY: as above.
            unsafe { f(self.as_ptr(), name.as_ptr(), out, len) }
        })
    }

    /// `delete_manifest`.
    pub fn delete_manifest(&self, name: &str) -> Result<(), i32> {
        let f = self.lib.vtable.delete_manifest.expect("checked at load");
        let name = c_name(name)?;
        // SAFETY: as above.
        status(unsafe { f(self.as_ptr(), name.as_ptr()) })
    }

    /// `prefetch_chunks` over equal-length hashes; `Err(0)` on a v1 vtable.
    pub fn prefetch_chunks(&self, hashes: &[&[u8]]) -> Result<(), i32> {
        let f = match self.lib.vtable.prefetch_chunks {
            Some(f) if self.lib.has_prefetch() => f,
            _ => return Err(0),
        };
        let hash_len = hashes.first().map_or(0, |h| h.len());
        assert!(
            hashes.iter().all(|h| h.len() == hash_len),
            "mixed hash lengths"
        );
        let flat: Vec<u8> = hashes.concat();
        // SAFETY: `flat` holds n_hashes * hash_len bytes.
        status(unsafe { f(self.as_ptr(), flat.as_ptr(), hash_len, hashes.len()) })
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        let close = self.lib.vtable.close.expect("checked at load");
        // SAFETY: closed exactly once, never used again.
        unsafe { close(self.as_ptr()) }
    }
}

fn c_name(name: &str) -> Result<CString, i32> {
    // A name with an interior NUL cannot be expressed in the C ABI at all.
    CString::new(name).map_err(|_| -1)
}

fn status(rc: i32) -> Result<(), i32> {
    if rc == 0 { Ok(()) } else { Err(rc) }
}

/// An output buffer allocated by the backend with `malloc`; released with
/// `free`, exactly as a C consumer would.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a uniquely owned heap block.
unsafe impl Send for Buffer {}

impl Buffer {
    fn fill(call: impl FnOnce(*mut *mut u8, *mut usize) -> i32) -> Result<Buffer, i32> {
        let mut ptr = ptr::null_mut();
        let mut len = 0usize;
        let rc = call(&mut ptr, &mut len);
        if rc < 0 {
            return Err(rc);
        }
        if ptr.is_null() && len != 0 {
            // A backend that claims bytes but returns none: report, not UB.
            return Err(-1);
        }
        Ok(Buffer { ptr, len })
    }

    /// Give up ownership: the raw pointer (NULL or from the backend's
    /// `malloc`) and length. The caller must `free` it, or leak it.
    pub fn into_raw(self) -> (*mut u8, usize) {
        let raw = (self.ptr, self.len);
        std::mem::forget(self);
        raw
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the backend handed us `len` initialised bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes)", self.len)
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the ABI says outputs come from malloc; free(NULL) is a no-op.
        unsafe { libc::free(self.ptr.cast()) }
    }
}
