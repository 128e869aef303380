//! The checks, one module per part of the spec. Each quotes the rule it
//! enforces; the order here is the order they run and are reported in.

mod chunks;
mod hostile;
mod library;
mod manifests;
mod namespaces;
mod ownership;
mod threads;

use crate::Level;
use crate::ctx::{Ctx, Outcome};

/// One named rule and the code that tests it.
pub struct Check {
    /// Stable name for `--only` / `--skip` and CI scripts.
    pub name: &'static str,
    pub level: Level,
    /// The spec's sentence (or the consumers' observed behaviour) it enforces.
    pub rule: &'static str,
    /// Part of `--quick`.
    pub quick: bool,
    pub run: fn(&Ctx<'_>) -> Outcome,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The check a child process runs by name.
pub fn find(name: &str) -> Option<&'static Check> {
    CHECKS.iter().find(|c| c.name == name)
}

/// Checks that gate the rest: if the vtable cannot be loaded or a handle
/// cannot be opened, nothing else can be tested.
pub const GATES: [&str; 2] = ["vtable", "open-close"];
/// If this fails, the other checks leak outputs instead of crashing in `free`.
pub const OUTPUT_OWNERSHIP: &str = "malloc-outputs";

/// Every check, in run order.
pub static CHECKS: &[Check] = &[
    library::VTABLE,
    library::LIBRARY_NAME,
    library::EXPORTS,
    library::URI_SECRETS,
    library::OPEN_CLOSE,
    library::OPEN_BAD_URI,
    ownership::MALLOC_OUTPUTS,
    chunks::PUT_CHUNK_IDEMPOTENT,
    chunks::ROUND_TRIP_SIZES,
    chunks::HASH_LENGTHS,
    chunks::MISSING_CHUNK,
    manifests::MISSING_MANIFEST,
    manifests::DELETE_MISSING_MANIFEST,
    manifests::MANIFEST_LIFECYCLE,
    manifests::EMPTY_MANIFEST,
    manifests::VISIBILITY,
    library::TRAILING_SLASH_URI,
    namespaces::NAMESPACE_SEPARATE,
    namespaces::NAMESPACE_LOOK_ALIKES,
    namespaces::NAMESPACE_DELETE_OVERWRITE,
    namespaces::EMPTY_NAMESPACE,
    manifests::MANIFEST_ATOMICITY,
    threads::THREAD_SAFETY,
    chunks::PREFETCH,
    hostile::HOSTILE_INPUTS,
    hostile::PREFETCH_BAD_ARGUMENTS,
    library::CLOSE_RELEASES,
    manifests::DURABLE_ACROSS_REOPEN,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_gates_exist() {
        let mut names: Vec<_> = CHECKS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CHECKS.len());
        for gate in GATES.iter().chain([&OUTPUT_OWNERSHIP]) {
            assert!(find(gate).is_some(), "{gate}");
        }
    }
}
