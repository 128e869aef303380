//! The indexer through its public API: ingest and the HTTP handlers.

use kvwasm_kv_indexer_core::{Event, EventData, Indexer, Stored, hash};
use proptest::prelude::*;
use serde_json::{Value, json};

fn call(indexer: &mut Indexer, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, bytes) = indexer.handle(method, path, "", body.to_string().as_bytes());
    let value = serde_json::from_slice(&bytes).expect("every answer is JSON");
    (status, value)
}

fn register(indexer: &mut Indexer, instance: u64, rank: u32, model: &str, block_size: u32) {
    let body = json!({"instance_id": instance, "dp_rank": rank, "endpoint": "tcp://127.0.0.1:5557",
        "model_name": model, "block_size": block_size});
    assert_eq!(call(indexer, "POST", "/register", &body).0, 201);
}

/// A store by `worker` of the blocks of `tokens` after `parent`; engine
/// hashes are `first_hash..`.
fn stored(worker: (u64, u32), parent: Option<u64>, first_hash: u64, tokens: &[u32]) -> Event {
    let blocks = tokens.len().div_ceil(16) as u64;
    Event {
        worker_id: worker.0,
        dp_rank: worker.1,
        event_id: 0,
        model: None,
        tenant: None,
        data: EventData::Stored(Stored {
            block_hashes: (first_hash..first_hash + blocks).collect(),
            parent_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: Some(16),
            ..Stored::default()
        }),
    }
}

/// Engine hashes as engines make them: a chain over the prefix, the same
/// for the same blocks on every worker.
fn chained_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut chain = 0u64;
    hash::block_hashes(tokens, 16, None)
        .into_iter()
        .map(|local| {
            chain = (chain ^ local).wrapping_mul(0x100_0000_01b3);
            chain
        })
        .collect()
}

/// A store of a whole prompt with chained engine hashes.
fn chained(worker: (u64, u32), tokens: &[u32]) -> Event {
    let mut event = stored(worker, None, 0, tokens);
    if let EventData::Stored(s) = &mut event.data {
        s.block_hashes = chained_hashes(tokens);
    }
    event
}

fn event(worker: (u64, u32), data: EventData) -> Event {
    Event {
        worker_id: worker.0,
        dp_rank: worker.1,
        event_id: 0,
        model: None,
        tenant: None,
        data,
    }
}

fn query(indexer: &mut Indexer, tokens: &[u32]) -> Value {
    let (status, body) = call(
        indexer,
        "POST",
        "/query",
        &json!({"token_ids": tokens, "model_name": "m"}),
    );
    assert_eq!(status, 200, "{body}");
    body
}

fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

/// Worker 1 holds blocks 0..4 of a prompt, worker 2 its first two blocks
/// then a branch: scores are matched blocks × block size.
#[test]
fn prefix_scores_per_worker_and_rank() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    register(&mut ix, 2, 3, "m", 16);
    let prompt = tokens(0..64);
    let mut branch = tokens(0..32);
    branch.extend(1000..1032);
    assert_eq!(
        ix.ingest(&[
            stored((1, 0), None, 100, &prompt),
            stored((2, 3), None, 100, &branch[..32]),
            stored((2, 3), Some(101), 200, &branch[32..]),
        ]),
        0
    );
    let answer = query(&mut ix, &prompt);
    assert_eq!(
        answer,
        json!({"scores": {"1": {"0": 64}, "2": {"3": 32}}, "frequencies": [],
               "tree_sizes": {"1": {"0": 4}, "2": {"3": 4}}})
    );
    // A prompt diverging in its first block matches nothing.
    assert_eq!(query(&mut ix, &tokens(5..69))["scores"], json!({}));
    // The tail of a prompt that is not a full block is not hashed.
    assert_eq!(query(&mut ix, &tokens(0..63))["scores"]["1"]["0"], 48);
}

#[test]
fn partial_blocks_are_not_stored() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    // Two engine hashes but one and a half blocks of tokens.
    ix.ingest(&[stored((1, 0), None, 100, &tokens(0..24))]);
    assert_eq!(ix.counters().blocks_stored, 1);
    assert_eq!(ix.counters().blocks_incomplete, 1);
    assert_eq!(query(&mut ix, &tokens(0..32))["scores"]["1"]["0"], 16);
}

/// The shim's `publish_events` stores: no tokens, block size 0. Their
/// engine hashes are their local hashes; nothing is dropped.
#[test]
fn storage_events_are_indexed_by_their_engine_hashes() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let storage = |hash: u64, size: Option<u32>| {
        event(
            (1, 0),
            EventData::Stored(Stored {
                block_hashes: vec![hash],
                block_size: size,
                ..Stored::default()
            }),
        )
    };
    let big = (-5i64) as u64;
    assert_eq!(
        ix.ingest(&[storage(7, Some(0)), storage(big, None), storage(9, Some(0))]),
        0
    );
    assert_eq!(ix.counters().blocks_stored, 3);
    assert_eq!(ix.counters().blocks_incomplete, 0);
    assert_eq!(ix.counters().blocks_wrong_size, 0);
    let mut by_hash = |hashes: Value| {
        call(
            &mut ix,
            "POST",
            "/query_by_hash",
            &json!({"block_hashes": hashes, "model_name": "m"}),
        )
    };
    for hashes in [json!([7]), json!([-5]), json!([9])] {
        let (status, answer) = by_hash(hashes);
        assert_eq!(status, 200);
        assert_eq!(
            answer,
            json!({"scores": {"1": {"0": 16}}, "frequencies": [],
                   "tree_sizes": {"1": {"0": 3}}})
        );
    }
    assert_eq!(by_hash(json!([8])).1["scores"], json!({}));
}

#[test]
fn blocks_of_another_size_are_dropped_and_counted() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let mut wrong = stored((1, 0), None, 100, &tokens(0..64));
    if let EventData::Stored(s) = &mut wrong.data {
        s.block_size = Some(32);
        s.block_hashes.truncate(2);
    }
    assert_eq!(ix.ingest(&[wrong]), 1);
    assert_eq!(ix.counters().blocks_wrong_size, 2);
    assert_eq!(query(&mut ix, &tokens(0..64))["scores"], json!({}));
}

#[test]
fn removals_by_engine_hash_shorten_the_match() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    register(&mut ix, 2, 0, "m", 16);
    let prompt = tokens(0..64);
    ix.ingest(&[
        stored((1, 0), None, 100, &prompt),
        stored((2, 0), None, 100, &prompt),
    ]);
    // Worker 1 evicts its last two blocks; worker 2 its second (the
    // blocks after it no longer count for it).
    assert_eq!(
        ix.ingest(&[
            event((1, 0), EventData::Removed(vec![103, 102])),
            event((2, 0), EventData::Removed(vec![101])),
        ]),
        0
    );
    let answer = query(&mut ix, &prompt);
    assert_eq!(answer["scores"], json!({"1": {"0": 32}, "2": {"0": 16}}));
    assert_eq!(answer["tree_sizes"], json!({"1": {"0": 2}, "2": {"0": 3}}));
    // Removing what the worker does not hold is counted, not fatal.
    assert_eq!(
        ix.ingest(&[event((1, 0), EventData::Removed(vec![103]))]),
        1
    );
    assert_eq!(ix.counters().block_not_found, 1);
    // A store after an unknown parent is dropped whole.
    assert_eq!(
        ix.ingest(&[stored((1, 0), Some(999), 300, &tokens(64..80))]),
        1
    );
    assert_eq!(ix.counters().parent_not_found, 1);
    // Everyone removes the first block: nothing matches any more.
    ix.ingest(&[
        event((1, 0), EventData::Removed(vec![100])),
        event((2, 0), EventData::Removed(vec![100])),
    ]);
    assert_eq!(query(&mut ix, &prompt)["scores"], json!({}));
    // Worker 1 stores the first two blocks again: its orphaned block 101
    // comes back under the new first block, with worker 2's 102 and 103
    // below it, which count again once worker 2 stores 100 and 101.
    ix.ingest(&[stored((1, 0), None, 100, &prompt[..32])]);
    assert_eq!(query(&mut ix, &prompt)["scores"], json!({"1": {"0": 32}}));
    ix.ingest(&[stored((2, 0), None, 100, &prompt[..32])]);
    assert_eq!(
        query(&mut ix, &prompt)["scores"],
        json!({"1": {"0": 32}, "2": {"0": 64}})
    );
}

#[test]
fn cleared_drops_every_rank_of_the_worker() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    register(&mut ix, 1, 1, "m", 16);
    register(&mut ix, 2, 0, "m", 16);
    let prompt = tokens(0..32);
    ix.ingest(&[
        stored((1, 0), None, 100, &prompt),
        stored((1, 1), None, 100, &prompt),
        stored((2, 0), None, 100, &prompt),
    ]);
    assert_eq!(ix.ingest(&[event((1, 0), EventData::Cleared)]), 0);
    assert_eq!(
        query(&mut ix, &prompt),
        json!({"scores": {"2": {"0": 32}}, "frequencies": [], "tree_sizes": {"2": {"0": 2}}})
    );
}

#[test]
fn events_go_to_their_model_and_tenant() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let body = json!({"instance_id": 2, "endpoint": "tcp://h:1", "model_name": "m",
        "routing_group": "t", "block_size": 16});
    assert_eq!(call(&mut ix, "POST", "/register", &body).0, 201);
    let prompt = tokens(0..32);
    // Worker 2 is registered under tenant t only; worker 3 is not
    // registered but its event names its (model, tenant).
    let mut named = stored((3, 0), None, 100, &prompt);
    named.model = Some("m".into());
    named.tenant = Some("t".into());
    ix.ingest(&[stored((2, 0), None, 100, &prompt), named]);
    assert_eq!(query(&mut ix, &prompt)["scores"], json!({}));
    let q = json!({"token_ids": prompt, "model_name": "m", "tenant_id": "t"});
    assert_eq!(
        call(&mut ix, "POST", "/query", &q).1["scores"],
        json!({"2": {"0": 32}, "3": {"0": 32}})
    );
    // Unregistered worker, no model: nowhere to go.
    assert_eq!(ix.ingest(&[stored((9, 0), None, 1, &prompt)]), 1);
    assert_eq!(ix.counters().unroutable, 1);
}

#[test]
fn lora_blocks_match_only_lora_queries() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let prompt = tokens(0..32);
    let mut event = stored((1, 0), None, 100, &prompt);
    if let EventData::Stored(s) = &mut event.data {
        s.lora_name = Some("adapter".into());
    }
    ix.ingest(&[event]);
    assert_eq!(query(&mut ix, &prompt)["scores"], json!({}));
    let q = json!({"token_ids": prompt, "model_name": "m", "lora_name": "adapter"});
    assert_eq!(
        call(&mut ix, "POST", "/query", &q).1["scores"]["1"]["0"],
        32
    );
}

#[test]
fn query_by_hash_takes_signed_hashes() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let prompt = tokens(0..32);
    ix.ingest(&[stored((1, 0), None, 100, &prompt)]);
    let signed: Vec<i64> = hash::block_hashes(&prompt, 16, None)
        .into_iter()
        .map(|h| h as i64)
        .collect();
    assert!(
        signed.iter().all(|h| *h < 0),
        "the vector's hashes are above i64::MAX"
    );
    let q = json!({"block_hashes": signed, "model_name": "m"});
    let (status, body) = call(&mut ix, "POST", "/query_by_hash", &q);
    assert_eq!((status, &body["scores"]), (200, &json!({"1": {"0": 32}})));
}

/// A dump's events per index, in a fixed order (a dump lists siblings in
/// no particular order) and without their ids.
fn dumped_blocks(dump: &Value) -> Vec<(String, u64, Vec<String>)> {
    let mut out = Vec::new();
    for (key, index) in dump.as_object().unwrap() {
        let mut events: Vec<String> = index["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                format!(
                    "{} {} {}",
                    e["worker_id"], e["event"]["dp_rank"], e["event"]["data"]
                )
            })
            .collect();
        events.sort();
        out.push((key.clone(), index["block_size"].as_u64().unwrap(), events));
    }
    out
}

#[test]
fn dump_then_restore_answers_the_same() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    register(&mut ix, 2, 1, "m", 16);
    let body = json!({"instance_id": 3, "endpoint": "ipc:///tmp/x", "model_name": "n",
        "tenant_id": "t", "block_size": 4});
    assert_eq!(call(&mut ix, "POST", "/register", &body).0, 201);
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|p| (0..(16 * (p + 2))).map(|t| t % (7 + p * 5)).collect())
        .collect();
    for (i, prompt) in prompts.iter().enumerate() {
        let worker = if i % 2 == 0 { (1, 0) } else { (2, 1) };
        ix.ingest(&[chained(worker, prompt)]);
    }
    // A leaf evicted (an inner one would leave orphans, which a dump does
    // not list, as in Dynamo).
    let leaf = *chained_hashes(&prompts[3]).last().unwrap();
    assert_eq!(
        ix.ingest(&[event((2, 1), EventData::Removed(vec![leaf]))]),
        0
    );
    let mut n = stored((3, 0), None, 7, &tokens(0..12));
    if let EventData::Stored(s) = &mut n.data {
        s.block_size = Some(4);
        s.block_hashes = vec![7, 8, 9];
    }
    ix.ingest(&[n]);

    let (status, dump) = call(&mut ix, "GET", "/dump", &json!(null));
    assert_eq!(status, 200);
    assert_eq!(dump["n:t"]["block_size"], 4);
    let first = &dump["n:t"]["events"][0];
    assert_eq!(first["worker_id"], 3);
    assert_eq!(first["event"]["data"]["stored"]["parent_hash"], Value::Null);
    assert_eq!(
        first["event"]["data"]["stored"]["blocks"][0]["block_hash"],
        7
    );

    let answers = |ix: &mut Indexer| -> Vec<Value> {
        let mut out: Vec<Value> = prompts.iter().map(|p| query(ix, p)).collect();
        let q = json!({"token_ids": tokens(0..12), "model_name": "n", "tenant_id": "t"});
        out.push(call(ix, "POST", "/query", &q).1);
        out
    };
    let before = answers(&mut ix);
    assert!(before.iter().all(|a| a["scores"] != json!({})));

    let mut fresh = Indexer::default();
    let (status, _) = call(&mut fresh, "POST", "/restore", &dump);
    assert_eq!(status, 200);
    assert_eq!(answers(&mut fresh), before);
    assert_eq!(
        dumped_blocks(&call(&mut fresh, "GET", "/dump", &json!(null)).1),
        dumped_blocks(&dump)
    );

    // Restoring into a live indexer replaces its trees but keeps its
    // registrations.
    ix.ingest(&[event((1, 0), EventData::Cleared)]);
    assert_eq!(call(&mut ix, "POST", "/restore", &dump).0, 200);
    assert_eq!(answers(&mut ix), before);
    assert_eq!(
        call(&mut ix, "GET", "/workers", &json!(null))
            .1
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn status_codes_and_error_bodies() {
    let mut ix = Indexer::default();
    let reg = |id: u64, rank: u32, endpoint: &str, size: u32| json!({"instance_id": id, "dp_rank": rank, "endpoint": endpoint, "model_name": "m", "block_size": size});
    let (status, body) = call(
        &mut ix,
        "POST",
        "/register",
        &reg(1, 0, "tcp://10.0.0.1:5557", 16),
    );
    assert_eq!((status, body), (201, json!({"status": "ok"})));
    let mut expect_error = |method: &str, path: &str, body: &Value, status: u16| {
        let (got, answer) = call(&mut ix, method, path, body);
        assert_eq!(got, status, "{method} {path} {body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    };
    // Duplicate (instance, rank), other block size: 409.
    expect_error(
        "POST",
        "/register",
        &reg(1, 0, "tcp://10.0.0.1:5558", 16),
        409,
    );
    expect_error(
        "POST",
        "/register",
        &reg(2, 0, "tcp://10.0.0.1:5558", 32),
        409,
    );
    // Bad endpoints: 400.
    for endpoint in [
        "",
        "10.0.0.1:5557",
        "tcp://10.0.0.1",
        "tcp://:1",
        "tcp://h:0",
        "tcp://h:x",
        "ipc://",
        "tcp://h:1\n",
    ] {
        expect_error("POST", "/register", &reg(2, 0, endpoint, 16), 400);
    }
    let mut bad_replay = reg(2, 0, "tcp://h:1", 16);
    bad_replay["replay_endpoint"] = json!("udp://h:2");
    expect_error("POST", "/register", &bad_replay, 400);
    expect_error("POST", "/register", &reg(2, 0, "tcp://h:1", 0), 400);
    // Malformed bodies: 400.
    expect_error("POST", "/register", &json!({"instance_id": 1}), 400);
    expect_error(
        "POST",
        "/query",
        &json!({"token_ids": [-1], "model_name": "m"}),
        400,
    );
    expect_error(
        "POST",
        "/restore",
        &json!({"no-colon": {"block_size": 16, "events": []}}),
        400,
    );
    // Unknown instance or rank: 404.
    expect_error(
        "POST",
        "/unregister",
        &json!({"instance_id": 9, "model_name": "m"}),
        404,
    );
    expect_error(
        "POST",
        "/unregister",
        &json!({"instance_id": 1, "model_name": "m", "dp_rank": 5}),
        404,
    );
    expect_error(
        "POST",
        "/unregister",
        &json!({"instance_id": 1, "model_name": "other"}),
        404,
    );
    // No index for (model, tenant): 404.
    expect_error(
        "POST",
        "/query",
        &json!({"token_ids": [], "model_name": "x"}),
        404,
    );
    expect_error(
        "POST",
        "/query",
        &json!({"token_ids": [], "model_name": "m", "tenant_id": "t"}),
        404,
    );
    expect_error(
        "POST",
        "/query_by_hash",
        &json!({"block_hashes": [], "model_name": "x"}),
        404,
    );
    // Routes and methods.
    expect_error("GET", "/nope", &json!(null), 404);
    expect_error("GET", "/query", &json!(null), 405);
    expect_error("POST", "/dump", &json!(null), 405);

    let (status, workers) = call(&mut ix, "GET", "/workers", &json!(null));
    assert_eq!(
        (status, workers),
        (
            200,
            json!([{"instance_id": 1, "endpoints": {"0": "tcp://10.0.0.1:5557"}}])
        )
    );
    let (status, body) = call(
        &mut ix,
        "POST",
        "/unregister",
        &json!({"instance_id": 1, "model_name": "m"}),
    );
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    assert_eq!(call(&mut ix, "GET", "/workers", &json!(null)).1, json!([]));
    // Registered again: the index (and its block size) outlived the worker.
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(1, 0, "tcp://h:1", 16)).0,
        201
    );
}

#[test]
fn unregister_removes_the_blocks_of_the_rank_or_instance() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    register(&mut ix, 1, 1, "m", 16);
    register(&mut ix, 2, 0, "m", 16);
    let prompt = tokens(0..32);
    for w in [(1, 0), (1, 1), (2, 0)] {
        ix.ingest(&[stored(w, None, 100, &prompt)]);
    }
    let q = |rank: Option<u32>| match rank {
        Some(r) => json!({"instance_id": 1, "model_name": "m", "dp_rank": r}),
        None => json!({"instance_id": 1, "model_name": "m"}),
    };
    assert_eq!(call(&mut ix, "POST", "/unregister", &q(Some(1))).0, 200);
    assert_eq!(
        query(&mut ix, &prompt)["scores"],
        json!({"1": {"0": 32}, "2": {"0": 32}})
    );
    assert_eq!(call(&mut ix, "POST", "/unregister", &q(None)).0, 200);
    assert_eq!(query(&mut ix, &prompt)["scores"], json!({"2": {"0": 32}}));
}

#[test]
fn oversized_token_lists_are_refused() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let too_many = vec![0u32; kvwasm_kv_indexer_core::MAX_TOKEN_IDS + 1];
    let (status, body) = call(
        &mut ix,
        "POST",
        "/query",
        &json!({"token_ids": too_many, "model_name": "m"}),
    );
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("more than"),
        "{body}"
    );
}

fn arb_event() -> impl Strategy<Value = Event> {
    let stored = (
        prop::collection::vec(0u64..16, 0..6),
        prop::option::of(0u64..16),
        prop::collection::vec(0u32..4, 0..80),
        prop::collection::vec(0u64..8, 0..3),
        prop::option::of(prop::sample::select(vec![0u32, 4, 16])),
        prop::option::of(prop::sample::select(vec!["a".to_string(), "b".into()])),
    )
        .prop_map(
            |(block_hashes, parent_hash, token_ids, tokens_hashes, block_size, lora_name)| {
                EventData::Stored(Stored {
                    block_hashes,
                    parent_hash,
                    token_ids,
                    tokens_hashes,
                    block_size,
                    lora_name,
                })
            },
        );
    let data = prop_oneof![
        4 => stored,
        2 => prop::collection::vec(0u64..16, 0..4).prop_map(EventData::Removed),
        1 => Just(EventData::Cleared),
    ];
    (
        0u64..3,
        0u32..2,
        prop::option::of(prop::sample::select(vec!["m".to_string(), "n".into()])),
        data,
    )
        .prop_map(|(worker_id, dp_rank, model, data)| Event {
            worker_id,
            dp_rank,
            event_id: 0,
            model,
            tenant: None,
            data,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary event streams (unknown parents, reused hashes, self
    /// references, clears) never panic, queries always answer, and a dump
    /// always restores.
    #[test]
    fn arbitrary_events_never_panic(events in prop::collection::vec(arb_event(), 0..60),
                                    prompt in prop::collection::vec(0u32..4, 0..80)) {
        let mut ix = Indexer::default();
        register(&mut ix, 0, 0, "m", 16);
        register(&mut ix, 1, 1, "m", 16);
        for chunk in events.chunks(7) {
            ix.ingest(chunk);
            prop_assert_eq!(query(&mut ix, &prompt)["frequencies"].clone(), json!([]));
        }
        let (status, dump) = call(&mut ix, "GET", "/dump", &json!(null));
        prop_assert_eq!(status, 200);
        let mut fresh = Indexer::default();
        prop_assert_eq!(call(&mut fresh, "POST", "/restore", &dump).0, 200);
        prop_assert_eq!(call(&mut fresh, "GET", "/dump", &json!(null)).0, 200);
    }
}
