//! The floor under every guest call: what wasmtime itself takes for the
//! smallest component call that reaches the host, measured in the same run
//! as the empty calls it bounds. A core function behind `canon lift` (a
//! `u32` in, a `u32` out) calls one host import: once with `call_async` on
//! a fiber, as kvwasm calls its guests, and once with a synchronous `call`,
//! which needs no fiber (what a fiber-free call path would start from).
//!
//! No kvwasm code runs here: no shim, handle, pool, deadline, WASI, string
//! or resource. Whatever an empty kvwasm call costs beyond the baseline's,
//! at least this much of it is wasmtime's.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use wasmtime::component::{Component, Linker, TypedFunc};
use wasmtime::{Config, Engine, Store};

use crate::Stat;

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
    /// `call_async`, with an async host import (kvwasm's way).
    pub asynchronous: Stat,
    /// `call`, with a synchronous host import.
    pub synchronous: Stat,
}

type CallHost = TypedFunc<(u32,), (u32,)>;

/// Time `calls` calls of each kind per repetition, alternating which goes
/// first, after a tenth as many to warm up.
pub fn measure(reps: usize, calls: u32) -> Result<CallFloor, String> {
    let fail = |e: wasmtime::Error| format!("the call floor: {e:#}");
    // What kvwasm's engine sets that touches a call: the component model and
    // epoch interruption (a deadline is armed before every call).
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true);
    let engine = Engine::new(&config).map_err(fail)?;
    let bytes = wat::parse_str(COMPONENT).map_err(|e| format!("the call floor: {e}"))?;
    let component = Component::new(&engine, bytes).map_err(fail)?;

    let mut linker = Linker::<()>::new(&engine);
    linker
        .root()
        .func_wrap("host-fn", |_, (x,): (u32,)| Ok((x.wrapping_add(1),)))
        .map_err(fail)?;
    let mut sync_store = Store::new(&engine, ());
    let instance = linker
        .instantiate(&mut sync_store, &component)
        .map_err(fail)?;
    let sync_fn: CallHost = instance
        .get_typed_func(&mut sync_store, "call-host")
        .map_err(fail)?;

    let mut linker = Linker::<()>::new(&engine);
    linker
        .root()
        .func_wrap_async("host-fn", |_, (x,): (u32,)| {
            Box::new(async move { Ok((x.wrapping_add(1),)) })
        })
        .map_err(fail)?;
    let mut async_store = Store::new(&engine, ());
    let instance = ready(linker.instantiate_async(&mut async_store, &component)).map_err(fail)?;
    let async_fn: CallHost = instance
        .get_typed_func(&mut async_store, "call-host")
        .map_err(fail)?;

    let mut sync_call = |n: u32| -> Result<f64, String> {
        timed(n, |i| {
            sync_store.set_epoch_deadline(1);
            sync_fn.call(&mut sync_store, (i,)).map(|(r,)| r)
        })
        .map_err(fail)
    };
    let mut async_call = |n: u32| -> Result<f64, String> {
        timed(n, |i| {
            async_store.set_epoch_deadline(1);
            ready(async_fn.call_async(&mut async_store, (i,))).map(|(r,)| r)
        })
        .map_err(fail)
    };
    sync_call(calls / 10)?;
    async_call(calls / 10)?;
    let (mut sync, mut asynchronous) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        if rep % 2 == 0 {
            sync.push(sync_call(calls)?);
            asynchronous.push(async_call(calls)?);
        } else {
            asynchronous.push(async_call(calls)?);
            sync.push(sync_call(calls)?);
        }
    }
    Ok(CallFloor {
        asynchronous: Stat::new(asynchronous),
        synchronous: Stat::new(sync),
    })
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
/// nothing advances this engine's epoch, so no call yields at its deadline.
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
    #[test]
    fn both_kinds_of_call_are_measured() {
        let floor = super::measure(2, 200).unwrap();
        for stat in [&floor.asynchronous, &floor.synchronous] {
            assert_eq!(stat.samples.len(), 2);
            assert!(stat.samples.iter().all(|ns| *ns > 0.0 && ns.is_finite()));
        }
    }
}
