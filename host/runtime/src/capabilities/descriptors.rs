//! Descriptor headroom: guests share the consumer's file-descriptor table,
//! so they may open files and sockets only while the process keeps room for
//! the consumer's own.
//!
//! Each instance is capped by its resource table (`max_resources`); across
//! the process, a guest's new descriptor is refused once the process holds
//! three quarters of its `RLIMIT_NOFILE` soft limit (keeping at least 64
//! free). The test is free for files: the kernel hands out the lowest free
//! number, so a new descriptor numbered at or above the threshold means the
//! process already holds that many. Sockets are probed before they are
//! created.

use std::os::fd::RawFd;
use std::sync::LazyLock;

/// The first descriptor number guests may not hold, from the soft limit
/// when a guest first needs a descriptor.
fn threshold() -> RawFd {
    static THRESHOLD: LazyLock<RawFd> = LazyLock::new(current_threshold);
    *THRESHOLD
}

/// The threshold for the soft `RLIMIT_NOFILE` limit as it is now.
fn current_threshold() -> RawFd {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes one rlimit struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    };
    let soft = soft.min(RawFd::MAX as libc::rlim_t) as RawFd;
    soft - (soft / 4).max(64).min(soft / 2)
}

/// The descriptor table size [`reserve_table`] grows to: room for about a
/// thousand handles (3 descriptors each) and the consumer's own. 8 bytes
/// a slot, 32 KiB in all.
const RESERVED_TABLE: RawFd = 4096;

/// Grow the process's descriptor table in one step (at most to the
/// headroom threshold). In a threaded process Linux waits an RCU grace
/// period each time the table doubles (8–16 ms measured here): opening
/// handles one after another paid it inside the opens that crossed 256,
/// 512, 1024 and 2048 descriptors. Paid once here instead, when the shim
/// is loaded (docs/benchmarks.md). `F_DUPFD` takes the lowest free number
/// at or above the top, so no open descriptor is touched; the table never
/// shrinks.
pub fn reserve_table() {
    static RESERVED: std::sync::Once = std::sync::Once::new();
    RESERVED.call_once(|| {
        let top = RESERVED_TABLE.min(current_threshold()) - 1;
        // SAFETY: creates a descriptor we own and close below.
        let probe = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if probe < 0 {
            return;
        }
        // SAFETY: duplicates the descriptor created above at or above `top`.
        let high = unsafe { libc::fcntl(probe, libc::F_DUPFD_CLOEXEC, top) };
        for fd in [high, probe] {
            if fd >= 0 {
                // SAFETY: closes descriptors created here.
                unsafe { libc::close(fd) };
            }
        }
    });
}

/// Whether a guest may keep descriptor `fd`, just opened on its behalf.
pub(crate) fn within_headroom(fd: RawFd) -> bool {
    fd < threshold()
}

/// Whether the process has room for one more guest descriptor (a probe:
/// creates and closes one).
pub(crate) fn has_headroom() -> bool {
    // SAFETY: creates a descriptor we own and close at once.
    let probe = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if probe < 0 {
        return false;
    }
    // SAFETY: closes the descriptor created above.
    unsafe { libc::close(probe) };
    within_headroom(probe)
}

/// Log (rate-limited) that a guest was refused a descriptor.
pub(crate) fn refused(backend: &str, what: &str) {
    crate::log_limit::warn(
        ("descriptor headroom", backend),
        format_args!(
            "backend {backend:?}: {what} refused: the process holds {} descriptors or more \
             (3/4 of RLIMIT_NOFILE), the rest is kept for the consumer",
            threshold()
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_the_consumer_a_quarter_of_the_limit() {
        let t = threshold();
        assert!(t > 0);
        assert!(within_headroom(t - 1) && !within_headroom(t));
        assert!(has_headroom(), "a test process holds few descriptors");
    }
}
