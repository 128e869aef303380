//! `prehash_tokens`: stored events' token ids hashed by the host before a
//! subscriber sees them (docs/events.md, "Token ids hashed before
//! delivery"), with the KV indexer's own hashing.

use kvwasm_host::subscriber::{Event, EventData};
use kvwasm_kv_indexer_core::hash;

/// Replace each stored event's `token-ids` by their Dynamo block hashes
/// in `tokens-hashes`, where the KV indexer would compute exactly those
/// (its `prehashable`): a non-zero block size, token ids and no
/// publisher hashes. Only the tokens the event's engine hashes cover are
/// hashed ([`hash::paired_tokens`], as the indexer does), so the work is
/// bounded by the event's own size. A store that yields no full
/// block keeps its tokens: no hashes and no tokens would mean "use the
/// engine hashes" instead.
pub(crate) fn prehash_tokens(events: &mut [Event]) {
    for event in events {
        let EventData::Stored(stored) = &mut event.data else {
            continue;
        };
        let Some(block_size) = stored.block_size.filter(|&size| size != 0) else {
            continue;
        };
        if !stored.tokens_hashes.is_empty() || stored.token_ids.is_empty() {
            continue;
        }
        let paired = hash::paired_tokens(&stored.token_ids, stored.block_hashes.len(), block_size);
        let seed = hash::seed_for(stored.lora_name.as_deref());
        let hashes = hash::xxh3_blocks(paired, block_size, seed);
        if !hashes.is_empty() {
            stored.tokens_hashes = hashes;
            stored.token_ids = Vec::new();
        }
    }
}
