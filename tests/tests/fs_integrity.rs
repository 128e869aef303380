//! Data integrity of the fs guest: the durable-before-manifest rule holds
//! for chunks another writer left in place, and no namespace can reach into
//! another one's chunk store or manifests.

use std::path::Path;
use std::sync::Arc;

use kvwasm_host::config::Config;
use kvwasm_host::{KvError, StoreHandle};
use kvwasm_tests::{Probe, fs_uri, pattern, xxh3_key};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

#[test]
fn a_chunk_found_in_place_is_synced_before_the_next_manifest() {
    let dir = tempfile::tempdir().unwrap();
    // Another writer (instance or process) renamed this chunk into place
    // and has not synced it yet: this handle cannot know it is durable.
    let (theirs, mine) = ("0a11", "0b22");
    std::fs::create_dir_all(dir.path().join("chunks/0")).unwrap();
    std::fs::write(dir.path().join("chunks/0").join(theirs), "theirs").unwrap();

    let (out, stderr) = Probe::new(PROBE, &fs_uri(dir.path())).run(&[
        &format!("put-chunk:{theirs}=theirs"),
        &format!("put-chunk:{mine}=mine"),
        "put-manifest:m1=both",
    ]);
    assert_eq!(
        out,
        [
            "open ok".to_owned(),
            format!("put-chunk {theirs}=theirs -> 1"),
            format!("put-chunk {mine}=mine -> 0"),
            "put-manifest m1=both -> 0".into(),
        ],
        "{stderr}"
    );
    assert!(
        stderr.contains("put-manifest \"m1\": 2 chunks synced first"),
        "the chunk found in place was synced with the new one: {stderr}"
    );
}

/// Backend `name` of `builtin:fs` rooted at `dir/data`, never releasing
/// its instances (each test names its own: metrics are per name).
fn fs_named(dir: &Path, name: &str) -> Arc<kvwasm_host::Backend> {
    let text = format!("[backends.{name}]\ncomponent = \"builtin:fs\"\ndir = \"data\"\n");
    Arc::new(Config::parse(&text, dir).unwrap().backend(name).unwrap())
}

/// Issue 37: the host remembers what it synced only for the version it
/// synced. A chunk file replaced since (same name and size, a new inode,
/// as another writer's rename leaves it) or rewritten in place is synced
/// again before the next manifest; an unchanged one is not.
#[test]
fn a_replaced_or_rewritten_chunk_file_is_not_trusted_as_durable() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_named(dir.path(), "fs_replaced");
    let store = StoreHandle::open(backend.clone(), "").unwrap();
    let chunk = pattern(4096, 37);
    let key = xxh3_key(&chunk);
    let hex = hex::encode(key);
    let fan_out = dir.path().join("data/chunks").join(&hex[..1]);
    let file = fan_out.join(&hex);
    let save = || {
        let before = backend.metrics.snapshot();
        assert!(store.put_chunk(&key, &chunk).unwrap(), "found in place");
        store.put_manifest("m", &key).unwrap();
        let after = backend.metrics.snapshot();
        (
            after.syncs - before.syncs,
            after.syncs_skipped - before.syncs_skipped,
        )
    };
    assert!(!store.put_chunk(&key, &chunk).unwrap());
    kvwasm_tests::wait_past_change_times(dir.path());
    store.put_manifest("m", &key).unwrap();
    // File, fan-out directory and `chunks`: all synced, all remembered.
    // The host finds all three unchanged and answers the put itself: the
    // guest has nothing to list, check or sync.
    assert_eq!(save(), (0, 0), "unchanged: nothing synced again");

    // Another writer's copy renamed over it: a new inode, and a new entry.
    let tmp = fan_out.join("other-writer.tmp");
    std::fs::write(&tmp, &chunk).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    kvwasm_tests::wait_past_change_times(dir.path());
    assert_eq!(save(), (2, 1), "the file and its directory synced again");
    assert_eq!(save(), (0, 0));

    // Rewritten in place, same size: same inode, a new change time.
    std::fs::write(&file, &chunk).unwrap();
    assert_eq!(save().0, 1, "the file synced again");
    assert_eq!(store.get_chunk(&key).unwrap().as_slice(), chunk.as_slice());
}

/// `durability = "none"` (a cache, synced as little as llama.cpp's own
/// slot files): a save syncs nothing, where the default syncs the chunk,
/// its fan-out directory and `chunks`; the manifest is still published
/// whole and reads back with its chunk. Any other value refuses to open.
#[test]
fn durability_none_syncs_nothing_and_still_publishes_whole_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let backend = |name: &str, durability: &str| {
        let text = format!(
            "[backends.{name}]\ncomponent = \"builtin:fs\"\ndir = \"{name}\"\n\
             settings = {{ durability = \"{durability}\" }}\n"
        );
        Arc::new(
            Config::parse(&text, dir.path())
                .unwrap()
                .backend(name)
                .unwrap(),
        )
    };
    let chunk = pattern(4096, 41);
    let key = xxh3_key(&chunk);
    let save = |backend: &Arc<kvwasm_host::Backend>| {
        let store = StoreHandle::open(backend.clone(), "").unwrap();
        let before = backend.metrics.snapshot();
        assert!(!store.put_chunk(&key, &chunk).unwrap(), "stored");
        assert!(store.put_chunk(&key, &chunk).unwrap(), "already present");
        store.put_manifest("m", &key).unwrap();
        assert_eq!(store.get_manifest("m").unwrap().as_slice(), key.as_slice());
        assert_eq!(store.get_chunk(&key).unwrap().as_slice(), chunk.as_slice());
        backend.metrics.snapshot().syncs - before.syncs
    };
    assert_eq!(
        save(&backend("fs_ordered", "ordered")),
        3,
        "chunk, fan-out directory, chunks"
    );
    assert_eq!(save(&backend("fs_cache", "none")), 0, "nothing synced");
    // Published by rename: no temp file is left beside the manifest.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("fs_cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "the manifest and `chunks`: {names:?}");

    match StoreHandle::open(backend("fs_bad", "sometimes"), "") {
        Err(KvError::InvalidArgument(why)) => assert!(why.contains("durability"), "{why}"),
        Err(other) => panic!("expected an invalid argument, got {other}"),
        Ok(_) => panic!("an unknown durability opened"),
    }
}

#[test]
fn a_directory_the_store_creates_is_synced_into_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let uri = fs_uri(dir.path());
    let (out, stderr) = Probe::new(PROBE, &uri).run(&["put-manifest:m=x"]);
    assert_eq!(out, ["open ok", "put-manifest m=x -> 0"], "{stderr}");
    assert!(
        stderr.contains("created directory \"chunks\" and synced its parent"),
        "a new chunk store is durable before a manifest can name its chunks: {stderr}"
    );
    // Opened again, nothing is created and nothing more is synced.
    let (out, stderr) = Probe::new(PROBE, &uri).run(&["get-manifest:m"]);
    assert_eq!(out.len(), 2, "{stderr}");
    assert!(!stderr.contains("created directory"), "{stderr}");
}

/// Handles on namespaces of one `builtin:fs` backend rooted at `dir/data`.
fn fs_backend(dir: &Path) -> Arc<kvwasm_host::Backend> {
    let text = "[backends.fs]\ncomponent = \"builtin:fs\"\ndir = \"data\"\n";
    Arc::new(Config::parse(text, dir).unwrap().backend("fs").unwrap())
}

#[test]
fn no_namespace_reaches_into_another_ones_chunks_or_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_backend(dir.path());
    let open = |ns: &str| StoreHandle::open(backend.clone(), ns).unwrap();
    let data = dir.path().join("data");

    // The empty namespace (llama.cpp's layout) and an ordinary nested one.
    let victims = [("", open("")), ("team", open("team"))];
    let chunk = pattern(4096, 7);
    let hash = xxh3_key(&chunk);
    let hex = hex::encode(hash);
    // A second chunk in another fan-out directory.
    let other = (8..)
        .map(|seed| pattern(4096, seed))
        .find(|c| hex::encode(xxh3_key(c))[..1] != hex[..1])
        .unwrap();
    let other_fan = hex::encode(xxh3_key(&other))[..1].to_owned();
    for (_, store) in &victims {
        assert!(!store.put_chunk(&hash, &chunk).unwrap());
        assert!(!store.put_chunk(&xxh3_key(&other), &other).unwrap());
        store.put_manifest("m", &hash).unwrap();
    }

    // Namespaces that look like the victims' chunk stores, in any case.
    let fan = &hex[..1];
    for ns in [
        format!("chunks/{fan}"),
        format!("team/chunks/{fan}"),
        format!("CHUNKS/{fan}"),
        format!("team/Chunks/{fan}"),
        "chunks".to_owned(),
        "team/chunks".to_owned(),
    ] {
        let attacker = open(&ns);
        // The victims' chunk files are not its manifests...
        assert!(
            matches!(attacker.get_manifest(&hex), Err(KvError::NotFound)),
            "{ns:?} read a chunk as a manifest"
        );
        // ...and writing manifests of those names, or named after the
        // victims' fan-out directories, clobbers nothing.
        attacker.put_manifest(&hex, b"clobbered").unwrap();
        attacker.put_manifest(&other_fan, b"a manifest").unwrap();
        assert_eq!(
            attacker.get_manifest(&other_fan).unwrap().as_slice(),
            b"a manifest"
        );
        // Its own chunks are its own, even the same hash.
        assert!(!attacker.put_chunk(&hash, b"other bytes").unwrap());
        for (name, victim) in &victims {
            assert_eq!(
                victim.get_chunk(&hash).unwrap().as_slice(),
                chunk.as_slice(),
                "{ns:?} clobbered {name:?}'s chunk"
            );
            assert_eq!(victim.get_manifest("m").unwrap().as_slice(), &hash);
            assert!(victim.get_manifest(&hex).is_err(), "{ns:?} → {name:?}");
        }
    }

    // Ordinary namespaces keep their plain paths; the escaped ones are
    // out of every chunk store's way.
    let chunk_file = |ns: &str| data.join(ns).join("chunks").join(fan).join(&hex);
    assert_eq!(std::fs::read(chunk_file("team")).unwrap(), chunk);
    assert_eq!(std::fs::read(chunk_file("")).unwrap(), chunk);
    assert_eq!(
        std::fs::read(chunk_file("..chunks")).unwrap(),
        b"other bytes"
    );
    assert_eq!(
        std::fs::read(chunk_file("team/..chunks")).unwrap(),
        b"other bytes"
    );
    // Namespace `CHUNKS/<fan>`'s manifest named like the chunk.
    let manifest = data.join("..CHUNKS").join(fan).join(&hex);
    assert_eq!(std::fs::read(manifest).unwrap(), b"clobbered");
    let mut fans: Vec<String> = std::fs::read_dir(data.join("chunks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    fans.sort();
    let mut expected = [fan.to_owned(), other_fan];
    expected.sort();
    assert_eq!(fans, expected, "only the victim's fan-out directories");
}
