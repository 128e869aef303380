//! examples/vendor-starter, built the way a vendor would build it (plain
//! wit-bindgen against wit/, no kvwasm crates), runs behind the shim; and
//! so does the same starter built against an earlier release of the
//! contract (`tests/fixtures/vendor-starter-0.1.0.wasm`, built from
//! `kvwasm:kv-store@0.1.0`, before `payload-streams` was added), and the
//! built-in fs backend as built against `@0.1.2`
//! (`tests/fixtures/fs-guest-0.1.2.wasm`, importing `payload-io` before
//! `publish-file` was added).

use kvwasm_tests::{Probe, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

#[test]
fn the_vendor_starter_serves_the_full_contract() {
    let dir = serves_the_full_contract(kvwasm_guest_artifacts::VENDOR_STARTER_PATH);
    assert_starter_layout(&dir);
}

/// A vendor's component is not rebuilt when the host gains a compatible
/// addition: wasmtime matches `@0.1.0` imports and exports to the host's
/// `@0.1.6` by semver.
#[test]
fn a_component_built_against_0_1_0_still_runs() {
    let old = fixture("vendor-starter-0.1.0.wasm", "kvwasm:kv-store/store@0.1.0");
    let dir = serves_the_full_contract(&old);
    assert_eq!(
        std::fs::read(dir.path().join("acme-data/tenant-a/chunks/c0ffee")).unwrap(),
        b"first"
    );
}

/// Namespace `tenant-a/chunks` cannot read or forge namespace `tenant-a`'s
/// chunks. The starter's earlier layout (`<namespace>/chunks/<hex>` next to
/// `<namespace>/<manifest>`, kept in the 0.1.0 fixture) let it do both.
#[test]
fn a_namespace_cannot_reach_into_another_ones_chunks() {
    let (genuine, forged) = forge_a_chunk(kvwasm_guest_artifacts::VENDOR_STARTER_PATH);
    assert_eq!(genuine, "get-manifest deadbeefdeadbeef -> -2");
    assert_eq!(forged, "get-chunk deadbeefdeadbeef -> 0 GENUINE");

    let old = fixture("vendor-starter-0.1.0.wasm", "kvwasm:kv-store/store@0.1.0");
    let (genuine, forged) = forge_a_chunk(&old);
    assert_eq!(genuine, "get-manifest deadbeefdeadbeef -> 0 GENUINE");
    assert_eq!(forged, "get-chunk deadbeefdeadbeef -> 0 FORGED");
}

/// Namespace `tenant-a` stores a chunk; `tenant-a/chunks` reads the
/// manifest named like it, then writes that manifest; `tenant-a` reads its
/// chunk again. The probe's lines for the two reads.
fn forge_a_chunk(component: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("[backends.acme]\ncomponent = {component:?}\ndir = \"acme-data\"\n"),
    );
    let probe = |uri: &str, commands: &[&str]| {
        let (out, err) = Probe::new(PROBE, uri).config(&config).run(commands);
        assert_eq!(out.len(), commands.len() + 1, "{out:?} {err}");
        out
    };
    probe(
        "wasm://acme/tenant-a",
        &["put-chunk:deadbeefdeadbeef=GENUINE", "put-manifest:slot=x"],
    );
    let reach = probe(
        "wasm://acme/tenant-a/chunks",
        &[
            "get-manifest:deadbeefdeadbeef",
            "put-manifest:deadbeefdeadbeef=FORGED",
        ],
    );
    let read = probe("wasm://acme/tenant-a", &["get-chunk:deadbeefdeadbeef"]);
    (reach[1].clone(), read[1].clone())
}

/// The same for an import the host extended since: the fs backend built
/// against `@0.1.2` writes through `payload-io.write-file` and `rename-at`
/// (today's build uses `publish-file`), on a host serving `@0.1.6`.
#[test]
fn a_filesystem_backend_built_against_0_1_2_still_runs() {
    let old = fixture("fs-guest-0.1.2.wasm", "kvwasm:kv-store/payload-io@0.1.2");
    let dir = serves_the_full_contract(&old);
    let chunk = dir.path().join("acme-data/tenant-a/chunks/c/c0ffee");
    assert_eq!(std::fs::read(chunk).unwrap(), b"first");
}

/// The path of `tests/fixtures/<name>`, after checking it imports or
/// exports the versioned interface `marker`.
fn fixture(name: &str, marker: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "{name} must be the build naming {marker}"
    );
    path.to_str().unwrap().to_owned()
}

fn assert_starter_layout(dir: &tempfile::TempDir) {
    assert_eq!(
        std::fs::read(dir.path().join("acme-data/ns/tenant-a/chunks/c0ffee")).unwrap(),
        b"first"
    );
}

/// Run the whole contract through the shim against `component`; the
/// directory it stored into.
fn serves_the_full_contract(component: &str) -> tempfile::TempDir {
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
    dir
}
