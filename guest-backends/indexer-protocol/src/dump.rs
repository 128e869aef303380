//! Dynamo's `RouterEvent` and the `/dump` document made of them.
//!
//! The integer type `H` of ids and hashes is how strict a reader is:
//! `u64` (the default) reads what Dynamo's own types read (a `/dump`
//! restored by `/restore`); [`U64Bits`] also takes signed integers,
//! bit-cast, as publishers on NATS send them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /dump`'s answer: one [`DumpIndex`] per tree, keyed by
/// [`dump_key`].
pub type Dump<H = u64> = BTreeMap<String, DumpIndex<H>>;

/// A tree's key in a [`Dump`]: `model:routing_group`.
pub fn dump_key(model: &str, group: &str) -> String {
    format!("{model}:{group}")
}

/// A [`Dump`] key's (model, routing group): split at the first `:` (a
/// model name may not hold one, a group may), as Dynamo's recovery does.
pub fn split_dump_key(key: &str) -> Option<(&str, &str)> {
    key.split_once(':')
}

/// One tree of a [`Dump`]: its block size and the events that rebuild it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
pub struct DumpIndex<H = u64> {
    pub block_size: u32,
    pub events: Vec<RouterEvent<H>>,
}

/// Dynamo's `RouterEvent`, with every field 1.6.1 writes, so a dump reads
/// as its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
pub struct RouterEvent<H = u64> {
    pub worker_id: H,
    #[serde(default = "device_tier")]
    pub storage_tier: String,
    pub event: KvCacheEvent<H>,
}

/// The `storage_tier` of a RouterEvent that names none.
pub fn device_tier() -> String {
    "device".into()
}

/// Dynamo's `KvCacheEvent`. A missing `event_id` reads as 0 (KVBM-era
/// publishers send none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
pub struct KvCacheEvent<H = u64> {
    #[serde(default)]
    pub event_id: H,
    pub data: KvCacheEventData<H>,
    #[serde(default)]
    pub dp_rank: u32,
}

/// `{"stored": {...}}`, `{"removed": {...}}` or the bare string
/// `"cleared"` (the worker's rank dropped everything).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
#[serde(rename_all = "snake_case")]
pub enum KvCacheEventData<H = u64> {
    Stored(KvCacheStoreData<H>),
    Removed(KvCacheRemoveData<H>),
    Cleared,
}

/// Blocks a worker now holds, after `parent_hash` (engine hashes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
pub struct KvCacheStoreData<H = u64> {
    #[serde(default)]
    pub parent_hash: Option<H>,
    /// Written as `null` (a field of 1.6.1's dump), never read.
    #[serde(default)]
    pub start_position: Option<u32>,
    pub blocks: Vec<KvCacheStoredBlockData<H>>,
    /// The blocks' adapter, as some publishers send it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
}

/// One stored block: the engine's hash and the indexer's local hash of
/// its tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
pub struct KvCacheStoredBlockData<H = u64> {
    pub block_hash: H,
    pub tokens_hash: H,
    /// Written as `null` (a field of 1.6.1's dump), never read.
    #[serde(default)]
    pub mm_extra_info: Option<serde_json::Value>,
}

/// Blocks a worker dropped (engine hashes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "H: Deserialize<\'de> + Default"))]
pub struct KvCacheRemoveData<H = u64> {
    pub block_hashes: Vec<H>,
}

/// A 64-bit id or hash sent as an unsigned or a signed JSON integer (the
/// signed ones bit-cast); written back unsigned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct U64Bits(pub u64);

impl<'de> Deserialize<'de> for U64Bits {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<U64Bits, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = U64Bits;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a 64-bit integer")
            }
            fn visit_u64<E>(self, v: u64) -> Result<U64Bits, E> {
                Ok(U64Bits(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<U64Bits, E> {
                Ok(U64Bits(v as u64))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(parent: Option<u64>, blocks: &[(u64, u64)]) -> KvCacheEventData {
        KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent,
            start_position: None,
            blocks: blocks
                .iter()
                .map(|&(block_hash, tokens_hash)| KvCacheStoredBlockData {
                    block_hash,
                    tokens_hash,
                    mm_extra_info: None,
                })
                .collect(),
            lora_name: None,
        })
    }

    /// A dump as Dynamo 1.6.1 writes it, every variant, field for field.
    #[test]
    fn dumps_are_written_as_dynamo_writes_them_and_read_back() {
        let event = |worker_id, event_id, dp_rank, data| RouterEvent {
            worker_id,
            storage_tier: device_tier(),
            event: KvCacheEvent {
                event_id,
                data,
                dp_rank,
            },
        };
        let dump: Dump = BTreeMap::from([(
            dump_key("m", "g:h"),
            DumpIndex {
                block_size: 16,
                events: vec![
                    event(7, 0, 1, stored(None, &[(100, u64::MAX)])),
                    event(7, 1, 1, stored(Some(100), &[(101, 5)])),
                    event(
                        8,
                        2,
                        0,
                        KvCacheEventData::Removed(KvCacheRemoveData {
                            block_hashes: vec![101],
                        }),
                    ),
                    event(8, 3, 0, KvCacheEventData::Cleared),
                ],
            },
        )]);
        let written = serde_json::to_value(&dump).unwrap();
        assert_eq!(
            written["m:g:h"]["events"][0],
            json!({"worker_id": 7, "storage_tier": "device", "event": {"event_id": 0,
                "data": {"stored": {"parent_hash": null, "start_position": null, "blocks":
                [{"block_hash": 100, "tokens_hash": 18446744073709551615_u64,
                  "mm_extra_info": null}]}}, "dp_rank": 1}})
        );
        assert_eq!(
            written["m:g:h"]["events"][2]["event"]["data"],
            json!({"removed": {"block_hashes": [101]}})
        );
        assert_eq!(
            written["m:g:h"]["events"][3]["event"]["data"],
            json!("cleared")
        );
        assert_eq!(serde_json::from_value::<Dump>(written).unwrap(), dump);
        assert_eq!(split_dump_key("m:g:h"), Some(("m", "g:h")));
        assert_eq!(split_dump_key("m"), None);
    }

    /// A RouterEvent as publishers send it on NATS: signed ids and hashes,
    /// no `event_id`, `dp_rank` or `storage_tier`, a `lora_name`, unknown
    /// keys; the strict reader refuses what Dynamo's `u64` refuses.
    #[test]
    fn router_events_from_publishers_read_with_signed_integers() {
        let sent = json!({"worker_id": -2, "event": {"data": {"stored": {"parent_hash": -1,
            "blocks": [{"block_hash": 5, "tokens_hash": 18446744073709551615_u64,
            "mm_extra_info": null}], "lora_name": "a"}}}, "extra": true});
        let event: RouterEvent<U64Bits> = serde_json::from_value(sent.clone()).unwrap();
        assert_eq!(event.worker_id, U64Bits(u64::MAX - 1));
        assert_eq!((event.event.event_id, event.event.dp_rank), (U64Bits(0), 0));
        assert_eq!(event.storage_tier, "device");
        let KvCacheEventData::Stored(stored) = &event.event.data else {
            panic!("{event:?}");
        };
        assert_eq!(stored.parent_hash, Some(U64Bits(u64::MAX)));
        assert_eq!(
            (stored.blocks[0].block_hash, stored.blocks[0].tokens_hash),
            (U64Bits(5), U64Bits(u64::MAX))
        );
        assert_eq!(stored.lora_name.as_deref(), Some("a"));
        let written = serde_json::to_value(&event).unwrap();
        assert_eq!(
            written["worker_id"],
            json!(u64::MAX - 1),
            "written unsigned"
        );
        assert_eq!(
            serde_json::from_value::<RouterEvent<U64Bits>>(written).unwrap(),
            event
        );
        assert!(serde_json::from_value::<RouterEvent>(sent).is_err());
        for bad in [
            json!({"worker_id": 1}),
            json!({"worker_id": 1.5, "event": {"data": "cleared"}}),
            json!({"worker_id": 1, "event": {"data": "exploded"}}),
            json!({"worker_id": 1, "event": {"data": {"stored": {"blocks": [{"block_hash": 1}]}}}}),
            json!({"worker_id": 1, "event": {"data": {"removed": {"block_hashes": ["x"]}}}}),
        ] {
            assert!(
                serde_json::from_value::<RouterEvent<U64Bits>>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        let removed: RouterEvent<U64Bits> = serde_json::from_value(json!({"worker_id": 3,
            "event": {"event_id": 10, "dp_rank": 2, "data": {"removed": {"block_hashes": [5, -6]}}}}))
        .unwrap();
        assert_eq!(
            removed.event.data,
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: vec![U64Bits(5), U64Bits(-6i64 as u64)]
            })
        );
    }
}
