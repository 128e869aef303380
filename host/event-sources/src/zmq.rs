//! A ZMQ worker: SUB to its publisher, gaps filled through its replay
//! socket (docs/events.md, "Formats accepted").

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use zeromq::{Socket as _, SocketEvent, SocketRecv as _, SocketSend as _, ZmqMessage};

use crate::{Sink, SourceCounters, SourceHandle, decode_zmq_batch, deliver};

/// A worker registered through /register (or [serve.workers]): SUB to
/// `endpoint`, replay through `replay_endpoint` (the publisher's ROUTER)
/// when a gap is seen. Every event is tagged with worker_id = instance_id,
/// dp_rank (a batch's own rank overrides it), model and tenant.
#[derive(Clone, Debug)]
pub struct ZmqWorker {
    pub instance_id: u64,
    pub dp_rank: u32,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub model: String,
    pub tenant: String,
}

/// How long a replay waits for the publisher's next reply before giving up.
const REPLAY_REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// Backoff between attempts to reach a publisher that is not up (the
/// socket itself retries within each attempt).
const RECONNECT_BACKOFF: Duration = Duration::from_millis(500);

/// Start receiving `worker`'s events into `sink`. Must be called inside a
/// tokio runtime. The source connects (and reconnects) forever; it stops
/// when dropped or when the sink is closed.
pub fn spawn_zmq(worker: ZmqWorker, sink: Sink) -> SourceHandle {
    let counters = Arc::new(SourceCounters::default());
    let task = tokio::spawn(run(worker, sink, counters.clone()));
    SourceHandle { task, counters }
}

async fn run(worker: ZmqWorker, sink: Sink, counters: Arc<SourceCounters>) {
    let mut socket = zeromq::SubSocket::new();
    let mut monitor = socket.monitor();
    if let Err(e) = socket.subscribe("").await {
        tracing::warn!(endpoint = %worker.endpoint, "zmq source: cannot subscribe: {e}");
        return;
    }
    while let Err(e) = socket.connect(&worker.endpoint).await {
        tracing::warn!(endpoint = %worker.endpoint, "zmq source: cannot connect (retrying): {e}");
        tokio::time::sleep(RECONNECT_BACKOFF).await;
    }
    let mut source = ZmqSource {
        worker,
        sink,
        counters,
        sequence: Sequence::default(),
    };
    let mut connections = 0u64;
    loop {
        tokio::select! {
            message = socket.recv() => match message {
                Ok(message) => {
                    if !source.on_message(message).await {
                        return;
                    }
                }
                // The peer went away; the socket reconnects by itself.
                Err(e) => tracing::debug!(endpoint = %source.worker.endpoint, "zmq source: {e}"),
            },
            Some(event) = monitor.next() => {
                if let SocketEvent::Connected(..) = event {
                    connections += 1;
                    if connections > 1 {
                        SourceCounters::add(&source.counters.reconnects, 1);
                    }
                }
            }
        }
    }
}

/// Where a message's sequence number stands against the last one seen.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Next in order: deliver.
    Next,
    /// Messages `from..seq` were missed: replay them, then deliver this.
    Gap { from: u64 },
    /// Seen before (replayed already): skip.
    Duplicate,
    /// Seq 0 after a later one: the publisher restarted; deliver.
    Restart,
}

/// The last sequence number delivered.
#[derive(Debug, Default)]
struct Sequence {
    last: Option<u64>,
}

impl Sequence {
    fn step(&self, seq: u64) -> Step {
        match self.last {
            None if seq == 0 => Step::Next,
            None => Step::Gap { from: 0 },
            Some(last) if seq == 0 && last > 0 => Step::Restart,
            Some(last) if seq <= last => Step::Duplicate,
            Some(last) if seq == last + 1 => Step::Next,
            Some(last) => Step::Gap { from: last + 1 },
        }
    }
}

struct ZmqSource {
    worker: ZmqWorker,
    sink: Sink,
    counters: Arc<SourceCounters>,
    sequence: Sequence,
}

impl ZmqSource {
    /// Handle one live message `[topic, seq, payload]`; `false` once the
    /// sink is closed.
    async fn on_message(&mut self, message: ZmqMessage) -> bool {
        SourceCounters::add(&self.counters.messages, 1);
        let frames = message.into_vec();
        let (seq, payload) = match &frames[..] {
            [_topic, seq, payload] => match seq_of(seq) {
                Some(seq) => (seq, payload),
                None => return self.decode_error("sequence frame is not 8 bytes"),
            },
            _ => return self.decode_error("a message has 3 frames"),
        };
        match self.sequence.step(seq) {
            Step::Duplicate => {
                SourceCounters::add(&self.counters.duplicates_skipped, 1);
                return true;
            }
            Step::Restart => SourceCounters::add(&self.counters.restarts, 1),
            Step::Gap { from } => {
                SourceCounters::add(&self.counters.gaps, 1);
                if !self.replay(from, seq).await {
                    return false;
                }
                if self.sequence.step(seq) == Step::Duplicate {
                    SourceCounters::add(&self.counters.duplicates_skipped, 1);
                    return true;
                }
            }
            Step::Next => {}
        }
        self.accept(seq, payload).await
    }

    /// Record `seq` as delivered and hand its events to the sink.
    async fn accept(&mut self, seq: u64, payload: &[u8]) -> bool {
        self.sequence.last = Some(seq);
        match decode_zmq_batch(payload, &self.worker, seq) {
            Ok(events) => deliver(&self.sink, &self.counters, events).await,
            Err(e) => self.decode_error(&e.0),
        }
    }

    fn decode_error(&self, why: &str) -> bool {
        SourceCounters::add(&self.counters.decode_errors, 1);
        tracing::debug!(endpoint = %self.worker.endpoint, "zmq source: bad message: {why}");
        true
    }

    /// Ask the publisher's replay socket for everything from `from` on and
    /// deliver what is new, until its end marker. A replay that cannot be
    /// had (no replay endpoint, no answer) leaves the gap; `until` is the
    /// live message that revealed it. `false` once the sink is closed.
    async fn replay(&mut self, from: u64, until: u64) -> bool {
        let Some(endpoint) = self.worker.replay_endpoint.clone() else {
            tracing::debug!(endpoint = %self.worker.endpoint, from, until, "zmq source: gap, no replay endpoint");
            return true;
        };
        let mut options = zeromq::SocketOptions::default();
        options.connect_timeout(REPLAY_REPLY_TIMEOUT);
        let mut dealer = zeromq::DealerSocket::with_options(options);
        let request = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
        let request = ZmqMessage::try_from(request).expect("two frames");
        let asked = async {
            dealer.connect(&endpoint).await?;
            dealer.send(request).await
        };
        if let Err(e) = tokio::time::timeout(REPLAY_REPLY_TIMEOUT, asked)
            .await
            .unwrap_or(Err(zeromq::ZmqError::NoMessage))
        {
            tracing::warn!(%endpoint, from, until, "zmq source: replay request failed: {e}");
            return true;
        }
        loop {
            let reply = match tokio::time::timeout(REPLAY_REPLY_TIMEOUT, dealer.recv()).await {
                Ok(Ok(reply)) => reply.into_vec(),
                Ok(Err(e)) => {
                    tracing::warn!(%endpoint, "zmq source: replay ended early: {e}");
                    return true;
                }
                Err(_) => {
                    tracing::warn!(%endpoint, "zmq source: replay timed out");
                    return true;
                }
            };
            // vLLM 0.33: [b"", topic, seq, payload]; older vLLM and SGLang:
            // [b"", seq, payload]. An empty payload ends the replay.
            let (seq, payload) = match &reply[..] {
                [_, _, seq, payload] | [_, seq, payload] => (seq_of(seq), payload),
                _ => {
                    self.decode_error("a replay reply has 3 or 4 frames");
                    continue;
                }
            };
            if payload.is_empty() {
                return true;
            }
            let Some(seq) = seq else {
                self.decode_error("replayed sequence frame is not 8 bytes");
                continue;
            };
            SourceCounters::add(&self.counters.messages, 1);
            if self.sequence.last.is_some_and(|last| seq <= last) {
                SourceCounters::add(&self.counters.duplicates_skipped, 1);
                continue;
            }
            SourceCounters::add(&self.counters.replayed, 1);
            if !self.accept(seq, payload).await {
                return false;
            }
        }
    }
}

/// An 8-byte big-endian sequence number.
fn seq_of(frame: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(frame.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_steps() {
        let mut s = Sequence::default();
        assert_eq!(s.step(0), Step::Next);
        assert_eq!(
            s.step(3),
            Step::Gap { from: 0 },
            "a first seq > 0 is a gap from 0"
        );
        s.last = Some(4);
        assert_eq!(s.step(5), Step::Next);
        assert_eq!(s.step(7), Step::Gap { from: 5 });
        assert_eq!(s.step(4), Step::Duplicate);
        assert_eq!(s.step(2), Step::Duplicate);
        assert_eq!(s.step(0), Step::Restart);
        s.last = Some(0);
        assert_eq!(s.step(0), Step::Duplicate);
    }

    #[test]
    fn sequence_frames_are_8_bytes_big_endian() {
        assert_eq!(seq_of(&258u64.to_be_bytes()), Some(258));
        assert_eq!(seq_of(&[1, 2]), None);
        assert_eq!(seq_of(&[]), None);
    }
}
