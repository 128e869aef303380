//! The builtin fabric guests, which kvwasm-host does not embed: a
//! `kv_store_v1` consumer (libkv_store_wasm.so) runs no fabric, so only the
//! programs that depend on this crate carry them.

use kvwasm_host::extension::{Extension, LinkedBuiltin};

/// `builtin:synthetic` (the reference's in-memory fabric, `nixl-synth`, for
/// tests and demos) and `builtin:tcp` (frames to one granted peer running
/// `kvwasm fabric serve`; needs `net` and `settings.peer`).
pub static BUILTINS: [LinkedBuiltin; 2] = [
    LinkedBuiltin::new("synthetic", kvwasm_guest_artifacts::SYNTHETIC, false),
    LinkedBuiltin::new("tcp", kvwasm_guest_artifacts::TCP, false),
];

/// What [`install`] adds to kvwasm-host: the builtins only (a fabric
/// imports nothing the host does not link already).
pub static EXTENSION: Extension = Extension {
    name: "kvwasm-fabric",
    builtins: &BUILTINS,
    host_imports: None,
    token_hasher: None,
};

/// Make `builtin:synthetic` and `builtin:tcp` loadable in this process.
/// Idempotent; call it before building a fabric from a config.
pub fn install() {
    kvwasm_host::extension::install(&EXTENSION);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kvwasm-host names these builtins where this crate is not installed
    /// (so `builtin:tcp` through the shim reads "not linked", not "unknown").
    #[test]
    fn every_builtin_here_is_listed_among_the_shipped_ones() {
        for builtin in &BUILTINS {
            assert!(
                kvwasm_host::extension::SHIPPED_BUILTINS.contains(&(builtin.name, EXTENSION.name)),
                "builtin:{} is missing from SHIPPED_BUILTINS",
                builtin.name
            );
        }
    }
}
