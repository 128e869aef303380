//! The `payload` resource: byte buffers owned by the host, so chunk bytes
//! travel between the consumer and the storage medium without a detour
//! through guest linear memory.
//!
//! * On `put-*`, the consumer's buffer is **lent** to the guest for the one
//!   call ([`resource::lend`]); the entry is removed from the resource table
//!   before the call returns, so the pointer never outlives the C caller's
//!   borrow.
//! * On `get-*`, payloads are [`MallocBuffer`]s: `payload-io.read-at`
//!   `pread`s straight into one, and the shim hands it to the consumer as the
//!   `malloc`'d output buffer. A `get_chunk_into` lends the consumer's own
//!   buffer instead, which the first read that fits fills ([`target`]).
//! * A guest that stages values for a later flush keeps host copies
//!   (`payload-streams.copy`): [`Payload::Shared`], which `write-all` hands
//!   to a socket or an HTTP body without copying it again. Their buffers
//!   are reused by later copies ([`recycle`]).
//!
//! Payload memory is host memory, outside the guest's linear-memory cap, so
//! every byte a payload holds is charged to its instance when it is
//! allocated (see `InstanceLimits::reserve_payload`), and the number of
//! payloads is bounded with every other resource (`max_resources`).

mod io;
mod malloc;
mod recycle;
pub(crate) mod resource;
mod streams;
pub mod target;

pub use malloc::MallocBuffer;

use crate::error::KvError;

/// A host-owned byte buffer visible to guests as a `payload` resource.
pub enum Payload {
    /// The consumer's input buffer, valid only during the current call.
    Lent(LentBytes),
    /// A buffer from `malloc`, handed to the consumer on `get-*`.
    Owned(MallocBuffer),
    /// A guest's own copy of a payload, which output streams may hold
    /// (reference-counted) while they send it: a [`SharedBuffer`], charged
    /// to the instance until the last reference is gone.
    Shared(bytes::Bytes),
    /// Bytes read into a `get_chunk_into` caller's buffer, while the guest
    /// call that read them runs ([`target`]).
    Target(target::Lease),
}

/// The buffer behind a [`Payload::Shared`], with its charge. Its memory is
/// kept for the next copy when it goes ([`recycle`]).
pub(crate) struct SharedBuffer {
    pub(crate) buf: recycle::RecycledBuffer,
    pub(crate) _charge: crate::limits::PayloadCharge,
}

impl AsRef<[u8]> for SharedBuffer {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice()
    }
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
            Payload::Shared(b) => b,
            Payload::Target(t) => t.as_slice(),
        }
    }
}

/// A payload a guest returned, taken out of its table: a block for the
/// consumer, or a chunk already in a `get_chunk_into` caller's buffer. Two
/// kinds, so bytes in a caller's buffer can never become a [`MallocBuffer`]
/// that C would be told to `free`.
pub(crate) enum Taken {
    /// A `malloc`'d block of its own.
    Block(MallocBuffer),
    /// The first this many bytes of this thread's target ([`target`]).
    InTarget(usize),
}

impl Taken {
    /// Bytes of the answer.
    pub(crate) fn len(&self) -> usize {
        match self {
            Taken::Block(block) => block.len(),
            Taken::InTarget(len) => *len,
        }
    }

    /// The block of an answer that must be one: a manifest, a fabric's
    /// frame, a plain `get_chunk`. Only a `get_chunk_into` sets a target,
    /// and it asks for chunks alone, so an answer in a target here is a
    /// host bug, refused rather than handed on.
    pub(crate) fn into_block(self) -> Result<MallocBuffer, KvError> {
        match self {
            Taken::Block(block) => Ok(block),
            Taken::InTarget(_) => Err(KvError::Host(
                "an answer read into a get_chunk_into buffer reached a call \
                 that returns a block"
                    .into(),
            )),
        }
    }
}
