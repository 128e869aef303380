//! Fabric guests in the host's sandbox (`kvwasm_host::fabric`): the
//! synthetic fabric round-trips frames of every size in every tier, and a
//! hostile fabric that corrupts, swaps, loops, sleeps, panics or hogs memory
//! is caught each time, after which the same fabric serves the next frame;
//! one that traps call after call backs off.

use std::sync::Arc;

use kvwasm_host::KvError;
use kvwasm_host::config::Config;
use kvwasm_host::fabric::Fabric;
use kvwasm_mrdn::Tier;
use kvwasm_tests::{pattern, write_config};

/// A fabric built from `[fabrics.f]` with `body` as the table's contents.
fn fabric(dir: &std::path::Path, body: &str) -> Fabric {
    kvwasm_fabric::builtins::install();
    let path = write_config(dir, &format!("[fabrics.f]\n{body}\n"));
    let policy = Config::load(&path).unwrap().fabric("f").unwrap();
    Fabric::start(Arc::new(policy)).unwrap()
}

fn hostile(dir: &std::path::Path, extra: &str) -> Fabric {
    fabric(
        dir,
        &format!(
            "component = {:?}\n{extra}",
            kvwasm_guest_artifacts::HOSTILE_FABRIC_PATH
        ),
    )
}

fn frame(tier: Tier, body: &[u8]) -> Vec<u8> {
    kvwasm_mrdn::encode(tier, body).unwrap()
}

/// Push then pull back, insisting on the same frame.
fn round_trip(f: &Fabric, tier: Tier, body: &[u8]) -> Result<(), KvError> {
    let handle = f.push(&frame(tier, body))?;
    let pulled = f.pull_echo(handle)?;
    assert_eq!(pulled.tier(), tier);
    assert!(pulled.body() == body, "body differs after a round trip");
    f.release(handle)
}

#[test]
fn synthetic_fabric_round_trips_every_size_in_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let f = fabric(
        dir.path(),
        "component = \"builtin:synthetic\"\nmemory_limit_mib = 512",
    );
    assert_eq!(f.label().unwrap(), "nixl-synth");
    for len in [0, 1, 16 << 10, 1 << 20, 64 << 20] {
        for tier in Tier::ALL {
            round_trip(&f, tier, &pattern(len, len as u64 + tier.as_byte() as u64))
                .unwrap_or_else(|e| panic!("{len} bytes, {tier:?}: {e}"));
        }
    }
    // Pull is not destructive; release is.
    let h = f.push(&frame(Tier::ThinkActive, b"kept")).unwrap();
    for _ in 0..2 {
        assert_eq!(f.pull_echo(h).unwrap().body(), b"kept");
    }
    f.release(h).unwrap();
    assert!(matches!(f.pull(h), Err(KvError::NotFound)));
    assert_eq!(f.live_handles(), 0);
}

#[test]
fn synthetic_fabric_label_is_configurable_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = fabric(
        dir.path(),
        "component = \"builtin:synthetic\"\nsettings = { label = \"mooncake-synth\" }",
    );
    assert_eq!(f.label().unwrap(), "mooncake-synth");
}

#[test]
fn host_refuses_what_is_not_a_frame_before_the_guest_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = fabric(dir.path(), "component = \"builtin:synthetic\"");
    let good = frame(Tier::ThinkComplete, b"0123456789");
    let mut cut = good.clone();
    cut.pop();
    let mut long = good.clone();
    long.push(0);
    let mut version2 = good.clone();
    version2[4] = 2;
    for bad in [&b"MRDN"[..], &cut, &long, &version2, &[0u8; 40][..]] {
        assert!(
            matches!(f.push(bad), Err(KvError::BadInput(_))),
            "{bad:?} accepted"
        );
    }
    assert_eq!(f.live_handles(), 0);
}

/// Every corruption a fabric can hand back is a typed error, and the next
/// frame through the same fabric is fine.
#[test]
fn hostile_fabric_returns_are_verified() {
    let dir = tempfile::tempdir().unwrap();
    let f = hostile(dir.path(), "max_payload_mib = 4");
    assert_eq!(f.label().unwrap(), "hostile");
    round_trip(&f, Tier::ThinkComplete, b"before").unwrap();
    for command in ["!flip", "!truncate", "!garbage"] {
        let h = f
            .push(&frame(Tier::ThinkActive, command.as_bytes()))
            .unwrap();
        match f.pull_echo(h) {
            Err(KvError::Io(m)) => assert!(m.contains("bad frame"), "{command}: {m}"),
            Err(e) => panic!("{command}: unexpected {e}"),
            Ok(_) => panic!("{command}: a corrupted frame passed verification"),
        }
        f.release(h).unwrap();
        round_trip(&f, Tier::OutputCritical, command.as_bytes().split_at(1).1).unwrap();
    }
    // `!wrong` hands back the previous frame, which verifies on its own:
    // only the echo check (or the caller's own binding) catches it.
    f.push(&frame(Tier::ThinkActive, b"first")).unwrap();
    let h = f.push(&frame(Tier::ThinkActive, b"!wrong")).unwrap();
    assert_eq!(f.pull(h).unwrap().body(), b"first");
    match f.pull_echo(h) {
        Err(KvError::Io(m)) => assert!(m.contains("not the frame pushed"), "{m}"),
        other => panic!("someone else's frame accepted: {:?}", other.is_ok()),
    }
    // A payload over the fabric's limit is refused by the host.
    let h = f.push(&frame(Tier::ThinkActive, b"!bighandle")).unwrap();
    let err = f.pull(h).err().expect("10 MiB over a 4 MiB limit");
    assert!(
        matches!(err, KvError::Trapped(_) | KvError::Limit(_)),
        "{err}"
    );
    round_trip(&f, Tier::ThinkComplete, b"after").unwrap();
}

#[test]
fn hostile_fabric_that_loops_sleeps_panics_or_hogs_costs_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let f = hostile(dir.path(), "call_timeout_ms = 1000\nmemory_limit_mib = 32");
    let kept = f.push(&frame(Tier::ThinkComplete, b"kept")).unwrap();
    for (command, expect) in [
        ("!loop", "deadline"),
        ("!sleep", "deadline"),
        ("!panic", "trapped"),
        ("!hog", "out of memory"),
    ] {
        let started = std::time::Instant::now();
        let err = f
            .push(&frame(Tier::ThinkActive, command.as_bytes()))
            .expect_err(command);
        assert!(
            err.to_string().contains(expect),
            "{command}: {err} (expected {expect:?})"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{command} held the caller for {:?}",
            started.elapsed()
        );
        // The next frame goes through a fresh instance.
        round_trip(&f, Tier::ThinkComplete, b"next").unwrap();
    }
    // A handle from a discarded instance is forgotten with it: not resolved
    // by the new instance to whatever it holds under the same number, and
    // no longer counted.
    assert!(matches!(f.pull(kept), Err(KvError::NotFound)));
    assert_eq!(f.live_handles(), 0);
    let counters = kvwasm_host::metrics::snapshot()[f.name()];
    assert!(
        counters.timeouts >= 2 && counters.traps >= 2,
        "{counters:?}"
    );
}

/// A fabric that traps on every call backs off as a kv-store backend does,
/// rather than costing a fresh instance per call, and the refusal says what
/// kept failing.
#[test]
fn a_fabric_that_keeps_trapping_backs_off_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let f = hostile(dir.path(), "");
    let panic = frame(Tier::ThinkActive, b"!panic");
    let why = kvwasm_tests::backoff::refused_while_backing_off(|| {
        let mut began = std::time::Instant::now();
        for _ in 0..3 {
            began = std::time::Instant::now();
            let err = f.push(&panic).expect_err("panics");
            assert!(matches!(err, KvError::Trapped(_)), "{err}");
        }
        (began, f.push(&frame(Tier::ThinkComplete, b"refused")))
    });
    assert!(
        why.contains("fabric \"fabrics.f\" lost 3 instances in a row"),
        "{why}"
    );
    assert!(why.contains("panic"), "{why}");
    std::thread::sleep(kvwasm_tests::backoff::FIRST_BACKOFF + std::time::Duration::from_millis(30));
    round_trip(&f, Tier::ThinkComplete, b"after").unwrap();
    // A success resets the count: one more trap is just a trap.
    assert!(matches!(f.push(&panic), Err(KvError::Trapped(_))));
    round_trip(&f, Tier::ThinkComplete, b"again").unwrap();
}

/// The most log lines a guest's losses may cause in `elapsed`: one line
/// per kind of line (`keys`) and second, as the limiter admits them (the
/// first at once, then one per started second).
fn log_budget(keys: u64, elapsed: std::time::Duration) -> u64 {
    keys * (elapsed.as_secs() + 1)
}

/// A fabric that gets itself discarded on every other call, quoting 4 KiB
/// of stderr each time, costs the log at most one line per kind of line
/// (the discarded instance, the failed call) and second, each cut to the
/// limit on guest text: 100 losses, not 100 lines of 4 KiB.
#[test]
fn lost_fabric_instances_log_within_the_limit() {
    kvwasm_tests::logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        &format!(
            "[fabrics.noisy]\ncomponent = {:?}\n",
            kvwasm_guest_artifacts::HOSTILE_FABRIC_PATH
        ),
    );
    let policy = Config::load(&path).unwrap().fabric("noisy").unwrap();
    let f = Fabric::start(Arc::new(policy)).unwrap();
    let noisy = frame(Tier::ThinkActive, b"!noisy");
    let losses = 100;
    let started = std::time::Instant::now();
    for _ in 0..losses {
        let err = f.push(&noisy).expect_err("panics");
        assert!(matches!(err, KvError::Trapped(_)), "{err}");
        // A success in between: no back-off, every push is a loss.
        round_trip(&f, Tier::ThinkComplete, b"fine").unwrap();
    }
    let elapsed = started.elapsed();
    assert_eq!(kvwasm_host::metrics::snapshot()[f.name()].traps, losses);
    let lines = kvwasm_tests::logs::lines_with("\"fabrics.noisy\"");
    let budget = log_budget(2, elapsed);
    assert!(
        (2..=budget).contains(&(lines.len() as u64)),
        "{} lines for {losses} losses in {elapsed:?} (budget {budget}): {lines:#?}",
        lines.len()
    );
    assert!(lines.iter().any(|l| l.contains("discarded")), "{lines:#?}");
    for line in &lines {
        assert!(line.len() < 1024, "{} bytes: {line}", line.len());
    }
}

#[test]
fn a_kv_store_backend_is_not_a_fabric_and_vice_versa() {
    kvwasm_fabric::builtins::install();
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "[fabrics.f]\ncomponent = \"builtin:memory\"\n[backends.b]\ncomponent = \"builtin:synthetic\"\n",
    );
    let config = Config::load(&path).unwrap();
    let err = config.fabric("f").unwrap_err();
    assert!(err.contains("is a kv-store backend, not a fabric"), "{err}");
    let err = config.backend("b").unwrap_err();
    assert!(err.contains("is a fabric, not a kv-store backend"), "{err}");
}
