//! Buffers for staged copies (`payload-streams.copy`), kept for reuse.
//!
//! A guest that stages a save (S3 or Redis with `dedup_check = "flush"`)
//! holds a host copy of every long chunk until its flush: 96 MiB for a
//! 96 × 1 MiB save, all alive at once. Freed, blocks that large go back to
//! the kernel (glibc unmaps them, or trims the top of its heap once
//! everything above is free), so the next save faults every page in again:
//! 23,785 minor faults per save against the native client's ~500, a third
//! of the save's CPU (docs/benchmarks.md, "Recycled staging buffers"). The
//! host cannot tune the consumer's `malloc` (it is the consumer process's
//! own), so copies of [`RECYCLE_FROM`] bytes or more come from here and
//! return here when their last reference goes: at most [`KEEP_AT_MOST`]
//! bytes in the process. A buffer kept for [`KEEP_FOR`] without being taken
//! again is freed by a sweeper thread, started with the first long copy,
//! which sleeps while nothing is kept.
//!
//! A buffer holds a whole size class ([`capacity_for`]); the instance is
//! charged for all of it. These buffers never reach the consumer (a staged
//! value read back is copied into a `malloc`'d block of its own,
//! `payload::resource::take`), so they need not come from `malloc` itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Shorter copies are plain allocations: `malloc` reuses small blocks well.
const RECYCLE_FROM: usize = 64 << 10;

/// The most bytes kept for reuse, in the whole process.
const KEEP_AT_MOST: usize = 256 << 20;

/// How long a kept buffer may wait for a taker before it is freed.
const KEEP_FOR: Duration = Duration::from_secs(2);

/// The capacity a copy of `len` bytes takes, and is charged for: `len`
/// rounded up to a sixteenth of the next power of two when it is long, so
/// values of one size share a class and less than an eighth of `len` is
/// slack.
pub(crate) fn capacity_for(len: usize) -> usize {
    if len < RECYCLE_FROM {
        return len;
    }
    let step = len.next_power_of_two() / 16;
    len.div_ceil(step).saturating_mul(step)
}

/// Free buffers by capacity, each with when it was given back (oldest
/// first, so a class's busy end is its last).
struct Kept {
    by_capacity: HashMap<usize, Vec<(Vec<u8>, Instant)>>,
    bytes: usize,
}

impl Kept {
    fn new() -> Kept {
        Kept {
            by_capacity: HashMap::new(),
            bytes: 0,
        }
    }

    /// The most recently kept buffer of `capacity` bytes, if there is one.
    fn take(&mut self, capacity: usize) -> Option<Vec<u8>> {
        let (buf, _) = self.by_capacity.get_mut(&capacity)?.pop()?;
        self.bytes -= capacity;
        Some(buf)
    }

    /// Keep `buf` if it is long, exactly a class, and fits under
    /// [`KEEP_AT_MOST`]; otherwise give it back to be freed.
    fn keep(&mut self, buf: Vec<u8>, now: Instant) -> Option<Vec<u8>> {
        let capacity = buf.capacity();
        if capacity < RECYCLE_FROM
            || capacity != capacity_for(capacity)
            || self.bytes + capacity > KEEP_AT_MOST
        {
            return Some(buf);
        }
        self.bytes += capacity;
        self.by_capacity
            .entry(capacity)
            .or_default()
            .push((buf, now));
        None
    }

    /// The buffers kept since before `now - KEEP_FOR`, out of the pool.
    fn expired(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for list in self.by_capacity.values_mut() {
            let fresh =
                list.partition_point(|(_, at)| now.saturating_duration_since(*at) >= KEEP_FOR);
            out.extend(list.drain(..fresh).map(|(buf, _)| buf));
        }
        self.by_capacity.retain(|_, list| !list.is_empty());
        self.bytes -= out.iter().map(Vec::capacity).sum::<usize>();
        out
    }
}

/// The pool, and the sweeper's wake-up for a first kept buffer.
struct Pool {
    kept: Mutex<Kept>,
    not_empty: Condvar,
    /// Whether the sweeper thread runs. Without it nothing is kept
    /// (`give_back` frees instead), so memory is never held with nobody to
    /// free it.
    sweeping: AtomicBool,
}

static POOL: LazyLock<&'static Pool> = LazyLock::new(|| {
    let pool: &'static Pool = Box::leak(Box::new(Pool {
        kept: Mutex::new(Kept::new()),
        not_empty: Condvar::new(),
        sweeping: AtomicBool::new(false),
    }));
    let started = std::thread::Builder::new()
        .name("kvwasm-buffers".into())
        .spawn(|| pool.sweep());
    pool.sweeping.store(started.is_ok(), Ordering::Release);
    pool
});

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Free what waited too long; sleep while nothing is kept.
    fn sweep(&self) {
        loop {
            let mut kept = self.lock();
            while kept.bytes == 0 {
                kept = self
                    .not_empty
                    .wait(kept)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let expired = kept.expired(Instant::now());
            drop(kept);
            drop(expired);
            std::thread::sleep(KEEP_FOR / 4);
        }
    }

    /// Keep `buf` for the next copy of its class, or free it.
    fn give_back(&self, buf: Vec<u8>) {
        if !self.sweeping.load(Ordering::Acquire) {
            return;
        }
        let mut kept = self.lock();
        let was_empty = kept.bytes == 0;
        let unkept = kept.keep(buf, Instant::now());
        if was_empty && kept.bytes > 0 {
            self.not_empty.notify_one();
        }
        drop(kept);
        // Freed, if not kept, once the lock is released.
        drop(unkept);
    }
}

/// A host copy of a payload's bytes, whose buffer goes back for reuse when
/// it is dropped (long ones only).
pub(crate) struct RecycledBuffer {
    buf: Vec<u8>,
}

impl RecycledBuffer {
    /// A copy of `bytes` in a buffer of [`capacity_for`] its length, a kept
    /// one if there is one; `None` if memory for a new one cannot be had.
    pub(crate) fn copy_of(bytes: &[u8]) -> Option<RecycledBuffer> {
        let capacity = capacity_for(bytes.len());
        let reused = (capacity >= RECYCLE_FROM)
            .then(|| POOL.lock().take(capacity))
            .flatten();
        let mut buf = match reused {
            Some(buf) => buf,
            None => {
                let mut buf = Vec::new();
                buf.try_reserve_exact(capacity).ok()?;
                buf
            }
        };
        // Only the new bytes are ever visible: `as_slice` ends at them.
        buf.clear();
        buf.extend_from_slice(bytes);
        Some(RecycledBuffer { buf })
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for RecycledBuffer {
    fn drop(&mut self) {
        if self.buf.capacity() >= RECYCLE_FROM {
            POOL.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_waste_less_than_an_eighth() {
        assert_eq!(capacity_for(100), 100, "short: exact");
        assert_eq!(capacity_for(1 << 20), 1 << 20);
        assert_eq!(capacity_for((1 << 20) + 1), (1 << 20) + (128 << 10));
        assert_eq!(capacity_for(100_000), 106_496);
        for len in [65_536, 70_000, 300_001, 1_000_000, 16 << 20] {
            let c = capacity_for(len);
            assert!(c >= len && c - len < len / 8, "{len} -> {c}");
            assert_eq!(capacity_for(c), c, "a class is its own class");
        }
    }

    /// Kept buffers serve takers of their class, the total stays under the
    /// bound, and each goes once it waited `KEEP_FOR`, whatever other
    /// classes are doing.
    #[test]
    fn kept_buffers_are_bounded_and_leave_when_unused() {
        let mut kept = Kept::new();
        let start = Instant::now();
        let mib = 1 << 20;
        assert!(kept.keep(Vec::with_capacity(100), start).is_some(), "short");
        assert!(
            kept.keep(Vec::with_capacity(mib + 1), start).is_some(),
            "not a class"
        );
        for _ in 0..KEEP_AT_MOST / mib {
            assert!(kept.keep(Vec::with_capacity(mib), start).is_none());
        }
        assert!(
            kept.keep(Vec::with_capacity(mib), start).is_some(),
            "over the bound"
        );
        assert_eq!(kept.bytes, KEEP_AT_MOST);

        assert!(kept.take(2 * mib).is_none(), "no buffer of that class");
        assert_eq!(kept.take(mib).map(|b| b.capacity()), Some(mib));
        assert!(kept.take(mib).is_some());
        assert_eq!(kept.bytes, KEEP_AT_MOST - 2 * mib);

        // A busy class keeps only its own buffers alive.
        let later = start + KEEP_FOR;
        assert!(kept.keep(Vec::with_capacity(2 * mib), later).is_none());
        assert!(kept.expired(start + KEEP_FOR / 2).is_empty(), "not yet");
        assert_eq!(kept.expired(later).len(), KEEP_AT_MOST / mib - 2);
        assert_eq!(kept.bytes, 2 * mib);
        assert!(kept.take(mib).is_none());
        assert_eq!(kept.expired(later + KEEP_FOR).len(), 1);
        assert_eq!(kept.bytes, 0);
    }

    /// A dropped long copy's buffer serves the next copy of its class: the
    /// same allocation (no page of it faulted in again), holding only the
    /// new bytes however long the old ones were.
    #[test]
    fn a_copy_reuses_the_buffer_of_the_last_one_dropped() {
        // A size no other test copies, so they cannot take the buffer.
        let value = vec![7u8; (5 << 20) + 11];
        let first = RecycledBuffer::copy_of(&value).unwrap();
        assert_eq!(first.as_slice(), &value[..]);
        let address = first.as_slice().as_ptr();
        drop(first);
        let other = vec![9u8; (5 << 20) + 3];
        let second = RecycledBuffer::copy_of(&other).unwrap();
        assert_eq!(second.as_slice().len(), other.len());
        assert_eq!(second.as_slice(), &other[..]);
        assert_eq!(second.as_slice().as_ptr(), address);
    }
}
