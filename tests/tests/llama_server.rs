//! llama-server itself, patched with examples/llama-server (built once into
//! the tool cache by `scripts/llama-build.sh --server`), saves and restores
//! slots through the shim, driven through its real HTTP API by
//! scripts/llama-server-e2e.py (via `scripts/llama-e2e.sh --server`):
//! a save, a new server process, a restore and the next turn give the
//! tokens and probabilities of a server that never restarted, evaluating
//! only the new tokens, through the fs guest, Redis and the native backend,
//! across backends on one directory; ten slots sharing a system prompt
//! store its chunks once; bad stores answer HTTP errors and leave the slot
//! and the server as they were; a state saved in pieces (the server) and
//! in one buffer (examples/llama-slot) gives the same chunks and manifest
//! (examples/include/kv_slot_test.c).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kvwasm_tests::shim_dir;

fn tools_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"))
        .join("kvwasm-tools")
}

/// True when some llama-server build is in the cache (the patch may still
/// have changed since: then this run builds it).
fn server_cached() -> bool {
    std::fs::read_dir(tools_cache()).is_ok_and(|dir| {
        dir.flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with("llama-server-")
                && e.path().join(".built").exists()
        })
    })
}

#[test]
fn llama_server_saves_and_restores_slots_through_the_shim() {
    // An empty cache pays the llama-server build (~20 min on 2 loaded
    // cores); with it cached, the runs take a few minutes.
    let limit = Duration::from_secs(if server_cached() { 900 } else { 4000 });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/llama-e2e.sh");
    let mut command = Command::new("bash");
    command
        .arg(&script)
        .arg("--server")
        .env("KVWASM_SHIM_DIR", shim_dir())
        .env("KVWASM_HOSTILE_GUEST", kvwasm_guest_artifacts::HOSTILE_PATH);
    let (status, stdout, stderr) =
        kvwasm_tests::run_bounded(command, "scripts/llama-e2e.sh --server", limit);
    assert!(
        status.success(),
        "scripts/llama-e2e.sh --server failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.ends_with("llama-server-e2e: OK\n"),
        "{stdout}\n{stderr}"
    );
    // Every check the script makes printed its line.
    for check in [
        "ok  KV rows, 3001 cells (the bench's cut): 104 chunks, the same manifest and chunks",
        "ok  transposed V, 300 cells: 33 chunks, the same manifest and chunks",
        "kv_slot_test: OK",
        "ok  --slot-save-path nosuch://x: exits",
        "ok  --slot-save-path wasm://undefined-backend/ns: exits",
        "ok  restart fs guest:",
        "ok  restart redis:",
        "ok  restart native:",
        "ok  restart saved by the fs guest, restored by the native backend:",
        "ok  restart saved by the native backend, restored by the fs guest:",
        "ok  ten slots sharing a 600-token system prompt:",
        "ok  save without a filename:",
        "ok  restore without a filename:",
        "ok  restore of a missing manifest:",
        "ok  restore of a manifest naming a missing chunk:",
        "ok  restore of a corrupted chunk:",
        "ok  restore of another conversation failing part way:",
        "ok  save with Redis killed:",
        "ok  restore with Redis killed:",
        "ok  restore through a guest that traps:",
    ] {
        assert!(stderr.contains(check), "no '{check}' in:\n{stderr}");
    }
}
