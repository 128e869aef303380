//! `kvwasm serve` with `builtin:kv-indexer` against Dynamo's own standalone
//! indexer (the `dynamo-kv-router` crate, 1.6.1, built once by
//! `scripts/dynamo-oracle.sh`): both subscribe to the same vLLM 0.33-shaped
//! publishers (several instances, DP ranks with batches overriding the
//! registered rank, LoRA adapters and none, block sizes 16 and 32, removals,
//! per-rank AllBlocksCleared, forced gaps filled by replay, restarted
//! publishers), and every `/query`, `/query_by_hash` and `/dump` answer is
//! compared. A ground truth of which (instance, rank) holds which block says
//! which side is wrong when they differ. No verdict waits on a clock: each
//! stream ends with a marker block, and answers are compared once both sides
//! have it.
//!
//! Named differences (docs/events.md, "Differences from Dynamo 1.6.1") are
//! normalised in `parity/compare.rs`: kvwasm's extra answer fields
//! ([`parity::compare::KVWASM_EXTENSIONS`]).

mod parity;

use std::sync::atomic::{AtomicU64, Ordering};

use kvwasm_tests::servers::NatsServer;
use parity::Scenario;
use parity::services::Service;
use parity::stream::World;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
fn same_answers_as_dynamo_on_multi_rank_vllm_streams() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    let kvwasm = Service::kvwasm("kvwasm", "");
    let mut scenario = Scenario::new(World::new(36, "", 11, 24));
    scenario.register(&dynamo);
    scenario.register(&kvwasm);

    scenario.publish(400);
    scenario.checkpoint("after 400 batches", &dynamo, &[&kvwasm]);

    // Two engines restart (unregistered, then registered again at seq 0):
    // one rank of a two-rank instance, and a one-rank instance.
    scenario.restart_publisher(0, &[&dynamo, &kvwasm]);
    scenario.restart_publisher(3, &[&dynamo, &kvwasm]);
    scenario.publish(300);
    scenario.checkpoint(
        "after two publisher restarts and 300 more batches",
        &dynamo,
        &[&kvwasm],
    );
}

/// Dynamo 1.6.1's tree keeps one engine hash per block (the first
/// writer's) and matches removals against it (docs/events.md, "Differences
/// from Dynamo 1.6.1").
const MIXED_HASHING: &str = "Dynamo 1.6.1 skips removals of blocks another engine stored first \
                             under its own engine hash";

/// Engines hashing the same content to different block hashes on the same
/// model (vLLM's xxhash option beside its default): stores, removals and
/// per-rank clears, then a fresh replica restored from kvwasm's `/dump`
/// and fed only what is published after it, so the removals it applies
/// must find blocks under each worker's own engine hashes from the dump.
/// kvwasm is held to the ground truth; compared with Dynamo's, every
/// answer that differs must be one where Dynamo is wrong (the named
/// difference), and its `/dump` is compared without engine hashes.
#[test]
fn same_answers_as_dynamo_when_engines_hash_the_same_blocks_differently() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    let kvwasm = Service::kvwasm("kvwasm", "");
    let mut world = World::new(61, "", 91, 16);
    world.mix_engine_hashing();
    world.clear_percent = 4;
    let mut scenario = Scenario::new(world);
    scenario.register(&dynamo);
    scenario.register(&kvwasm);
    scenario.publish(300);
    scenario.checkpoint_where_reference_is_wrong(
        "engines hashing differently",
        &dynamo,
        &[&kvwasm],
        MIXED_HASHING,
    );

    let replica = Service::kvwasm(
        "kvwasm replica (restored from kvwasm's /dump)",
        &format!("peers = [{:?}]\n", kvwasm.url),
    );
    scenario.compare_with_truth("a fresh replica restored from kvwasm's /dump", &[&replica]);
    // No replay endpoint: nothing from before the dump reaches it, so no
    // forced gaps from here on.
    scenario.register_live_only(&replica);
    scenario.wait_subscribed(&replica);
    scenario.world.gap_percent = 0;
    scenario.publish(300);
    scenario.checkpoint_where_reference_is_wrong(
        "the restored replica after 300 more batches",
        &dynamo,
        &[&kvwasm, &replica],
        MIXED_HASHING,
    );
}

/// An engine's ZMQ publisher restarts and nobody registers it again: its
/// seq starts over at 0. kvwasm takes seq 0 after a later seq as a restart
/// and follows the new stream (gaps in it replayed from the new
/// publisher). Dynamo 1.6.1 skips the new publisher's batches as stale
/// until its seq passes the old one's (docs/events.md, "Differences from
/// Dynamo 1.6.1"), so kvwasm is held to the ground truth alone, and the
/// difference is checked as named.
#[test]
fn a_publisher_restarted_without_a_new_registration_is_followed_from_seq_0() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    let kvwasm = Service::kvwasm("kvwasm", "");
    let mut scenario = Scenario::new(World::new(40, "", 101, 16));
    scenario.register(&dynamo);
    scenario.register(&kvwasm);
    scenario.publish(200);
    scenario.checkpoint("before the restart", &dynamo, &[&kvwasm]);

    // Feed 2: instance 102, whose batches carry ranks 0 and 1.
    let restarted = 2;
    let marker = scenario.restart_publisher_in_place(restarted, &kvwasm);
    assert_eq!(
        kvwasm.metric("kvwasm_source_restarts_total{source=\"zmq:102:0@m16/default\"}"),
        1,
        "kvwasm took seq 0 as a restart"
    );
    // The named difference (it can only show as an absence: Dynamo had
    // the same messages, the last one sent again until kvwasm had it).
    assert!(
        scenario.marker_score(&dynamo, restarted, marker).is_null(),
        "Dynamo 1.6.1 skips a restarted publisher's seq 0 as stale"
    );
    scenario.publish(200);
    scenario.checkpoint_with_truth("after a restart without registration", &[&kvwasm]);
}

/// Distinct models and instances per generated case: the two indexers are
/// shared by every case (and shrink step) of the property test.
static CASES: AtomicU64 = AtomicU64::new(0);

#[test]
fn same_answers_as_dynamo_on_random_streams() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    let kvwasm = Service::kvwasm("kvwasm", "");
    let mut runner = TestRunner::new(Config {
        cases: 6,
        max_shrink_iters: 4,
        failure_persistence: None,
        ..Config::default()
    });
    let cases = (any::<u64>(), 4usize..20, 0u64..25, 0u64..10, 5usize..150);
    runner
        .run(&cases, |(seed, prompts, gap_percent, clear_percent, batches)| {
            let case = CASES.fetch_add(1, Ordering::Relaxed);
            let mut world = World::new(seed, &format!("-case{case}"), 1000 + 10 * case, prompts);
            world.gap_percent = gap_percent;
            world.clear_percent = clear_percent;
            let mut scenario = Scenario::new(world);
            scenario.register(&dynamo);
            scenario.register(&kvwasm);
            scenario.publish(batches);
            scenario.checkpoint(
                &format!("seed {seed}, {prompts} prompts, {gap_percent}% gaps, {clear_percent}% clears, {batches} batches"),
                &dynamo,
                &[&kvwasm],
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn after_kill_9_mid_stream_recovered_by_replay_and_by_peers_the_same_answers_as_dynamo() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    let replica = Service::kvwasm("kvwasm replica B", "");
    let mut killed = Service::kvwasm("kvwasm replica A", "");
    let mut world = World::new(99, "", 31, 20);
    // Per-rank AllBlocksCleared in every stream.
    world.clear_percent = 6;
    let mut scenario = Scenario::new(world);
    for service in [&dynamo, &replica, &killed] {
        scenario.register(service);
    }
    scenario.publish(200);
    scenario.checkpoint("before any kill", &dynamo, &[&replica, &killed]);

    // Killed mid-stream, restarted empty and registered again: each
    // publisher's replay (from seq 0) rebuilds it.
    scenario.publish(100);
    killed.kill9();
    scenario.publish(100);
    killed = Service::kvwasm("kvwasm replica A (after kill -9, replayed)", "");
    scenario.register(&killed);
    scenario.publish(50);
    scenario.checkpoint(
        "after kill -9 and recovery by replay",
        &dynamo,
        &[&replica, &killed],
    );

    // Killed mid-stream again, restarted from the other kvwasm replica's
    // /dump once the others have the whole stream: its answers before any
    // registration come from the dump alone.
    for (peer, name) in [(&replica, "kvwasm replica B"), (&dynamo, "Dynamo 1.6.1")] {
        scenario.publish(100);
        killed.kill9();
        scenario.publish(100);
        scenario.end_streams();
        scenario.settle(&[&dynamo, &replica]);
        killed = Service::kvwasm(
            &format!("kvwasm replica A (after kill -9, recovered from {name}'s /dump)"),
            &format!("peers = [{:?}]\n", peer.url),
        );
        scenario.compare(
            &format!("recovered from {name}'s /dump"),
            &dynamo,
            &[&killed],
        );
        // Registered again, it follows the publishers (whose replay from
        // seq 0 it applies on top of the dump: the same state).
        scenario.register(&killed);
        scenario.publish(50);
        scenario.checkpoint(
            &format!("recovered from {name}'s /dump, then 50 more batches"),
            &dynamo,
            &[&replica, &killed],
        );
    }

    // And Dynamo itself, restarted from a kvwasm replica's /dump, answers
    // as the Dynamo that followed the stream.
    let restored = Service::dynamo(
        "Dynamo 1.6.1 (recovered from kvwasm's /dump)",
        &[&replica.url],
    );
    scenario.compare(
        "Dynamo recovered from kvwasm's /dump",
        &dynamo,
        &[&restored],
    );
}

#[test]
fn an_80000_event_batch_is_applied_in_full_with_nothing_dropped() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    // The batch is larger than the guest's whole queue.
    let kvwasm = Service::kvwasm("kvwasm", "queue_events = 65536\n");
    let mut scenario = Scenario::new(World::new(80_000, "", 51, 300));
    scenario.register(&dynamo);
    scenario.register(&kvwasm);
    scenario.publish(20);
    scenario.publish_one_batch(0, 80_000);
    scenario.publish(20);
    scenario.checkpoint("after one 80,000-event batch", &dynamo, &[&kvwasm]);
    assert_eq!(
        kvwasm.metric("kvwasm_serve_events_dropped_total{guest=\"subscribers.idx\"}"),
        0,
        "events dropped"
    );
    // The precondition holds by construction: one batch of 80,000 events
    // against `queue_events = 65536` above; the counters are the guest's.
    assert!(
        kvwasm.metric("kvwasm_serve_events_deferred_total{guest=\"subscribers.idx\"}") >= 80_000
    );
}

/// A batch larger than twice `log_events` is gone from the replay log
/// before the indexer can take it (by construction, not by timing): the
/// indexer diverges, says so, and is rebuilt automatically from a peer's
/// `/dump` once one is registered, then follows the stream again.
#[test]
fn events_lost_to_a_tiny_log_are_rebuilt_from_a_peer_automatically() {
    let dynamo = Service::dynamo("Dynamo 1.6.1", &[]);
    let kvwasm = Service::kvwasm("kvwasm (tiny log)", "queue_events = 64\nlog_events = 100\n");
    let mut scenario = Scenario::new(World::new(37, "", 81, 12));
    scenario.register(&dynamo);
    scenario.register(&kvwasm);
    scenario.publish(50);
    scenario.publish_one_batch(0, 1000);
    scenario.publish(50);
    scenario.end_streams();
    scenario.settle(&[&dynamo]);

    // Diverged, with no peer: /health and every answer say so.
    let started = std::time::Instant::now();
    let health = loop {
        let (status, health) = kvwasm.call("GET", "/health", None);
        if status == 503 {
            break health;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "kvwasm never diverged: {status} {health}; stderr:\n{}",
            kvwasm.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(
        health["diverged"],
        serde_json::json!(["subscribers.idx"]),
        "{health}"
    );
    let rebuild = health["rebuild"].as_str().unwrap_or_default();
    assert!(rebuild.contains("/register_peer"), "{health}");
    assert_eq!(
        kvwasm.metric("kvwasm_serve_diverged{guest=\"subscribers.idx\"}"),
        1
    );
    assert!(kvwasm.metric("kvwasm_serve_events_dropped_total{guest=\"subscribers.idx\"}") >= 1000);
    let (status, _) = kvwasm.call("GET", "/dump", None);
    assert_eq!(status, 503, "a diverged indexer answers nothing");

    // Dynamo's indexer as the peer: rebuilt from its /dump without any
    // operator's /restore.
    kvwasm.expect(
        201,
        "POST",
        "/register_peer",
        Some(&serde_json::json!({"url": dynamo.url})),
    );
    let started = std::time::Instant::now();
    while kvwasm.call("GET", "/health", None).0 != 200 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "never rebuilt: {:?}; stderr:\n{}",
            kvwasm.call("GET", "/health", None),
            kvwasm.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        kvwasm.metric("kvwasm_serve_peer_rebuilds_total{guest=\"subscribers.idx\"}"),
        1
    );
    scenario.compare("rebuilt from Dynamo's /dump", &dynamo, &[&kvwasm]);

    // Then it follows the publishers (removals of blocks the dump gave it
    // included).
    scenario.publish(150);
    scenario.checkpoint("rebuilt, then 150 more batches", &dynamo, &[&kvwasm]);
}

#[test]
fn nats_only_workers_registered_without_endpoints_get_every_event() {
    let nats = NatsServer::start();
    let subject = "namespace.dyn.component.backend.kv-events";
    // Dynamo's standalone indexer has no NATS: it gets the same events
    // from the ZMQ publishers.
    let dynamo = Service::dynamo("Dynamo 1.6.1 (over ZMQ)", &[]);
    let kvwasm = Service::kvwasm(
        "kvwasm (over NATS only)",
        &format!(
            "[[serve.nats]]\nurl = {:?}\nsubjects = [{subject:?}]\n",
            nats.url()
        ),
    );
    let mut scenario = Scenario::new(World::new(38, "", 71, 16));
    scenario.register(&dynamo);
    scenario.mirror_to_nats(&nats.url(), subject);

    // kvwasm's subscription is in place once it has counted a message: a
    // clear of a rank that holds nothing yet, sent until counted (NATS
    // drops what is published before a subscription).
    let source = format!("{{source=\"nats:{}\"}}", nats.url());
    let events = format!("kvwasm_source_events_total{source}");
    let warm_up = parity::stream::router_event((71, 0), 0, &parity::stream::Event::Cleared, 16);
    let started = std::time::Instant::now();
    while kvwasm.metric(&events) == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "kvwasm never received a NATS message; stderr:\n{}",
            kvwasm.log()
        );
        scenario.nats_raw(warm_up.to_string());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Published before kvwasm knows the workers: kept until they are
    // registered (without endpoints), then applied.
    scenario.publish(150);
    let started = std::time::Instant::now();
    while kvwasm.metric(&events) < scenario.nats_published() + 1 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{} of {} NATS events received; stderr:\n{}",
            kvwasm.metric(&events),
            scenario.nats_published(),
            kvwasm.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    scenario.register_without_endpoints(&kvwasm);
    scenario.publish(150);
    scenario.checkpoint(
        "NATS-only workers, events before and after their registration",
        &dynamo,
        &[&kvwasm],
    );
}
