//! Where guests' asynchronous host imports (sockets, timers, HTTP) run.
//!
//! Two event loops serve them:
//!
//! * [`shared`]: one tokio runtime for the process, with one worker thread
//!   driving its I/O and timer events. Guests without sockets use it (their
//!   calls rarely wait at all), and so do the pooled HTTP client, name
//!   lookups and the kv_store-traffic publisher.
//! * [`InstanceIo`]: an event loop of one guest instance, for guests granted
//!   network peers. It has no thread: the consumer's thread that calls the
//!   guest drives it while the call waits. A reply arriving on the guest's
//!   socket therefore wakes the waiting caller directly, as a native
//!   client's blocking read would be woken. Through [`shared`] the same
//!   reply wakes the I/O thread first, which then wakes the caller: two
//!   thread wake-ups per round trip instead of one, and on a VM a wake-up
//!   of an idle vCPU costs tens of microseconds.
//!
//! An instance serves one call at a time (see [`crate::handle`]), so its
//! loop is never driven by two threads at once; between calls nobody
//! drives it, which is fine because nothing of the guest's waits then (a
//! write still in flight when a call returns resumes with the next call).

use std::future::Future;
use std::sync::LazyLock;

/// The process's shared runtime. Name lookups run on its blocking pool
/// (tokio's default size, threads started on demand and gone after 10 s
/// idle), so lookups a deadline abandoned cannot starve others.
pub(crate) fn shared() -> &'static tokio::runtime::Runtime {
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

/// Run `future` on the shared runtime, whatever loop the caller is in.
/// Connections shared between instances (the HTTP pool) must be driven
/// there: an instance's own loop stops whenever its caller does.
pub(crate) fn on_shared<F>(future: F) -> impl Future<Output = F::Output> + Send + 'static
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Abandoned with the call (at its deadline), the task is aborted.
    wasmtime_wasi::runtime::AbortOnDropJoinHandle::from(shared().spawn(future))
}

/// The event loop of one guest instance, driven by its callers.
pub(crate) struct InstanceIo {
    /// Always `Some` until dropped (taken to shut it down without waiting).
    runtime: Option<tokio::runtime::Runtime>,
}

impl InstanceIo {
    pub(crate) fn new() -> std::io::Result<InstanceIo> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            // Its blocking pool runs the guest's name lookups: a few at
            // most per instance, not tokio's default of 512.
            .max_blocking_threads(2)
            .thread_name("kvwasm-lookup")
            .build()?;
        Ok(InstanceIo {
            runtime: Some(runtime),
        })
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("present until dropped")
    }
}

impl Drop for InstanceIo {
    /// Without waiting for a name lookup still running on its blocking pool
    /// (one a deadline abandoned), and from any context, async included.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_task_runs_whoever_awaits_it() {
        let io = InstanceIo::new().unwrap();
        let out = io.runtime().block_on(on_shared(async { 5 }));
        assert_eq!(out, 5);
    }

    #[test]
    fn an_instance_loop_can_be_dropped_inside_another_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let io = InstanceIo::new().unwrap();
        outer.block_on(async move { drop(io) });
    }
}
