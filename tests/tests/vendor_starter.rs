//! examples/vendor-starter, built the way a vendor would build it (plain
//! wit-bindgen against wit/, no kvwasm crates), runs behind the shim; and
//! so does the same starter built against an earlier release of the
//! contract (`tests/fixtures/vendor-starter-0.1.0.wasm`, built from
//! `kvwasm:kv-store@0.1.0`, before `payload-streams` was added).

use kvwasm_tests::{Probe, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

#[test]
fn the_vendor_starter_serves_the_full_contract() {
    serves_the_full_contract(kvwasm_guest_artifacts::VENDOR_STARTER_PATH);
}

/// A vendor's component is not rebuilt when the host gains a compatible
/// addition: wasmtime matches `@0.1.0` imports and exports to the host's
/// `@0.1.2` by semver.
#[test]
fn a_component_built_against_0_1_0_still_runs() {
    let old =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vendor-starter-0.1.0.wasm");
    let bytes = std::fs::read(&old).unwrap();
    let marker = b"kvwasm:kv-store/store@0.1.0";
    assert!(
        bytes.windows(marker.len()).any(|w| w == marker),
        "the fixture must be the 0.1.0 build"
    );
    serves_the_full_contract(old.to_str().unwrap());
}

fn serves_the_full_contract(component: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("[backends.acme]\ncomponent = {component:?}\ndir = \"acme-data\"\n"),
    );
    let (out, err) = Probe::new(PROBE, "wasm://acme/tenant-a/")
        .config(&config)
        .run(&[
            "put-chunk:c0ffee=first",
            "put-chunk:c0ffee=first",
            "put-manifest:slot=c0ffee",
            "get-manifest:slot",
            "get-chunk:c0ffee",
            "get-chunk:0bad",
            "put-manifest:../escape=x",
            "delete-manifest:slot",
            "delete-manifest:slot",
            "get-manifest:slot",
        ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk c0ffee=first -> 0",
            "put-chunk c0ffee=first -> 1",
            "put-manifest slot=c0ffee -> 0",
            "get-manifest slot -> 0 c0ffee",
            "get-chunk c0ffee -> 0 first",
            "get-chunk 0bad -> -2",
            "put-manifest ../escape=x -> -3",
            "delete-manifest slot -> 0",
            "delete-manifest slot -> 0",
            "get-manifest slot -> -2",
        ],
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("acme-data/tenant-a/chunks/c0ffee")).unwrap(),
        b"first"
    );
}
