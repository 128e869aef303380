//! The storage advisor loop (`kvwasm_host::tiering::advisor`) with the
//! `builtin:advisor` guest and the hostile test advisor
//! (tests/guests/hostile-advisor), against an in-memory two-tier store
//! that applies advice under the host's rules (the real tiered store is
//! built apart; it implements the same `AdviceSink`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use kvwasm_host::config::Config;
use kvwasm_host::tiering::advisor::{AdvisedStore, Advisor, AdvisorLoop, LoopConfig};
use kvwasm_host::tiering::{
    Access, AccessKind, Action, Advice, AdviceReport, AdviceSink, TierUsage,
};

const LEN: u64 = 1000;

/// Two tiers: 0 with a byte capacity, 1 without. Applies advice as the
/// host must: unknown hashes, a last copy, a full tier refused. Logs the
/// accesses the test reports and the moves it makes, and keeps the loop's
/// decisions.
struct TwoTiers {
    capacity: u64,
    /// Which tiers hold each chunk.
    chunks: Mutex<HashMap<Vec<u8>, [bool; 2]>>,
    log: Mutex<VecDeque<Access>>,
    decisions: Mutex<Vec<String>>,
}

impl TwoTiers {
    fn new(capacity: u64) -> Arc<TwoTiers> {
        Arc::new(TwoTiers {
            capacity,
            chunks: Mutex::new(HashMap::new()),
            log: Mutex::default(),
            decisions: Mutex::default(),
        })
    }

    fn log(&self, kind: AccessKind, hash: &[u8], tier: u32, manifest: &str) {
        self.log.lock().unwrap().push_back(Access {
            kind,
            hash: hash.to_vec(),
            len: LEN,
            tier,
            manifest: Some(manifest.into()),
        });
    }

    fn weak(self: &Arc<Self>) -> Weak<dyn AdvisedStore> {
        Arc::downgrade(self) as Weak<dyn AdvisedStore>
    }

    fn used(chunks: &HashMap<Vec<u8>, [bool; 2]>) -> u64 {
        chunks.values().filter(|t| t[0]).count() as u64 * LEN
    }

    /// Store a chunk: in tier 0 if it has room, else in tier 1.
    fn put(&self, hash: &[u8], manifest: &str) {
        let mut chunks = self.chunks.lock().unwrap();
        let tier = u32::from(Self::used(&chunks) + LEN > self.capacity);
        let mut place = [false; 2];
        place[tier as usize] = true;
        chunks.insert(hash.to_vec(), place);
        drop(chunks);
        self.log(AccessKind::Put, hash, tier, manifest);
    }

    /// Read a chunk, from the highest tier holding it.
    fn get(&self, hash: &[u8], manifest: &str) {
        let tier = self.tier_of(hash);
        self.log(AccessKind::Hit, hash, tier, manifest);
    }

    /// The highest tier holding `hash`.
    fn tier_of(&self, hash: &[u8]) -> u32 {
        let chunks = self.chunks.lock().unwrap();
        u32::from(!chunks[hash][0])
    }

    /// Every chunk put is still held by some tier.
    fn assert_nothing_lost(&self, expected: usize) {
        let chunks = self.chunks.lock().unwrap();
        assert_eq!(chunks.len(), expected);
        assert!(chunks.values().all(|t| t[0] || t[1]), "a chunk was lost");
        assert!(Self::used(&chunks) <= self.capacity);
    }
}

impl AdvisedStore for TwoTiers {
    fn drain_accesses(&self, max: usize) -> Vec<Access> {
        let mut log = self.log.lock().unwrap();
        let n = max.min(log.len());
        log.drain(..n).collect()
    }

    fn record_decisions(&self, lines: Vec<String>) {
        self.decisions.lock().unwrap().extend(lines);
    }
}

impl AdviceSink for TwoTiers {
    fn apply(&self, advice: Vec<Advice>) -> AdviceReport {
        let mut chunks = self.chunks.lock().unwrap();
        let moved = |action, hash: &[u8], tier| {
            self.log.lock().unwrap().push_back(Access {
                kind: AccessKind::Moved(action),
                hash: hash.to_vec(),
                len: LEN,
                tier,
                manifest: None,
            })
        };
        let mut report = AdviceReport::default();
        let refuse = |report: &mut AdviceReport, why: &str| {
            report.refused += 1;
            if !report.reasons.iter().any(|r| r == why) {
                report.reasons.push(why.into());
            }
        };
        for a in advice {
            for hash in a.hashes {
                let used = Self::used(&chunks);
                let Some(place) = chunks.get_mut(&hash) else {
                    refuse(&mut report, "unknown hash");
                    continue;
                };
                let t = a.tier as usize;
                match a.action {
                    Action::Demote if t == 0 && place[0] => *place = [false, true],
                    Action::Promote if t == 1 && place[1] && !place[0] => {
                        if used + LEN > self.capacity {
                            refuse(&mut report, "tier 0 is full");
                            continue;
                        }
                        place[0] = true;
                    }
                    Action::Evict if t < 2 && place[t] => {
                        if !place[1 - t] {
                            refuse(&mut report, "last copy");
                            continue;
                        }
                        place[t] = false;
                    }
                    _ => {
                        refuse(&mut report, "not in that tier");
                        continue;
                    }
                }
                report.applied += 1;
                moved(a.action, &hash, a.tier);
            }
        }
        report
    }

    fn usage(&self) -> Vec<TierUsage> {
        let chunks = self.chunks.lock().unwrap();
        let used = Self::used(&chunks);
        let hot = chunks.values().filter(|t| t[0]).count() as u64;
        let cold = chunks.values().filter(|t| t[1]).count() as u64;
        vec![
            TierUsage {
                name: "hot".into(),
                capacity_bytes: Some(self.capacity),
                used_bytes: used,
                chunks: hot,
            },
            TierUsage {
                name: "cold".into(),
                capacity_bytes: None,
                used_bytes: cold * LEN,
                chunks: cold,
            },
        ]
    }
}

fn advisor(dir: &tempfile::TempDir, component: &str, extra: &str) -> Advisor {
    let path = kvwasm_tests::write_config(
        dir.path(),
        &format!(
            "[subscribers.adv]\ncomponent = {component:?}\nmemory_limit_mib = 64\n\
             call_timeout_ms = 300\n{extra}"
        ),
    );
    let config = Config::load(&path).expect("config");
    Advisor::from_config(&config, "adv").expect("start the advisor")
}

fn key(kind: u8, i: u32) -> Vec<u8> {
    [[kind].as_slice(), &i.to_be_bytes()].concat()
}

/// Ten sessions share a 12-chunk prompt and own 8 chunks each, with a hot
/// tier of 30% of the data that first fills with whatever is put first.
/// After the sessions are restored a few times, every prompt chunk is hot,
/// the hot tier never went over capacity and nothing was lost; every
/// access was either observed or counted as dropped.
#[test]
fn builtin_advisor_brings_the_shared_prompt_hot() {
    let dir = tempfile::tempdir().unwrap();
    let advisor = advisor(&dir, "builtin:advisor", "");
    let (prefix, own, sessions) = (12u32, 8u32, 10u32);
    let total = prefix + own * sessions;
    let store = TwoTiers::new(u64::from(total) * LEN * 30 / 100);
    let looper = AdvisorLoop::start(
        advisor,
        store.weak(),
        LoopConfig {
            interval_ms: 60_000,
            ..LoopConfig::default()
        },
    )
    .unwrap();
    let chunks_of = |s: u32| -> Vec<Vec<u8>> {
        (0..own)
            .map(|i| key(b's', s * own + i))
            .chain((0..prefix).map(|i| key(b'p', i)))
            .collect()
    };
    let mut sent = 0u64;
    // The sessions' own chunks first, so the hot tier starts full of them
    // and the prompt lands in the cold tier.
    let puts = (0..sessions)
        .flat_map(|s| (0..own).map(move |i| (s, key(b's', s * own + i))))
        .chain((0..prefix).map(|i| (0, key(b'p', i))));
    for (s, hash) in puts {
        store.put(&hash, &format!("session-{s}"));
        sent += 1;
    }
    assert!((0..prefix).any(|i| store.tier_of(&key(b'p', i)) == 1));
    looper.round();
    for turn in 0..30 {
        let s = turn % sessions;
        for hash in chunks_of(s) {
            store.get(&hash, &format!("session-{s}"));
            sent += 1;
        }
        looper.round();
        store.assert_nothing_lost(total as usize);
    }
    let cold: Vec<u32> = (0..prefix)
        .filter(|i| store.tier_of(&key(b'p', *i)) != 0)
        .collect();
    assert!(cold.is_empty(), "prompt chunks still cold: {cold:?}");
    let status = looper.status();
    assert_eq!(status.observed, sent, "{status:?}");
    assert!(status.applied > 0, "{status:?}");
    assert_eq!(status.guest_errors, 0, "{status:?}");
    assert_eq!(status.rounds, 31);
    let decisions = store.decisions.lock().unwrap();
    assert!(
        decisions.iter().any(|d| d.contains("promote")),
        "{decisions:?}"
    );
}

/// The hostile advisor on command: evict everything, unknown hashes,
/// oversized and empty hashes, impossible tiers, a move storm, a flood
/// of records, a panic and an endless loop. The store loses nothing, the
/// storm is cut to `max_hashes` per round, nonsense is refused with
/// reasons, a failed instance is replaced, and the loop keeps running.
#[test]
fn hostile_advisor_is_refused_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let advisor = advisor(&dir, kvwasm_guest_artifacts::HOSTILE_ADVISOR_PATH, "");
    let store = TwoTiers::new(40 * LEN);
    let config = LoopConfig {
        interval_ms: 60_000,
        max_hashes: 10,
        ..LoopConfig::default()
    };
    let looper = AdvisorLoop::start(advisor, store.weak(), config).unwrap();
    for i in 0..60 {
        store.put(&key(b'c', i), "s");
    }
    let command = |word: &str| {
        store.get(&key(b'c', 0), word);
        let before = looper.status();
        let started = Instant::now();
        looper.round();
        store.assert_nothing_lost(60);
        let after = looper.status();
        let last = after.last.clone().unwrap();
        eprintln!("{word}: {:?} in {:?}", last, started.elapsed());
        (before, after, last)
    };

    let (_, _, last) = command("!evict");
    assert_eq!(last.report.applied, 0, "{last:?}");
    assert!(
        last.report.reasons.iter().any(|r| r == "last copy"),
        "{last:?}"
    );
    assert!(last.report.refused >= 10, "{last:?}");

    let (_, _, last) = command("!unknown");
    assert_eq!(last.report.applied, 0, "{last:?}");
    // 3000 hashes advised; 10 reach the store (unknown), the rest are over
    // the round's budget.
    assert_eq!(last.report.refused, 3000, "{last:?}");
    assert!(
        last.report.reasons.iter().any(|r| r == "unknown hash"),
        "{last:?}"
    );

    let (_, _, last) = command("!bighash");
    assert_eq!(
        (last.report.applied, last.report.refused),
        (0, 2),
        "{last:?}"
    );

    let (_, _, last) = command("!tier");
    assert_eq!(last.report.applied, 0, "{last:?}");
    assert_eq!(last.report.refused, 60, "{last:?}");

    // The storm moves at most max_hashes chunks per round.
    let mut moved = 0;
    for _ in 0..3 {
        let (_, _, last) = command("!storm");
        assert!(last.report.applied <= 10, "{last:?}");
        assert_eq!(last.report.applied + last.report.refused, 120, "{last:?}");
        moved += last.report.applied;
    }
    assert!(moved > 0);

    // Lists that all name the same bytes: the host stops copying at the
    // advisor's lift budget, far below what the aliases add up to.
    let (before, after, last) = command("!alias");
    let error = last.error.clone().unwrap_or_default();
    assert!(error.contains("too much data"), "{last:?}");
    assert_eq!(after.restarts, before.restarts + 1);

    for word in ["!huge", "!panic", "!loop"] {
        let (before, after, last) = command(word);
        assert!(last.error.is_some(), "{word}: {last:?}");
        assert_eq!(after.guest_errors, before.guest_errors + 1, "{word}");
        assert_eq!(after.restarts, before.restarts + 1, "{word}");
    }

    // The replaced instance starts clean and the loop still works.
    let (_, after, last) = command("!storm");
    assert!(last.error.is_none() && last.report.applied > 0, "{last:?}");
    assert_eq!(after.restarts, 4);
    let decisions = store.decisions.lock().unwrap();
    assert_eq!(
        decisions
            .iter()
            .filter(|d| d.contains("guest failed"))
            .count(),
        4,
        "{decisions:?}"
    );
}

/// Without forced rounds the loop drains and advises on its own timer,
/// and it ends once the store it serves is gone.
#[test]
fn the_loop_runs_on_its_timer_and_ends_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let advisor = advisor(&dir, "builtin:advisor", "");
    let store = TwoTiers::new(100 * LEN);
    let config = LoopConfig {
        interval_ms: 20,
        drain_ms: 5,
        ..LoopConfig::default()
    };
    let looper = AdvisorLoop::start(advisor, store.weak(), config).unwrap();
    for i in 0..50 {
        store.put(&key(b'c', i), "s");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while looper.status().rounds < 3 || looper.status().observed < 50 {
        assert!(Instant::now() < deadline, "{:?}", looper.status());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(looper.is_running());
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(5);
    while looper.is_running() {
        assert!(Instant::now() < deadline, "the loop outlived its store");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An advisor whose every `advise` traps, round after round (each round
/// first observes fine, so no back-off): the losses cost the log at most
/// one line per kind of line and second, each cut to the limit on guest
/// text, and every failure is still counted and kept in the decisions.
#[test]
fn a_failing_advisor_logs_within_the_limit() {
    kvwasm_tests::logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let path = kvwasm_tests::write_config(
        dir.path(),
        &format!(
            "[subscribers.noisy-advisor]\ncomponent = {:?}\n",
            kvwasm_guest_artifacts::HOSTILE_ADVISOR_PATH
        ),
    );
    let config = Config::load(&path).expect("config");
    let advisor = Advisor::from_config(&config, "noisy-advisor").expect("start the advisor");
    let store = TwoTiers::new(10 * LEN);
    let looper = AdvisorLoop::start(
        advisor,
        store.weak(),
        LoopConfig {
            interval_ms: 3_600_000,
            drain_ms: 3_600_000,
            ..LoopConfig::default()
        },
    )
    .unwrap();
    store.put(&key(b'c', 0), "s");
    let rounds = 100;
    let started = Instant::now();
    for _ in 0..rounds {
        store.get(&key(b'c', 0), "!panic");
        looper.round();
    }
    let elapsed = started.elapsed();
    let status = looper.status();
    assert_eq!(status.guest_errors, rounds, "{status:?}");
    assert_eq!(status.restarts, rounds, "{status:?}");
    let lines = kvwasm_tests::logs::lines_with("subscribers.noisy-advisor");
    // The discarded instance and the failed call: two kinds of line.
    let budget = 2 * (elapsed.as_secs() + 1);
    assert!(
        (1..=budget).contains(&(lines.len() as u64)),
        "{} lines for {rounds} losses in {elapsed:?} (budget {budget}): {lines:#?}",
        lines.len()
    );
    for line in &lines {
        assert!(line.len() < 1024, "{} bytes: {line}", line.len());
    }
    let decisions = store.decisions.lock().unwrap();
    assert!(
        decisions.iter().all(|d| d.contains("guest failed")),
        "{decisions:?}"
    );
}

/// A subscriber that is not an advisor is refused up front; `inspect` and
/// `check-config` tell the two apart.
#[test]
fn a_plain_subscriber_is_not_an_advisor() {
    use kvwasm_host::component::{Builtin, ComponentSource, LoadedComponent, describe};
    kvwasm_kv_indexer_host::install();
    for (source, advisor) in [
        (ComponentSource::Builtin(Builtin::Advisor), true),
        (ComponentSource::LinkedBuiltin("kv-indexer".into()), false),
    ] {
        assert_eq!(describe(&source).unwrap().is_advisor(), advisor);
        assert_eq!(
            LoadedComponent::load(&source).unwrap().is_advisor(),
            advisor
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let path = kvwasm_tests::write_config(
        dir.path(),
        "[subscribers.adv]\ncomponent = \"builtin:kv-indexer\"\n",
    );
    let config = Config::load(&path).unwrap();
    let err = Advisor::from_config(&config, "adv").err().expect("refused");
    assert!(err.to_string().contains("not a storage advisor"), "{err}");
}
