//! Buffers for staged copies (`payload-streams.copy`), kept for reuse.
//!
//! A guest that stages a save (S3 with `dedup_check = "flush"`) holds a
//! host copy of every chunk until its flush: 96 MiB for a 96 × 1 MiB save,
//! all alive at once. Freed, blocks that large go back to the kernel
//! (glibc unmaps them, or trims the top of its heap once everything above
//! is free), so the next save faults every page in again: 23,785 minor
//! faults per save against the native client's ~500, a third of the
//! save's CPU (docs/benchmarks.md, "Recycled staging buffers"). The host
//! cannot tune the consumer's `malloc` (that is the consumer process's
//! own), so copies of [`RECYCLE_FROM`] bytes or more come from here and
//! return here when their last reference goes: at most [`KEEP_AT_MOST`]
//! bytes in all, freed by the idle reaper once none was taken for
//! [`KEEP_FOR`].
//!
//! These buffers never reach the consumer (a staged value read back is
//! copied into a `malloc`'d block of its own, `payload::take`), so they
//! need not come from `malloc` itself.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shorter copies are plain allocations: `malloc` reuses small blocks well.
pub(crate) const RECYCLE_FROM: usize = 64 << 10;

/// The most bytes kept for reuse, in the whole process.
pub(crate) const KEEP_AT_MOST: usize = 256 << 20;

/// How long kept buffers may go without a taker before they are freed.
pub(crate) const KEEP_FOR: Duration = Duration::from_secs(2);

/// Free buffers by size class (see [`class`]).
struct Kept {
    by_class: HashMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
    last_taken: Instant,
}

impl Kept {
    fn new() -> Kept {
        Kept {
            by_class: HashMap::new(),
            bytes: 0,
            last_taken: Instant::now(),
        }
    }

    /// A kept buffer of `capacity` bytes, if there is one.
    fn take(&mut self, capacity: usize, now: Instant) -> Option<Vec<u8>> {
        self.last_taken = now;
        let buf = self.by_class.get_mut(&capacity)?.pop()?;
        self.bytes -= capacity;
        Some(buf)
    }

    /// Keep `buf` if it is long, of a class, and fits under
    /// [`KEEP_AT_MOST`]; otherwise give it back to be freed.
    fn keep(&mut self, buf: Vec<u8>) -> Option<Vec<u8>> {
        let capacity = buf.capacity();
        if capacity < RECYCLE_FROM
            || capacity != class(capacity)
            || self.bytes + capacity > KEEP_AT_MOST
        {
            return Some(buf);
        }
        self.bytes += capacity;
        self.by_class.entry(capacity).or_default().push(buf);
        None
    }

    /// Everything kept, if nothing was taken for [`KEEP_FOR`] before `now`.
    fn unused(&mut self, now: Instant) -> Vec<Vec<u8>> {
        if self.bytes == 0 || now.saturating_duration_since(self.last_taken) < KEEP_FOR {
            return Vec::new();
        }
        self.bytes = 0;
        std::mem::take(&mut self.by_class)
            .into_values()
            .flatten()
            .collect()
    }
}

static KEPT: LazyLock<Mutex<Kept>> = LazyLock::new(|| Mutex::new(Kept::new()));

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The capacity a buffer for `len` bytes gets: `len` rounded up to a
/// sixteenth of the next power of two, so values of one size share a class
/// and less than an eighth of `len` is slack.
fn class(len: usize) -> usize {
    let step = (len.next_power_of_two() / 16).max(1);
    len.div_ceil(step).saturating_mul(step)
}

/// A host copy of a payload's bytes, whose buffer goes back for reuse when
/// it is dropped (long ones only).
pub(crate) struct RecycledBuffer {
    buf: Vec<u8>,
}

impl RecycledBuffer {
    /// A copy of `bytes`, in a kept buffer of its class if there is one;
    /// `None` if memory for a new one cannot be had.
    pub(crate) fn copy_of(bytes: &[u8]) -> Option<RecycledBuffer> {
        let capacity = match bytes.len() {
            len if len >= RECYCLE_FROM => class(len),
            len => len,
        };
        let reused = (capacity >= RECYCLE_FROM)
            .then(|| kept().take(capacity, Instant::now()))
            .flatten();
        let mut buf = match reused {
            Some(buf) => buf,
            None => with_capacity(capacity)?,
        };
        buf.clear();
        buf.extend_from_slice(bytes);
        Some(RecycledBuffer { buf })
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf
    }
}

/// An empty vector with room for exactly `capacity` bytes.
fn with_capacity(capacity: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(capacity).ok()?;
    Some(buf)
}

impl Drop for RecycledBuffer {
    fn drop(&mut self) {
        if self.buf.capacity() >= RECYCLE_FROM {
            // Freed, if not kept, once the lock is released.
            let unkept = kept().keep(std::mem::take(&mut self.buf));
            drop(unkept);
        }
    }
}

/// Whether any buffer is kept (for the reaper to come back for it).
pub(crate) fn any_kept() -> bool {
    kept().bytes > 0
}

/// Free every kept buffer if none was taken for [`KEEP_FOR`] (the idle
/// reaper's pass). Returns how many bytes were freed.
pub(crate) fn release_unused(now: Instant) -> usize {
    let unused = kept().unused(now);
    unused.iter().map(Vec::capacity).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_waste_at_most_an_eighth() {
        assert_eq!(class(1 << 20), 1 << 20);
        assert_eq!(class((1 << 20) + 1), (1 << 20) + (128 << 10));
        assert_eq!(class(100_000), 106_496);
        for len in [65_536, 70_000, 300_001, 1_000_000, 16 << 20] {
            let c = class(len);
            assert!(c >= len && c - len <= len / 8, "{len} -> {c}");
            assert_eq!(class(c), c, "a class is its own class");
        }
    }

    /// Kept buffers serve takers of their class, the total stays under the
    /// bound, and all of them go once none was taken for `KEEP_FOR`.
    #[test]
    fn kept_buffers_are_bounded_and_leave_when_unused() {
        let mut kept = Kept::new();
        let now = Instant::now();
        let mib = 1 << 20;
        assert!(kept.keep(Vec::with_capacity(100)).is_some(), "short");
        assert!(
            kept.keep(Vec::with_capacity(mib + 1)).is_some(),
            "not a class"
        );
        for _ in 0..KEEP_AT_MOST / mib {
            assert!(kept.keep(Vec::with_capacity(mib)).is_none());
        }
        assert!(
            kept.keep(Vec::with_capacity(mib)).is_some(),
            "over the bound"
        );
        assert_eq!(kept.bytes, KEEP_AT_MOST);

        assert!(kept.take(2 * mib, now).is_none(), "no buffer of that class");
        assert_eq!(kept.take(mib, now).map(|b| b.capacity()), Some(mib));
        assert_eq!(kept.bytes, KEEP_AT_MOST - mib);

        assert!(kept.unused(now + KEEP_FOR / 2).is_empty(), "taken recently");
        assert_eq!(kept.unused(now + KEEP_FOR).len(), KEEP_AT_MOST / mib - 1);
        assert_eq!(kept.bytes, 0);
        assert!(kept.take(mib, now).is_none());
    }

    /// A dropped long copy's buffer serves the next copy of its class: the
    /// same allocation, so none of its pages is faulted in again.
    #[test]
    fn a_copy_reuses_the_buffer_of_the_last_one_dropped() {
        // A size no other test copies, so they cannot take the buffer.
        let value = vec![7u8; (5 << 20) + 3];
        let first = RecycledBuffer::copy_of(&value).unwrap();
        assert_eq!(first.as_slice(), &value[..]);
        let address = first.as_slice().as_ptr();
        drop(first);
        let other = vec![9u8; (5 << 20) + 11];
        let second = RecycledBuffer::copy_of(&other).unwrap();
        assert_eq!(second.as_slice(), &other[..]);
        assert_eq!(second.as_slice().as_ptr(), address);
    }
}
