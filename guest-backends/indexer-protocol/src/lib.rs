//! What `kvwasm serve` (the host) and the KV indexer guest both speak,
//! written once and compiled for both targets (serde only, no WIT):
//!
//! * [`api`]: the bodies of the indexer's HTTP API (Dynamo's
//!   `dynamo-kv-router` 1.6.1, plus kvwasm's extensions): the guest
//!   answers them, the host reads `/register` and `/unregister` to start
//!   and stop sources, and writes `/register` for `[[serve.workers]]`;
//! * [`dump`]: Dynamo's `RouterEvent` and the `/dump` document made of
//!   them: the guest writes and restores dumps, the host reads their keys
//!   and decodes RouterEvents arriving on NATS;
//! * `vllm` (feature `vllm`, host only): vLLM's msgpack KV event batches,
//!   decoded by the host's ZMQ sources and encoded by `publish_events`.
//!
//! The shapes follow what real publishers and Dynamo send
//! (docs/events.md, "Formats accepted"); each module's tests hold the
//! variants they send.

pub mod api;
pub mod dump;
#[cfg(feature = "vllm")]
pub mod vllm;
