//! The data wasmtime keeps per guest instance.

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::guest_log::GuestStderr;
use crate::limits::InstanceLimits;

/// Per-instance host state: the WASI context built from the grants, the
/// resource table (WASI handles and payloads), the limits, and stderr.
pub struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: InstanceLimits,
    /// The guest's stderr, kept for trap reports.
    pub(crate) stderr: GuestStderr,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
