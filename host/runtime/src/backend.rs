//! A backend: a component plus the operator's policy for running it.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};

use wasmtime_wasi_config::WasiConfigVariables;

use crate::capabilities::Grants;
use crate::component::{ComponentSource, LoadedComponent};
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::limits::Limits;
use crate::metrics::BackendMetrics;

/// Everything needed to open stores on one backend.
pub struct Backend {
    /// Config name (`wasm://<name>/...`), or `builtin:fs` for `wasm:///dir`.
    pub name: String,
    /// Where the component came from.
    pub source: ComponentSource,
    /// The compiled, linked component.
    pub component: Arc<LoadedComponent>,
    /// What instances may reach.
    pub grants: Grants,
    /// Per-instance limits.
    pub limits: Limits,
    /// Limits for particular tenants (the first namespace component).
    pub tenant_limits: BTreeMap<String, Limits>,
    /// Most instances serving one handle at once (only for backends that
    /// declare shared state; others get one).
    pub max_instances: usize,
    /// An instance idle this long is released, and started again on the
    /// handle's next call (0: never; see `handle::reaper`).
    pub idle_release_ms: u64,
    /// Of the handles on this backend name, the most recently used this
    /// many keep one instance through idle release, however long they idle
    /// (0: none; see `handle::reaper`).
    pub warm_handles: usize,
    /// Most calls in flight on this backend at once, over all handles.
    pub max_concurrent_calls: Option<usize>,
    pub(crate) calls_in_flight: CallGate,
    /// Counters (shared by every backend entry of this name).
    pub metrics: Arc<BackendMetrics>,
    /// `grants.settings` as every instance's `wasi:config` store serves it.
    pub(crate) config_vars: Arc<WasiConfigVariables>,
    /// The publisher of this backend's kv_store traffic (`publish_events`).
    pub(crate) events_out: Option<crate::events_out::EventsOut>,
    /// Subscribers only: stored events reach the guest with their token ids
    /// already hashed (`prehash_tokens`, see [`crate::subscriber`]).
    pub prehash_tokens: bool,
    /// What this backend's instances said its server holds, per namespace
    /// (`known-chunks`): outlives the instances idle release drops.
    pub known_chunks: Arc<crate::known_chunks::KnownChunks>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("grants", &self.grants)
            .field("limits", &self.limits)
            .field("tenant_limits", &self.tenant_limits)
            .field("max_instances", &self.max_instances)
            .field("idle_release_ms", &self.idle_release_ms)
            .field("warm_handles", &self.warm_handles)
            .field("max_concurrent_calls", &self.max_concurrent_calls)
            .field("prehash_tokens", &self.prehash_tokens)
            .finish()
    }
}

impl Backend {
    /// A backend with default limits and no tenants or call cap.
    pub fn new(
        name: &str,
        source: ComponentSource,
        component: Arc<LoadedComponent>,
        grants: Grants,
    ) -> Backend {
        Backend {
            warm_handles: default_warm_handles(&source),
            config_vars: Arc::new(grants.settings.variables()),
            name: name.to_owned(),
            source,
            component,
            grants,
            limits: Limits::default(),
            tenant_limits: BTreeMap::new(),
            max_instances: default_max_instances(),
            idle_release_ms: DEFAULT_IDLE_RELEASE_MS,
            max_concurrent_calls: None,
            calls_in_flight: CallGate::default(),
            metrics: crate::metrics::for_backend(name),
            events_out: None,
            prehash_tokens: false,
            known_chunks: Arc::default(),
        }
    }

    /// The limits for `namespace`: its tenant's (first component), if the
    /// config sets any, else the backend's.
    pub fn limits_for(&self, namespace: &str) -> &Limits {
        // Asked on every call: most backends set no per-tenant limits.
        if self.tenant_limits.is_empty() {
            return &self.limits;
        }
        let tenant = namespace.split('/').next().unwrap_or("");
        self.tenant_limits.get(tenant).unwrap_or(&self.limits)
    }

    /// Wait (until `deadline`) for a slot under `max_concurrent_calls`.
    pub(crate) fn enter_call(&self, deadline: Deadline) -> Result<CallSlot<'_>, KvError> {
        let Some(max) = self.max_concurrent_calls else {
            return Ok(CallSlot { gate: None });
        };
        let gate = &self.calls_in_flight;
        let mut in_flight = gate.count.lock().unwrap_or_else(|p| p.into_inner());
        while *in_flight >= max {
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(KvError::Limit(format!(
                    "backend {:?} already runs its maximum of {max} concurrent calls",
                    self.name
                )));
            }
            in_flight = gate
                .freed
                .wait_timeout(in_flight, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *in_flight += 1;
        Ok(CallSlot { gate: Some(gate) })
    }
}

/// Calls in flight on one backend.
#[derive(Debug, Default)]
pub(crate) struct CallGate {
    count: Mutex<usize>,
    freed: Condvar,
}

/// One call's place under `max_concurrent_calls`, given back on drop.
pub(crate) struct CallSlot<'a> {
    gate: Option<&'a CallGate>,
}

impl Drop for CallSlot<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.gate {
            *gate.count.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
            gate.freed.notify_one();
        }
    }
}

/// Default `idle_release_ms`: an idle handle holds no guest instance after
/// a second, and a handle in use pays no re-instantiation (~0.1 ms) per call.
pub const DEFAULT_IDLE_RELEASE_MS: u64 = 1000;

/// Default `warm_handles`: 1 for `builtin:fs` (and so `wasm:///dir`), 0
/// for every other component. A disk store's warm save is a few hundred
/// microseconds natively, so an instance start, the host's reopened
/// directories and the refaults after a release would cost a long-lived
/// store (llama.cpp's, saving every few seconds) up to twice that
/// (docs/benchmarks.md, warm saves after idle gaps). The Redis and S3
/// guests keep what a release loses on the host (`known-chunks`), and a
/// connection kept for hours could meet a server's idle timeout.
pub fn default_warm_handles(source: &ComponentSource) -> usize {
    usize::from(*source == ComponentSource::Builtin(crate::component::Builtin::Fs))
}

/// Default instances per handle: 4. A call holds its instance for its whole
/// I/O (done on the caller's thread), so more instances than cores still
/// overlap work (docs/benchmarks.md, thread scaling). Instances start only
/// when calls overlap.
pub fn default_max_instances() -> usize {
    4
}
