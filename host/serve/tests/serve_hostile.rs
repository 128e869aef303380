//! `kvwasm serve` with a hostile event service as its indexer
//! (tests/guests/hostile-subscriber): instances lost in every `on-batch`
//! or every request reach the back-off, and requests waiting behind a hung
//! call are answered within their own deadline.

use std::time::{Duration, Instant};

use common::{Harness, wait_for};
use kvwasm_host::subscriber::{BlocksStored, Event, EventData, SourceKind};

mod common;

fn hostile(name: &str, limits: &str) -> Harness {
    let h = Harness::with_component(
        name,
        kvwasm_guest_artifacts::HOSTILE_SUBSCRIBER_PATH,
        limits,
        "",
    );
    // Logged, so every rebuild replays it through `handle`, successfully.
    let (status, _) = h.call("POST", "/register", "{}");
    assert_eq!(status, 201);
    h
}

/// An event the hostile guest panics on (a store naming its model and
/// block size: the host hands it over without a registration).
fn poison() -> Vec<Event> {
    vec![Event {
        worker_id: 666,
        dp_rank: 0,
        event_id: 1,
        source: SourceKind::Zmq,
        model: Some("m".into()),
        tenant: None,
        data: EventData::Stored(BlocksStored {
            block_hashes: vec![1],
            parent_hash: None,
            token_ids: Vec::new(),
            tokens_hashes: Vec::new(),
            block_size: Some(16),
            lora_name: None,
            tier: None,
        }),
    }]
}

/// Traps and back-offs so far. Every instance lost from the 3rd in a row
/// (none succeeds live here) starts a back-off, so traps ≤ back-offs + 2.
fn traps_and_backoffs(h: &Harness) -> (u64, u64) {
    (
        h.guest_metric("kvwasm_traps_total", "backend"),
        h.guest_metric("kvwasm_serve_backoffs_total", "guest"),
    )
}

#[test]
fn a_subscriber_panicking_in_every_on_batch_backs_off_within_3_losses() {
    let h = hostile("panics_on_batch", "");
    wait_for("the back-off", || {
        h.publish(poison());
        std::thread::sleep(Duration::from_millis(10));
        traps_and_backoffs(&h).1 >= 1
    });
    // Read between a trap and its count as a loss, the two may differ by
    // one for a moment; a guest that never backs off never satisfies it.
    wait_for("traps ≤ back-offs + 2", || {
        let (traps, backoffs) = traps_and_backoffs(&h);
        traps <= backoffs + 2
    });
}

#[test]
fn a_subscriber_panicking_on_every_query_backs_off_within_3_losses() {
    let h = hostile("panics_on_query", "");
    for _ in 0..3 {
        let (status, body) = h.call("POST", "/query", "panic");
        assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    }
    assert_eq!(traps_and_backoffs(&h), (3, 1));
    let calls = h.guest_metric("kvwasm_calls_total", "backend");
    for _ in 0..20 {
        assert_eq!(h.call("POST", "/query", "panic").0, 503);
    }
    let (traps, backoffs) = traps_and_backoffs(&h);
    assert!(traps <= backoffs + 2, "{traps} traps, {backoffs} back-offs");
    // Each loss replays the log (one registration) at most once.
    let more_calls = h.guest_metric("kvwasm_calls_total", "backend") - calls;
    assert!(
        more_calls <= 2 * (traps - 3),
        "{more_calls} calls for {} traps",
        traps - 3
    );
}

/// 20 concurrent requests behind a guest that hangs each of them: every
/// one is answered 503 within its deadline plus slack (3×; the wait used
/// to add one deadline per request queued ahead, 20× for the last).
#[test]
fn requests_behind_a_hung_guest_are_answered_within_their_deadline() {
    let deadline = Duration::from_millis(1000);
    let h = hostile("hangs", "call_timeout_ms = 1000");
    let url = h.url("/query");
    let answers: Vec<(u16, Duration)> = std::thread::scope(|s| {
        let requests: Vec<_> = (0..20)
            .map(|_| {
                let (client, url) = (&h.client, &url);
                s.spawn(move || {
                    let start = Instant::now();
                    let status = client.post(url).body("hang").send().unwrap().status();
                    (status.as_u16(), start.elapsed())
                })
            })
            .collect();
        requests.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (status, took) in &answers {
        assert_eq!(*status, 503);
        assert!(*took < 3 * deadline, "answered after {took:?}: {answers:?}");
    }
}
