//! The storage advisor: an untrusted guest (`kvwasm:events/storage-advisor`,
//! configured as `[subscribers.NAME]`) that turns a tiered store's
//! [`Access`] records into [`Advice`], and the host loop that feeds it.
//!
//! The guest runs through [`Subscriber`], so it gets what every subscriber
//! gets: the sandbox, one instance started on demand, a trapped or late
//! instance replaced by a fresh one, a deadline per call, metrics under
//! `subscribers.NAME`. A fresh instance starts cold; advice only costs hit
//! ratio, so nothing is replayed.
//!
//! [`AdvisorLoop`] is a thread owned by the tiered store's open handle:
//! it drains the store's access log (bounded by the store, drops counted
//! there; [`AdvisedStore`]) into `observe` in batches, asks `advise` every
//! `interval_ms`, bounds what comes back ([`LoopConfig`]), and gives the
//! rest to the store's [`AdviceSink`], which has the last word. What was
//! advised, applied and refused goes to the store's decisions for
//! `kvwasm tier status`, and the loop's counters to [`AdvisorStatus`].

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::bindings::advisor::exports::kvwasm::events::advisor as wit;
use crate::bindings::advisor::exports::kvwasm::events::advisor_moves as wit_moves;
pub use crate::config_file::LoopConfig;
use crate::error::KvError;
use crate::subscriber::Subscriber;

use super::contract::{Access, AccessKind, Action, Advice, AdviceReport, AdviceSink, TierUsage};

/// The longest chunk hash kv_store allows: longer ones are refused.
const MAX_HASH_LEN: usize = 64;

/// An advisor guest, called one call at a time.
pub struct Advisor {
    subscriber: Subscriber,
}

impl Advisor {
    /// The advisor `[subscribers.<name>]` of `config`.
    pub fn from_config(config: &crate::config::Config, name: &str) -> Result<Advisor, KvError> {
        let policy = config.subscriber(name).map_err(KvError::Host)?;
        Advisor::start(Arc::new(policy))
    }

    /// An advisor running `policy`'s component, which must export
    /// `kvwasm:events/advisor`; its first instance starts now.
    pub fn start(policy: Arc<Backend>) -> Result<Advisor, KvError> {
        if policy.component.subscriber_exports()?.advisor.is_none() {
            return Err(KvError::Host(format!(
                "{} is an event subscriber but not a storage advisor (it does not export \
                 kvwasm:events/advisor)",
                policy.source
            )));
        }
        Ok(Advisor {
            subscriber: Subscriber::start(policy)?,
        })
    }

    /// The name in logs and metrics (`subscribers.<name>`).
    pub fn name(&self) -> &str {
        self.subscriber.name()
    }

    /// Changes each time a failed instance is replaced.
    pub fn generation(&self) -> u64 {
        self.subscriber.generation()
    }

    /// Hand `accesses` to the guest (moves among them are left out: see
    /// [`Advisor::observe_moves`]).
    pub fn observe(&self, accesses: &[Access]) -> Result<(), KvError> {
        let accesses: Vec<wit::ChunkAccess> = accesses.iter().filter_map(to_wit).collect();
        self.subscriber
            .call_advisor(async |guest, store| guest.call_observe(store, &accesses).await)
    }

    /// Whether the guest is told the store's own moves (it exports
    /// `advisor-moves`, events 0.1.1).
    pub fn observes_moves(&self) -> bool {
        self.subscriber.observes_moves()
    }

    /// Hand the moves among `accesses` to the guest (a guest that is not
    /// told them: [`KvError::NotFound`]).
    pub fn observe_moves(&self, accesses: &[Access]) -> Result<(), KvError> {
        let moves: Vec<wit_moves::ChunkMove> = accesses.iter().filter_map(move_to_wit).collect();
        self.subscriber
            .call_advisor_moves(async |guest, store| guest.call_observe_moves(store, &moves).await)
    }

    /// Ask the guest for advice on the store as `usage` describes it.
    /// What it returns is bounded by `config` and checked against `usage`
    /// before it becomes [`Advice`]; what did not pass is counted in the
    /// report's refusals.
    pub fn advise(
        &self,
        usage: &[TierUsage],
        now_ms: u64,
        config: &LoopConfig,
    ) -> Result<(Vec<Advice>, AdviceReport), KvError> {
        let usage_wit: Vec<wit::TierUsage> = usage
            .iter()
            .map(|u| wit::TierUsage {
                name: u.name.clone(),
                capacity_bytes: u.capacity_bytes,
                used_bytes: u.used_bytes,
                chunks: u.chunks,
            })
            .collect();
        let raw = self.subscriber.call_advisor(async |guest, store| {
            guest.call_advise(store, &usage_wit, now_ms).await
        })?;
        Ok(bound(raw, usage.len(), config))
    }
}

/// Keep the first `max_advice` records and `max_hashes` hashes of `raw`,
/// dropping hashes outside 1..=64 bytes and advice on tiers the store does
/// not have (or, for a demotion, its last tier), counting all of it.
fn bound(raw: Vec<wit::Advice>, tiers: usize, config: &LoopConfig) -> (Vec<Advice>, AdviceReport) {
    let mut report = AdviceReport::default();
    let refuse = |report: &mut AdviceReport, n: usize, why: &str| {
        if n == 0 {
            return;
        }
        report.refused += n as u64;
        if !report.reasons.iter().any(|r| r == why) {
            report.reasons.push(why.to_owned());
        }
    };
    let mut advice = Vec::new();
    let mut budget = config.max_hashes;
    let records = raw.len();
    for (i, record) in raw.into_iter().enumerate() {
        if i == config.max_advice {
            let rest: usize = records - i;
            refuse(
                &mut report,
                rest,
                "advice records beyond max_advice (counted per record)",
            );
            break;
        }
        let action = match record.action {
            wit::Action::Promote => Action::Promote,
            wit::Action::Demote => Action::Demote,
            wit::Action::Evict => Action::Evict,
        };
        let tier = record.tier as usize;
        let valid_tier = match action {
            Action::Promote => (1..tiers).contains(&tier),
            Action::Demote => tier + 1 < tiers,
            Action::Evict => tier < tiers,
        };
        if !valid_tier {
            refuse(
                &mut report,
                record.hashes.len(),
                "no such tier for this action",
            );
            continue;
        }
        let total = record.hashes.len();
        let hashes: Vec<Vec<u8>> = record
            .hashes
            .into_iter()
            .filter(|h| (1..=MAX_HASH_LEN).contains(&h.len()))
            .collect();
        refuse(
            &mut report,
            total - hashes.len(),
            "hash length outside 1..=64 bytes",
        );
        let keep = hashes.len().min(budget);
        refuse(
            &mut report,
            hashes.len() - keep,
            "hashes beyond max_hashes per round (rate limit)",
        );
        budget -= keep;
        if keep > 0 {
            let mut hashes = hashes;
            hashes.truncate(keep);
            advice.push(Advice {
                action,
                tier: record.tier,
                hashes,
            });
        }
    }
    (advice, report)
}

/// A consumer's access as the guest sees it; `None` for a move.
fn to_wit(access: &Access) -> Option<wit::ChunkAccess> {
    let kind = match access.kind {
        AccessKind::Put => wit::AccessKind::Put,
        AccessKind::Hit => wit::AccessKind::Hit,
        AccessKind::Miss => wit::AccessKind::Miss,
        AccessKind::Gone => wit::AccessKind::Gone,
        AccessKind::Moved(_) => return None,
    };
    Some(wit::ChunkAccess {
        kind,
        hash: access.hash.clone(),
        len: access.len,
        tier: access.tier,
        manifest: access.manifest.clone(),
    })
}

/// A move of the store's as the guest sees it; `None` for an access.
fn move_to_wit(access: &Access) -> Option<wit_moves::ChunkMove> {
    let AccessKind::Moved(action) = access.kind else {
        return None;
    };
    Some(wit_moves::ChunkMove {
        kind: match action {
            Action::Promote => wit_moves::MoveKind::Promoted,
            Action::Demote => wit_moves::MoveKind::Demoted,
            Action::Evict => wit_moves::MoveKind::Evicted,
        },
        hash: access.hash.clone(),
        len: access.len,
        tier: access.tier,
    })
}

fn is_move(access: &Access) -> bool {
    matches!(access.kind, AccessKind::Moved(_))
}

/// What the loop needs of a tiered store besides applying advice: its
/// access log (bounded by the store, which counts what it drops) and a
/// place for the loop's decisions (`kvwasm tier status`).
pub trait AdvisedStore: AdviceSink {
    /// Take up to `max` of the oldest access records.
    fn drain_accesses(&self, max: usize) -> Vec<Access>;
    /// Keep these decisions, one line each, for `kvwasm tier status`.
    fn record_decisions(&self, lines: Vec<String>);
}

/// One round of the loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Milliseconds since the loop started.
    pub at_ms: u64,
    /// What the guest advised (after bounding): action, tier, chunks.
    pub advised: Vec<(Action, u32, usize)>,
    /// The loop's bounds and the store's rules together.
    pub report: AdviceReport,
    /// The guest's call failed (trap, deadline...): no advice this round.
    pub error: Option<String>,
}

impl Decision {
    /// One line for `kvwasm tier status`.
    pub fn line(&self) -> String {
        let advised: Vec<String> = self
            .advised
            .iter()
            .map(|(action, tier, n)| format!("{action:?} {n} from tier {tier}").to_lowercase())
            .collect();
        let mut line = format!(
            "+{}ms advised [{}]: {} applied, {} refused",
            self.at_ms,
            advised.join(", "),
            self.report.applied,
            self.report.refused
        );
        if !self.report.reasons.is_empty() {
            line.push_str(&format!(" ({})", self.report.reasons.join("; ")));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!("; guest failed: {e}"));
        }
        line
    }
}

/// The loop's counters and its last round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdvisorStatus {
    /// `subscribers.NAME`.
    pub advisor: String,
    /// Accesses handed to the guest.
    pub observed: u64,
    /// Rounds run, and guest calls that failed.
    pub rounds: u64,
    pub guest_errors: u64,
    /// Instances replaced after a failure.
    pub restarts: u64,
    /// Chunks the store applied and chunks refused (by the loop's bounds
    /// or the store), over the loop's life.
    pub applied: u64,
    pub refused: u64,
    pub last: Option<Decision>,
}

/// What the owner tells the loop thread.
enum Control {
    /// Run a round now and say when it is done (tests, forced rounds).
    Round(SyncSender<()>),
}

/// The advisor loop of one tiered store: a thread that ends when this is
/// dropped (or when the store is gone).
pub struct AdvisorLoop {
    control: Option<SyncSender<Control>>,
    status: Arc<Mutex<AdvisorStatus>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AdvisorLoop {
    /// Start the loop: `advisor`'s advice for `store`. The loop holds the
    /// store weakly, so the store may own the loop.
    pub fn start(
        advisor: Advisor,
        store: Weak<dyn AdvisedStore>,
        config: LoopConfig,
    ) -> Result<AdvisorLoop, KvError> {
        let (control, rx) = mpsc::sync_channel(1);
        let status = Arc::new(Mutex::new(AdvisorStatus {
            advisor: advisor.name().to_owned(),
            ..AdvisorStatus::default()
        }));
        let worker = Worker {
            advisor,
            store,
            config,
            status: status.clone(),
            started: Instant::now(),
            generation: 0,
        };
        let thread = std::thread::Builder::new()
            .name("kvwasm-advisor".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| KvError::host("cannot start the advisor loop", e))?;
        Ok(AdvisorLoop {
            control: Some(control),
            status,
            thread: Some(thread),
        })
    }

    /// Run a round now: observe what the store logged, advise, apply.
    /// Returns when it is done.
    pub fn round(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        if let Some(control) = &self.control
            && control.send(Control::Round(done)).is_ok()
        {
            let _ = wait.recv();
        }
    }

    /// The counters and the last round.
    pub fn status(&self) -> AdvisorStatus {
        lock(&self.status).clone()
    }

    /// Whether the thread still runs (it ends once the store is gone).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for AdvisorLoop {
    fn drop(&mut self) {
        // Closing the channel wakes and ends the thread.
        self.control.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The loop thread's state.
struct Worker {
    advisor: Advisor,
    store: Weak<dyn AdvisedStore>,
    config: LoopConfig,
    status: Arc<Mutex<AdvisorStatus>>,
    started: Instant,
    generation: u64,
}

impl Worker {
    fn run(mut self, rx: Receiver<Control>) {
        let interval = Duration::from_millis(self.config.interval_ms.max(1));
        let drain = Duration::from_millis(self.config.drain_ms.max(1));
        let mut next = Instant::now() + interval;
        loop {
            let wait = drain.min(next.saturating_duration_since(Instant::now()));
            let forced = match rx.recv_timeout(wait) {
                Ok(Control::Round(done)) => Some(done),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let Some(store) = self.store.upgrade() else {
                return;
            };
            self.observe(&*store, forced.is_some());
            if forced.is_some() || Instant::now() >= next {
                self.round(&*store);
                next = Instant::now() + interval;
            }
            if let Some(done) = forced {
                let _ = done.send(());
            }
        }
    }

    /// Hand the store's logged accesses to the guest, in `observe_batch`
    /// pieces, at most `max_batches` of them (64 times more before a forced
    /// round, which wants everything logged before it, yet must end under
    /// constant traffic). Within a piece, consumer accesses go to
    /// `observe` and the store's moves to `observe-moves` (to a guest that
    /// exports it), run by run in the order they happened. A failed call
    /// loses its run, counted.
    fn observe(&mut self, store: &dyn AdvisedStore, all: bool) {
        let size = self.config.observe_batch.max(1);
        let limit = self.config.max_batches.max(1) * if all { 64 } else { 1 };
        let moves_wanted = self.advisor.observes_moves();
        let mut batches = 0;
        while batches < limit {
            let batch = store.drain_accesses(size);
            if batch.is_empty() {
                return;
            }
            batches += 1;
            for run in batch.chunk_by(|a, b| is_move(a) == is_move(b)) {
                let result = match is_move(&run[0]) {
                    true if !moves_wanted => continue,
                    true => self.advisor.observe_moves(run),
                    false => self.advisor.observe(run),
                };
                let mut status = lock(&self.status);
                match result {
                    Ok(()) if !is_move(&run[0]) => status.observed += run.len() as u64,
                    Ok(()) => {}
                    // Logged by the subscriber's call (one line per guest
                    // and code per second); counted here.
                    Err(_) => status.guest_errors += 1,
                }
            }
        }
    }

    /// Ask for advice, bound it, let the store apply it, keep the record.
    fn round(&mut self, store: &dyn AdvisedStore) {
        let usage = store.usage();
        let at_ms = self.started.elapsed().as_millis() as u64;
        let mut decision = Decision {
            at_ms,
            ..Decision::default()
        };
        match self.advisor.advise(&usage, at_ms, &self.config) {
            Ok((advice, mut report)) => {
                decision.advised = advice
                    .iter()
                    .map(|a| (a.action, a.tier, a.hashes.len()))
                    .collect();
                if !advice.is_empty() {
                    let applied = store.apply(advice);
                    report.applied += applied.applied;
                    report.refused += applied.refused;
                    for reason in applied.reasons {
                        if !report.reasons.contains(&reason) {
                            report.reasons.push(reason);
                        }
                    }
                }
                decision.report = report;
            }
            // Logged by the subscriber's call, rate-limited; kept in the
            // decisions for `kvwasm tier status`.
            Err(e) => decision.error = Some(crate::log_limit::bounded(e.to_string())),
        }
        if !decision.advised.is_empty() || decision.report.refused > 0 || decision.error.is_some() {
            store.record_decisions(vec![decision.line()]);
        }
        let generation = self.advisor.generation();
        let mut status = lock(&self.status);
        status.restarts += generation - self.generation;
        self.generation = generation;
        status.rounds += 1;
        status.guest_errors += u64::from(decision.error.is_some());
        status.applied += decision.report.applied;
        status.refused += decision.report.refused;
        status.last = Some(decision);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(action: wit::Action, tier: u32, hashes: Vec<Vec<u8>>) -> wit::Advice {
        wit::Advice {
            action,
            tier,
            hashes,
        }
    }

    /// Records beyond `max_advice`, hashes beyond `max_hashes`, hashes of
    /// bad length and impossible tiers never reach the store; each is
    /// counted as refused with its reason.
    #[test]
    fn advice_is_bounded_before_the_store_sees_it() {
        let config = LoopConfig {
            max_advice: 3,
            max_hashes: 5,
            ..LoopConfig::default()
        };
        let h = |i: u8| vec![i; 8];
        let raw = vec![
            record(
                wit::Action::Demote,
                0,
                vec![h(1), vec![], vec![0; 65], h(2)],
            ),
            record(wit::Action::Demote, 1, vec![h(3)]), // last tier: nowhere to go
            record(wit::Action::Promote, 1, vec![h(4), h(5), h(6), h(7)]),
            record(wit::Action::Evict, 0, vec![h(8)]), // beyond max_advice
            record(wit::Action::Evict, 0, vec![h(9)]),
        ];
        let (advice, report) = bound(raw, 2, &config);
        assert_eq!(
            advice,
            [
                Advice {
                    action: Action::Demote,
                    tier: 0,
                    hashes: vec![h(1), h(2)]
                },
                Advice {
                    action: Action::Promote,
                    tier: 1,
                    hashes: vec![h(4), h(5), h(6)]
                },
            ]
        );
        // 2 bad lengths, 1 bad tier, 1 over the hash budget, 2 records.
        assert_eq!(report.refused, 6, "{report:?}");
        assert_eq!(report.reasons.len(), 4, "{report:?}");
        assert_eq!(report.applied, 0);
    }
}
