//! The release thread serves a pool added while it sleeps for a longer
//! period (issue 17's idle release). Its own test binary: the thread is one
//! per process, and the short release times of the other idle tests would
//! keep it waking every 10 ms anyway.

use std::time::{Duration, Instant};

use kvwasm_host::StoreHandle;
use kvwasm_tests::idle::{releasing_after, wait_for_release};

#[test]
fn a_pool_with_a_shorter_release_time_wakes_the_sleeping_release_thread() {
    let dir = tempfile::tempdir().unwrap();
    // Released after a minute: the thread then looks every second.
    let slow = releasing_after(dir.path(), "idle_minute", "builtin:fs", 60_000);
    let registered = Instant::now();
    let _slow = StoreHandle::open(slow, "").unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let quick = releasing_after(dir.path(), "idle_quick", "builtin:fs", 30);
    let quick = StoreHandle::open(quick, "").unwrap();
    wait_for_release(&quick);
    // Within 1.25 × 30 ms plus scheduling. A thread not woken would first
    // finish its one-second sleep, begun after the slow pool's open began:
    // a release sooner than that one second proves the wake-up, however
    // slowly this thread ran (the margin is what a loaded machine gets).
    assert!(
        registered.elapsed() < Duration::from_secs(1),
        "released {:?} after the slow pool's open began",
        registered.elapsed()
    );
}
