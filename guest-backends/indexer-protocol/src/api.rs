//! The indexer API's bodies: Dynamo 1.6.1's request and response types,
//! with kvwasm's additions marked. Unknown fields are ignored, as Dynamo's
//! axum extractors ignore them.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// The routing group (and tenant) of a body that names none.
pub const DEFAULT_GROUP: &str = "default";
/// Longest `token_ids` of a `/query` (a request can make the indexer
/// allocate no more than this).
pub const MAX_TOKEN_IDS: usize = 1 << 20;
/// Longest `block_hashes` of a `/query_by_hash`.
pub const MAX_QUERY_BLOCKS: usize = 1 << 20;

/// [`DEFAULT_GROUP`], owned (serde's `default = ...` takes a function).
pub fn default_group() -> String {
    DEFAULT_GROUP.into()
}

/// `POST /register`: Dynamo 1.6.1's `RegisterRequest`, plus kvwasm's
/// optional `endpoint` (a worker fed over NATS has none) and `lora_name`
/// (the adapter a `/query` of the tree hashes with when it names none).
/// One tree per (`model_name`, `routing_group`); `tenant_id` only tags the
/// registration (docs/events.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct RegisterRequest {
    pub instance_id: u64,
    /// The publisher's ZMQ PUB address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub routing_group: String,
    #[serde(
        default,
        deserialize_with = "present_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub tenant_id: Option<String>,
    pub block_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// The publisher's ZMQ ROUTER address, for gap replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
}

impl RegisterRequest {
    /// The registered rank (0 when the body names none).
    pub fn rank(&self) -> u32 {
        self.dp_rank.unwrap_or(0)
    }

    /// The registration's tenant ([`DEFAULT_GROUP`] when the body names
    /// none).
    pub fn tenant(&self) -> &str {
        self.tenant_id.as_deref().unwrap_or(DEFAULT_GROUP)
    }
}

/// `POST /unregister`: Dynamo 1.6.1's `UnregisterRequest`. No group means
/// the instance's, no rank every rank; `tenant_id` (ignored by Dynamo)
/// narrows the removal to that tenant's ranks.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct UnregisterRequest {
    pub instance_id: u64,
    pub model_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
}

/// `POST /query`: Dynamo 1.6.1's `QueryRequest`. `tenant_id`, when given,
/// keeps only the workers registered with it (kvwasm's extension: Dynamo
/// ignores it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct QueryRequest {
    #[serde(deserialize_with = "bounded::<_, _, MAX_TOKEN_IDS>")]
    pub token_ids: Vec<u32>,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub routing_group: String,
    #[serde(
        default,
        deserialize_with = "present_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub tenant_id: Option<String>,
    // No `default` on the last two: a body sent as a JSON array must hold
    // them (`null`), as Dynamo's derive reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
}

/// `POST /query_by_hash`: Dynamo 1.6.1's `QueryByHashRequest`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct QueryByHashRequest {
    /// Signed, as Dynamo's API takes them; bit-cast to the u64 hashes.
    #[serde(deserialize_with = "bounded::<_, _, MAX_QUERY_BLOCKS>")]
    pub block_hashes: Vec<i64>,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub routing_group: String,
    #[serde(
        default,
        deserialize_with = "present_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub tenant_id: Option<String>,
    /// Refused when given: the hashes must already carry the salt. (No
    /// `default`: see [`QueryRequest::cache_salt`].)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
}

/// The answer of `/query` and `/query_by_hash`, written without a
/// `serde_json::Value` in between (`/query` is the hot path): Dynamo
/// 1.6.1's `scores` (matched tokens per instance per rank), `frequencies`
/// and `instances`, plus kvwasm's `tree_sizes` (each matched worker's
/// blocks; an extra field a Dynamo client ignores). Map keys are numbers
/// here and strings in JSON.
#[derive(Debug, Serialize)]
pub struct ScoreResponse<'a> {
    pub scores: &'a BTreeMap<u64, BTreeMap<u32, u64>>,
    /// Always empty: no access-time window is kept, as in the standalone
    /// indexer.
    pub frequencies: [u64; 0],
    pub instances: BTreeMap<u64, InstanceOverlap<'a>>,
    pub tree_sizes: BTreeMap<u64, BTreeMap<u32, usize>>,
}

/// Dynamo 1.6.1's per-instance summary (Mooncake RFC #1403), in matched
/// tokens: `dp` per rank, `gpu` the best rank's, `cpu` and `disk`
/// cumulative through the tiers before them, `longest_matched` the largest.
#[derive(Debug, Serialize)]
pub struct InstanceOverlap<'a> {
    pub longest_matched: u64,
    pub gpu: u64,
    pub dp: &'a BTreeMap<u32, u64>,
    pub cpu: u64,
    pub disk: u64,
}

/// A field Dynamo types as a `String` with a default: absent is `None`,
/// `null` is refused (422) as there.
fn present_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// A list of at most `MAX` items: a longer one fails while parsing,
/// before it is held in memory.
fn bounded<'de, D, T, const MAX: usize>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T, const MAX: usize>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>, const MAX: usize> Visitor<'de> for Bounded<T, MAX> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX} items")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            // A prompt's worth up front (JSON gives no length hint).
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4096).min(4096));
            while let Some(item) = seq.next_element()? {
                if items.len() == MAX {
                    return Err(serde::de::Error::custom(format!("more than {MAX} items")));
                }
                items.push(item);
            }
            Ok(items)
        }
    }
    deserializer.deserialize_seq(Bounded::<T, MAX>(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> Result<T, String> {
        serde_json::from_value(body).map_err(|e| e.to_string())
    }

    /// Dynamo's fields, kvwasm's extensions and the defaults of absent
    /// ones; unknown fields ignored.
    #[test]
    fn register_bodies_as_dynamo_and_kvwasm_send_them() {
        let dynamo: RegisterRequest = parse(json!({"instance_id": 7, "endpoint": "tcp://h:1",
            "model_name": "m", "block_size": 16, "unknown": [1]}))
        .unwrap();
        assert_eq!(
            (
                dynamo.routing_group.as_str(),
                dynamo.tenant(),
                dynamo.rank()
            ),
            ("default", "default", 0)
        );
        assert_eq!(dynamo.endpoint.as_deref(), Some("tcp://h:1"));
        let full: RegisterRequest = parse(json!({"instance_id": 7, "model_name": "m",
            "routing_group": "g", "tenant_id": "t", "block_size": 16, "dp_rank": 3,
            "replay_endpoint": "tcp://h:2", "lora_name": "a"}))
        .unwrap();
        assert_eq!((full.tenant(), full.rank()), ("t", 3));
        assert_eq!(full.endpoint, None, "a NATS-fed worker has no endpoint");
        assert_eq!(
            (full.replay_endpoint.as_deref(), full.lora_name.as_deref()),
            (Some("tcp://h:2"), Some("a"))
        );
        let null_rank: RegisterRequest = parse(json!({"instance_id": 7, "model_name": "m",
            "block_size": 16, "dp_rank": null}))
        .unwrap();
        assert_eq!(null_rank.rank(), 0);
        for bad in [
            json!({"model_name": "m", "block_size": 16}),
            json!({"instance_id": 7, "block_size": 16}),
            json!({"instance_id": 7, "model_name": "m"}),
            json!({"instance_id": -7, "model_name": "m", "block_size": 16}),
            json!({"instance_id": 7, "model_name": "m", "block_size": 16, "tenant_id": null}),
        ] {
            assert!(parse::<RegisterRequest>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn register_and_unregister_bodies_round_trip() {
        let register = RegisterRequest {
            instance_id: u64::MAX,
            endpoint: Some("ipc:///tmp/x".into()),
            model_name: "m:n".into(),
            routing_group: "g".into(),
            tenant_id: Some("t".into()),
            block_size: 64,
            dp_rank: Some(2),
            replay_endpoint: None,
            lora_name: None,
        };
        let body = serde_json::to_value(&register).unwrap();
        assert!(body.get("replay_endpoint").is_none(), "{body}");
        assert_eq!(parse::<RegisterRequest>(body), Ok(register));
        let unregister = UnregisterRequest {
            instance_id: 1,
            model_name: "m".into(),
            routing_group: None,
            tenant_id: Some("t".into()),
            dp_rank: Some(0),
        };
        let body = serde_json::to_value(&unregister).unwrap();
        assert_eq!(parse::<UnregisterRequest>(body), Ok(unregister));
        let any: UnregisterRequest = parse(json!({"instance_id": 1, "model_name": "m"})).unwrap();
        assert_eq!(
            (any.routing_group, any.tenant_id, any.dp_rank),
            (None, None, None)
        );
    }

    #[test]
    fn query_bodies_take_defaults_and_refuse_null_tenants_and_long_lists() {
        let q: QueryRequest =
            parse(json!({"token_ids": [1, 2], "model_name": "m", "lora_name": null})).unwrap();
        assert_eq!(
            (q.routing_group.as_str(), q.tenant_id, q.lora_name),
            ("default", None, None)
        );
        assert!(
            parse::<QueryRequest>(json!({"token_ids": [], "model_name": "m", "tenant_id": null}))
                .is_err()
        );
        assert!(parse::<QueryRequest>(json!({"token_ids": [-1], "model_name": "m"})).is_err());
        // As an array (serde's sequence form), every field up to the last
        // must be there: Dynamo's derive answers 422 to a short one.
        assert!(parse::<QueryRequest>(json!([[1], "m"])).is_err());
        let full: QueryRequest = parse(json!([[1], "m", "g", "t", null, null])).unwrap();
        assert_eq!(
            (full.routing_group.as_str(), full.tenant_id.as_deref()),
            ("g", Some("t"))
        );
        let long = serde_json::to_string(&json!({"model_name": "m",
            "token_ids": vec![1; MAX_TOKEN_IDS + 1]}))
        .unwrap();
        let err = serde_json::from_str::<QueryRequest>(&long).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        let by_hash: QueryByHashRequest =
            parse(json!({"block_hashes": [-1, 5], "model_name": "m"})).unwrap();
        assert_eq!(by_hash.block_hashes, [-1, 5]);
        assert!(
            parse::<QueryByHashRequest>(json!({"block_hashes": [18446744073709551615_u64],
            "model_name": "m"}))
            .is_err(),
            "signed hashes only, as Dynamo"
        );
    }

    #[test]
    fn score_responses_have_string_keys() {
        let scores = BTreeMap::from([(7, BTreeMap::from([(1, 32)]))]);
        let dp = &scores[&7];
        let response = ScoreResponse {
            scores: &scores,
            frequencies: [],
            instances: BTreeMap::from([(
                7,
                InstanceOverlap {
                    longest_matched: 32,
                    gpu: 32,
                    dp,
                    cpu: 32,
                    disk: 32,
                },
            )]),
            tree_sizes: BTreeMap::from([(7, BTreeMap::from([(1, 2)]))]),
        };
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            json!({"scores": {"7": {"1": 32}}, "frequencies": [], "instances": {"7":
                {"longest_matched": 32, "gpu": 32, "dp": {"1": 32}, "cpu": 32, "disk": 32}},
                "tree_sizes": {"7": {"1": 2}}})
        );
    }
}
