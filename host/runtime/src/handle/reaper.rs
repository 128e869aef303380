//! Releases kv-store instances left idle past `idle_release_ms`.
//!
//! An idle handle otherwise keeps a whole guest instance (its store, WASI
//! context, fiber stack and memory: about 80 KiB resident). One thread per
//! process, started with the first pool that may release, looks at every
//! such pool a few times per release period and releases what has been
//! idle long enough ([`Pool::release_idle`]); the handle's next call starts
//! an instance again through the pool, as `open` did.
//!
//! Except on warm handles: of the pools of one backend and granted
//! directory, the `warm_handles` most recently used keep their last
//! instance however long they idle ([`keepers`]), so a long-lived store's
//! next save starts nothing. Only pools whose last instance would go now
//! compete (one in use keeps its instances anyway), and the ranking is per
//! backend and directory, not process-wide: one store's traffic never
//! costs another's handles their warm instance.

use std::cmp::Reverse;
use std::sync::{Arc, Condvar, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use super::lock;
use super::pool::{Pool, WarmRank};

/// The pools that may release instances, while their handles live.
struct Reaper {
    state: Mutex<Watched>,
    /// Signalled when a pool is added that the thread's current sleep
    /// would serve late (or while it waits for a first pool).
    added: Condvar,
}

struct Watched {
    pools: Vec<Weak<Pool>>,
    /// The period the thread is sleeping for (`None`: waiting for a pool).
    sleeping_for: Option<Duration>,
}

static REAPER: LazyLock<&'static Reaper> = LazyLock::new(|| {
    let reaper: &'static Reaper = Box::leak(Box::new(Reaper {
        state: Mutex::new(Watched {
            pools: Vec::new(),
            sleeping_for: None,
        }),
        added: Condvar::new(),
    }));
    std::thread::Builder::new()
        .name("kvwasm-idle".into())
        .spawn(|| reaper.run())
        .expect("spawn the idle-instance reaper thread");
    reaper
});

/// Look after `pool` until its handle is gone.
///
/// The thread is woken only when its current sleep is longer than this
/// pool's period, so opening many handles does not wake it once each.
pub(super) fn watch(pool: &Arc<Pool>) {
    let reaper = *REAPER;
    let mut state = lock(&reaper.state);
    state.pools.retain(|p| p.strong_count() > 0);
    state.pools.push(Arc::downgrade(pool));
    let sooner = match (state.sleeping_for, pool.release_after()) {
        (None, _) => true,
        (Some(current), Some(after)) => period(after) < current,
        (Some(_), None) => false,
    };
    if sooner {
        reaper.added.notify_one();
    }
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
            {
                let mut state = lock(&self.state);
                let shortest = loop {
                    state.pools.retain(|p| p.strong_count() > 0);
                    let shortest = state
                        .pools
                        .iter()
                        .filter_map(|p| p.upgrade()?.release_after())
                        .min();
                    if let Some(shortest) = shortest {
                        break shortest;
                    }
                    state.sleeping_for = None;
                    state = self.added.wait(state).unwrap_or_else(|p| p.into_inner());
                };
                // Woken early by a pool with a shorter period: the pass
                // below is early too, which releases nothing too soon
                // (each pool checks its own idle times).
                let sleep = period(shortest);
                state.sleeping_for = Some(sleep);
                drop(self.added.wait_timeout(state, sleep));
            }
            // Released without the registry lock: opens go on.
            let pools: Vec<Arc<Pool>> = lock(&self.state)
                .pools
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            let now = Instant::now();
            let ticks = crate::engine::ticks();
            let ranks: Vec<Option<WarmRank<'_>>> =
                pools.iter().map(|p| p.warm_rank(ticks)).collect();
            let keep = keepers(&ranks);
            drop(ranks);
            let released: usize = pools
                .iter()
                .zip(keep)
                .map(|(p, keep)| p.release_idle(ticks, keep))
                .sum();
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

/// For each pool, whether it keeps a warm instance: per group (backend and
/// directory), the `warm_handles` most recently used of those ranked (ties
/// go to the pool watched first).
fn keepers(ranks: &[Option<WarmRank<'_>>]) -> Vec<bool> {
    let mut order: Vec<(usize, &WarmRank<'_>)> = ranks
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r.as_ref()?)))
        .collect();
    // Stable: equal times keep the order the pools were watched in.
    order.sort_by_key(|(_, r)| (r.group, Reverse(r.last_used)));
    let mut keep = vec![false; ranks.len()];
    let mut group = None;
    let mut rank = 0;
    for (i, r) in order {
        if group != Some(r.group) {
            group = Some(r.group);
            rank = 0;
        }
        keep[i] = rank < r.warm_handles;
        rank += 1;
    }
    keep
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

    fn rank(group: &str, last_used: u64, warm_handles: usize) -> Option<WarmRank<'_>> {
        Some(WarmRank {
            group,
            last_used,
            warm_handles,
        })
    }

    #[test]
    fn each_group_keeps_its_most_recently_used_pools_warm_and_ties_go_to_the_first_watched() {
        let ranks = [
            rank("fs", 10, 1),
            None,
            rank("fs", 30, 1),
            rank("disk", 5, 2),
            rank("disk", 9, 2),
            rank("disk", 7, 2),
            rank("fs", 20, 1),
            None,
            rank("alone", 99, 1),
            rank("tie", 7, 1),
            rank("tie", 7, 1),
            rank("off", 50, 0),
        ];
        assert_eq!(
            keepers(&ranks),
            [
                false, false, true, false, true, true, false, false, true, true, false, false
            ]
        );
    }

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
