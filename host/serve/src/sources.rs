//! STAND-IN for `kvwasm-event-sources` (helper "sources"), the contract of
//! events-common.md; deleted when h-sources is merged.

use std::collections::BTreeMap;
use std::sync::Arc;

pub use kvwasm_host::subscriber::Event;

pub type Sink = tokio::sync::mpsc::Sender<Vec<Event>>;

#[derive(Default, Debug)]
pub struct SourceCounters {
    pub messages: std::sync::atomic::AtomicU64,
}

impl SourceCounters {
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        BTreeMap::from([(
            "messages",
            self.messages.load(std::sync::atomic::Ordering::Relaxed),
        )])
    }
}

pub struct SourceHandle {
    task: tokio::task::JoinHandle<()>,
    pub counters: Arc<SourceCounters>,
}

impl Drop for SourceHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct ZmqWorker {
    pub instance_id: u64,
    pub dp_rank: u32,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub model: String,
    pub tenant: String,
}

pub struct NatsSource {
    pub url: String,
    pub subjects: Vec<String>,
    pub model: Option<String>,
    pub tenant: Option<String>,
}

pub fn spawn_zmq(_worker: ZmqWorker, sink: Sink) -> SourceHandle {
    SourceHandle {
        task: tokio::spawn(async move { sink.closed().await }),
        counters: Arc::default(),
    }
}

pub fn spawn_nats(_source: NatsSource, sink: Sink) -> SourceHandle {
    SourceHandle {
        task: tokio::spawn(async move { sink.closed().await }),
        counters: Arc::default(),
    }
}
