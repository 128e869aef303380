//! Capability policy: what a guest may reach, one module per capability.
//!
//! A guest gets exactly the grants of its backend entry and nothing else:
//!
//! * [`dirs`] — host directories at guest paths, read-only or read-write;
//! * [`net`] — TCP peers by `host:port`, and name lookups only if granted;
//! * [`http`] — outbound `wasi:http` requests to listed origins;
//! * [`env`] — environment variables passed through by name;
//! * [`settings`] — the backend's settings table, read through `wasi:config`;
//! * [`tls`] — TLS to remote stores, done by the host with the operator's roots;
//! * [`descriptors`] — the process's file descriptors, kept for the consumer.
//!
//! Everything else is off: no arguments, no stdin, no UDP, no other
//! variables or paths. The guest's stdout goes nowhere; its stderr goes to
//! the host log at debug level (see `guest_log`). What every guest does get
//! from WASI: clocks and random numbers.

pub mod descriptors;
pub mod dirs;
pub(crate) mod durable;
pub mod env;
pub mod http;
pub(crate) mod in_place;
pub mod net;
pub mod settings;
pub(crate) mod store_dirs;
pub mod tls;

use std::sync::Arc;

use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};

pub use dirs::{DATA_DIR, DirGrant};
pub use env::EnvGrant;
pub use http::HttpGrant;
pub use net::NetGrant;
pub use settings::SettingsGrant;
pub use tls::TlsGrant;

use crate::guest_log::GuestStderr;
use crate::metrics::BackendMetrics;

/// The capabilities granted to one backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    pub dirs: Vec<DirGrant>,
    /// Whether guests may list directories (see `guards::dirs::add_to_linker`).
    pub list_dirs: bool,
    pub net: NetGrant,
    /// Shared with every instance's request hook.
    pub http: Arc<HttpGrant>,
    pub env: EnvGrant,
    /// Shared with every instance's `wasi:config` store.
    pub settings: Arc<SettingsGrant>,
    /// `wasi:tls` handshakes and https requests, with these roots; none
    /// without a `tls` entry.
    pub tls: Option<Arc<TlsGrant>>,
}

impl Grants {
    /// Build the WASI context for one instance. Denials are counted in
    /// `metrics`.
    pub(crate) fn wasi_ctx(
        &self,
        stderr: GuestStderr,
        metrics: &Arc<BackendMetrics>,
    ) -> wasmtime::Result<WasiCtx> {
        let mut builder = WasiCtxBuilder::new();
        builder.stderr(stderr);
        // Must come before any preopen: each preopen captures it. Without it
        // every file operation hops to a thread pool, which dominates the
        // cost of a small call. kvwasm's own `open-at` relies on it too.
        builder.allow_blocking_current_thread(true);
        self.net.apply(&mut builder, metrics);
        self.env.apply(&mut builder);
        for dir in &self.dirs {
            dir.apply(&mut builder)?;
        }
        Ok(builder.build())
    }

    /// The `wasi:tls` context for one instance.
    pub(crate) fn tls_ctx(
        &self,
        backend: &str,
        metrics: &Arc<BackendMetrics>,
    ) -> wasmtime_wasi_tls::WasiTlsCtx {
        wasmtime_wasi_tls::WasiTlsCtxBuilder::new()
            .provider(Box::new(tls::HostTls {
                grant: self.tls.clone(),
                metrics: metrics.clone(),
                backend: backend.into(),
            }))
            .build()
    }
}
