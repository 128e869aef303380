//! The S3 backend (`builtin:s3`) against a real S3 server that checks
//! SigV4 signatures (`s3s-fs` on loopback, started by each test), through
//! the shim as an engine loads it. Credentials reach the guest only through
//! granted environment variables.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
        stderr
            .contains("2 chunks written behind, 0 staged chunks (0 already stored), 6 round trips"),
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
    assert!(started.elapsed() < Duration::from_secs(3), "no hang");
    assert!(stderr.contains("ConnectionRefused"), "{stderr}");
}

/// A chunk written behind whose `PUT` fails fails the next `put-manifest`,
/// naming it, and publishes nothing; the handle forgets the chunk, so
/// putting it again stores it (its bytes were lent to `put-chunk` only).
#[test]
fn a_write_behind_that_fails_fails_the_manifest_and_is_forgotten() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true);
    // s3s-fs writes an object to `<root>/.tmp.<n>.internal.part`, `n`
    // counting its `PUT`s from 0, then renames it into place. A directory
    // there fails the first `PUT`, whoever runs the test (root included).
    let blocker = server
        .bucket_dir()
        .parent()
        .unwrap()
        .join(".tmp.0.internal.part");
    std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    let mut probe = probe(&config, "ns", &server.access_key, &server.secret_key).spawn(&[
        "put-chunk:0a=alpha",
        "put-manifest:m=0a",
        "get-manifest:m",
        "pause",
        "put-chunk:0a=alpha",
        "put-manifest:m=0a",
        "get-manifest:m",
        "get-chunk:0a",
    ]);
    let before = probe.until_pause();
    std::fs::remove_dir_all(&blocker).unwrap();
    probe.resume();
    let (after, stderr) = probe.finish();
    assert_eq!(before[0], "open ok", "{stderr}");
    assert_eq!(before[1], "put-chunk 0a=alpha -> 0", "{stderr}");
    assert!(
        before[2].starts_with("put-manifest m=0a -> -"),
        "{before:?} {stderr}"
    );
    assert_eq!(
        before[3], "get-manifest m -> -2",
        "nothing published: {stderr}"
    );
    assert!(
        stderr.contains("1 chunks could not be stored, e.g. 0a"),
        "{stderr}"
    );
    // Forgotten: stored again, not answered as a duplicate.
    assert_eq!(
        after,
        [
            "put-chunk 0a=alpha -> 0",
            "put-manifest m=0a -> 0",
            "get-manifest m -> 0 0a",
            "get-chunk 0a -> 0 alpha",
        ],
        "{stderr}"
    );
}
