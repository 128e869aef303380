//! KV event sources for `kvwasm serve` (docs/events.md, "Formats accepted").
//!
//! Inference engines publish KV-cache events; a source receives them,
//! decodes them into the normalised [`Event`] records of `kvwasm:events`
//! and hands them, a batch at a time, to a [`Sink`]:
//!
//! * [`spawn_zmq`]: a vLLM or SGLang worker's ZMQ PUB socket (or a kvwasm
//!   shim's `publish_events`), with gaps filled through the publisher's
//!   replay socket;
//! * [`spawn_nats`]: Dynamo's RouterEvent and KVBM's `kvbm.events` on NATS.
//!
//! The decoders are pure functions ([`decode_zmq_batch`],
//! [`decode_router_event`], [`decode_kvbm_event`]): whatever bytes arrive,
//! they return an error, never panic. Every source keeps
//! [`SourceCounters`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use kvwasm_host::subscriber::{
    BlocksRemoved, BlocksStored, Event, EventData, SourceKind, Tier,
};

mod json;
mod msgpack;
mod nats;
mod zmq;

pub use json::{decode_kvbm_event, decode_router_event};
pub use msgpack::decode_zmq_batch;
pub use nats::{NatsSource, spawn_nats};
pub use zmq::{ZmqWorker, spawn_zmq};

/// Where a source delivers its events: a bounded channel drained by the
/// serve feed (which never blocks on guests, so `send().await` here only
/// waits for the fan-out, never for a guest).
pub type Sink = tokio::sync::mpsc::Sender<Vec<Event>>;

/// Why a message could not be decoded. The source counts it
/// (`decode_errors`) and goes on with the next message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

impl DecodeError {
    fn new(message: impl Into<String>) -> DecodeError {
        DecodeError(message.into())
    }
}

/// Counters every source keeps, readable any time (serve renders them
/// into `/metrics` with the source's label).
#[derive(Default, Debug)]
pub struct SourceCounters {
    /// Messages received (live and replayed, duplicates included).
    pub messages: AtomicU64,
    /// Events delivered to the sink.
    pub events: AtomicU64,
    /// Messages that could not be decoded (skipped).
    pub decode_errors: AtomicU64,
    /// Sequence gaps seen (ZMQ).
    pub gaps: AtomicU64,
    /// Messages recovered through the publisher's replay socket (ZMQ).
    pub replayed: AtomicU64,
    /// Messages already seen, skipped (ZMQ, after a replay).
    pub duplicates_skipped: AtomicU64,
    /// Publishers seen restarting their sequence at 0 (ZMQ).
    pub restarts: AtomicU64,
    /// Connections re-established after the server or publisher went away.
    pub reconnects: AtomicU64,
}

impl SourceCounters {
    /// Every counter by name (the names serve puts in `/metrics`).
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        [
            ("messages", &self.messages),
            ("events", &self.events),
            ("decode_errors", &self.decode_errors),
            ("gaps", &self.gaps),
            ("replayed", &self.replayed),
            ("duplicates_skipped", &self.duplicates_skipped),
            ("restarts", &self.restarts),
            ("reconnects", &self.reconnects),
        ]
        .into_iter()
        .map(|(name, counter)| (name, counter.load(Relaxed)))
        .collect()
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

/// A running source; dropping it stops it.
#[derive(Debug)]
pub struct SourceHandle {
    task: tokio::task::JoinHandle<()>,
    pub counters: Arc<SourceCounters>,
}

impl SourceHandle {
    /// Whether the source has stopped (its sink was closed).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for SourceHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tier a publisher's `medium` names (case-insensitive); `None` for
/// names not in the table.
pub fn tier_of_medium(medium: &str) -> Option<Tier> {
    Some(match medium.to_ascii_uppercase().as_str() {
        "GPU" | "DEVICE" => Tier::Device,
        "CPU" | "CPU_PINNED" | "CPU_TIER1" => Tier::Host,
        "CPU_TIER2" | "DISK" | "NVME" | "STORAGE" => Tier::Disk,
        "EXTERNAL" | "NETWORK" | "REMOTE" | "SHARED" => Tier::External,
        _ => return None,
    })
}

/// Hand `events` to `sink`, counted; `false` once the sink is closed.
async fn deliver(sink: &Sink, counters: &SourceCounters, events: Vec<Event>) -> bool {
    if events.is_empty() {
        return true;
    }
    let n = events.len() as u64;
    if sink.send(events).await.is_err() {
        return false;
    }
    SourceCounters::add(&counters.events, n);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_map_to_tiers() {
        for (medium, tier) in [
            ("GPU", Some(Tier::Device)),
            ("device", Some(Tier::Device)),
            ("CPU_PINNED", Some(Tier::Host)),
            ("CPU_TIER1", Some(Tier::Host)),
            ("CPU_TIER2", Some(Tier::Disk)),
            ("NVME", Some(Tier::Disk)),
            ("STORAGE", Some(Tier::Disk)),
            ("shared", Some(Tier::External)),
            ("NETWORK", Some(Tier::External)),
            ("TAPE", None),
        ] {
            assert_eq!(tier_of_medium(medium), tier, "{medium}");
        }
    }

    #[test]
    fn snapshot_names_every_counter() {
        let counters = SourceCounters::default();
        SourceCounters::add(&counters.gaps, 2);
        let snapshot = counters.snapshot();
        assert_eq!(snapshot.len(), 8);
        assert_eq!(snapshot["gaps"], 2);
        assert_eq!(snapshot["reconnects"], 0);
    }
}
