//! The `kv_store_v1` conformance suite behind `kvwasm check`.
//!
//! Every MUST and SHOULD of the spec (`kv-store-abi.txt`) and of the
//! consumers' observed behaviour is a named [`Check`] that quotes the rule it
//! enforces. Checks drive a backend only through its C vtable, loaded with
//! `dlopen` exactly as a consumer does, so the same suite judges a native
//! `libkv_store_<scheme>.so` and `libkv_store_wasm.so` running a component.
//!
//! A backend under test may crash, hang or corrupt memory. The [`runner`]
//! therefore runs each check in a child process (the caller's own
//! executable, re-entered through [`child::run`]); a crash or a hang is that
//! check's failure, never the checker's.

mod checks;
pub mod child;
mod ctx;
pub mod report;
pub mod runner;

pub use checks::{CHECKS, Check, find};
pub use report::{CheckResult, Report, Verdict};
pub use runner::{Runner, Target};

/// How binding a rule is, as the spec words it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    /// Breaking it breaks consumers: a failure fails the run.
    Must,
    /// Recommended: a failure is reported as a warning.
    Should,
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Must => "MUST",
            Level::Should => "SHOULD",
        })
    }
}
