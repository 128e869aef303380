//! vLLM and SGLang event batches (msgpack), as their ZMQ publishers send
//! them (docs/events.md, "Formats accepted"), read by
//! `kvwasm_indexer_protocol::vllm` (which `publish_events` writes with).

use kvwasm_indexer_protocol::vllm;

use crate::{BlocksRemoved, BlocksStored, DecodeError, Event, EventData, SourceKind, ZmqWorker};

/// Decode one ZMQ payload: a batch `[ts, events, data_parallel_rank?]`
/// (SGLang: `[ts, events]`), events as tagged maps (vLLM ≥ 0.33) or tagged
/// arrays (older vLLM, SGLang). Every event is attributed to `worker`
/// (its rank replaced by the batch's own, when present) and carries `seq`
/// as its event id. Unknown event types, fields and keys are ignored;
/// anything else malformed fails the whole batch.
pub fn decode_zmq_batch(
    payload: &[u8],
    worker: &ZmqWorker,
    seq: u64,
) -> Result<Vec<Event>, DecodeError> {
    let batch = vllm::decode(payload).map_err(DecodeError)?;
    let dp_rank = batch.data_parallel_rank.unwrap_or(worker.dp_rank);
    let events = batch.events.into_iter().map(|event| Event {
        worker_id: worker.instance_id,
        dp_rank,
        event_id: seq,
        source: SourceKind::Zmq,
        model: Some(worker.model.clone()),
        tenant: Some(worker.tenant.clone()),
        data: event_data(event),
    });
    Ok(events.collect())
}

/// A vLLM event as the WIT's event data; a medium names the tier.
fn event_data(event: vllm::Event) -> EventData {
    match event {
        vllm::Event::BlockStored(s) => EventData::Stored(BlocksStored {
            block_hashes: s.block_hashes,
            parent_hash: s.parent_block_hash,
            token_ids: s.token_ids,
            tokens_hashes: Vec::new(),
            block_size: s.block_size,
            lora_name: s.lora_name,
            tier: tier(s.medium.as_deref()),
        }),
        vllm::Event::BlockRemoved(r) => EventData::Removed(BlocksRemoved {
            block_hashes: r.block_hashes,
            tier: tier(r.medium.as_deref()),
        }),
        vllm::Event::AllBlocksCleared => EventData::Cleared,
    }
}

/// `medium` as a tier; a medium that is not a known name says nothing.
fn tier(medium: Option<&str>) -> Option<crate::Tier> {
    medium.and_then(crate::tier_of_medium)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tier;
    use rmpv::Value;

    fn worker() -> ZmqWorker {
        ZmqWorker {
            instance_id: 7,
            dp_rank: 2,
            endpoint: "tcp://127.0.0.1:1".into(),
            replay_endpoint: None,
            model: "m".into(),
            tenant: "t".into(),
        }
    }

    fn encode(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    fn map(pairs: &[(&str, Value)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    fn ints(values: &[u64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::from(v)).collect())
    }

    fn stored(event: &Event) -> &BlocksStored {
        match &event.data {
            EventData::Stored(s) => s,
            other => panic!("not stored: {other:?}"),
        }
    }

    #[test]
    fn vllm_tagged_maps_with_rank_and_extras() {
        let payload = encode(&Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                map(&[
                    ("type", "BlockStored".into()),
                    (
                        "block_hashes",
                        Value::Array(vec![Value::from(-1i64), 5.into()]),
                    ),
                    ("parent_block_hash", 9.into()),
                    ("token_ids", ints(&[1, 2, 3, 4])),
                    ("block_size", 2.into()),
                    ("lora_id", Value::Nil),
                    ("medium", "CPU".into()),
                    ("lora_name", "ad".into()),
                    ("extra_keys", ints(&[1])),
                ]),
                map(&[
                    ("type", "BlockRemoved".into()),
                    ("block_hashes", ints(&[5])),
                    ("medium", "GPU".into()),
                ]),
                map(&[("type", "SomethingNew".into())]),
                map(&[("type", "AllBlocksCleared".into())]),
            ]),
            3.into(),
            "trailing".into(),
        ]));
        let events = decode_zmq_batch(&payload, &worker(), 11).unwrap();
        assert_eq!(events.len(), 3, "{events:?}");
        for e in &events {
            assert_eq!((e.worker_id, e.dp_rank, e.event_id), (7, 3, 11));
            assert_eq!(
                (e.model.as_deref(), e.tenant.as_deref()),
                (Some("m"), Some("t"))
            );
            assert!(matches!(e.source, SourceKind::Zmq));
        }
        let s = stored(&events[0]);
        assert_eq!(s.block_hashes, [u64::MAX, 5]);
        assert_eq!(s.parent_hash, Some(9));
        assert_eq!(s.token_ids, [1, 2, 3, 4]);
        assert_eq!(s.block_size, Some(2));
        assert_eq!(s.lora_name.as_deref(), Some("ad"));
        assert_eq!(s.tier, Some(Tier::Host));
        match &events[1].data {
            EventData::Removed(r) => {
                assert_eq!(r.block_hashes, [5]);
                assert_eq!(r.tier, Some(Tier::Device));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(events[2].data, EventData::Cleared));
    }

    #[test]
    fn tagged_arrays_sglang_batches_and_byte_hashes() {
        let mut digest = vec![0xAB; 24];
        digest.extend(0x0102_0304_0506_0708u64.to_be_bytes());
        let payload = encode(&Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![Value::Binary(digest)]),
                    Value::Nil,
                    ints(&[10, 11]),
                    2.into(),
                    Value::Nil,
                ]),
                Value::Array(vec![
                    "BlockRemoved".into(),
                    ints(&[1]),
                    "DISK".into(),
                    0.into(),
                ]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
        ]));
        let events = decode_zmq_batch(&payload, &worker(), 0).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].dp_rank, 2, "no rank in the batch: the worker's");
        let s = stored(&events[0]);
        assert_eq!(s.block_hashes, [0x0102_0304_0506_0708]);
        assert_eq!(
            (s.parent_hash, s.tier, s.lora_name.clone()),
            (None, None, None)
        );
        match &events[1].data {
            EventData::Removed(r) => assert_eq!(r.tier, Some(Tier::Disk)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_batches_are_errors() {
        let event = |e: Value| encode(&Value::Array(vec![Value::F64(0.0), Value::Array(vec![e])]));
        for (payload, why) in [
            (vec![], "not a msgpack batch"),
            (vec![0x92, 0xcb, 0], "not a msgpack batch"),
            (encode(&"x".into()), "a batch is an array"),
            (encode(&Value::Array(vec![Value::F64(0.0)])), "second field"),
            (event(7.into()), "tagged map or array"),
            (event(map(&[("block_hashes", ints(&[1]))])), "no type tag"),
            (
                event(map(&[("type", "BlockStored".into())])),
                "block_hashes is missing",
            ),
            (
                event(map(&[
                    ("type", "BlockStored".into()),
                    ("block_hashes", ints(&[1])),
                    ("token_ids", ints(&[1 << 40])),
                ])),
                "token_ids",
            ),
            (
                event(map(&[
                    ("type", "BlockRemoved".into()),
                    ("block_hashes", "x".into()),
                ])),
                "must be an array",
            ),
        ] {
            let err = decode_zmq_batch(&payload, &worker(), 0).unwrap_err();
            assert!(err.0.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut payload = vec![0x91; 100_000];
        payload.push(0xc0);
        assert!(decode_zmq_batch(&payload, &worker(), 0).is_err());
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode_zmq_batch(&bytes, &worker(), 0);
        }

        #[test]
        fn mutated_batches_never_panic(
            flips in proptest::collection::vec((0usize..256, proptest::num::u8::ANY), 1..8),
        ) {
            let mut payload = encode(&Value::Array(vec![
                Value::F64(1.0),
                Value::Array(vec![map(&[
                    ("type", "BlockStored".into()),
                    ("block_hashes", ints(&[1, 2])),
                    ("parent_block_hash", Value::Nil),
                    ("token_ids", ints(&[1, 2, 3, 4])),
                    ("block_size", 2.into()),
                    ("medium", "GPU".into()),
                ])]),
                1.into(),
            ]));
            for (at, byte) in flips {
                let at = at % payload.len();
                payload[at] = byte;
            }
            let _ = decode_zmq_batch(&payload, &worker(), 0);
        }
    }
}
