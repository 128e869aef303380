//! Round trips through the C ABI of libkv_store_wasm.so into the embedded
//! filesystem guest, loaded with libloading as a consumer does.

use kvwasm_tests::{hash_of_len, open_fs, pattern, shim};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

#[test]
fn vtable_is_version_2_with_prefetch() {
    let lib = shim();
    assert_eq!(lib.vtable().version, 2);
    assert!(lib.has_prefetch());
}

#[test]
fn chunks_round_trip_for_every_size_and_hash_length() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let mut seed = 0;
    for size in [0, 1, 4 * KIB, MIB, 64 * MIB] {
        for hash_len in [1, 8, 32, 64] {
            seed += 1;
            let hash = hash_of_len(hash_len, seed);
            let data = pattern(size, seed);
            assert_eq!(
                store.put_chunk(&hash, &data),
                Ok(false),
                "size {size} hash {hash_len}: first put stores"
            );
            assert_eq!(
                store.put_chunk(&hash, &data),
                Ok(true),
                "size {size} hash {hash_len}: second put is a dedup hit"
            );
            let got = store.get_chunk(&hash).expect("get after put");
            assert_eq!(got.len(), size);
            assert!(
                got.as_slice() == data.as_slice(),
                "size {size} hash {hash_len}: bytes differ"
            );
        }
    }
}

#[test]
fn missing_keys_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    assert!(store.get_chunk(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap_err() < 0);
    assert!(store.get_manifest("absent").unwrap_err() < 0);
    assert_eq!(store.delete_manifest("absent"), Ok(()));

    store.put_manifest("m", b"value").unwrap();
    assert_eq!(&*store.get_manifest("m").unwrap(), b"value");
    assert_eq!(store.delete_manifest("m"), Ok(()));
    assert!(store.get_manifest("m").unwrap_err() < 0);
}

#[test]
fn empty_manifest_publishes_and_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    store
        .put_chunk(&[7; 32], b"chunk before the empty manifest")
        .unwrap();
    store.put_manifest("__omlx_index__", b"").unwrap();
    assert_eq!(store.get_manifest("__omlx_index__").unwrap().len(), 0);

    let reader = open_fs(dir.path());
    assert_eq!(
        &*reader.get_chunk(&[7; 32]).unwrap(),
        b"chunk before the empty manifest"
    );
}

#[test]
fn manifests_replace_atomically_and_large_ones_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    store.put_manifest("slot", &pattern(100, 1)).unwrap();
    let big = pattern(3 * MIB, 2);
    store.put_manifest("slot", &big).unwrap();
    assert!(*store.get_manifest("slot").unwrap() == *big);
}

#[test]
fn second_handle_sees_manifest_and_all_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let writer = open_fs(dir.path());
    let chunks: Vec<Vec<u8>> = (0..20).map(|i| pattern(64 * KIB + i, i as u64)).collect();
    let hashes: Vec<[u8; 8]> = chunks.iter().map(|c| kvwasm_tests::xxh3_key(c)).collect();
    for (hash, chunk) in hashes.iter().zip(&chunks) {
        writer.put_chunk(hash, chunk).unwrap();
    }
    let manifest: Vec<u8> = hashes.concat();
    writer.put_manifest("session-1", &manifest).unwrap();

    let reader = open_fs(dir.path());
    let got = reader.get_manifest("session-1").unwrap();
    assert!(*got == *manifest);
    let keys: Vec<&[u8]> = got.chunks(8).collect();
    reader.prefetch_chunks(&keys).unwrap();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(*reader.get_chunk(key).unwrap() == **chunk);
    }
}

#[test]
fn prefetch_tolerates_missing_and_duplicate_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    store.put_chunk(&[1; 8], b"one").unwrap();
    store.prefetch_chunks(&[&[1; 8], &[2; 8], &[1; 8]]).unwrap();
    assert_eq!(&*store.get_chunk(&[1; 8]).unwrap(), b"one");
    assert!(store.get_chunk(&[2; 8]).is_err());
}

#[test]
fn trailing_slash_uri_opens_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let plain = open_fs(dir.path());
    plain.put_manifest("m", b"x").unwrap();
    let slashed = shim()
        .open_store(&format!("wasm://{}/", dir.path().display()))
        .expect("open with trailing slash");
    assert_eq!(&*slashed.get_manifest("m").unwrap(), b"x");
}

#[test]
fn open_creates_a_missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b/c");
    let store = open_fs(&nested);
    store.put_manifest("m", b"x").unwrap();
    assert_eq!(std::fs::read(nested.join("m")).unwrap(), b"x");
}
