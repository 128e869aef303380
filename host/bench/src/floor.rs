//! The floor under every guest call: what wasmtime itself takes for the
//! smallest component call that reaches the host, measured in the same run
//! as the empty calls it bounds. A core function behind `canon lift` (a
//! `u32` in, a `u32` out) calls one host import, four ways:
//!
//! * `call_async` on a fiber, the import synchronous: how kvwasm calls a
//!   guest whose call makes a `payload-io` host call (the fs guest's empty
//!   call, `read-file`);
//! * `call_async`, the import async: the shape of a guest call that makes a
//!   WASI call (wasmtime-wasi links those as async functions);
//! * a synchronous `call`, no fiber: what a fiber-free call path would start
//!   from;
//! * the first way again with the core's caches swept before each call, as
//!   after a large transfer. This runs the bench's own copy of wasmtime,
//!   not the library's, whose code is laid out for the call path
//!   (shim-cdylib/build.rs).
//!
//! As in kvwasm, epoch interruption is on and a deadline is armed before
//! every call. No kvwasm code runs: no shim, handle, pool, WASI, string or
//! resource. Whatever an empty kvwasm call costs beyond the baseline's, at
//! least this much of it is wasmtime's.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use wasmtime::component::{Component, Linker, TypedFunc};
use wasmtime::{Config, Engine, Store};

use crate::Stat;
use crate::workloads::{EVICT_BYTES, evict_caches};

/// The smallest component with a host call inside: `call-host(x)` returns
/// what the host's `host-fn(x)` returns.
const COMPONENT: &str = r#"
(component
  (import "host-fn" (func $host (param "x" u32) (result u32)))
  (core func $host-lowered (canon lower (func $host)))
  (core module $m
    (import "" "host-fn" (func $host (param i32) (result i32)))
    (func (export "call-host") (param i32) (result i32) local.get 0 call $host))
  (core instance $i (instantiate $m (with "" (instance (export "host-fn" (func $host-lowered))))))
  (func (export "call-host") (param "x" u32) (result u32) (canon lift (core func $i "call-host")))
)"#;

/// Nanoseconds per call, one sample per repetition.
#[derive(Debug, serde::Serialize)]
pub struct CallFloor {
    /// `call_async`, a synchronous host import (kvwasm's empty call).
    pub asynchronous: Stat,
    /// `call_async`, an async host import (a WASI call's shape).
    pub async_import: Stat,
    /// `call`, a synchronous host import, no fiber.
    pub synchronous: Stat,
    /// As `asynchronous`, with the core's caches swept before each call.
    pub cold: Stat,
}

type CallHost = TypedFunc<(u32,), (u32,)>;

/// `n` timed calls of one kind, giving nanoseconds per call.
type Timed<'a> = &'a mut dyn FnMut(u32) -> wasmtime::Result<f64>;

/// Time `calls` calls of each kind per repetition (the cold kind: 1 in
/// 400), rotating which goes first, after a tenth as many to warm up.
pub fn measure(reps: usize, calls: u32) -> Result<CallFloor, String> {
    let fail = |e: wasmtime::Error| format!("the call floor: {e:#}");
    // What kvwasm's engine sets that touches a call: the component model and
    // epoch interruption (a deadline is armed before every call).
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true);
    let engine = Engine::new(&config).map_err(fail)?;
    let bytes = wat::parse_str(COMPONENT).map_err(|e| format!("the call floor: {e}"))?;
    let component = Component::new(&engine, bytes).map_err(fail)?;

    let mut sync_linker = Linker::<()>::new(&engine);
    sync_linker
        .root()
        .func_wrap("host-fn", |_, (x,): (u32,)| Ok((x.wrapping_add(1),)))
        .map_err(fail)?;
    let mut async_linker = Linker::<()>::new(&engine);
    async_linker
        .root()
        .func_wrap_async("host-fn", |_, (x,): (u32,)| {
            Box::new(async move { Ok((x.wrapping_add(1),)) })
        })
        .map_err(fail)?;
    let instance = |linker: &Linker<()>| -> Result<(Store<()>, CallHost), String> {
        let mut store = Store::new(&engine, ());
        let instance = ready(linker.instantiate_async(&mut store, &component)).map_err(fail)?;
        let f = instance
            .get_typed_func(&mut store, "call-host")
            .map_err(fail)?;
        Ok((store, f))
    };

    let (mut store, f) = instance(&sync_linker)?;
    let mut asynchronous = move |n: u32| timed(n, |i| call_async(&mut store, &f, i));
    let (mut store, f) = instance(&async_linker)?;
    let mut async_import = move |n: u32| timed(n, |i| call_async(&mut store, &f, i));
    let (mut store, f) = instance(&sync_linker)?;
    let mut synchronous = move |n: u32| {
        timed(n, |i| {
            store.set_epoch_deadline(1);
            f.call(&mut store, (i,)).map(|(r,)| r)
        })
    };
    // The empty call's shape again, with the caches swept before each call
    // as in `cold_small_call`: one call in 400 as many.
    let (mut store, f) = instance(&sync_linker)?;
    let mut sweep = vec![0u8; EVICT_BYTES];
    let mut cold = move |n: u32| {
        let n = (n / 400).max(1);
        let mut total = 0.0;
        for _ in 0..n {
            evict_caches(&mut sweep);
            total += timed(1, |i| call_async(&mut store, &f, i))?;
        }
        Ok(total / f64::from(n))
    };
    let mut kinds: [(Timed, Vec<f64>); 4] = [
        (&mut asynchronous, Vec::new()),
        (&mut async_import, Vec::new()),
        (&mut synchronous, Vec::new()),
        (&mut cold, Vec::new()),
    ];
    for (call, _) in kinds.iter_mut() {
        call(calls / 10).map_err(fail)?;
    }
    for rep in 0..reps {
        for k in 0..kinds.len() {
            let (call, samples) = &mut kinds[(rep + k) % kinds.len()];
            samples.push(call(calls).map_err(fail)?);
        }
    }
    let [
        (_, asynchronous),
        (_, async_import),
        (_, synchronous),
        (_, cold),
    ] = kinds;
    Ok(CallFloor {
        asynchronous: Stat::new(asynchronous),
        async_import: Stat::new(async_import),
        synchronous: Stat::new(synchronous),
        cold: Stat::new(cold),
    })
}

/// One `call_async` of `call-host(i)` with a deadline armed, as kvwasm
/// calls a guest.
fn call_async(store: &mut Store<()>, f: &CallHost, i: u32) -> wasmtime::Result<u32> {
    store.set_epoch_deadline(1);
    ready(f.call_async(store, (i,))).map(|(r,)| r)
}

/// Nanoseconds per call of `call(i)` for `i` in `0..n`; each result is
/// checked, so no call can be optimised away.
fn timed(n: u32, mut call: impl FnMut(u32) -> wasmtime::Result<u32>) -> wasmtime::Result<f64> {
    let start = Instant::now();
    for i in 0..n {
        let got = call(i)?;
        if got != i.wrapping_add(1) {
            wasmtime::bail!("call-host({i}) returned {got}");
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / f64::from(n.max(1)))
}

/// Run a future that never waits: the host import is ready at once, and
/// nothing advances this engine's epoch, so no deadline passes. (A future
/// that did wait would be polled in a busy loop: none here can.)
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every call's result is checked (`timed`), so this fails if any of
    /// the four ways stops reaching the host import.
    #[test]
    fn every_kind_of_call_completes_and_is_timed() {
        let floor = super::measure(2, 200).unwrap();
        for stat in [
            &floor.asynchronous,
            &floor.async_import,
            &floor.synchronous,
            &floor.cold,
        ] {
            assert_eq!(stat.samples.len(), 2);
            assert!(stat.samples.iter().all(|ns| *ns > 0.0 && ns.is_finite()));
        }
    }
}
