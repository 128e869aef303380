//! NATS: Dynamo's RouterEvent and KVBM's event batches (docs/events.md,
//! "Formats accepted").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use futures::StreamExt as _;

use crate::{
    Event, EventData, Sink, SourceCounters, SourceHandle, decode_kvbm_event, decode_router_event,
    deliver,
};

/// The subjects a [`NatsSource`] with none listens on: Dynamo's
/// RouterEvent and KVBM's batches.
pub const DEFAULT_SUBJECTS: [&str; 2] = ["namespace.*.component.*.kv-events", "kvbm.events"];

/// A NATS server to listen to. Messages on a `kvbm.` subject are KVBM
/// batches, any other subject carries RouterEvents. Events are attributed
/// to `model` and `tenant` when set (otherwise the guest places them by
/// its registrations).
#[derive(Clone, Debug)]
pub struct NatsSource {
    /// `nats://host:port`.
    pub url: String,
    /// Subjects (wildcards allowed); empty means [`DEFAULT_SUBJECTS`].
    pub subjects: Vec<String>,
    pub model: Option<String>,
    pub tenant: Option<String>,
    /// The model's block size, given to stored events that carry none (a
    /// RouterEvent never does): with `model`, the indexer keeps a tree for
    /// them without any worker registered.
    pub block_size: Option<u32>,
}

/// Longest wait between attempts to reach the server.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Start receiving events from `source` into `sink`. Must be called inside
/// a tokio runtime. The client connects in the background and, when the
/// server goes away, reconnects forever with exponential backoff (100 ms
/// doubling to 5 s), subscriptions restored; each reconnection is
/// counted. Messages published while it is away are lost (core NATS).
/// Order is kept per subject subscription, not across subscriptions.
pub fn spawn_nats(source: NatsSource, sink: Sink) -> SourceHandle {
    let counters = Arc::new(SourceCounters::default());
    let task = tokio::spawn(run(source, sink, counters.clone()));
    SourceHandle { task, counters }
}

async fn run(source: NatsSource, sink: Sink, counters: Arc<SourceCounters>) {
    let connected_before = Arc::new(AtomicBool::new(false));
    let on_event = counters.clone();
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(backoff)
        .event_callback(move |event| {
            let (counters, connected_before) = (on_event.clone(), connected_before.clone());
            async move {
                if let async_nats::Event::Connected = event
                    && connected_before.swap(true, Relaxed)
                {
                    SourceCounters::add(&counters.reconnects, 1);
                }
            }
        })
        .connect(source.url.as_str())
        .await;
    let client = match client {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(url = %source.url, "nats source: {e}");
            return;
        }
    };
    let subjects: Vec<String> = if source.subjects.is_empty() {
        DEFAULT_SUBJECTS.iter().map(|s| s.to_string()).collect()
    } else {
        source.subjects.clone()
    };
    let mut subscriptions = Vec::with_capacity(subjects.len());
    for subject in subjects {
        match client.subscribe(subject.clone()).await {
            Ok(subscription) => subscriptions.push(subscription),
            Err(e) => {
                tracing::warn!(url = %source.url, %subject, "nats source: cannot subscribe: {e}");
                return;
            }
        }
    }
    let mut messages = futures::stream::select_all(subscriptions);
    let (model, tenant) = (source.model.as_deref(), source.tenant.as_deref());
    while let Some(message) = messages.next().await {
        SourceCounters::add(&counters.messages, 1);
        let decoded = if message.subject.starts_with("kvbm.") {
            decode_kvbm_event(&message.payload, model, tenant)
        } else {
            decode_router_event(&message.payload, model, tenant)
        };
        match decoded {
            Ok(mut events) => {
                if let Some(size) = source.block_size {
                    with_block_size(&mut events, size);
                }
                if !deliver(&sink, &counters, events).await {
                    return;
                }
            }
            Err(e) => {
                SourceCounters::add(&counters.decode_errors, 1);
                tracing::debug!(subject = %message.subject, "nats source: {e}");
            }
        }
    }
}

/// Give `size` to the stored events that carry no block size.
fn with_block_size(events: &mut [Event], size: u32) {
    for event in events {
        if let EventData::Stored(stored) = &mut event.data {
            stored.block_size.get_or_insert(size);
        }
    }
}

/// The wait before reconnection attempt `attempts`.
fn backoff(attempts: usize) -> Duration {
    let shift = attempts.min(16) as u32;
    Duration::from_millis(100u64 << shift).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(6), MAX_BACKOFF);
        assert_eq!(backoff(usize::MAX), MAX_BACKOFF);
    }
}
