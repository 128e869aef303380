//! `payload-streams.read-exact`: a guest names one of its `wasi:io` input
//! streams and a length, and the host reads the value straight into a
//! payload. Driven through the hostile guest (`readexact:`), against a
//! loopback peer run by the test, through the shim as an engine loads it.
//! The builtin Redis and S3 guests use it for long values (their own
//! tests, tests/redis.rs, tests/s3.rs and tests/tls.rs, read 200 kB and
//! 1 MiB values back through it).

use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use kvwasm_tests::{Probe, hostile_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

/// A peer on loopback that writes `chunks`, pausing between them so the
/// host has to wait on the stream, then keeps the connection open for
/// `linger` (or closes it at once).
fn peer(chunks: Vec<Vec<u8>>, linger: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        for chunk in chunks {
            std::thread::sleep(Duration::from_millis(5));
            if conn.write_all(&chunk).is_err() {
                return;
            }
        }
        std::thread::sleep(linger);
    });
    addr
}

/// Run `ops` on the hostile guest granted `addr`, with `extra` added to
/// its config; the probe's output lines after `open ok`, and its stderr.
fn run(addr: &str, extra: &str, ops: &[&str]) -> (Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), &format!("net = [\"{addr}\"]\n{extra}"));
    let (mut out, stderr) = Probe::new(PROBE, "wasm://hostile/t")
        .config(&config)
        .run(ops);
    assert_eq!(out.remove(0), "open ok", "{stderr}");
    (out, stderr)
}

/// `readexact` from `addr`; the probe's output line and its stderr.
fn read_exact(addr: &str, len: usize, ms: u64, head: &str, extra: &str) -> (String, String) {
    let op = format!("get-manifest:readexact:{addr},{len},{ms},{head}");
    let (out, stderr) = run(addr, extra, &[&op]);
    (out[0].clone(), stderr)
}

fn letters(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

#[test]
fn a_value_arriving_in_pieces_is_read_exactly_after_its_head() {
    let body = letters(300_000);
    let chunks: Vec<Vec<u8>> = body.chunks(70_000).map(<[u8]>::to_vec).collect();
    // More than the value follows: nothing past `len` may be taken.
    let mut with_tail = chunks;
    with_tail.push(b"NEXT-REPLY".to_vec());
    let addr = peer(with_tail, Duration::from_secs(2));
    let (line, stderr) = read_exact(&addr, 2 + body.len(), 250, "HD", "");
    let expected = format!("HD{}", String::from_utf8(body).unwrap());
    assert!(
        line == format!("get-manifest readexact:{addr},300002,250,HD -> 0 {expected}"),
        "{} bytes: {}... {stderr}",
        line.len(),
        &line[..line.len().min(200)]
    );
}

#[test]
fn a_stream_that_ends_early_is_closed_and_a_silent_one_times_out() {
    let addr = peer(vec![letters(1000)], Duration::ZERO);
    let (line, stderr) = read_exact(&addr, 5000, 250, "", "");
    assert!(line.ends_with("-> 0 ReadError::Closed"), "{line} {stderr}");

    // The guest's own timeout, well inside the call's 300 ms deadline: an
    // answer, not a lost instance.
    let addr = peer(vec![letters(10)], Duration::from_secs(2));
    let started = Instant::now();
    let (line, stderr) = read_exact(&addr, 5000, 100, "", "");
    assert!(
        line.ends_with("-> 0 ReadError::TimedOut"),
        "{line} {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// A guest that asks to wait longer than its call may is cut at the
/// call's deadline like any other wait: one failed call, a fresh instance
/// for the next.
#[test]
fn the_call_deadline_ends_a_read_exact_that_waits_longer() {
    let addr = peer(vec![letters(10)], Duration::from_secs(3));
    let started = Instant::now();
    let op = format!("get-manifest:readexact:{addr},5000,60000,");
    let (out, stderr) = run(&addr, "", &[&op, "get-manifest:ping"]);
    assert!(out[0].ends_with("-> -8"), "{out:?} {stderr}");
    assert_eq!(out[1], "get-manifest ping -> 0 pong", "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn the_payload_limits_refuse_before_a_byte_is_read() {
    let addr = peer(vec![letters(10)], Duration::from_secs(1));
    // Over the size of one payload.
    let (line, stderr) = read_exact(&addr, 3 << 20, 250, "", "max_payload_mib = 2\n");
    assert!(
        line.contains("-> 0 ReadError::Limit(") && line.contains("over the payload limit"),
        "{line} {stderr}"
    );
    // A head longer than the value.
    let addr = peer(vec![letters(10)], Duration::from_secs(1));
    let (line, stderr) = read_exact(&addr, 2, 250, "head", "");
    assert!(
        line.contains("-> 0 ReadError::Limit(") && line.contains("longer than"),
        "{line} {stderr}"
    );
}

/// A backend with a `tls` entry must hand its socket's streams to
/// `wasi:tls`; reading them raw through `read-exact` is refused like any
/// other plain-text read, and the refusal is logged and counted.
#[test]
fn a_tls_only_socket_yields_no_plain_text_through_read_exact() {
    let addr = peer(vec![letters(1000)], Duration::from_secs(1));
    let (line, stderr) = read_exact(&addr, 1000, 250, "", "tls = true\n");
    assert!(line.contains("-> 0 ReadError::Failed("), "{line} {stderr}");
    assert!(!line.contains("abcdef"), "{line}");
    assert!(stderr.contains("plain text refused"), "{stderr}");
}
