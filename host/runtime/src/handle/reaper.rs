//! Releases kv-store instances left idle past `idle_release_ms`.
//!
//! An idle handle otherwise keeps a whole guest instance (its store, WASI
//! context, fiber stack and memory: about 80 KiB resident). One thread per
//! process, started with the first pool that may release, looks at every
//! such pool a few times per release period and releases what has been
//! idle long enough ([`Pool::release_idle`]); the handle's next call starts
//! an instance again through the pool, as `open` did.

use std::sync::{Arc, Condvar, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use super::lock;
use super::pool::Pool;

/// The pools that may release instances, while their handles live.
struct Reaper {
    pools: Mutex<Vec<Weak<Pool>>>,
    /// Signalled when a pool is added (the thread sleeps while none is).
    added: Condvar,
}

static REAPER: LazyLock<&'static Reaper> = LazyLock::new(|| {
    let reaper: &'static Reaper = Box::leak(Box::new(Reaper {
        pools: Mutex::new(Vec::new()),
        added: Condvar::new(),
    }));
    std::thread::Builder::new()
        .name("kvwasm-idle".into())
        .spawn(|| reaper.run())
        .expect("spawn the idle-instance reaper thread");
    reaper
});

/// Look after `pool` until its handle is gone.
pub(super) fn watch(pool: &Arc<Pool>) {
    let reaper = *REAPER;
    let mut pools = lock(&reaper.pools);
    pools.retain(|p| p.strong_count() > 0);
    pools.push(Arc::downgrade(pool));
    reaper.added.notify_one();
}

/// How often the pools are looked at: a quarter of the shortest release
/// time (an instance is released within 1.25 × its `idle_release_ms`),
/// within bounds that keep the thread cheap.
fn period(shortest: Duration) -> Duration {
    (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

impl Reaper {
    fn run(&self) {
        let mut last_trim: Option<Instant> = None;
        loop {
            let shortest = {
                let mut pools = lock(&self.pools);
                loop {
                    pools.retain(|p| p.strong_count() > 0);
                    let shortest = pools
                        .iter()
                        .filter_map(|p| p.upgrade()?.release_after())
                        .min();
                    if let Some(shortest) = shortest {
                        break shortest;
                    }
                    pools = self.added.wait(pools).unwrap_or_else(|p| p.into_inner());
                }
            };
            std::thread::sleep(period(shortest));
            // Released without the registry lock: opens go on.
            let pools: Vec<Arc<Pool>> =
                lock(&self.pools).iter().filter_map(Weak::upgrade).collect();
            let now = Instant::now();
            let released: usize = pools.iter().map(|p| p.release_idle(now)).sum();
            drop(pools);
            // Trimming walks every malloc arena under its lock: at most
            // once per `TRIM_EVERY`, however short the release times.
            if released > 0 && last_trim.is_none_or(|t| now.duration_since(t) >= TRIM_EVERY) {
                trim_heap();
                last_trim = Some(now);
            }
        }
    }
}

/// Least time between two heap trims.
const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Give the heap pages the released instances freed back to the system:
/// glibc keeps freed memory below the top of its heaps mapped, so without
/// this the process's RSS would not show the release.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_quarter_of_the_shortest_release_within_bounds() {
        assert_eq!(
            period(Duration::from_millis(1000)),
            Duration::from_millis(250)
        );
        assert_eq!(period(Duration::from_millis(1)), Duration::from_millis(10));
        assert_eq!(period(Duration::from_secs(60)), Duration::from_secs(1));
    }
}
