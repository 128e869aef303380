//! The remote store's answers stay true when the server drops chunks behind
//! a handle's back (Redis eviction or TTL, S3 lifecycle rules), and
//! `prefetch_chunks` is bounded in requests and held bytes. Against a real
//! `redis-server` and `s3s-fs`, through the shim in a child process.

use std::path::{Path, PathBuf};

use kvwasm_tests::servers::{RedisServer, S3Server};
use kvwasm_tests::{Probe, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

fn config(dir: &Path, server: &RedisServer, settings: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\n\
             [backends.redis.settings]\naddress = \"{0}\"\n{settings}",
            server.addr
        ),
    )
}

#[test]
fn a_chunk_dropped_behind_the_handles_back_is_never_named_by_a_new_manifest() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, "");
    let probe = Probe::new(PROBE, "wasm://redis/ns").config(&config);
    drop_chunks_between_saves(
        probe,
        |keys| {
            let mut args = vec!["DEL"];
            args.extend(keys);
            assert_eq!(server.cli(&args).trim(), keys.len().to_string());
        },
        |key| server.cli(&["EXISTS", key]).trim() == "1",
    );
}

#[test]
fn an_s3_object_expired_behind_the_handles_back_is_never_named_by_a_new_manifest() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[backends.s3]\ncomponent = \"builtin:s3\"\nhttp = [\"{0}\"]\n\
             env = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\n\
             [backends.s3.settings]\nendpoint = \"{0}\"\nbucket = \"{1}\"\n",
            server.endpoint, server.bucket
        ),
    );
    let probe = Probe::new(PROBE, "wasm://s3/ns")
        .config(&config)
        .env("AWS_ACCESS_KEY_ID", &server.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &server.secret_key);
    let object = |key: &str| server.bucket_dir().join(key);
    drop_chunks_between_saves(
        probe,
        |keys| {
            for key in keys {
                std::fs::remove_file(object(key)).unwrap();
            }
        },
        |key| object(key).is_file(),
    );
}

/// Save chunks `0a` and `0b` in namespace `ns` (prefetching `0b`), let
/// `remove` drop both from the server, save them again on the same handle:
/// `0b` is re-sent from the prefetch cache, `0a` fails the manifest, which
/// is not published; putting `0a` again stores it. `exists` asks the server.
fn drop_chunks_between_saves(
    probe: Probe,
    remove: impl FnOnce(&[&str]),
    exists: impl Fn(&str) -> bool,
) {
    let mut run = probe.spawn(&[
        "put-chunk:0a=alpha",
        "put-chunk:0b=beta",
        "put-manifest:m1=0a0b",
        "prefetch:0b",
        "pause",
        // The handle saw both chunks: it answers 1 without asking.
        "put-chunk:0a=alpha",
        "put-chunk:0b=beta",
        "put-manifest:m2=0a0b",
        "pause",
        "put-chunk:0a=alpha",
        "put-manifest:m2=0a0b",
        "get-chunk:0a",
    ]);
    assert_eq!(
        run.until_pause(),
        [
            "open ok",
            "put-chunk 0a=alpha -> 0",
            "put-chunk 0b=beta -> 0",
            "put-manifest m1=0a0b -> 0",
            "prefetch 0b -> 0",
        ]
    );
    // Evicted, expired or deleted: gone from the server either way.
    remove(&["kvwasm/ns/chunks/0a", "kvwasm/ns/chunks/0b"]);
    run.resume();
    assert_eq!(
        run.until_pause(),
        [
            "put-chunk 0a=alpha -> 1",
            "put-chunk 0b=beta -> 1",
            "put-manifest m2=0a0b -> -5",
        ],
        "0a is gone and its bytes are not at hand: the manifest fails"
    );
    assert!(!exists("kvwasm/ns/manifests/m2"), "nothing was published");
    assert!(!exists("kvwasm/ns/chunks/0a"));
    assert!(
        exists("kvwasm/ns/chunks/0b"),
        "re-sent from the prefetch cache"
    );
    run.resume();
    let (out, stderr) = run.finish();
    assert_eq!(
        out,
        [
            "put-chunk 0a=alpha -> 0",
            "put-manifest m2=0a0b -> 0",
            "get-chunk 0a -> 0 alpha",
        ],
        "the handle forgot the lost chunk, so putting it again stores it: {stderr}"
    );
    assert!(
        stderr.contains("1 chunks this handle answered already-present for are gone")
            && stderr.contains("e.g. 0a;"),
        "{stderr}"
    );
    assert!(exists("kvwasm/ns/chunks/0a") && exists("kvwasm/ns/manifests/m2"));
}

#[test]
fn a_warm_save_rechecks_its_dedup_hits_in_one_round_trip() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, "");
    let puts: Vec<String> = (0..16).map(|i| format!("put-chunk:{i:02x}=c{i}")).collect();
    let save: Vec<&str> = puts
        .iter()
        .map(String::as_str)
        .chain(["put-manifest:m=16"])
        .collect();
    let twice: Vec<&str> = save.iter().chain(&save).copied().collect();
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .run(&twice);
    assert!(out[18..34].iter().all(|l| l.ends_with("-> 1")), "{out:?}");
    // The second save: one existence check of the 16 hits, then the manifest.
    assert!(
        stderr.contains(
            "0 staged chunks (0 already stored), 2 round trips, 16 dedup hits re-checked"
        ),
        "{stderr}"
    );
}

#[test]
fn prefetch_is_bounded_in_requests_and_held_bytes() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    // Two keys per request; 1 MiB holds five chunks of 200 000 bytes.
    let config = config(
        dir.path(),
        &server,
        "prefetch_wave = 2\nprefetch_cache_mib = 1\n",
    );
    let hashes: Vec<String> = (0..12u8).map(|i| format!("{i:02x}")).collect();
    for (i, hash) in hashes.iter().enumerate() {
        let value = vec![b'a' + i as u8; 200_000];
        server.set(&format!("kvwasm/ns/chunks/{hash}"), &value);
    }
    let prefetch = format!("prefetch:{}", hashes.join(","));
    let gets: Vec<String> = hashes.iter().map(|h| format!("get-chunk:{h}")).collect();
    let mut ops = vec![prefetch.as_str(), "pause"];
    ops.extend(gets[..5].iter().map(String::as_str));
    ops.push("pause");
    ops.extend(gets[5..].iter().map(String::as_str));
    let mut run = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .spawn(&ops);
    assert_eq!(
        run.until_pause(),
        [
            "open ok".to_owned(),
            format!("prefetch {} -> 0", hashes.join(","))
        ]
    );
    assert_eq!(
        server.calls("get"),
        5,
        "waves of 2 and 3: a sixth value would not fit, the other seven were not asked for"
    );
    run.resume();
    let cached = run.until_pause();
    for (i, line) in cached.iter().enumerate() {
        let expected = String::from_utf8(vec![b'a' + i as u8; 200_000]).unwrap();
        assert_eq!(line, &format!("get-chunk {:02x} -> 0 {expected}", i));
    }
    assert_eq!(server.calls("get"), 5, "five gets served from the cache");
    run.resume();
    let (out, stderr) = run.finish();
    assert_eq!(out.len(), 7, "{stderr}");
    for (line, i) in out.iter().zip(5..12u8) {
        let expected = String::from_utf8(vec![b'a' + i; 200_000]).unwrap();
        assert_eq!(
            line,
            &format!("get-chunk {i:02x} -> 0 {expected}"),
            "{stderr}"
        );
    }
    assert_eq!(
        server.calls("get"),
        5 + 6 + 1,
        "the get of the sixth fetched it and the five after it (what 1 MiB holds), the get \
         of the twelfth the last one: each value asked for once"
    );
}

/// Short values are held in linear memory, at most 1 MiB of them
/// (`prefetch::IN_GUEST_BYTES`): a prefetch of 6 MiB of 4 KiB chunks
/// fetches 1 MiB (256 chunks), and once the gets have drained it, the get
/// of the first chunk left out fetches itself and the next MiB in one wave. Every
/// value comes back exact, in whatever order it is got, each asked for
/// once.
#[test]
fn a_prefetch_past_the_bound_on_linear_memory_continues_in_waves() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, "");
    let hashes = store_short_chunks(&server);
    let prefetch = format!("prefetch:{}", hashes.join(","));
    let gets: Vec<String> = hashes.iter().map(|h| format!("get-chunk:{h}")).collect();
    let mut ops = vec![prefetch.as_str(), "pause"];
    ops.extend(gets[..256].iter().map(String::as_str));
    ops.extend(["pause", gets[256].as_str(), "pause"]);
    ops.extend(gets[257..].iter().rev().map(String::as_str));
    let mut run = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .spawn(&ops);
    assert_eq!(run.until_pause().len(), 2);
    assert_eq!(
        server.calls("get"),
        32 + 224,
        "a first wave of 32, then 1 MiB"
    );
    run.resume();
    let served = run.until_pause();
    assert_eq!(server.calls("get"), 256, "256 gets served from the cache");
    run.resume();
    let first_left_out = run.until_pause();
    assert_eq!(
        server.calls("get"),
        256 + 257,
        "one wave brought it and the 256 after it (what 1 MiB holds)"
    );
    run.resume();
    let (rest, stderr) = run.finish();
    assert_eq!(server.calls("get"), 1536, "{stderr}");
    let got_in_order = hashes[..257].iter().chain(hashes[257..].iter().rev());
    let lines = served.iter().chain(&first_left_out).chain(&rest);
    let mut count = 0;
    for (line, hash) in lines.zip(got_in_order) {
        assert_eq!(
            line,
            &format!("get-chunk {hash} -> 0 {}", short_value(hash))
        );
        count += 1;
    }
    assert_eq!(count, 1536);
}

/// What a prefetch left queued is dropped when a wave fails (here a key of
/// the wrong type makes the server answer one `GET` with an error) and
/// when a new prefetch comes: the gets then ask the server alone, and
/// every value still comes back exact.
#[test]
fn a_failed_wave_or_a_new_prefetch_leaves_the_gets_to_ask_alone() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, "");
    let hashes = store_short_chunks(&server);
    let wrong_type = "kvwasm/ns/chunks/01b0";
    server.cli(&["DEL", wrong_type]);
    server.cli(&["RPUSH", wrong_type, "not a string"]);
    let get = |h: &str| format!("get-chunk:{h}");
    let expect = |h: &str| format!("get-chunk {h} -> 0 {}", short_value(h));

    // Cached: 0000..00ff, queued: 0100..05ff. Once the gets drained the
    // cache, the get of 0100 heads a wave of 257, which meets 01b0.
    let prefetch = format!("prefetch:{}", hashes.join(","));
    let drain: Vec<String> = hashes[..256].iter().map(|h| get(h)).collect();
    let mut ops: Vec<&str> = vec![&prefetch];
    ops.extend(drain.iter().map(String::as_str));
    let after = [get("0100"), get("0101"), get("01b0"), get("05ff")];
    ops.extend(after.iter().map(String::as_str));
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .run(&ops);
    for (line, hash) in out[2..].iter().zip(&hashes[..256]) {
        assert_eq!(line, &expect(hash));
    }
    let out = &out[2 + 256..];
    assert_eq!(out[0], expect("0100"), "{stderr}");
    assert_eq!(out[1], expect("0101"));
    assert!(out[2].starts_with("get-chunk 01b0 -> -"), "{}", out[2]);
    assert_eq!(out[3], expect("05ff"));
    assert!(stderr.contains("a prefetch wave failed"), "{stderr}");
    // 256 prefetched, a wave of 257 that failed, then four alone.
    assert_eq!(server.calls("get"), 256 + 257 + 4);

    // A second prefetch (one queued hash, one cached) replaces the first.
    let second = format!("prefetch:{},0007", hashes[1500]);
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns").config(&config).run(&[
        &prefetch,
        &second,
        &get("0514"),
        &get("05dc"),
        &get("0007"),
        &get("0008"),
    ]);
    let before = 256 + 257 + 4;
    assert_eq!(
        out[3..],
        [
            expect("0514"),
            expect("05dc"),
            expect("0007"),
            expect("0008")
        ],
        "{stderr}"
    );
    // 256, then 05dc alone; 0514 was no longer queued, 0008 evicted.
    assert_eq!(server.calls("get"), before + 256 + 1 + 2);
}

/// 1,536 chunks of 4 KiB (6 MiB) stored in namespace `ns`, hashes `0000`
/// to `05ff`: more than a prefetch keeps in linear memory at once.
fn store_short_chunks(server: &RedisServer) -> Vec<String> {
    let hashes: Vec<String> = (0..1536u32).map(|i| format!("{i:04x}")).collect();
    for hash in &hashes {
        server.set(
            &format!("kvwasm/ns/chunks/{hash}"),
            short_value(hash).as_bytes(),
        );
    }
    hashes
}

/// The 4 KiB value [`store_short_chunks`] stores under `hash`.
fn short_value(hash: &str) -> String {
    hash.repeat(1024)
}
