//! Dynamo's local block hashes (interop-facts §4): what the radix tree is
//! keyed by, computed the same way on ingest (from an event's token ids)
//! and on `/query` (from the prompt), so the two meet.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The seed of every block hash without a LoRA adapter.
pub const SEED: u64 = 1337;

/// The seed for blocks computed with `lora_name`: [`SEED`] plus the
/// adapter's own hash, so the same tokens under two adapters never match.
/// An empty name is no adapter, as in Dynamo (its `compute_salt_hash`):
/// publishers and clients that send `""` for "none" still meet the base
/// model's blocks.
pub fn seed_for(lora_name: Option<&str>) -> u64 {
    match lora_name {
        Some(name) if !name.is_empty() => SEED.wrapping_add(xxh3_64(name.as_bytes())),
        _ => SEED,
    }
}

/// The seed of a `/query`: [`seed_for`] its adapter, plus the hash of its
/// `cache_salt` when one is given (not empty), as Dynamo 1.6.1's
/// `compute_salt_hash` mixes it (xxh3-64 of the salt with seed 1, so a salt
/// never collides with an adapter of the same name).
pub fn query_seed(lora_name: Option<&str>, cache_salt: Option<&str>) -> u64 {
    match cache_salt {
        Some(salt) if !salt.is_empty() => {
            seed_for(lora_name).wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1))
        }
        _ => seed_for(lora_name),
    }
}

/// The part of a stored event's token ids that its `blocks` engine hashes
/// cover (at most `blocks` full blocks). The indexer pairs local hashes
/// with engine hashes, so hashing further tokens would be work for nothing
/// (one hash per token with a block size of 1): the host's pre-hashing
/// and the indexer's batched hashing take only these.
pub fn paired_tokens(tokens: &[u32], blocks: usize, block_size: u32) -> &[u32] {
    let covered = (blocks as u64).saturating_mul(u64::from(block_size));
    &tokens[..covered.min(tokens.len() as u64) as usize]
}

/// Computes the hashes of the full blocks of `tokens` with `seed`, as
/// [`xxh3_blocks`] does: natively that function itself; in the guest, the
/// host's `kvwasm:events/block-hash` import (xxh3 is slow in wasm32).
pub type BlockHasher = fn(tokens: &[u32], block_size: u32, seed: u64) -> Vec<u64>;

/// A run of tokens in a [`RunsHasher`]'s token buffer: its next `tokens`
/// tokens, hashed as [`xxh3_blocks`] with `block_size` and `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashRun {
    pub tokens: u32,
    pub block_size: u32,
    pub seed: u64,
}

/// The block hashes of several runs of tokens in one call, concatenated
/// in order: [`xxh3_blocks`] of each run. The guest hashes a whole
/// `on-batch` through one host call (`kvwasm:events/block-hash.hash-runs`)
/// instead of a crossing per stored event.
pub type RunsHasher = fn(tokens: &[u32], runs: &[HashRun]) -> Vec<u64>;

/// [`xxh3_blocks`] of each run of `tokens`, concatenated: the pure
/// function behind [`RunsHasher`]. `None` if the runs do not add up to
/// `tokens`.
pub fn xxh3_runs(tokens: &[u32], runs: &[HashRun]) -> Option<Vec<u64>> {
    let mut hashes = Vec::new();
    let mut rest = tokens;
    for run in runs {
        let (run_tokens, after) = rest.split_at_checked(run.tokens as usize)?;
        hashes.extend(xxh3_blocks(run_tokens, run.block_size, run.seed));
        rest = after;
    }
    rest.is_empty().then_some(hashes)
}

/// The hashes of the full blocks of a `/query`'s `token_ids`, given as
/// the array's raw JSON, with `seed`; `Err` unless the input is one array
/// of u32 ([`token_array`](crate::token_array)). Natively
/// [`token_json_blocks`]; in the guest, the host's
/// `kvwasm:events/block-hash.hash-token-json` (the parse runs ~2× faster
/// natively, and it was most of a guest `/query`).
pub type TokenJsonHasher = fn(json: &[u8], block_size: u32, seed: u64) -> Result<Vec<u64>, String>;

/// [`token_array`](crate::token_array), then [`xxh3_blocks`]: the pure
/// function behind [`TokenJsonHasher`].
pub fn token_json_blocks(json: &[u8], block_size: u32, seed: u64) -> Result<Vec<u64>, String> {
    Ok(xxh3_blocks(&crate::token_array(json)?, block_size, seed))
}

/// One hash per FULL block of `block_size` tokens (the tail is ignored):
/// xxh3-64 of the tokens' little-endian u32 bytes. Not chained: the tree's
/// paths carry the prefix structure.
pub fn block_hashes(tokens: &[u32], block_size: u32, lora_name: Option<&str>) -> Vec<u64> {
    xxh3_blocks(tokens, block_size, seed_for(lora_name))
}

/// [`block_hashes`] with the seed given: the pure function behind
/// [`BlockHasher`].
pub fn xxh3_blocks(tokens: &[u32], block_size: u32, seed: u64) -> Vec<u64> {
    let Some(size) = usize::try_from(block_size).ok().filter(|&s| s > 0) else {
        return Vec::new();
    };
    let mut bytes = Vec::with_capacity(size * 4);
    tokens
        .chunks_exact(size)
        .map(|block| {
            bytes.clear();
            block
                .iter()
                .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
            xxh3_64_with_seed(&bytes, seed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_vector() {
        let tokens: Vec<u32> = (0..=31).collect();
        assert_eq!(
            block_hashes(&tokens, 16, None),
            [15310707395893867146, 15292316782987903195]
        );
    }

    #[test]
    fn only_the_tokens_of_the_engine_blocks_are_paired() {
        let tokens: Vec<u32> = (0..100).collect();
        assert_eq!(paired_tokens(&tokens, 2, 16), &tokens[..32]);
        assert_eq!(
            paired_tokens(&tokens, 9, 16),
            &tokens[..],
            "fewer tokens than blocks"
        );
        assert!(paired_tokens(&tokens, 0, 16).is_empty());
        assert_eq!(paired_tokens(&tokens, 3, 1), &tokens[..3]);
        assert_eq!(paired_tokens(&tokens, usize::MAX, u32::MAX), &tokens[..]);
    }

    #[test]
    fn partial_tail_is_ignored() {
        let tokens: Vec<u32> = (0..=40).collect();
        assert_eq!(block_hashes(&tokens, 16, None).len(), 2);
        assert_eq!(
            block_hashes(&tokens, 16, None),
            block_hashes(&tokens[..32], 16, None)
        );
        assert!(block_hashes(&tokens[..15], 16, None).is_empty());
        assert!(block_hashes(&tokens, 0, None).is_empty());
    }

    #[test]
    fn a_cache_salt_is_mixed_into_the_query_seed() {
        let salt = 1337u64.wrapping_add(xxh3_64_with_seed(b"s", 1));
        assert_eq!(query_seed(None, Some("s")), salt);
        assert_eq!(
            query_seed(Some("a"), Some("s")),
            seed_for(Some("a")).wrapping_add(xxh3_64_with_seed(b"s", 1))
        );
        assert_eq!(query_seed(Some(""), Some("")), 1337, "empty is absent");
        assert_ne!(query_seed(None, Some("a")), query_seed(Some("a"), None));
    }

    #[test]
    fn lora_seed_is_1337_plus_the_adapter_hash() {
        let name = "my-adapter";
        let expected = 1337u64.wrapping_add(xxh3_64_with_seed(name.as_bytes(), 0));
        assert_eq!(seed_for(Some(name)), expected);
        assert_eq!(seed_for(None), 1337);
        assert_eq!(seed_for(Some("")), 1337, "an empty name is no adapter");
        let tokens: Vec<u32> = (0..16).collect();
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            block_hashes(&tokens, 16, Some(name)),
            [xxh3_64_with_seed(&bytes, expected)]
        );
        assert_ne!(
            block_hashes(&tokens, 16, Some(name)),
            block_hashes(&tokens, 16, None)
        );
        assert_ne!(
            block_hashes(&tokens, 16, Some(name)),
            block_hashes(&tokens, 16, Some("other"))
        );
    }
}
