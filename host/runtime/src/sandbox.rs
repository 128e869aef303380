//! The one sandbox every guest kind runs in.
//!
//! A kv-store backend and a fabric guest get the same store: WASI built
//! from the operator's grants, the memory, table, resource and payload
//! limits, the fuel budget of a metered engine, stderr kept for trap
//! reports. Every call into either runs under the same [`Deadline`] rules
//! and is classified the same way ([`Outcome`]), so a new guest kind cannot
//! come with a second, weaker path.

use std::sync::Arc;

use wasmtime::{Store, Trap};

use crate::backend::Backend;
use crate::capabilities::descriptors::{Headroom, Share};
use crate::capabilities::durable::KeptDirsByStore;
use crate::capabilities::http::HttpPolicy;
use crate::deadline::{self, Deadline};
use crate::engine::Metering;
use crate::error::KvError;
use crate::guest_log::GuestStderr;
use crate::io::InstanceIo;
use crate::payload;
use crate::state::HostState;

/// How a call into a guest ended.
pub(crate) enum Outcome<T> {
    /// The guest returned (a value or its own error); the instance is healthy.
    Returned(Result<T, KvError>),
    /// The instance trapped or was abandoned at the deadline: drop it.
    Lost(KvError),
}

/// A store for one new instance of `backend`'s component, under the limits
/// of `namespace`'s tenant, with the fuel budget each call gets (on a
/// metered engine).
pub(crate) fn new_store(
    backend: &Backend,
    namespace: &str,
) -> Result<(Store<HostState>, Option<u64>), KvError> {
    let limits = backend.limits_for(namespace);
    let stderr = GuestStderr::new(&backend.name);
    let wasi = backend
        .grants
        .wasi_ctx(stderr.clone(), &backend.metrics)
        .map_err(|e| KvError::host("cannot apply the grants", e))?;
    let mut table = wasmtime::component::ResourceTable::new();
    table.set_max_capacity(limits.max_resources);
    let name: Arc<str> = backend.name.as_str().into();
    let kind = backend.component.kind();
    let state = HostState {
        headroom: Headroom::new(
            name.clone(),
            Share::of(kind),
            limits.max_descriptors_for(kind),
        ),
        backend: name,
        metrics: backend.metrics.clone(),
        kept_dirs: KeptDirsByStore::global().for_store(
            backend.grants.dirs.iter().map(|d| d.host.as_path()),
            namespace,
        ),
        namespace: namespace.into(),
        known_chunks: backend.known_chunks.clone(),
        list_dirs: backend.grants.list_dirs,
        wasi,
        http: wasmtime_wasi_http::WasiHttpCtx::new(),
        http_policy: HttpPolicy {
            grant: backend.grants.http.clone(),
            metrics: backend.metrics.clone(),
            tls: backend.grants.tls.clone(),
            https_without_grant: None,
        },
        tls: backend.grants.tls_ctx(&backend.name, &backend.metrics),
        sealed_streams: Default::default(),
        settings: backend.config_vars.clone(),
        table,
        limits: limits.instance_limits(),
        stderr,
        io: instance_io(backend)?,
    };
    crate::engine::ensure_ticking()?;
    let mut store = Store::new(backend.component.engine, state);
    store.limiter(|s| &mut s.limits);
    // On a metered engine every call needs a budget; tenants that set none
    // get an unlimited one.
    let fuel = match backend.component.metering {
        Metering::Fuel => Some(limits.fuel.unwrap_or(u64::MAX)),
        Metering::Off => None,
    };
    Ok((store, fuel))
}

/// An event loop of the instance's own if the backend may open sockets
/// (see [`crate::io`]).
fn instance_io(backend: &Backend) -> Result<Option<Arc<InstanceIo>>, KvError> {
    if !backend.grants.net.has_peers() {
        return Ok(None);
    }
    let io = InstanceIo::new()
        .map_err(|e| KvError::host("cannot start the instance's event loop", e))?;
    Ok(Some(Arc::new(io)))
}

/// Run `call` (instantiation, one guest method, a destructor) within
/// `deadline`, and classify how it ended.
///
/// Every entry into guest code, of every guest kind, comes through here,
/// so this is where a `get_chunk_into` caller's buffer is taken back: the
/// leases on it that payloads made in the call hold are revoked as the
/// call ends ([`payload::target::revoke_leases`]), before the instance can
/// be checked in, parked or used by another thread. A payload the guest
/// kept reads as empty from then on, and cannot be returned as the answer
/// of a later call.
pub(crate) fn run<T: Send, E: Into<KvError> + Send>(
    store: &mut Store<HostState>,
    deadline: Deadline,
    fuel: Option<u64>,
    call: impl AsyncFnOnce(&mut Store<HostState>) -> wasmtime::Result<Result<T, E>> + Send,
) -> Outcome<T> {
    arm(store, deadline, fuel);
    let io = store.data().io.clone();
    let outcome = match deadline::block_on(deadline, io.as_deref(), || call(&mut *store)) {
        None => Outcome::Lost(KvError::Timeout(deadline.budget_ms())),
        Some(Ok(result)) => Outcome::Returned(result.map_err(Into::into)),
        Some(Err(err)) => Outcome::Lost(lost(store, err, deadline)),
    };
    payload::target::revoke_leases();
    outcome
}

/// Arm the epoch deadline and the fuel budget for the next call, and start
/// it with a clean out-of-memory flag.
fn arm(store: &mut Store<HostState>, deadline: Deadline, fuel: Option<u64>) {
    store.set_epoch_deadline(deadline.epoch_ticks());
    store.data_mut().limits.memory_denied = false;
    if let Some(fuel) = fuel {
        store
            .set_fuel(fuel)
            .expect("fuel is set only on a metered backend's engine");
    }
}

/// Describe a trap (or other fatal error) that ended an instance, in one
/// line: the trap code, not the wasm backtrace.
pub(crate) fn lost(store: &Store<HostState>, err: wasmtime::Error, deadline: Deadline) -> KvError {
    let trap = err.downcast_ref::<Trap>();
    if trap == Some(&Trap::Interrupt) {
        return KvError::Timeout(deadline.budget_ms());
    }
    if trap == Some(&Trap::OutOfFuel) {
        return KvError::Limit("the call used up its fuel budget".into());
    }
    if let Some(wasmtime::component::ResourceTableError::Full) = err.downcast_ref() {
        return KvError::Limit(format!(
            "the instance already holds its maximum of {} resources (files, sockets, \
             payloads...; `max_resources`)",
            store.data().table.max_capacity()
        ));
    }
    let mut what = trap.map_or_else(
        || crate::log_limit::bounded(format!("{err:#}")),
        Trap::to_string,
    );
    if let Some(words) = store.data().stderr.last_words() {
        what = format!("{what}; guest stderr: {words}");
    }
    if store.data().limits.memory_denied {
        KvError::Trapped(format!(
            "out of memory: the memory limit was reached ({what})"
        ))
    } else {
        KvError::Trapped(what)
    }
}
