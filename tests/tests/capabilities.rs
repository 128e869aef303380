//! Capabilities are granted by name in the config and nothing else gets
//! through: TCP peers, name lookups, HTTP origins, environment variables,
//! extra directories and the component's digest. Each test pairs the
//! granted case (it works) with the refused one (a real peer is there).

use std::sync::atomic::Ordering;

use kvwasm_tests::{Probe, hostile_config, http_server};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

fn run(config: &std::path::Path, ops: &[&str]) -> (Vec<String>, String) {
    Probe::new(PROBE, "wasm://hostile/t")
        .config(config)
        .run(ops)
}

#[test]
fn only_granted_tcp_peers_connect() {
    let dir = tempfile::tempdir().unwrap();
    let granted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    other.set_nonblocking(true).unwrap();
    // Named by host name: resolved by the host at load.
    let port = granted.local_addr().unwrap().port();
    let config = hostile_config(dir.path(), &format!("net = [\"localhost:{port}\"]\n"));
    let (out, err) = run(
        &config,
        &[
            &format!("get-manifest:connect:127.0.0.1:{port}"),
            &format!("get-manifest:connect:{}", other.local_addr().unwrap()),
            "get-manifest:resolve:localhost",
        ],
    );
    assert_eq!(
        out[1],
        format!("get-manifest connect:127.0.0.1:{port} -> 0 connected"),
        "{err}"
    );
    assert!(out[2].ends_with("-> -5"), "ungranted peer: {}", out[2]);
    assert!(
        out[3].ends_with("-> -5"),
        "name lookup without dns: {}",
        out[3]
    );
    assert!(
        other.accept().is_err(),
        "the ungranted listener saw no connection"
    );
    assert!(err.contains("network access denied"), "{err}");
}

#[test]
fn name_lookups_need_their_own_grant() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "dns = true\n");
    let (out, err) = run(&config, &["get-manifest:resolve:localhost"]);
    assert!(
        out[1].contains("-> 0 [") && out[1].contains("127.0.0.1"),
        "{out:?} {err}"
    );
}

#[test]
fn only_granted_http_origins_are_reached() {
    let dir = tempfile::tempdir().unwrap();
    let (granted, granted_hits) = http_server("hello from the granted origin");
    let (other, other_hits) = http_server("must not be reached");
    let config = hostile_config(dir.path(), &format!("http = [\"http://{granted}\"]\n"));
    let (out, err) = run(
        &config,
        &[
            &format!("get-manifest:http:http://{granted}/x"),
            &format!("get-manifest:http:http://{other}/x"),
            "get-manifest:ping",
        ],
    );
    assert_eq!(
        out[1],
        format!("get-manifest http:http://{granted}/x -> 0 200 hello from the granted origin"),
        "{err}"
    );
    assert!(
        out[2].ends_with("-> -4"),
        "ungranted origin: {} {err}",
        out[2]
    );
    assert!(
        err.contains("HTTP request denied: origin not granted"),
        "{err}"
    );
    assert_eq!(out[3], "get-manifest ping -> 0 pong");
    assert_eq!(granted_hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        other_hits.load(Ordering::SeqCst),
        0,
        "no connection to the ungranted origin"
    );
}

#[test]
fn http_requests_with_userinfo_are_refused_even_to_a_granted_origin() {
    let dir = tempfile::tempdir().unwrap();
    let (granted, hits) = http_server("must not be reached with userinfo");
    let config = hostile_config(dir.path(), &format!("http = [\"http://{granted}\"]\n"));
    let with_user = format!("get-manifest:http:http://user@{granted}/x");
    let with_password = format!("get-manifest:http:http://user:pw-s3cr3t@{granted}/x");
    let (out, err) = run(&config, &[&with_user, &with_password, "get-manifest:ping"]);
    assert!(out[1].ends_with("-> -4"), "user@: {} {err}", out[1]);
    assert!(
        out[2].ends_with("-> -4"),
        "user:password@: {} {err}",
        out[2]
    );
    assert!(
        err.contains("HTTP request denied: userinfo (`user@`) in the authority"),
        "{err}"
    );
    assert!(!err.contains("pw-s3cr3t"), "the password was logged: {err}");
    assert_eq!(out[3], "get-manifest ping -> 0 pong");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "no request reached the server"
    );
}

#[test]
fn an_http_grant_with_userinfo_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(
        dir.path(),
        "http = [\"http://user:pw-s3cr3t@127.0.0.1:9\"]\n",
    );
    let started = std::time::Instant::now();
    kvwasm_tests::assert_open_refused(
        run(&config, &["get-manifest:ping"]),
        started.elapsed(),
        &["an http origin has no userinfo"],
        "pw-s3cr3t",
    );
}

#[test]
fn only_granted_environment_variables_are_visible_and_values_are_not_logged() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "env = [\"KVWASM_TEST_TOKEN\"]\n");
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t")
        .config(&config)
        .env("KVWASM_TEST_TOKEN", "s3cr3t-value")
        .env("KVWASM_TEST_OTHER", "not-for-the-guest")
        .run(&[
            "get-manifest:env:KVWASM_TEST_TOKEN",
            "get-manifest:env:KVWASM_TEST_OTHER",
            "get-manifest:env:HOME",
        ]);
    assert_eq!(
        out[1],
        "get-manifest env:KVWASM_TEST_TOKEN -> 0 s3cr3t-value"
    );
    assert!(
        out[2].ends_with("-> -2") && out[3].ends_with("-> -2"),
        "{out:?}"
    );
    assert!(
        !err.contains("s3cr3t-value"),
        "a granted value reached the log: {err}"
    );
}

#[test]
fn extra_directories_are_granted_at_their_guest_paths_and_read_only_holds() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    std::fs::write(models.join("m.txt"), b"model card").unwrap();
    let config = hostile_config(
        dir.path(),
        "dirs = [{ host = \"models\", guest = \"/models\", read_only = true }]\n",
    );
    let (out, err) = run(
        &config,
        &[
            "get-manifest:abs:/models/m.txt",
            "get-manifest:abs:/models/../data",
        ],
    );
    assert_eq!(
        out[1], "get-manifest abs:/models/m.txt -> 0 model card",
        "{err}"
    );
    assert!(out[2].contains("-> -"), "{out:?}");
}

#[test]
fn a_sha256_pin_refuses_other_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let digest = {
        let bytes = std::fs::read(kvwasm_guest_artifacts::HOSTILE_PATH).unwrap();
        kvwasm_host::component::describe(&kvwasm_host::component::ComponentSource::File(
            kvwasm_guest_artifacts::HOSTILE_PATH.into(),
        ))
        .map(|d| {
            assert_eq!(d.size, bytes.len());
            d.sha256
        })
        .unwrap()
    };
    let right = hostile_config(dir.path(), &format!("sha256 = \"{digest}\"\n"));
    let (out, err) = run(&right, &["get-manifest:ping"]);
    assert_eq!(out, ["open ok", "get-manifest ping -> 0 pong"], "{err}");

    let wrong = hostile_config(dir.path(), &format!("sha256 = \"{}\"\n", "0".repeat(64)));
    let (out, err) = run(&wrong, &["get-manifest:ping"]);
    assert_eq!(out, ["open NULL"]);
    assert!(
        err.contains("but the config pins") && err.contains(&digest),
        "{err}"
    );
}

#[test]
fn metrics_are_served_as_prometheus_text() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let probe = Probe::new(PROBE, "wasm://hostile/t")
        .config(&config)
        .env("KVWASM_METRICS_ADDR", &addr);
    // Paused after the three calls, its metrics endpoint up until resumed
    // (not for a fixed time a loaded machine might let pass unpolled).
    let mut child = probe.spawn(&[
        "get-manifest:ping",
        "get-manifest:panic",
        "get-manifest:loop",
        "pause",
    ]);
    let calls = child.until_pause();
    // Poll until the three calls are counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let text = loop {
        let text = http_get(&addr, "/metrics").unwrap_or_default();
        if text.contains("kvwasm_calls_total{backend=\"hostile\"} 3") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics never showed 3 calls: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for line in [
        "kvwasm_traps_total{backend=\"hostile\"} 1",
        "kvwasm_timeouts_total{backend=\"hostile\"} 1",
        "kvwasm_errors_total{backend=\"hostile\"} 2",
        "kvwasm_bytes_out_total{backend=\"hostile\"} 4",
        "# TYPE kvwasm_calls_total counter",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    child.resume();
    let (rest, _) = child.finish();
    assert_eq!((calls.len(), rest.len()), (4, 0), "{calls:?} {rest:?}");
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}
