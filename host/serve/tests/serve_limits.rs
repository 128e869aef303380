//! What slow clients can make `kvwasm serve` hold, measured as this
//! process's peak RSS (`VmHWM`): the only test in its binary, so nothing
//! else runs in the process meanwhile.

use std::io::Write;
use std::net::TcpStream;

use common::{Harness, wait_for};

mod common;

/// A field of /proc/self/status, KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{field} missing:\n{status}"))
}

/// 16 clients ask the hostile guest for 48 MiB answers and never read
/// them. The documented bound (docs/security.md): the server holds at
/// most the guest's memory, one answer being checked (`max_response_mib`)
/// and `held_response_mib` of answers for clients, plus its own fixed
/// cost. Uncapped, it held every answer: 16 × 48 MiB.
#[test]
fn slow_clients_of_huge_answers_leave_rss_within_the_documented_bound() {
    const MEMORY_MIB: u64 = 64;
    const MAX_RESPONSE_MIB: u64 = 64;
    const HELD_MIB: u64 = 64;
    /// Threads, connection buffers, allocator slack.
    const FIXED_MIB: u64 = 32;
    let h = Harness::with_component(
        "huge",
        kvwasm_guest_artifacts::HOSTILE_SUBSCRIBER_PATH,
        &format!("memory_limit_mib = {MEMORY_MIB}"),
        &format!(
            "max_response_mib = {MAX_RESPONSE_MIB}\nheld_response_mib = {HELD_MIB}\n\
             max_connections = 8\nclient_timeout_ms = 1000"
        ),
    );
    // Warm up: the guest's memory grows to hold one answer, read in full.
    let (status, body) = h.call("POST", "/query", "huge:48");
    assert_eq!((status, body.len()), (200, 48 << 20));
    drop(body);
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let base = status_kib("VmHWM:");

    let clients: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut stream = TcpStream::connect(h.addr()).unwrap();
            stream
                .write_all(b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\nhuge:48")
                .unwrap();
            stream
        })
        .collect();
    let answered = |class: &str| {
        let sample =
            format!("kvwasm_serve_http_requests_total{{endpoint=\"/query\",class=\"{class}\"}}");
        let metrics = h.metrics();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(sample.as_str())?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_for("every request answered", || {
        answered("2xx") + answered("5xx") == 1 + 16
    });
    assert!(
        answered("5xx") >= 1,
        "some were refused: the budget was spent"
    );
    // Clients that never read are dropped, and their answers with them.
    wait_for("every held answer released", || {
        h.metric("kvwasm_serve_held_response_bytes") == 0
    });
    let peak_mib = (status_kib("VmHWM:") - base) / 1024;
    let bound = MEMORY_MIB + MAX_RESPONSE_MIB + HELD_MIB + FIXED_MIB;
    assert!(
        peak_mib <= bound,
        "peak RSS grew by {peak_mib} MiB, bound {bound} MiB"
    );
    let (status, body) = h.call("POST", "/query", "huge:48");
    assert_eq!((status, body.len()), (200, 48 << 20), "served again");
    drop(clients);
}
