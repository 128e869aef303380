//! `kvwasm:events/block-hash`: Dynamo's local block hashes (xxh3-64 per
//! full block of u32 tokens) for subscriber guests. xxh3 runs about 10×
//! slower inside wasm32 (no 64×64→128-bit multiply), and the KV indexer
//! hashes every stored block and every prompt. A pure function of its
//! arguments: it reads nothing and grants nothing, so it needs no state of
//! the instance ([`BlockHasher`]). Installed over kvwasm-host's refusal of
//! the same functions ([`crate::EXTENSION`]).

use kvwasm_host::extension::HostState;
use kvwasm_kv_indexer_core::hash::{HashRun, token_json_blocks, xxh3_blocks, xxh3_runs};
use wasmtime::component::{HasData, Linker};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/events",
        inline: "
            package kvwasm:kv-indexer-host;
            world block-hash-import {
                import kvwasm:events/block-hash@0.1.1;
            }
        ",
        imports: {
            "kvwasm:events/block-hash.hash-blocks": trappable,
            "kvwasm:events/block-hash.hash-runs": trappable,
        },
    });
}

use bindings::kvwasm::events::block_hash;

/// Most tokens per call. The list is already bounded by the guest's memory
/// when it arrives; the cap also bounds the host's own output allocation
/// (at most 2× the input) per call. `kvwasm-kv-indexer` splits longer
/// lists (its `HOST_MAX_TOKENS`).
pub(crate) const MAX_TOKENS: usize = 1 << 20;

/// Most bytes per `hash-token-json` call: the longest array of
/// [`MAX_TOKENS`] tokens takes ~11 MiB; the cap bounds the parse per call.
/// A longer input is an error (the guest answers through its own parser).
const MAX_JSON: usize = 16 << 20;

/// Link the block-hash functions (a [`kvwasm_host::extension::AddHostImports`]).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    block_hash::add_to_linker::<_, BlockHasher>(linker, |_| BlockHasher)
}

/// The host side of `block-hash`: no state, as the functions read none.
struct BlockHasher;

impl HasData for BlockHasher {
    type Data<'a> = BlockHasher;
}

impl block_hash::Host for BlockHasher {
    fn hash_blocks(
        &mut self,
        tokens: Vec<u32>,
        block_size: u32,
        seed: u64,
    ) -> wasmtime::Result<Vec<u64>> {
        hash_blocks(&tokens, block_size, seed)
    }

    fn hash_runs(
        &mut self,
        tokens: Vec<u32>,
        runs: Vec<block_hash::HashRun>,
    ) -> wasmtime::Result<Vec<u64>> {
        let runs: Vec<HashRun> = runs
            .into_iter()
            .map(|r| HashRun {
                tokens: r.tokens,
                block_size: r.block_size,
                seed: r.seed,
            })
            .collect();
        hash_runs(&tokens, &runs)
    }

    fn hash_token_json(
        &mut self,
        json: Vec<u8>,
        block_size: u32,
        seed: u64,
    ) -> Result<Vec<u64>, String> {
        hash_token_json(&json, block_size, seed)
    }
}

/// The hashes of each run, or a trap for more than [`MAX_TOKENS`] tokens
/// or runs that do not add up to them.
fn hash_runs(tokens: &[u32], runs: &[HashRun]) -> wasmtime::Result<Vec<u64>> {
    // Empty runs add up too: their number is capped like the tokens'.
    if runs.len() > MAX_TOKENS {
        wasmtime::bail!(
            "block-hash: {} runs in one call, more than {MAX_TOKENS}",
            runs.len()
        );
    }
    if tokens.len() > MAX_TOKENS {
        wasmtime::bail!(
            "block-hash: {} tokens in one call, more than {MAX_TOKENS}",
            tokens.len()
        );
    }
    xxh3_runs(tokens, runs)
        .ok_or_else(|| wasmtime::format_err!("block-hash: runs do not add up to the tokens"))
}

/// The hashes of the tokens of a JSON array, or why it is not one of at
/// most [`MAX_TOKENS`] u32 in at most [`MAX_JSON`] bytes.
fn hash_token_json(json: &[u8], block_size: u32, seed: u64) -> Result<Vec<u64>, String> {
    if json.len() > MAX_JSON {
        return Err(format!("{} bytes, more than {MAX_JSON}", json.len()));
    }
    token_json_blocks(json, block_size, seed)
}

/// The hashes, or a trap for a list over [`MAX_TOKENS`].
fn hash_blocks(tokens: &[u32], block_size: u32, seed: u64) -> wasmtime::Result<Vec<u64>> {
    if tokens.len() > MAX_TOKENS {
        wasmtime::bail!(
            "block-hash: {} tokens in one call, more than {MAX_TOKENS}",
            tokens.len()
        );
    }
    Ok(xxh3_blocks(tokens, block_size, seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// interop-facts §4's vector: tokens 0..=31, block size 16, seed 1337.
    #[test]
    fn matches_the_published_vector() {
        let tokens: Vec<u32> = (0..=31).collect();
        assert_eq!(
            hash_blocks(&tokens, 16, 1337).unwrap(),
            [15310707395893867146, 15292316782987903195]
        );
    }

    #[test]
    fn full_blocks_only_and_zero_block_size() {
        let tokens: Vec<u32> = (0..=40).collect();
        assert_eq!(hash_blocks(&tokens, 16, 1337).unwrap().len(), 2);
        assert!(hash_blocks(&tokens[..15], 16, 1337).unwrap().is_empty());
        assert!(hash_blocks(&tokens, 0, 1337).unwrap().is_empty());
        assert_ne!(
            hash_blocks(&tokens, 16, 1).unwrap(),
            hash_blocks(&tokens, 16, 1337).unwrap()
        );
    }

    #[test]
    fn runs_hash_like_one_call_each_and_must_add_up() {
        let tokens: Vec<u32> = (0..=40).collect();
        let run = |tokens, block_size, seed| HashRun {
            tokens,
            block_size,
            seed,
        };
        let mut expected = hash_blocks(&tokens[..32], 16, 1337).unwrap();
        expected.extend(hash_blocks(&tokens[32..], 4, 9).unwrap());
        assert_eq!(expected[..2], [15310707395893867146, 15292316782987903195]);
        assert_eq!(expected.len(), 4);
        let runs = [run(32, 16, 1337), run(0, 16, 1), run(9, 4, 9)];
        assert_eq!(hash_runs(&tokens, &runs).unwrap(), expected);
        assert!(hash_runs(&tokens, &runs[..2]).is_err());
        assert!(hash_runs(&tokens[..40], &runs).is_err());
        let over = vec![0u32; MAX_TOKENS + 1];
        let whole = u32::try_from(over.len()).unwrap();
        assert!(hash_runs(&over, &[run(whole, 16, 1)]).is_err());
        let empty_runs = vec![run(0, 16, 1); MAX_TOKENS + 1];
        assert!(hash_runs(&[], &empty_runs).is_err());
        assert_eq!(
            hash_runs(&over[1..], &[run(whole - 1, 16, 1)])
                .unwrap()
                .len(),
            MAX_TOKENS / 16
        );
    }

    #[test]
    fn token_json_matches_the_vector_and_refuses_what_is_not_u32s() {
        let json = format!("{:?}", (0..=31).collect::<Vec<u32>>()).into_bytes();
        assert_eq!(
            hash_token_json(&json, 16, 1337).unwrap(),
            [15310707395893867146, 15292316782987903195]
        );
        assert!(hash_token_json(b" [ ] ", 16, 1337).unwrap().is_empty());
        for bad in [
            &b"[1, 2"[..],
            b"[1, -2]",
            b"[1.0]",
            b"[4294967296]",
            b"[1] [2]",
            b"{}",
            b"",
        ] {
            assert!(hash_token_json(bad, 16, 1337).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn token_json_refuses_more_than_the_caps() {
        let at_cap = format!("{:?}", vec![0u32; MAX_TOKENS]).into_bytes();
        assert_eq!(
            hash_token_json(&at_cap, 16, 1337).unwrap().len(),
            MAX_TOKENS / 16
        );
        let over = format!("{:?}", vec![0u32; MAX_TOKENS + 1]).into_bytes();
        assert!(hash_token_json(&over, 16, 1337).is_err());
        let mut spaced = vec![b' '; MAX_JSON + 1];
        spaced[..2].copy_from_slice(b"[]");
        assert!(hash_token_json(&spaced, 16, 1337).is_err());
        assert!(hash_token_json(&spaced[..MAX_JSON], 16, 1337).is_ok());
    }

    #[test]
    fn refuses_more_than_the_cap() {
        let at_cap = vec![0u32; MAX_TOKENS];
        assert_eq!(
            hash_blocks(&at_cap, 16, 1337).unwrap().len(),
            MAX_TOKENS / 16
        );
        let over = vec![0u32; MAX_TOKENS + 1];
        assert!(hash_blocks(&over, 16, 1337).is_err());
    }
}
