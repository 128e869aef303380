//! A process that forks after its first open: the child does not inherit
//! the host's threads (deadline ticker, I/O runtime), so every call there
//! fails at once with a clear error instead of hanging, and the parent
//! goes on working. Its own process: `fork` copies only the calling thread.

use std::time::{Duration, Instant};

/// Wait up to `limit` for `child`; its exit code, or `None` if it hung
/// (then it is killed).
fn wait_for(child: libc::pid_t, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let done = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if done == child {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if start.elapsed() > limit {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_child_forked_after_the_first_open_is_refused_and_the_parent_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let handle = kvwasm_tests::open_fs(dir.path());
    handle.put_manifest("m", b"manifest").unwrap();

    // SAFETY: the child only calls the shim (which refuses at its entry,
    // before taking any lock) and `_exit`s.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        let code = match handle.get_manifest("m") {
            Err(rc) if rc < 0 => 0,
            Err(_) => 1,
            Ok(_) => 2,
        };
        // SAFETY: leaves the child without running the parent's exit code.
        unsafe { libc::_exit(code) };
    }
    assert_eq!(
        wait_for(child, Duration::from_secs(20)),
        Some(0),
        "the child's call must fail at once (2: it ran, None: it hung)"
    );
    assert_eq!(&*handle.get_manifest("m").unwrap(), b"manifest");
}
