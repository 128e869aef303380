//! The KV indexer of Dynamo's standalone `dynamo-kv-indexer`, as plain Rust
//! with no WIT or WASI dependency: the `kv-indexer` guest wraps it, and the
//! host's benchmark runs it natively as the baseline.
//!
//! * [`hash`]: the local block hashes (xxh3-64, seed 1337, LoRA seeds).
//! * [`tree`]: one radix tree per (model, routing group).
//! * [`Indexer`]: registrations, trees, event ingest ([`Indexer::ingest`])
//!   and the HTTP API as a pure function ([`Indexer::handle`]) with the
//!   JSON shapes and status codes of Dynamo's `dynamo-kv-router` 1.6.1
//!   (interop-facts §4 and §6), plus kvwasm's extensions (`POST /restore`,
//!   filtering by `tenant_id`); docs/events.md lists every difference.

mod fold;
pub mod hash;
mod indexer;
mod query_body;
mod reply;
mod table;
pub mod tree;

pub use indexer::{Counters, Indexer};
pub use kvwasm_indexer_protocol::api::{MAX_QUERY_BLOCKS, MAX_TOKEN_IDS};
pub use query_body::token_array;

/// One normalised event: a plain mirror of the WIT `event` record
/// (`wit/events/events.wit`), so this crate needs no bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub worker_id: u64,
    pub dp_rank: u32,
    pub event_id: u64,
    /// The (model, routing group) the host attributed the event to, used
    /// for a worker the indexer has no registration of.
    pub model: Option<String>,
    pub tenant: Option<String>,
    pub data: EventData,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventData {
    Stored(Stored),
    /// The worker dropped these blocks (engine hashes).
    Removed(Vec<u64>),
    /// The worker's rank dropped everything (that rank only, as in Dynamo).
    Cleared,
}

/// Blocks a worker now holds (the WIT `blocks-stored`; the tier is not
/// kept: one tree holds every tier, as the standalone indexer's does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// The engine's hash of each block.
    pub block_hashes: Vec<u64>,
    /// The engine hash of the block before the first, if any.
    pub parent_hash: Option<u64>,
    /// The blocks' tokens, from which the local hashes are computed.
    pub token_ids: Vec<u32>,
    /// Local hashes already computed (a dump's `tokens_hash`); used
    /// instead of `token_ids` when not empty.
    pub tokens_hashes: Vec<u64>,
    pub block_size: Option<u32>,
    pub lora_name: Option<String>,
}
