//! Idle instances are released after `idle_release_ms` and started again on
//! the next call (issue 17: an idle handle must not keep a guest instance),
//! but never while they hold unflushed puts, and never for a backend whose
//! data lives in its instance.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvwasm_host::{Backend, KvError, StoreHandle};
use kvwasm_tests::idle::{releasing_after, wait_for_release};

/// Release time in these tests: short, so a test waits well under a second.
const RELEASE_MS: u64 = 30;
/// Long enough for several reaper passes past `RELEASE_MS` on a loaded
/// machine, had the instance been releasable.
const WELL_PAST_RELEASE: Duration = Duration::from_millis(400);

/// Backend `name` of `component`, released after `RELEASE_MS`. Each test
/// names its own backend: metrics are per name.
fn backend(dir: &std::path::Path, name: &str, component: &str) -> Arc<Backend> {
    releasing_after(dir, name, component, RELEASE_MS)
}

#[test]
fn a_released_instance_is_started_again_and_reads_what_was_written_before() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), "idle_fs", "builtin:fs");
    let handle = StoreHandle::open(backend.clone(), "tenant/ns").unwrap();
    assert!(!handle.put_chunk(b"chunk-1", b"payload").unwrap());
    handle.put_manifest("m", b"names chunk-1").unwrap();
    let before = backend.metrics.snapshot();

    wait_for_release(&handle);
    assert_eq!(backend.metrics.snapshot().instances_released, 1);
    assert!(
        kvwasm_host::metrics::prometheus_text()
            .contains("kvwasm_instances_released_total{backend=\"idle_fs\"} 1\n")
    );

    // (A stalled test thread may see the new instance released again
    // between calls: the counts below allow for it.)
    assert_eq!(handle.get_chunk(b"chunk-1").unwrap().as_slice(), b"payload");
    assert_eq!(
        handle.get_manifest("m").unwrap().as_slice(),
        b"names chunk-1"
    );
    let after = backend.metrics.snapshot();
    assert!(after.instances_restarted >= 1, "{after:?}");
    assert!(after.instances_restarted <= after.instances_released);
    assert_eq!((after.calls - before.calls, after.errors), (2, 0));

    // Released again once idle, and again served.
    wait_for_release(&handle);
    assert!(handle.put_chunk(b"chunk-1", b"payload").unwrap(), "present");
    assert_eq!(handle.get_chunk(b"chunk-1").unwrap().as_slice(), b"payload");
    let last = backend.metrics.snapshot();
    assert!(last.instances_released >= 2 && last.instances_restarted >= 2);
}

#[test]
fn an_instance_holding_unflushed_puts_is_not_released_before_its_flush() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(
        dir.path(),
        "idle_buffered",
        kvwasm_guest_artifacts::BUFFERED_PATH,
    );
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    // The buffered guest keeps this chunk in instance memory until a flush:
    // releasing its instance now would drop it unnoticed.
    assert!(!handle.put_chunk(b"chunk-1", b"payload").unwrap());
    std::thread::sleep(WELL_PAST_RELEASE);
    assert_eq!(handle.live_instances(), 1);
    assert_eq!(backend.metrics.snapshot().instances_released, 0);

    handle.put_manifest("m", b"names chunk-1").unwrap();
    let reader = StoreHandle::open(backend.clone(), "").unwrap();
    assert_eq!(reader.get_chunk(b"chunk-1").unwrap().as_slice(), b"payload");
    // Flushed, the idle instance may go.
    wait_for_release(&handle);
}

#[test]
fn idle_release_ms_0_keeps_idle_instances() {
    let dir = tempfile::tempdir().unwrap();
    let backend = releasing_after(dir.path(), "idle_never", "builtin:fs", 0);
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    handle.put_manifest("m", b"nothing").unwrap();
    std::thread::sleep(WELL_PAST_RELEASE);
    assert_eq!(handle.live_instances(), 1);
    assert_eq!(backend.metrics.snapshot().instances_released, 0);
}

#[test]
fn a_backend_whose_data_lives_in_its_instance_is_never_released() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), "idle_memory", "builtin:memory");
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    assert!(!handle.put_chunk(b"chunk-1", b"payload").unwrap());
    handle.put_manifest("m", b"names chunk-1").unwrap();
    std::thread::sleep(WELL_PAST_RELEASE);
    assert_eq!(handle.live_instances(), 1);
    assert_eq!(backend.metrics.snapshot().instances_released, 0);
    assert_eq!(handle.get_chunk(b"chunk-1").unwrap().as_slice(), b"payload");
}

#[test]
fn a_guest_that_traps_after_a_restart_costs_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(
        dir.path(),
        "idle_hostile",
        kvwasm_guest_artifacts::HOSTILE_PATH,
    );
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    let ping = || handle.get_manifest("ping").map(|b| b.as_slice().to_vec());
    assert_eq!(ping().unwrap(), b"pong");
    wait_for_release(&handle);

    // The restarted instance traps on its first call; the next call gets a
    // fresh one.
    assert!(matches!(
        handle.get_manifest("panic"),
        Err(KvError::Trapped(_))
    ));
    assert_eq!(handle.live_instances(), 0);
    assert_eq!(ping().unwrap(), b"pong");
    let counters = backend.metrics.snapshot();
    assert_eq!((counters.traps, counters.errors), (1, 1));
    assert_eq!(counters.instances_restarted, 1);
}

/// Releasing runs no guest code: a destructor that blocks (here for longer
/// than the call deadline) cannot hold up the release of another backend's
/// idle instances, which the one release thread looks after in turn.
#[test]
fn a_slow_destructor_does_not_hold_up_other_releases() {
    let dir = tempfile::tempdir().unwrap();
    // A call deadline of 60 s, far from what a release takes even on a
    // loaded machine, so the bound below tells the two apart.
    let text = format!(
        "[backends.idle_slowclose]\ncomponent = {:?}\ndir = \"data\"\n\
         idle_release_ms = {RELEASE_MS}\ncall_timeout_ms = 60000\n",
        kvwasm_guest_artifacts::HOSTILE_PATH
    );
    let hostile = kvwasm_host::config::Config::parse(&text, dir.path())
        .unwrap()
        .backend("idle_slowclose")
        .unwrap();
    let slow = StoreHandle::open(Arc::new(hostile), "").unwrap();
    let fs = backend(dir.path(), "idle_after_slowclose", "builtin:fs");
    let other = StoreHandle::open(fs, "tenant/ns").unwrap();
    slow.get_manifest("slowclose:120000").unwrap();
    other.get_manifest("missing").unwrap_err();
    let idle_since = Instant::now();

    wait_for_release(&slow);
    wait_for_release(&other);
    // Before, the hostile destructor ran on the release thread until the
    // 60 s call deadline, and the other instance waited behind it.
    assert!(
        idle_since.elapsed() < Duration::from_secs(20),
        "released after {:?}",
        idle_since.elapsed()
    );
}

/// Issue 37: what the host made durable outlives the instance that asked.
/// A warm save after an idle release finds every chunk in place, and the
/// host syncs none of them (nor their directories) again: they are
/// unchanged since it synced them. Before, each new instance synced every
/// chunk it found once more (an `fdatasync` each on a disk). The host
/// answers those puts itself (no guest instance, no `find-file`), so the
/// manifest's instance has nothing to sync or check.
#[test]
fn a_warm_save_after_an_idle_release_syncs_nothing_the_host_synced_before() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), "idle_fs_sync", "builtin:fs");
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    let chunks: Vec<Vec<u8>> = (0..24).map(|i| kvwasm_tests::pattern(2048, i)).collect();
    for chunk in &chunks {
        assert!(
            !handle
                .put_chunk(&kvwasm_tests::xxh3_key(chunk), chunk)
                .unwrap()
        );
    }
    // So that the cold save's syncs are remembered, whenever they happen.
    kvwasm_tests::wait_past_change_times(dir.path());
    handle.put_manifest("slot", b"names them").unwrap();
    let cold = backend.metrics.snapshot();
    assert!(cold.syncs > 24, "24 chunks, their directories: {cold:?}");

    wait_for_release(&handle);
    for chunk in &chunks {
        assert!(
            handle
                .put_chunk(&kvwasm_tests::xxh3_key(chunk), chunk)
                .unwrap()
        );
    }
    handle.put_manifest("slot", b"names them").unwrap();
    let warm = backend.metrics.snapshot();
    assert!(warm.instances_restarted >= 1, "{warm:?}");
    assert_eq!(warm.syncs, cold.syncs, "nothing synced again: {warm:?}");
    assert_eq!(
        (
            warm.puts_found_in_place - cold.puts_found_in_place,
            warm.syncs_skipped - cold.syncs_skipped
        ),
        (24, 0),
        "every chunk found durable in place by the host; the guest saw none"
    );
}

/// Issue 37: after a save and an idle release, a warm save of the same
/// chunks gets "already present" for each from the host and starts no
/// guest instance until its manifest. A chunk another process rewrote in
/// between (same bytes, a new change time) is not the version the host
/// synced: its put goes to the guest, which syncs it before the manifest.
#[test]
fn a_warm_save_after_an_idle_release_starts_an_instance_only_for_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), "idle_fs_in_place", "builtin:fs");
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    let chunks: Vec<Vec<u8>> = (0..24)
        .map(|i| kvwasm_tests::pattern(2048, 100 + i))
        .collect();
    let keys: Vec<_> = chunks.iter().map(|c| kvwasm_tests::xxh3_key(c)).collect();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(!handle.put_chunk(key, chunk).unwrap(), "stored");
    }
    kvwasm_tests::wait_past_change_times(dir.path());
    handle.put_manifest("slot", b"names them").unwrap();

    // Warm, after an idle release: no instance until the manifest.
    wait_for_release(&handle);
    let before = backend.metrics.snapshot();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(handle.put_chunk(key, chunk).unwrap(), "already present");
    }
    let puts = backend.metrics.snapshot();
    assert_eq!(handle.live_instances(), 0);
    assert_eq!(
        (
            puts.puts_found_in_place - before.puts_found_in_place,
            puts.instances_restarted - before.instances_restarted,
            puts.calls - before.calls,
        ),
        (24, 0, 24),
        "every put answered by the host: {puts:?}"
    );
    handle.put_manifest("slot", b"names them").unwrap();
    let saved = backend.metrics.snapshot();
    assert_eq!(saved.instances_restarted - before.instances_restarted, 1);
    assert_eq!(saved.syncs, before.syncs, "nothing to sync");

    // Another process rewrites one chunk in place, same bytes.
    wait_for_release(&handle);
    let name = hex::encode(keys[0]);
    let file = dir.path().join("data/chunks").join(&name[..1]).join(&name);
    std::fs::write(&file, &chunks[0]).unwrap();
    let before = backend.metrics.snapshot();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(handle.put_chunk(key, chunk).unwrap(), "already present");
    }
    let puts = backend.metrics.snapshot();
    assert_eq!(
        (
            puts.puts_found_in_place - before.puts_found_in_place,
            puts.instances_restarted - before.instances_restarted,
        ),
        (23, 1),
        "the rewritten chunk went to the guest: {puts:?}"
    );
    handle.put_manifest("slot", b"names them").unwrap();
    let saved = backend.metrics.snapshot();
    assert_eq!(
        (
            saved.syncs - before.syncs,
            saved.instances_restarted - before.instances_restarted
        ),
        (1, 1),
        "the rewritten file synced before the manifest, on the put's instance"
    );
}

/// Put `count` new 2 KiB chunks (patterns from `seed`) through `handle`,
/// wait until their syncs can be remembered, and publish a manifest over
/// them: a cold save. Returns the keys and chunks, for the warm saves.
fn cold_save(
    handle: &StoreHandle,
    dir: &std::path::Path,
    count: u64,
    seed: u64,
) -> (Vec<[u8; 8]>, Vec<Vec<u8>>) {
    let chunks: Vec<Vec<u8>> = (0..count)
        .map(|i| kvwasm_tests::pattern(2048, seed + i))
        .collect();
    let keys: Vec<_> = chunks.iter().map(|c| kvwasm_tests::xxh3_key(c)).collect();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(!handle.put_chunk(key, chunk).unwrap(), "stored");
    }
    kvwasm_tests::wait_past_change_times(dir);
    handle.put_manifest("slot", b"names them").unwrap();
    (keys, chunks)
}

/// Descriptors of this process open on `dir` or beneath it.
fn held_beneath(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// An idle handle keeps nothing open beneath its store: the directories
/// the host keeps for the puts it answers close when the handle's
/// instances are all released, as the guest's descriptors do.
#[test]
fn an_idle_release_closes_what_the_host_kept_open_beneath_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let backend = backend(dir.path(), "idle_fs_closes", "builtin:fs");
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    let (keys, chunks) = cold_save(&handle, dir.path(), 8, 300);
    let before = backend.metrics.snapshot();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(handle.put_chunk(key, chunk).unwrap());
    }
    let answered = backend.metrics.snapshot().puts_found_in_place - before.puts_found_in_place;
    assert_eq!(
        answered, 8,
        "answered by the host, through kept directories"
    );
    let data = dir.path().join("data").canonicalize().unwrap();
    assert!(held_beneath(&data.join("chunks")) > 0, "`chunks` kept open");

    wait_for_release(&handle);
    // Closed by the release thread right after the instances go.
    wait_until_none_held_beneath(&data);
    // And opened again by the next lookup.
    assert!(handle.put_chunk(&keys[0], &chunks[0]).unwrap());
    assert_eq!(
        backend.metrics.snapshot().puts_found_in_place - before.puts_found_in_place,
        9
    );
}

/// A `builtin:fs` backend (`name`) releasing idle instances after
/// `RELEASE_MS`, with the default `warm_handles` (1 for builtin:fs), and
/// a deadline no busy machine reaches.
fn fs_with_default_warm_handles(dir: &std::path::Path, name: &str) -> Arc<Backend> {
    let text = format!(
        "[backends.{name}]\ncomponent = \"builtin:fs\"\ndir = \"data\"\n\
         idle_release_ms = {RELEASE_MS}\ncall_timeout_ms = 60000\n"
    );
    let config = kvwasm_host::config::Config::parse(&text, dir).unwrap();
    Arc::new(config.backend(name).unwrap())
}

/// Issue 37: a long-lived store's handle (the only one on its backend, so
/// the most recently used) keeps its instance through idle release, so a
/// warm save after any pause starts nothing and syncs nothing.
#[test]
fn a_warm_save_after_a_long_idle_starts_no_instance() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_with_default_warm_handles(dir.path(), "idle_fs_warm");
    assert_eq!(backend.warm_handles, 1, "builtin:fs keeps one warm handle");
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    // 1 MiB chunks too: the instance that stays is one that has moved them.
    let chunks: Vec<Vec<u8>> = (0..20)
        .map(|i| kvwasm_tests::pattern(if i < 4 { 1 << 20 } else { 2048 }, 500 + i))
        .collect();
    let keys: Vec<_> = chunks.iter().map(|c| kvwasm_tests::xxh3_key(c)).collect();
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(!handle.put_chunk(key, chunk).unwrap(), "stored");
    }
    kvwasm_tests::wait_past_change_times(dir.path());
    handle.put_manifest("slot", b"names them").unwrap();

    std::thread::sleep(WELL_PAST_RELEASE);
    let before = backend.metrics.snapshot();
    assert_eq!(handle.live_instances(), 1, "kept warm");
    assert_eq!(before.instances_released, 0);
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(handle.put_chunk(key, chunk).unwrap(), "already present");
    }
    handle.put_manifest("slot", b"names them").unwrap();
    let saved = backend.metrics.snapshot();
    assert_eq!(
        (
            saved.puts_found_in_place - before.puts_found_in_place,
            saved.instances_restarted - before.instances_restarted,
            saved.syncs - before.syncs,
        ),
        (20, 0, 0),
        "every put answered by the host, the manifest by the warm instance: {saved:?}"
    );
}

/// The warm handle's instance and the directories the host keeps for it
/// stay open while it idles (an operator who needs the filesystem
/// unmountable when idle sets `warm_handles = 0`), and close with it.
#[test]
fn a_warm_handle_keeps_its_store_directories_open_until_it_closes() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_with_default_warm_handles(dir.path(), "idle_fs_warm_dirs");
    let handle = StoreHandle::open(backend.clone(), "").unwrap();
    let (keys, chunks) = cold_save(&handle, dir.path(), 8, 600);
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(handle.put_chunk(key, chunk).unwrap());
    }
    let data = dir.path().join("data").canonicalize().unwrap();
    std::thread::sleep(WELL_PAST_RELEASE);
    assert_eq!(handle.live_instances(), 1, "kept warm");
    assert!(
        held_beneath(&data.join("chunks")) > 0,
        "`chunks` still kept open"
    );

    drop(handle);
    wait_until_none_held_beneath(&data);
}

/// Wait until this process holds nothing open beneath `dir` (up to a
/// minute).
fn wait_until_none_held_beneath(dir: &std::path::Path) {
    let start = Instant::now();
    while held_beneath(dir) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} descriptors still open beneath {}",
            held_beneath(dir),
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A warm handle's instance holds descriptors on the directories it
/// opened. A store replaced after its last call (an operator clearing the
/// cache by moving it away), before or after the instance was kept, is
/// not written through them: the instance is not kept, or not used again,
/// and a new one starts on the new store, as after a release; a new
/// handle reads what was saved.
#[test]
fn a_warm_instance_is_not_used_once_its_store_was_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_with_default_warm_handles(dir.path(), "idle_fs_warm_moved");
    let handle = StoreHandle::open(backend.clone(), "team").unwrap();
    let (keys, chunks) = cold_save(&handle, dir.path(), 4, 700);
    let data = dir.path().join("data");
    std::fs::rename(&data, dir.path().join("moved-away")).unwrap();
    std::fs::create_dir(&data).unwrap();
    std::thread::sleep(WELL_PAST_RELEASE);

    for (key, chunk) in keys.iter().zip(&chunks) {
        assert!(!handle.put_chunk(key, chunk).unwrap(), "stored afresh");
    }
    handle.put_manifest("slot", b"names them").unwrap();
    let saved = backend.metrics.snapshot();
    assert_eq!(
        (saved.instances_released, saved.instances_restarted),
        (1, 1),
        "the instance went, a new one took its place: {saved:?}"
    );

    let reader = StoreHandle::open(backend, "team").unwrap();
    assert_eq!(
        reader.get_manifest("slot").unwrap().as_slice(),
        b"names them"
    );
    for (key, chunk) in keys.iter().zip(&chunks) {
        assert_eq!(reader.get_chunk(key).unwrap().as_slice(), &chunk[..]);
    }
}

/// Handles on one store share the directories the host keeps open for
/// it: a sibling's release at idle leaves them open for the warm handle,
/// whose puts go on being answered through them.
#[test]
fn a_sibling_released_at_idle_leaves_the_warm_handles_directories_open() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_with_default_warm_handles(dir.path(), "idle_fs_warm_sibling");
    // Written by a third handle, closed since: no guest instance below
    // holds a fan-out directory, only the host does.
    let writer = StoreHandle::open(backend.clone(), "").unwrap();
    let (keys, chunks) = cold_save(&writer, dir.path(), 8, 800);
    drop(writer);
    let before = backend.metrics.snapshot();
    // Opened first: should both be last used in one tick, it still ranks
    // first, so the sibling is the one released in any case.
    let warm = StoreHandle::open(backend.clone(), "").unwrap();
    let sibling = StoreHandle::open(backend.clone(), "").unwrap();
    for handle in [&sibling, &warm] {
        for (key, chunk) in keys.iter().zip(&chunks) {
            assert!(handle.put_chunk(key, chunk).unwrap());
        }
        handle.put_manifest("slot", b"names them").unwrap();
    }
    assert_eq!(
        backend.metrics.snapshot().puts_found_in_place - before.puts_found_in_place,
        16,
        "answered through the kept directories"
    );
    let chunks_dir = dir.path().join("data/chunks").canonicalize().unwrap();
    assert!(
        held_strictly_beneath(&chunks_dir) > 0,
        "fan-out directories kept"
    );

    wait_for_release(&sibling);
    assert_eq!(warm.live_instances(), 1, "kept warm");
    assert!(
        held_strictly_beneath(&chunks_dir) > 0,
        "the fan-out directories the host kept were closed by the sibling's release"
    );
    drop(warm);
    drop(sibling);
    wait_until_none_held_beneath(&chunks_dir);
}

/// Descriptors of this process open on directories beneath `dir` (the
/// host's kept fan-out directories; the guest keeps none of them).
fn held_strictly_beneath(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir) && target != dir)
        .count()
}

/// Every `wasm:///dir` store is backend `builtin:fs`, and backends of one
/// name in two configs share it too: warm handles are ranked per backend
/// and directory, so two stores in two directories each keep theirs, while
/// an older handle on each is released.
#[test]
fn stores_in_two_directories_each_keep_a_warm_handle() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let pairs: Vec<(StoreHandle, StoreHandle)> = [&one, &two]
        .iter()
        .map(|dir| {
            let backend = fs_with_default_warm_handles(dir.path(), "idle_fs_warm_two_dirs");
            // Opened first, used last: it ranks first in its directory
            // even should both be last used in one tick.
            let newer = StoreHandle::open(backend.clone(), "").unwrap();
            let older = StoreHandle::open(backend, "").unwrap();
            older.put_manifest("slot", b"saved").unwrap();
            newer.put_manifest("slot", b"saved").unwrap();
            (newer, older)
        })
        .collect();
    for (_, older) in &pairs {
        wait_for_release(older);
    }
    let live: Vec<usize> = pairs
        .iter()
        .map(|(newer, _)| newer.live_instances())
        .collect();
    assert_eq!(live, [1, 1], "each directory's newer handle kept warm");
}

/// A warm handle keeps an instance only while it is small: one that grew
/// past 16 MiB (a prefetch of 300,000 names, lowered into its memory)
/// gives its memory back at idle like any other.
#[test]
fn a_warm_handles_instance_that_grew_past_16_mib_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let backend = fs_with_default_warm_handles(dir.path(), "idle_fs_warm_big");
    let handle = StoreHandle::open(backend, "").unwrap();
    let hashes: Vec<Vec<u8>> = (0..300_000u64).map(|i| i.to_le_bytes().repeat(8)).collect();
    handle.prefetch_chunks(&hashes).unwrap();
    wait_for_release(&handle);
}
