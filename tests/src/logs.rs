//! The host's log lines, captured in the test process (the in-process
//! host logs through `tracing`; the shim in a child process logs to its
//! own stderr), for tests that count what a guest can make it log.

use std::sync::{Mutex, Once};

use tracing_subscriber::filter::LevelFilter;

static CAPTURED: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Sink;

impl std::io::Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<u8>> {
    CAPTURED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Capture warnings and errors from now on, for the whole test process
/// (the first call installs the subscriber; later ones do nothing).
pub fn capture() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        tracing_subscriber::fmt()
            .with_max_level(LevelFilter::WARN)
            .with_ansi(false)
            .with_writer(|| Sink)
            .init();
    });
}

/// The captured lines that contain `needle` (tests running in parallel
/// share the capture: name what is yours).
pub fn lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&lock())
        .lines()
        .filter(|line| line.contains(needle))
        .map(str::to_owned)
        .collect()
}
