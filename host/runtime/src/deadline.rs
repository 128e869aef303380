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
use std::pin::pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::limits::EPOCH_TICK;

/// When an operation must have returned, and the budget it was given (for
/// error messages).
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
    budget_ms: u64,
}

impl Deadline {
    /// `budget_ms` from now.
    pub fn after_ms(budget_ms: u64) -> Deadline {
        Deadline {
            at: Instant::now() + Duration::from_millis(budget_ms),
            budget_ms,
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

    /// Epoch ticks left, rounded up (at least one, so a call that starts
    /// late still traps promptly rather than never).
    pub(crate) fn epoch_ticks(&self) -> u64 {
        let tick = EPOCH_TICK.as_nanos();
        (self.remaining().as_nanos().div_ceil(tick) as u64).max(1)
    }

    /// The instant, for `tokio::time`.
    fn instant(&self) -> Instant {
        self.at
    }
}

/// The runtime behind guests' asynchronous host imports (sockets, timers,
/// HTTP). One worker thread drives its I/O and timer events; guest calls
/// themselves run on the consumer's threads. Name lookups run on its
/// blocking pool (tokio's default size, threads started on demand and gone
/// after 10 s idle), so lookups a deadline abandoned cannot starve others.
/// The kv_store-traffic publisher's task runs here too ([`crate::events_out`]).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvwasm-io")
            .enable_all()
            .build()
            .expect("start the kvwasm I/O runtime")
    });
    &RUNTIME
}

/// Run `future` on this thread until it completes or `deadline` passes
/// (`None`). The caller must discard whatever state the future left behind
/// when it gets `None`.
///
/// Works on any thread, including one already inside another tokio
/// runtime (an async engine calling the C ABI): the future is polled here,
/// not handed to a runtime's `block_on`.
pub(crate) fn block_on<F: Future>(deadline: Deadline, future: F) -> Option<F::Output> {
    let _context = runtime().enter();
    let mut future = pin!(future);
    // Most calls never wait on the event loop (file I/O runs inline): they
    // finish in the first poll, and no timer is armed for them.
    if let Poll::Ready(out) = future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        return Some(out);
    }
    let until = tokio::time::Instant::from_std(deadline.instant());
    pollster::block_on(tokio::time::timeout_at(until, future)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_future_is_abandoned_at_the_deadline() {
        let started = Instant::now();
        let out = block_on(Deadline::after_ms(50), async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        assert!(out.is_none());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_millis(1000),
            "{took:?}"
        );
    }

    #[test]
    fn a_ready_future_needs_no_timer() {
        assert_eq!(block_on(Deadline::after_ms(1), async { 7 }), Some(7));
        let out = block_on(Deadline::after_ms(1000), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            8
        });
        assert_eq!(out, Some(8));
    }

    #[test]
    fn works_inside_another_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = outer.block_on(async {
            block_on(Deadline::after_ms(1000), async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                9
            })
        });
        assert_eq!(out, Some(9));
    }
}
