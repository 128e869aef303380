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
        kvwasm.metric("kvwasm_serve_events_dropped_total{guest=\"idx\"}"),
        0,
        "events dropped"
    );
    // The precondition holds by construction: one batch of 80,000 events
    // against `queue_events = 65536` above.
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
