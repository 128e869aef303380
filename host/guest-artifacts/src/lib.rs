//! The guest backends as WebAssembly components, built by `build.rs`.
//!
//! `FS` and `MEMORY` are the backends the shim embeds; the test-only guests
//! exist with the `test-guests` feature.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));
