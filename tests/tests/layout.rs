//! The fs guest's files are laid out exactly like llama.cpp's local store:
//! `<dir>/<name>` and `<dir>/chunks/<first hex digit>/<hex of hash>`.

use kvwasm_tests::{open_fs, pattern, xxh3_key};

#[test]
fn files_written_by_the_guest_match_the_llama_cpp_layout() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let mut expected = Vec::new();
    for i in 0..40u64 {
        let data = pattern(1000 + i as usize, i);
        let key = xxh3_key(&data);
        store.put_chunk(&key, &data).unwrap();
        expected.push((key, data));
    }
    let manifest: Vec<u8> = expected.iter().flat_map(|(k, _)| *k).collect();
    store.put_manifest("slot-0.bin", &manifest).unwrap();

    assert_eq!(
        std::fs::read(dir.path().join("slot-0.bin")).unwrap(),
        manifest
    );
    for (key, data) in &expected {
        let hex = hex::encode(key);
        let path = dir.path().join("chunks").join(&hex[..1]).join(&hex);
        assert_eq!(&std::fs::read(&path).unwrap(), data, "{}", path.display());
    }
    // Nothing but manifests and the chunk tree at the top; no temp files left.
    let mut top: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    top.sort();
    assert_eq!(top, ["chunks", "slot-0.bin"]);
    for fan in std::fs::read_dir(dir.path().join("chunks")).unwrap() {
        let fan = fan.unwrap();
        let name = fan.file_name().into_string().unwrap();
        assert!(
            name.len() == 1
                && name
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        for file in std::fs::read_dir(fan.path()).unwrap() {
            let file = file.unwrap().file_name().into_string().unwrap();
            assert!(
                file.starts_with(&name) && file.len() == 16,
                "unexpected {file}"
            );
        }
    }
}

#[test]
fn data_laid_out_by_another_program_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    // Write the store as llama.cpp's native local backend would.
    let chunk = pattern(5000, 99);
    let key = xxh3_key(&chunk);
    let hex = hex::encode(key);
    std::fs::create_dir_all(dir.path().join("chunks").join(&hex[..1])).unwrap();
    std::fs::write(dir.path().join("chunks").join(&hex[..1]).join(&hex), &chunk).unwrap();
    std::fs::write(dir.path().join("native-slot"), key).unwrap();
    // A 32-byte key (oMLX) in the same tree.
    let long_key = [0xC3u8; 32];
    let long_hex = hex::encode(long_key);
    std::fs::create_dir_all(dir.path().join("chunks/c")).unwrap();
    std::fs::write(dir.path().join("chunks/c").join(&long_hex), b"omlx").unwrap();

    let store = open_fs(dir.path());
    let manifest = store.get_manifest("native-slot").unwrap();
    assert_eq!(&*manifest, &key);
    assert_eq!(&*store.get_chunk(&manifest).unwrap(), chunk.as_slice());
    assert_eq!(&*store.get_chunk(&long_key).unwrap(), b"omlx");
    // An existing chunk is a dedup hit, not a rewrite.
    assert_eq!(store.put_chunk(&key, &chunk), Ok(true));
}

#[test]
fn a_truncated_chunk_left_by_a_crash_is_rewritten_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = pattern(4096, 5);
    let key = xxh3_key(&chunk);
    let hex = hex::encode(key);
    std::fs::create_dir_all(dir.path().join("chunks").join(&hex[..1])).unwrap();
    let path = dir.path().join("chunks").join(&hex[..1]).join(&hex);
    std::fs::write(&path, &chunk[..100]).unwrap();

    let store = open_fs(dir.path());
    assert_eq!(store.put_chunk(&key, &chunk), Ok(false));
    assert_eq!(std::fs::read(&path).unwrap(), chunk);
}

/// An instance keeps three descriptors open (the grant, the namespace
/// directory, `chunks`), however many fan-out directories its chunks went
/// to; for lookups the host keeps at most 16 directories open per store
/// (backend and namespace), shared by the store's instances (`KeptDirs`),
/// and, for the puts it answers itself, `chunks` and at most 16 fan-out
/// directories per store, shared by the store's handles (`FoundInPlace`).
/// 1,000 open handles must fit in a process's descriptor budget: three
/// handles on one store that each touched all 16 fan-out directories hold
/// 3 × 3 + 16 + 17 descriptors at most, not 3 × 36.
#[test]
fn an_instance_holds_three_descriptors_whatever_chunks_it_touched() {
    const HANDLES: usize = 3;
    const KEPT_PER_STORE: usize = 16 + 17;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let stores: Vec<_> = (0..HANDLES).map(|_| open_fs(&root)).collect();
    for (s, store) in stores.iter().enumerate() {
        let mut slots = std::collections::BTreeSet::new();
        for i in 0u64.. {
            let data = pattern(64, i + 1000 * s as u64);
            let key = xxh3_key(&data);
            store.put_chunk(&key, &data).unwrap();
            // A second put finds the chunk in place (a lookup beneath its
            // fan-out directory).
            assert_eq!(store.put_chunk(&key, &data), Ok(true));
            assert_eq!(store.get_chunk(&key).unwrap().as_slice(), &data[..]);
            slots.insert(hex::encode(key).remove(0));
            if slots.len() == 16 {
                break;
            }
        }
        store.put_manifest("m", b"all fan-out directories").unwrap();
    }
    // Descriptors of this process (other tests run in parallel) that point
    // into the store's directory.
    let held = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(&root))
        .count();
    assert!(
        held <= 3 * HANDLES + KEPT_PER_STORE,
        "{held} descriptors held into {}",
        root.display()
    );
}
