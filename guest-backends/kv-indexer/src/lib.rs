//! `builtin:kv-indexer`: Dynamo's standalone KV indexer as an event-service
//! guest. Events arrive through `on-batch`, the indexer's API through
//! `http-api.handle`; both go to one [`Indexer`] (kvwasm-kv-indexer-core),
//! which lives as long as this instance. The host rebuilds a replaced
//! instance by replaying its log (docs/events.md).

use std::cell::RefCell;

use kvwasm_guest_support::events_bindings::exports::kvwasm::events::{http_api, subscriber};
use kvwasm_guest_support::events_bindings::kvwasm::events::{block_hash, types};
use kvwasm_kv_indexer_core::hash::{self, HashRun};
use kvwasm_kv_indexer_core::{Event, EventData, Indexer, Stored};

/// talc instead of std's dlmalloc (measured in docs/benchmarks.md).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

thread_local! {
    static INDEXER: RefCell<Indexer> = RefCell::new(
        Indexer::with_block_hasher(host_hashes)
            .with_token_json_hasher(block_hash::hash_token_json)
            .with_runs_hasher(host_runs)
    );
}

/// Most tokens per `hash-blocks` call: the host's cap
/// (wit/events/events.wit).
const HOST_MAX_TOKENS: usize = 1 << 20;

/// The block hashes from the host (`kvwasm:events/block-hash`: xxh3 in
/// wasm32 is about 10× slower), the full blocks only, in calls of at
/// most [`HOST_MAX_TOKENS`] split at block boundaries.
fn host_hashes(tokens: &[u32], block_size: u32, seed: u64) -> Vec<u64> {
    let size = block_size as usize;
    if size == 0 || size > HOST_MAX_TOKENS {
        return hash::xxh3_blocks(tokens, block_size, seed);
    }
    let full = &tokens[..tokens.len() / size * size];
    if full.len() <= HOST_MAX_TOKENS {
        return block_hash::hash_blocks(full, block_size, seed);
    }
    full.chunks(HOST_MAX_TOKENS / size * size)
        .flat_map(|chunk| block_hash::hash_blocks(chunk, block_size, seed))
        .collect()
}

/// A batch's runs hashed by the host (`hash-runs`): one call per
/// [`HOST_MAX_TOKENS`] tokens of consecutive runs; a run longer than that
/// alone goes through [`host_hashes`].
fn host_runs(tokens: &[u32], runs: &[HashRun]) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / 16);
    let mut group: Vec<block_hash::HashRun> = Vec::new();
    let (mut start, mut end) = (0, 0);
    for run in runs {
        let len = run.tokens as usize;
        if end + len - start > HOST_MAX_TOKENS && !group.is_empty() {
            hashes.extend(block_hash::hash_runs(&tokens[start..end], &group));
            group.clear();
            start = end;
        }
        if len > HOST_MAX_TOKENS {
            hashes.extend(host_hashes(
                &tokens[end..end + len],
                run.block_size,
                run.seed,
            ));
            start = end + len;
        } else {
            group.push(block_hash::HashRun {
                tokens: run.tokens,
                block_size: run.block_size,
                seed: run.seed,
            });
        }
        end += len;
    }
    if !group.is_empty() {
        hashes.extend(block_hash::hash_runs(&tokens[start..end], &group));
    }
    hashes
}

struct KvIndexer;

impl subscriber::Guest for KvIndexer {
    /// Apply the batch; events not applied (unknown parent, wrong block
    /// size, unregistered worker...) are reported as the call's error so
    /// the host logs and counts them. The rest of the batch still applies.
    fn on_batch(events: Vec<types::Event>) -> Result<(), String> {
        let total = events.len();
        let events: Vec<Event> = events.into_iter().map(convert).collect();
        let rejected = INDEXER.with_borrow_mut(|indexer| indexer.ingest(&events));
        match rejected {
            0 => Ok(()),
            n => Err(format!(
                "{n} of {total} events not applied (unknown parent or block, other block \
                 size, or no index for the worker)"
            )),
        }
    }
}

impl http_api::Guest for KvIndexer {
    fn handle(request: http_api::Request) -> http_api::Response {
        let (status, body) = INDEXER.with_borrow_mut(|indexer| {
            indexer.handle(
                &request.method,
                &request.path,
                &request.query,
                &request.body,
            )
        });
        http_api::Response {
            status,
            content_type: None,
            body,
        }
    }
}

/// The WIT record as the core's mirror (the tier and source are not kept).
fn convert(event: types::Event) -> Event {
    let data = match event.data {
        types::EventData::Stored(s) => EventData::Stored(Stored {
            block_hashes: s.block_hashes,
            parent_hash: s.parent_hash,
            token_ids: s.token_ids,
            tokens_hashes: s.tokens_hashes,
            block_size: s.block_size,
            lora_name: s.lora_name,
        }),
        types::EventData::Removed(r) => EventData::Removed(r.block_hashes),
        types::EventData::Cleared => EventData::Cleared,
    };
    Event {
        worker_id: event.worker_id,
        dp_rank: event.dp_rank,
        event_id: event.event_id,
        model: event.model,
        tenant: event.tenant,
        data,
    }
}

kvwasm_guest_support::export_subscriber!(KvIndexer);
