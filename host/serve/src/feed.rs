//! The feed: sources → one fan-out task → a bounded queue per guest → one
//! std thread per guest calling `on-batch`.
//!
//! Sources never wait for a guest: the fan-out only appends to the log and
//! offers each batch to each queue. A batch that does not fit a guest's
//! queue (it is full, or the batch is larger than the queue) is deferred:
//! the guest's thread takes it, and every later batch until it catches up,
//! from the log instead, in order and in `on-batch` calls of at most
//! `batch_events`. Only a deferred batch the log no longer holds is lost;
//! the guest is then marked diverged (`/health`, `/metrics`). Every call
//! into a guest (batches from its thread, API requests from
//! `spawn_blocking`) goes through its [`GuestCell`], which first rebuilds a
//! replaced instance from the log.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, mpsc};

use kvwasm_host::subscriber::Event;

use crate::cell::{Batch, Guest, GuestCell};
use crate::log::{Entry, EventLog};

/// What a guest's queue carries.
pub(crate) enum Queued {
    Batch(Batch),
    /// Batches were deferred: take them from the log.
    FromLog,
}

/// The queues and the threads draining them.
pub(crate) struct Feed {
    pub cells: Vec<Arc<GuestCell>>,
    queues: Vec<mpsc::Sender<Queued>>,
    queue_events: usize,
    pub log: Arc<EventLog>,
    pub events_in: AtomicU64,
}

impl Feed {
    /// Cells for `guests` (the API guest, if any, first: it compacts the
    /// log) and their queues; the threads start with [`Feed::start`].
    pub fn new(
        guests: Vec<Arc<dyn Guest>>,
        settings: &crate::ServeConfig,
    ) -> (Feed, Vec<mpsc::Receiver<Queued>>) {
        let compacted = guests.first().is_some_and(|g| g.serves_http());
        let log = Arc::new(EventLog::new(settings.log_events, compacted));
        let mut cells = Vec::new();
        let mut queues = Vec::new();
        let mut receivers = Vec::new();
        for (i, guest) in guests.into_iter().enumerate() {
            let compacts = i == 0 && compacted;
            cells.push(Arc::new(GuestCell::new(
                guest,
                log.clone(),
                settings.batch_events,
                compacts,
            )));
            let (tx, rx) = mpsc::channel();
            queues.push(tx);
            receivers.push(rx);
        }
        let feed = Feed {
            cells,
            queues,
            queue_events: settings.queue_events,
            log,
            events_in: AtomicU64::new(0),
        };
        (feed, receivers)
    }

    /// Log `events` and offer them to every guest's queue.
    pub fn fan_out(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let n = events.len();
        self.events_in.fetch_add(n as u64, Relaxed);
        let events: Arc<[Event]> = events.into();
        let seq = self.log.push(Entry::Events(events.clone()));
        for (cell, queue) in self.cells.iter().zip(&self.queues) {
            // Held while queueing: the guest's thread takes the deferred
            // range under it, so no batch overtakes one deferred before it.
            let mut deferred = cell.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((range, events)) = deferred.as_mut() {
                *range = *range.start()..=seq;
                *events += n;
                cell.stats.deferred.fetch_add(n as u64, Relaxed);
                continue;
            }
            let queued = &cell.stats.queued;
            let admitted = queued
                .fetch_update(Relaxed, Relaxed, |q| {
                    (q + n <= self.queue_events).then_some(q + n)
                })
                .is_ok();
            let sent = if admitted {
                queue.send(Queued::Batch((seq, events.clone())))
            } else {
                *deferred = Some((seq..=seq, n));
                cell.stats.deferred.fetch_add(n as u64, Relaxed);
                queue.send(Queued::FromLog)
            };
            if sent.is_err() {
                // The guest's thread is gone (the service is stopping).
                if admitted {
                    queued.fetch_sub(n, Relaxed);
                }
                cell.stats.dropped.fetch_add(n as u64, Relaxed);
            }
        }
    }

    /// One thread per guest draining its queue.
    pub fn start(&self, receivers: Vec<mpsc::Receiver<Queued>>) -> anyhow::Result<()> {
        for (cell, rx) in self.cells.iter().zip(receivers) {
            let cell = cell.clone();
            std::thread::Builder::new()
                .name(format!("kvwasm-feed-{}", cell.name()))
                .spawn(move || drain(&cell, &rx))?;
        }
        Ok(())
    }
}

/// Take whatever is queued (up to about a batch), deliver it, repeat until
/// the feed is gone. Deferred batches are taken from the log in their turn.
fn drain(cell: &GuestCell, rx: &mpsc::Receiver<Queued>) {
    let mut next = rx.recv().ok();
    while let Some(first) = next.take() {
        let mut items = Vec::new();
        let mut taken = 0;
        let mut item = Some(first);
        while let Some(Queued::Batch(batch)) = item {
            taken += batch.1.len();
            items.push(batch);
            item = None;
            if taken < cell.batch_events {
                item = rx.try_recv().ok();
            }
        }
        cell.stats.queued.fetch_sub(taken, Relaxed);
        if !items.is_empty() {
            cell.deliver(&items);
        }
        if let Some(Queued::FromLog) = item {
            cell.catch_up();
        }
        next = rx.recv().ok();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The feed against an in-memory guest that can be made to lose its
    //! instance, like a trapping guest.

    use super::*;
    use crate::cell::request;
    use crate::log::RESTORE;
    use kvwasm_host::KvError;
    use kvwasm_host::deadline::Deadline;
    use kvwasm_host::subscriber::{EventData, Request, Response, SourceKind};
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// Keeps the ids of the events it was given and the registrations;
    /// `/dump` and `/restore` move the ids as JSON. Any batch holding an
    /// event with id `TRAP` loses the instance while `traps` > 0; so does
    /// a request with body `trap`, and one with body `hang` waits for
    /// `hang` first. After a loss, the next `failed_starts` calls fail
    /// without an instance, as when a start traps or calls back off.
    #[derive(Default)]
    pub(crate) struct Recorder {
        pub state: Mutex<(u64, Vec<u64>, Vec<String>)>,
        pub batch_sizes: Mutex<Vec<usize>>,
        pub traps: AtomicUsize,
        /// `POST /restore` calls still to lose the instance.
        pub restore_traps: AtomicUsize,
        pub failed_starts: AtomicUsize,
        /// What `backing_off` answers, and how often it was asked.
        pub backing_off: std::sync::atomic::AtomicBool,
        pub backing_off_asked: AtomicUsize,
        /// No instance is running (after a loss, until a start succeeds).
        pub down: std::sync::atomic::AtomicBool,
        pub gate: Mutex<()>,
        pub hang: Mutex<()>,
        /// Requests handled (replays included) and hanging now.
        pub handled: AtomicUsize,
        pub hanging: AtomicUsize,
        /// Each call's deadline; 0: 10 s.
        pub timeout_ms: AtomicU64,
    }

    pub(crate) const TRAP: u64 = 666;

    impl Recorder {
        pub fn ids(&self) -> Vec<u64> {
            self.state.lock().unwrap().1.clone()
        }
        fn lose(&self) -> KvError {
            let mut s = self.state.lock().unwrap();
            *s = (s.0 + 1, Vec::new(), Vec::new());
            self.down.store(true, Relaxed);
            KvError::Trapped("unreachable".into())
        }
        /// Start an instance if none is running, unless this start fails.
        fn start(&self) -> Result<(), KvError> {
            if self.down.load(Relaxed) {
                if take_one(&self.failed_starts) {
                    return Err(KvError::Trapped("the start trapped".into()));
                }
                self.down.store(false, Relaxed);
            }
            Ok(())
        }
    }

    /// Decrement `count` if it is above zero; whether it was.
    fn take_one(count: &AtomicUsize) -> bool {
        count
            .fetch_update(Relaxed, Relaxed, |t| t.checked_sub(1))
            .is_ok()
    }

    impl Guest for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn serves_http(&self) -> bool {
            true
        }
        fn on_batch(&self, events: &mut [Event]) -> Result<(), KvError> {
            self.replay(events)
        }
        fn replay(&self, events: &[Event]) -> Result<(), KvError> {
            let _gate = self.gate.lock().unwrap();
            self.start()?;
            if events.iter().any(|e| e.event_id == TRAP) && take_one(&self.traps) {
                return Err(self.lose());
            }
            self.batch_sizes.lock().unwrap().push(events.len());
            let mut s = self.state.lock().unwrap();
            s.1.extend(events.iter().map(|e| e.event_id));
            Ok(())
        }
        fn handle(&self, r: &Request, _deadline: Deadline) -> Result<Response, KvError> {
            self.handled.fetch_add(1, Relaxed);
            self.start()?;
            let body = String::from_utf8_lossy(&r.body).into_owned();
            if body == "hang" {
                self.hanging.fetch_add(1, Relaxed);
                drop(self.hang.lock().unwrap());
                self.hanging.fetch_sub(1, Relaxed);
            }
            if body == "trap" || (r.path == "/restore" && take_one(&self.restore_traps)) {
                return Err(self.lose());
            }
            let mut s = self.state.lock().unwrap();
            let (status, body) = match (r.method.as_str(), r.path.as_str()) {
                ("POST", "/register") if s.2.contains(&body) => {
                    (409, "{\"error\": \"dup\"}".into())
                }
                ("POST", "/register") => {
                    s.2.push(body);
                    (201, "{}".into())
                }
                ("GET", "/dump") => (200, serde_json::to_string(&s.1).unwrap()),
                ("POST", "/restore") => {
                    s.1 = serde_json::from_str(&body).unwrap();
                    (200, "{}".into())
                }
                ("GET", "/query") => (200, serde_json::to_string(&(&s.1, &s.2)).unwrap()),
                _ => (404, "{\"error\": \"no\"}".into()),
            };
            Ok(Response {
                status,
                content_type: None,
                body: body.into_bytes(),
            })
        }
        fn deadline(&self) -> Deadline {
            match self.timeout_ms.load(Relaxed) {
                0 => Deadline::after_ms(10_000),
                ms => Deadline::after_ms(ms),
            }
        }
        fn generation(&self) -> u64 {
            self.state.lock().unwrap().0
        }
        fn is_live(&self) -> bool {
            !self.down.load(Relaxed)
        }
        fn backing_off(&self) -> bool {
            self.backing_off_asked.fetch_add(1, Relaxed);
            self.backing_off.load(Relaxed)
        }
    }

    pub(crate) fn events(ids: impl IntoIterator<Item = u64>) -> Vec<Event> {
        ids.into_iter()
            .map(|event_id| Event {
                worker_id: 1,
                dp_rank: 0,
                event_id,
                source: SourceKind::Zmq,
                model: None,
                tenant: None,
                data: EventData::Cleared,
            })
            .collect()
    }

    fn settings(queue_events: usize, batch_events: usize, log_events: usize) -> crate::ServeConfig {
        crate::ServeConfig {
            queue_events,
            batch_events,
            log_events,
            ..Default::default()
        }
    }

    pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A started feed of one recorder that registered `w1`, its log
    /// bounded by `log_events`.
    fn registered(log_events: usize) -> (Arc<Recorder>, Feed, Arc<GuestCell>) {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, log_events));
        let cell = feed.cells[0].clone();
        cell.handle(request("POST", "/register", b"w1".to_vec()))
            .unwrap();
        feed.start(rx).unwrap();
        (guest, feed, cell)
    }

    /// What `/query` answers: the event ids and the registered workers.
    fn query(cell: &GuestCell) -> (Vec<u64>, Vec<String>) {
        let query = cell.handle(request("GET", "/query", Vec::new())).unwrap();
        serde_json::from_slice(&query.body).unwrap()
    }

    #[test]
    fn batches_are_merged_up_to_batch_events_and_a_full_queue_defers_to_the_log() {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(10, 4, 1000));
        // Not started: the queue fills up to 10 events; the batch that does
        // not fit, and every one after it (even one that would), are
        // deferred to the log.
        feed.fan_out(events(0..3));
        feed.fan_out(events(3..9));
        feed.fan_out(events(9..12));
        feed.fan_out(events(12..13));
        let stats = &feed.cells[0].stats;
        assert_eq!(stats.queued.load(Relaxed), 9);
        assert_eq!(stats.deferred.load(Relaxed), 4);
        feed.start(rx).unwrap();
        wait_for("delivery", || guest.ids().len() == 13);
        assert_eq!(
            guest.ids(),
            (0..13).collect::<Vec<_>>(),
            "each once, in order"
        );
        let sizes = guest.batch_sizes.lock().unwrap().clone();
        assert!(sizes.iter().all(|&s| s <= 4), "{sizes:?}");
        assert_eq!(feed.events_in.load(Relaxed), 13);
        assert_eq!(stats.queued.load(Relaxed), 0);
        assert_eq!(stats.dropped.load(Relaxed), 0);
        assert!(!feed.cells[0].diverged());
        // Queued again once caught up.
        feed.fan_out(events(13..14));
        wait_for("a queued batch", || guest.ids().len() == 14);
        assert_eq!(stats.deferred.load(Relaxed), 4);
    }

    /// A batch larger than the whole queue is delivered from the log in
    /// `batch_events` calls, and replayed the same way.
    #[test]
    fn a_batch_larger_than_the_queue_is_delivered_in_full_in_bounded_calls() {
        let (guest, feed, cell) = registered(1_000_000);
        let big = 80_000;
        feed.fan_out(events(0..big));
        feed.fan_out(events([big]));
        wait_for("delivery", || guest.ids().len() == big as usize + 1);
        assert_eq!(guest.ids(), (0..=big).collect::<Vec<_>>());
        assert_eq!(cell.stats.dropped.load(Relaxed), 0);
        // The last batch is deferred too unless the catch-up came first.
        assert!(cell.stats.deferred.load(Relaxed) >= big);
        let max_call = |g: &Recorder| g.batch_sizes.lock().unwrap().iter().copied().max();
        assert_eq!(max_call(&guest), Some(100));
        // The rebuild replays it in calls of the same size.
        guest.batch_sizes.lock().unwrap().clear();
        assert!(
            cell.handle(request("POST", "/x", b"trap".to_vec()))
                .is_err()
        );
        let (ids, _) = query(&cell);
        assert_eq!(ids.len(), big as usize + 1);
        assert_eq!(max_call(&guest), Some(100));
    }

    /// Deferred batches that the log dropped before the guest took them
    /// are lost to it: counted, and the guest is marked diverged (its
    /// API refuses) until a `/restore` replaces its state.
    #[test]
    fn deferred_batches_gone_from_the_log_mark_the_guest_diverged() {
        let guest = Arc::new(Recorder::default());
        // The recorder serves http, so the log holds up to 2 × 4 events
        // before it drops its oldest batches.
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(2, 100, 4));
        let cell = feed.cells[0].clone();
        feed.fan_out(events(0..2));
        feed.fan_out(events(2..7));
        feed.fan_out(events(7..11));
        assert_eq!(cell.stats.deferred.load(Relaxed), 9);
        feed.start(rx).unwrap();
        wait_for("the loss", || cell.diverged());
        assert_eq!(cell.stats.dropped.load(Relaxed), 9);
        match cell.handle(request("GET", "/query", Vec::new())) {
            Err(KvError::Unavailable(why)) => assert!(why.contains("lost events"), "{why}"),
            other => panic!("expected a refusal while diverged, got {other:?}"),
        }
        let restored = cell
            .handle(request("POST", RESTORE, b"[42]".to_vec()))
            .unwrap();
        assert_eq!(restored.status, 200);
        assert!(!cell.diverged());
        assert_eq!(query(&cell).0, [42]);
    }

    #[test]
    fn a_lost_instance_is_rebuilt_from_the_log_with_requests_in_order() {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, 1000));
        let cell = feed.cells[0].clone();
        assert_eq!(
            cell.handle(request("POST", "/register", b"w1".to_vec()))
                .unwrap()
                .status,
            201
        );
        // Refused: not logged.
        assert_eq!(
            cell.handle(request("POST", "/register", b"w1".to_vec()))
                .unwrap()
                .status,
            409
        );
        feed.start(rx).unwrap();
        feed.fan_out(events(0..5));
        wait_for("first batch", || guest.ids().len() == 5);
        guest.traps.store(1, Relaxed);
        feed.fan_out(events([5, TRAP, 7]));
        feed.fan_out(events(8..10));
        wait_for("rebuild", || {
            cell.stats.rebuilds.load(Relaxed) == 1 && guest.ids().len() == 10
        });
        let (ids, workers) = query(&cell);
        assert_eq!(
            ids,
            [0, 1, 2, 3, 4, 5, TRAP, 7, 8, 9],
            "each event exactly once"
        );
        assert_eq!(workers, ["w1"]);
        assert_eq!(guest.generation(), 1);
    }

    #[test]
    fn an_entry_that_kills_every_instance_is_skipped_on_rebuild() {
        let guest = Arc::new(Recorder::default());
        let (feed, rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, 1000));
        feed.start(rx).unwrap();
        guest.traps.store(2, Relaxed);
        feed.fan_out(events([1, TRAP]));
        feed.fan_out(events([3]));
        wait_for("rebuild", || guest.ids() == [3]);
        let cell = &feed.cells[0];
        assert_eq!(cell.stats.rebuilds.load(Relaxed), 2);
        assert_eq!(guest.generation(), 2);
    }

    /// A rebuild whose instance will not start (its start traps, or calls
    /// back off) stops and is tried again later: no entry is skipped, no
    /// batch reaches a fresh instance ahead of the log, and the API refuses
    /// rather than answer from an empty state.
    #[test]
    fn a_rebuild_whose_instance_will_not_start_is_retried_not_skipped() {
        let (guest, feed, cell) = registered(1000);
        feed.fan_out(events(0..3));
        wait_for("first batch", || guest.ids().len() == 3);
        // The batch holding TRAP loses the instance; the next three starts
        // fail, then one succeeds.
        guest.traps.store(1, Relaxed);
        guest.failed_starts.store(3, Relaxed);
        feed.fan_out(events([3, TRAP]));
        wait_for("the failed rebuild", || {
            guest.failed_starts.load(Relaxed) == 2
        });
        match cell.handle(request("GET", "/query", Vec::new())) {
            Err(KvError::Unavailable(why)) => assert!(why.contains("no running instance"), "{why}"),
            other => panic!("expected a refusal while no instance starts, got {other:?}"),
        }
        assert_eq!(guest.failed_starts.load(Relaxed), 1);
        // While the guest backs off, a batch is not even worth a rebuild.
        guest.backing_off.store(true, Relaxed);
        let rebuilds = cell.stats.rebuilds.load(Relaxed);
        let asked = guest.backing_off_asked.load(Relaxed);
        feed.fan_out(events([5]));
        wait_for("the back-off consulted", || {
            guest.backing_off_asked.load(Relaxed) > asked
        });
        drop(cell.lock());
        assert_eq!(cell.stats.rebuilds.load(Relaxed), rebuilds);
        assert_eq!(guest.failed_starts.load(Relaxed), 1, "no start was tried");
        guest.backing_off.store(false, Relaxed);
        // This batch's rebuild fails to start too; it waits in the log.
        feed.fan_out(events([6]));
        wait_for("the last failed start", || {
            guest.failed_starts.load(Relaxed) == 0
        });
        feed.fan_out(events([7]));
        wait_for("the rebuild", || guest.ids().len() == 8);
        let (ids, workers) = query(&cell);
        assert_eq!(
            ids,
            [0, 1, 2, 3, TRAP, 5, 6, 7],
            "each event exactly once, in order"
        );
        assert_eq!(
            workers,
            ["w1"],
            "the registration was replayed, not skipped"
        );
    }

    /// A log base whose restore kills every fresh instance is skipped like
    /// a poisoned entry: the rebuild goes on with what the log holds after
    /// it.
    #[test]
    fn a_base_that_kills_every_instance_is_skipped_on_rebuild() {
        let (guest, feed, cell) = registered(4);
        feed.fan_out(events(0..3));
        feed.fan_out(events(3..6));
        wait_for("compaction", || feed.log.events() == 0);
        feed.fan_out(events(6..8));
        wait_for("later events", || guest.ids().len() == 8);
        guest.restore_traps.store(usize::MAX, Relaxed);
        assert!(
            cell.handle(request("POST", "/x", b"trap".to_vec()))
                .is_err()
        );
        let (ids, workers) = query(&cell);
        assert_eq!(ids, [6, 7], "the events after the base");
        assert_eq!(workers, ["w1"]);
        assert_eq!(cell.stats.rebuilds.load(Relaxed), 2);
    }

    #[test]
    fn past_log_events_the_log_is_compacted_into_a_dump_and_replay_restores_it() {
        let (guest, feed, cell) = registered(4);
        feed.fan_out(events(0..3));
        wait_for("first", || guest.ids().len() == 3);
        feed.fan_out(events(3..6));
        wait_for("second", || guest.ids().len() == 6);
        wait_for("compaction", || feed.log.events() == 0);
        feed.fan_out(events(6..8));
        wait_for("third", || guest.ids().len() == 8);
        assert_eq!(feed.log.events(), 2);
        // Lose the instance through the API: the next call rebuilds it from
        // the base dump, the registration and the later events.
        assert!(
            cell.handle(request("POST", "/x", b"trap".to_vec()))
                .is_err()
        );
        let (ids, workers) = query(&cell);
        assert_eq!(ids, (0..8).collect::<Vec<_>>());
        assert_eq!(workers, ["w1"]);
    }

    /// Requests queued behind a call that hangs give up at their own
    /// deadline: they are answered while the hung call still holds the
    /// guest (no verdict depends on how long anything took).
    #[test]
    fn requests_waiting_behind_a_hung_call_give_up_at_their_own_deadline() {
        let guest = Arc::new(Recorder::default());
        guest.timeout_ms.store(200, Relaxed);
        let (feed, _rx) = Feed::new(vec![guest.clone()], &settings(1000, 100, 1000));
        let cell = feed.cells[0].clone();
        let hang = guest.hang.lock().unwrap();
        let hung = {
            let cell = cell.clone();
            std::thread::spawn(move || cell.handle(request("GET", "/query", b"hang".to_vec())))
        };
        wait_for("the hung call", || guest.hanging.load(Relaxed) == 1);
        let waiting: Vec<_> = (0..20)
            .map(|_| {
                let cell = cell.clone();
                std::thread::spawn(move || cell.handle(request("GET", "/query", Vec::new())))
            })
            .collect();
        for waiter in waiting {
            match waiter.join().unwrap() {
                Err(KvError::Timeout(200)) => {}
                other => panic!("expected a refusal at the deadline, got {other:?}"),
            }
        }
        assert_eq!(
            guest.hanging.load(Relaxed),
            1,
            "still hung when all were answered"
        );
        assert_eq!(
            guest.handled.load(Relaxed),
            1,
            "no waiter reached the guest"
        );
        drop(hang);
        assert_eq!(hung.join().unwrap().unwrap().status, 200);
    }

    /// A guest that loses its instance in every `on-batch` backs off after
    /// 3 losses, although each rebuild replays a `/register` that succeeds;
    /// while it backs off, nothing is rebuilt.
    #[test]
    fn batches_losing_every_instance_start_the_back_off_within_3_losses() {
        let (guest, feed, cell) = registered(1000);
        guest.traps.store(usize::MAX, Relaxed);
        // Lost live (1), and again replaying it (2): skipped.
        feed.fan_out(events([TRAP]));
        wait_for("the rebuild", || cell.stats.rebuilds.load(Relaxed) == 2);
        assert_eq!(cell.stats.backoffs.load(Relaxed), 0);
        // Lost live (3): the back-off starts. (Had its window passed
        // before the rebuild was tried, on a slow machine, that rebuild
        // loses one more instance, which starts one more back-off.)
        feed.fan_out(events([TRAP]));
        wait_for("the back-off", || cell.stats.backoffs.load(Relaxed) >= 1);
        drop(cell.lock());
        assert_eq!(
            guest.generation(),
            cell.stats.backoffs.load(Relaxed) + 2,
            "every loss from the 3rd in a row starts a back-off"
        );
    }

    /// The same for requests that lose the instance (a `/query` that
    /// traps), each after a rebuild replaying the registration.
    #[test]
    fn requests_losing_every_instance_start_the_back_off_within_3_losses() {
        let (guest, _feed, cell) = registered(1000);
        for _ in 0..3 {
            assert!(
                cell.handle(request("GET", "/query", b"trap".to_vec()))
                    .is_err()
            );
        }
        assert_eq!(cell.stats.backoffs.load(Relaxed), 1);
        assert_eq!(guest.generation(), 3);
        assert_eq!(
            cell.stats.rebuilds.load(Relaxed),
            2,
            "one per loss after the first"
        );
    }
}
