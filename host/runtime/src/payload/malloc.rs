//! `malloc`'d byte buffers: what the consumer receives from `get_*` and
//! frees with `free`.

use std::ptr::NonNull;

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
    pub(crate) fn alloc(len: usize) -> Option<MallocBuffer> {
        // SAFETY: plain malloc; the block is owned by the result.
        let ptr = unsafe { libc::malloc(len.max(1)) }.cast::<u8>();
        NonNull::new(ptr).map(|ptr| MallocBuffer { ptr, len })
    }

    /// A malloc'd copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> Option<MallocBuffer> {
        let mut buf = MallocBuffer::alloc(bytes.len())?;
        buf.write_at(0, bytes);
        Some(buf)
    }

    /// Copy `bytes` into the block at `offset`; `false` (nothing copied) if
    /// they do not fit.
    pub(crate) fn write_at(&mut self, offset: usize, bytes: &[u8]) -> bool {
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        // SAFETY: `offset + bytes.len() <= len`, checked above; no overlap
        // (the block is uniquely owned).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        };
        true
    }

    /// Fill a new buffer of up to `len` bytes from `file` at `offset` with
    /// `pread`, straight into the malloc'd block. Shorter only at EOF (then
    /// the block is shrunk to what was read).
    pub(crate) fn read_file(
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<MallocBuffer> {
        let mut buf = MallocBuffer::alloc(len).ok_or(std::io::ErrorKind::OutOfMemory)?;
        // SAFETY: the block holds `len` bytes.
        let filled = unsafe { pread_into(file, offset, buf.ptr.as_ptr(), len) }?;
        if filled < len {
            buf.shrink(filled);
        }
        Ok(buf)
    }

    /// Give back the block's tail past `len` bytes.
    fn shrink(&mut self, len: usize) {
        // SAFETY: `ptr` came from malloc; realloc to a smaller size keeps
        // the first `len` bytes.
        let smaller = unsafe { libc::realloc(self.ptr.as_ptr().cast(), len.max(1)) }.cast::<u8>();
        // A failed shrink leaves the old block valid and larger: keep it.
        if let Some(ptr) = NonNull::new(smaller) {
            self.ptr = ptr;
        }
        self.len = len;
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

/// `pread` up to `len` bytes of `file` at `offset` into `dst`, until EOF;
/// returns how many were read.
///
/// # Safety
/// `dst` points at `len` writable bytes.
pub(crate) unsafe fn pread_into(
    file: &std::fs::File,
    offset: u64,
    dst: *mut u8,
    len: usize,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut filled = 0usize;
    while filled < len {
        let at = offset
            .checked_add(filled as u64)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or(std::io::ErrorKind::InvalidInput)?;
        // SAFETY: writes at most `len - filled` bytes inside `dst`.
        let n = unsafe { libc::pread(file.as_raw_fd(), dst.add(filled).cast(), len - filled, at) };
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
    Ok(filled)
}
