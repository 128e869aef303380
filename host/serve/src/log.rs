//! The replay log (events-common.md, "Recovery (2)").
//!
//! Every event batch the sources deliver and every accepted state-changing
//! API request (`/register`, `/unregister`, `/restore`), in the order the
//! service saw them, so a guest instance that replaced a lost one can be
//! rebuilt. Bounded by `[serve].log_events`: past it the indexer's `/dump`
//! becomes the log's base and the events it covers are dropped.

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};

use kvwasm_host::subscriber::{Event, Request};

/// One logged step.
#[derive(Clone)]
pub(crate) enum Entry {
    Events(Arc<[Event]>),
    Request(Arc<Request>),
}

impl Entry {
    /// A `/register` or `/unregister`: kept through compaction, since a
    /// `/dump` holds no registrations.
    fn is_registration(&self) -> bool {
        matches!(self, Entry::Request(r) if r.path != RESTORE)
    }
}

/// The kvwasm extension that replaces an indexer's state with a `/dump`.
pub(crate) const RESTORE: &str = "/restore";

/// What a rebuild replays: `base` (a `/dump`, through `/restore`), then
/// `entries` in order.
pub(crate) struct Snapshot {
    pub base: Option<Arc<Vec<u8>>>,
    pub entries: Vec<(u64, Entry)>,
}

impl Snapshot {
    /// The event batches the snapshot replays: a queued batch in this range
    /// was replayed already. (Older queued batches were compacted away
    /// before this guest saw them, so they are still to be delivered.)
    pub fn covers(&self) -> Option<std::ops::RangeInclusive<u64>> {
        let (first, _) = self
            .entries
            .iter()
            .find(|(_, e)| matches!(e, Entry::Events(_)))?;
        let last = self.entries.last()?.0;
        Some(*first..=last)
    }
}

#[derive(Default)]
struct State {
    next_seq: u64,
    entries: VecDeque<(u64, Entry)>,
    /// Events held in `entries`.
    events: usize,
    base: Option<Arc<Vec<u8>>>,
    /// The newest event batch removed (compacted or dropped). Batches are
    /// removed oldest first, so every batch up to it is gone and every
    /// later one is held.
    removed_through: u64,
}

pub(crate) struct EventLog {
    state: Mutex<State>,
    limit: usize,
    /// Past this many events the oldest batches are dropped outright: the
    /// limit itself when no guest can compact the log (no indexer), twice
    /// it when one should but has not (its `/dump` keeps failing).
    hard_limit: usize,
}

impl EventLog {
    pub fn new(limit: usize, compacted: bool) -> EventLog {
        EventLog {
            state: Mutex::default(),
            limit,
            hard_limit: if compacted {
                limit.saturating_mul(2)
            } else {
                limit
            },
        }
    }

    /// Append `entry`; its sequence number (from 1).
    pub fn push(&self, entry: Entry) -> u64 {
        let mut state = self.lock();
        state.next_seq += 1;
        let seq = state.next_seq;
        if let Entry::Events(events) = &entry {
            state.events += events.len();
        }
        state.entries.push_back((seq, entry));
        while state.events > self.hard_limit {
            let Some(oldest) = state
                .entries
                .iter()
                .position(|(_, e)| matches!(e, Entry::Events(_)))
            else {
                break;
            };
            if let Some((seq, Entry::Events(events))) = state.entries.remove(oldest) {
                state.events -= events.len();
                state.removed_through = state.removed_through.max(seq);
            }
        }
        seq
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            base: state.base.clone(),
            entries: state.entries.iter().cloned().collect(),
        }
    }

    /// The event batches logged in `range`, in order; `None` if the log
    /// no longer holds all of them.
    pub fn batches_in(&self, range: &RangeInclusive<u64>) -> Option<Vec<(u64, Arc<[Event]>)>> {
        let state = self.lock();
        if state.removed_through >= *range.start() {
            return None;
        }
        let batches = state
            .entries
            .iter()
            .filter(|(seq, _)| range.contains(seq))
            .filter_map(|(seq, entry)| match entry {
                Entry::Events(events) => Some((*seq, events.clone())),
                Entry::Request(_) => None,
            })
            .collect();
        Some(batches)
    }

    /// Events held.
    pub fn events(&self) -> usize {
        self.lock().events
    }

    pub fn over_limit(&self) -> bool {
        self.events() > self.limit
    }

    /// `dump` now stands for every entry up to `upto` (the last event batch
    /// the dumping guest applied, so none of them is still queued for it):
    /// drop them, except registrations (a dump has none), which replay
    /// after the base.
    pub fn compact(&self, dump: Vec<u8>, upto: u64) {
        let mut state = self.lock();
        let mut dropped = 0;
        let mut removed_through = state.removed_through;
        state.entries.retain(|(seq, entry)| {
            let keep = *seq > upto || entry.is_registration();
            if !keep && let Entry::Events(events) = entry {
                dropped += events.len();
                removed_through = removed_through.max(*seq);
            }
            keep
        });
        state.events -= dropped;
        state.removed_through = removed_through;
        state.base = Some(Arc::new(dump));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvwasm_host::subscriber::{EventData, SourceKind};

    fn batch(n: usize) -> Entry {
        let event = Event {
            worker_id: 1,
            dp_rank: 0,
            event_id: 0,
            source: SourceKind::Zmq,
            model: None,
            tenant: None,
            data: EventData::Cleared,
        };
        Entry::Events(vec![event; n].into())
    }

    fn request(path: &str) -> Entry {
        Entry::Request(Arc::new(Request {
            method: "POST".into(),
            path: path.into(),
            query: String::new(),
            body: Vec::new(),
        }))
    }

    #[test]
    fn without_compaction_the_oldest_batches_go_past_the_limit() {
        let log = EventLog::new(5, false);
        log.push(batch(3));
        log.push(request("/register"));
        log.push(batch(2));
        assert_eq!(log.events(), 5);
        log.push(batch(1));
        assert_eq!(log.events(), 3);
        let seqs: Vec<u64> = log.snapshot().entries.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [2, 3, 4]);
        // A compacting log tolerates twice the limit before it drops.
        let log = EventLog::new(5, true);
        log.push(batch(10));
        assert_eq!(log.events(), 10);
        log.push(batch(1));
        assert_eq!(log.events(), 1);
    }

    #[test]
    fn compaction_keeps_registrations_and_later_entries() {
        let log = EventLog::new(5, true);
        assert_eq!(log.push(request("/register")), 1);
        assert_eq!(log.push(batch(4)), 2);
        assert_eq!(log.push(request(RESTORE)), 3);
        assert!(!log.over_limit());
        assert_eq!(log.push(batch(3)), 4);
        assert!(log.over_limit());
        log.push(batch(2));
        log.compact(b"dump".to_vec(), 4);
        assert_eq!(log.events(), 2);
        assert!(!log.over_limit());
        let snap = log.snapshot();
        assert_eq!(snap.base.as_deref().map(Vec::as_slice), Some(&b"dump"[..]));
        let seqs: Vec<u64> = snap.entries.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [1, 5]);
        assert_eq!(snap.covers(), Some(5..=5));
        assert!(log.batches_in(&(4..=5)).is_none(), "batch 4 was compacted");
        let held: Vec<u64> = log
            .batches_in(&(5..=9))
            .unwrap()
            .iter()
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(held, [5]);
    }
}
