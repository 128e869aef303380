//! A connection's socket with a stall limit per call and a deadline per request or
//! response, in each direction: a peer that trickles bytes cannot hold a connection thread.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One direction of a [`Timed`] socket: a stall limit per call and a deadline for the whole
/// request or response under way.
#[derive(Default)]
pub(super) struct Clock {
    /// Longest one call may wait for the peer.
    stall: Cell<Duration>,
    /// When the request or response under way must be done, if one is.
    by: Cell<Option<Instant>>,
    /// The socket timeout as last set (saves a system call per read or write).
    set: Cell<Option<Duration>>,
}

impl Clock {
    /// Runs `call` with the socket timeout `apply` sets to the nearer of the stall limit and
    /// the deadline; past the deadline, a timeout without calling.
    fn run<T>(
        &self,
        apply: impl FnOnce(Option<Duration>) -> io::Result<()>,
        call: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let mut timeout = self.stall.get();
        if let Some(by) = self.by.get() {
            let left = by.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            timeout = timeout.min(left);
        }
        // A zero timeout is an error to the socket API: the shortest one instead.
        let timeout = Some(timeout.max(Duration::from_millis(1)));
        if self.set.get() != timeout {
            apply(timeout)?;
            self.set.set(timeout);
        }
        call()
    }

    /// The request or response under way must now be done by `by` (the stall limit stays).
    pub(super) fn finish_by(&self, by: Instant) {
        self.by.set(Some(by));
    }

    /// From now on, calls may each wait `stall`, and must be done by `by`.
    pub(super) fn limit(&self, stall: Duration, by: Option<Instant>) {
        self.stall.set(stall);
        self.by.set(by);
    }
}

/// A connection's socket under [`Clock`]s, read and written through `&Timed`.
pub(super) struct Timed<'a> {
    stream: &'a TcpStream,
    pub(super) read: Clock,
    pub(super) write: Clock,
}

impl<'a> Timed<'a> {
    pub(super) fn new(stream: &'a TcpStream) -> Timed<'a> {
        Timed {
            stream,
            read: Clock::default(),
            write: Clock::default(),
        }
    }
}

impl Read for &Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut stream = self.stream;
        self.read
            .run(|t| stream.set_read_timeout(t), || stream.read(buf))
    }
}

impl Write for &Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut stream = self.stream;
        self.write
            .run(|t| stream.set_write_timeout(t), || stream.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether a socket error is its read or write timeout running out.
pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
