//! libkv_store_wasm.so carries the sandbox and the kv-store kind only: the
//! four backends and the storage advisor (a tiered store opened through the
//! shim runs one), not the fabrics or the KV indexer, which run in
//! `kvwasm`, nor the crates that add them to the host (kvwasm-fabric,
//! kvwasm-kv-indexer-host and the indexer core's block hashing). A consumer
//! naming one of those gets a refusal saying so.

use std::time::Instant;

use kvwasm_tests::{Probe, assert_open_refused, shim_path, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

/// Whether `needle` occurs in `haystack` as one run of bytes (as
/// `include_bytes!` lays an embedded component out).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_shim_embeds_the_kv_store_guests_and_the_advisor_only() {
    use kvwasm_guest_artifacts as guests;
    let library = std::fs::read(shim_path()).expect("read the shim");
    for (name, bytes) in [
        ("fs", guests::FS),
        ("memory", guests::MEMORY),
        ("redis", guests::REDIS),
        ("s3", guests::S3),
        ("advisor", guests::ADVISOR),
    ] {
        assert!(contains(&library, bytes), "builtin:{name} missing");
    }
    let kinds_it_does_not_run = [
        ("builtin:synthetic", guests::SYNTHETIC),
        ("builtin:tcp", guests::TCP),
        ("builtin:kv-indexer", guests::KV_INDEXER),
    ];
    // Test guests are built by every build, named by tests only.
    for (name, bytes) in kinds_it_does_not_run
        .into_iter()
        .chain(guests::tests_only())
    {
        assert!(!contains(&library, bytes), "{name} embedded");
    }
}

/// No function of the crates that run the other kinds is linked: the
/// release profile strips debug info but keeps symbol names, and a linked
/// function's (legacy-mangled) name starts with its crate's, length first.
/// Before kvwasm-host handed the block-hash import to
/// kvwasm-kv-indexer-host, the shim held five functions of the indexer core.
#[test]
fn the_shim_links_no_code_of_the_fabric_or_kv_indexer_crates() {
    let library = std::fs::read(shim_path()).expect("read the shim");
    let mangled = |krate: &str| format!("{}{krate}", krate.len());
    assert!(
        contains(&library, mangled("kvwasm_host").as_bytes()),
        "the check sees the host's symbols"
    );
    for krate in [
        "kvwasm_kv_indexer_core",
        "kvwasm_kv_indexer_host",
        "kvwasm_fabric",
    ] {
        assert!(
            !contains(&library, mangled(krate).as_bytes()),
            "{krate} linked into the shim"
        );
    }
    // Nor a panic location in their sources.
    for dir in [
        "kv-indexer-core/src/",
        "host/kv-indexer/src/",
        "host/fabric/src/",
    ] {
        assert!(
            !contains(&library, dir.as_bytes()),
            "{dir} linked into the shim"
        );
    }
}

#[test]
fn the_shim_refuses_a_fabric_or_the_kv_indexer_and_says_why() {
    for builtin in ["tcp", "synthetic", "kv-indexer"] {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(
            dir.path(),
            &format!("[backends.b]\ncomponent = \"builtin:{builtin}\"\n"),
        );
        let started = Instant::now();
        let run = Probe::new(PROBE, "wasm://b/ns")
            .config(&config)
            .run(&["get-manifest:m"]);
        assert_open_refused(
            run,
            started.elapsed(),
            &[
                &format!("builtin:{builtin} is not linked into this program"),
                "fabrics and event subscribers run in `kvwasm`",
            ],
            "no secret here",
        );
    }
}
