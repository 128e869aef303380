//! One handle served by several guest instances: concurrent calls spread
//! over the pool, and `put_manifest` still makes every chunk put through the
//! handle, in any instance, visible before the manifest.

use std::sync::Arc;

use kvwasm_host::config::Config;
use kvwasm_host::{Backend, StoreHandle};

fn buffered_backend(dir: &std::path::Path, max_instances: usize) -> Arc<Backend> {
    let text = format!(
        "[backends.buffered]\ncomponent = {:?}\ndir = \"data\"\nmax_instances = {max_instances}\n",
        kvwasm_guest_artifacts::BUFFERED_PATH
    );
    let config = Config::parse(&text, dir).unwrap();
    Arc::new(config.backend("buffered").unwrap())
}

#[test]
fn put_manifest_flushes_chunks_buffered_in_other_instances() {
    let dir = tempfile::tempdir().unwrap();
    let backend = buffered_backend(dir.path(), 4);
    let writer = StoreHandle::open(backend.clone(), "").unwrap();
    let chunks: Vec<(Vec<u8>, Vec<u8>)> = (0..16u8)
        .map(|i| (vec![i; 8], vec![i; 1000 + i as usize]))
        .collect();

    // Over four instances: while the instances that took earlier parts
    // are held, the next part needs another one (threads that happen to
    // overlap do not guarantee this).
    let mut held = Vec::new();
    for part in chunks.chunks(4) {
        for (hash, data) in part {
            assert!(!writer.put_chunk(hash, data).unwrap(), "fresh chunk stored");
        }
        held.push(writer.hold_instance().unwrap());
    }
    assert_eq!(
        writer.live_instances(),
        4,
        "puts should use several instances"
    );
    drop(held);

    // Nothing is visible yet: every instance still buffers its chunks.
    let reader = StoreHandle::open(backend, "").unwrap();
    assert!(reader.get_chunk(&chunks[0].0).is_err());

    writer.put_manifest("m", b"all sixteen").unwrap();
    for (hash, data) in &chunks {
        assert_eq!(
            reader.get_chunk(hash).unwrap().as_slice(),
            data.as_slice(),
            "chunk {hash:?}"
        );
    }
}

#[test]
fn a_backend_without_shared_state_gets_one_instance() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[backends.mem]\ncomponent = \"builtin:memory\"\nmax_instances = 4\n";
    let backend = Arc::new(
        Config::parse(text, dir.path())
            .unwrap()
            .backend("mem")
            .unwrap(),
    );
    let store = StoreHandle::open(backend, "").unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let store = &store;
            s.spawn(move || {
                for i in 0..50u8 {
                    store.put_chunk(&[t, i], &[t, i, 1]).unwrap();
                }
            });
        }
    });
    assert_eq!(store.live_instances(), 1);
    // All 200 chunks are in the one instance.
    for t in 0..4u8 {
        for i in 0..50u8 {
            assert_eq!(store.get_chunk(&[t, i]).unwrap().as_slice(), &[t, i, 1]);
        }
    }
}

#[test]
fn in_memory_handles_share_a_store_per_namespace_until_the_last_closes() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(
        "[backends.mem]\ncomponent = \"builtin:memory\"\n",
        dir.path(),
    )
    .unwrap();
    let backend = Arc::new(config.backend("mem").unwrap());
    let open = |ns: &str| kvwasm_host::handle::open_shared(backend.clone(), ns).unwrap();

    let (a, b, other) = (open("tenant"), open("tenant"), open("other"));
    assert!(!a.put_chunk(b"k", b"v").unwrap());
    a.put_manifest("m", b"k").unwrap();
    assert_eq!(
        b.get_manifest("m").unwrap().as_slice(),
        b"k",
        "second handle sees it"
    );
    assert!(b.put_chunk(b"k", b"v").unwrap(), "and counts it as present");
    assert!(other.get_manifest("m").is_err(), "other namespaces do not");

    drop((a, b));
    assert!(
        open("tenant").get_manifest("m").is_err(),
        "gone with the last handle"
    );
}

/// Item 8 of the hardening issue: an instance holding unflushed chunks
/// traps while another thread's `put_manifest` waits to flush it. The
/// manifest must not be published naming the lost chunk. Repeated, so a
/// regression shows.
#[test]
fn a_manifest_is_never_published_over_chunks_lost_in_a_trap() {
    // Five rounds where the trap came first. On a busy machine the manifest
    // may run before the trapping get took the instance: it then flushes the
    // chunk and publishes, rightly, and the round is tried again.
    let (mut rounds, mut attempts) = (0, 0);
    while rounds < 5 {
        attempts += 1;
        assert!(
            attempts <= 50,
            "the trap never came first: machine too busy"
        );
        let dir = tempfile::tempdir().unwrap();
        let backend = buffered_backend(dir.path(), 4);
        let handle = StoreHandle::open(backend.clone(), "").unwrap();
        // The chunk lands, unflushed, in the one instance there is.
        assert!(!handle.put_chunk(b"chunk-1", b"payload").unwrap());
        assert_eq!(handle.live_instances(), 1);
        let published = std::thread::scope(|s| {
            // That instance sleeps in a get, then traps.
            let trap = s.spawn(|| handle.get_chunk(b"sleep-then-trap"));
            std::thread::sleep(std::time::Duration::from_millis(100));
            // Meanwhile the manifest waits for it, to flush it.
            let published = handle.put_manifest("m", b"names chunk-1");
            assert!(trap.join().unwrap().is_err());
            published
        });
        let reader = StoreHandle::open(backend, "").unwrap();
        if published.is_ok() {
            // Published: only right if the chunk it names was flushed.
            let named = reader.get_chunk(b"chunk-1").map(|b| b.as_slice().to_vec());
            assert!(
                matches!(&named, Ok(bytes) if bytes == b"payload"),
                "round {rounds}: a manifest was published naming a chunk lost in a trap: \
                 {named:?}"
            );
            continue;
        }
        rounds += 1;
        assert!(reader.get_manifest("m").is_err(), "round {rounds}");
        // Put again, the save succeeds.
        assert!(!handle.put_chunk(b"chunk-1", b"payload").unwrap());
        handle.put_manifest("m", b"names chunk-1").unwrap();
        assert_eq!(reader.get_chunk(b"chunk-1").unwrap().as_slice(), b"payload");
    }
}
