//! `kvwasm:events/block-hash` where the program does not link the host's
//! block hashing: every call refused, with the reason.
//!
//! The event subscriber worlds (the storage advisor's included) import
//! `block-hash`, so a component built against them may import it even if
//! it never calls it. Linking this refusal keeps such a component loadable
//! where the hashing is not linked (a storage advisor in
//! `libkv_store_wasm.so`); a call traps with the reason, or, for
//! `hash-token-json`, answers an error the KV indexer falls back from.
//! `kvwasm-kv-indexer-host` replaces these definitions with the real ones
//! ([`crate::extension`]).

use wasmtime::component::{HasSelf, Linker};

use crate::bindings::events::kvwasm::events::block_hash;
use crate::state::HostState;

/// Why the call is refused.
const NOT_LINKED: &str = "kvwasm:events/block-hash is not linked into this program: a \
    kv_store_v1 library (libkv_store_wasm.so) runs no event subscriber but a tiered store's \
    advisor, and hashes no blocks; `kvwasm serve` does";

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    block_hash::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

impl block_hash::Host for HostState {
    fn hash_blocks(&mut self, _: Vec<u32>, _: u32, _: u64) -> wasmtime::Result<Vec<u64>> {
        Err(refused(self))
    }

    fn hash_runs(
        &mut self,
        _: Vec<u32>,
        _: Vec<block_hash::HashRun>,
    ) -> wasmtime::Result<Vec<u64>> {
        Err(refused(self))
    }

    fn hash_token_json(&mut self, _: Vec<u8>, _: u32, _: u64) -> Result<Vec<u64>, String> {
        Err(refused(self).to_string())
    }
}

/// The refusal, logged at most once per guest and interval
/// ([`crate::log_limit::warn`]).
fn refused(state: &HostState) -> wasmtime::Error {
    let backend = &*state.backend;
    crate::log_limit::warn(
        ("block-hash refused", backend),
        format_args!("{backend}: {NOT_LINKED}"),
    );
    wasmtime::format_err!("{NOT_LINKED}")
}
