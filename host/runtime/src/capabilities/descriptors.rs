//! Descriptor headroom: guests share the consumer's file-descriptor table,
//! so they may open files and sockets only while the process keeps room for
//! the consumer's own, and a guest that serves no consumer (a fabric, an
//! event subscriber, a storage advisor) only while it leaves room for the
//! stores that do (the tiers of a tiered store among them).
//!
//! Each instance holds at most `max_descriptors` files, directories and
//! sockets it opened through WASI (16 by default for fabrics, subscribers
//! and advisors; for kv-store backends only `max_resources` bounds them),
//! and at most `max_resources` resources of any kind. Across the process,
//! a kv-store guest's new descriptor is refused once the process holds
//! three quarters of its `RLIMIT_NOFILE` soft limit (keeping at least 64
//! free), any other guest's once it holds half of that ([`Share`]). The
//! test is free for files: the kernel hands out the lowest free number, so
//! a new descriptor numbered at or above the threshold means the process
//! already holds that many. Sockets are probed before they are created.

use std::os::fd::RawFd;
use std::sync::{Arc, LazyLock};

use wasmtime::component::ResourceTable;

/// The share of the process's descriptors a guest kind may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Share {
    /// kv-store backends (a consumer's stores, a tiered store's tiers):
    /// below three quarters of the soft limit.
    Store,
    /// Fabrics, event subscribers and storage advisors: below half of the
    /// stores' share, so that none of them can take the descriptors a
    /// store (and through it the consumer) needs.
    Auxiliary,
}

impl Share {
    /// The share of guests of `kind`.
    pub(crate) fn of(kind: crate::guest_kind::GuestKind) -> Share {
        match kind {
            crate::guest_kind::GuestKind::KvStore => Share::Store,
            crate::guest_kind::GuestKind::Fabric | crate::guest_kind::GuestKind::Subscriber => {
                Share::Auxiliary
            }
        }
    }
}

/// What one instance may hold: its share of the process's descriptors and
/// its own cap.
#[derive(Clone, Debug)]
pub(crate) struct Headroom {
    /// The backend's name, for the log line of a refusal.
    pub(crate) backend: Arc<str>,
    share: Share,
    /// `max_descriptors`, if the guest has one.
    max_held: Option<usize>,
}

impl Headroom {
    pub(crate) fn new(backend: Arc<str>, share: Share, max_held: Option<usize>) -> Headroom {
        Headroom {
            backend,
            share,
            max_held,
        }
    }

    /// Whether the instance whose resources are `table` may open one more
    /// descriptor: under its own cap. The guest's files, directories and
    /// TCP sockets are counted in its resource table (a directory handed
    /// out twice counts twice), so the count is exact at any moment
    /// without hooking their release.
    pub(crate) fn may_open(&self, table: &mut ResourceTable, what: &str) -> bool {
        let Some(max) = self.max_held else {
            return true;
        };
        let held = table
            .iter_mut()
            .filter(|entry| {
                entry.is::<wasmtime_wasi::filesystem::Descriptor>()
                    || entry.is::<wasmtime_wasi::sockets::TcpSocket>()
            })
            .count();
        if held < max {
            return true;
        }
        crate::log_limit::warn(
            ("descriptor cap", &*self.backend),
            format_args!(
                "backend {:?}: {what} refused: the instance holds its maximum of {max} \
                 files and sockets (`max_descriptors`)",
                self.backend
            ),
        );
        false
    }

    /// Whether this guest may keep descriptor `fd`, just opened on its
    /// behalf (logged when not).
    pub(crate) fn keeps(&self, fd: RawFd, what: &str) -> bool {
        if fd < threshold(self.share) {
            return true;
        }
        self.refused(what);
        false
    }

    /// Whether descriptor `fd` may be kept open for all guests
    /// ([`super::durable::KeptDirs`]): only while the process holds fewer
    /// than half the descriptors a store may reach, so what is kept never
    /// takes the room a store or the consumer needs.
    pub(crate) fn may_share(fd: RawFd) -> bool {
        fd < threshold(Share::Auxiliary)
    }

    /// Whether the process has room for one more descriptor of this guest
    /// (a probe: creates and closes one; logged when not).
    pub(crate) fn has_room(&self, what: &str) -> bool {
        // SAFETY: creates a descriptor we own and close at once.
        let probe = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if probe < 0 {
            self.refused(what);
            return false;
        }
        // SAFETY: closes the descriptor created above.
        unsafe { libc::close(probe) };
        self.keeps(probe, what)
    }

    /// Log (rate-limited) that the guest was refused a descriptor.
    fn refused(&self, what: &str) {
        let backend = &*self.backend;
        let whose = match self.share {
            Share::Store => "the rest is kept for the consumer",
            Share::Auxiliary => "the rest is kept for the consumer and its stores",
        };
        crate::log_limit::warn(
            ("descriptor headroom", backend),
            format_args!(
                "backend {backend:?}: {what} refused: the process holds {} descriptors or \
                 more, {whose}",
                threshold(self.share)
            ),
        );
    }
}

/// The first descriptor number guests of `share` may not hold, from the
/// soft limit when a guest first needs a descriptor.
fn threshold(share: Share) -> RawFd {
    static THRESHOLD: LazyLock<RawFd> = LazyLock::new(current_threshold);
    match share {
        Share::Store => *THRESHOLD,
        Share::Auxiliary => *THRESHOLD / 2,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_the_consumer_a_quarter_and_the_stores_an_eighth_of_the_limit() {
        let store = Headroom::new("s".into(), Share::Store, None);
        let other = Headroom::new("a".into(), Share::Auxiliary, None);
        let t = threshold(Share::Store);
        assert!(t > 0);
        assert!(store.keeps(t - 1, "t") && !store.keeps(t, "t"));
        let half = threshold(Share::Auxiliary);
        assert_eq!(half, t / 2);
        assert!(other.keeps(half - 1, "t") && !other.keeps(half, "t"));
        assert!(store.keeps(half, "t"), "the band above half is the stores'");
        assert!(
            store.has_room("t") && other.has_room("t"),
            "a test process holds few descriptors"
        );
    }

    #[test]
    fn an_instance_is_held_to_its_own_cap() {
        let mut table = ResourceTable::new();
        let capped = Headroom::new("a".into(), Share::Auxiliary, Some(2));
        let dir = std::fs::File::open(".").unwrap();
        let descriptor = || {
            wasmtime_wasi::filesystem::Descriptor::File(wasmtime_wasi::filesystem::File::new(
                dir.try_clone().unwrap(),
                wasmtime_wasi::FsPerms::ReadOnly,
                wasmtime_wasi::OpenMode::READ,
                true,
            ))
        };
        // Other resources do not count.
        table.push(0u64).unwrap();
        assert!(capped.may_open(&mut table, "t"));
        let first = table.push(descriptor()).unwrap();
        table.push(descriptor()).unwrap();
        assert!(!capped.may_open(&mut table, "t"));
        assert!(Headroom::new("s".into(), Share::Store, None).may_open(&mut table, "t"));
        table.delete(first).unwrap();
        assert!(
            capped.may_open(&mut table, "t"),
            "a closed descriptor frees its place"
        );
    }
}
