//! The S3 backend (`builtin:s3`) against a real S3 server that checks
//! SigV4 signatures (`s3s-fs` on loopback, started by each test), through
//! the shim as an engine loads it. Credentials reach the guest only through
//! granted environment variables.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvwasm_host::config::Config;
use kvwasm_host::{Backend, StoreHandle};
use kvwasm_tests::servers::S3Server;
use kvwasm_tests::{Probe, assert_open_refused, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

/// A config granting `server`'s origin (unless `grant` is false) and the
/// credential variables.
fn config(dir: &Path, server: &S3Server, grant: bool) -> PathBuf {
    let http = if grant {
        format!("http = [\"{}\"]\n", server.endpoint)
    } else {
        String::new()
    };
    write_config(
        dir,
        &format!(
            "[backends.s3]\ncomponent = \"builtin:s3\"\n{http}\
             env = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\ncall_timeout_ms = 5000\n\
             [backends.s3.settings]\nendpoint = \"{}\"\nbucket = \"{}\"\ntimeout_ms = 2000\n",
            server.endpoint, server.bucket
        ),
    )
}

fn probe(config: &Path, namespace: &str, key: &str, secret: &str) -> Probe {
    Probe::new(PROBE, &format!("wasm://s3/{namespace}"))
        .config(config)
        .env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", secret)
}

#[test]
fn saves_restores_and_deduplicates_in_the_bucket() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true);
    let run = |ops: &[&str]| {
        probe(
            &config,
            "team/model",
            &server.access_key,
            &server.secret_key,
        )
        .run(ops)
    };

    let (out, stderr) = run(&[
        "put-chunk:0a=alpha",
        "put-chunk:0a=alpha",
        "put-chunk:0b=beta",
        "get-chunk:0b",
        "put-manifest:slot 0=0a0b",
        "get-manifest:slot 0",
        "get-chunk:0a",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk 0a=alpha -> 0",
            "put-chunk 0a=alpha -> 1",
            "put-chunk 0b=beta -> 0",
            "get-chunk 0b -> 0 beta",
            "put-manifest slot 0=0a0b -> 0",
            "get-manifest slot 0 -> 0 0a0b",
            "get-chunk 0a -> 0 alpha",
        ],
        "{stderr}"
    );
    // Round trips: each new chunk a put-time HEAD and its PUT, written
    // behind (answered when `get-chunk 0b` needs it stored), then the GET
    // and the manifest PUT.
    assert!(
        stderr.contains(
            "2 chunks written at put time, 0 staged chunks (0 already stored), 6 round trips"
        ),
        "{stderr}"
    );

    // Objects under <prefix>/<namespace>/{chunks,manifests}/, path-style.
    let base = server.bucket_dir().join("kvwasm/team/model");
    assert_eq!(std::fs::read(base.join("chunks/0a")).unwrap(), b"alpha");
    assert_eq!(std::fs::read(base.join("chunks/0b")).unwrap(), b"beta");
    assert_eq!(
        std::fs::read(base.join("manifests/slot 0")).unwrap(),
        b"0a0b"
    );

    // Another process: the duplicate is found with HEAD, the delete works.
    let (out, stderr) = run(&[
        "put-chunk:0b=beta",
        "delete-manifest:slot 0",
        "get-manifest:slot 0",
        "delete-manifest:slot 0",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk 0b=beta -> 1",
            "delete-manifest slot 0 -> 0",
            "get-manifest slot 0 -> -2",
            "delete-manifest slot 0 -> 0",
        ],
        "{stderr}"
    );
}

#[test]
fn a_wrong_secret_key_fails_the_open_with_the_servers_reason() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true);
    let started = Instant::now();
    let run = probe(&config, "ns", &server.access_key, "wrong-secret-key").run(&["get-manifest:m"]);
    assert_open_refused(
        run,
        started.elapsed(),
        &["denied", "403 SignatureDoesNotMatch"],
        "wrong-secret-key",
    );

    // The open checks the bucket with a `HEAD`, which has no body: a
    // missing bucket is asked again as a listing, for the service's reason.
    let text = std::fs::read_to_string(&config).unwrap();
    let missing = dir.path().join("missing-bucket.toml");
    std::fs::write(
        &missing,
        text.replace(
            &format!("bucket = \"{}\"", server.bucket),
            "bucket = \"no-such-bucket\"",
        ),
    )
    .unwrap();
    let started = Instant::now();
    let run =
        probe(&missing, "ns", &server.access_key, &server.secret_key).run(&["get-manifest:m"]);
    assert_open_refused(
        run,
        started.elapsed(),
        &["checking bucket \"no-such-bucket\"", "404 NoSuchBucket"],
        &server.secret_key,
    );

    // Credentials that are not granted do not reach the guest at all.
    let (out, stderr) = Probe::new(PROBE, "wasm://s3/ns")
        .config(&config)
        .run(&["get-manifest:m"]);
    assert_eq!(out, ["open NULL"]);
    assert!(stderr.contains("no S3 credentials"), "{stderr}");

    // Credentials in the endpoint are refused, and not echoed.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "endpoint = \"http://",
        "endpoint = \"http://AKID:leaked-secret@",
    );
    std::fs::write(&config, text).unwrap();
    let started = Instant::now();
    let run = probe(&config, "ns", &server.access_key, &server.secret_key).run(&["get-manifest:m"]);
    assert_open_refused(
        run,
        started.elapsed(),
        &["holds credentials"],
        "leaked-secret",
    );
}

#[test]
fn without_the_http_grant_the_guest_cannot_reach_the_server() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, false);
    let (out, stderr) =
        probe(&config, "ns", &server.access_key, &server.secret_key).run(&["get-manifest:m"]);
    assert_eq!(out, ["open NULL"]);
    assert!(
        stderr.contains("HttpRequestDenied") && stderr.contains("not granted in `http`"),
        "{stderr}"
    );
}

#[test]
fn a_stopped_server_fails_calls_within_the_deadline() {
    let mut server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true);
    let mut run = probe(&config, "ns", &server.access_key, &server.secret_key).spawn(&[
        "put-manifest:m=v",
        "pause",
        "get-manifest:m",
    ]);
    assert_eq!(run.until_pause(), ["open ok", "put-manifest m=v -> 0"]);
    server.stop();
    let started = Instant::now();
    run.resume();
    let (out, stderr) = run.finish();
    assert_eq!(out, ["get-manifest m -> -6"], "{stderr}");
    // Refused at once, no deadline waited for (the reason says so); the
    // bound only rules out a hang, loose for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(30), "no hang");
    assert!(stderr.contains("ConnectionRefused"), "{stderr}");
}

/// A chunk written behind whose `PUT` fails is staged with its bytes,
/// which the handle keeps until the service has them: the flush retries
/// it, and while the service keeps failing, `put-manifest` fails and
/// publishes nothing, and a get still finds the chunk. Once the service
/// recovers, the same `put-manifest` (the chunk not put again) succeeds.
#[test]
fn a_write_behind_that_fails_is_retried_by_the_flush() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true);
    // s3s-fs writes an object to `<root>/.tmp.<n>.internal.part`, `n`
    // counting its `PUT`s from 0, then renames it into place. Directories
    // there fail the first two `PUT`s, whoever runs the test (root
    // included): the write behind and the flush's retry.
    let root = server.bucket_dir().parent().unwrap().to_owned();
    let blockers: Vec<PathBuf> = (0..2)
        .map(|n| root.join(format!(".tmp.{n}.internal.part")))
        .collect();
    for blocker in &blockers {
        std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    }
    let mut probe = probe(&config, "ns", &server.access_key, &server.secret_key).spawn(&[
        "put-chunk:0a=alpha",
        "put-manifest:m=0a",
        "get-manifest:m",
        "get-chunk:0a",
        "pause",
        "put-manifest:m=0a",
        "get-manifest:m",
    ]);
    let before = probe.until_pause();
    for blocker in &blockers {
        std::fs::remove_dir_all(blocker).unwrap();
    }
    probe.resume();
    let (after, stderr) = probe.finish();
    assert_eq!(
        before,
        [
            "open ok",
            "put-chunk 0a=alpha -> 0",
            "put-manifest m=0a -> -6",
            "get-manifest m -> -2",
            "get-chunk 0a -> 0 alpha",
        ],
        "{stderr}"
    );
    assert!(
        stderr.contains("1 chunks written behind failed (e.g. 0a: "),
        "{stderr}"
    );
    assert_eq!(
        after,
        ["put-manifest m=0a -> 0", "get-manifest m -> 0 0a"],
        "{stderr}"
    );
    let object = server.bucket_dir().join("kvwasm/ns/chunks/0a");
    assert_eq!(std::fs::read(object).unwrap(), b"alpha");
}

/// A restore through the prefetch cache, with more chunks than requests in
/// flight: gets in any order, a missing chunk and long values (read into
/// host payloads) all come back exact.
#[test]
fn prefetched_chunks_come_back_exact_in_any_order() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true);
    let run = |ops: &[String]| {
        let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
        probe(&config, "ns", &server.access_key, &server.secret_key).run(&ops)
    };
    let value = |i: usize| -> String {
        let len = if i % 13 == 5 { 70_000 } else { 10 + i };
        (0..len)
            .map(|j| (b'a' + ((i + j) % 26) as u8) as char)
            .collect()
    };
    let hashes: Vec<String> = (0..40).map(|i| format!("{i:02x}")).collect();
    let mut save: Vec<String> = hashes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 17)
        .map(|(i, h)| format!("put-chunk:{h}={}", value(i)))
        .collect();
    save.push("put-manifest:m=x".into());
    let (out, stderr) = run(&save);
    assert!(out.iter().skip(1).all(|l| l.ends_with("-> 0")), "{stderr}");

    // Out of the prefetch order: the second half first.
    let order: Vec<usize> = (20..40).chain(0..20).collect();
    let mut restore = vec![format!("prefetch:{}", hashes.join(","))];
    restore.extend(order.iter().map(|&i| format!("get-chunk:{}", hashes[i])));
    let (out, stderr) = run(&restore);
    assert_eq!(
        out[1],
        format!("prefetch {} -> 0", hashes.join(",")),
        "{stderr}"
    );
    for (line, &i) in out[2..].iter().zip(&order) {
        let expected = if i == 17 {
            format!("get-chunk {} -> -2", hashes[i])
        } else {
            format!("get-chunk {} -> 0 {}", hashes[i], value(i))
        };
        assert!(
            *line == expected,
            "chunk {i}: {} {stderr}",
            &line[..line.len().min(80)]
        );
    }
    assert_eq!(out.len(), 2 + order.len(), "{stderr}");
}

/// The backend `name` on `server`, in this process, releasing idle
/// instances after 30 ms, with its credentials in variables of its own
/// (set here: no other test reads them).
fn releasing_in_process(dir: &Path, server: &S3Server, name: &str) -> Arc<Backend> {
    let (key_var, secret_var) = ("KVWASM_TEST_S3_IDLE_KEY", "KVWASM_TEST_S3_IDLE_SECRET");
    // SAFETY: every test setting these variables sets the same values, and
    // std serialises environment access among its own readers.
    unsafe {
        std::env::set_var(key_var, &server.access_key);
        std::env::set_var(secret_var, &server.secret_key);
    }
    let text = format!(
        "[backends.{name}]\ncomponent = \"builtin:s3\"\nhttp = [\"{0}\"]\n\
         env = [\"{key_var}\", \"{secret_var}\"]\nidle_release_ms = 30\ncall_timeout_ms = 5000\n\
         settings = {{ endpoint = \"{0}\", bucket = \"{1}\", access_key_id_env = \"{key_var}\", \
         secret_access_key_env = \"{secret_var}\" }}\n",
        server.endpoint, server.bucket
    );
    Arc::new(Config::parse(&text, dir).unwrap().backend(name).unwrap())
}

/// Issue 37, for S3: after an idle release, the first warm save sends no
/// `HEAD` per chunk. The new instance finds every chunk in the host's
/// `known-chunks` record (the only request of its puts is its start's
/// bucket check), and the manifest re-checks them in one wave. Before,
/// each put was a `HEAD` round trip. Another backend entry on the same
/// bucket and namespace shares nothing of that record.
#[test]
fn a_warm_save_after_an_idle_release_sends_no_head_per_chunk() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let backend = releasing_in_process(dir.path(), &server, "s3_idle");
    let handle = StoreHandle::open(backend.clone(), "slots").unwrap();
    let chunks: Vec<Vec<u8>> = (0..24).map(|i| kvwasm_tests::pattern(2048, i)).collect();
    let key = |chunk: &[u8]| kvwasm_tests::xxh3_key(chunk);
    for chunk in &chunks {
        assert!(!handle.put_chunk(&key(chunk), chunk).unwrap(), "new");
    }
    handle.put_manifest("slot", b"names them").unwrap();
    let cold = backend.metrics.snapshot();
    assert_eq!(
        cold.http_requests,
        1 + 24 + 24 + 1,
        "the bucket check, a HEAD and a PUT per chunk, the manifest: {cold:?}"
    );

    kvwasm_tests::idle::wait_for_release(&handle);
    let released = backend.metrics.snapshot();
    for chunk in &chunks {
        assert!(handle.put_chunk(&key(chunk), chunk).unwrap(), "present");
    }
    let warm = backend.metrics.snapshot();
    assert_eq!(warm.instances_restarted - released.instances_restarted, 1);
    assert_eq!(
        warm.http_requests - released.http_requests,
        1,
        "only the new instance's bucket check: {warm:?}"
    );
    assert_eq!(warm.known_chunk_hits - released.known_chunk_hits, 24);
    handle.put_manifest("slot", b"names them").unwrap();
    assert_eq!(
        backend.metrics.snapshot().http_requests - warm.http_requests,
        24 + 1,
        "one HEAD per chunk in one wave, then the manifest"
    );

    // Another backend entry on the same bucket and namespace asks the
    // service about every chunk, which has them.
    let stranger = releasing_in_process(dir.path(), &server, "s3_idle_other");
    let other = StoreHandle::open(stranger.clone(), "slots").unwrap();
    for chunk in &chunks {
        assert!(other.put_chunk(&key(chunk), chunk).unwrap(), "present");
    }
    assert_eq!(stranger.metrics.snapshot().http_requests, 1 + 24);
}
