//! The `payload` resource: byte buffers owned by the host, so chunk bytes
//! travel between the consumer and the storage medium without a detour
//! through guest linear memory.
//!
//! * On `put-*`, the consumer's buffer is **lent** to the guest for the one
//!   call ([`lend`]); the entry is removed from the resource table before the
//!   call returns, so the pointer never outlives the C caller's borrow.
//! * On `get-*`, payloads are [`MallocBuffer`]s: `payload-io.read-at`
//!   `pread`s straight into one, and the shim hands it to the consumer as the
//!   `malloc`'d output buffer.

use std::ptr::NonNull;

use wasmtime::component::Resource;
use wasmtime_wasi::OpenMode;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;

use crate::bindings::kvwasm::kv_store::{payload_io, types};
use crate::state::HostState;

/// A host-owned byte buffer visible to guests as a `payload` resource.
pub enum Payload {
    /// The consumer's input buffer, valid only during the current call.
    Lent(LentBytes),
    /// A buffer from `malloc`, handed to the consumer on `get-*`.
    Owned(MallocBuffer),
}

/// A pointer/length pair lent by the caller of a store method.
pub struct LentBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are only read, and only while the lending call (on the
// thread that owns the store) is running.
unsafe impl Send for LentBytes {}

impl Payload {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            // SAFETY: `lend` guarantees the borrow outlives the table entry.
            Payload::Lent(l) => unsafe { std::slice::from_raw_parts(l.ptr, l.len) },
            Payload::Owned(b) => b.as_slice(),
        }
    }
}

/// Put `bytes` into the table as a payload for the duration of `call`, then
/// remove it, whatever `call` returned.
pub(crate) fn lend<T>(
    state: &mut wasmtime::Store<HostState>,
    bytes: &[u8],
    call: impl FnOnce(&mut wasmtime::Store<HostState>, Resource<Payload>) -> T,
) -> wasmtime::Result<T> {
    let lent = Payload::Lent(LentBytes {
        ptr: bytes.as_ptr(),
        len: bytes.len(),
    });
    let res = state.data_mut().table.push(lent)?;
    let out = call(state, Resource::new_borrow(res.rep()));
    // The guest only ever saw a borrow, so the entry is still ours to delete
    // (unless the instance trapped, in which case the whole store is dropped).
    let _ = state.data_mut().table.delete(res);
    Ok(out)
}

/// Take a payload a guest returned out of the table.
pub(crate) fn take(
    state: &mut wasmtime::Store<HostState>,
    res: Resource<Payload>,
) -> wasmtime::Result<MallocBuffer> {
    match state.data_mut().table.delete(res)? {
        Payload::Owned(buf) => {
            state.data_mut().limits.release_payload(buf.len() as u64);
            Ok(buf)
        }
        // Guests only ever hold borrows of lent payloads and cannot return
        // them; reaching this means a host bug, not a guest one.
        Payload::Lent(_) => wasmtime::bail!("a lent payload was returned"),
    }
}

/// A heap block from C `malloc`, freed with `free` unless handed over with
/// [`MallocBuffer::into_raw`]. Never NULL: an empty buffer is a 1-byte block,
/// so consumers that test the pointer see success.
pub struct MallocBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: uniquely owned heap memory.
unsafe impl Send for MallocBuffer {}

impl MallocBuffer {
    /// Allocate `len` bytes; `None` if `malloc` fails.
    fn alloc(len: usize) -> Option<MallocBuffer> {
        // SAFETY: plain malloc; the block is owned by the result.
        let ptr = unsafe { libc::malloc(len.max(1)) }.cast::<u8>();
        NonNull::new(ptr).map(|ptr| MallocBuffer { ptr, len })
    }

    /// A malloc'd copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> Option<MallocBuffer> {
        let buf = MallocBuffer::alloc(bytes.len())?;
        // SAFETY: `buf` has room for `bytes.len()` bytes; no overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.ptr.as_ptr(), bytes.len()) };
        Some(buf)
    }

    /// Fill a new buffer of up to `len` bytes from `file` at `offset` with
    /// `pread`, straight into the malloc'd block. Shorter only at EOF.
    fn read_file(file: &std::fs::File, offset: u64, len: usize) -> std::io::Result<MallocBuffer> {
        use std::os::fd::AsRawFd;
        let mut buf = MallocBuffer::alloc(len).ok_or(std::io::ErrorKind::OutOfMemory)?;
        let mut filled = 0usize;
        while filled < len {
            let at = offset
                .checked_add(filled as u64)
                .and_then(|at| libc::off_t::try_from(at).ok())
                .ok_or(std::io::ErrorKind::InvalidInput)?;
            // SAFETY: writes at most `len - filled` bytes inside the block.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    buf.ptr.as_ptr().add(filled).cast(),
                    len - filled,
                    at,
                )
            };
            match n {
                0 => break,
                n if n > 0 => filled += n as usize,
                _ => {
                    let err = std::io::Error::last_os_error();
                    if err.kind() != std::io::ErrorKind::Interrupted {
                        return Err(err);
                    }
                }
            }
        }
        buf.len = filled;
        Ok(buf)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes were initialised when the buffer was filled.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hand the block to C; the receiver must `free` it.
    pub fn into_raw(self) -> (*mut u8, usize) {
        let out = (self.ptr.as_ptr(), self.len);
        std::mem::forget(self);
        out
    }
}

impl std::fmt::Debug for MallocBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MallocBuffer({} bytes)", self.len)
    }
}

impl Drop for MallocBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc, not handed out.
        unsafe { libc::free(self.ptr.as_ptr().cast()) }
    }
}

impl types::Host for HostState {}

impl types::HostPayload for HostState {
    fn new(&mut self, bytes: Vec<u8>) -> wasmtime::Result<Resource<Payload>> {
        if !self.limits.reserve_payload(bytes.len() as u64) {
            wasmtime::bail!(
                "payload limit: a new payload of {} bytes would exceed the {} bytes of \
                 payloads an instance may hold at once",
                bytes.len(),
                self.limits.max_payload_bytes
            );
        }
        let buf = MallocBuffer::copy_from(&bytes)
            .ok_or_else(|| wasmtime::format_err!("out of memory for a payload"))?;
        Ok(self.table.push(Payload::Owned(buf))?)
    }

    fn len(&mut self, payload: Resource<Payload>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&payload)?.as_slice().len() as u64)
    }

    fn read(
        &mut self,
        payload: Resource<Payload>,
        offset: u64,
        len: u64,
    ) -> wasmtime::Result<Vec<u8>> {
        let bytes = self.table.get(&payload)?.as_slice();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let end = start
            .saturating_add(usize::try_from(len).unwrap_or(usize::MAX))
            .min(bytes.len());
        Ok(bytes[start..end].to_vec())
    }

    fn drop(&mut self, payload: Resource<Payload>) -> wasmtime::Result<()> {
        if let Payload::Owned(buf) = self.table.delete(payload)? {
            self.limits.release_payload(buf.len() as u64);
        }
        Ok(())
    }
}

impl payload_io::Host for HostState {
    fn write_at(
        &mut self,
        file: Resource<Descriptor>,
        data: Resource<Payload>,
        offset: u64,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        use std::os::unix::fs::FileExt;
        let file = match self.table.get(&file)? {
            Descriptor::File(f) => f,
            Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
        };
        // The same checks wasi:filesystem's own `write` makes: the grant must
        // be writable and the file opened for writing.
        if file.perms.write_not_permitted() || !file.open_mode.contains(OpenMode::WRITE) {
            return Ok(Err(ErrorCode::NotPermitted));
        }
        let bytes = self.table.get(&data)?.as_slice();
        Ok(file.file.write_all_at(bytes, offset).map_err(io_error_code))
    }

    fn read_at(
        &mut self,
        file: Resource<Descriptor>,
        offset: u64,
        len: u64,
    ) -> wasmtime::Result<Result<Resource<Payload>, ErrorCode>> {
        let file = match self.table.get(&file)? {
            Descriptor::File(f) if f.open_mode.contains(OpenMode::READ) => f.file.clone(),
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotPermitted)),
            Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
        };
        let want = usize::try_from(len).map_err(|_| wasmtime::format_err!("length overflow"))?;
        self.read_payload(&file, offset, want, false)
    }

    fn read_file(
        &mut self,
        dir: Resource<Descriptor>,
        path: String,
    ) -> wasmtime::Result<Result<Resource<Payload>, ErrorCode>> {
        let dir = match self.table.get(&dir)? {
            Descriptor::Dir(d) => d,
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
        };
        // Resolved beneath `dir` (openat2 RESOLVE_BENEATH, or cap-std's
        // manual resolution): no `..`, absolute path or symlink leaves it.
        let mut options = cap_primitives::fs::OpenOptions::new();
        options.read(true);
        let opened = cap_primitives::fs::open(&dir.dir, std::path::Path::new(&path), &options)
            .and_then(|file| file.metadata().map(|meta| (file, meta)));
        let (file, meta) = match opened {
            Ok(found) => found,
            Err(e) => return Ok(Err(io_error_code(e))),
        };
        if meta.is_dir() {
            return Ok(Err(ErrorCode::IsDirectory));
        }
        let Ok(len) = usize::try_from(meta.len()) else {
            return Ok(Err(ErrorCode::FileTooLarge));
        };
        self.read_payload(&file, 0, len, true)
    }

    fn write_file(
        &mut self,
        dir: Resource<Descriptor>,
        path: String,
        data: Resource<Payload>,
        sync: bool,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        self.create_and_write(&dir, &path, &data, sync)
    }
}

impl HostState {
    /// `write-file`'s body; `Err` is the guest-visible error code.
    fn create_and_write(
        &mut self,
        dir: &Resource<Descriptor>,
        path: &str,
        data: &Resource<Payload>,
        sync: bool,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        use std::io::Write;
        let dir = match self.table.get(dir)? {
            // The check wasi:filesystem's `open-at` makes before creating.
            Descriptor::Dir(d) if d.perms.write_not_permitted() => {
                return Ok(Err(ErrorCode::NotPermitted));
            }
            Descriptor::Dir(d) => d.dir.clone(),
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
        };
        let mut options = cap_primitives::fs::OpenOptions::new();
        options.write(true).create_new(true);
        let bytes = self.table.get(data)?.as_slice();
        let written = cap_primitives::fs::open(&dir, std::path::Path::new(path), &options)
            .and_then(|mut file| {
                file.write_all(bytes)?;
                if sync { file.sync_data() } else { Ok(()) }
            });
        Ok(written.map_err(io_error_code))
    }

    /// `pread` `len` bytes of `file` at `offset` into a new payload, within
    /// the payload limits. `exact`: fewer bytes (the file shrank) is `io`.
    fn read_payload(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: usize,
        exact: bool,
    ) -> wasmtime::Result<Result<Resource<Payload>, ErrorCode>> {
        let len64 = len as u64;
        if len64 > self.limits.max_payload_bytes {
            return Ok(Err(ErrorCode::FileTooLarge));
        }
        if !self.limits.reserve_payload(len64) {
            return Ok(Err(ErrorCode::InsufficientMemory));
        }
        match MallocBuffer::read_file(file, offset, len) {
            Ok(buf) if exact && buf.len() != len => {
                self.limits.release_payload(len64);
                Ok(Err(ErrorCode::Io))
            }
            Ok(buf) => {
                // Account for what was read, not what was asked for.
                self.limits.release_payload(len64 - buf.len() as u64);
                Ok(Ok(self.table.push(Payload::Owned(buf))?))
            }
            Err(e) => {
                self.limits.release_payload(len64);
                Ok(Err(io_error_code(e)))
            }
        }
    }
}

/// The `wasi:filesystem` error code closest to an I/O error.
fn io_error_code(e: std::io::Error) -> ErrorCode {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => ErrorCode::InsufficientSpace,
        Some(libc::EDQUOT) => ErrorCode::Quota,
        Some(libc::EFBIG) => ErrorCode::FileTooLarge,
        Some(libc::EACCES) => ErrorCode::Access,
        Some(libc::EPERM) => ErrorCode::NotPermitted,
        Some(libc::EBADF) => ErrorCode::BadDescriptor,
        Some(libc::EISDIR) => ErrorCode::IsDirectory,
        Some(libc::ENOENT) => ErrorCode::NoEntry,
        Some(libc::ENOTDIR) => ErrorCode::NotDirectory,
        Some(libc::ELOOP) => ErrorCode::Loop,
        Some(libc::EEXIST) => ErrorCode::Exist,
        Some(libc::EXDEV) => ErrorCode::NotPermitted,
        _ if e.kind() == std::io::ErrorKind::OutOfMemory => ErrorCode::InsufficientMemory,
        _ => ErrorCode::Io,
    }
}
