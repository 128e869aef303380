//! The kvwasm host: runs `kv_store_v1` storage backends as sandboxed
//! WebAssembly components under wasmtime.
//!
//! [`open`] turns a `wasm://` URI into a [`StoreHandle`] whose methods are
//! the kv_store_v1 operations. Layers, bottom up:
//!
//! * [`engine`] — the one wasmtime engine per process and its epoch clock;
//! * [`deadline`] — one deadline per operation, held whatever the guest does;
//! * `io` — the event loops behind guests' sockets, timers and HTTP;
//! * [`artifact_cache`] — precompiled components on disk;
//! * [`component`] — compiled, pre-linked components shared in the process;
//! * [`extension`] — what the crates running fabrics and subscribers add:
//!   their builtins, their host imports, the token hashing;
//! * [`capabilities`] and [`limits`] — what a guest may reach and use;
//! * [`metrics`] — per-backend counters, served as Prometheus text;
//! * [`log_limit`] — guest-supplied text and repeated warnings, bounded;
//! * `payload` — host-owned buffers that carry bytes without copying;
//! * `sandbox` — the store and call rules every guest kind shares;
//! * `single` — guests that keep one instance (fabrics, subscribers);
//! * `instance` — one kv-store instance and typed, deadline-bound calls;
//! * [`fabric`] — fabric guests: MRDN frames, verified by the host;
//! * [`subscriber`] — event subscriber guests, fed by `kvwasm serve`;
//! * [`tiering`] — backends composed as tiers, moved on a guest's advice;
//! * [`events_out`] — a backend's kv_store traffic, published as KV events;
//! * [`handle`] — an open store: a pool of instances, safe from many threads;
//! * [`config_file`], [`config`] and [`uri`] — how operators and consumers
//!   name backends: the file's tables, their checks and the guests they build.

pub mod artifact_cache;
pub mod backend;
pub mod backoff;
mod bindings;
mod block_hash_refusal;
pub mod capabilities;
pub mod component;
pub mod config;
pub mod config_file;
pub mod deadline;
pub mod engine;
mod error;
pub mod events_out;
pub mod extension;
pub mod fabric;
mod guards;
mod guest_kind;
mod guest_log;
pub mod handle;
mod instance;
mod io;
pub mod known_chunks;
pub mod limits;
pub mod log_limit;
pub mod metrics;
mod payload;
mod sandbox;
mod single;
mod state;
pub mod subscriber;
pub mod tiering;
pub mod uri;

use std::sync::Arc;

pub use backend::Backend;
pub use bindings::BackendInfo;
pub use error::KvError;
pub use handle::StoreHandle;
pub use payload::MallocBuffer;
pub use payload::target::ChunkInto;

/// One-time setup, done when a consumer loads the library
/// (`kv_store_get_vtable`) instead of inside its first open: the
/// descriptor table grown ([`capabilities::descriptors::reserve_table`]),
/// the engine built, the config file (if one is found) parsed, and the
/// builtin components its backends name loaded from the artifact cache
/// (`builtin:fs` when there is no config: `wasm:///dir` uses it).
///
/// Nothing here starts a thread or compiles: a consumer may load the
/// library from a constructor (under the loader's lock) or fork after
/// loading it, and the child's threads are its own. A builtin that is not
/// in the cache yet, and every vendor file, is left to its first open;
/// errors too. Measured in docs/benchmarks.md, "Performance at scale".
pub fn prepare() {
    capabilities::descriptors::reserve_table();
    engine::engine();
    let builtins: Vec<component::ComponentSource> = match config::locate() {
        Ok(path) => match config::cached_config(&path) {
            Ok(config) => config
                .backends
                .values()
                .filter(|spec| spec.metering() == engine::Metering::Off)
                .filter_map(|spec| spec.source().ok())
                .filter(|source| matches!(source, component::ComponentSource::Builtin(_)))
                .collect(),
            Err(_) => Vec::new(),
        },
        Err(_) => vec![component::ComponentSource::Builtin(component::Builtin::Fs)],
    };
    for source in builtins {
        let _ = component::LoadedComponent::load_if_cached(&source);
    }
}

/// Open the store a `wasm://` URI names (see [`uri`] and
/// [`handle::open_shared`]).
pub fn open(uri: &str) -> Result<Arc<StoreHandle>, KvError> {
    metrics::serve_from_env();
    match uri::parse(uri).map_err(KvError::BadInput)? {
        uri::Target::EmbeddedFs(dir) => {
            let backend = config::Config::embedded_fs(&dir).map_err(KvError::Host)?;
            handle::open_shared(Arc::new(backend), "")
        }
        uri::Target::Named { backend, namespace } => {
            let hint = |e: String| KvError::Host(e + &uri::directory_hint(&backend, &namespace));
            let path = config::locate().map_err(hint)?;
            if tiering::is_tiered(&path, &backend).map_err(hint)? {
                return tiering::open_tiered(&path, &backend, &namespace);
            }
            let backend = config::cached_backend(&path, &backend).map_err(hint)?;
            handle::open_shared(backend, &namespace)
        }
    }
}
