//! One handle from many threads; manifest atomicity against concurrent
//! readers.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kvwasm_tests::{open_fs, pattern, xxh3_key};

#[test]
fn eight_threads_of_mixed_operations_on_one_handle_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 60;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let store = &store;
            s.spawn(move || {
                for r in 0..ROUNDS {
                    // Every thread also writes one chunk all threads share.
                    let shared = pattern(2048, 424242);
                    assert!(store.put_chunk(&xxh3_key(&shared), &shared).is_ok());

                    let data = pattern(1000 + (r as usize * 37) % 9000, t * 1000 + r);
                    let key = xxh3_key(&data);
                    assert_eq!(
                        store.put_chunk(&key, &data),
                        Ok(false),
                        "thread {t} round {r}"
                    );
                    let name = format!("t{t}-r{r}");
                    store.put_manifest(&name, &key).unwrap();
                    assert_eq!(&*store.get_manifest(&name).unwrap(), &key);
                    assert!(*store.get_chunk(&key).unwrap() == *data);
                    if r % 3 == 0 {
                        store.delete_manifest(&name).unwrap();
                        assert!(store.get_manifest(&name).is_err());
                    }
                    store.prefetch_chunks(&[&key]).unwrap();
                }
            });
        }
    });
    // Everything written is still there, from a fresh handle.
    let reader = open_fs(dir.path());
    for t in 0..THREADS {
        for r in 0..ROUNDS {
            let data = pattern(1000 + (r as usize * 37) % 9000, t * 1000 + r);
            assert!(*reader.get_chunk(&xxh3_key(&data)).unwrap() == *data);
            let present = reader.get_manifest(&format!("t{t}-r{r}")).is_ok();
            assert_eq!(present, r % 3 != 0, "manifest t{t}-r{r}");
        }
    }
}

/// Two distinct values of different lengths; a torn read would mix them.
fn versions() -> [Vec<u8>; 2] {
    [vec![b'A'; 70_000], vec![b'B'; 130_000]]
}

fn hammer(writer: &kvwasm_tests::Handle<'_>, reader: &kvwasm_tests::Handle<'_>) {
    let [a, b] = versions();
    writer.put_manifest("contended", &a).unwrap();
    let done = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..2000 {
                let v = if i % 2 == 0 { &b } else { &a };
                writer.put_manifest("contended", v).unwrap();
            }
            done.store(true, Ordering::Release);
        });
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                let got = reader
                    .get_manifest("contended")
                    .expect("never missing mid-replace");
                assert!(
                    *got == *a || *got == *b,
                    "torn manifest of {} bytes",
                    got.len()
                );
                reads.fetch_add(1, Ordering::Relaxed);
            }
        });
    });
    assert!(reads.load(Ordering::Relaxed) > 100, "reader barely ran");
}

#[test]
fn manifest_replacement_is_atomic_for_a_reader_on_another_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, reader) = (open_fs(dir.path()), open_fs(dir.path()));
    hammer(&writer, &reader);
}

#[test]
fn manifest_replacement_is_atomic_for_a_reader_on_the_same_handle() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    hammer(&store, &store);
}
