//! The guest backends as WebAssembly components, built by `build.rs`.
//!
//! `FS`, `MEMORY`, `REDIS` and `S3` are the backends and `ADVISOR` the
//! storage advisor, which kvwasm-host (and so the shim) embeds; `SYNTHETIC`
//! and `TCP` the fabrics, embedded by kvwasm-fabric, and `KV_INDEXER` the
//! event subscriber, by kvwasm-kv-indexer-host. `HOSTILE`, `HOSTILE_FABRIC`, `BUFFERED`,
//! `NAMESPACE_BLIND`, `HOSTILE_ADVISOR` and `HOSTILE_SUBSCRIBER`
//! (tests/guests/) and `VENDOR_STARTER` (examples/vendor-starter) are for
//! tests only.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// The guests no shipped program may embed, with their names: tests check
/// the shim and `kvwasm` against this list.
pub fn tests_only() -> [(&'static str, &'static [u8]); 7] {
    [
        ("test guest hostile", HOSTILE),
        ("test guest hostile-fabric", HOSTILE_FABRIC),
        ("test guest buffered", BUFFERED),
        ("test guest namespace-blind", NAMESPACE_BLIND),
        ("test guest hostile-advisor", HOSTILE_ADVISOR),
        ("test guest hostile-subscriber", HOSTILE_SUBSCRIBER),
        ("vendor starter", VENDOR_STARTER),
    ]
}
