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

/// The probe on the fs backend with `cache`, also opening the config's
/// memory backend: two components, so two cache lookups in one process.
fn open_two_components(cache: &Path, dir: &Path) -> String {
    let config =
        kvwasm_tests::write_config(dir, "[backends.mem]\ncomponent = \"builtin:memory\"\n");
    let (out, err) = Probe::new(PROBE, &fs_uri(&dir.join("store")))
        .config(&config)
        .env("KVWASM_CACHE_DIR", cache.to_str().unwrap())
        .run(&["open:wasm://mem/t"]);
    assert_eq!(out, ["open ok", "open wasm://mem/t -> ok"], "{err}");
    err
}

const REFUSED: &str = "not trusting the artifact cache";

/// How each component was obtained, in load order (`origin=...` lines).
fn origins(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|l| l.split("origin=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
        .collect()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `nobody`: tests run as root, so they can hand a file to another user.
fn give_to_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(65534), Some(65534))
        .unwrap_or_else(|e| panic!("chown {} (these tests run as root): {e}", path.display()));
}

#[test]
fn a_cache_directory_another_user_could_write_is_neither_loaded_nor_written() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let err = open_two_components(&cache, tmp.path());
    assert_eq!(origins(&err), ["Compiled", "Compiled"], "{err}");
    assert_eq!(
        origins(&open_two_components(&cache, tmp.path())),
        ["Cached", "Cached"]
    );
    let before: Vec<Vec<u8>> = artifacts(&cache)
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(before.len(), 2);

    type Tamper = fn(&Path);
    let cases: [(&str, Tamper, &str); 3] = [
        (
            "world-writable",
            |d| set_mode(d, 0o777),
            "mode 777 lets other users write it",
        ),
        (
            "group-writable",
            |d| set_mode(d, 0o770),
            "mode 770 lets other users write it",
        ),
        ("owned by nobody", give_to_nobody, "owned by uid 65534"),
    ];
    for (what, tamper, reason) in cases {
        tamper(&cache);
        let err = open_two_components(&cache, tmp.path());
        // Valid artifacts are there, but compiled afresh, and nothing is
        // written into a directory someone else controls.
        assert_eq!(
            origins(&err),
            ["CompiledUncached", "CompiledUncached"],
            "{what}: {err}"
        );
        assert_eq!(
            err.matches(REFUSED).count(),
            1,
            "{what}: warned once: {err}"
        );
        assert!(err.contains(reason), "{what}: {err}");
        let after: Vec<Vec<u8>> = artifacts(&cache)
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect();
        assert_eq!(after, before, "{what}: the cache was not written");
        // Back to a private directory: trusted again.
        // SAFETY: no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        std::os::unix::fs::chown(&cache, Some(uid), Some(gid)).unwrap();
        set_mode(&cache, 0o700);
        assert_eq!(
            origins(&open_two_components(&cache, tmp.path())),
            ["Cached", "Cached"]
        );
    }
}

#[test]
fn an_artifact_another_user_could_write_is_recompiled_and_replaced() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (out, err) = open_and_use(cache.to_str().unwrap(), &tmp.path().join("store"));
    assert_eq!(out[0], "open ok", "{err}");
    let artifact = artifacts(&cache).pop().expect("one artifact");

    type Tamper = fn(&Path);
    let cases: [(&str, Tamper, &str); 3] = [
        ("owned by nobody", give_to_nobody, "owned by uid 65534"),
        // Root wrote it, but anyone may rewrite it.
        (
            "other-writable",
            |f| set_mode(f, 0o606),
            "mode 606 lets other users write it",
        ),
        (
            "group-writable",
            |f| set_mode(f, 0o660),
            "mode 660 lets other users write it",
        ),
    ];
    for (what, tamper, reason) in cases {
        tamper(&artifact);
        let (out, err) = open_and_use(cache.to_str().unwrap(), &tmp.path().join("store"));
        assert_eq!(out[0], "open ok", "{what}: {err}");
        assert_eq!(
            origins(&err),
            ["Compiled"],
            "{what}: not loaded, compiled: {err}"
        );
        assert_eq!(err.matches(REFUSED).count(), 1, "{what}: {err}");
        assert!(err.contains(reason), "{what}: {err}");
        // Replaced by this user's own, private artifact, which is used again.
        let meta = std::fs::metadata(&artifact).unwrap();
        // SAFETY: no preconditions.
        assert_eq!(meta.uid(), unsafe { libc::geteuid() }, "{what}");
        assert_eq!(meta.mode() & 0o777, 0o600, "{what}");
        let (_, err) = open_and_use(cache.to_str().unwrap(), &tmp.path().join("store"));
        assert_eq!(origins(&err), ["Cached"], "{what}: {err}");
    }
}
