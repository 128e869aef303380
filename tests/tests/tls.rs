//! TLS to Redis (`builtin:redis` asks the host for a `wasi:tls` session on
//! its granted socket; the host verifies the server against the operator's
//! `ca_file`): mutual TLS works, and every bad peer fails `open` with a
//! clear logged reason within the guest's timeout, never a hang and never
//! plain text. Real `redis-server`s with `tls-port` on loopback, with
//! certificates made at test time (`kvwasm_tests::tls::Pki`). The
//! conformance runs over TLS (Redis, and S3 behind stunnel) are in
//! host/cli/tests/check.rs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kvwasm_tests::servers::RedisServer;
use kvwasm_tests::tls::Pki;
use kvwasm_tests::{Probe, assert_open_refused, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");
const PASSWORD_VAR: &str = "KVWASM_TEST_REDIS_PASSWORD";

/// A config for `builtin:redis` at `addr`, with the password variable
/// granted and `tls` lines (the backend's TLS table, or nothing).
fn config(dir: &Path, addr: &str, tls: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{addr}\"]\n\
             env = [\"{PASSWORD_VAR}\"]\ncall_timeout_ms = 5000\n{tls}\n\
             [backends.redis.settings]\naddress = \"{addr}\"\n\
             password_env = \"{PASSWORD_VAR}\"\ntimeout_ms = 1000\n"
        ),
    )
}

fn ca_only(ca: &Path) -> String {
    format!("[backends.redis.tls]\nca_file = \"{}\"", ca.display())
}

fn run(config: &Path, password: Option<&str>, ops: &[&str]) -> (Vec<String>, String) {
    let probe = Probe::new(PROBE, "wasm://redis/ns").config(config);
    match password {
        Some(p) => probe.env(PASSWORD_VAR, p),
        None => probe,
    }
    .run(ops)
}

/// `open` fails within the guest's timeout with each of `reasons` logged.
fn assert_refused(config: &Path, password: Option<&str>, reasons: &[&str]) {
    let started = Instant::now();
    let outcome = run(config, password, &["get-manifest:m"]);
    assert_open_refused(outcome, started.elapsed(), reasons, "no secret here");
}

#[test]
fn mutual_tls_works_with_the_client_certificate_and_fails_open_without_it() {
    let pki = Pki::new();
    let server = RedisServer::start_tls(&pki, &pki.server, true, true);
    let password = server.password.as_deref();
    let dir = tempfile::tempdir().unwrap();
    let addr = server.addr.to_string();
    let mutual = format!(
        "{}\nclient_cert = \"{}\"\nclient_key = \"{}\"",
        ca_only(&pki.ca),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    let (out, stderr) = run(
        &config(dir.path(), &addr, &mutual),
        password,
        &["put-manifest:m=over tls", "get-manifest:m"],
    );
    assert_eq!(
        out,
        [
            "open ok",
            "put-manifest m=over tls -> 0",
            "get-manifest m -> 0 over tls"
        ],
        "{stderr}"
    );
    assert_eq!(
        server.cli(&["GET", "kvwasm/ns/manifests/m"]).trim(),
        "over tls"
    );
    // No client certificate: the server ends the session at the `AUTH`.
    assert_refused(
        &config(dir.path(), &addr, &ca_only(&pki.ca)),
        password,
        &["redis at"],
    );
}

/// A `client_cert` that names the key file (or a `client_key` that names
/// the certificate) is a configuration error naming the file and what it
/// holds, when the backend loads: not a handshake that sends no
/// certificate and fails with "peer sent no certificates".
#[test]
fn a_client_cert_naming_the_key_file_is_a_clear_configuration_error() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let load = |cert: &Path, key: &Path| {
        let tls = format!(
            "{}\nclient_cert = \"{}\"\nclient_key = \"{}\"",
            ca_only(&pki.ca),
            cert.display(),
            key.display()
        );
        let path = config(dir.path(), "127.0.0.1:6380", &tls);
        kvwasm_host::config::Config::load(&path)
            .unwrap()
            .backend("redis")
            .map(drop)
    };
    let (cert, key) = (&pki.client.cert, &pki.client.key);
    assert_eq!(load(cert, key), Ok(()));
    let err = load(key, key).unwrap_err();
    assert_eq!(
        err,
        format!(
            "backend \"redis\": tls: client_cert {} holds no PEM certificate (it holds a \
             private key); it must be the client's certificate chain, its key goes in client_key",
            key.display()
        )
    );
    let err = load(cert, cert).unwrap_err();
    assert_eq!(
        err,
        format!(
            "backend \"redis\": tls: client_key {} holds no PEM private key (it holds a \
             certificate)",
            cert.display()
        )
    );
    // The key's text is never echoed.
    let key_text = std::fs::read_to_string(key).unwrap();
    let body = key_text.lines().nth(1).unwrap();
    assert!(!load(key, key).unwrap_err().contains(body));
}

#[test]
fn a_wrong_ca_an_expired_certificate_and_a_wrong_name_each_fail_open() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let good = RedisServer::start_tls(&pki, &pki.server, false, false);
    let addr = good.addr.to_string();
    let (out, stderr) = run(
        &config(dir.path(), &addr, &ca_only(&pki.ca)),
        None,
        &["get-manifest:m"],
    );
    assert_eq!(out, ["open ok", "get-manifest m -> -2"], "{stderr}");

    // A CA that did not sign the server's certificate.
    let wrong_ca = config(dir.path(), &addr, &ca_only(&pki.other_ca));
    assert_refused(&wrong_ca, None, &["TLS handshake failed", "UnknownIssuer"]);
    // The public roots alone (`tls = true`) do not trust a private CA.
    assert_refused(
        &config(dir.path(), &addr, "tls = true"),
        None,
        &["TLS handshake failed", "UnknownIssuer"],
    );
    // The operator names another server than the certificate's.
    let other_name = format!("{}\nserver_name = \"cache.example\"", ca_only(&pki.ca));
    assert_refused(
        &config(dir.path(), &addr, &other_name),
        None,
        &["TLS handshake failed", "not valid for name"],
    );

    let expired = RedisServer::start_tls(&pki, &pki.expired, false, false);
    let config_expired = config(dir.path(), &expired.addr.to_string(), &ca_only(&pki.ca));
    assert_refused(
        &config_expired,
        None,
        &["TLS handshake failed", "certificate expired"],
    );

    let wrong_name = RedisServer::start_tls(&pki, &pki.wrong_name, false, false);
    let config_wrong = config(dir.path(), &wrong_name.addr.to_string(), &ca_only(&pki.ca));
    assert_refused(
        &config_wrong,
        None,
        &["TLS handshake failed", "not valid for name"],
    );
}

#[test]
fn plain_text_and_tls_never_mix_and_a_silent_peer_costs_one_timeout() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();

    // A plain-text server where TLS is configured: it waits for a command
    // line that never comes, and the handshake times out.
    let plain = RedisServer::start();
    let addr = plain.addr.to_string();
    // Each reading is one authenticated redis-cli connection of its own.
    let readings = || {
        (
            plain.info_stat("total_connections_received"),
            plain.calls("auth"),
        )
    };
    let (connections, auths) = readings();
    assert_refused(
        &config(dir.path(), &addr, &ca_only(&pki.ca)),
        plain.password.as_deref(),
        &["TLS handshake did not complete in time"],
    );
    // The guest connected, but sent no `AUTH`: the password never went out.
    assert_eq!(readings(), (connections + 3, auths + 2));

    // A TLS-only server reached without TLS: the server drops the session.
    let tls = RedisServer::start_tls(&pki, &pki.server, true, false);
    assert_refused(
        &config(dir.path(), &tls.addr.to_string(), ""),
        tls.password.as_deref(),
        // Reset or closed, depending on timing: either way at once.
        &["redis at 127.0.0.1"],
    );

    // A peer that accepts and never answers the handshake.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    // Held until the run is over, however long a loaded machine takes.
    let (done, over) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let held = silent.accept();
        let _ = over.recv();
        drop(held);
    });
    let started = Instant::now();
    let outcome = run(
        &config(dir.path(), &silent_addr, &ca_only(&pki.ca)),
        None,
        &["get-manifest:m"],
    );
    let took = started.elapsed();
    drop(done);
    assert!(took.as_millis() >= 900, "took {took:?}");
    assert_open_refused(
        outcome,
        took,
        &["TLS handshake did not complete in time"],
        "no secret here",
    );
    holder.join().unwrap();
}

/// A hostile guest of a backend with a `tls` entry writes plain text on
/// its granted socket instead of handing the streams to `wasi:tls`: the
/// host refuses every byte, so the operator's "TLS only" holds whatever
/// the vendor's code does.
#[test]
fn a_guest_with_a_tls_grant_cannot_write_plain_text_on_its_socket() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let peer = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = peer.local_addr().unwrap().to_string();
    let reader = std::thread::spawn(move || {
        let (mut conn, _) = peer.accept().unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let mut got = Vec::new();
        let _ = conn.read_to_end(&mut got);
        got
    });
    let config =
        kvwasm_tests::hostile_config(dir.path(), &format!("net = [\"{addr}\"]\ntls = true\n"));
    let (out, stderr) = Probe::new(PROBE, "wasm://hostile/t")
        .config(&config)
        .run(&[&format!("get-manifest:send:{addr}")]);
    let got = reader.join().unwrap();
    assert!(
        got.is_empty(),
        "plain text reached the peer: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(!out[1].ends_with("sent"), "{out:?} {stderr}");
    assert!(stderr.contains("plain text refused"), "{stderr}");
}
