//! `kv_store_wasm_get_chunk_into`, the optional symbol beside the vtable:
//! a chunk read straight into the caller's buffer (the fs guest's chunks
//! are `pread` into it by the host, as `chunks_read_in_place` counts), the
//! right bytes and length, a buffer too small, a missing chunk, bad
//! arguments, many threads at once, a guest whose answer is not a file read
//! (copied in), and a hostile guest playing with the payload read into the
//! caller's buffer: keeping it past its call (from `open` too), reading
//! twice, dropping and reading again, answering with another, trapping.

use std::path::Path;
use std::ptr;
use std::sync::Arc;

use kv_store_abi::GetChunkIntoFn;
use kvwasm_host::config::Config;
use kvwasm_host::{Backend, ChunkInto, KvError, StoreHandle};
use kvwasm_tests::{Handle, open_fs, pattern, shim, xxh3_key};

fn into_fn() -> GetChunkIntoFn {
    shim()
        .get_chunk_into()
        .expect("libkv_store_wasm.so exports kv_store_wasm_get_chunk_into")
}

/// `get_chunk_into(store, hash, buf)`: the code and `*out_len`.
fn get_into(store: &Handle<'_>, hash: &[u8], buf: &mut [u8]) -> (i32, usize) {
    let mut len = usize::MAX;
    // SAFETY: live slices and an out-param.
    let rc = unsafe {
        into_fn()(
            store.as_ptr(),
            hash.as_ptr(),
            hash.len(),
            buf.as_mut_ptr(),
            buf.len(),
            &mut len,
        )
    };
    (rc, len)
}

#[test]
fn chunks_are_read_into_the_callers_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let chunks: Vec<Vec<u8>> = [0, 1, 4096, 255_000, (1 << 20) + 3]
        .iter()
        .enumerate()
        .map(|(i, &len)| pattern(len, i as u64))
        .collect();
    for c in &chunks {
        store.put_chunk(&xxh3_key(c), c).unwrap();
    }
    store.put_manifest("m", b"x").unwrap();
    let mut buf = vec![0xa5u8; (1 << 20) + 128];
    for round in 0..3 {
        for c in &chunks {
            // the exact size, and a larger buffer whose tail is left alone
            for cap in [c.len(), c.len() + 64] {
                buf.fill(0xa5);
                let (rc, len) = get_into(&store, &xxh3_key(c), &mut buf[..cap]);
                assert_eq!((rc, len), (0, c.len()), "round {round}, {} bytes", c.len());
                assert!(buf[..len] == c[..], "the bytes of a {}-byte chunk", c.len());
                assert!(
                    buf[len..].iter().all(|&b| b == 0xa5),
                    "bytes past the chunk"
                );
            }
            // the malloc'd get still works between them
            assert_eq!(&store.get_chunk(&xxh3_key(c)).unwrap()[..], &c[..]);
        }
    }
}

#[test]
fn a_buffer_too_small_is_refused_with_the_chunks_length() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let chunk = pattern(10_000, 7);
    store.put_chunk(&xxh3_key(&chunk), &chunk).unwrap();
    let mut buf = vec![0u8; 9_999];
    assert_eq!(get_into(&store, &xxh3_key(&chunk), &mut buf), (-10, 10_000));
    assert_eq!(get_into(&store, &xxh3_key(&chunk), &mut []), (-10, 10_000));
    // and the next call that fits is served
    let mut buf = vec![0u8; 10_000];
    assert_eq!(get_into(&store, &xxh3_key(&chunk), &mut buf), (0, 10_000));
    assert!(buf == chunk);
}

/// (`buf`'s contents after a miss are unspecified, as after any failure.)
#[test]
fn a_missing_chunk_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let mut buf = vec![0x11u8; 64];
    assert_eq!(
        get_into(&store, &[1, 2, 3, 4, 5, 6, 7, 8], &mut buf),
        (-2, 0)
    );
}

#[test]
fn bad_arguments_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let empty = Vec::new();
    store.put_chunk(&xxh3_key(&empty), &empty).unwrap();
    let f = into_fn();
    let h = store.as_ptr();
    let key = xxh3_key(&empty);
    let mut buf = [0u8; 16];
    let mut len = 99usize;
    // SAFETY: deliberately hostile calls; the shim must survive each.
    unsafe {
        let b = buf.as_mut_ptr();
        assert_eq!(
            f(h, key.as_ptr(), 8, b, 16, ptr::null_mut()),
            -10,
            "NULL out_len"
        );
        assert_eq!(f(h, key.as_ptr(), 8, ptr::null_mut(), 16, &mut len), -10);
        assert_eq!(len, 0, "NULL buffer with capacity 16");
        len = 99;
        assert_eq!(f(ptr::null_mut(), key.as_ptr(), 8, b, 16, &mut len), -10);
        assert_eq!(len, 0, "NULL handle");
        assert_eq!(
            f(0xdead_beef as *mut _, key.as_ptr(), 8, b, 16, &mut len),
            -10
        );
        assert_eq!(f(h, ptr::null(), 8, b, 16, &mut len), -10, "NULL hash");
        assert_eq!(f(h, key.as_ptr(), 0, b, 16, &mut len), -10, "hash_len 0");
        assert_eq!(
            f(h, [9u8; 65].as_ptr(), 65, b, 16, &mut len),
            -10,
            "hash_len 65"
        );
        // a capacity no buffer can have (past `PTRDIFF_MAX`, or running
        // past the end of the address space) is refused before any slice
        // is made of it
        for (b, cap, what) in [
            (b, usize::MAX, "capacity usize::MAX"),
            (b, isize::MAX as usize + 1, "capacity past isize::MAX"),
            (ptr::without_provenance_mut(usize::MAX - 8), 16, "wraps"),
        ] {
            len = 99;
            assert_eq!(f(h, key.as_ptr(), 8, b, cap, &mut len), -10, "{what}");
            assert_eq!(len, 0, "{what}");
        }
        // a NULL buffer of capacity 0 is fine for an empty chunk
        len = 99;
        assert_eq!(f(h, key.as_ptr(), 8, ptr::null_mut(), 0, &mut len), 0);
        assert_eq!(len, 0);
    }
    // the handle still serves
    assert_eq!(get_into(&store, &key, &mut buf), (0, 0));
}

#[test]
fn many_threads_read_into_their_own_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let chunks: Vec<Vec<u8>> = (0..32)
        .map(|i| pattern(50_000 + i * 977, i as u64))
        .collect();
    for c in &chunks {
        store.put_chunk(&xxh3_key(c), c).unwrap();
    }
    store.put_manifest("m", b"x").unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (store, chunks) = (&store, &chunks);
            s.spawn(move || {
                let mut buf = vec![0u8; 100_000];
                for i in 0..200 {
                    let c = &chunks[(i * 7 + t * 5) % chunks.len()];
                    let (rc, len) = get_into(store, &xxh3_key(c), &mut buf);
                    assert_eq!((rc, len), (0, c.len()));
                    assert!(buf[..len] == c[..], "thread {t}, call {i}");
                }
            });
        }
    });
}

#[test]
fn a_guest_that_does_not_read_files_has_its_answer_copied_in() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[backends.mem]\ncomponent = \"builtin:memory\"\n";
    let backend = Arc::new(
        Config::parse(text, dir.path())
            .unwrap()
            .backend("mem")
            .unwrap(),
    );
    let store = StoreHandle::open(backend, "").unwrap();
    let chunk = pattern(300_000, 3);
    store.put_chunk(b"key", &chunk).unwrap();
    let mut buf = vec![0u8; 300_001];
    assert_eq!(
        store.get_chunk_into(b"key", &mut buf).unwrap(),
        ChunkInto::Read(300_000)
    );
    assert!(buf[..300_000] == chunk[..]);
    assert_eq!(
        store.get_chunk_into(b"key", &mut buf[..299_999]).unwrap(),
        ChunkInto::TooSmall(300_000)
    );
    assert!(matches!(
        store.get_chunk_into(b"nope", &mut buf),
        Err(KvError::NotFound)
    ));
}

/// Backend `name` (its own, so its counters are this test's alone) of
/// `component` in process, its data in `dir/data`, and a handle on it.
fn in_process(dir: &Path, name: &str, component: &str) -> (Arc<Backend>, StoreHandle) {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let text = format!(
        "[backends.{name}]\ncomponent = {component:?}\ndir = \"data\"\ncall_timeout_ms = 30000\n"
    );
    let backend = Arc::new(Config::parse(&text, dir).unwrap().backend(name).unwrap());
    let store = StoreHandle::open(backend.clone(), "").unwrap();
    (backend, store)
}

/// The hostile test guest (see its module doc for the `get_chunk` modes),
/// with `files` in its `/data`.
fn hostile(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> (Arc<Backend>, StoreHandle) {
    let opened = in_process(dir, name, kvwasm_guest_artifacts::HOSTILE_PATH);
    for (file, bytes) in files {
        std::fs::write(dir.join("data").join(file), bytes).unwrap();
    }
    opened
}

fn in_place(backend: &Backend) -> u64 {
    backend.metrics.snapshot().chunks_read_in_place
}

/// The C code `kv_store_wasm_get_chunk_into` returns for `result`.
fn code(result: &Result<ChunkInto, KvError>) -> i32 {
    match result {
        Ok(ChunkInto::Read(_)) => 0,
        Ok(ChunkInto::TooSmall(_)) => -10,
        Err(e) => e.code(),
    }
}

#[test]
fn an_fs_chunk_is_read_in_place_not_into_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let (backend, store) = in_process(dir.path(), "into_fs_in_place", "builtin:fs");
    let chunk = pattern((4 << 20) + 3, 11);
    let key = xxh3_key(&chunk);
    store.put_chunk(&key, &chunk).unwrap();
    let mut buf = vec![0u8; chunk.len() + 5];
    for round in 1..=3 {
        buf.fill(0);
        assert_eq!(
            store.get_chunk_into(&key, &mut buf).unwrap(),
            ChunkInto::Read(chunk.len())
        );
        assert!(buf[..chunk.len()] == chunk[..], "round {round}");
        assert_eq!(in_place(&backend), round, "read straight into the buffer");
    }
    // a plain get reads into a block of its own
    assert_eq!(store.get_chunk(&key).unwrap().as_slice(), &chunk[..]);
    assert_eq!(in_place(&backend), 3);
    // and a buffer too small is not read into
    assert_eq!(
        store
            .get_chunk_into(&key, &mut buf[..chunk.len() - 1])
            .unwrap(),
        ChunkInto::TooSmall(chunk.len())
    );
    assert_eq!(in_place(&backend), 3);
}

#[test]
fn a_payload_kept_past_its_call_is_empty_and_cannot_be_returned() {
    let dir = tempfile::tempdir().unwrap();
    let a = pattern(3000, 21);
    let (backend, store) = hostile(dir.path(), "into_hostile_kept", &[("a", &a)]);
    // `a` is read into `first` and kept by the guest past the call
    let mut first = vec![0u8; 4096];
    assert_eq!(code(&store.get_chunk_into(b"keep:a", &mut first)), -2);
    // the caller reuses its buffer
    first.fill(0x5e);
    let mut second = vec![0u8; 4096];
    assert_eq!(
        store.get_chunk_into(b"peek", &mut second).unwrap(),
        ChunkInto::Read(0),
        "the guest sees nothing of a buffer lent to an earlier call"
    );
    let returned = store.get_chunk_into(b"kept", &mut second);
    assert_eq!(code(&returned), -7, "{returned:?}");
    assert_eq!(in_place(&backend), 0);
    // a fresh instance serves the next call, in place
    assert_eq!(
        store.get_chunk_into(b"read:a", &mut second).unwrap(),
        ChunkInto::Read(a.len())
    );
    assert!(second[..a.len()] == a[..]);
    assert_eq!(in_place(&backend), 1);
}

/// Instantiation and the guest's `open` run with the caller's buffer lent
/// too (a fresh instance starts inside the `get_chunk_into`): what `open`
/// read into it and kept is revoked when `open` ends, not handed back as
/// the answer of the get that follows.
#[test]
fn a_payload_kept_by_open_is_refused_by_the_get_that_follows() {
    let dir = tempfile::tempdir().unwrap();
    let a = pattern(3000, 22);
    let (backend, store) = hostile(dir.path(), "into_hostile_open", &[("a", &a)]);
    // lose the instance: the next call starts one, inside the get
    assert!(matches!(
        store.get_manifest("panic"),
        Err(KvError::Trapped(_))
    ));
    assert_eq!(store.live_instances(), 0);
    let keep_on_open = dir.path().join("data/keep-on-open");
    std::fs::write(&keep_on_open, "a").unwrap();
    let mut buf = vec![0u8; 4096];
    let returned = store.get_chunk_into(b"kept", &mut buf);
    assert_eq!(code(&returned), -7, "{returned:?}");
    assert_eq!(in_place(&backend), 0);
    std::fs::remove_file(&keep_on_open).unwrap();
    assert_eq!(
        store.get_chunk_into(b"read:a", &mut buf).unwrap(),
        ChunkInto::Read(a.len())
    );
    assert!(buf[..a.len()] == a[..]);
    assert_eq!(in_place(&backend), 1);
}

#[test]
fn reads_while_the_buffer_is_leased_go_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (pattern(3000, 23), pattern(2000, 24));
    let (backend, store) = hostile(dir.path(), "into_hostile_twice", &[("a", &a), ("b", &b)]);
    let mut buf = vec![0u8; 4096];
    // `b`, read while `a` holds the buffer, must not land on `a`
    assert_eq!(
        store.get_chunk_into(b"twice:a,b", &mut buf).unwrap(),
        ChunkInto::Read(a.len())
    );
    assert!(buf[..a.len()] == a[..]);
    assert_eq!(in_place(&backend), 1);
    // a payload dropped frees the buffer for the next read
    buf.fill(0);
    assert_eq!(
        store.get_chunk_into(b"reread:a,b", &mut buf).unwrap(),
        ChunkInto::Read(b.len())
    );
    assert!(buf[..b.len()] == b[..]);
    assert_eq!(in_place(&backend), 2);
}

#[test]
fn another_answer_than_the_payload_read_in_place_is_copied_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = pattern(3000, 25);
    let (backend, store) = hostile(dir.path(), "into_hostile_other", &[("a", &a)]);
    let mut buf = vec![0u8; 4096];
    // `a` is read into `buf` and kept; the answer is another payload
    assert_eq!(
        store.get_chunk_into(b"other:a", &mut buf).unwrap(),
        ChunkInto::Read(5)
    );
    assert_eq!(&buf[..5], b"other");
    assert_eq!(in_place(&backend), 0);
    // what the guest kept of `buf` is gone with the call
    buf.fill(0x5e);
    let mut next = vec![0u8; 4096];
    assert_eq!(
        store.get_chunk_into(b"peek", &mut next).unwrap(),
        ChunkInto::Read(0)
    );
}

#[test]
fn a_guest_that_traps_holding_the_payload_fails_and_the_next_get_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (pattern(3000, 26), pattern(2000, 27));
    let (backend, store) = hostile(dir.path(), "into_hostile_trap", &[("a", &a), ("b", &b)]);
    let mut buf = vec![0u8; 4096];
    let trapped = store.get_chunk_into(b"trap:a", &mut buf);
    assert_eq!(code(&trapped), -7, "{trapped:?}");
    assert_eq!(in_place(&backend), 0);
    assert_eq!(
        store.get_chunk_into(b"read:b", &mut buf).unwrap(),
        ChunkInto::Read(b.len())
    );
    assert!(buf[..b.len()] == b[..]);
    assert_eq!(in_place(&backend), 1);
}
