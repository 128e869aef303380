//! Host bindings for `wit/kv-store.wit`.
//!
//! WASI types are shared with wasmtime-wasi so a guest's
//! `wasi:filesystem` descriptor can be handed to `payload-io`, and the
//! `payload` resource is backed by [`crate::payload::Payload`].

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "kvwasm:kv-store/filesystem-backend",
    with: {
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:filesystem": wasmtime_wasi::p2::bindings::filesystem,
        "kvwasm:kv-store/types.payload": crate::payload::Payload,
    },
    imports: { default: trappable },
    require_store_data_send: true,
});

pub use exports::kvwasm::kv_store::store::{BackendInfo, PutOutcome};
