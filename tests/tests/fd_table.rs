//! Loading the shim grows the descriptor table once, so opening many
//! handles never waits for the kernel to grow it (an RCU grace period per
//! doubling in a threaded process: docs/benchmarks.md). Its own process:
//! the table's size is per process.

/// The process's descriptor table size (`FDSize` in /proc/self/status).
fn fd_table_size() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .expect("FDSize in /proc/self/status")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn loading_the_shim_grows_the_descriptor_table_once() {
    let before = fd_table_size();
    assert!(before < 4096, "the table is already {before} slots");
    // Threaded, as a consumer is: the case where growing the table waits.
    let worker =
        std::thread::spawn(|| std::thread::park_timeout(std::time::Duration::from_secs(5)));
    kvwasm_tests::shim();
    assert!(
        fd_table_size() >= 4096,
        "{} slots after load",
        fd_table_size()
    );
    // Nothing was left open by the growth.
    let dir = std::fs::read_dir("/proc/self/fd").unwrap().count();
    assert!(dir < 64, "{dir} descriptors open");
    worker.thread().unpark();
    worker.join().unwrap();
}
