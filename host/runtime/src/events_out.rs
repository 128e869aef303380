//! A backend's kv_store traffic, published as KV events (docs/events.md).
//!
//! With `publish_events = "tcp://127.0.0.1:5557"` in `[backends.<name>]`,
//! every successful `put_chunk` on a handle of that backend becomes a
//! vLLM-format `BlockStored` event on a ZMQ PUB socket bound at that
//! address, so `kvwasm serve` (or any vLLM event consumer) can index what
//! the store holds. The wire format is vLLM's (docs/events.md): 3 frames
//! `[topic "", seq (u64 big-endian, from 0), payload]`, the payload a
//! msgpack batch `[ts, [event, ...], nil]` with events as tagged maps
//! (written by `kvwasm_indexer_protocol::vllm`, which the ZMQ sources read
//! with): `block_hashes` is the chunk hash folded to 64 bits ([`fold_hash`]),
//! `token_ids` is empty (a chunk's bytes are not tokens), `block_size` 0,
//! `medium` `"STORAGE"`. Events queued together go out as one batch.
//!
//! Manifests are not blocks: `put_manifest` and `delete_manifest` publish
//! nothing, and the ABI has no chunk deletion, so no `BlockRemoved` is ever
//! sent.
//!
//! The consumer's thread only queues the hash (bounded, never waits; a full
//! queue drops the event, counted as `events_dropped` in the backend's
//! metrics). A task on the host's I/O runtime ([`crate::deadline`]) owns the
//! socket and drains the queue. No replay socket: a subscriber that missed
//! messages sees a gap it cannot fill; events still queued when the process
//! exits are lost.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use kvwasm_indexer_protocol::vllm::{self, BlockStored};
use tokio::sync::mpsc;
use zeromq::{Socket as _, SocketSend as _};

use crate::metrics::BackendMetrics;

/// Events queued per backend before new ones are dropped.
const QUEUE_EVENTS: usize = 16 * 1024;
/// Most events in one published batch.
const MAX_BATCH: usize = 1024;

pub use kvwasm_indexer_protocol::vllm::fold_hash;

/// Whether `address` is an endpoint the publisher can bind (`tcp://host:port`).
pub(crate) fn validate_address(address: &str) -> Result<(), String> {
    match address.parse::<zeromq::Endpoint>() {
        Ok(zeromq::Endpoint::Tcp(..)) => Ok(()),
        Ok(other) => Err(format!("publish_events {other}: only tcp:// endpoints")),
        Err(e) => Err(format!(
            "publish_events {address:?}: {e} (expected tcp://host:port)"
        )),
    }
}

impl crate::Backend {
    /// Bind the backend's publisher, if it has one (at the first open, so
    /// subscribers can connect before the first event).
    pub(crate) fn start_publishing(&self) {
        if let Some(events) = &self.events_out {
            events.queue();
        }
    }

    /// Queue a `BlockStored` for the chunk `hash`, if the backend publishes.
    pub(crate) fn publish_stored(&self, hash: &[u8]) {
        if let Some(events) = &self.events_out {
            events.stored(hash);
        }
    }
}

/// The publisher of one backend.
pub(crate) struct EventsOut {
    address: String,
    metrics: Arc<BackendMetrics>,
    queue: OnceLock<mpsc::Sender<u64>>,
}

impl EventsOut {
    pub(crate) fn new(address: &str, metrics: Arc<BackendMetrics>) -> EventsOut {
        EventsOut {
            address: address.to_owned(),
            metrics,
            queue: OnceLock::new(),
        }
    }

    /// Queue a `BlockStored` for the chunk `hash`; never waits.
    fn stored(&self, hash: &[u8]) {
        if self.queue().try_send(fold_hash(hash)).is_err() {
            self.metrics.event_dropped();
        }
    }

    /// The queue, its task started (the socket bound) on first use.
    fn queue(&self) -> &mpsc::Sender<u64> {
        self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(QUEUE_EVENTS);
            let (address, metrics) = (self.address.clone(), self.metrics.clone());
            crate::io::shared().spawn(publish(address, receiver, metrics));
            sender
        })
    }
}

/// Bind a PUB socket at `address` and publish what arrives on `queue`
/// until every sender is gone. A socket that cannot bind ends the task:
/// later events then count as dropped.
async fn publish(address: String, mut queue: mpsc::Receiver<u64>, metrics: Arc<BackendMetrics>) {
    let mut socket = zeromq::PubSocket::new();
    if let Err(e) = socket.bind(&address).await {
        tracing::warn!(%address, "publish_events: cannot bind the PUB socket: {e}; events are dropped");
        return;
    }
    let mut hashes = Vec::with_capacity(MAX_BATCH);
    for seq in 0u64.. {
        if queue.recv_many(&mut hashes, MAX_BATCH).await == 0 {
            return;
        }
        if let Err(e) = socket.send(message(seq, &hashes)).await {
            tracing::warn!(%address, "publish_events: send failed: {e}");
            (0..hashes.len()).for_each(|_| metrics.event_dropped());
        }
        hashes.clear();
    }
}

/// One vLLM-format message: `[topic, seq, batch]`.
fn message(seq: u64, hashes: &[u64]) -> zeromq::ZmqMessage {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let stored = |hash: u64| {
        vllm::Event::BlockStored(BlockStored {
            block_hashes: vec![hash],
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: Some(0),
            medium: Some("STORAGE".into()),
            lora_name: None,
        })
    };
    let batch = vllm::Batch {
        ts,
        events: hashes.iter().copied().map(stored).collect(),
        data_parallel_rank: None,
    };
    let frames: Vec<bytes::Bytes> = vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
        vllm::encode(&batch).into(),
    ];
    frames.try_into().expect("three frames")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_tcp_endpoints() {
        assert!(validate_address("tcp://127.0.0.1:5557").is_ok());
        assert!(validate_address("tcp://localhost:5557").is_ok());
        for bad in [
            "127.0.0.1:5557",
            "ipc:///tmp/x",
            "tcp://host",
            "udp://1.2.3.4:5",
        ] {
            assert!(validate_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let metrics = Arc::new(BackendMetrics::default());
        let out = EventsOut::new("tcp://127.0.0.1:1", metrics.clone());
        // A queue nobody drains stands in for a publisher that fell behind.
        let (sender, _receiver) = mpsc::channel(2);
        out.queue.set(sender).unwrap();
        let started = std::time::Instant::now();
        for i in 0..5u64 {
            out.stored(&i.to_be_bytes());
        }
        // A send that waited would wait forever (nobody drains the queue);
        // the bound is loose for a loaded machine.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert_eq!(metrics.snapshot().events_dropped, 3);
    }

    #[test]
    fn messages_are_vllm_batches_of_tagged_maps() {
        let message = message(7, &[1, u64::MAX]);
        let frames: Vec<_> = message.into_vec();
        assert_eq!(frames.len(), 3);
        assert!(frames[0].is_empty());
        assert_eq!(&frames[1][..], &7u64.to_be_bytes());
        let batch = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
        let batch = batch.as_array().unwrap();
        assert!(batch[0].as_f64().unwrap() > 1.6e9);
        assert!(batch[2].is_nil());
        let events = batch[1].as_array().unwrap();
        assert_eq!(events.len(), 2);
        let field = |e: &rmpv::Value, k: &str| {
            e.as_map()
                .unwrap()
                .iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(field(&events[1], "type").as_str(), Some("BlockStored"));
        assert_eq!(
            field(&events[1], "block_hashes").as_array().unwrap()[0].as_u64(),
            Some(u64::MAX)
        );
    }
}
