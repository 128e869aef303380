//! The precompiled-artifact cache: written on first use, reused, repaired
//! when damaged, and off when asked.

use std::path::{Path, PathBuf};

use kvwasm_tests::{Probe, fs_uri};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

fn artifacts(cache: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(cache) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn open_and_use(cache: &str, store: &Path) -> (Vec<String>, String) {
    Probe::new(PROBE, &fs_uri(store))
        .env("KVWASM_CACHE_DIR", cache)
        .run(&["put-manifest:m=v", "get-manifest:m"])
}

#[test]
fn artifacts_are_cached_reused_and_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let cache_str = cache.to_str().unwrap();
    let store = tmp.path().join("store");
    let expected = ["open ok", "put-manifest m=v -> 0", "get-manifest m -> 0 v"];

    let (out, err) = open_and_use(cache_str, &store);
    assert_eq!(out, expected, "{err}");
    let cached = artifacts(&cache);
    assert_eq!(cached.len(), 1, "one artifact for the fs guest: {cached:?}");
    let name = cached[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.len() > 40 && name.contains('-'),
        "keyed by component and engine hash: {name}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let first = std::fs::read(&cached[0]).unwrap();

    // Reused as is.
    let (out, err) = open_and_use(cache_str, &store);
    assert_eq!(out, expected, "{err}");
    assert_eq!(std::fs::read(&cached[0]).unwrap(), first);

    // A damaged artifact is ignored, recompiled and replaced.
    std::fs::write(&cached[0], b"not machine code").unwrap();
    let (out, err) = open_and_use(cache_str, &store);
    assert_eq!(out, expected, "{err}");
    assert!(err.contains("ignoring unusable cached artifact"), "{err}");
    assert_eq!(std::fs::read(&cached[0]).unwrap(), first);
}

#[test]
fn the_cache_can_be_turned_off() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, err) = open_and_use("off", &tmp.path().join("store"));
    assert_eq!(out[0], "open ok", "{err}");
    assert!(!Path::new("off").exists());
}
