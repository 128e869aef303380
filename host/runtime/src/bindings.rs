//! Host bindings for `wit/kv-store.wit`.
//!
//! WASI types are shared with wasmtime-wasi so a guest's
//! `wasi:filesystem` descriptor can be handed to `payload-io` and its
//! `wasi:io` input streams to `payload-streams`, and the
//! `payload` resource is backed by [`crate::payload::Payload`]. The
//! conversion of a guest's error into a [`KvError`] lives here, so that
//! `error` depends on nothing.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "kvwasm:kv-store/host-imports",
    with: {
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:filesystem": wasmtime_wasi::p2::bindings::filesystem,
        "kvwasm:kv-store/types.payload": crate::payload::Payload,
    },
    // kvwasm's own imports never wait, so they stay synchronous, but for
    // `read-exact` and `write-all`, which wait for the stream like a WASI
    // pollable; calls into the guest are futures (see `crate::deadline`).
    imports: {
        "kvwasm:kv-store/payload-streams.read-exact": async | trappable,
        "kvwasm:kv-store/payload-streams.write-all": async | trappable,
        default: trappable,
    },
    exports: { default: async },
    require_store_data_send: true,
});

pub use exports::kvwasm::kv_store::store::{BackendInfo, PutOutcome};

use crate::error::KvError;
use crate::log_limit::bounded;
use kvwasm::kv_store::types::Error as GuestError;

impl From<GuestError> for KvError {
    /// A guest's error, its message cut to a bounded length: the guest
    /// chooses it, and it ends up in the consumer's log.
    fn from(e: GuestError) -> KvError {
        match e {
            GuestError::NotFound => KvError::NotFound,
            GuestError::InvalidArgument(m) => KvError::InvalidArgument(bounded(m)),
            GuestError::Denied(m) => KvError::Denied(bounded(m)),
            GuestError::Io(m) => KvError::Io(bounded(m)),
            GuestError::Unavailable(m) => KvError::Unavailable(bounded(m)),
            GuestError::Other(m) => KvError::Other(bounded(m)),
        }
    }
}

/// Any backend's exports, typed. (The generated name comes from the WIT
/// world used to generate the host side; every backend world exports the
/// same `store` interface, so this serves them all.)
pub(crate) type BackendExports = HostImports;
/// [`BackendExports`] pre-linked against the host, ready to instantiate.
pub(crate) type BackendExportsPre<T> = HostImportsPre<T>;

/// Host bindings for `wit/fabric` (`kvwasm:fabric/fabric`): the exports of
/// a fabric guest. Its one import, the `payload` resource, is the kv-store
/// one above, so both guest kinds share one linker.
pub(crate) mod fabric {
    wasmtime::component::bindgen!({
        path: ["../../wit", "../../wit/fabric"],
        world: "kvwasm:fabric/fabric",
        with: {
            "kvwasm:kv-store/types": crate::bindings::kvwasm::kv_store::types,
        },
        exports: { default: async },
        require_store_data_send: true,
    });
}

/// Host bindings for `wit/events` (`kvwasm:events`): what an event
/// subscriber exports. Generated for the `event-service` world; a guest of
/// the narrower `event-subscriber` world is served through the per-interface
/// indices, without `http-api`.
pub(crate) mod events {
    wasmtime::component::bindgen!({
        path: ["../../wit/events"],
        world: "kvwasm:events/event-service",
        imports: {
            "kvwasm:events/block-hash.hash-blocks": trappable,
            "kvwasm:events/block-hash.hash-runs": trappable,
        },
        exports: { default: async },
        require_store_data_send: true,
    });
}

/// Host bindings for the `storage-advisor-moves` world of `wit/events`:
/// what a storage advisor exports besides `subscriber`
/// (`crate::tiering::advisor`); `advisor-moves` is optional (advisors built
/// against the `storage-advisor` world of 0.1.0 do not export it).
pub(crate) mod advisor {
    wasmtime::component::bindgen!({
        path: ["../../wit/events"],
        world: "kvwasm:events/storage-advisor-moves",
        exports: { default: async },
        require_store_data_send: true,
    });
}
