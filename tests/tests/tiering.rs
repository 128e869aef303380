//! Tiered stores (issue 15, docs/tiering.md), in process: a shared-prompt
//! workload against a hot tier holding 30% of the data, advice that would
//! lose data or storm refused, and the index rebuilt after a restart.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvwasm_host::tiering::{
    Action, Advice, AdviceSink, MAX_ADVISED_HASHES, TieredStore, open_tiered,
};
use kvwasm_host::{KvError, StoreHandle};
use kvwasm_tests::servers::S3Server;
use kvwasm_tests::tiered::{config, fs_chunk_usage, fs_cold, s3_cold};
use kvwasm_tests::{pattern, xxh3_key};

const MIB: u64 = 1 << 20;

fn tiers(handle: &StoreHandle) -> &Arc<TieredStore> {
    handle.tiered().expect("a tiered store")
}

/// A session of the shared-prompt workload: the prompt's chunks (the same
/// in every session) then its own.
fn session(index: u64, prompt: u64, own: u64, len: usize) -> Vec<Vec<u8>> {
    (0..prompt)
        .map(|c| pattern(len, c))
        .chain((0..own).map(|c| pattern(len, 1_000_000 * (index + 1) + c)))
        .collect()
}

/// The manifest: the chunks' keys, in order.
fn manifest(chunks: &[Vec<u8>]) -> Vec<u8> {
    chunks.iter().flat_map(|c| xxh3_key(c)).collect()
}

/// Restore every session: its manifest names its chunks, and each reads
/// back byte for byte.
fn restore_all(store: &StoreHandle, sessions: &[Vec<Vec<u8>>]) {
    for (s, chunks) in sessions.iter().enumerate() {
        let keys = store.get_manifest(&format!("session-{s}")).unwrap();
        assert_eq!(keys.as_slice(), manifest(chunks).as_slice());
        for chunk in chunks {
            let got = store.get_chunk(&xxh3_key(chunk)).unwrap();
            assert!(
                got.as_slice() == chunk.as_slice(),
                "session {s}: bytes differ"
            );
        }
    }
}

/// 10 sessions sharing a 16-chunk prompt, 24 own chunks each, 120 KiB
/// chunks: 256 distinct chunks, 30 MiB; the hot tier holds 9 MiB (30%),
/// the cold one is S3. While they save (and the background demoter runs
/// every 5 ms) the hot tier's directory never holds more than its
/// capacity, and every restore reads back every chunk its manifest names,
/// byte for byte.
#[test]
fn a_shared_prompt_workload_keeps_the_hot_tier_within_capacity_and_misses_nothing() {
    const LEN: usize = 120 << 10;
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let (cold, env) = s3_cold(&server);
    for (key, value) in &env {
        // SAFETY: set before any thread of this test reads the environment;
        // every test in this file that touches S3 sets the same values.
        unsafe { std::env::set_var(key, value) };
    }
    let path = config(
        dir.path(),
        9,
        &cold,
        "low_water_pct = 60\ndemote_interval_ms = 5\n",
    );
    let store = open_tiered(&path, "kv", "shared").unwrap();
    let hot_root = dir.path().join("hot/shared");
    // What the hot tier really holds, looked at after every put: this
    // thread is its only writer, and the demoter running meanwhile only
    // removes, so a listing never overstates it.
    let mut peak = 0;
    let sessions: Vec<Vec<Vec<u8>>> = (0..10).map(|s| session(s, 16, 24, LEN)).collect();
    for (s, chunks) in sessions.iter().enumerate() {
        for chunk in chunks {
            store.put_chunk(&xxh3_key(chunk), chunk).unwrap();
            let hot = &tiers(&store).usage()[0];
            assert!(hot.used_bytes <= 9 * MIB, "{hot:?}");
            let (on_disk, _) = fs_chunk_usage(&hot_root);
            assert!(on_disk <= 9 * MIB, "{on_disk} bytes in the hot tier");
            peak = peak.max(on_disk);
        }
        store
            .put_manifest(&format!("session-{s}"), &manifest(chunks))
            .unwrap();
    }
    // Restore every session twice, the prompt's chunks read by all.
    for _ in 0..2 {
        restore_all(&store, &sessions);
    }
    let status = tiers(&store).status();
    eprintln!("peak hot bytes {peak} of {}; {status:?}", 9 * MIB);
    assert!(peak > 8 * MIB, "the hot tier was filled");
    // 256 distinct chunks: every one is in some tier, most went cold.
    let usage = tiers(&store).usage();
    assert!(usage[1].chunks >= 256 - usage[0].chunks, "{usage:?}");
    assert!(status.demotions >= 256 - 9 * MIB / LEN as u64);
    assert_eq!(status.misses, 0);
    assert_eq!(status.hits.iter().sum::<u64>(), 2 * 400);
    assert!(status.hits[0] > 0 && status.hits[1] > 0, "{status:?}");
    // Restarted (a new process would do the same): S3 is not listed, so a
    // put of a chunk only S3 holds is answered `already present` by a look
    // there, and the prompt still reads back.
    drop(store);
    let store = open_tiered(&path, "kv", "shared").unwrap();
    let cold_only = sessions[0]
        .iter()
        .find(|c| {
            let name = hex_name(&xxh3_key(c));
            !hot_root
                .join(format!("chunks/{}/{name}", &name[..1]))
                .exists()
        })
        .expect("a chunk only the cold tier holds");
    assert!(store.put_chunk(&xxh3_key(cold_only), cold_only).unwrap());
    let got = store.get_chunk(&xxh3_key(&sessions[3][0])).unwrap();
    assert!(got.as_slice() == sessions[3][0].as_slice());
}

fn hex_name(hash: &[u8]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// (hash, bytes) pairs.
type Chunks = Vec<(Vec<u8>, Vec<u8>)>;

/// Chunks `0..n` of 64 KiB put into a fresh tiered store (fs over fs).
fn filled(dir: &Path, knobs: &str, n: u64) -> (Arc<StoreHandle>, Chunks) {
    let path = config(dir, 1, &fs_cold(dir), knobs);
    let store = open_tiered(&path, "kv", "").unwrap();
    let chunks: Vec<_> = (0..n)
        .map(|i| {
            let data = pattern(64 << 10, 7_000 + i);
            (xxh3_key(&data).to_vec(), data)
        })
        .collect();
    for (hash, data) in &chunks {
        assert!(!store.put_chunk(hash, data).unwrap());
    }
    (store, chunks)
}

fn advice(action: Action, tier: u32, hashes: &[(Vec<u8>, Vec<u8>)]) -> Vec<Advice> {
    vec![Advice {
        action,
        tier,
        hashes: hashes.iter().map(|(h, _)| h.clone()).collect(),
    }]
}

/// Every chunk reads back whole.
fn assert_all_readable(store: &StoreHandle, chunks: &[(Vec<u8>, Vec<u8>)]) {
    for (hash, data) in chunks {
        let got = store.get_chunk(hash).unwrap();
        assert!(got.as_slice() == data.as_slice());
    }
}

/// Advice that would lose data is refused, with its reason: evicting the
/// only copy, anything from the last tier, unknown hashes, a tier that does
/// not exist, promoting into a full tier, too many hashes at once; a move
/// storm is cut at `max_moves_per_sec`. Nothing is lost.
#[test]
fn advice_that_would_lose_data_or_storm_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // No background demotion: only advice moves chunks here.
    let knobs = "max_moves_per_sec = 5\nlow_water_pct = 100\ndemote_interval_ms = 60000\n";
    let (store, chunks) = filled(dir.path(), knobs, 12);
    let sink: &TieredStore = tiers(&store);
    let refused = |advice: Vec<Advice>, why: &str| {
        let report = sink.apply(advice);
        assert_eq!(report.applied, 0, "{report:?}");
        assert!(
            report.refused > 0 && report.reasons.iter().any(|r| r.contains(why)),
            "{why}: {report:?}"
        );
    };
    refused(advice(Action::Evict, 0, &chunks), "evicting the last copy");
    refused(
        advice(Action::Demote, 1, &chunks),
        "demote from the last tier",
    );
    refused(
        advice(Action::Evict, 1, &chunks),
        "evict from the last tier",
    );
    refused(advice(Action::Promote, 0, &chunks), "promote from tier 0");
    refused(
        advice(Action::Promote, 1, &chunks),
        "chunk not in that tier",
    );
    refused(advice(Action::Demote, 7, &chunks), "no tier 7");
    let strangers: Vec<_> = (0..3u64)
        .map(|i| (pattern(8, 99 + i), Vec::new()))
        .collect();
    refused(advice(Action::Demote, 0, &strangers), "unknown hash");
    let flood: Vec<_> = (0..MAX_ADVISED_HASHES as u64 + 10)
        .map(|i| (i.to_le_bytes().to_vec(), Vec::new()))
        .collect();
    refused(advice(Action::Demote, 0, &flood), "too many hashes");
    assert_all_readable(&store, &chunks);

    // A storm: demote all 12 at once; 5 per second pass.
    let report = sink.apply(advice(Action::Demote, 0, &chunks));
    assert_eq!((report.applied, report.refused), (5, 7), "{report:?}");
    assert!(report.reasons.iter().any(|r| r.contains("rate limit")));
    let usage = sink.usage();
    assert_eq!((usage[0].chunks, usage[1].chunks), (7, 5), "{usage:?}");
    let (hot_bytes, hot_files) = fs_chunk_usage(&dir.path().join("hot"));
    assert_eq!((hot_bytes, hot_files), (usage[0].used_bytes, 7));
    assert_all_readable(&store, &chunks);

    // The next second: promote one back (copied, the cold copy stays),
    // then its hot copy may go, but the cold one never.
    std::thread::sleep(Duration::from_millis(1100));
    let demoted = &chunks[..1];
    let report = sink.apply(advice(Action::Promote, 1, demoted));
    assert_eq!(report.applied, 1, "{report:?}");
    refused(
        advice(Action::Evict, 1, demoted),
        "evict from the last tier",
    );
    assert_eq!(sink.apply(advice(Action::Evict, 0, demoted)).applied, 1);
    refused(advice(Action::Evict, 0, demoted), "chunk not in that tier");

    // A full hot tier takes no promotion.
    std::thread::sleep(Duration::from_millis(1100));
    let big: Vec<_> = (0..9u64)
        .map(|i| {
            let data = pattern(64 << 10, 8_000 + i);
            (xxh3_key(&data).to_vec(), data)
        })
        .collect();
    for (hash, data) in &big {
        store.put_chunk(hash, data).unwrap();
    }
    assert_eq!(
        sink.usage()[0].used_bytes,
        MIB,
        "16 chunks of 64 KiB fill it"
    );
    refused(
        advice(Action::Promote, 1, &chunks[1..2]),
        "target tier full",
    );

    assert_all_readable(&store, &chunks);
    assert_all_readable(&store, &big);
    let status = sink.status();
    assert_eq!(status.verify_failures, 0);
    assert!(status.refused >= 12 * 6 + 3 + 7, "{status:?}");
    let text = kvwasm_host::metrics::prometheus_text();
    assert!(
        text.contains("kvwasm_tier_advice_refused_total{store=\"kv/\"}"),
        "{text}"
    );
}

/// A restart rebuilds the index from the tiers: the same usage, the dedup
/// answer for chunks in either tier, and reads from the tier holding them.
/// The store also never reads a chunk a demotion is removing as missing.
#[test]
fn a_restart_rebuilds_the_index_and_reads_survive_concurrent_demotion() {
    let dir = tempfile::tempdir().unwrap();
    let knobs = "low_water_pct = 100\ndemote_interval_ms = 60000\n";
    let (store, chunks) = filled(dir.path(), knobs, 12);
    // Readers hammer every chunk while all of them are demoted.
    let stop = AtomicBool::new(false);
    let misses = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut misses = 0;
            while !stop.load(Ordering::Relaxed) {
                for (hash, data) in &chunks {
                    match store.get_chunk(hash) {
                        Ok(got) => assert!(got.as_slice() == data.as_slice()),
                        Err(KvError::NotFound) => misses += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            misses
        });
        let report = tiers(&store).apply(advice(Action::Demote, 0, &chunks));
        assert_eq!(report.applied, 12, "{report:?}");
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap()
    });
    assert_eq!(misses, 0);
    let before = tiers(&store).usage();
    assert_eq!((before[0].chunks, before[1].chunks), (0, 12));
    drop(store);
    let path = dir.path().join("kvwasm.toml");
    let store = open_tiered(&path, "kv", "").unwrap();
    assert_eq!(tiers(&store).usage(), before);
    for (hash, data) in &chunks {
        assert!(store.put_chunk(hash, data).unwrap(), "dedup across tiers");
    }
    assert_all_readable(&store, &chunks);
    assert_eq!(tiers(&store).status().hits, [0, 12]);
}

/// The same shared-prompt workload with `builtin:advisor` driving the
/// tiers (issue 15's must-show): a hot tier of 30% of the data, and the
/// prompt's chunks demoted to the cold tier after the saves (as a burst of other
/// traffic would leave them under plain LRU). Restore rounds with an
/// advisor round after each: the hot tier never holds more than its
/// capacity, no read misses, every byte reads back, and the prompt's
/// chunks end in the hot tier.
#[test]
fn the_builtin_advisor_brings_the_shared_prompt_hot_in_a_real_tiered_store() {
    const LEN: usize = 120 << 10;
    let dir = tempfile::tempdir().unwrap();
    // The cold tier on files: the tests above own the S3 credentials in
    // this process's environment.
    let cold = format!(
        "{}[subscribers.advisor]\ncomponent = \"builtin:advisor\"\n\
         settings = {{ policy = \"frequency\" }}\n",
        fs_cold(dir.path())
    );
    // A long interval: the test runs the rounds itself, between restores.
    let knobs = "advisor = \"advisor\"\ndemote_interval_ms = 5\n\
                 advisor_loop = { interval_ms = 3600000 }\n";
    let path = config(dir.path(), 9, &cold, knobs);
    let store = open_tiered(&path, "kv", "shared").unwrap();
    let hot_root = dir.path().join("hot/shared");
    let sessions: Vec<Vec<Vec<u8>>> = (0..10).map(|s| session(s, 16, 24, LEN)).collect();
    for (s, chunks) in sessions.iter().enumerate() {
        for chunk in chunks {
            store.put_chunk(&xxh3_key(chunk), chunk).unwrap();
        }
        store
            .put_manifest(&format!("session-{s}"), &manifest(chunks))
            .unwrap();
    }
    let prompt_hot = |root: &Path| {
        sessions[0][..16]
            .iter()
            .filter(|c| {
                let name = hex_name(&xxh3_key(c));
                root.join(format!("chunks/{}/{name}", &name[..1])).exists()
            })
            .count()
    };
    let prompt: Vec<Vec<u8>> = sessions[0][..16]
        .iter()
        .map(|c| xxh3_key(c).to_vec())
        .collect();
    let demoted = tiers(&store).apply(vec![Advice {
        action: Action::Demote,
        tier: 0,
        hashes: prompt,
    }]);
    assert_eq!(demoted.applied, 16, "{demoted:?}");
    assert_eq!(prompt_hot(&hot_root), 0);
    for round in 0..6 {
        restore_all(&store, &sessions);
        assert!(store.advisor_round(), "the store runs an advisor");
        let (on_disk, _) = fs_chunk_usage(&hot_root);
        assert!(on_disk <= 9 * MIB, "round {round}: {on_disk} bytes hot");
    }
    let status = tiers(&store).status();
    let advisor = store.advisor_status().expect("an advisor");
    eprintln!("{status:?}; {advisor:?}");
    assert_eq!(status.misses, 0);
    assert!(status.promotions >= 16, "{status:?}");
    assert_eq!(prompt_hot(&hot_root), 16, "{advisor:?}");
}

/// A chunk the last tier accepted but lost before a flush (a buffering
/// backend whose instance trapped) is not left claimed by the index: the
/// manifest that follows fails, and the consumer's retry really writes the
/// chunk again (on the old code the retry was answered "already present"
/// from the index, the next manifest was published, and the chunk read
/// back as missing).
#[test]
fn a_chunk_a_tier_lost_before_its_flush_is_written_again_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cold")).unwrap();
    let cold = format!(
        "[backends.cold]\ncomponent = {:?}\ndir = {:?}\nmax_instances = 1\n",
        kvwasm_guest_artifacts::BUFFERED_PATH,
        dir.path().join("cold")
    );
    let path = config(dir.path(), 1, &cold, "");
    let store = open_tiered(&path, "kv", "lossy").unwrap();
    // Larger than the hot tier: it goes straight to the buffering tier.
    let big = pattern(2 * MIB as usize, 7);
    let key = xxh3_key(&big);
    assert!(!store.put_chunk(&key, &big).unwrap());
    // The cold instance traps, losing the chunk it buffered.
    assert!(store.get_chunk(b"sleep-then-trap").is_err());
    assert!(
        store.put_manifest("m", &key).is_err(),
        "published over a lost chunk"
    );
    assert!(
        !store.put_chunk(&key, &big).unwrap(),
        "the retry was answered from the index and wrote nothing"
    );
    store.put_manifest("m", &key).unwrap();
    let got = store.get_chunk(&key).unwrap();
    assert!(got.as_slice() == big.as_slice());
}

/// Three tiers: a chunk promoted from the middle tier (its copy there
/// stays) and then demoted from the top again reserved no room in the
/// middle tier, so none may be given back. On the old code the give-back
/// wrapped the middle tier's reservation and it then held more than its
/// capacity.
#[test]
fn a_promote_then_demote_cycle_keeps_the_middle_tier_within_capacity() {
    const LEN: usize = 256 << 10;
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[backends.hot]\ncomponent = \"builtin:fs\"\ndir = {:?}\ncapacity_mib = 1\n\
         [backends.mid]\ncomponent = \"builtin:fs\"\ndir = {:?}\ncapacity_mib = 1\n\
         {}[backends.kv]\ntiers = [\"hot\", \"mid\", \"cold\"]\nmax_moves_per_sec = 1000\n",
        dir.path().join("hot"),
        dir.path().join("mid"),
        fs_cold(dir.path())
    );
    let path = kvwasm_tests::write_config(dir.path(), &text);
    let store = open_tiered(&path, "kv", "cycle").unwrap();
    let first = pattern(LEN, 1);
    let pair = [(xxh3_key(&first).to_vec(), first.clone())];
    store.put_chunk(&pair[0].0, &first).unwrap();
    for (action, tier) in [
        (Action::Demote, 0),
        (Action::Promote, 1),
        (Action::Demote, 0),
    ] {
        let report = tiers(&store).apply(advice(action, tier, &pair));
        assert_eq!(report.applied, 1, "{action:?}: {report:?}");
    }
    // Enough puts to push chunks through the middle tier to the cold one.
    let chunks: Vec<Vec<u8>> = (2..14).map(|c| pattern(LEN, c)).collect();
    for chunk in &chunks {
        store.put_chunk(&xxh3_key(chunk), chunk).unwrap();
        let (mid, _) = fs_chunk_usage(&dir.path().join("mid/cycle"));
        assert!(mid <= MIB, "the middle tier holds {mid} bytes");
    }
    for chunk in chunks.iter().chain([&first]) {
        assert!(store.get_chunk(&xxh3_key(chunk)).unwrap().as_slice() == chunk.as_slice());
    }
}

/// When no chunk of a full tier can leave it (every read of one fails), a
/// put that needs room is refused at once with its reason, after trying
/// each chunk once. On the old code the same unreadable chunk was picked
/// again and again until the hot tier's deadline (issue 38: ~345,000
/// failing reads a second for 30 s). Counted, not timed: the store counts
/// every chunk a move could not take out of its tier.
#[test]
fn a_put_into_a_tier_nothing_can_leave_is_refused_after_trying_each_chunk_once() {
    const LEN: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    // Only the put moves chunks: no background demoter.
    let knobs = "demote_interval_ms = 3600000\nlow_water_pct = 100\n";
    let path = config(dir.path(), 1, &fs_cold(dir.path()), knobs);
    let store = open_tiered(&path, "kv", "stuck").unwrap();
    // 16 chunks of 64 KiB: the 1 MiB hot tier is full.
    let chunks: Vec<Vec<u8>> = (0..16).map(|i| pattern(LEN, 9_000 + i)).collect();
    for chunk in &chunks {
        assert!(!store.put_chunk(&xxh3_key(chunk), chunk).unwrap());
    }
    // Every hot chunk becomes unreadable: a directory where its file was.
    let file_of = |chunk: &[u8]| {
        let name = hex_name(&xxh3_key(chunk));
        dir.path()
            .join(format!("hot/stuck/chunks/{}/{name}", &name[..1]))
    };
    for chunk in &chunks {
        std::fs::remove_file(file_of(chunk)).unwrap();
        std::fs::create_dir(file_of(chunk)).unwrap();
    }
    let failures = || {
        tiers(&store)
            .metrics()
            .move_failures
            .load(Ordering::Relaxed)
    };
    let extra = pattern(LEN, 9_100);
    match store.put_chunk(&xxh3_key(&extra), &extra) {
        Err(KvError::Limit(why)) => {
            assert!(
                why.contains("none of its chunks could be moved out"),
                "{why}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(failures(), 16, "each chunk is tried once per put");
    // Again: each tried once more, no more.
    assert!(store.put_chunk(&xxh3_key(&extra), &extra).is_err());
    assert_eq!(failures(), 32);
    // Once the chunks read again, the put demotes one and lands.
    for chunk in &chunks {
        std::fs::remove_dir(file_of(chunk)).unwrap();
        std::fs::write(file_of(chunk), chunk).unwrap();
    }
    assert!(!store.put_chunk(&xxh3_key(&extra), &extra).unwrap());
    assert_eq!(failures(), 32);
    for chunk in chunks.iter().chain([&extra]) {
        assert!(store.get_chunk(&xxh3_key(chunk)).unwrap().as_slice() == chunk.as_slice());
    }
}

/// Set in the child process [`an_advisor_hoarding_descriptors_leaves_every_consumer_call_working`] runs in.
const DESCRIPTOR_CHILD: &str = "KVWASM_TEST_DESCRIPTOR_CHILD";

/// Descriptors the process holds now.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// An advisor granted a directory opens files in `advise` until refused
/// and keeps them (issue 38: it held the whole guest share at
/// `RLIMIT_NOFILE` 1024, the store's own fs tiers could then open nothing,
/// gets failed and a put spun). In a child process of its own at a soft
/// limit of 1024 (the limits are per process): with its default cap the
/// advisor holds at most 16 descriptors; with its caps raised as far as
/// they go, it stops at the share of guests that serve no consumer (half
/// of the guests' three quarters), and every consumer call still works:
/// puts that demote through both fs tiers, gets from both, manifests.
#[test]
fn an_advisor_hoarding_descriptors_leaves_every_consumer_call_working() {
    const NAME: &str = "an_advisor_hoarding_descriptors_leaves_every_consumer_call_working";
    if std::env::var_os(DESCRIPTOR_CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(DESCRIPTOR_CHILD, "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
        return;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and writes one rlimit struct of this (child) process.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        assert!(limit.rlim_max >= 1024, "hard limit {}", limit.rlim_max);
        limit.rlim_cur = 1024;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    // The guests' share is 768 descriptors; guests that serve no consumer
    // get half of it.
    let auxiliary_share = 768 / 2;
    const LEN: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let advisor_dir = dir.path().join("advisor");
    std::fs::create_dir_all(&advisor_dir).unwrap();
    std::fs::write(advisor_dir.join("fd-target"), b"x").unwrap();
    let store_entry = |name: &str, advisor: &str| {
        format!(
            "[backends.{name}-hot]\ncomponent = \"builtin:fs\"\ndir = {:?}\ncapacity_mib = 1\n\
             [backends.{name}-cold]\ncomponent = \"builtin:fs\"\ndir = {:?}\n\
             [backends.{name}]\ntiers = [\"{name}-hot\", \"{name}-cold\"]\n\
             advisor = \"{advisor}\"\ndemote_interval_ms = 3600000\n\
             advisor_loop = {{ interval_ms = 3600000, drain_ms = 3600000 }}\n",
            dir.path().join(format!("{name}-hot")),
            dir.path().join(format!("{name}-cold"))
        )
    };
    let advisor_entry = |name: &str, caps: &str| {
        format!(
            "[subscribers.{name}]\ncomponent = {:?}\ndir = {advisor_dir:?}\n{caps}",
            kvwasm_guest_artifacts::HOSTILE_ADVISOR_PATH
        )
    };
    let text = [
        store_entry("capped", "default-caps"),
        store_entry("starved", "raised-caps"),
        advisor_entry("default-caps", ""),
        advisor_entry(
            "raised-caps",
            "max_descriptors = 1000000\nmax_resources = 1000000\n",
        ),
    ]
    .concat();
    let path = kvwasm_tests::write_config(dir.path(), &text);
    // Tell the advisor to hoard, and let it act: one round.
    let hoard = |store: &StoreHandle| {
        assert!(matches!(store.get_manifest("!fds"), Err(KvError::NotFound)));
        let first = pattern(LEN, 1);
        store.put_chunk(&xxh3_key(&first), &first).unwrap();
        let before = open_descriptors();
        assert!(store.advisor_round());
        open_descriptors() - before
    };

    let capped = open_tiered(&path, "capped", "ns").unwrap();
    let held = hoard(&capped);
    assert!((8..=16).contains(&held), "the advisor holds {held} more");

    let starved = open_tiered(&path, "starved", "ns").unwrap();
    let held = hoard(&starved);
    let total = open_descriptors();
    assert!(held > 200, "the attack did not run: {held} descriptors");
    assert!(
        total <= auxiliary_share + 2,
        "{total} descriptors open, the advisor's share ends at {auxiliary_share}"
    );
    // Every consumer call works: 40 chunks through a 16-chunk hot tier
    // (demotions open files in both tiers), every one read back, a
    // manifest published and read.
    let chunks: Vec<Vec<u8>> = (2..42).map(|i| pattern(LEN, i)).collect();
    for chunk in &chunks {
        store_ok(starved.put_chunk(&xxh3_key(chunk), chunk));
    }
    let keys: Vec<u8> = chunks.iter().flat_map(|c| xxh3_key(c)).collect();
    store_ok(starved.put_manifest("after-the-flood", &keys));
    assert_eq!(
        starved.get_manifest("after-the-flood").unwrap().as_slice(),
        keys.as_slice()
    );
    for chunk in &chunks {
        let got = starved.get_chunk(&xxh3_key(chunk)).unwrap();
        assert!(got.as_slice() == chunk.as_slice());
    }
    let status = tiers(&starved).status();
    assert!(status.demotions >= 24, "{status:?}");
    assert_eq!(status.misses, 0);
    assert_eq!(
        tiers(&starved)
            .metrics()
            .move_failures
            .load(Ordering::Relaxed),
        0
    );
}

fn store_ok<T: std::fmt::Debug>(result: Result<T, KvError>) {
    if let Err(e) = result {
        panic!("a consumer call failed: {e}");
    }
}

/// One run of the shared-prompt trace through a real tiered store (the
/// simulation's shape, `guest-backends/advisor-core/src/sim.rs`, scaled to
/// 11 KiB chunks so that 93 fit a 1 MiB hot tier, 30% of the sessions'
/// data): 10 sessions of 72 shared and 24 own chunks saved, then 200
/// restores in a seeded order, a one-off 24-chunk request every 2nd
/// turn; after each turn the background demoter's pass and, with an
/// advisor, its round. Everything runs on this thread, in order: the same
/// store state for the same config every time. Returns the hot tier's hit
/// ratio over the restores, and the store's figures.
fn shared_prompt_trace(
    dir: &Path,
    advisor: Option<&str>,
) -> (f64, kvwasm_host::tiering::TierStatus) {
    const LEN: usize = 11 << 10;
    let (prompt, own, sessions) = (72u64, 24u64, 10u64);
    let advisor_knobs = match advisor {
        Some(policy) => format!(
            "advisor = \"policy\"\nadvisor_loop = {{ interval_ms = 3600000, drain_ms = 3600000 }}\n\
             [subscribers.policy]\ncomponent = \"builtin:advisor\"\nsettings = {{ policy = \"{policy}\" }}\n"
        ),
        None => String::new(),
    };
    // No clock anywhere: the demoter's timer never fires (its pass runs
    // below), and no advised move is over a rate limit.
    let knobs = format!(
        "demote_interval_ms = 3600000\nmax_moves_per_sec = 1000000000\n\
         max_move_mib_per_sec = 1000000000\n{advisor_knobs}"
    );
    let path = config(dir, 1, &fs_cold(dir), &knobs);
    let store = open_tiered(&path, "kv", "trace").unwrap();
    let chunk = |kind: u64, owner: u64, i: u64| pattern(LEN, kind << 40 | owner << 20 | i);
    let session = |s: u64| -> Vec<Vec<u8>> {
        (0..prompt)
            .map(|i| chunk(1, 0, i))
            .chain((0..own).map(|i| chunk(2, s, i)))
            .collect()
    };
    let end_of_turn = || {
        tiers(&store).demote_to_low_water().unwrap();
        if advisor.is_some() {
            assert!(store.advisor_round());
        }
    };
    for s in 0..sessions {
        let chunks = session(s);
        for c in &chunks {
            store.put_chunk(&xxh3_key(c), c).unwrap();
        }
        store
            .put_manifest(&format!("session-{s}"), &manifest(&chunks))
            .unwrap();
        end_of_turn();
    }
    let hot_hits = || {
        tiers(&store).metrics().tiers[0]
            .hits
            .load(Ordering::Relaxed)
    };
    let (mut reads, mut hits) = (0u64, 0u64);
    let mut rng = 0x5eed_u64 | 1;
    for turn in 0..200u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let s = rng % sessions;
        let name = format!("session-{s}");
        store.get_manifest(&name).unwrap();
        let before = hot_hits();
        for c in session(s) {
            assert!(store.get_chunk(&xxh3_key(&c)).unwrap().as_slice() == c.as_slice());
            reads += 1;
        }
        hits += hot_hits() - before;
        if turn % 2 == 0 {
            store.get_manifest(&format!("oneoff-{turn}")).unwrap_err();
            let scan: Vec<Vec<u8>> = (0..24).map(|i| chunk(3, turn, i)).collect();
            for c in &scan {
                store.put_chunk(&xxh3_key(c), c).unwrap();
            }
            for c in &scan {
                store.get_chunk(&xxh3_key(c)).unwrap();
            }
        }
        end_of_turn();
    }
    (hits as f64 / reads as f64, tiers(&store).status())
}

/// Issue 38: over this trace `policy = "lru"` scored a 0.44–0.49 hot hit
/// ratio against 0.52 with no advisor, and thousands of its moves were
/// refused ("chunk not in that tier", "target tier full") because it never
/// learned what the store moved. Now the store reports its moves and
/// deduplicated puts, LRU promotes into free room only, and over the same
/// deterministic trace it scores at least what no advisor does, with no
/// advice refused; the default policy scores more.
#[test]
fn plain_lru_advice_scores_at_least_the_hit_ratio_of_no_advisor() {
    let runs: Vec<(&str, f64, kvwasm_host::tiering::TierStatus)> =
        [None, Some("lru"), Some("frequency")]
            .into_iter()
            .map(|advisor| {
                let dir = tempfile::tempdir().unwrap();
                let (ratio, status) = shared_prompt_trace(dir.path(), advisor);
                eprintln!("{advisor:?}: hot hit ratio {ratio:.3}, {status:?}");
                (advisor.unwrap_or("none"), ratio, status)
            })
            .collect();
    let [
        (_, none, _),
        (_, lru, lru_status),
        (_, frequency, frequency_status),
    ] = runs.as_slice()
    else {
        unreachable!()
    };
    assert!(lru >= none, "lru {lru:.3} < no advisor {none:.3}");
    assert!(frequency > lru, "frequency {frequency:.3} <= lru {lru:.3}");
    for status in [lru_status, frequency_status] {
        assert_eq!(status.refused, 0, "{:?}", status.decisions);
        assert_eq!(status.misses, 0);
    }
}
