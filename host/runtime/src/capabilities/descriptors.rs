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

/// The first descriptor number guests may not hold.
fn threshold() -> RawFd {
    static THRESHOLD: LazyLock<RawFd> = LazyLock::new(|| {
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
    });
    *THRESHOLD
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
