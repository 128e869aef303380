//! Dynamo's RouterEvent and KVBM's event batches (JSON), as they arrive on
//! NATS (docs/events.md, "Formats accepted").

use kvwasm_indexer_protocol::dump::{KvCacheEventData, RouterEvent, U64Bits};
use serde::Deserialize;

use crate::{BlocksRemoved, BlocksStored, DecodeError, Event, EventData, SourceKind};

/// Decode one RouterEvent: `{"worker_id": id, "event": {"event_id": n,
/// "dp_rank": r, "data": {"stored": {"parent_hash": h|null, "blocks":
/// [{"block_hash": h, "tokens_hash": t}]}}}}`, or `data` `{"removed":
/// {"block_hashes": [...]}}` or `"cleared"`. Hashes and ids may be signed
/// (bit-cast to u64). Stored blocks carry `tokens_hash` as
/// `tokens-hashes`. Unknown keys are ignored.
pub fn decode_router_event(
    json: &[u8],
    model: Option<&str>,
    tenant: Option<&str>,
) -> Result<Vec<Event>, DecodeError> {
    let event: RouterEvent<U64Bits> = parse(json, "RouterEvent")?;
    let data = match event.event.data {
        KvCacheEventData::Stored(stored) => EventData::Stored(BlocksStored {
            block_hashes: stored.blocks.iter().map(|b| b.block_hash.0).collect(),
            parent_hash: stored.parent_hash.map(|h| h.0),
            token_ids: Vec::new(),
            tokens_hashes: stored.blocks.iter().map(|b| b.tokens_hash.0).collect(),
            block_size: None,
            lora_name: stored.lora_name,
            tier: None,
        }),
        KvCacheEventData::Removed(removed) => EventData::Removed(BlocksRemoved {
            block_hashes: removed.block_hashes.into_iter().map(|h| h.0).collect(),
            tier: None,
        }),
        KvCacheEventData::Cleared => EventData::Cleared,
    };
    Ok(vec![Event {
        worker_id: event.worker_id.0,
        dp_rank: event.event.dp_rank,
        event_id: event.event.event_id.0,
        source: SourceKind::Nats,
        model: model.map(str::to_owned),
        tenant: tenant.map(str::to_owned),
        data,
    }])
}

/// Decode one KVBM batch: `{"events": {"Create"|"Remove": [sequence_hash,
/// ...]}, "instance_id": u128}`. The worker id is the instance id's low
/// 64 bits; KVBM sends no rank (0), event id (0) or tokens.
pub fn decode_kvbm_event(
    json: &[u8],
    model: Option<&str>,
    tenant: Option<&str>,
) -> Result<Vec<Event>, DecodeError> {
    let batch: KvbmBatch = parse(json, "KVBM event")?;
    let data = match batch.events {
        KvbmEvents::Create(hashes) => EventData::Stored(BlocksStored {
            block_hashes: hashes.into_iter().map(|h| h.0).collect(),
            parent_hash: None,
            token_ids: Vec::new(),
            tokens_hashes: Vec::new(),
            block_size: None,
            lora_name: None,
            tier: None,
        }),
        KvbmEvents::Remove(hashes) => EventData::Removed(BlocksRemoved {
            block_hashes: hashes.into_iter().map(|h| h.0).collect(),
            tier: None,
        }),
    };
    Ok(vec![Event {
        worker_id: batch.instance_id as u64,
        dp_rank: 0,
        event_id: 0,
        source: SourceKind::Nats,
        model: model.map(str::to_owned),
        tenant: tenant.map(str::to_owned),
        data,
    }])
}

fn parse<'a, T: Deserialize<'a>>(json: &'a [u8], what: &str) -> Result<T, DecodeError> {
    serde_json::from_slice(json).map_err(|e| DecodeError::new(format!("not a {what}: {e}")))
}

#[derive(Deserialize)]
struct KvbmBatch {
    events: KvbmEvents,
    instance_id: u128,
}

#[derive(Deserialize)]
enum KvbmEvents {
    Create(Vec<U64Bits>),
    Remove(Vec<U64Bits>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(events: Result<Vec<Event>, DecodeError>) -> Event {
        let mut events = events.unwrap();
        assert_eq!(events.len(), 1);
        events.pop().unwrap()
    }

    #[test]
    fn router_event_stored_removed_cleared() {
        let stored = one(decode_router_event(
            br#"{"worker_id": 42, "event": {"event_id": 9, "dp_rank": 1, "data": {"stored":
               {"parent_hash": -1, "blocks": [{"block_hash": 5, "tokens_hash": 18446744073709551615,
               "mm_extra_info": null}]}}}, "extra": true}"#,
            Some("m"),
            None,
        ));
        assert_eq!(
            (stored.worker_id, stored.dp_rank, stored.event_id),
            (42, 1, 9)
        );
        assert_eq!(
            (stored.model.as_deref(), stored.tenant.as_deref()),
            (Some("m"), None)
        );
        assert!(matches!(stored.source, SourceKind::Nats));
        match &stored.data {
            EventData::Stored(s) => {
                assert_eq!(s.block_hashes, [5]);
                assert_eq!(s.tokens_hashes, [u64::MAX]);
                assert_eq!(s.parent_hash, Some(u64::MAX));
                assert!(s.token_ids.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let removed = one(decode_router_event(
            br#"{"worker_id": -2, "event": {"event_id": 10, "data": {"removed": {"block_hashes": [5, 6]}}}}"#,
            None,
            Some("t"),
        ));
        assert_eq!((removed.worker_id, removed.dp_rank), (u64::MAX - 1, 0));
        assert!(matches!(&removed.data, EventData::Removed(r) if r.block_hashes == [5, 6]));
        let cleared = one(decode_router_event(
            br#"{"worker_id": 1, "event": {"event_id": 11, "dp_rank": 0, "data": "cleared"}}"#,
            None,
            None,
        ));
        assert!(matches!(cleared.data, EventData::Cleared));
    }

    #[test]
    fn kvbm_create_and_remove_with_a_u128_instance() {
        let instance = (7u128 << 64) | 0xDEAD_BEEF;
        let create = one(decode_kvbm_event(
            format!(r#"{{"events": {{"Create": [1, 2, -3]}}, "instance_id": {instance}}}"#)
                .as_bytes(),
            None,
            None,
        ));
        assert_eq!(create.worker_id, 0xDEAD_BEEF);
        match &create.data {
            EventData::Stored(s) => {
                assert_eq!(s.block_hashes, [1, 2, (-3i64) as u64]);
                assert!(s.tokens_hashes.is_empty() && s.token_ids.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let remove = one(decode_kvbm_event(
            br#"{"events": {"Remove": [4]}, "instance_id": 3}"#,
            Some("m"),
            Some("t"),
        ));
        assert_eq!(remove.worker_id, 3);
        assert!(matches!(&remove.data, EventData::Removed(r) if r.block_hashes == [4]));
    }

    #[test]
    fn malformed_json_is_an_error() {
        for json in [
            &b""[..],
            b"{",
            br#"{"worker_id": 1}"#,
            br#"{"worker_id": 1.5, "event": {"data": "cleared"}}"#,
            br#"{"worker_id": 1, "event": {"data": "exploded"}}"#,
            br#"{"worker_id": 1, "event": {"data": {"stored": {"blocks": [{"block_hash": 1}]}}}}"#,
            br#"{"worker_id": 99999999999999999999, "event": {"data": "cleared"}}"#,
        ] {
            assert!(decode_router_event(json, None, None).is_err(), "{json:?}");
        }
        for json in [
            &br#"{"events": {"Create": [1]}}"#[..],
            br#"{"events": {"Update": [1]}, "instance_id": 1}"#,
            br#"{"events": {"Create": [1]}, "instance_id": -1}"#,
            br#"{"events": {"Create": ["x"]}, "instance_id": 1}"#,
        ] {
            assert!(decode_kvbm_event(json, None, None).is_err(), "{json:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode_router_event(&bytes, None, None);
            let _ = decode_kvbm_event(&bytes, None, None);
        }

        #[test]
        fn json_shaped_garbage_never_panics(text in r#"[\[\]{}",:0-9a-z_ -]{0,200}"#) {
            let _ = decode_router_event(text.as_bytes(), None, None);
            let _ = decode_kvbm_event(text.as_bytes(), None, None);
        }
    }
}
