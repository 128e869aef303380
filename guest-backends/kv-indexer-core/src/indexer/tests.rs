/// An indexer with the raw-JSON hasher (the guest's path) answers
/// every `/query` exactly as one that parses in place: valid bodies in
/// any field order, and each kind of error the fast path leaves to
/// the in-place path.
#[test]
fn token_json_hasher_answers_like_the_in_place_parser() {
    use crate::hash::{token_json_blocks, xxh3_blocks};
    use crate::{Event, EventData, Indexer, Stored};
    let mut plain = Indexer::default();
    let mut raw = Indexer::default().with_token_json_hasher(token_json_blocks);
    let tokens: Vec<u32> = (0..64).collect();
    let register =
        br#"{"instance_id": 7, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 16}"#;
    let stored = Event {
        worker_id: 7,
        dp_rank: 0,
        event_id: 1,
        model: None,
        tenant: None,
        data: EventData::Stored(Stored {
            block_hashes: vec![1, 2, 3],
            token_ids: tokens[..48].to_vec(),
            ..Stored::default()
        }),
    };
    for indexer in [&mut plain, &mut raw] {
        assert_eq!(indexer.handle("POST", "/register", "", register).0, 201);
        assert_eq!(indexer.ingest(std::slice::from_ref(&stored)), 0);
    }
    let too_long = format!(
        "{{\"model_name\": \"m\", \"token_ids\": {:?}}}",
        vec![1; crate::MAX_TOKEN_IDS + 1]
    );
    let bodies = [
        format!(r#"{{"model_name": "m", "token_ids": {tokens:?}}}"#),
        format!(
            r#"{{"token_ids": {:?} , "model_name": "m", "tenant_id": "default"}}"#,
            &tokens[..40]
        ),
        r#"{"token_ids": [1, 2, "]"], "model_name": "m"}"#.into(),
        r#"{"token_ids": [1, 2.5], "model_name": "m"}"#.into(),
        r#"{"token_ids": [1, 2], "model_name": "m", "token_ids": []}"#.into(),
        r#"{"token_ids": [1, 2, "model_name": "m"}"#.into(),
        r#"{"token_ids": [1, 2] "model_name": "m"}"#.into(),
        r#"{"token_ids": [1, 4294967296], "model_name": "other"}"#.into(),
        r#"{"token_ids": [1, 2], "model_name": "other"}"#.into(),
        r#"{"token_ids": [1, 2]"#.into(),
        too_long,
    ];
    for body in &bodies {
        let expected = plain.handle("POST", "/query", "", body.as_bytes());
        assert_eq!(
            raw.handle("POST", "/query", "", body.as_bytes()),
            expected,
            "{body:.80}"
        );
    }
    let scored = plain.handle("POST", "/query", "", bodies[0].as_bytes());
    assert_eq!(scored.0, 200);
    assert!(
        String::from_utf8(scored.1)
            .unwrap()
            .contains(r#"{"7":{"0":48}}"#)
    );
    assert_eq!(
        token_json_blocks(b" [0,1,2,3] ", 2, 9),
        Ok(xxh3_blocks(&[0, 1, 2, 3], 2, 9))
    );
    for bad in [&b"[1,2] x"[..], b"[1,-2]", b"", b"[1,2"] {
        assert!(token_json_blocks(bad, 2, 9).is_err());
    }
}

/// A worker fed over NATS has no ZMQ endpoint: it registers without
/// one, and its RouterEvents (no model, no block size) are placed by
/// that registration.
#[test]
fn a_worker_registers_without_an_endpoint_and_its_events_are_placed() {
    use crate::{Event, EventData, Indexer, Stored};
    let mut indexer = Indexer::default();
    let register = br#"{"instance_id": 7, "model_name": "m", "block_size": 16}"#;
    assert_eq!(indexer.handle("POST", "/register", "", register).0, 201);
    let (status, workers) = indexer.handle("GET", "/workers", "", b"");
    assert_eq!(status, 200);
    let workers: serde_json::Value = serde_json::from_slice(&workers).unwrap();
    assert_eq!(
        workers,
        serde_json::json!([{"instance_id": 7, "model_name": "m", "routing_group": "default",
            "block_size": 16, "endpoints": {"0": null}}])
    );
    let stored = Event {
        worker_id: 7,
        dp_rank: 0,
        event_id: 1,
        model: None,
        tenant: None,
        data: EventData::Stored(Stored {
            block_hashes: vec![100, 101],
            tokens_hashes: vec![15310707395893867146, 15292316782987903195],
            ..Stored::default()
        }),
    };
    assert_eq!(indexer.ingest(&[stored]), 0, "placed by the registration");
    let query = br#"{"token_ids": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31], "model_name": "m"}"#;
    let (status, answer) = indexer.handle("POST", "/query", "", query);
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        (status, &answer["scores"]),
        (200, &serde_json::json!({"7": {"0": 32}}))
    );
}

/// An indexer hashing each batch in one call (the guest's path)
/// applies a mixed batch exactly as one hashing event by event.
#[test]
fn runs_hasher_ingests_like_per_event_hashing() {
    use crate::hash::xxh3_runs;
    use crate::{Event, EventData, Indexer, Stored};
    let stored = |id: u64, parent, tokens: std::ops::Range<u32>, size, lora: Option<&str>| {
        let blocks = (tokens.len() / 4) as u64;
        Event {
            worker_id: 3,
            dp_rank: 0,
            event_id: id,
            model: Some("m".into()),
            tenant: None,
            data: EventData::Stored(Stored {
                block_hashes: (id * 100..id * 100 + blocks).collect(),
                parent_hash: parent,
                token_ids: tokens.collect(),
                block_size: size,
                lora_name: lora.map(Into::into),
                ..Stored::default()
            }),
        }
    };
    let mut by_hash = stored(6, Some(402), 0..0, Some(4), None);
    if let EventData::Stored(s) = &mut by_hash.data {
        s.block_hashes = vec![600, 601];
        s.tokens_hashes = vec![7, 8];
    }
    let batch = [
        stored(1, None, 0..18, Some(4), None),
        stored(2, Some(103), 18..30, None, None),
        stored(3, Some(103), 30..38, Some(8), None),
        stored(4, Some(202), 38..50, Some(4), Some("a")),
        stored(5, Some(999), 50..54, Some(4), None),
        by_hash,
        stored(7, Some(601), 54..62, Some(0), None),
    ];
    let mut plain = Indexer::default();
    let mut runs = Indexer::default().with_runs_hasher(|t, r| xxh3_runs(t, r).unwrap());
    assert_eq!(plain.ingest(&batch), 2);
    assert_eq!(runs.ingest(&batch), 2);
    assert_eq!(runs.counters(), plain.counters());
    assert_eq!(plain.counters().blocks_stored, 4 + 3 + 3 + 2 + 2);
    let dump = |indexer: &mut Indexer| indexer.handle("GET", "/dump", "", b"");
    assert_eq!(dump(&mut runs), dump(&mut plain));
    let query = br#"{"model_name": "m", "token_ids": [0,1,2,3,4,5,6,7]}"#;
    let answer = runs.handle("POST", "/query", "", query);
    assert_eq!(answer, plain.handle("POST", "/query", "", query));
    assert!(
        String::from_utf8(answer.1)
            .unwrap()
            .contains(r#""scores":{"3":{"0":8}}"#)
    );
}
