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
               "instances": {
                   "1": {"longest_matched": 64, "gpu": 64, "dp": {"0": 64}, "cpu": 64, "disk": 64},
                   "2": {"longest_matched": 32, "gpu": 32, "dp": {"3": 32}, "cpu": 32, "disk": 32}},
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
                   "instances": {"1": {"longest_matched": 16, "gpu": 16, "dp": {"0": 16},
                                       "cpu": 16, "disk": 16}},
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

/// The issue's example: ranks 0 and 1 of instance 11 each store two
/// blocks, rank 1 clears: rank 0 still holds its blocks, as in Dynamo
/// 1.6.1 (which keys everything by (instance, rank)). Replayed from a dump
/// that carries the clear, the same.
#[test]
fn cleared_drops_only_the_sending_rank() {
    let mut ix = Indexer::default();
    register(&mut ix, 11, 0, "m", 16);
    register(&mut ix, 11, 1, "m", 16);
    register(&mut ix, 2, 0, "m", 16);
    let prompt = tokens(0..32);
    ix.ingest(&[
        stored((11, 0), None, 100, &prompt),
        stored((11, 1), None, 100, &prompt),
        stored((2, 0), None, 100, &prompt),
    ]);
    assert_eq!(ix.ingest(&[event((11, 1), EventData::Cleared)]), 0);
    let answer = query(&mut ix, &prompt);
    assert_eq!(answer["scores"], json!({"11": {"0": 32}, "2": {"0": 32}}));
    assert_eq!(answer["instances"]["11"]["dp"], json!({"0": 32}));

    let hashes = hash::block_hashes(&prompt, 16, None);
    let store = |rank: u32| {
        json!({"worker_id": 11, "event": {"event_id": 0, "dp_rank": rank, "data": {"stored": {
            "parent_hash": null, "blocks": [{"block_hash": 100, "tokens_hash": hashes[0]}]}}}})
    };
    let clear = json!({"worker_id": 11, "event": {"event_id": 1, "dp_rank": 1, "data": "cleared"}});
    let dump = json!({"m:default": {"block_size": 16, "events": [store(0), store(1), clear]}});
    let mut restored = Indexer::default();
    assert_eq!(call(&mut restored, "POST", "/restore", &dump).0, 200);
    assert_eq!(
        query(&mut restored, &prompt)["scores"],
        json!({"11": {"0": 16}})
    );
}

/// Trees are per (model, routing group), as in Dynamo 1.6.1; an event
/// goes to its worker's registration, else to the (model, group) the
/// host attributed it to.
#[test]
fn events_go_to_their_model_and_routing_group() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let body = json!({"instance_id": 2, "endpoint": "tcp://h:1", "model_name": "m",
        "routing_group": "g", "block_size": 16});
    assert_eq!(call(&mut ix, "POST", "/register", &body).0, 201);
    let prompt = tokens(0..32);
    // Worker 2 is registered in group g only; worker 3 is not registered
    // but its event names its (model, group); worker 1's event names
    // another group, which its registration overrides.
    let mut named = stored((3, 0), None, 100, &prompt);
    named.model = Some("m".into());
    named.tenant = Some("g".into());
    let mut registered = stored((1, 0), None, 100, &prompt);
    registered.model = Some("m".into());
    registered.tenant = Some("g".into());
    ix.ingest(&[stored((2, 0), None, 100, &prompt), named, registered]);
    assert_eq!(query(&mut ix, &prompt)["scores"], json!({"1": {"0": 32}}));
    let q = json!({"token_ids": prompt, "model_name": "m", "routing_group": "g"});
    assert_eq!(
        call(&mut ix, "POST", "/query", &q).1["scores"],
        json!({"2": {"0": 32}, "3": {"0": 32}})
    );
    // Unregistered worker, no model: nowhere to go.
    assert_eq!(ix.ingest(&[stored((9, 0), None, 1, &prompt)]), 1);
    assert_eq!(ix.counters().unroutable, 1);
}

/// `tenant_id` is ignored by Dynamo 1.6.1: a query without it covers
/// every worker of the model, whatever tenant each registered with, and
/// a registration's tenant picks no tree (nor block size). kvwasm's
/// extension: a query that names a tenant gets only its workers.
#[test]
fn tenant_ids_filter_only_when_a_query_names_one() {
    let mut ix = Indexer::default();
    let reg = |id: u64, tenant: Option<&str>, size: u32| {
        let mut body = json!({"instance_id": id, "endpoint": "tcp://h:1", "model_name": "m",
            "block_size": size});
        if let Some(tenant) = tenant {
            body["tenant_id"] = json!(tenant);
        }
        body
    };
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(1, Some("a"), 16)).0,
        201
    );
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(2, Some("b"), 16)).0,
        201
    );
    assert_eq!(call(&mut ix, "POST", "/register", &reg(3, None, 16)).0, 201);
    // One tree for the model: another block size conflicts whatever the
    // tenant.
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(4, Some("c"), 32)).0,
        409
    );
    let prompt = tokens(0..32);
    ix.ingest(&[
        stored((1, 0), None, 100, &prompt),
        stored((2, 0), None, 100, &prompt),
        stored((3, 0), None, 100, &prompt),
        stored((1, 4), None, 100, &prompt),
    ]);
    assert_eq!(
        query(&mut ix, &prompt)["scores"],
        json!({"1": {"0": 32, "4": 32}, "2": {"0": 32}, "3": {"0": 32}})
    );
    let only = |ix: &mut Indexer, tenant: &str| {
        let q = json!({"token_ids": prompt, "model_name": "m", "tenant_id": tenant});
        let answer = call(ix, "POST", "/query", &q).1;
        let q = json!({"block_hashes": hash::block_hashes(&prompt, 16, None)
            .iter().map(|h| *h as i64).collect::<Vec<_>>(), "model_name": "m", "tenant_id": tenant});
        assert_eq!(call(ix, "POST", "/query_by_hash", &q).1, answer);
        (
            answer["scores"].clone(),
            answer["instances"].as_object().unwrap().len(),
        )
    };
    assert_eq!(only(&mut ix, "a"), (json!({"1": {"0": 32, "4": 32}}), 1));
    assert_eq!(only(&mut ix, "default"), (json!({"3": {"0": 32}}), 1));
    assert_eq!(only(&mut ix, "z"), (json!({}), 0));
    // A tenant narrows an unregistration too; the dump's key is the group.
    let unreg = json!({"instance_id": 1, "model_name": "m", "tenant_id": "b"});
    assert_eq!(call(&mut ix, "POST", "/unregister", &unreg).0, 404);
    let dump = call(&mut ix, "GET", "/dump", &json!(null)).1;
    assert_eq!(
        dump.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["m:default"]
    );
}

/// An instance belongs to one (model, routing group) and a group's tree
/// has one block size; the last registration of a group takes its tree
/// with it (`/query` answers 404 again), as in Dynamo 1.6.1.
#[test]
fn registrations_bind_an_instance_and_a_block_size_to_a_group() {
    let mut ix = Indexer::default();
    let reg = |id: u64, rank: u32, model: &str, group: &str, size: u32| {
        json!({"instance_id": id, "dp_rank": rank, "endpoint": "tcp://h:1", "model_name": model,
            "routing_group": group, "block_size": size})
    };
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(1, 0, "m", "g", 16)).0,
        201
    );
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(1, 1, "m", "h", 16)).0,
        409
    );
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(1, 1, "n", "g", 16)).0,
        409
    );
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(1, 1, "m", "g", 16)).0,
        201
    );
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(2, 0, "m", "h", 32)).0,
        201
    );
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(3, 0, "m", "g", 32)).0,
        409
    );
    let unreg = |group: Option<&str>| match group {
        Some(g) => json!({"instance_id": 1, "model_name": "m", "routing_group": g}),
        None => json!({"instance_id": 1, "model_name": "m"}),
    };
    assert_eq!(
        call(&mut ix, "POST", "/unregister", &unreg(Some("h"))).0,
        404
    );
    let q = json!({"token_ids": [1], "model_name": "m", "routing_group": "g"});
    assert_eq!(call(&mut ix, "POST", "/query", &q).0, 200);
    assert_eq!(call(&mut ix, "POST", "/unregister", &unreg(None)).0, 200);
    assert_eq!(call(&mut ix, "POST", "/query", &q).0, 404);
    // The tree is gone: another block size is welcome.
    assert_eq!(
        call(&mut ix, "POST", "/register", &reg(3, 0, "m", "g", 32)).0,
        201
    );
}

/// `"lora_name": ""` is no adapter, as in Dynamo: in a query, in an
/// event, and in kvwasm's per-registration default adapter.
#[test]
fn an_empty_lora_name_is_no_adapter() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let body = json!({"instance_id": 2, "endpoint": "tcp://h:1", "model_name": "n",
        "block_size": 16, "lora_name": ""});
    assert_eq!(call(&mut ix, "POST", "/register", &body).0, 201);
    let prompt = tokens(0..32);
    let mut empty = stored((1, 0), None, 100, &prompt);
    if let EventData::Stored(s) = &mut empty.data {
        s.lora_name = Some(String::new());
    }
    ix.ingest(&[empty, stored((2, 0), None, 100, &prompt)]);
    for (model, worker) in [("m", "1"), ("n", "2")] {
        for lora in [json!(""), json!(null)] {
            let q = json!({"token_ids": prompt, "model_name": model, "lora_name": lora});
            let scores = &call(&mut ix, "POST", "/query", &q).1["scores"];
            assert_eq!(scores[worker]["0"], 32, "{model} {lora}");
        }
    }
}

/// A worker whose engine hashes the same content differently from
/// another's (vLLM's xxhash option, an unset PYTHONHASHSEED) keeps its own
/// engine hashes in the dump, so a replica restored from it applies that
/// worker's later removals (Dynamo 1.6.1 dumps the first worker's).
#[test]
fn dumps_keep_each_workers_own_engine_hashes() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    register(&mut ix, 2, 0, "m", 16);
    let prompt = tokens(0..48);
    ix.ingest(&[
        stored((1, 0), None, 100, &prompt),
        stored((2, 0), None, 200, &prompt[..32]),
        stored((2, 0), Some(201), 202, &prompt[32..]),
    ]);
    let dump = call(&mut ix, "GET", "/dump", &json!(null)).1;
    let mut own: Vec<(u64, Value, u64)> = dump["m:default"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let stored = &e["event"]["data"]["stored"];
            let worker = e["worker_id"].as_u64().unwrap();
            let block = stored["blocks"][0]["block_hash"].as_u64().unwrap();
            (worker, stored["parent_hash"].clone(), block)
        })
        .collect();
    own.sort_by_key(|(w, _, b)| (*w, *b));
    assert_eq!(
        own,
        [
            (1, Value::Null, 100),
            (1, json!(100), 101),
            (1, json!(101), 102),
            (2, Value::Null, 200),
            (2, json!(200), 201),
            (2, json!(201), 202),
        ]
    );
    let mut restored = Indexer::default();
    register(&mut restored, 1, 0, "m", 16);
    register(&mut restored, 2, 0, "m", 16);
    assert_eq!(call(&mut restored, "POST", "/restore", &dump).0, 200);
    let removal = [event((2, 0), EventData::Removed(vec![201]))];
    for indexer in [&mut ix, &mut restored] {
        assert_eq!(indexer.ingest(&removal), 0);
        assert_eq!(
            query(indexer, &prompt)["scores"],
            json!({"1": {"0": 48}, "2": {"0": 16}})
        );
    }
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
        "routing_group": "t", "block_size": 4});
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
    // Every field of Dynamo 1.6.1's RouterEvent.
    assert_eq!(first["storage_tier"], "device");
    assert_eq!(
        first["event"]["data"]["stored"]["start_position"],
        Value::Null
    );
    assert_eq!(
        first["event"]["data"]["stored"]["blocks"][0],
        json!({"block_hash": 7, "tokens_hash": first["event"]["data"]["stored"]["blocks"][0]["tokens_hash"], "mm_extra_info": null})
    );
    assert_eq!(first["event"]["data"]["stored"]["parent_hash"], Value::Null);
    assert_eq!(
        first["event"]["data"]["stored"]["blocks"][0]["block_hash"],
        7
    );

    let answers = |ix: &mut Indexer| -> Vec<Value> {
        let mut out: Vec<Value> = prompts.iter().map(|p| query(ix, p)).collect();
        let q = json!({"token_ids": tokens(0..12), "model_name": "n", "routing_group": "t"});
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
    // JSON of the wrong shape: 422.
    expect_error("POST", "/register", &json!({"instance_id": 1}), 422);
    let mut negative = reg(2, 0, "tcp://h:1", 16);
    negative["block_size"] = json!(-1);
    expect_error("POST", "/register", &negative, 422);
    for query in [
        json!({"token_ids": [-1], "model_name": "m"}),
        json!({"token_ids": [4294967296u64], "model_name": "m"}),
        json!({"token_ids": [1]}),
        json!({"token_ids": "1", "model_name": "m"}),
        json!({"token_ids": [1], "model_name": "m", "tenant_id": null}),
        json!([[1], "m"]),
    ] {
        expect_error("POST", "/query", &query, 422);
    }
    expect_error(
        "POST",
        "/query_by_hash",
        &json!({"block_hashes": [18446744073709551615u64], "model_name": "m"}),
        422,
    );
    expect_error(
        "POST",
        "/unregister",
        &json!({"instance_id": -1, "model_name": "m"}),
        422,
    );
    // A salt with precomputed hashes: 400, as in Dynamo.
    expect_error(
        "POST",
        "/query_by_hash",
        &json!({"block_hashes": [], "model_name": "m", "cache_salt": "s"}),
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
    // No index for (model, routing group): 404.
    expect_error(
        "POST",
        "/query",
        &json!({"token_ids": [], "model_name": "x"}),
        404,
    );
    expect_error(
        "POST",
        "/query",
        &json!({"token_ids": [], "model_name": "m", "routing_group": "t"}),
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
            json!([{"instance_id": 1, "model_name": "m", "routing_group": "default",
                    "block_size": 16, "endpoints": {"0": "tcp://10.0.0.1:5557"}}])
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

    // Bodies that are not JSON: 400, on every route that reads one.
    register(&mut ix, 1, 0, "m", 16);
    for path in [
        "/register",
        "/unregister",
        "/query",
        "/query_by_hash",
        "/restore",
    ] {
        for body in [
            &b""[..],
            b"{",
            b"not json",
            br#"{"token_ids": [1,], "model_name": "m"}"#,
            br#"{"mo"#,
        ] {
            let (status, answer) = ix.handle("POST", path, "", body);
            assert_eq!(status, 400, "{path} {}", String::from_utf8_lossy(body));
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            assert!(answer["error"].is_string());
        }
    }
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
fn oversized_token_lists_are_refused_as_the_wrong_shape() {
    let mut ix = Indexer::default();
    register(&mut ix, 1, 0, "m", 16);
    let too_many = vec![0u32; kvwasm_kv_indexer_core::MAX_TOKEN_IDS + 1];
    let (status, body) = call(
        &mut ix,
        "POST",
        "/query",
        &json!({"token_ids": too_many, "model_name": "m"}),
    );
    assert_eq!(status, 422);
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

/// Dynamo 1.6.1's `QueryRequest` as its axum handler reads it: the
/// reference for which `/query` bodies answer 400, 422 or a score.
#[derive(serde::Deserialize)]
struct DynamoQuery {
    #[serde(rename = "token_ids")]
    _token_ids: Vec<u32>,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    #[serde(default = "default_group", rename = "tenant_id")]
    _tenant_id: String,
    #[serde(rename = "lora_name")]
    _lora_name: Option<String>,
    #[serde(rename = "cache_salt")]
    _cache_salt: Option<String>,
}

fn default_group() -> String {
    "default".into()
}

/// The status Dynamo answers `body` with, given one tree, (m, default):
/// axum's `Json` rejects by serde_json's classification (data: 422,
/// syntax or end of input: 400), then 404 without a tree.
fn dynamo_status(body: &[u8]) -> u16 {
    match serde_json::from_slice::<DynamoQuery>(body) {
        Ok(q) if q.model_name == "m" && q.routing_group == "default" => 200,
        Ok(_) => 404,
        Err(e) => match e.classify() {
            serde_json::error::Category::Data => 422,
            _ => 400,
        },
    }
}

/// A `/query` body: fields (any, in any order, maybe twice) with valid
/// and invalid values, other top-level values, then maybe cut short or
/// followed by garbage.
fn arb_query_body() -> impl Strategy<Value = Vec<u8>> {
    let value = |pool: &[&'static str]| prop::sample::select(pool.to_vec());
    let field = prop_oneof![
        value(&[
            "[1,2,3]",
            "[ ]",
            "[-1]",
            "[-0]",
            "[1.5]",
            "[1e2]",
            "[4294967296]",
            "[01]",
            "[1,]",
            "\"1\"",
            "null",
            "{}",
            "[ 0 , 4294967295 ]",
            "[1 2]"
        ])
        .prop_map(|v| ("token_ids", v)),
        value(&[
            "\"m\"",
            "\"x\"",
            "5",
            "null",
            "\"m\\u0000\"",
            "\"\\ud800\"",
            "\"m"
        ])
        .prop_map(|v| ("model_name", v)),
        value(&["\"default\"", "\"g\"", "null", "1"]).prop_map(|v| ("routing_group", v)),
        value(&["\"t\"", "null", "[]"]).prop_map(|v| ("tenant_id", v)),
        value(&["\"a\"", "\"\"", "null", "2"]).prop_map(|v| ("lora_name", v)),
        value(&["\"s\"", "null", "{}"]).prop_map(|v| ("cache_salt", v)),
        value(&["{\"a\": [1, \"]\"]}", "nul", "[]"]).prop_map(|v| ("other", v)),
    ];
    let object = prop::collection::vec(field, 0..6).prop_map(|fields| {
        let fields: Vec<String> = fields
            .into_iter()
            .map(|(key, value)| format!("\"{key}\": {value}"))
            .collect();
        format!("{{{}}}", fields.join(", "))
    });
    let body = prop_oneof![
        6 => object,
        1 => value(&["[]", "5", "\"s\"", "null", "[[1], \"m\"]", "", " "]).prop_map(String::from),
    ];
    (
        body,
        prop::option::of(any::<prop::sample::Index>()),
        value(&["", "", " ", "x", "}", ","]),
    )
        .prop_map(|(body, cut, tail)| {
            let mut bytes = body.into_bytes();
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            bytes.extend_from_slice(tail.as_bytes());
            bytes
        })
}

/// Any (worker, rank) of instance `i` in 0..3, ranks 0..2.
fn arb_worker() -> impl Strategy<Value = (u64, u32)> {
    (0u64..3, 0u32..2)
}

/// Prompts of 1 to 4 blocks from a small alphabet of blocks, so workers
/// share prefixes and branch.
fn arb_prompt() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 1..5).prop_map(|blocks| {
        blocks
            .iter()
            .flat_map(|b| (0..16).map(move |t| b * 100 + t))
            .collect()
    })
}

/// A worker's engine hash of each block of `prompt`: chained over the
/// prefix, salted per instance when `own_hashes` (engines hashing the same
/// content differently), else the same on every worker.
fn engine_hashes(instance: u64, prompt: &[u32], own_hashes: bool) -> Vec<u64> {
    let salt = if own_hashes {
        instance.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    } else {
        0
    };
    let mut chain = salt;
    hash::block_hashes(prompt, 16, None)
        .into_iter()
        .map(|local| {
            chain = (chain ^ local).wrapping_mul(0x100_0000_01b3) | 1;
            chain
        })
        .collect()
}

/// What a stream does, as an engine would publish it: blocks `from..to`
/// of a prompt stored after the block before them, or one removed.
#[derive(Debug, Clone)]
enum Step {
    Store((u64, u32), Vec<u32>, usize),
    Remove((u64, u32), Vec<u32>, usize),
    Clear((u64, u32)),
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (arb_worker(), arb_prompt(), 0usize..4).prop_map(|(w, p, from)| Step::Store(w, p, from)),
        2 => (arb_worker(), arb_prompt(), 0usize..4).prop_map(|(w, p, at)| Step::Remove(w, p, at)),
        1 => arb_worker().prop_map(Step::Clear),
    ]
}

fn step_event(step: &Step, own_hashes: bool) -> Event {
    match step {
        Step::Store(w, prompt, from) => {
            let hashes = engine_hashes(w.0, prompt, own_hashes);
            let from = (*from).min(hashes.len() - 1);
            let mut e = stored(
                *w,
                from.checked_sub(1).map(|p| hashes[p]),
                0,
                &prompt[from * 16..],
            );
            if let EventData::Stored(s) = &mut e.data {
                s.block_hashes = hashes[from..].to_vec();
            }
            e
        }
        Step::Remove(w, prompt, at) => {
            let hashes = engine_hashes(w.0, prompt, own_hashes);
            event(
                *w,
                EventData::Removed(vec![hashes[(*at).min(hashes.len() - 1)]]),
            )
        }
        Step::Clear(w) => event(*w, EventData::Cleared),
    }
}

fn scores_of(ix: &mut Indexer, prompts: &[Vec<u32>]) -> Vec<Value> {
    prompts
        .iter()
        .map(|p| query(ix, p)["scores"].clone())
        .collect()
}

fn registered() -> Indexer {
    let mut ix = Indexer::default();
    for instance in 0..3 {
        for rank in 0..2 {
            register(&mut ix, instance, rank, "m", 16);
        }
    }
    ix
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The fast in-place `/query` parser (and the guest's raw-JSON path)
    /// answers every body with Dynamo's status: serde_json's own
    /// classification of it against Dynamo's request type.
    #[test]
    fn query_statuses_follow_serdes_classification(body in arb_query_body()) {
        let mut plain = Indexer::default();
        let mut raw = Indexer::default().with_token_json_hasher(hash::token_json_blocks);
        for ix in [&mut plain, &mut raw] {
            register(ix, 1, 0, "m", 1);
            ix.ingest(&[stored((1, 0), None, 7, &[1])]);
        }
        let answer = plain.handle("POST", "/query", "", &body);
        prop_assert_eq!(answer.0, dynamo_status(&body), "{}", String::from_utf8_lossy(&body));
        prop_assert_eq!(raw.handle("POST", "/query", "", &body), answer);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A clear from one (instance, rank) leaves every other worker's
    /// scores as they were: no other rank of its instance loses a block.
    #[test]
    fn a_clear_takes_only_its_own_rank(steps in prop::collection::vec(arb_step(), 0..40),
                                       cleared in arb_worker(),
                                       prompts in prop::collection::vec(arb_prompt(), 1..6)) {
        let mut ix = registered();
        for step in &steps {
            ix.ingest(&[step_event(step, false)]);
        }
        let before = scores_of(&mut ix, &prompts);
        ix.ingest(&[event(cleared, EventData::Cleared)]);
        let (id, rank) = (cleared.0.to_string(), cleared.1.to_string());
        let expected: Vec<Value> = before
            .into_iter()
            .map(|mut scores| {
                let map = scores.as_object_mut().unwrap();
                if let Some(ranks) = map.get_mut(&id) {
                    ranks.as_object_mut().unwrap().remove(&rank);
                    if ranks.as_object().unwrap().is_empty() {
                        map.remove(&id);
                    }
                }
                scores
            })
            .collect();
        prop_assert_eq!(scores_of(&mut ix, &prompts), expected);
    }

    /// A replica restored from a dump answers as the live indexer, and
    /// still does after both apply the same later removals (of blocks the
    /// stream stored) and clears, also when every instance's engine hashes
    /// the same content its own way.
    #[test]
    fn a_restored_replica_follows_later_removals(
        steps in prop::collection::vec(arb_step(), 1..40),
        later in prop::collection::vec((any::<prop::sample::Index>(), 0usize..4, 0u8..8), 1..20),
        own_hashes in any::<bool>(),
        prompts in prop::collection::vec(arb_prompt(), 0..4),
    ) {
        let mut live = registered();
        for step in &steps {
            live.ingest(&[step_event(step, own_hashes)]);
        }
        let dump = call(&mut live, "GET", "/dump", &json!(null)).1;
        let mut restored = registered();
        prop_assert_eq!(call(&mut restored, "POST", "/restore", &dump).0, 200);
        let mut prompts = prompts;
        prompts.extend(steps.iter().filter_map(|s| match s {
            Step::Store(_, prompt, _) => Some(prompt.clone()),
            _ => None,
        }));
        prop_assert_eq!(scores_of(&mut restored, &prompts), scores_of(&mut live, &prompts));
        for (pick, at, clear) in later {
            let step = match &steps[pick.index(steps.len())] {
                Step::Store(w, _, _) | Step::Remove(w, _, _) | Step::Clear(w) if clear == 0 => {
                    Step::Clear(*w)
                }
                Step::Store(w, prompt, _) | Step::Remove(w, prompt, _) => {
                    Step::Remove(*w, prompt.clone(), at)
                }
                Step::Clear(w) => Step::Clear(*w),
            };
            live.ingest(&[step_event(&step, own_hashes)]);
            restored.ingest(&[step_event(&step, own_hashes)]);
            prop_assert_eq!(scores_of(&mut restored, &prompts), scores_of(&mut live, &prompts));
        }
    }
}
