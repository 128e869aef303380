//! Tenants of one backend are isolated: one tenant's traps, deadlines and
//! memory blow-ups cost its own calls only; other tenants keep working with
//! their data intact. Repeated traps (in calls or while an instance starts)
//! back off instead of spinning, and a backend's cap on concurrent calls
//! queues callers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvwasm_host::config::Config;
use kvwasm_host::handle::open_shared;
use kvwasm_host::{Backend, KvError, StoreHandle};
use kvwasm_tests::backoff::{FIRST_BACKOFF, refused_while_backing_off};

fn hostile(dir: &std::path::Path, extra: &str) -> Arc<Backend> {
    let text = format!(
        "[backends.hostile]\ncomponent = {:?}\ndir = \"data\"\nmemory_limit_mib = 64\n\
         call_timeout_ms = 5000\n{extra}",
        kvwasm_guest_artifacts::HOSTILE_PATH
    );
    Arc::new(
        Config::parse(&text, dir)
            .unwrap()
            .backend("hostile")
            .unwrap(),
    )
}

fn text(store: &StoreHandle, name: &str) -> Result<String, KvError> {
    store
        .get_manifest(name)
        .map(|b| String::from_utf8_lossy(b.as_slice()).into_owned())
}

#[test]
fn a_tenant_killed_by_its_deadline_leaves_other_tenants_working() {
    let dir = tempfile::tempdir().unwrap();
    let backend = hostile(
        dir.path(),
        "[backends.hostile.tenants.doomed]\ncall_timeout_ms = 150\n",
    );
    let doomed = open_shared(backend.clone(), "doomed").unwrap();
    let healthy = open_shared(backend.clone(), "healthy").unwrap();
    // Counted, not timed: the hammers run for as long as the killer does.
    let killing = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|s| {
        // One tenant loops forever, call after call.
        let killer = s.spawn(|| {
            let mut failures = 0;
            for _ in 0..8 {
                match doomed.get_manifest("loop") {
                    Err(KvError::Timeout(150) | KvError::Unavailable(_)) => failures += 1,
                    other => panic!("a loop must not return: {other:?}"),
                }
            }
            killing.store(false, std::sync::atomic::Ordering::SeqCst);
            failures
        });
        // Six threads hammer the other tenant meanwhile.
        let hammers: Vec<_> = (0..6)
            .map(|t| {
                let (healthy, killing) = (&healthy, &killing);
                s.spawn(move || {
                    let mut calls = 0;
                    while killing.load(std::sync::atomic::Ordering::SeqCst) || calls <= 10 {
                        let (name, value) = (format!("t{t}"), format!("v{calls}"));
                        healthy.put_manifest(&name, value.as_bytes()).unwrap();
                        assert_eq!(text(healthy, &name).unwrap(), value);
                        assert_eq!(text(healthy, "ping").unwrap(), "pong");
                        calls += 1;
                    }
                    calls
                })
            })
            .collect();
        let failures = killer.join().unwrap();
        assert_eq!(failures, 8, "the doomed tenant kept being cut off");
        for h in hammers {
            assert!(
                h.join().unwrap() > 10,
                "the healthy tenant kept being served"
            );
        }
    });
    for t in 0..6 {
        assert!(text(&healthy, &format!("t{t}")).unwrap().starts_with('v'));
    }
    assert_eq!(text(&healthy, "ping").unwrap(), "pong");
}

#[test]
fn repeated_traps_back_off_then_recover() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_shared(hostile(dir.path(), ""), "t").unwrap();
    // Backing off: refused, without starting another instance.
    let why = refused_while_backing_off(|| {
        let mut began = Instant::now();
        for _ in 0..3 {
            began = Instant::now();
            assert!(matches!(
                store.get_manifest("panic"),
                Err(KvError::Trapped(_))
            ));
        }
        (began, store.get_manifest("ping"))
    });
    assert!(why.contains("3 instances in a row"), "{why}");
    assert_eq!(store.live_instances(), 0);
    std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(30));
    assert_eq!(
        text(&store, "ping").unwrap(),
        "pong",
        "recovered after the back-off"
    );
    // A success resets the count: one more trap is just a trap.
    assert!(matches!(
        store.get_manifest("panic"),
        Err(KvError::Trapped(_))
    ));
    assert_eq!(text(&store, "ping").unwrap(), "pong");
}

/// A guest that traps while it starts loses an instance per call as surely
/// as one that traps in a call: it backs off the same way, and the refusal
/// says what kept failing.
#[test]
fn a_guest_that_traps_while_starting_backs_off_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_shared(hostile(dir.path(), ""), "t").unwrap();
    store.put_manifest("trap-on-open", b"on").unwrap();
    assert!(matches!(
        store.get_manifest("panic"),
        Err(KvError::Trapped(_))
    ));
    // Each call now starts an instance that traps in `open`.
    let mut last_loss = Instant::now();
    for _ in 0..2 {
        last_loss = Instant::now();
        match store.get_manifest("ping") {
            Err(KvError::Trapped(why)) => assert!(why.contains("traps while opening"), "{why}"),
            other => panic!("expected the constructor's trap, got {other:?}"),
        }
        assert_eq!(store.live_instances(), 0);
    }
    // A call the back-off no longer refused (this thread ran too late) is
    // one more such loss, which doubles the back-off.
    let mut losses = 3;
    let why = refused_while_backing_off(|| {
        let began = Instant::now();
        let result = store.get_manifest("ping");
        if matches!(&result, Err(KvError::Trapped(_))) {
            losses += 1;
        }
        (std::mem::replace(&mut last_loss, began), result)
    });
    assert!(
        why.contains(&format!("{losses} instances in a row")),
        "{why}"
    );
    assert!(why.contains("traps while opening"), "{why}");
    assert_eq!(store.live_instances(), 0);
    std::fs::remove_file(dir.path().join("data/trap-on-open")).unwrap();
    std::thread::sleep(FIRST_BACKOFF * (1 << (losses - 3)) + Duration::from_millis(30));
    assert_eq!(
        text(&store, "ping").unwrap(),
        "pong",
        "a fresh instance starts once the back-off is over"
    );
}

/// The deadline of the calls in
/// [`a_caller_waiting_for_an_instance_is_refused_when_the_back_off_starts`].
const READ_DEADLINE_MS: u64 = 1000;

/// A call that waited for the handle's only instance while that instance
/// was lost is refused once the loss starts the back-off, rather than
/// starting yet another instance.
#[test]
fn a_caller_waiting_for_an_instance_is_refused_when_the_back_off_starts() {
    let dir = tempfile::tempdir().unwrap();
    // A peer that never answers: a guest reading from it is in its call
    // (holding the only instance) once the peer has accepted it.
    let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = peer.local_addr().unwrap();
    let backend = hostile(
        dir.path(),
        &format!(
            "net = [\"{addr}\"]\nmax_instances = 1\n\
             [backends.hostile.tenants.t]\ncall_timeout_ms = {READ_DEADLINE_MS}\n"
        ),
    );
    let store = open_shared(backend, "t").unwrap();
    // The waiter is woken when the loss starts the back-off; a busy machine
    // may run it only after the back-off's 50 ms, when a start is right.
    let why = refused_while_backing_off(|| {
        // After an attempt whose waiter came too late (it may have lost a
        // start of its own), a success first: the count starts from zero.
        for _ in 0..200 {
            match store.get_manifest("ping") {
                Ok(_) => break,
                Err(_) => std::thread::sleep(FIRST_BACKOFF),
            }
        }
        for _ in 0..2 {
            assert!(matches!(
                store.get_manifest("panic"),
                Err(KvError::Trapped(_))
            ));
        }
        std::thread::scope(|s| {
            // The third loss: a read cut by its deadline.
            let reading = s.spawn(|| store.get_manifest(&format!("read-socket:{addr}")).err());
            let _peer = peer.accept().unwrap();
            // Arrives before the back-off starts (the read holds the
            // instance until its deadline), then waits for the instance.
            // Half a deadline later than the read: the read's loss (found
            // at an epoch tick, then unwound) comes well before the
            // waiter's own deadline, which would otherwise end the wait
            // first whenever the two calls begin within a tick.
            std::thread::sleep(Duration::from_millis(READ_DEADLINE_MS / 2));
            let waited = Instant::now();
            let result = store.get_manifest("ping");
            assert!(matches!(reading.join().unwrap(), Some(KvError::Timeout(_))));
            (waited, result)
        })
    });
    assert!(why.contains("3 instances in a row"), "{why}");
    assert_eq!(
        store.live_instances(),
        0,
        "no instance was started for the waiter"
    );
}

#[test]
fn tenant_memory_limits_are_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let backend = hostile(
        dir.path(),
        "[backends.hostile.tenants.small]\nmemory_limit_mib = 16\n",
    );
    let small = open_shared(backend.clone(), "small").unwrap();
    let large = open_shared(backend, "large/sub").unwrap();
    match small.get_manifest("alloc:32") {
        Err(KvError::Trapped(why)) => assert!(why.contains("out of memory"), "{why}"),
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert_eq!(text(&large, "alloc:32").unwrap(), "allocated");
    assert_eq!(text(&small, "ping").unwrap(), "pong");
}

#[test]
fn max_concurrent_calls_queues_callers() {
    let dir = tempfile::tempdir().unwrap();
    let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = peer.local_addr().unwrap();
    let backend = hostile(
        dir.path(),
        &format!(
            "net = [\"{addr}\"]\nmax_concurrent_calls = 1\n\
             [backends.hostile.tenants.slow]\ncall_timeout_ms = 400\n"
        ),
    );
    let slow = open_shared(backend.clone(), "slow").unwrap();
    let other = open_shared(backend, "other").unwrap();
    // The slow call holds the only slot once the peer accepted its read,
    // and frees it at its deadline, 400 ms after it began.
    std::thread::scope(|s| {
        let began = Instant::now();
        let looping = s.spawn(|| slow.get_manifest(&format!("read-socket:{addr}")).err());
        let _reading = peer.accept().unwrap();
        assert_eq!(text(&other, "ping").unwrap(), "pong");
        assert!(
            began.elapsed() >= Duration::from_millis(400),
            "the second call waited for the only slot: {:?}",
            began.elapsed()
        );
        assert!(matches!(
            looping.join().unwrap(),
            Some(KvError::Timeout(400))
        ));
    });
}

#[test]
fn a_fuel_budget_stops_a_call_before_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let backend = hostile(
        dir.path(),
        "[backends.hostile.tenants.metered]\nfuel = 20000000\n",
    );
    let metered = open_shared(backend.clone(), "metered").unwrap();
    // Stopped by the fuel, before its 5 s deadline: a call the deadline
    // stops fails with `Timeout` (not timed here: a loaded machine may take
    // seconds to burn the budget).
    match metered.get_manifest("loop") {
        Err(KvError::Limit(why)) => assert!(why.contains("fuel"), "{why}"),
        other => panic!("expected the fuel limit, got {other:?}"),
    }
    assert_eq!(text(&metered, "ping").unwrap(), "pong");
    // Another tenant of the same (metered) backend has no budget: only its deadline.
    let free = open_shared(backend, "free").unwrap();
    assert_eq!(text(&free, "alloc:8").unwrap(), "allocated");
}

#[test]
fn a_tenant_blocked_in_host_calls_leaves_other_tenants_working() {
    // The attack the epoch deadline could not stop: guests blocked inside
    // host imports (a clock, a full pool). Four threads of one tenant hang
    // until their deadline, 5 s; the other tenant's calls, made meanwhile,
    // stay prompt: each well under the 5 s a call queued behind a hung one
    // would take (1 s, room for a loaded machine).
    let dir = tempfile::tempdir().unwrap();
    let backend = hostile(
        dir.path(),
        "[backends.hostile.tenants.doomed]\ncall_timeout_ms = 5000\n",
    );
    let doomed = open_shared(backend.clone(), "doomed").unwrap();
    let healthy = open_shared(backend, "healthy").unwrap();
    let hung = std::sync::atomic::AtomicUsize::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let call = Instant::now();
                let result = doomed.get_manifest("sleep:3600000");
                hung.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                assert!(
                    matches!(result, Err(KvError::Timeout(5000))),
                    "{:?}",
                    result.map(|b| b.len())
                );
                // Cut at the deadline, not after the hour asked for (the
                // bound leaves room for a loaded machine).
                assert!(
                    call.elapsed() < Duration::from_secs(60),
                    "{:?}",
                    call.elapsed()
                );
            });
        }
        let mut calls = 0;
        let mut slowest = Duration::ZERO;
        while hung.load(std::sync::atomic::Ordering::SeqCst) > 0 || calls < 20 {
            let call = Instant::now();
            assert_eq!(text(&healthy, "ping").unwrap(), "pong");
            slowest = slowest.max(call.elapsed());
            calls += 1;
        }
        assert!(
            slowest < Duration::from_secs(1),
            "slowest healthy call {slowest:?}"
        );
    });
}
