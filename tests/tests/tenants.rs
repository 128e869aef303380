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
    let started = Instant::now();
    std::thread::scope(|s| {
        // One tenant loops forever, call after call.
        let killer = s.spawn(|| {
            let mut failures = 0;
            while started.elapsed() < Duration::from_secs(2) {
                match doomed.get_manifest("loop") {
                    Err(KvError::Timeout(150) | KvError::Unavailable(_)) => failures += 1,
                    other => panic!("a loop must not return: {other:?}"),
                }
            }
            failures
        });
        // Six threads hammer the other tenant meanwhile.
        let hammers: Vec<_> = (0..6)
            .map(|t| {
                let healthy = &healthy;
                s.spawn(move || {
                    let mut calls = 0;
                    while started.elapsed() < Duration::from_secs(2) {
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
        assert!(
            failures >= 3,
            "the doomed tenant kept being cut off: {failures}"
        );
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
    for _ in 0..3 {
        assert!(matches!(
            store.get_manifest("panic"),
            Err(KvError::Trapped(_))
        ));
    }
    // Backing off: refused at once, without starting another instance.
    let at = Instant::now();
    match store.get_manifest("ping") {
        Err(KvError::Unavailable(why)) => assert!(why.contains("3 instances in a row"), "{why}"),
        other => panic!("expected a back-off refusal, got {other:?}"),
    }
    assert!(at.elapsed() < Duration::from_millis(40));
    std::thread::sleep(Duration::from_millis(80));
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
    for _ in 0..2 {
        match store.get_manifest("ping") {
            Err(KvError::Trapped(why)) => assert!(why.contains("traps while opening"), "{why}"),
            other => panic!("expected the constructor's trap, got {other:?}"),
        }
        assert_eq!(store.live_instances(), 0);
    }
    let at = Instant::now();
    match store.get_manifest("ping") {
        Err(KvError::Unavailable(why)) => {
            assert!(why.contains("3 instances in a row"), "{why}");
            assert!(why.contains("traps while opening"), "{why}");
        }
        other => panic!("expected a back-off refusal, got {other:?}"),
    }
    assert!(at.elapsed() < Duration::from_millis(40));
    std::fs::remove_file(dir.path().join("data/trap-on-open")).unwrap();
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(
        text(&store, "ping").unwrap(),
        "pong",
        "a fresh instance starts once the back-off is over"
    );
}

/// A call that waited for the handle's only instance while that instance
/// was lost is refused once the loss starts the back-off, rather than
/// starting yet another instance.
#[test]
fn a_caller_waiting_for_an_instance_is_refused_when_the_back_off_starts() {
    let dir = tempfile::tempdir().unwrap();
    let backend = hostile(
        dir.path(),
        "max_instances = 1\n[backends.hostile.tenants.t]\ncall_timeout_ms = 600\n",
    );
    let store = open_shared(backend, "t").unwrap();
    for _ in 0..2 {
        assert!(matches!(
            store.get_manifest("panic"),
            Err(KvError::Trapped(_))
        ));
    }
    std::thread::scope(|s| {
        // The third loss: a loop cut by its deadline.
        let looping = s.spawn(|| store.get_manifest("loop").err());
        std::thread::sleep(Duration::from_millis(200));
        // Arrives before the back-off starts, then waits for the instance.
        match store.get_manifest("ping") {
            Err(KvError::Unavailable(why)) => {
                assert!(why.contains("3 instances in a row"), "{why}")
            }
            other => panic!("expected a back-off refusal, got {other:?}"),
        }
        assert!(matches!(looping.join().unwrap(), Some(KvError::Timeout(_))));
    });
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
    let backend = hostile(
        dir.path(),
        "max_concurrent_calls = 1\n[backends.hostile.tenants.slow]\ncall_timeout_ms = 400\n",
    );
    let slow = open_shared(backend.clone(), "slow").unwrap();
    let other = open_shared(backend, "other").unwrap();
    std::thread::scope(|s| {
        let looping = s.spawn(|| slow.get_manifest("loop").err());
        std::thread::sleep(Duration::from_millis(100));
        let at = Instant::now();
        assert_eq!(text(&other, "ping").unwrap(), "pong");
        assert!(
            at.elapsed() >= Duration::from_millis(200),
            "the second call waited for the only slot: {:?}",
            at.elapsed()
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
    let at = Instant::now();
    match metered.get_manifest("loop") {
        Err(KvError::Limit(why)) => assert!(why.contains("fuel"), "{why}"),
        other => panic!("expected the fuel limit, got {other:?}"),
    }
    assert!(
        at.elapsed() < Duration::from_secs(3),
        "well before the 5 s deadline"
    );
    assert_eq!(text(&metered, "ping").unwrap(), "pong");
    // Another tenant of the same (metered) backend has no budget: only its deadline.
    let free = open_shared(backend, "free").unwrap();
    assert_eq!(text(&free, "alloc:8").unwrap(), "allocated");
}

#[test]
fn a_tenant_blocked_in_host_calls_leaves_other_tenants_working() {
    // The attack the epoch deadline could not stop: guests blocked inside
    // host imports (a clock, a full pool). Four threads of one tenant hang,
    // call after call; the other tenant's calls stay prompt.
    let dir = tempfile::tempdir().unwrap();
    let backend = hostile(
        dir.path(),
        "[backends.hostile.tenants.doomed]\ncall_timeout_ms = 200\n",
    );
    let doomed = open_shared(backend.clone(), "doomed").unwrap();
    let healthy = open_shared(backend, "healthy").unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while started.elapsed() < Duration::from_secs(2) {
                    let call = Instant::now();
                    let result = doomed.get_manifest("sleep:3600000");
                    assert!(
                        matches!(result, Err(KvError::Timeout(200) | KvError::Unavailable(_))),
                        "{:?}",
                        result.map(|b| b.len())
                    );
                    assert!(
                        call.elapsed() < Duration::from_millis(900),
                        "{:?}",
                        call.elapsed()
                    );
                }
            });
        }
        let mut slowest = Duration::ZERO;
        while started.elapsed() < Duration::from_secs(2) {
            let call = Instant::now();
            assert_eq!(text(&healthy, "ping").unwrap(), "pong");
            slowest = slowest.max(call.elapsed());
        }
        assert!(
            slowest < Duration::from_millis(150),
            "slowest healthy call {slowest:?}"
        );
    });
}
