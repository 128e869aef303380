//! The guest backends as WebAssembly components, built by `build.rs`.
//!
//! `FS`, `MEMORY`, `REDIS` and `S3` are the backends the shim embeds, and
//! `SYNTHETIC` and `TCP` the fabrics, `KV_INDEXER` and `ADVISOR` the
//! event subscribers. `HOSTILE`, `HOSTILE_FABRIC`, `BUFFERED`,
//! `NAMESPACE_BLIND`, `HOSTILE_ADVISOR` and `HOSTILE_SUBSCRIBER`
//! (tests/guests/) and `VENDOR_STARTER` (examples/vendor-starter) are for
//! tests only.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));
