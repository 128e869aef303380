//! The data wasmtime keeps per guest instance.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_config::WasiConfigVariables;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
use wasmtime_wasi_tls::{WasiTlsCtx, WasiTlsCtxView, WasiTlsView};

use crate::capabilities::http::HttpPolicy;
use crate::guest_log::GuestStderr;
use crate::io::InstanceIo;
use crate::limits::InstanceLimits;

/// Per-instance host state: the WASI contexts built from the grants, the
/// resource table (WASI handles and payloads), the limits, and stderr.
pub struct HostState {
    /// The backend's name, for log lines about what this guest was refused.
    pub(crate) backend: Arc<str>,
    /// The backend's counters.
    pub(crate) metrics: Arc<crate::metrics::BackendMetrics>,
    /// The namespace the instance opened: the only one whose
    /// `known-chunks` record it reaches.
    pub(crate) namespace: Arc<str>,
    /// The backend's `known-chunks` records.
    pub(crate) known_chunks: Arc<crate::known_chunks::KnownChunks>,
    /// Subdirectories `find-file` keeps open, shared with the live
    /// instances of the same backend and namespace.
    pub(crate) kept_dirs: Arc<crate::capabilities::durable::KeptDirs>,
    /// The descriptors the instance may open (its cap, its kind's share).
    pub(crate) headroom: crate::capabilities::descriptors::Headroom,
    /// Whether `read-directory` is granted.
    pub(crate) list_dirs: bool,
    pub(crate) wasi: WasiCtx,
    pub(crate) http: WasiHttpCtx,
    /// Checks every outgoing HTTP request against the grant.
    pub(crate) http_policy: HttpPolicy,
    /// `wasi:tls` handshakes, with the backend's TLS grant.
    pub(crate) tls: WasiTlsCtx,
    /// Streams of TLS-only sockets not yet handed to `wasi:tls`, by table
    /// index (`guards::tls::add_to_linker`).
    pub(crate) sealed_streams: std::collections::HashMap<u32, Arc<std::sync::atomic::AtomicBool>>,
    /// The backend's settings, served by `wasi:config/store`.
    pub(crate) settings: Arc<WasiConfigVariables>,
    pub(crate) table: ResourceTable,
    pub(crate) limits: InstanceLimits,
    /// The guest's stderr, kept for trap reports.
    pub(crate) stderr: GuestStderr,
    /// The instance's own event loop, for a guest granted network peers
    /// (see [`crate::io`]). Last, so that it outlives the sockets in
    /// `wasi` and `table`.
    pub(crate) io: Option<Arc<InstanceIo>>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_policy,
        }
    }
}

impl WasiTlsView for HostState {
    fn tls(&mut self) -> WasiTlsCtxView<'_> {
        WasiTlsCtxView {
            ctx: &mut self.tls,
            table: &mut self.table,
        }
    }
}
