//! The `[serve]` table of the config file (`kvwasm serve --help` shows it).
//!
//! The host runtime keeps `[serve]` as raw TOML ([`kvwasm_host::config::Config::serve`]);
//! it is parsed here, strictly: an unknown key is an error, not a silent no-op.

use std::net::SocketAddr;

use kvwasm_indexer_protocol::api::{RegisterRequest, default_group};
use serde::{Deserialize, Serialize};

/// `[serve]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Address of the HTTP listener.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The `[subscribers.NAME]` that answers the indexer API (exports `http-api`).
    pub indexer: Option<String>,
    /// More `[subscribers.NAME]` fed the same events (an advisor, an audit log).
    #[serde(default)]
    pub subscribers: Vec<String>,
    /// Events waiting for one guest at most; past it new events are taken
    /// from the replay log instead, never blocking a source.
    #[serde(default = "default_queue_events")]
    pub queue_events: usize,
    /// Events of workers not registered yet, held (in all) until they are;
    /// past it new ones are dropped, counted.
    #[serde(default = "default_pending_events")]
    pub pending_events: usize,
    /// Events per `on-batch` call at most.
    #[serde(default = "default_batch_events")]
    pub batch_events: usize,
    /// Largest request body, MiB; larger ones are answered 413.
    #[serde(default = "default_max_body_mib")]
    pub max_body_mib: u64,
    /// Largest guest answer, MiB; a larger one is answered 503 instead.
    #[serde(default = "default_max_response_mib")]
    pub max_response_mib: u64,
    /// Guest answers held for clients that have not read them yet, MiB in
    /// all; past it a request is answered 503 instead.
    #[serde(default = "default_held_response_mib")]
    pub held_response_mib: u64,
    /// Open client connections at most; more wait to be accepted.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A client that makes no progress reading an answer, or sends no
    /// request head, for this long is dropped (with what it held), ms.
    #[serde(default = "default_client_timeout_ms")]
    pub client_timeout_ms: u64,
    /// Events the replay log keeps before it is compacted into a `/dump`.
    #[serde(default = "default_log_events")]
    pub log_events: usize,
    /// Peer replicas (`http://host:port`): the first reachable one's `/dump`
    /// restores this one at startup, and its indexer whenever it diverged.
    #[serde(default)]
    pub peers: Vec<String>,
    /// `[[serve.workers]]`: ZMQ publishers registered at startup.
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// `[[serve.nats]]`: NATS servers to subscribe to.
    #[serde(default)]
    pub nats: Vec<NatsConfig>,
}

/// `[[serve.workers]]`: the body of a `/register` call made at startup.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    pub instance_id: u64,
    #[serde(default)]
    pub dp_rank: u32,
    /// The publisher's ZMQ PUB address; none for a worker whose events
    /// come over NATS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The publisher's ZMQ ROUTER address, for gap replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub tenant_id: String,
    pub block_size: u32,
}

impl WorkerConfig {
    /// The `/register` body it stands for (in the default routing group).
    pub fn registration(&self) -> RegisterRequest {
        RegisterRequest {
            instance_id: self.instance_id,
            endpoint: self.endpoint.clone(),
            model_name: self.model_name.clone(),
            routing_group: default_group(),
            tenant_id: Some(self.tenant_id.clone()),
            block_size: self.block_size,
            dp_rank: Some(self.dp_rank),
            replay_endpoint: self.replay_endpoint.clone(),
            lora_name: None,
        }
    }
}

/// `[[serve.nats]]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// `nats://host:port`.
    pub url: String,
    /// Subjects to subscribe to; empty means the source's defaults
    /// (Dynamo's RouterEvent subjects and `kvbm.events`).
    #[serde(default)]
    pub subjects: Vec<String>,
    /// The (model, tenant) its events are attributed to; without them the
    /// indexer attributes events by its registrations.
    pub model: Option<String>,
    pub tenant: Option<String>,
    /// `model`'s block size: its stored events (a RouterEvent carries
    /// none) then build the tree without a worker registered.
    pub block_size: Option<u32>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8090))
}
fn default_queue_events() -> usize {
    65_536
}
fn default_pending_events() -> usize {
    65_536
}
fn default_batch_events() -> usize {
    1_024
}
fn default_max_body_mib() -> u64 {
    16
}
fn default_max_response_mib() -> u64 {
    256
}
fn default_held_response_mib() -> u64 {
    512
}
fn default_max_connections() -> usize {
    256
}
fn default_client_timeout_ms() -> u64 {
    10_000
}
fn default_log_events() -> usize {
    4_000_000
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig::parse(None).expect("the defaults are valid")
    }
}

impl ServeConfig {
    /// Parse and check `[serve]` (absent: every default).
    pub fn parse(table: Option<&toml::Table>) -> Result<ServeConfig, String> {
        let table = table.cloned().unwrap_or_default();
        let config: ServeConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| format!("[serve]: {}", e.message()))?;
        config.validate().map_err(|e| format!("[serve]: {e}"))?;
        Ok(config)
    }

    /// Largest request body, bytes.
    pub fn max_body_bytes(&self) -> usize {
        mib_to_bytes(self.max_body_mib)
    }

    /// Largest guest answer, bytes.
    pub fn max_response_bytes(&self) -> usize {
        mib_to_bytes(self.max_response_mib)
    }

    /// Guest answers held for clients in all, bytes.
    pub fn held_response_bytes(&self) -> usize {
        mib_to_bytes(self.held_response_mib)
    }

    /// Every subscriber guest the service feeds: the indexer first.
    pub fn guest_names(&self) -> Vec<&str> {
        self.indexer
            .iter()
            .chain(&self.subscribers)
            .map(String::as_str)
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("queue_events", self.queue_events as u64),
            ("batch_events", self.batch_events as u64),
            ("pending_events", self.pending_events as u64),
            ("max_body_mib", self.max_body_mib),
            ("log_events", self.log_events as u64),
            ("max_response_mib", self.max_response_mib),
            ("held_response_mib", self.held_response_mib),
            ("max_connections", self.max_connections as u64),
            ("client_timeout_ms", self.client_timeout_ms),
        ] {
            if value == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if self.held_response_mib < self.max_response_mib {
            return Err("held_response_mib must be at least max_response_mib".into());
        }
        let names = self.guest_names();
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(format!("subscriber {name:?} is named twice"));
            }
        }
        if self.indexer.is_none() && !self.workers.is_empty() {
            return Err("[[serve.workers]] needs an `indexer` to register them with".into());
        }
        for peer in &self.peers {
            if !(peer.starts_with("http://") || peer.starts_with("https://")) {
                return Err(format!("peer {peer:?} is not an http:// URL"));
            }
        }
        for nats in &self.nats {
            if !nats.url.starts_with("nats://") {
                return Err(format!(
                    "[[serve.nats]] url {:?} is not a nats:// URL",
                    nats.url
                ));
            }
            if nats.block_size == Some(0) {
                return Err("[[serve.nats]] block_size must be at least 1".into());
            }
            if nats.block_size.is_some() && nats.model.is_none() {
                return Err("[[serve.nats]] block_size needs the `model` it is the size of".into());
            }
        }
        Ok(())
    }
}

fn mib_to_bytes(mib: u64) -> usize {
    usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeConfig, String> {
        let table: toml::Table = toml::from_str(text).unwrap();
        ServeConfig::parse(Some(&table))
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let c = ServeConfig::parse(None).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8090".parse().unwrap());
        assert_eq!(
            (c.queue_events, c.batch_events, c.max_body_mib, c.log_events),
            (65_536, 1_024, 16, 4_000_000)
        );
        assert_eq!(c.max_body_bytes(), 16 << 20);
        assert_eq!(
            (c.max_response_bytes(), c.held_response_bytes()),
            (256 << 20, 512 << 20)
        );
        assert_eq!((c.max_connections, c.client_timeout_ms), (256, 10_000));
        assert!(c.indexer.is_none() && c.peers.is_empty() && c.workers.is_empty());
    }

    #[test]
    fn a_full_table_parses() {
        let c = parse(
            r#"
            listen = "0.0.0.0:9000"
            indexer = "idx"
            subscribers = ["advisor"]
            queue_events = 10
            batch_events = 5
            max_body_mib = 2
            log_events = 100
            peers = ["http://10.0.0.2:8090"]
            [[workers]]
            instance_id = 7
            endpoint = "tcp://127.0.0.1:5557"
            model_name = "m"
            block_size = 16
            [[nats]]
            url = "nats://127.0.0.1:4222"
            subjects = ["kvbm.events"]
            model = "m"
            "#,
        )
        .unwrap();
        assert_eq!(c.guest_names(), ["idx", "advisor"]);
        assert_eq!(c.workers[0].tenant_id, "default");
        assert_eq!(c.workers[0].dp_rank, 0);
        assert_eq!(c.nats[0].tenant, None);
        assert_eq!(c.max_body_bytes(), 2 << 20);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        for (text, expected) in [
            ("listn = \"127.0.0.1:1\"", "unknown field `listn`"),
            ("listen = \"nowhere\"", "invalid socket address"),
            ("queue_events = 0", "queue_events must be at least 1"),
            ("max_body_mib = 0", "max_body_mib must be at least 1"),
            ("max_connections = 0", "max_connections must be at least 1"),
            (
                "max_response_mib = 8\nheld_response_mib = 4",
                "held_response_mib must be at least max_response_mib",
            ),
            ("indexer = \"a\"\nsubscribers = [\"a\"]", "named twice"),
            ("peers = [\"10.0.0.2:8090\"]", "not an http:// URL"),
            (
                "[[workers]]\ninstance_id = 1\nendpoint = \"tcp://x:1\"\nmodel_name = \"m\"\nblock_size = 16",
                "needs an `indexer`",
            ),
            (
                "indexer = \"i\"\n[[workers]]\ninstance_id = 1\nendpoint = \"tcp://x:1\"\nmodel_name = \"m\"\nblock_size = 16\nport = 3",
                "unknown field `port`",
            ),
            ("[[nats]]\nurl = \"127.0.0.1:4222\"", "not a nats:// URL"),
            (
                "[[nats]]\nurl = \"nats://h:1\"\nblock_size = 16",
                "needs the `model`",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(err.starts_with("[serve]: "), "{err}");
        }
    }
}
