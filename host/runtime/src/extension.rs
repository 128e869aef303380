//! What the crates that run the other guest kinds add to this host.
//!
//! `kvwasm-host` embeds only the guests a `kv_store_v1` consumer can run:
//! the kv-store backends and the storage advisor a tiered store consults
//! ([`crate::component::Builtin`]). A fabric or an event subscriber runs in
//! `kvwasm` and its crates (`kvwasm-fabric`, `kvwasm-kv-indexer-host`), and
//! those crates bring what their guests need: their builtin components, the
//! host imports only their guests call (the KV indexer's
//! `kvwasm:events/block-hash`) and the host's token hashing
//! (`prehash_tokens`). Each installs an [`Extension`] before it starts a
//! guest.
//!
//! Built this way (not with Cargo features, which a workspace build unifies),
//! `libkv_store_wasm.so` cannot link them: the shim depends on none of those
//! crates, so naming `builtin:tcp` through it fails at open with a reason
//! ([`crate::component`]), whatever else the build contains.

use std::sync::{Mutex, OnceLock};

use wasmtime::component::Linker;

pub use crate::bindings::events::kvwasm::events::types::Event;
pub use crate::state::HostState;

/// The builtins of the extensions kvwasm ships, by name, with the extension
/// that carries each: so a program that has not installed one tells it
/// from a misspelled name. Each extension's crate tests that its builtins
/// are listed here.
pub const SHIPPED_BUILTINS: [(&str, &str); 3] = [
    ("synthetic", "kvwasm-fabric"),
    ("tcp", "kvwasm-fabric"),
    ("kv-indexer", "kvwasm-kv-indexer-host"),
];

/// A builtin component that a crate above this one embeds: configured as
/// `builtin:<name>`, like the host's own.
#[derive(Debug)]
pub struct LinkedBuiltin {
    /// The name in configs, without `builtin:`.
    pub name: &'static str,
    /// The component's bytes.
    pub bytes: &'static [u8],
    /// Whether `prehash_tokens` is on unless the config says otherwise
    /// (the KV indexer's default: see [`crate::subscriber`]).
    pub prehash_tokens: bool,
    /// BLAKE3 of `bytes`, computed on first load.
    hash: OnceLock<blake3::Hash>,
}

impl LinkedBuiltin {
    /// A builtin `builtin:<name>` with these bytes.
    pub const fn new(name: &'static str, bytes: &'static [u8], prehash_tokens: bool) -> Self {
        LinkedBuiltin {
            name,
            bytes,
            prehash_tokens,
            hash: OnceLock::new(),
        }
    }

    /// BLAKE3 of the bytes, computed once per process: loads look
    /// components up by it.
    pub(crate) fn hash(&self) -> blake3::Hash {
        *self.hash.get_or_init(|| blake3::hash(self.bytes))
    }
}

/// Adds host imports to the linker every guest is linked against.
pub type AddHostImports = fn(&mut Linker<HostState>) -> wasmtime::Result<()>;

/// Rewrites stored events' token ids into their block hashes before a
/// subscriber sees them (`prehash_tokens`).
pub type TokenHasher = fn(&mut [Event]);

/// What one crate adds: all of it optional.
#[derive(Debug)]
pub struct Extension {
    /// The crate, for logs.
    pub name: &'static str,
    /// Its builtin components.
    pub builtins: &'static [LinkedBuiltin],
    /// Host imports its guests need. They replace the host's own
    /// definitions of the same functions (the block-hash refusal).
    pub host_imports: Option<AddHostImports>,
    /// The token hashing behind `prehash_tokens`.
    pub token_hasher: Option<TokenHasher>,
}

static INSTALLED: Mutex<Vec<&'static Extension>> = Mutex::new(Vec::new());

/// Make `extension`'s builtins loadable and its imports linked in this
/// process. Idempotent. An instance made before keeps the linking it had;
/// every later load of a component, one loaded before included, is linked
/// with the extension.
pub fn install(extension: &'static Extension) {
    let mut installed = INSTALLED.lock().unwrap();
    if !installed.iter().any(|e| e.name == extension.name) {
        tracing::debug!(extension = extension.name, "host extension installed");
        installed.push(extension);
    }
}

/// The extensions installed so far, in order.
pub(crate) fn installed() -> Vec<&'static Extension> {
    INSTALLED.lock().unwrap().clone()
}

/// The installed builtin called `name`.
pub(crate) fn linked_builtin(name: &str) -> Option<&'static LinkedBuiltin> {
    installed()
        .into_iter()
        .flat_map(|e| e.builtins)
        .find(|b| b.name == name)
}

/// Every installed builtin.
pub(crate) fn linked_builtins() -> Vec<&'static LinkedBuiltin> {
    installed().into_iter().flat_map(|e| e.builtins).collect()
}

/// The installed token hashing, if any.
pub(crate) fn token_hasher() -> Option<TokenHasher> {
    installed().into_iter().find_map(|e| e.token_hasher)
}
