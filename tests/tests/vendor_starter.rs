//! examples/vendor-starter, built the way a vendor would build it (plain
//! wit-bindgen against wit/, no kvwasm crates), runs behind the shim.

use kvwasm_tests::{Probe, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

#[test]
fn the_vendor_starter_serves_the_full_contract() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[backends.acme]\ncomponent = {:?}\ndir = \"acme-data\"\n",
            kvwasm_guest_artifacts::VENDOR_STARTER_PATH
        ),
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
