//! The KV indexer's host side: what `kvwasm` adds to kvwasm-host to run
//! `builtin:kv-indexer` and subscribers like it, and what
//! `libkv_store_wasm.so` therefore does not link
//! (docs/architecture.md, "What the shim carries"):
//!
//! * `builtin:kv-indexer`'s component, `prehash_tokens` on by default;
//! * [`block_hash`]: the `kvwasm:events/block-hash` import, Dynamo's block
//!   hashes computed natively (the shim links a refusal in its place);
//! * [`prehash`]: the token hashing behind `prehash_tokens`.
//!
//! A program that starts event subscribers calls [`install`] first
//! (`kvwasm serve`'s crate does, from [`kvwasm_host::config::Config`]'s
//! callers; `kvwasm` at start).

mod block_hash;
mod prehash;

use kvwasm_host::extension::{Extension, LinkedBuiltin};

/// The builtins of this crate.
pub static BUILTINS: [LinkedBuiltin; 1] = [LinkedBuiltin::new(
    "kv-indexer",
    kvwasm_guest_artifacts::KV_INDEXER,
    true,
)];

/// What [`install`] adds to kvwasm-host.
pub static EXTENSION: Extension = Extension {
    name: "kvwasm-kv-indexer-host",
    builtins: &BUILTINS,
    host_imports: Some(block_hash::add_to_linker),
    token_hasher: Some(prehash::prehash_tokens),
};

/// Make `builtin:kv-indexer`, the block-hash import and `prehash_tokens`
/// available to this process's guests. Idempotent; call it before loading
/// a subscriber.
pub fn install() {
    kvwasm_host::extension::install(&EXTENSION);
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// kvwasm-host names these builtins where this crate is not installed
    /// (so `builtin:kv-indexer` through the shim reads "not linked").
    #[test]
    fn every_builtin_here_is_listed_among_the_shipped_ones() {
        for builtin in &super::BUILTINS {
            assert!(
                kvwasm_host::extension::SHIPPED_BUILTINS
                    .contains(&(builtin.name, super::EXTENSION.name)),
                "builtin:{} is missing from SHIPPED_BUILTINS",
                builtin.name
            );
        }
    }

    use kvwasm_host::config::Config;

    #[test]
    fn token_prehashing_is_on_for_the_kv_indexer_unless_configured() {
        super::install();
        let config = Config::parse(
            "[subscribers.default]\ncomponent = \"builtin:kv-indexer\"\n\
             [subscribers.off]\ncomponent = \"builtin:kv-indexer\"\nprehash_tokens = false\n\
             [subscribers.advisor]\ncomponent = \"builtin:advisor\"\n\
             [subscribers.on]\ncomponent = \"builtin:advisor\"\nprehash_tokens = true\n",
            Path::new("/tmp"),
        )
        .unwrap();
        let prehash = |name| config.subscriber(name).unwrap().prehash_tokens;
        assert!(prehash("default"));
        assert!(!prehash("off"));
        assert!(!prehash("advisor"));
        assert!(prehash("on"));
    }
}
