//! `builtin:kv-indexer` through the host's `Subscriber`: the guest answers
//! exactly as the indexer core run natively on the same events.

use kvwasm_bench::events::{self, Shape};
use kvwasm_host::KvError;
use kvwasm_host::subscriber::{Request, Subscriber};
use kvwasm_kv_indexer_core::{Event, EventData, Indexer, Stored};
use serde_json::{Value, json};

/// The subscriber `[subscribers.idx]` of a config file, as `kvwasm serve`
/// builds it.
fn subscriber(dir: &tempfile::TempDir) -> Subscriber {
    subscriber_with(dir, "")
}

/// As [`subscriber`], with `extra` lines in its table.
fn subscriber_with(dir: &tempfile::TempDir, extra: &str) -> Subscriber {
    kvwasm_kv_indexer_host::install();
    let path = dir.path().join("kvwasm.toml");
    std::fs::write(
        &path,
        format!(
            "[subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\nmemory_limit_mib = 256\n{extra}"
        ),
    )
    .unwrap();
    let subscriber = Subscriber::from_config(&path, "idx").expect("start the guest");
    assert!(subscriber.serves_http());
    subscriber
}

/// The same request to the guest and the native indexer: same status and
/// body, returned parsed.
fn both(
    guest: &Subscriber,
    native: &mut Indexer,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, Value) {
    let request = Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        body: body.to_vec(),
    };
    let answer = guest.handle(&request).expect("the guest answers");
    let (status, expected) = native.handle(method, path, "", body);
    assert_eq!(
        (answer.status, String::from_utf8_lossy(&answer.body)),
        (status, String::from_utf8_lossy(&expected)),
        "{method} {path}"
    );
    (status, serde_json::from_slice(&answer.body).expect("JSON"))
}

#[test]
fn guest_answers_like_the_native_core() {
    let dir = tempfile::tempdir().unwrap();
    let guest = subscriber(&dir);
    let mut native = Indexer::default();
    let shape = Shape {
        blocks: 6_000,
        workers: 6,
        block_size: 16,
        batch: 64,
        prompt_tokens: 4096,
        queries: 24,
    };
    for body in events::registrations(&shape) {
        assert_eq!(both(&guest, &mut native, "POST", "/register", &body).0, 201);
    }
    // Refusals come from the guest too.
    let duplicate = &events::registrations(&shape)[0];
    assert_eq!(
        both(&guest, &mut native, "POST", "/register", duplicate).0,
        409
    );
    let unknown = json!({"token_ids": [1, 2], "model_name": "nope"}).to_string();
    assert_eq!(
        both(&guest, &mut native, "POST", "/query", unknown.as_bytes()).0,
        404
    );
    // Token arrays the host's `hash-token-json` refuses: the guest answers
    // through its own parser, with the native body of each error (valid
    // JSON of the wrong shape: 422, as Dynamo).
    let too_long = vec![1u32; kvwasm_kv_indexer_core::MAX_TOKEN_IDS + 1];
    for tokens in [
        json!([1, 2, "]"]),
        json!([1, -2]),
        json!([1, 2.5]),
        json!([1, 4294967296u64]),
        json!(too_long),
    ] {
        let body = json!({"token_ids": tokens, "model_name": events::MODEL}).to_string();
        assert_eq!(
            both(&guest, &mut native, "POST", "/query", body.as_bytes()).0,
            422
        );
    }
    let unterminated = format!(r#"{{"model_name": "{}", "token_ids": [1, 2"#, events::MODEL);
    assert_eq!(
        both(
            &guest,
            &mut native,
            "POST",
            "/query",
            unterminated.as_bytes()
        )
        .0,
        400
    );

    let trace = events::trace(&shape);
    assert!(
        trace
            .events
            .iter()
            .any(|e| matches!(e.data, EventData::Removed(_)))
    );
    let queries: Vec<Vec<u8>> = trace
        .prompts
        .iter()
        .map(|p| events::query_body(p))
        .collect();
    for (n, batch) in trace.events.chunks(shape.batch).enumerate() {
        let mut wit: Vec<_> = batch.iter().map(events::to_wit).collect();
        guest.on_batch(&mut wit).expect("every trace event applies");
        assert_eq!(native.ingest(batch), 0);
        if n % 2 == 0 {
            for body in &queries {
                assert_eq!(both(&guest, &mut native, "POST", "/query", body).0, 200);
            }
        }
    }
    let matched = queries
        .iter()
        .filter(|body| both(&guest, &mut native, "POST", "/query", body).1["scores"] != json!({}))
        .count();
    assert!(
        matched > queries.len() / 2,
        "most prompts match cached blocks"
    );
    let hashes: Vec<i64> = kvwasm_kv_indexer_core::hash::block_hashes(&trace.prompts[0], 16, None)
        .into_iter()
        .map(|h| h as i64)
        .collect();
    let by_hash = json!({"block_hashes": hashes, "model_name": events::MODEL}).to_string();
    let (_, answer) = both(
        &guest,
        &mut native,
        "POST",
        "/query_by_hash",
        by_hash.as_bytes(),
    );
    assert_ne!(answer["scores"], json!({}));
    both(&guest, &mut native, "GET", "/workers", b"");

    // The guest's dump restores into a native indexer that then answers
    // as both do.
    let dump = guest
        .handle(&Request {
            method: "GET".into(),
            path: "/dump".into(),
            query: String::new(),
            body: Vec::new(),
        })
        .unwrap();
    assert_eq!(dump.status, 200);
    let mut restored = Indexer::default();
    assert_eq!(restored.handle("POST", "/restore", "", &dump.body).0, 200);
    for body in &queries {
        assert_eq!(
            restored.handle("POST", "/query", "", body),
            native.handle("POST", "/query", "", body)
        );
    }
    assert_eq!(guest.generation(), 0, "the instance was never replaced");
}

#[test]
fn events_not_applied_are_the_batch_error() {
    let dir = tempfile::tempdir().unwrap();
    let guest = subscriber(&dir);
    let mut native = Indexer::default();
    let register = json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:5557",
        "model_name": "m", "block_size": 16})
    .to_string();
    assert_eq!(
        both(
            &guest,
            &mut native,
            "POST",
            "/register",
            register.as_bytes()
        )
        .0,
        201
    );
    let stored = |worker: u64| Event {
        worker_id: worker,
        dp_rank: 0,
        event_id: 0,
        model: None,
        tenant: None,
        data: EventData::Stored(Stored {
            block_hashes: vec![7],
            token_ids: (0..16).collect(),
            block_size: Some(16),
            ..Stored::default()
        }),
    };
    // Worker 2 is not registered and its event names no model.
    let batch = [stored(2), stored(1)];
    let mut wit: Vec<_> = batch.iter().map(events::to_wit).collect();
    match guest.on_batch(&mut wit) {
        Err(KvError::Other(message)) => assert!(message.contains("1 of 2 events"), "{message}"),
        other => panic!("expected the guest's error, got {other:?}"),
    }
    assert_eq!(native.ingest(&batch), 1);
    let query = json!({"token_ids": (0..16).collect::<Vec<u32>>(), "model_name": "m"}).to_string();
    let (_, answer) = both(&guest, &mut native, "POST", "/query", query.as_bytes());
    assert_eq!(
        answer["scores"],
        json!({"1": {"0": 16}}),
        "the rest of the batch applied"
    );
    assert_eq!(guest.generation(), 0, "an error is not a lost instance");
}

/// Token ids hashed by the host before delivery (`prehash_tokens`, the
/// default for this guest) and hashed by the guest itself build the same
/// index as the native core, for every shape of stored event: only those
/// the core would hash the same way are rewritten.
#[test]
fn prehashed_and_raw_token_ids_build_the_same_index() {
    let stored =
        |worker: u64, parent: Option<u64>, hashes: &[u64], tokens: std::ops::Range<u32>| Event {
            worker_id: worker,
            dp_rank: 0,
            event_id: 0,
            model: Some("m".into()),
            tenant: None,
            data: EventData::Stored(Stored {
                block_hashes: hashes.to_vec(),
                parent_hash: parent,
                token_ids: tokens.collect(),
                block_size: Some(16),
                ..Stored::default()
            }),
        };
    let with = |mut event: Event, change: &dyn Fn(&mut Stored)| {
        if let EventData::Stored(s) = &mut event.data {
            change(s);
        }
        event
    };
    let batch = [
        stored(1, None, &[1, 2], 0..32),
        // A partial tail after one full block: the tail is ignored.
        stored(1, Some(2), &[3], 32..53),
        // Less than a block: no local hash, so the block stays incomplete
        // (without tokens it would take its engine hash instead).
        stored(1, Some(3), &[4], 53..63),
        with(stored(2, None, &[11, 12], 0..32), &|s| {
            s.lora_name = Some("adapter".into())
        }),
        // No block size: the index's.
        with(stored(2, None, &[21], 100..116), &|s| s.block_size = None),
        // The publisher's own hashes win over token ids.
        with(stored(3, None, &[31], 0..16), &|s| {
            s.tokens_hashes = vec![999]
        }),
        // Another block size than the index's: dropped either way.
        with(stored(3, None, &[41, 42], 0..16), &|s| {
            s.block_size = Some(8)
        }),
        // A block size of 0 means "not known": the guest hashes with the
        // index's, the host leaves it alone.
        with(stored(4, None, &[51], 200..216), &|s| {
            s.block_size = Some(0)
        }),
        // No tokens and no local hashes: a storage event (engine hashes).
        stored(4, None, &[61, 62], 0..0),
        // More tokens than engine blocks: only the first block's are used.
        stored(5, None, &[71], 300..348),
    ];
    // Which events the host rewrites: token ids replaced by their hashes.
    let rewritten = [
        true, true, false, true, false, false, true, false, false, true,
    ];

    let queries = [
        json!({"token_ids": (0..64).collect::<Vec<u32>>(), "model_name": "m"}),
        json!({"token_ids": (100..116).collect::<Vec<u32>>(), "model_name": "m"}),
        json!({"token_ids": (0..32).collect::<Vec<u32>>(), "model_name": "m", "lora_name": "adapter"}),
        json!({"token_ids": (200..216).collect::<Vec<u32>>(), "model_name": "m"}),
        json!({"token_ids": (300..348).collect::<Vec<u32>>(), "model_name": "m"}),
    ];
    let mut dumps = Vec::new();
    for (prehash, extra) in [(true, ""), (false, "prehash_tokens = false\n")] {
        let dir = tempfile::tempdir().unwrap();
        let guest = subscriber_with(&dir, extra);
        let mut native = Indexer::default();
        for worker in 1..=5 {
            let register = json!({"instance_id": worker, "endpoint": "tcp://127.0.0.1:5557",
                "model_name": "m", "block_size": 16})
            .to_string();
            assert_eq!(
                both(
                    &guest,
                    &mut native,
                    "POST",
                    "/register",
                    register.as_bytes()
                )
                .0,
                201
            );
        }
        let mut wit: Vec<_> = batch.iter().map(events::to_wit).collect();
        let _ = guest.on_batch(&mut wit);
        native.ingest(&batch);
        for (event, rewritten) in wit.iter().zip(rewritten) {
            let kvwasm_host::subscriber::EventData::Stored(s) = &event.data else {
                unreachable!()
            };
            let hashed = s.token_ids.is_empty() && !s.tokens_hashes.is_empty();
            assert_eq!(hashed, prehash && rewritten, "{s:?}");
            assert!(s.tokens_hashes.len() <= s.block_hashes.len(), "{s:?}");
        }
        for query in &queries {
            assert_eq!(
                both(
                    &guest,
                    &mut native,
                    "POST",
                    "/query",
                    query.to_string().as_bytes()
                )
                .0,
                200
            );
        }
        let dump = guest.handle(&request("GET", "/dump")).unwrap();
        let guest_dump = dumped_blocks(&serde_json::from_slice(&dump.body).unwrap());
        let native_dump = native.handle("GET", "/dump", "", b"").1;
        assert_eq!(
            guest_dump,
            dumped_blocks(&serde_json::from_slice(&native_dump).unwrap())
        );
        dumps.push(guest_dump);
    }
    assert_eq!(dumps[0], dumps[1]);
    let blocks: Vec<u64> = dumps[0].iter().map(|b| b.2).collect();
    assert_eq!(
        blocks,
        [1, 2, 3, 11, 12, 21, 31, 51, 61, 62, 71],
        "the stored blocks"
    );
    assert!(
        dumps[0].contains(&(3, None, 31, 999)),
        "the publisher's hash: {:?}",
        dumps[0]
    );
}

fn request(method: &str, path: &str) -> Request {
    Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        body: Vec::new(),
    }
}

/// A `/dump`'s blocks as (worker, parent, block hash, tokens hash),
/// sorted: the order of a dump's events is the tree's, which is not
/// fixed.
fn dumped_blocks(dump: &Value) -> Vec<(u64, Option<u64>, u64, u64)> {
    let mut blocks: Vec<_> = dump["m:default"]["events"]
        .as_array()
        .expect("the index's events")
        .iter()
        .flat_map(|e| {
            let stored = &e["event"]["data"]["stored"];
            let worker = e["worker_id"].as_u64().unwrap();
            let parent = stored["parent_hash"].as_u64();
            stored["blocks"].as_array().unwrap().iter().map(move |b| {
                let hash = |key: &str| b[key].as_u64().unwrap();
                (worker, parent, hash("block_hash"), hash("tokens_hash"))
            })
        })
        .collect();
    blocks.sort_by_key(|b| b.2);
    blocks
}
