//! Link the functions a call runs together at the start of the library's
//! code, in the order of `hot-path.order` (made by
//! `scripts/hot-path-order.sh`). A call that finds the CPU caches cold, as
//! after a consumer's large copy or when it cycles through many handles,
//! then touches fewer code pages and cache lines: the empty call with cold
//! caches took 20–25% less time (docs/benchmarks.md, "A call with cold
//! caches").
//!
//! Only where rustc links with its own lld by default (x86_64 Linux since
//! Rust 1.90), and only if no linker is chosen through RUSTFLAGS: another
//! linker may not know `--symbol-ordering-file`. `KVWASM_NO_HOT_PATH_ORDER`
//! turns it off. Names in the list that the build no longer has are
//! skipped: a stale list loses some of its effect, never the build.

use std::env;
use std::path::Path;

fn main() {
    let order =
        Path::new(&env::var("CARGO_MANIFEST_DIR").expect("set by cargo")).join("hot-path.order");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=KVWASM_NO_HOT_PATH_ORDER");
    let own_lld = env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu");
    let linker_chosen = env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("link"));
    if !own_lld
        || linker_chosen
        || env::var_os("KVWASM_NO_HOT_PATH_ORDER").is_some()
        || !order.exists()
    {
        return;
    }
    println!(
        "cargo:rustc-link-arg-cdylib=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo:rustc-link-arg-cdylib=-Wl,--no-warn-symbol-ordering");
}
