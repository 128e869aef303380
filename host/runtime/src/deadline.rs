//! Call deadlines that hold whatever a guest does.
//!
//! Every operation on a handle gets one [`Deadline`] when it starts, and
//! everything it does on the consumer's behalf shares it: waiting for a free
//! instance, flushing other instances, the guest call itself, and closing.
//!
//! Guests run on wasmtime's async support, so a call into a guest is a
//! future, polled on the caller's own thread by [`block_on`]. Two things
//! bound it:
//!
//! * wasm code still running at the deadline traps at its next epoch check
//!   (`Trap::Interrupt`, see [`crate::limits::EPOCH_TICK`]);
//! * a guest waiting inside a host import (a clock, a socket read, an HTTP
//!   response) is a pending future: at the deadline the caller stops polling
//!   it and drops it. The instance it ran in is then in an unknown state and
//!   is discarded by the caller.
//!
//! Host imports that would block the thread itself rather than return a
//! pending future (opening a file) refuse what could block before it does
//! (FIFOs and devices, see [`crate::capabilities::dirs`]).

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::engine::{ticks, ticks_in};
use crate::io::InstanceIo;

/// When an operation must have returned, and the budget it was given (for
/// error messages).
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
    budget_ms: u64,
    /// The epoch tick it started at ([`crate::engine::ticks`]).
    started_tick: u64,
}

impl Deadline {
    /// `budget_ms` from now.
    pub fn after_ms(budget_ms: u64) -> Deadline {
        Deadline {
            at: Instant::now() + Duration::from_millis(budget_ms),
            budget_ms,
            started_tick: ticks(),
        }
    }

    /// Time left (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// The budget this deadline was given, in milliseconds.
    pub fn budget_ms(&self) -> u64 {
        self.budget_ms
    }

    /// Epoch ticks left: the budget in ticks, rounded up, less the ticks
    /// passed since the deadline started. Counted on the ticker's clock,
    /// which also moves the engines' epochs, rather than read from the
    /// system clock on every call. At least one, so a call that starts late
    /// still traps promptly rather than never.
    pub(crate) fn epoch_ticks(&self) -> u64 {
        let budget = ticks_in(Duration::from_millis(self.budget_ms));
        let passed = ticks().saturating_sub(self.started_tick);
        budget.saturating_sub(passed).max(1)
    }

    /// The instant, for `tokio::time`.
    fn instant(&self) -> Instant {
        self.at
    }
}

/// Run the future `make` returns, on this thread, until it completes or
/// `deadline` passes (`None`). The caller must discard whatever state the
/// future left behind when it gets `None`.
///
/// `io` is the instance's own event loop, if it has one ([`crate::io`]):
/// this thread drives it while the future waits. Without one, the future
/// is polled here and its I/O is driven by the shared runtime.
///
/// Works on any thread, including one already inside another tokio
/// runtime (an async engine calling the C ABI). There the future is polled
/// without a runtime of our own; an instance's own loop, which tokio will
/// not drive on such a thread, is driven by a short-lived helper thread
/// for the call instead.
pub(crate) fn block_on<F, M>(
    deadline: Deadline,
    io: Option<&InstanceIo>,
    make: M,
) -> Option<F::Output>
where
    M: FnOnce() -> F + Send,
    F: Future,
    F::Output: Send,
{
    let Some(io) = io else {
        let _context = crate::io::shared().enter();
        return run_polled(deadline, make());
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return run_driven(deadline, io, make());
    }
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("kvwasm-call".into())
            .spawn_scoped(scope, || run_driven(deadline, io, make()))
            .map_err(|e| tracing::warn!("cannot start a thread for a guest call: {e}"))
            .ok()?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Most calls never wait on an event loop (file I/O runs inline, a cached
/// chunk is at hand): they finish in the first poll, and no timer is armed
/// for them.
fn first_poll<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// Poll on this thread; the shared runtime delivers the wake-ups.
fn run_polled<F: Future>(deadline: Deadline, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    if let Poll::Ready(out) = first_poll(future.as_mut()) {
        return Some(out);
    }
    let until = tokio::time::Instant::from_std(deadline.instant());
    pollster::block_on(tokio::time::timeout_at(until, future)).ok()
}

/// Drive the instance's own loop on this thread while the future waits.
fn run_driven<F: Future>(deadline: Deadline, io: &InstanceIo, future: F) -> Option<F::Output> {
    let runtime = io.runtime();
    let mut future = pin!(future);
    {
        let _context = runtime.enter();
        if let Poll::Ready(out) = first_poll(future.as_mut()) {
            return Some(out);
        }
    }
    let until = tokio::time::Instant::from_std(deadline.instant());
    runtime
        .block_on(async { tokio::time::timeout_at(until, future).await })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Both kinds of call: through the shared runtime, and through an
    /// instance's own loop.
    fn each_io(test: impl Fn(Option<&InstanceIo>)) {
        test(None);
        test(Some(&InstanceIo::new().unwrap()));
    }

    #[test]
    fn a_pending_future_is_abandoned_at_the_deadline() {
        each_io(|io| {
            let started = Instant::now();
            let out = block_on(Deadline::after_ms(50), io, || async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            });
            assert!(out.is_none());
            // At the deadline, not before; the upper bound only rules out
            // the hour asked for, with room for a loaded machine.
            let took = started.elapsed();
            assert!(
                took >= Duration::from_millis(50) && took < Duration::from_secs(30),
                "{took:?}"
            );
        });
    }

    /// A deadline's epoch budget is counted on the ticker's clock: the
    /// whole budget at first, less each tick that passes, never below one.
    #[test]
    fn epoch_ticks_count_down_with_the_ticker() {
        crate::engine::ensure_ticking().unwrap();
        let budget = ticks_in(Duration::from_millis(1000));
        let before = ticks();
        let deadline = Deadline::after_ms(1000);
        let first = deadline.epoch_ticks();
        let elapsed = ticks() - before;
        assert!(
            first <= budget && first + elapsed >= budget,
            "{first} of {budget}, {elapsed} ticks passed while reading"
        );
        let start = ticks();
        let waited = Instant::now();
        while ticks() < start + 3 {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "the ticker stopped"
            );
            std::thread::sleep(crate::limits::EPOCH_TICK);
        }
        let later = deadline.epoch_ticks();
        assert!(later + 3 <= first, "{later} after {first}");
        assert_eq!(Deadline::after_ms(0).epoch_ticks(), 1);
        // Once the budget has passed, one tick is left: the guest traps at
        // the next tick, never runs on.
        let short = Deadline::after_ms(20);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(short.epoch_ticks(), 1);
    }

    /// The ticker counts ticks at the wall clock's pace (it sleeps until each
    /// tick's due time and counts missed ones), so deadlines counted in
    /// ticks do not stretch: 200 ms of wall time is 40 ticks, give or take
    /// the tick in progress at either end. On a busy machine the ticker
    /// may not have run when the sleep ends, so the count is read once it
    /// has woken twice since (the second wake read its clock after the
    /// first one stored its count, so after the sleep ended): whenever
    /// that is, it must then hold every tick due by the sleep's end.
    #[test]
    fn ticks_keep_pace_with_the_wall_clock() {
        crate::engine::ensure_ticking().unwrap();
        let start = ticks();
        let wall = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        let slept = wall.elapsed();
        let give_up = Instant::now() + Duration::from_secs(60);
        let mut seen = ticks();
        for _ in 0..2 {
            while ticks() == seen {
                assert!(Instant::now() < give_up, "the ticker stopped");
                std::thread::sleep(Duration::from_millis(1));
            }
            seen = ticks();
        }
        let counted = seen - start;
        let due = ticks_in(slept);
        let at_most = ticks_in(wall.elapsed()) + 1;
        assert!(
            counted + 2 >= due && counted <= at_most,
            "{counted} ticks counted: {due} were due when the sleep ended, at most {at_most} now"
        );
    }

    #[test]
    fn a_ready_future_needs_no_timer() {
        each_io(|io| {
            assert_eq!(block_on(Deadline::after_ms(1), io, || async { 7 }), Some(7));
            let out = block_on(Deadline::after_ms(1000), io, || async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                8
            });
            assert_eq!(out, Some(8));
        });
    }

    #[test]
    fn works_inside_another_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        each_io(|io| {
            let out = outer.block_on(async {
                block_on(Deadline::after_ms(1000), io, || async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    9
                })
            });
            assert_eq!(out, Some(9));
        });
    }

    /// A socket opened in one call is registered with the instance's loop;
    /// a later call on another thread (inside another runtime, even)
    /// still gets its reply, because each caller drives that loop.
    #[test]
    fn an_instance_socket_outlives_the_call_and_the_thread_that_opened_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            let mut byte = [0u8; 1];
            for reply in [b'a', b'b', b'c'] {
                peer.read_exact(&mut byte).unwrap();
                // The reply comes late: the caller must be parked by then.
                std::thread::sleep(Duration::from_millis(20));
                peer.write_all(&[reply]).unwrap();
            }
        });
        let io = InstanceIo::new().unwrap();
        let deadline = || Deadline::after_ms(5_000);
        let mut socket = block_on(deadline(), Some(&io), || async {
            tokio::net::TcpStream::connect(address).await.unwrap()
        })
        .unwrap();
        let round_trip = |socket: &mut tokio::net::TcpStream| {
            block_on(deadline(), Some(&io), || async {
                socket.write_all(b"?").await.unwrap();
                socket.read_u8().await.unwrap()
            })
        };
        assert_eq!(round_trip(&mut socket), Some(b'a'));
        let socket = std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(round_trip(&mut socket), Some(b'b'));
                socket
            })
            .join()
            .unwrap()
        });
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut socket = socket;
        assert_eq!(
            outer.block_on(async { round_trip(&mut socket) }),
            Some(b'c')
        );
        server.join().unwrap();
    }
}
