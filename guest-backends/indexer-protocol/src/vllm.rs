//! vLLM's KV event batches (msgpack), as vLLM and SGLang publish them on
//! ZMQ and as kvwasm's `publish_events` sends them (docs/events.md,
//! "Formats accepted"). The ZMQ frames around a payload (`[topic, seq,
//! payload]`) are the sockets' business, not this module's.

use rmpv::Value;

/// Nesting deeper than any real batch (batch, events, event, hashes) is
/// refused before it costs stack.
const MAX_DEPTH: usize = 16;

/// One payload: `[ts, events, data_parallel_rank?]` (SGLang: `[ts,
/// events]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Seconds since the epoch; read as 0 when not a number (no consumer
    /// uses it).
    pub ts: f64,
    /// The events of known types, in order (others are skipped on read).
    pub events: Vec<Event>,
    /// The batch's rank, which overrides the registered one.
    pub data_parallel_rank: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    AllBlocksCleared,
}

/// Blocks an engine now holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockStored {
    /// Engine hashes: signed or unsigned 64-bit integers (bit-cast), or
    /// raw bytes ([`fold_hash`]).
    pub block_hashes: Vec<u64>,
    pub parent_block_hash: Option<u64>,
    pub token_ids: Vec<u32>,
    pub block_size: Option<u32>,
    /// `GPU`, `CPU_PINNED`, ...: the tier; a medium that is not a string
    /// reads as none.
    pub medium: Option<String>,
    pub lora_name: Option<String>,
}

/// Blocks an engine dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<u64>,
    pub medium: Option<String>,
}

/// Fold a hash of any length to the 64-bit integer vLLM would have sent:
/// its last 8 bytes, big-endian (fewer bytes are taken as a shorter
/// big-endian number).
pub fn fold_hash(hash: &[u8]) -> u64 {
    let tail = &hash[hash.len().saturating_sub(8)..];
    tail.iter().fold(0, |acc, &b| acc << 8 | u64::from(b))
}

/// The payload of `batch`, events as tagged maps (vLLM ≥ 0.33's form) with
/// every field vLLM writes (`lora_id` nil).
pub fn encode(batch: &Batch) -> Vec<u8> {
    let ints = |values: &[u64]| Value::Array(values.iter().map(|&v| v.into()).collect());
    let text = |s: &Option<String>| s.as_deref().map_or(Value::Nil, Value::from);
    let event = |event: &Event| {
        let fields: Vec<(&str, Value)> = match event {
            Event::BlockStored(s) => vec![
                ("type", "BlockStored".into()),
                ("block_hashes", ints(&s.block_hashes)),
                (
                    "parent_block_hash",
                    s.parent_block_hash.map_or(Value::Nil, Value::from),
                ),
                (
                    "token_ids",
                    Value::Array(s.token_ids.iter().map(|&t| t.into()).collect()),
                ),
                ("block_size", s.block_size.map_or(Value::Nil, Value::from)),
                ("lora_id", Value::Nil),
                ("medium", text(&s.medium)),
                ("lora_name", text(&s.lora_name)),
            ],
            Event::BlockRemoved(r) => vec![
                ("type", "BlockRemoved".into()),
                ("block_hashes", ints(&r.block_hashes)),
                ("medium", text(&r.medium)),
            ],
            Event::AllBlocksCleared => vec![("type", "AllBlocksCleared".into())],
        };
        Value::Map(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    };
    let value = Value::Array(vec![
        Value::F64(batch.ts),
        Value::Array(batch.events.iter().map(event).collect()),
        batch.data_parallel_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &value).expect("writing to a Vec cannot fail");
    payload
}

/// Read one payload: events as tagged maps (vLLM ≥ 0.33) or tagged arrays
/// (older vLLM, SGLang). Unknown event types, fields, keys and trailing
/// batch fields are ignored; anything else malformed fails the whole
/// batch. Whatever the bytes, an error, never a panic.
pub fn decode(payload: &[u8]) -> Result<Batch, String> {
    let batch = rmpv::decode::read_value_with_max_depth(&mut &payload[..], MAX_DEPTH)
        .map_err(|e| format!("not a msgpack batch: {e}"))?;
    let Value::Array(fields) = batch else {
        return Err("a batch is an array [ts, events, dp_rank?]".into());
    };
    let Some(Value::Array(events)) = fields.get(1) else {
        return Err("a batch's second field must be its events".into());
    };
    let data_parallel_rank = match fields.get(2) {
        None | Some(Value::Nil) => None,
        Some(rank) => Some(int::<u32>(rank, "data_parallel_rank")?),
    };
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        out.extend(read_event(event)?);
    }
    Ok(Batch {
        ts: fields.first().and_then(Value::as_f64).unwrap_or(0.0),
        events: out,
        data_parallel_rank,
    })
}

/// An event's fields, by name (tagged map) or by position (tagged array,
/// the tag at 0).
enum Fields<'a> {
    Map(&'a [(Value, Value)]),
    Array(&'a [Value]),
}

impl Fields<'_> {
    /// The field `key` (at `index` in the array form); absent and nil are
    /// the same.
    fn get(&self, key: &str, index: usize) -> Option<&Value> {
        let value = match self {
            Fields::Map(map) => map
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            Fields::Array(items) => items.get(index),
        };
        value.filter(|v| !v.is_nil())
    }
}

/// One event; `None` for an event type this reader does not know.
fn read_event(event: &Value) -> Result<Option<Event>, String> {
    let fields = match event {
        Value::Map(map) => Fields::Map(map),
        Value::Array(items) => Fields::Array(items),
        _ => return Err("an event is a tagged map or array".into()),
    };
    let Some(tag) = fields.get("type", 0).and_then(Value::as_str) else {
        return Err("an event has no type tag".into());
    };
    let event = match tag {
        "BlockStored" => Event::BlockStored(BlockStored {
            block_hashes: hashes(fields.get("block_hashes", 1), "block_hashes")?,
            parent_block_hash: fields
                .get("parent_block_hash", 2)
                .map(|h| hash(h, "parent_block_hash"))
                .transpose()?,
            token_ids: match fields.get("token_ids", 3) {
                None => Vec::new(),
                Some(tokens) => array(tokens, "token_ids")?
                    .iter()
                    .map(|t| int::<u32>(t, "token_ids"))
                    .collect::<Result<_, _>>()?,
            },
            block_size: fields
                .get("block_size", 4)
                .map(|n| int::<u32>(n, "block_size"))
                .transpose()?,
            medium: medium(fields.get("medium", 6)),
            lora_name: match fields.get("lora_name", 7) {
                None => None,
                Some(Value::String(name)) => {
                    Some(name.as_str().ok_or("lora_name is not UTF-8")?.to_owned())
                }
                Some(_) => return Err("lora_name must be a string".into()),
            },
        }),
        "BlockRemoved" => Event::BlockRemoved(BlockRemoved {
            block_hashes: hashes(fields.get("block_hashes", 1), "block_hashes")?,
            medium: medium(fields.get("medium", 2)),
        }),
        "AllBlocksCleared" => Event::AllBlocksCleared,
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn medium(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_owned)
}

fn array<'a>(value: &'a Value, what: &str) -> Result<&'a [Value], String> {
    value
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{what} must be an array"))
}

fn hashes(value: Option<&Value>, what: &str) -> Result<Vec<u64>, String> {
    let value = value.ok_or_else(|| format!("{what} is missing"))?;
    array(value, what)?.iter().map(|h| hash(h, what)).collect()
}

/// A block hash: a signed or unsigned 64-bit integer (bit-cast), or raw
/// bytes ([`fold_hash`]).
fn hash(value: &Value, what: &str) -> Result<u64, String> {
    match value {
        Value::Integer(n) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|i| i as u64))
            .ok_or_else(|| format!("{what}: integer out of range")),
        Value::Binary(bytes) => Ok(fold_hash(bytes)),
        _ => Err(format!("{what}: a hash is an integer or bytes")),
    }
}

fn int<T: TryFrom<u64>>(value: &Value, what: &str) -> Result<T, String> {
    value
        .as_u64()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("{what}: expected a small unsigned integer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    fn stored() -> BlockStored {
        BlockStored {
            block_hashes: vec![1, u64::MAX],
            parent_block_hash: Some(9),
            token_ids: vec![1, 2, 3, u32::MAX],
            block_size: Some(2),
            medium: Some("CPU_PINNED".into()),
            lora_name: Some("ad".into()),
        }
    }

    #[test]
    fn batches_round_trip() {
        let batch = Batch {
            ts: 1.5,
            events: vec![
                Event::BlockStored(stored()),
                Event::BlockStored(BlockStored {
                    block_hashes: vec![7],
                    block_size: Some(0),
                    medium: Some("STORAGE".into()),
                    ..BlockStored::default()
                }),
                Event::BlockRemoved(BlockRemoved {
                    block_hashes: vec![5],
                    medium: None,
                }),
                Event::AllBlocksCleared,
            ],
            data_parallel_rank: Some(3),
        };
        assert_eq!(decode(&encode(&batch)), Ok(batch.clone()));
        let rankless = Batch {
            data_parallel_rank: None,
            ..batch
        };
        assert_eq!(decode(&encode(&rankless)), Ok(rankless));
    }

    /// vLLM ≥ 0.33's tagged maps carry every key, `lora_id` nil included.
    #[test]
    fn events_are_written_as_tagged_maps_with_every_vllm_key() {
        let payload = encode(&Batch {
            ts: 2.0,
            events: vec![Event::BlockStored(stored())],
            data_parallel_rank: None,
        });
        let value = rmpv::decode::read_value(&mut &payload[..]).unwrap();
        let batch = value.as_array().unwrap();
        assert_eq!((batch[0].as_f64(), batch[2].is_nil()), (Some(2.0), true));
        let keys: Vec<&str> = batch[1].as_array().unwrap()[0]
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "type",
                "block_hashes",
                "parent_block_hash",
                "token_ids",
                "block_size",
                "lora_id",
                "medium",
                "lora_name"
            ]
        );
    }

    /// Older vLLM and SGLang: tagged arrays, `[ts, events]` batches, byte
    /// hashes, signed hashes, trailing fields, unknown event types.
    #[test]
    fn tagged_arrays_signed_and_byte_hashes_and_unknown_types() {
        let mut digest = vec![0xAB; 24];
        digest.extend(0x0102_0304_0506_0708u64.to_be_bytes());
        let payload = write(&Value::Array(vec![
            Value::from(7),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![Value::Binary(digest), Value::from(-1i64)]),
                    Value::Nil,
                    Value::Array(vec![10.into(), 11.into()]),
                    2.into(),
                    Value::Nil,
                    "GPU".into(),
                    Value::Nil,
                    "an extra".into(),
                ]),
                Value::Array(vec!["SomethingNew".into(), 1.into()]),
                Value::Array(vec![
                    "BlockRemoved".into(),
                    Value::Array(vec![1.into()]),
                    5.into(),
                ]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
        ]));
        let batch = decode(&payload).unwrap();
        assert_eq!((batch.ts, batch.data_parallel_rank), (7.0, None));
        assert_eq!(
            batch.events,
            [
                Event::BlockStored(BlockStored {
                    block_hashes: vec![0x0102_0304_0506_0708, u64::MAX],
                    parent_block_hash: None,
                    token_ids: vec![10, 11],
                    block_size: Some(2),
                    medium: Some("GPU".into()),
                    lora_name: None,
                }),
                Event::BlockRemoved(BlockRemoved {
                    block_hashes: vec![1],
                    medium: None,
                }),
                Event::AllBlocksCleared,
            ]
        );
    }

    #[test]
    fn malformed_batches_are_errors_never_panics() {
        let event = |e: Value| write(&Value::Array(vec![Value::F64(0.0), Value::Array(vec![e])]));
        let tagged = |pairs: Vec<(&str, Value)>| {
            Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
        };
        for (payload, why) in [
            (vec![], "not a msgpack batch"),
            (write(&"x".into()), "a batch is an array"),
            (write(&Value::Array(vec![Value::F64(0.0)])), "second field"),
            (event(7.into()), "tagged map or array"),
            (
                event(tagged(vec![("block_hashes", Value::Array(vec![]))])),
                "no type tag",
            ),
            (
                event(tagged(vec![("type", "BlockStored".into())])),
                "block_hashes is missing",
            ),
            (
                event(tagged(vec![
                    ("type", "BlockStored".into()),
                    ("block_hashes", Value::Array(vec!["x".into()])),
                ])),
                "integer or bytes",
            ),
            (
                event(tagged(vec![
                    ("type", "BlockStored".into()),
                    ("block_hashes", Value::Array(vec![])),
                    ("lora_name", 3.into()),
                ])),
                "lora_name must be a string",
            ),
            (
                write(&Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![]),
                    Value::from(-1),
                ])),
                "data_parallel_rank",
            ),
        ] {
            let err = decode(&payload).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
        let mut deep = vec![0x91; 100_000];
        deep.push(0xc0);
        assert!(decode(&deep).is_err());
    }

    #[test]
    fn folds_the_last_eight_bytes_big_endian() {
        assert_eq!(fold_hash(&[]), 0);
        assert_eq!(fold_hash(&[1, 2]), 0x0102);
        let xxh3_le = 0x1122_3344_5566_7788u64.to_le_bytes();
        assert_eq!(fold_hash(&xxh3_le), 0x8877_6655_4433_2211);
        let mut sha = [0xEEu8; 32];
        sha[24..].copy_from_slice(&42u64.to_be_bytes());
        assert_eq!(fold_hash(&sha), 42);
    }
}
