//! A caller's buffer that a `get_chunk` reads straight into
//! ([`StoreHandle::get_chunk_into`]): no `malloc`'d block per chunk, no
//! copy out of it.
//!
//! While a [`ReadTarget`] is set on a thread, the first payload a guest
//! reads from a file on that thread (`payload-io.read-file`, `read-at`)
//! that fits is `pread` into the target instead of a new block, and is a
//! [`Payload::Target`] holding a [`Lease`] on it. A guest that returns that
//! payload from `get-chunk` has put the chunk where the caller wants it
//! ([`Taken::InTarget`]). A guest that drops it frees the target for its
//! next read; one that keeps it past its call finds it empty: every lease
//! is revoked when any guest call ends ([`revoke_leases`], at the end of
//! [`sandbox::run`], before an instance can go back to its pool or be
//! parked) and when the target is unset, so a guest never sees the
//! caller's memory after the call that lent it.
//!
//! Guests that build their payloads otherwise (memory, Redis, S3, a staged
//! copy) answer with a block of their own, which is copied into the target.
//!
//! [`StoreHandle::get_chunk_into`]: crate::StoreHandle::get_chunk_into
//! [`Payload::Target`]: super::Payload::Target
//! [`Taken::InTarget`]: super::Taken::InTarget
//! [`sandbox::run`]: crate::sandbox::run

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What [`StoreHandle::get_chunk_into`](crate::StoreHandle::get_chunk_into) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkInto {
    /// The chunk's bytes are the first `n` bytes of the buffer.
    Read(usize),
    /// The chunk is this many bytes, more than the buffer holds; the buffer
    /// holds nothing meaningful.
    TooSmall(usize),
}

/// The caller's buffer, set on this thread.
struct Target {
    ptr: *mut u8,
    cap: usize,
    /// The payload reading into it, if any.
    lease: Option<Arc<LeaseState>>,
    /// A get returned the payload that filled it: no more reads into it.
    spent: bool,
}

thread_local! {
    static TARGET: RefCell<Option<Target>> = const { RefCell::new(None) };
}

/// One payload's hold on the target: its bytes, while `live`.
struct LeaseState {
    ptr: *mut u8,
    len: usize,
    live: AtomicBool,
}

// SAFETY: the bytes are only reached through `Lease::as_slice`, which checks
// `live`; a lease is revoked before its store can reach another thread (the
// guest call that made it ends on the thread that set the target, and
// `revoke_leases` runs as `sandbox::run` returns, before the instance is
// checked in or parked), and before the target's buffer is given back.
unsafe impl Send for LeaseState {}
// SAFETY: as above; `live` is atomic, the rest never changes.
unsafe impl Sync for LeaseState {}

/// A payload's bytes in the caller's buffer (see the module docs).
pub struct Lease(Arc<LeaseState>);

impl Lease {
    /// The bytes; empty once revoked.
    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.0.live.load(Ordering::Acquire) {
            // SAFETY: live: the target's buffer is lent to this call and
            // `len <= cap` bytes of it were read.
            unsafe { std::slice::from_raw_parts(self.0.ptr, self.0.len) }
        } else {
            &[]
        }
    }

    /// The payload as a get's answer: its length, the bytes staying where
    /// they are in the target. `None` once revoked.
    pub(crate) fn into_target(self) -> Option<usize> {
        if !self.0.live.load(Ordering::Acquire) {
            return None;
        }
        // The bytes are the get's answer: no later read may overwrite them.
        let _ = TARGET.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut()
                && let Some(t) = t.as_mut()
            {
                t.spent = true;
            }
        });
        Some(self.0.len)
    }
}

impl Drop for Lease {
    /// A guest dropped the payload (or its store went): the target is free
    /// for the next read.
    fn drop(&mut self) {
        let _ = TARGET.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut()
                && let Some(t) = t.as_mut()
                && t.lease.as_ref().is_some_and(|l| Arc::ptr_eq(l, &self.0))
            {
                t.lease = None;
            }
        });
    }
}

/// Reads into the target, if one is set on this thread, free, and at least
/// `len` bytes: `read` gets where to write `len` bytes and returns how many
/// it wrote. `None` without such a target (the caller reads into a block of
/// its own); else the read's error, or a lease on the bytes read.
pub(crate) fn read_into(
    len: usize,
    read: impl FnOnce(*mut u8) -> std::io::Result<usize>,
) -> Option<std::io::Result<Lease>> {
    // During thread-local teardown there is no target: the caller reads
    // into a block of its own.
    let ptr = TARGET
        .try_with(|t| {
            let t = t.try_borrow().ok()?;
            let t = t.as_ref()?;
            (!t.spent && t.lease.is_none() && len <= t.cap).then_some(t.ptr)
        })
        .ok()
        .flatten()?;
    let n = match read(ptr) {
        Ok(n) => n.min(len),
        Err(e) => return Some(Err(e)),
    };
    let state = Arc::new(LeaseState {
        ptr,
        len: n,
        live: AtomicBool::new(true),
    });
    let _ = TARGET.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut()
            && let Some(t) = t.as_mut()
        {
            t.lease = Some(state.clone());
        }
    });
    Some(Ok(Lease(state)))
}

/// End every lease on this thread's target (a guest call ended): a payload
/// a guest kept reads as empty from now on. Cheap when no target is set.
pub(crate) fn revoke_leases() {
    let _ = TARGET.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut()
            && let Some(lease) = t.as_mut().and_then(|t| t.lease.take())
        {
            lease.live.store(false, Ordering::Release);
        }
    });
}

/// Sets a target on this thread until dropped (then revokes its lease and
/// restores what was set before).
pub(crate) struct ReadTarget {
    /// What was set before, to restore; `None` when this set nothing.
    before: Option<Option<Target>>,
}

impl ReadTarget {
    /// Lend `cap` bytes at `ptr` to the guest calls this thread makes until
    /// the result is dropped. During thread-local teardown nothing is set:
    /// with no target, answers are copied in.
    ///
    /// # Safety
    /// `ptr` points at `cap` writable bytes, not otherwise accessed, until the
    /// result is dropped on this thread.
    pub(crate) unsafe fn set(ptr: *mut u8, cap: usize) -> ReadTarget {
        let target = Target {
            ptr,
            cap,
            lease: None,
            spent: false,
        };
        let before = TARGET
            .try_with(|t| t.try_borrow_mut().ok().map(|mut t| t.replace(target)))
            .ok()
            .flatten();
        ReadTarget { before }
    }
}

impl Drop for ReadTarget {
    fn drop(&mut self) {
        let Some(before) = self.before.take() else {
            return;
        };
        revoke_leases();
        let _ = TARGET.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut() {
                *t = before;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(len: usize, fill: u8) -> Option<std::io::Result<Lease>> {
        read_into(len, |dst| {
            // SAFETY: `read_into` hands over `len` writable bytes.
            unsafe { std::ptr::write_bytes(dst, fill, len) };
            Ok(len)
        })
    }

    #[test]
    fn no_target_no_lease() {
        assert!(read(4, 1).is_none());
    }

    #[test]
    fn one_lease_at_a_time_revoked_at_the_end_of_a_call() {
        let mut buf = [0u8; 8];
        // SAFETY: `buf` is not touched until the target is unset.
        let target = unsafe { ReadTarget::set(buf.as_mut_ptr(), buf.len()) };
        assert!(read(9, 1).is_none(), "larger than the target");
        let first = read(4, 1).unwrap().unwrap();
        assert_eq!(first.as_slice(), &[1, 1, 1, 1]);
        assert!(read(2, 2).is_none(), "the target is leased");
        drop(first);
        let kept = read(8, 3).unwrap().unwrap();
        assert_eq!(kept.as_slice(), &[3; 8]);
        revoke_leases();
        assert!(
            kept.as_slice().is_empty(),
            "a kept payload is empty after its call"
        );
        assert!(kept.into_target().is_none());
        // a get that returned its payload: the target is spent
        assert_eq!(read(5, 4).unwrap().unwrap().into_target(), Some(5));
        assert!(read(1, 5).is_none(), "spent");
        drop(target);
        assert!(read(1, 6).is_none(), "unset");
        assert_eq!(&buf[..5], &[4; 5]);
    }

    /// A guest call made from another thread-local's destructor, after
    /// `TARGET`'s is gone, finds no target; nothing panics.
    #[test]
    fn thread_local_teardown_means_no_target() {
        struct AtExit;
        impl Drop for AtExit {
            fn drop(&mut self) {
                let mut buf = [0u8; 4];
                // SAFETY: `buf` is not touched until the target is unset.
                let target = unsafe { ReadTarget::set(buf.as_mut_ptr(), buf.len()) };
                // (no target is set if `TARGET`'s destructor ran first)
                drop(read(4, 1));
                drop(target);
                revoke_leases();
            }
        }
        thread_local! {
            static AT_EXIT: AtExit = const { AtExit };
        }
        std::thread::spawn(|| {
            // Destructors run in the reverse order of first use (on Linux):
            // `TARGET`'s first, then `AT_EXIT`'s.
            AT_EXIT.with(|_| {});
            assert!(read(1, 1).is_none());
        })
        .join()
        .expect("no panic at thread exit");
    }
}
