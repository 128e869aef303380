//! `kvwasm serve` in process, with the real `builtin:kv-indexer` guest,
//! driven through its HTTP listener: the API's status codes and error
//! bodies (interop-facts §4), body limits, and a guest instance lost and
//! rebuilt from the event log.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Harness, wait_for};
use kvwasm_host::subscriber::{BlocksStored, Event, EventData, SourceKind};
use serde_json::{Value, json};

mod common;

fn register(instance_id: u64, block_size: u32) -> Value {
    json!({"instance_id": instance_id, "endpoint": "tcp://127.0.0.1:5557",
           "model_name": "m", "block_size": block_size})
}

/// `blocks` full blocks of 16 tokens stored by `worker`, chained.
fn stored(worker: u64, event_id: u64, first_block: u64, blocks: u64) -> Event {
    let tokens = (first_block * 16) as u32..((first_block + blocks) * 16) as u32;
    Event {
        worker_id: worker,
        dp_rank: 0,
        event_id,
        source: SourceKind::Zmq,
        model: Some("m".into()),
        tenant: Some("default".into()),
        data: EventData::Stored(BlocksStored {
            block_hashes: (first_block..first_block + blocks)
                .map(|b| 1000 + b)
                .collect(),
            parent_hash: first_block.checked_sub(1).map(|b| 1000 + b),
            token_ids: tokens.collect(),
            tokens_hashes: Vec::new(),
            block_size: Some(16),
            lora_name: None,
            tier: None,
        }),
    }
}

fn query(h: &Harness, blocks: u32) -> Value {
    let (status, answer) = h.json(
        "POST",
        "/query",
        &json!({"token_ids": (0..blocks * 16).collect::<Vec<_>>(), "model_name": "m"}),
    );
    assert_eq!(status, 200, "{answer}");
    answer
}

#[test]
fn api_status_codes_and_error_bodies_through_the_listener() {
    let h = Harness::start("api", "", "");
    let (status, body) = h.call("GET", "/health", "");
    assert_eq!((status, body.len()), (200, 0));

    // Registrations: the guest's answers, unchanged by the host.
    assert_eq!(h.json("POST", "/register", &register(1, 16)).0, 201);
    for (request, status, message) in [
        (register(1, 16), 409, "already registered"),
        (register(2, 32), 409, "block_size mismatch"),
        (
            json!({"instance_id": 3, "endpoint": "not an endpoint", "model_name": "m", "block_size": 16}),
            400,
            "invalid endpoint",
        ),
    ] {
        let (got, answer) = h.json("POST", "/register", &request);
        assert_eq!(got, status, "{request}: {answer}");
        let error = answer["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"));
        assert!(error.contains(message), "{error}");
    }
    let (status, answer) = h.json(
        "POST",
        "/unregister",
        &json!({"instance_id": 99, "model_name": "m"}),
    );
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"].is_string());
    let (status, answer) = h.json(
        "POST",
        "/query",
        &json!({"token_ids": [1, 2, 3], "model_name": "nope"}),
    );
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"].is_string());
    let (status, workers) = h.json("GET", "/workers", &json!(null));
    assert_eq!(status, 200);
    assert_eq!(workers[0]["instance_id"], 1, "{workers}");

    // Not JSON: reaches the guest, which answers 400.
    let (status, body) = h.call("POST", "/register", "instance_id=1");
    assert_eq!(status, 400);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert!(answer["error"].is_string(), "{answer}");

    // Peers: the host's own routes, answered as Dynamo 1.6.1 does
    // (`status` is what its clients read; `url` is extra).
    for _ in 0..2 {
        let (status, answer) = h.json(
            "POST",
            "/register_peer",
            &json!({"url": "http://10.0.0.9:8090"}),
        );
        assert_eq!((status, &answer["status"]), (201, &json!("ok")), "{answer}");
    }
    assert_eq!(
        h.json("GET", "/peers", &json!(null)),
        (200, json!(["http://10.0.0.9:8090"]))
    );
    let (status, answer) = h.json(
        "POST",
        "/deregister_peer",
        &json!({"url": "http://10.0.0.1:1"}),
    );
    assert_eq!((status, answer), (404, json!({"error": "peer not found"})));
    let (status, answer) = h.json(
        "POST",
        "/deregister_peer",
        &json!({"url": "http://10.0.0.9:8090"}),
    );
    assert_eq!((status, &answer["status"]), (200, &json!("ok")), "{answer}");
    assert_eq!(h.json("GET", "/peers", &json!(null)), (200, json!([])));
    assert_eq!(h.call("POST", "/register_peer", "{").0, 400);
    assert_eq!(h.call("DELETE", "/health", "").0, 405);

    let metrics = h.metrics();
    for expected in [
        "kvwasm_calls_total{backend=\"subscribers.api\"}",
        "kvwasm_serve_http_requests_total{endpoint=\"/register\",class=\"2xx\"} 1",
        "kvwasm_serve_http_requests_total{endpoint=\"/register\",class=\"4xx\"} 4",
        "kvwasm_serve_http_requests_total{endpoint=\"/deregister_peer\",class=\"4xx\"} 1",
        "kvwasm_serve_events_dropped_total{guest=\"subscribers.api\"} 0",
        "kvwasm_serve_rebuilds_total{guest=\"subscribers.api\"} 0",
    ] {
        assert!(metrics.contains(expected), "{expected} missing:\n{metrics}");
    }
}

/// Write `head`, then `body_len` bytes of body from another thread (the
/// server may answer and close before reading it all), and read the answer.
fn raw_request(addr: SocketAddr, head: &str, body_len: usize, chunked: bool) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let chunk = vec![b'7'; 1 << 20];
        for _ in 0..body_len / chunk.len() {
            let sent = if chunked {
                write!(writer, "{:x}\r\n", chunk.len())
                    .and_then(|()| writer.write_all(&chunk))
                    .and_then(|()| writer.write_all(b"\r\n"))
            } else {
                writer.write_all(&chunk)
            };
            if sent.is_err() {
                return;
            }
        }
        if chunked {
            let _ = writer.write_all(b"0\r\n\r\n");
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0; 4096];
    // Up to the end of the first response's body (a JSON object).
    while !answer.ends_with(b"}") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    drop(stream);
    sender.join().unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn a_100_mb_body_is_refused_413_without_reaching_the_guest() {
    let h = Harness::start("big", "", "");
    let before = h.guest_metric("kvwasm_calls_total", "backend");
    let mb100 = 100 << 20;
    for (head, chunked) in [
        (
            format!("POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: {mb100}\r\n\r\n"),
            false,
        ),
        (
            "POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned(),
            true,
        ),
    ] {
        let answer = raw_request(h.addr(), &head, mb100, chunked);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(
            answer.contains("{\"error\":\"the request body exceeds 16777216 bytes"),
            "{answer}"
        );
        let (status, body) = h.call("GET", "/health", "");
        assert_eq!((status, body.len()), (200, 0));
    }
    assert_eq!(
        h.guest_metric("kvwasm_calls_total", "backend"),
        before,
        "the guest was called"
    );
    assert_eq!(
        h.metric("kvwasm_serve_http_requests_total{endpoint=\"/query\",class=\"4xx\"}"),
        2
    );
}

#[test]
fn a_guest_lost_mid_stream_is_rebuilt_from_the_log_with_identical_answers() {
    // 16 MiB of guest memory: a 24 MiB request body cannot be copied in, so
    // the guest traps (out of memory) and its instance is replaced.
    let lossy = Harness::start("lossy", "memory_limit_mib = 16", "max_body_mib = 32");
    let reference = Harness::start("reference", "memory_limit_mib = 16", "max_body_mib = 32");
    for h in [&lossy, &reference] {
        assert_eq!(h.json("POST", "/register", &register(1, 16)).0, 201);
        assert_eq!(h.json("POST", "/register", &register(2, 16)).0, 201);
        h.publish(vec![stored(1, 1, 0, 4), stored(2, 1, 0, 2)]);
        h.publish(vec![stored(1, 2, 4, 2)]);
        wait_for("the first events", || query(h, 6)["scores"]["1"]["0"] == 96);
    }
    let (status, body) = lossy.call("POST", "/query", vec![b' '; 24 << 20]);
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        answer["error"].as_str().unwrap().contains("trapped"),
        "{answer}"
    );
    assert_eq!(lossy.call("GET", "/health", "").0, 200);
    // Mid-stream: more events, and an unregistration, after the loss.
    for h in [&lossy, &reference] {
        h.publish(vec![stored(2, 2, 2, 3)]);
        let (status, answer) = h.json(
            "POST",
            "/unregister",
            &json!({"instance_id": 1, "model_name": "m"}),
        );
        assert_eq!(status, 200, "{answer}");
        wait_for("the later events", || query(h, 6)["scores"]["2"]["0"] == 80);
    }
    assert_eq!(query(&lossy, 6), query(&reference, 6));
    assert_eq!(
        lossy.json("GET", "/workers", &json!(null)),
        reference.json("GET", "/workers", &json!(null))
    );
    let rebuilds = "kvwasm_serve_rebuilds_total";
    assert_eq!(lossy.guest_metric(rebuilds, "guest"), 1);
    assert_eq!(reference.guest_metric(rebuilds, "guest"), 0);
    assert_eq!(lossy.guest_metric("kvwasm_traps_total", "backend"), 1);
}

/// One vLLM-format ZMQ message (`[topic, seq, [ts, [BlockStored], rank]]`):
/// `worker`'s first two blocks of tokens 0..32.
fn vllm_message(seq: u64) -> zeromq::ZmqMessage {
    use rmpv::Value;
    let stored = Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        (
            "block_hashes".into(),
            Value::Array(vec![1000.into(), 1001.into()]),
        ),
        ("parent_block_hash".into(), Value::Nil),
        (
            "token_ids".into(),
            Value::Array((0..32).map(Value::from).collect()),
        ),
        ("block_size".into(), 16.into()),
        ("lora_id".into(), Value::Nil),
        ("medium".into(), "GPU".into()),
    ]);
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![stored]),
        Value::Nil,
    ]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).unwrap();
    let frames: Vec<bytes::Bytes> = vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
        payload.into(),
    ];
    frames.try_into().unwrap()
}

#[test]
fn register_starts_a_zmq_source_and_unregister_stops_it() {
    use zeromq::{Socket as _, SocketSend as _};
    let h = Harness::start("zmq", "", "");
    // The socket belongs to the service's runtime (made, used and dropped there).
    let (mut publisher, bound) = h.runtime.block_on(async {
        let mut publisher = zeromq::PubSocket::new();
        let bound = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
        (publisher, bound)
    });
    let endpoint = match bound {
        zeromq::Endpoint::Tcp(host, port) => format!("tcp://{host}:{port}"),
        other => panic!("{other}"),
    };
    let registration = json!({"instance_id": 5, "endpoint": endpoint, "model_name": "m",
                              "block_size": 16});
    assert_eq!(h.json("POST", "/register", &registration).0, 201);
    // A PUB socket drops what it sends before the subscriber has joined:
    // publish (the same blocks) until the indexer has them.
    let mut seq = 0;
    wait_for("the published blocks", || {
        h.runtime
            .block_on(publisher.send(vllm_message(seq)))
            .unwrap();
        seq += 1;
        std::thread::sleep(Duration::from_millis(50));
        query(&h, 2)["scores"] == json!({"5": {"0": 32}})
    });
    let source = "{source=\"zmq:5:0@m/default\"}";
    assert!(h.metric(&format!("kvwasm_source_events_total{source}")) >= 1);

    let (status, answer) = h.json(
        "POST",
        "/unregister",
        &json!({"instance_id": 5, "model_name": "m"}),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(!h.metrics().contains(source), "the source still runs");
    let events_in = h.metric("kvwasm_serve_events_in_total");
    for _ in 0..5 {
        h.runtime
            .block_on(publisher.send(vllm_message(seq)))
            .unwrap();
        seq += 1;
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.metric("kvwasm_serve_events_in_total"), events_in);
    h.runtime.block_on(async move { drop(publisher) });
}

#[test]
fn a_configured_nats_source_feeds_the_indexer() {
    let nats = kvwasm_tests::servers::NatsServer::start();
    let h = Harness::start(
        "nats",
        "",
        &format!(
            "[[serve.nats]]\nurl = {:?}\nmodel = \"m\"\ntenant = \"default\"\n",
            nats.url()
        ),
    );
    // The tree for (m, default) comes from a registration.
    let registration = json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:9",
                              "model_name": "m", "block_size": 16});
    assert_eq!(h.json("POST", "/register", &registration).0, 201);
    let router_event = json!({"worker_id": 1, "event": {"event_id": 1, "dp_rank": 0,
        "data": {"stored": {"parent_hash": null, "blocks": [
            {"block_hash": 100, "tokens_hash": 15310707395893867146_u64},
            {"block_hash": 101, "tokens_hash": 15292316782987903195_u64}]}}}});
    let client = h.runtime.block_on(async_nats::connect(nats.url())).unwrap();
    // Core NATS drops what is published before the subscription exists:
    // publish (the same blocks) until the indexer has them.
    wait_for("the RouterEvent", || {
        h.runtime.block_on(async {
            let subject = "namespace.dynamo.component.backend.kv-events";
            client
                .publish(subject, router_event.to_string().into())
                .await
                .unwrap();
            client.flush().await.unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        query(&h, 2)["scores"] == json!({"1": {"0": 32}})
    });
    let source = format!("{{source=\"nats:{}\"}}", nats.url());
    assert!(h.metric(&format!("kvwasm_source_events_total{source}")) >= 1);
    h.runtime.block_on(async move { drop(client) });
}

/// `blocks` events of `worker`, one block each, chained: block `b` holds
/// tokens `worker * 1_000_000 + b * 16 ..+16`.
fn chain(worker: u64, blocks: u64) -> Vec<Event> {
    (0..blocks)
        .map(|b| {
            let first = (worker * 1_000_000 + b * 16) as u32;
            Event {
                worker_id: worker,
                dp_rank: 0,
                event_id: b + 1,
                source: SourceKind::Zmq,
                model: Some("m".into()),
                tenant: Some("default".into()),
                data: EventData::Stored(BlocksStored {
                    block_hashes: vec![worker * 1_000_000 + b],
                    parent_hash: b.checked_sub(1).map(|p| worker * 1_000_000 + p),
                    token_ids: (first..first + 16).collect(),
                    tokens_hashes: Vec::new(),
                    block_size: Some(16),
                    lora_name: None,
                    tier: None,
                }),
            }
        })
        .collect()
}

/// One batch larger than `queue_events` (the default 65,536) is applied in
/// full: nothing dropped, and every answer is the one the same events give
/// fed in batches of 100.
#[test]
fn one_80000_event_batch_is_applied_in_full() {
    let big = Harness::start("big_batch", "", "");
    let small = Harness::start("small_batches", "", "");
    let events: Vec<Event> = (1..=100).flat_map(|w| chain(w, 800)).collect();
    assert_eq!(events.len(), 80_000);
    big.publish(events.clone());
    for batch in events.chunks(100) {
        small.publish(batch.to_vec());
    }
    let delivered = "kvwasm_serve_events_delivered_total";
    for h in [&big, &small] {
        wait_for("every event", || {
            h.guest_metric(delivered, "guest") == 80_000
        });
        wait_for("an empty queue", || {
            h.guest_metric("kvwasm_serve_queued_events", "guest") == 0
        });
        assert_eq!(
            h.guest_metric("kvwasm_serve_events_dropped_total", "guest"),
            0
        );
        assert_eq!(
            h.guest_metric("kvwasm_serve_batch_errors_total", "guest"),
            0
        );
    }
    assert!(big.guest_metric("kvwasm_serve_events_deferred_total", "guest") >= 80_000);
    for worker in [1u64, 37, 100] {
        let tokens: Vec<u32> = (0..800 * 16)
            .map(|t| (worker * 1_000_000) as u32 + t)
            .collect();
        let body = json!({"token_ids": tokens, "model_name": "m"});
        let (status, answer) = big.json("POST", "/query", &body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["scores"],
            json!({worker.to_string(): {"0": 800 * 16}})
        );
        assert_eq!((status, answer), small.json("POST", "/query", &body));
    }
    // The same trees: the same events in each dump (their order, and so
    // the ids the dump numbers them with, follow the trees' layout).
    let dump = |h: &Harness| {
        let (status, mut dump) = h.json("GET", "/dump", &json!(null));
        assert_eq!(status, 200);
        let events = dump["m:default"]["events"].as_array_mut().unwrap();
        assert_eq!(events.len(), 80_000);
        for event in events.iter_mut() {
            event["event"]["event_id"] = json!(0);
        }
        events.sort_by_key(|e| e.to_string());
        dump
    };
    assert_eq!(dump(&big), dump(&small));
}

/// A Dynamo deployment publishes RouterEvents over NATS only: its workers
/// have no ZMQ endpoint. They register without one (`/register`,
/// `[[serve.workers]]`), and events published before the registration are
/// held until it comes; or `[[serve.nats]]` names the model and its block
/// size, and no registration is needed.
#[test]
fn nats_workers_need_no_endpoint_and_their_early_events_wait_for_the_registration() {
    let nats = kvwasm_tests::servers::NatsServer::start();
    let url = nats.url();
    // Worker 8 is configured; worker 7 registers later.
    let by_registration = Harness::start(
        "nats_registered",
        "",
        &format!(
            "[[serve.nats]]\nurl = {url:?}\n\
             [[serve.workers]]\ninstance_id = 8\nmodel_name = \"m\"\nblock_size = 16\n"
        ),
    );
    let by_model = Harness::start(
        "nats_model",
        "",
        &format!("[[serve.nats]]\nurl = {url:?}\nmodel = \"m\"\nblock_size = 16\n"),
    );
    let router_event = |worker: u64| {
        json!({"worker_id": worker, "event": {"event_id": 1, "dp_rank": 0,
            "data": {"stored": {"parent_hash": null, "blocks": [
                {"block_hash": 100, "tokens_hash": 15310707395893867146_u64},
                {"block_hash": 101, "tokens_hash": 15292316782987903195_u64}]}}}})
    };
    let client = by_model
        .runtime
        .block_on(async_nats::connect(nats.url()))
        .unwrap();
    let both = json!({"7": {"0": 32}, "8": {"0": 32}});
    let pending = "kvwasm_serve_events_pending";
    // Core NATS drops what is published before a subscription exists:
    // publish (the same blocks) until both services have them.
    wait_for("the RouterEvents", || {
        by_model.runtime.block_on(async {
            for worker in [7, 8] {
                let subject = "namespace.dynamo.component.backend.kv-events";
                client
                    .publish(subject, router_event(worker).to_string().into())
                    .await
                    .unwrap();
            }
            client.flush().await.unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        // 404 until the first store makes the tree.
        let scores = |h: &Harness| {
            let body = json!({"token_ids": (0..32).collect::<Vec<_>>(), "model_name": "m"});
            let (status, answer) = h.json("POST", "/query", &body);
            if status == 200 {
                answer["scores"].clone()
            } else {
                json!(null)
            }
        };
        scores(&by_model) == both
            && scores(&by_registration) == json!({"8": {"0": 32}})
            && by_registration.metric(pending) >= 1
    });
    let registration = json!({"instance_id": 7, "model_name": "m", "block_size": 16});
    let (status, answer) = by_registration.json("POST", "/register", &registration);
    assert_eq!((status, &answer["status"]), (201, &json!("ok")), "{answer}");
    assert_eq!(by_registration.metric(pending), 0);
    wait_for("the held events", || {
        query(&by_registration, 2)["scores"] == both
    });
    assert_eq!(
        query(&by_registration, 2),
        query(&by_model, 2),
        "the same answers either way"
    );
    let (_, workers) = by_registration.json("GET", "/workers", &json!(null));
    assert_eq!(
        workers,
        json!([{"instance_id": 7, "model_name": "m", "routing_group": "default",
                "block_size": 16, "endpoints": {"0": null}},
               {"instance_id": 8, "model_name": "m", "routing_group": "default",
                "block_size": 16, "endpoints": {"0": null}}])
    );
    assert_eq!(
        by_registration.metric("kvwasm_serve_events_pending_dropped_total"),
        0
    );
    by_model.runtime.block_on(async move { drop(client) });
}
