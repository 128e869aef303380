//! The WASI functions the host replaces on the linker
//! (`component::linker`): wasmtime-wasi's own, with the checks a
//! grant or a limit needs. They reach into [`HostState`], so they live apart
//! from the capability modules whose types it holds.
//!
//! [`HostState`]: crate::state::HostState

pub(crate) mod dirs;
pub(crate) mod http;
pub(crate) mod tls;
