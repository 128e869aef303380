//! What loading the shim does, and what it must not do. Its own process:
//! the descriptor table and the thread count are per process.
//!
//! Loading grows the descriptor table once, so opening many handles never
//! waits for the kernel to grow it (an RCU grace period per doubling in a
//! threaded process: docs/benchmarks.md). It starts no thread: a consumer
//! may load the library from a constructor or fork after loading it.

/// A field of /proc/self/status, as a number.
fn status(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
        .trim()
        .parse()
        .unwrap()
}

/// The descriptor number below which guests may open (the shim keeps a
/// quarter of the soft limit, at least 64, for the consumer).
fn guest_threshold() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes one rlimit struct.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(read, 0);
    let soft = limit.rlim_cur.min(1 << 20) as usize;
    soft - (soft / 4).max(64).min(soft / 2)
}

#[test]
fn loading_the_shim_grows_the_descriptor_table_once_and_starts_no_thread() {
    // An empty artifact cache: loading must not compile (wasmtime's
    // compile pool is threads), the first open does.
    let cache = tempfile::tempdir().unwrap();
    // SAFETY: this test is alone in its binary; libtest's threads do not
    // read the environment.
    unsafe { std::env::set_var("KVWASM_CACHE_DIR", cache.path()) };
    let before = status("FDSize");
    // Below a soft limit of about 128 there is nothing to grow.
    let wanted = guest_threshold().min(4096);
    assert!(
        before < wanted || wanted <= 64,
        "the table is already {before} slots"
    );
    // Threaded, as a consumer is: the case where growing the table waits.
    let worker =
        std::thread::spawn(|| std::thread::park_timeout(std::time::Duration::from_secs(5)));
    let threads = status("Threads");
    kvwasm_tests::shim();
    assert!(
        status("FDSize") >= wanted,
        "{} slots after load, wanted {wanted}",
        status("FDSize")
    );
    assert_eq!(status("Threads"), threads, "loading started a thread");
    let cached = std::fs::read_dir(cache.path()).map_or(0, |d| d.count());
    assert_eq!(cached, 0, "loading compiled into the cache");
    // Nothing was left open by the growth.
    let dir = std::fs::read_dir("/proc/self/fd").unwrap().count();
    assert!(dir < 64, "{dir} descriptors open");
    worker.thread().unpark();
    worker.join().unwrap();

    let data = tempfile::tempdir().unwrap();
    let handle = kvwasm_tests::open_fs(data.path());
    assert_eq!(handle.get_manifest("missing").unwrap_err(), -2);
    assert!(
        std::fs::read_dir(cache.path()).unwrap().count() > 0,
        "the first open compiled into the cache"
    );
}
