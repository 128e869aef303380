//! `payload-streams`: a guest names one of its `wasi:io` streams and a
//! payload, and the host moves the bytes between them, never through
//! linear memory: `read-exact` reads a value straight into a payload,
//! `copy` keeps a lent payload past its call, and `write-all` sends a
//! payload. Driven through the hostile guest (`readexact:`, `writeall:`),
//! against a loopback peer run by the test, through the shim as an engine
//! loads it. The builtin Redis and S3 guests read long values back through
//! `read-exact` (tests/redis.rs, tests/s3.rs and tests/tls.rs read 200 kB
//! and 1 MiB values), and the S3 guest stages long values with `copy` and
//! sends them with `write-all` (tests/s3.rs).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use kvwasm_tests::{Probe, hostile_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

/// How long a peer keeps its connection open after writing: far longer than
/// any call here takes on a loaded machine, so what a call answers is never
/// the peer closing early, and a call that returned within half of it did
/// not wait for the close.
const HELD: Duration = Duration::from_secs(120);

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

/// The test's calls came back before `limit` had passed since `started`.
fn assert_within(started: Instant, limit: Duration) {
    let took = started.elapsed();
    assert!(took < limit, "{took:?}");
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
    let addr = peer(with_tail, HELD);
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
    let addr = peer(vec![letters(10)], HELD);
    let started = Instant::now();
    let (line, stderr) = read_exact(&addr, 5000, 100, "", "");
    assert!(
        line.ends_with("-> 0 ReadError::TimedOut"),
        "{line} {stderr}"
    );
    assert_within(started, HELD / 2);
}

/// A guest that asks to wait longer than its call may is cut at the
/// call's deadline like any other wait: one failed call, a fresh instance
/// for the next.
#[test]
fn the_call_deadline_ends_a_read_exact_that_waits_longer() {
    let addr = peer(vec![letters(10)], HELD);
    let started = Instant::now();
    let op = format!("get-manifest:readexact:{addr},5000,60000,");
    let (out, stderr) = run(&addr, "", &[&op, "get-manifest:ping"]);
    assert!(out[0].ends_with("-> -8"), "{out:?} {stderr}");
    assert_eq!(out[1], "get-manifest ping -> 0 pong", "{stderr}");
    assert_within(started, HELD / 2);
}

#[test]
fn the_payload_limits_refuse_before_a_byte_is_read() {
    let addr = peer(vec![letters(10)], HELD);
    // Over the size of one payload.
    let (line, stderr) = read_exact(&addr, 3 << 20, 250, "", "max_payload_mib = 2\n");
    assert!(
        line.contains("-> 0 ReadError::Limit(") && line.contains("over the payload limit"),
        "{line} {stderr}"
    );
    // A head longer than the value.
    let addr = peer(vec![letters(10)], HELD);
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
    let addr = peer(vec![letters(1000)], HELD);
    let (line, stderr) = read_exact(&addr, 1000, 250, "", "tls = true\n");
    assert!(line.contains("-> 0 ReadError::Failed("), "{line} {stderr}");
    assert!(!line.contains("abcdef"), "{line}");
    assert!(stderr.contains("plain text refused"), "{stderr}");
}

/// A peer on loopback that reads everything sent on one connection until
/// the sender closes it, then hands the bytes over.
fn sink() -> (String, std::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let _ = conn.read_to_end(&mut got);
        let _ = tx.send(got);
    });
    (addr, rx)
}

/// `writeall` of `data` to `addr` (see the hostile guest); the probe's
/// output lines and its stderr.
fn write_all(
    addr: &str,
    ms: u64,
    mode: &str,
    times: usize,
    data: &str,
    extra: &str,
    then: &[&str],
) -> (Vec<String>, String) {
    let op = format!("put-manifest:writeall:{addr},{ms},{mode},{times}={data}");
    let ops: Vec<&str> = std::iter::once(op.as_str())
        .chain(then.iter().copied())
        .collect();
    run(addr, extra, &ops)
}

#[test]
fn a_lent_payload_and_a_kept_copy_reach_the_peer_byte_for_byte() {
    // Longer than one permitted write of a socket stream, so both the
    // copying path (lent) and the slicing path (a copy) take turns.
    let data = String::from_utf8(letters(120_000)).unwrap();
    for mode in ["lent", "copy"] {
        let (addr, received) = sink();
        let (out, stderr) = write_all(&addr, 2000, mode, 3, &data, "", &[]);
        assert!(
            out[0].ends_with("-> 0"),
            "{mode}: {} {stderr}",
            &out[0][..100]
        );
        let got = received.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got.len(), 3 * data.len(), "{mode}");
        assert!(
            got.chunks(data.len()).all(|c| c == data.as_bytes()),
            "{mode}: the bytes differ"
        );
    }
}

/// A peer that stops reading fills the socket's buffers; `write-all` then
/// answers `timed-out` at the guest's own timeout, inside the call's
/// deadline, and the next call is served.
#[test]
fn a_peer_that_stops_reading_times_the_write_out() {
    let data = String::from_utf8(letters(100_000)).unwrap();
    let addr = peer(vec![], HELD);
    let started = Instant::now();
    let (out, stderr) = write_all(&addr, 100, "copy", 500, &data, "", &["get-manifest:ping"]);
    assert!(!out[0].ends_with("-> 0"), "{stderr}");
    assert!(stderr.contains("WriteError::TimedOut"), "{stderr}");
    assert!(!stderr.contains("abcdefghij"), "the bytes are not logged");
    assert_eq!(out[1], "get-manifest ping -> 0 pong", "{stderr}");
    assert_within(started, HELD / 2);
}

/// Waiting longer than the call may is cut at the call's deadline: one
/// failed call, a fresh instance for the next.
#[test]
fn the_call_deadline_ends_a_write_all_that_waits_longer() {
    let data = String::from_utf8(letters(100_000)).unwrap();
    let addr = peer(vec![], HELD);
    let (out, stderr) = write_all(
        &addr,
        60_000,
        "lent",
        500,
        &data,
        "",
        &["get-manifest:ping"],
    );
    assert!(out[0].ends_with("-> -8"), "{} {stderr}", &out[0][..80]);
    assert_eq!(out[1], "get-manifest ping -> 0 pong", "{stderr}");
}

/// Copies are payloads like any other: charged to the instance while it
/// keeps them (`max_payload_mib`), for the whole buffer each takes (its
/// size class, `payload/recycle.rs`), released when it drops them.
#[test]
fn kept_copies_count_against_the_payload_limit_until_dropped() {
    let limit = "max_payload_mib = 1\n";
    let addr = "127.0.0.1:9";
    // 100,000 bytes take a buffer of 106,496 (a sixteenth of 128 KiB
    // steps): 1 MiB holds nine such copies, not ten.
    let uneven = String::from_utf8(letters(100_000)).unwrap();
    let (out, stderr) = write_all(addr, 0, "hoard", 10, &uneven, limit, &[]);
    assert!(!out[0].ends_with("-> 0"), "{stderr}");
    assert!(
        stderr.contains("copy 9: 106496 more bytes would exceed"),
        "{stderr}"
    );
    // 96 KiB is a class of its own: 1 MiB holds ten copies, not eleven.
    let data = String::from_utf8(letters(96 << 10)).unwrap();
    let (out, stderr) = write_all(
        addr,
        0,
        "hoard",
        11,
        &data,
        limit,
        &[&format!("put-manifest:writeall:{addr},0,hoard,10={data}")],
    );
    assert!(!out[0].ends_with("-> 0"), "{stderr}");
    assert!(
        stderr.contains("copy 10: ") && stderr.contains("would exceed"),
        "{stderr}"
    );
    // The ten copies of the call before were released with it.
    assert!(out[1].ends_with("-> 0"), "{stderr}");
}

/// A backend with a `tls` entry must hand its socket's streams to
/// `wasi:tls`; writing plain text through `write-all` is refused like any
/// other plain-text write.
#[test]
fn a_tls_only_socket_takes_no_plain_text_through_write_all() {
    let (addr, received) = sink();
    let (out, stderr) = write_all(&addr, 1000, "copy", 1, "secret-bytes", "tls = true\n", &[]);
    assert!(!out[0].ends_with("-> 0"), "{stderr}");
    assert!(stderr.contains("WriteError::Failed("), "{stderr}");
    assert!(stderr.contains("plain text refused"), "{stderr}");
    let got = received.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(got.is_empty(), "{got:?}");
}

/// A copy handed to a stream stays charged to the instance while the
/// stream holds any of it, even after the guest dropped the payload: here
/// the bodies of HTTP requests never sent keep slices of 40 MiB copies.
/// Each call holds its 40 MiB source payload and its copy at once, so a
/// 120 MiB `max_payload_mib` lets two calls through and refuses the third
/// copy (80 MiB still held by the bodies); uncharged, every call would fit.
#[test]
fn bytes_a_stream_still_holds_stay_charged_after_the_payload_is_dropped() {
    let pin = "put-manifest:pinhttp:40,1";
    // A deadline of 30 s, not the hostile config's 300 ms: copying 40 MiB
    // may take longer than that on a loaded machine, and the deadline is
    // not what this test is about.
    let limits = "max_payload_mib = 120\n[backends.hostile.tenants.t]\ncall_timeout_ms = 30000\n";
    let (out, stderr) = run("127.0.0.1:9", limits, &[pin, pin, pin]);
    assert_eq!(out[0], "put-manifest pinhttp:40,1 -> 0", "{stderr}");
    assert_eq!(out[1], "put-manifest pinhttp:40,1 -> 0", "{stderr}");
    assert!(!out[2].ends_with("-> 0"), "{out:?} {stderr}");
    assert!(
        stderr.contains("copy 0: ") && stderr.contains("would exceed"),
        "{stderr}"
    );
}
