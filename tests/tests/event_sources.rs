//! The KV event sources (`kvwasm-event-sources`) against real publishers:
//! `tests/scripts/kv_publisher.py` (pyzmq + msgpack, the vLLM and SGLang
//! shapes, a ROUTER replay socket) and a real `nats-server`, killed and
//! restarted mid-stream; and the shim's own `publish_events`, received by a
//! SUB while llama.cpp-style traffic goes through libkv_store_wasm.so, and
//! by `kvwasm serve`'s KV indexer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvwasm_event_sources::{
    Event, EventData, NatsSource, SourceCounters, SourceHandle, ZmqWorker, decode_zmq_batch,
    spawn_nats, spawn_zmq,
};
use kvwasm_tests::servers::{KvPublisher, NatsServer, free_port};
use kvwasm_tests::{Probe, RunningProbe, pattern, write_config, xxh3_key};
use tokio::sync::mpsc;

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");
/// The longest any one wait in these tests may take.
const PATIENCE: Duration = Duration::from_secs(15);

/// One line per event, the fields a test checks.
fn summary(e: &Event) -> String {
    let head = format!("{}/{} #{}", e.worker_id, e.dp_rank, e.event_id);
    match &e.data {
        EventData::Stored(s) => format!(
            "{head} stored {:?} parent {:?} tokens {:?} tokens_hashes {:?} size {:?} {:?}",
            s.block_hashes, s.parent_hash, s.token_ids, s.tokens_hashes, s.block_size, s.tier
        ),
        EventData::Removed(r) => format!("{head} removed {:?} {:?}", r.block_hashes, r.tier),
        EventData::Cleared => format!("{head} cleared"),
    }
}

/// The summaries of kv_publisher.py's batches `seqs` (see its docstring),
/// from worker 7 with `rank` and hashes `h`.
fn published(
    seqs: impl IntoIterator<Item = u64>,
    last: u64,
    rank: u32,
    h: fn(u64) -> u64,
) -> Vec<String> {
    let mut out = Vec::new();
    for k in seqs {
        let head = format!("7/{rank} #{k}");
        let parent = (k > 0).then(|| h(2 * k - 1));
        let tokens: Vec<u32> = (8 * k as u32..8 * k as u32 + 8).collect();
        out.push(format!(
            "{head} stored {:?} parent {parent:?} tokens {tokens:?} tokens_hashes [] size Some(4) Some(Tier::Device)",
            [h(2 * k), h(2 * k + 1)]
        ));
        if k % 2 == 1 {
            out.push(format!(
                "{head} removed {:?} Some(Tier::Host)",
                [h(2 * k - 2)]
            ));
        }
        if k == last {
            out.push(format!("{head} cleared"));
        }
    }
    out
}

fn worker(publisher: &KvPublisher, replay: bool) -> ZmqWorker {
    ZmqWorker {
        instance_id: 7,
        dp_rank: 0,
        endpoint: publisher.endpoint.clone(),
        replay_endpoint: replay.then(|| publisher.replay_endpoint.clone()),
        model: "m".into(),
        tenant: "t".into(),
    }
}

/// Warm-up events (see [`publish_until_seen`]) have ids from here on.
const WARM_UP_IDS: u64 = 1000;

/// Events from `sink` until `n` have come, warm-ups left out (panics after
/// [`PATIENCE`]).
async fn receive(sink: &mut mpsc::Receiver<Vec<Event>>, n: usize) -> Vec<Event> {
    let mut events = Vec::new();
    while events.len() < n {
        match tokio::time::timeout(PATIENCE, sink.recv()).await {
            Ok(Some(batch)) => {
                events.extend(batch.into_iter().filter(|e| e.event_id < WARM_UP_IDS))
            }
            _ => panic!(
                "{} of {n} events after {PATIENCE:?}: {:#?}",
                events.len(),
                events.iter().map(summary).collect::<Vec<_>>()
            ),
        }
    }
    events
}

/// Wait until the source has taken in `messages` messages, then check
/// that nothing more reaches the sink.
async fn settle(source: &SourceHandle, messages: u64, sink: &mut mpsc::Receiver<Vec<Event>>) {
    let counters: &SourceCounters = &source.counters;
    let started = Instant::now();
    while counters.snapshot()["messages"] < messages {
        assert!(started.elapsed() < PATIENCE, "{:?}", counters.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    if let Ok(extra) = sink.try_recv() {
        panic!(
            "unexpected events: {:?}",
            extra.iter().map(summary).collect::<Vec<_>>()
        );
    }
}

fn counters(source: &SourceHandle, names: &[&str]) -> Vec<u64> {
    let snapshot = source.counters.snapshot();
    names.iter().map(|n| snapshot[n]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_tagged_maps_a_forced_gap_is_replayed_and_duplicates_skipped() {
    // Seqs 3 and 4 are never published live: seeing 5 after 2, the source
    // asks the ROUTER for 3.. and gets 3..=7 (vLLM 0.33 replies, with the
    // topic); the live 5, 6 and 7 are then duplicates.
    let mut publisher = KvPublisher::start(&[
        "--shape",
        "vllm-map",
        "--hashes",
        "signed",
        "--batches",
        "8",
        "--drop",
        "3,4",
        "--reply-topic",
    ]);
    let (tx, mut sink) = mpsc::channel(64);
    let source = spawn_zmq(worker(&publisher, true), tx);
    assert_eq!(publisher.line(), "published");
    let events = receive(&mut sink, published(0..8, 7, 1, |i| !i).len()).await;
    // The batch's rank (1) overrides the registered one (0); signed
    // hashes -(i + 1) arrive bit-cast: !i.
    let got: Vec<String> = events.iter().map(summary).collect();
    assert_eq!(got, published(0..8, 7, 1, |i| !i));
    assert!(
        events
            .iter()
            .all(|e| e.model.as_deref() == Some("m") && e.tenant.as_deref() == Some("t"))
    );
    assert_eq!(publisher.line(), "replayed 3 5");
    settle(&source, 6 + 5, &mut sink).await;
    assert_eq!(
        counters(
            &source,
            &[
                "gaps",
                "replayed",
                "duplicates_skipped",
                "decode_errors",
                "restarts"
            ]
        ),
        [1, 5, 3, 0, 0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_tagged_arrays_a_first_seq_above_zero_is_a_gap_and_garbage_is_counted() {
    // Seq 0 is never published live, so the first message (1) is a gap
    // from 0; the replay (older vLLM's replies, no topic) brings 0..=7, of
    // which 2 is not msgpack: counted, skipped, the source goes on.
    let mut publisher = KvPublisher::start(&[
        "--shape",
        "vllm-array",
        "--hashes",
        "bytes",
        "--batches",
        "8",
        "--drop",
        "0",
        "--garbage",
        "2",
    ]);
    let (tx, mut sink) = mpsc::channel(64);
    let source = spawn_zmq(worker(&publisher, true), tx);
    assert_eq!(publisher.line(), "published");
    // Byte hashes fold to their last 8 bytes, big-endian: i + 1000. The
    // batch's rank is nil: the registered one (0) stays.
    let expected = published([0, 1, 3, 4, 5, 6, 7], 7, 0, |i| i + 1000);
    let got: Vec<String> = receive(&mut sink, expected.len())
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(got, expected);
    assert_eq!(publisher.line(), "replayed 0 8");
    settle(&source, 7 + 8, &mut sink).await;
    assert_eq!(
        counters(
            &source,
            &["gaps", "replayed", "duplicates_skipped", "decode_errors"]
        ),
        [1, 8, 7, 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_batches_and_a_publisher_restarted_at_seq_zero() {
    let mut first = KvPublisher::start(&["--shape", "sglang", "--batches", "3"]);
    let (tx, mut sink) = mpsc::channel(64);
    let source = spawn_zmq(worker(&first, true), tx);
    assert_eq!(first.line(), "published");
    let expected = published(0..3, 2, 0, |i| i + 1000);
    let got: Vec<String> = receive(&mut sink, expected.len())
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(got, expected);
    // A new process on the same endpoints, counting from 0 again: the
    // source reconnects and takes seq 0 as a restart, not a duplicate.
    first.kill();
    let mut second = KvPublisher::start_at(
        &first.endpoint,
        &first.replay_endpoint,
        &["--shape", "sglang", "--batches", "3"],
    );
    assert_eq!(second.line(), "published");
    let got: Vec<String> = receive(&mut sink, expected.len())
        .await
        .iter()
        .map(summary)
        .collect();
    assert_eq!(got, expected);
    settle(&source, 6, &mut sink).await;
    assert_eq!(
        counters(
            &source,
            &[
                "restarts",
                "reconnects",
                "gaps",
                "duplicates_skipped",
                "decode_errors"
            ]
        ),
        [1, 1, 0, 0, 0]
    );
}

/// Publish `payload` on `subject` every 100 ms until an event with
/// `event_id` reaches the sink (the source's subscription is then in place
/// on the server); other events are returned.
async fn publish_until_seen(
    client: &async_nats::Client,
    sink: &mut mpsc::Receiver<Vec<Event>>,
    event_id: u64,
) -> Vec<Event> {
    let started = Instant::now();
    let payload = format!(
        r#"{{"worker_id": 1, "event": {{"event_id": {event_id}, "dp_rank": 0, "data": "cleared"}}}}"#
    );
    let mut others = Vec::new();
    loop {
        assert!(
            started.elapsed() < PATIENCE,
            "the NATS source never saw event {event_id}"
        );
        client
            .publish(
                "namespace.dyn.component.backend.kv-events",
                payload.clone().into(),
            )
            .await
            .unwrap();
        client.flush().await.unwrap();
        if let Ok(Some(batch)) = tokio::time::timeout(Duration::from_millis(100), sink.recv()).await
        {
            for e in batch {
                if e.event_id == event_id {
                    return others;
                }
                if e.event_id < WARM_UP_IDS {
                    others.push(e);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_router_events_and_kvbm_batches_survive_a_server_restart() {
    let mut server = NatsServer::start();
    let (tx, mut sink) = mpsc::channel(64);
    let source = spawn_nats(
        NatsSource {
            url: server.url(),
            subjects: Vec::new(),
            model: Some("m".into()),
            tenant: None,
            block_size: None,
        },
        tx,
    );
    let client = async_nats::connect(server.url()).await.unwrap();
    publish_until_seen(&client, &mut sink, WARM_UP_IDS).await;
    let instance = (5u128 << 64) | 42;
    let router = "namespace.dyn.component.backend.kv-events";
    for (subject, json) in [
        (
            router,
            r#"{"worker_id": 3, "event": {"event_id": 1, "dp_rank": 2, "data": {"stored":
               {"parent_hash": null, "blocks": [{"block_hash": 11, "tokens_hash": 111},
               {"block_hash": -12, "tokens_hash": 112}]}}}}"#
                .to_owned(),
        ),
        (router, "{not json".to_owned()),
        (
            "namespace.other.component.worker.kv-events",
            r#"{"worker_id": 3, "event": {"event_id": 2, "data": {"removed": {"block_hashes": [11]}}}}"#
                .to_owned(),
        ),
        ("kvbm.events", format!(r#"{{"events": {{"Create": [21, 22]}}, "instance_id": {instance}}}"#)),
        ("kvbm.events", format!(r#"{{"events": {{"Remove": [21]}}, "instance_id": {instance}}}"#)),
    ] {
        client.publish(subject, json.into()).await.unwrap();
    }
    client.flush().await.unwrap();
    let mut before = receive(&mut sink, 4).await;
    // Order holds within a subscription, not across them: by worker (a
    // stable sort keeps each one's order).
    before.sort_by_key(|e| e.worker_id);
    assert!(
        before
            .iter()
            .all(|e| e.model.as_deref() == Some("m") && e.tenant.is_none())
    );
    let before: Vec<String> = before.iter().map(summary).collect();
    assert_eq!(
        before,
        [
            format!(
                "3/2 #1 stored {:?} parent None tokens [] tokens_hashes [111, 112] size None None",
                [11, (-12i64) as u64]
            ),
            "3/0 #2 removed [11] None".to_owned(),
            "42/0 #0 stored [21, 22] parent None tokens [] tokens_hashes [] size None None"
                .to_owned(),
            "42/0 #0 removed [21] None".to_owned(),
        ]
    );
    // The server dies and comes back on the same port: the source
    // reconnects and resubscribes by itself; what is published after that
    // reaches the sink.
    server.kill();
    server.restart();
    let client = async_nats::connect(server.url()).await.unwrap();
    let stray = publish_until_seen(&client, &mut sink, WARM_UP_IDS + 1).await;
    assert!(
        stray.is_empty(),
        "{:?}",
        stray.iter().map(summary).collect::<Vec<_>>()
    );
    client
        .publish(
            router,
            r#"{"worker_id": 4, "event": {"event_id": 3, "data": "cleared"}}"#.into(),
        )
        .await
        .unwrap();
    client
        .publish(
            "kvbm.events",
            format!(r#"{{"events": {{"Create": [31]}}, "instance_id": {instance}}}"#).into(),
        )
        .await
        .unwrap();
    client.flush().await.unwrap();
    let mut after = receive(&mut sink, 2).await;
    after.sort_by_key(|e| e.worker_id);
    let after: Vec<String> = after.iter().map(summary).collect();
    assert_eq!(
        after,
        [
            "4/0 #3 cleared".to_owned(),
            "42/0 #0 stored [31] parent None tokens [] tokens_hashes [] size None None".to_owned(),
        ]
    );
    let snapshot = source.counters.snapshot();
    assert_eq!(snapshot["decode_errors"], 1, "{snapshot:?}");
    assert!(snapshot["reconnects"] >= 1, "{snapshot:?}");
}

/// A PUB socket drops what it sends before a subscription reaches it: the
/// probe repeats a warm-up put this many times, pausing after each, until
/// the test's subscriber sees one.
const WARM_UPS: usize = 50;

/// llama.cpp-style traffic through a shim publishing events: the config
/// (backend `pub`), the 96 content-addressed chunks of a slot save (xxh3-64
/// keys, as llama.cpp writes them) and the probe's ops: the warm-ups, the
/// puts and a manifest, then a restore and a delete.
struct SlotTraffic {
    config: PathBuf,
    /// (hex key, content).
    chunks: Vec<(String, Vec<u8>)>,
    ops: Vec<String>,
}

/// The [`SlotTraffic`] of a backend publishing to `address`.
fn slot_traffic(dir: &std::path::Path, address: &str) -> SlotTraffic {
    let config = write_config(
        dir,
        &format!(
            "[backends.pub]\ncomponent = \"builtin:fs\"\ndir = \"data\"\npublish_events = \"{address}\"\n"
        ),
    );
    let chunks: Vec<(String, Vec<u8>)> = (0..96u64)
        .map(|i| {
            let text: String = hex::encode(pattern(64, i));
            (hex::encode(xxh3_key(text.as_bytes())), text.into_bytes())
        })
        .collect();
    let warm = hex::encode(xxh3_key(b"warm-up"));
    let mut ops: Vec<String> = Vec::new();
    for _ in 0..WARM_UPS {
        ops.push(format!("put-chunk:{warm}=warm-up"));
        ops.push("pause".into());
    }
    for (hash, data) in &chunks {
        ops.push(format!(
            "put-chunk:{hash}={}",
            String::from_utf8_lossy(data)
        ));
    }
    let names: Vec<&str> = chunks.iter().map(|(h, _)| h.as_str()).collect();
    ops.push(format!("put-manifest:slot0={}", names.join(",")));
    ops.push("get-manifest:slot0".into());
    ops.push(format!("prefetch:{}", names.join(",")));
    ops.push(format!("get-chunk:{}", names[0]));
    ops.push("delete-manifest:slot0".into());
    ops.push("pause".into());
    SlotTraffic {
        config,
        chunks,
        ops,
    }
}

/// Read the probe's lines for one warm-up (a put and its pause).
fn warm_up_done(probe: &mut RunningProbe) {
    let put = probe.line();
    assert!(
        put.starts_with("put-chunk") && !put.contains("-> -"),
        "{put}"
    );
    assert_eq!(probe.line(), "pause");
}

/// Read the probe's lines after the warm-ups: every op succeeded.
fn traffic_done(probe: &mut RunningProbe, ops: &[String]) {
    for _ in 0..ops.len() - 2 * WARM_UPS - 1 {
        let line = probe.line();
        assert!(line.contains("-> 0"), "{line}");
    }
    assert_eq!(probe.line(), "pause");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_publishes_every_stored_chunk_of_llama_cpp_style_traffic() {
    use zeromq::{Socket as _, SocketRecv as _};
    let dir = tempfile::tempdir().unwrap();
    let address = format!("tcp://127.0.0.1:{}", free_port());
    let SlotTraffic {
        config,
        chunks,
        ops,
    } = slot_traffic(dir.path(), &address);
    let mut probe = Probe::new(PROBE, "wasm://pub/llama")
        .config(&config)
        .spawn(&ops.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(probe.line(), "open ok");

    let mut sub = zeromq::SubSocket::new();
    sub.subscribe("").await.unwrap();
    sub.connect(&address).await.unwrap();
    let worker = ZmqWorker {
        instance_id: 1,
        dp_rank: 0,
        endpoint: address.clone(),
        replay_endpoint: None,
        model: String::new(),
        tenant: String::new(),
    };
    // Every message: [topic "", seq, vLLM batch]; returns (seq, block hashes).
    let mut next = async || {
        let message = tokio::time::timeout(PATIENCE, sub.recv())
            .await
            .expect("a message")
            .unwrap();
        let frames = message.into_vec();
        assert_eq!(frames.len(), 3);
        assert!(frames[0].is_empty(), "topic {:?}", frames[0]);
        let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
        let events = decode_zmq_batch(&frames[2], &worker, seq).unwrap();
        let hashes: Vec<u64> = events
            .iter()
            .map(|e| match &e.data {
                EventData::Stored(s) => {
                    assert_eq!(s.block_hashes.len(), 1);
                    assert!(s.token_ids.is_empty() && s.parent_hash.is_none());
                    s.block_hashes[0]
                }
                other => panic!("{other:?}"),
            })
            .collect();
        (seq, hashes)
    };
    let warm_hash = kvwasm_host::events_out::fold_hash(&xxh3_key(b"warm-up"));
    let mut warmed = None;
    for _ in 0..WARM_UPS {
        warm_up_done(&mut probe);
        if warmed.is_none()
            && let Ok(first) = tokio::time::timeout(Duration::from_millis(300), next()).await
        {
            assert!(first.1.iter().all(|&h| h == warm_hash));
            warmed = Some(first.0);
        }
        probe.resume();
    }
    let mut last_seq = warmed.expect("the SUB never received a warm-up event");
    let expected: Vec<u64> = chunks
        .iter()
        .map(|(hash, _)| kvwasm_host::events_out::fold_hash(&hex::decode(hash).unwrap()))
        .collect();
    let mut stored = Vec::new();
    while stored.len() < expected.len() {
        let (seq, hashes) = next().await;
        assert_eq!(seq, last_seq + 1, "sequence numbers are consecutive");
        last_seq = seq;
        stored.extend(hashes.into_iter().filter(|&h| h != warm_hash));
    }
    assert_eq!(stored, expected, "one BlockStored per put_chunk, in order");
    traffic_done(&mut probe, &ops);
    // Manifests are not blocks: nothing more was published.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), next())
            .await
            .is_err()
    );
    probe.resume();
    let (rest, stderr) = probe.finish();
    assert!(rest.is_empty(), "{rest:?} {stderr}");
}

/// As above, with the shim's PUB endpoint registered in `kvwasm serve`
/// (in process, through its HTTP listener) and the real KV indexer: the
/// chunks' BlockStored events (no tokens, block size 0) are indexed under
/// their folded keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvwasm_serve_indexes_every_chunk_the_shim_stores() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("tcp://127.0.0.1:{}", free_port());
    let SlotTraffic {
        config,
        chunks,
        ops,
    } = slot_traffic(dir.path(), &address);
    let mut probe = Probe::new(PROBE, "wasm://pub/llama")
        .config(&config)
        .spawn(&ops.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(probe.line(), "open ok");

    let serve_dir = dir.path().join("serve");
    std::fs::create_dir(&serve_dir).unwrap();
    let serve_config = write_config(
        &serve_dir,
        "[subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\n\
         [serve]\nindexer = \"idx\"\nlisten = \"127.0.0.1:0\"\n",
    );
    let serve_config = kvwasm_host::config::Config::load(&serve_config).unwrap();
    let settings = kvwasm_serve::ServeConfig::parse(serve_config.serve.as_ref()).unwrap();
    let guests = kvwasm_serve::guests_from_config(&serve_config, &settings).unwrap();
    let serve = kvwasm_serve::start(settings, guests).await.unwrap();
    let url = format!("http://{}", serve.local_addr());
    let client = reqwest::Client::new();
    let post = async |path: &str, body: serde_json::Value| {
        let response = client
            .post(format!("{url}{path}"))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        (status, body)
    };
    const BLOCK_SIZE: u64 = 16;
    let (status, answer) = post(
        "/register",
        serde_json::json!({"instance_id": 1, "endpoint": address, "model_name": "llama",
                           "block_size": BLOCK_SIZE}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    // The score of worker 1 for one block hash, folded as publish_events
    // folds a key and sent signed, as Dynamo's API takes them.
    let score = async |key: &[u8]| {
        let hash = kvwasm_host::events_out::fold_hash(key) as i64;
        let (status, answer) = post(
            "/query_by_hash",
            serde_json::json!({"block_hashes": [hash], "model_name": "llama"}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let warm = xxh3_key(b"warm-up");
    let mut warmed = false;
    for _ in 0..WARM_UPS {
        warm_up_done(&mut probe);
        if !warmed {
            // The put went out before the pause: indexed shortly if the
            // source was subscribed by then.
            let started = Instant::now();
            while !warmed && started.elapsed() < Duration::from_millis(300) {
                warmed = score(&warm).await["scores"]["1"]["0"] == BLOCK_SIZE;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        probe.resume();
    }
    assert!(warmed, "the indexer never saw a warm-up chunk");
    traffic_done(&mut probe, &ops);
    // Every distinct chunk stored, the warm-up's among them, each found
    // by its own hash.
    let distinct = chunks.len() as u64 + 1;
    let started = Instant::now();
    while score(&warm).await["tree_sizes"]["1"]["0"] != distinct {
        assert!(started.elapsed() < PATIENCE, "{}", score(&warm).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (hash, _) in &chunks {
        let answer = score(&hex::decode(hash).unwrap()).await;
        assert_eq!(
            answer,
            serde_json::json!({"scores": {"1": {"0": BLOCK_SIZE}}, "frequencies": [],
                               "instances": {"1": {"longest_matched": BLOCK_SIZE, "gpu": BLOCK_SIZE,
                                   "dp": {"0": BLOCK_SIZE}, "cpu": BLOCK_SIZE, "disk": BLOCK_SIZE}},
                               "tree_sizes": {"1": {"0": distinct}}}),
            "{hash}"
        );
    }
    probe.resume();
    let (rest, stderr) = probe.finish();
    assert!(rest.is_empty(), "{rest:?} {stderr}");
}
