//! `kv_store_wasm_get_chunk_into`, the optional symbol beside the vtable:
//! a chunk read straight into the caller's buffer (the fs guest's chunks
//! are `pread` into it by the host), the right bytes and length, a buffer
//! too small, a missing chunk, bad arguments, many threads at once, and a
//! guest whose answer is not a file read (copied in).

use std::ptr;
use std::sync::Arc;

use kv_store_abi::GetChunkIntoFn;
use kvwasm_host::config::Config;
use kvwasm_host::{ChunkInto, StoreHandle};
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

#[test]
fn a_missing_chunk_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let mut buf = vec![0x11u8; 64];
    assert_eq!(
        get_into(&store, &[1, 2, 3, 4, 5, 6, 7, 8], &mut buf),
        (-2, 0)
    );
    assert!(buf.iter().all(|&b| b == 0x11), "a miss writes nothing");
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
        Err(kvwasm_host::KvError::NotFound)
    ));
}
