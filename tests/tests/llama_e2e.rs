//! A real llama.cpp (built once into the tool cache by
//! scripts/llama-build.sh) saves its KV state through the shim and restores
//! it with bit-identical logits: scripts/llama-e2e.sh asserts it all (fs
//! guest, Redis, prefix dedup, the native backend on the same directory);
//! this test runs it against the shim these tests were built with.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kvwasm_tests::shim_dir;

/// The stamp scripts/llama-build.sh leaves once llama.cpp is built.
fn llama_stamp() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    cache.join("kvwasm-tools/llama-11434.0.0/.built")
}

#[test]
fn llama_cpp_restores_its_kv_state_through_the_shim_bit_for_bit() {
    // An empty cache pays the llama.cpp build (~12 min on 2 loaded cores);
    // with it cached, the runs take seconds.
    let limit = Duration::from_secs(if llama_stamp().exists() { 300 } else { 3000 });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama-e2e.sh");
    let mut command = Command::new("bash");
    command.arg(&script).env("KVWASM_SHIM_DIR", shim_dir());
    let (status, stdout, stderr) =
        kvwasm_tests::run_bounded(command, "scripts/llama-e2e.sh", limit);
    assert!(
        status.success(),
        "scripts/llama-e2e.sh failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(stdout.ends_with("llama-e2e: OK\n"), "{stdout}\n{stderr}");
    // Every round trip reported identical logits, through both backends.
    for uri in ["\"uri\":\"wasm:///", "\"uri\":\"wasm://redis/llama-e2e\""] {
        let runs = stderr
            .lines()
            .filter(|l| l.contains("\"mode\":\"roundtrip\"") && l.contains(uri))
            .collect::<Vec<_>>();
        assert!(runs.len() >= 3, "round trips through {uri}:\n{stderr}");
        assert!(
            runs.iter().all(|l| l.contains("\"logits_identical\":true")),
            "{stderr}"
        );
    }
}
