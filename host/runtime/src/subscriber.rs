//! Event subscriber guests (`wit/events/events.wit`, docs/events.md).
//!
//! `kvwasm serve` (trusted host code) owns the event sources and the HTTP
//! listener; it hands normalised events to a [`Subscriber`] in batches and
//! routes the requests of a guest's API to it. The guest runs in the same
//! sandbox as every kvwasm guest ([`crate::sandbox`]): grants, limits,
//! deadline, metrics.
//!
//! A subscriber keeps one instance ([`crate::single`]): its state (an
//! index, counters) lives there. An instance that traps or overruns its
//! deadline is discarded and the next call starts a fresh, empty one;
//! [`Subscriber::generation`] changes, so the caller knows to rebuild it
//! (replay its event log) first.
//!
//! With `prehash_tokens` (on for `builtin:kv-indexer`) the host hashes each
//! stored event's token ids before delivery: the guest would only hand them
//! back to `block-hash` anyway, and lowering ~1 KB of tokens per event into
//! its memory and out again was a fifth of its ingest (docs/benchmarks.md).
//! The hashing is the KV indexer's crate's ([`crate::extension::TokenHasher`],
//! `kvwasm-kv-indexer-host`), so the shim does not link it.

use std::sync::Arc;

use wasmtime::Store;

use crate::backend::Backend;
use crate::bindings::advisor::exports::kvwasm::events::{advisor, advisor_moves};
use crate::bindings::events::exports::kvwasm::events::{http_api, subscriber};
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::single::{GuestKind, Instance, OneInstance};
use crate::state::HostState;

pub use crate::bindings::events::exports::kvwasm::events::http_api::{Request, Response};
pub use crate::bindings::events::kvwasm::events::types::{
    BlocksRemoved, BlocksStored, Event, EventData, SourceKind, Tier,
};

/// The most bytes the host copies out of an advisor's answer (or a call's
/// arguments): wasmtime's per-call "hostcall fuel", 128 MiB by default.
/// Every list of an answer may name the same guest bytes, so without it a
/// 1 MiB buffer named 100 times costs the host 100 MiB per `advise`. 16 MiB
/// holds about 290 000 hashes of 32 bytes, far above what the loop takes
/// from a round (`max_hashes`); a larger answer fails the call (the
/// instance is replaced).
pub(crate) const MAX_LIFT_BYTES: usize = 16 << 20;

/// An event subscriber: one guest instance, called one call at a time.
pub struct Subscriber {
    guest: OneInstance<SubscriberExports>,
    /// Set with `prehash_tokens`.
    token_hasher: Option<crate::extension::TokenHasher>,
}

impl Subscriber {
    /// The subscriber `[subscribers.<name>]` of the config file at `path`.
    pub fn from_config(path: &std::path::Path, name: &str) -> Result<Subscriber, KvError> {
        let config = crate::config::Config::load(path).map_err(KvError::Host)?;
        let policy = config.subscriber(name).map_err(KvError::Host)?;
        Subscriber::start(Arc::new(policy))
    }

    /// A subscriber running `policy`'s component, which must be an event
    /// subscriber. The first instance starts now, so a broken component
    /// fails here.
    pub fn start(policy: Arc<Backend>) -> Result<Subscriber, KvError> {
        policy.component.subscriber_exports()?;
        let token_hasher = match policy.prehash_tokens {
            true => Some(crate::extension::token_hasher().ok_or_else(|| {
                KvError::Host(format!(
                    "{}: prehash_tokens needs the host's block hashing, which this program \
                     does not link",
                    policy.name
                ))
            })?),
            false => None,
        };
        Ok(Subscriber {
            token_hasher,
            guest: OneInstance::start(policy, ())?,
        })
    }

    /// The name in logs and metrics (`subscribers.<name>`).
    pub fn name(&self) -> &str {
        &self.guest.policy().name
    }

    /// Whether the guest exports `http-api`.
    pub fn serves_http(&self) -> bool {
        self.guest
            .policy()
            .component
            .subscriber_exports()
            .is_ok_and(|e| e.http_api.is_some())
    }

    /// Changes each time the instance is discarded: a caller that saw a
    /// different value before must rebuild the guest's state.
    pub fn generation(&self) -> u64 {
        self.guest.generation()
    }

    /// Whether an instance is running. A call that failed and left none
    /// behind, with the same [`Subscriber::generation`], failed to start
    /// one (or was refused by the back-off): the guest holds nothing, and
    /// a caller rebuilding its state must try again later.
    pub fn is_live(&self) -> bool {
        self.guest.is_live()
    }

    /// Whether calls are refused now, backing off after repeated lost
    /// instances or failed starts: a caller can wait instead of preparing
    /// a call that will be refused.
    pub fn backing_off(&self) -> bool {
        self.guest.backing_off()
    }

    /// Hand `events` to the guest. The guest's own error is
    /// [`KvError::Other`]. With `prehash_tokens`, stored events are first
    /// rewritten in place (the [`crate::extension::TokenHasher`]): the
    /// caller hands over events it no longer needs as they were.
    pub fn on_batch(&self, events: &mut [Event]) -> Result<(), KvError> {
        if let Some(hash_tokens) = self.token_hasher {
            hash_tokens(events);
        }
        self.on_batch_as_is(events)
    }

    /// Hand `events` shared with a log (a replay) to the guest exactly as
    /// [`Subscriber::on_batch`] would: copied only when they are to be
    /// pre-hashed, so a replayed batch costs the guest what it did live.
    pub fn replay(&self, events: &[Event]) -> Result<(), KvError> {
        if self.token_hasher.is_some() {
            self.on_batch(&mut events.to_vec())
        } else {
            self.on_batch_as_is(events)
        }
    }

    fn on_batch_as_is(&self, events: &[Event]) -> Result<(), KvError> {
        self.guest.operation(
            0,
            |_| 0,
            |turn| {
                turn.call(async |s, guest| {
                    guest
                        .subscriber
                        .call_on_batch(s, events)
                        .await
                        .map(|r| r.map_err(|m| KvError::Other(crate::log_limit::bounded(m))))
                })
            },
        )
    }

    /// Ask the guest's API. A guest without `http-api` answers nothing:
    /// [`KvError::NotFound`].
    pub fn handle(&self, request: &Request) -> Result<Response, KvError> {
        self.handle_by(request, self.deadline())
    }

    /// A fresh deadline for one call (the subscriber's `call_timeout_ms`),
    /// for a caller that waits before it calls ([`Subscriber::handle_by`]).
    pub fn deadline(&self) -> Deadline {
        self.guest.deadline()
    }

    /// [`Subscriber::handle`] within `deadline`, set when the request came
    /// in: whatever it waited for before its turn is not added to it.
    pub fn handle_by(&self, request: &Request, deadline: Deadline) -> Result<Response, KvError> {
        self.guest.operation_by(
            deadline,
            0,
            |_| 0,
            |turn| {
                turn.call(async |s, guest| match &guest.http_api {
                    Some(api) => api.call_handle(s, request).await.map(Ok),
                    None => Ok(Err(KvError::NotFound)),
                })
            },
        )
    }

    /// Run `call` on the instance's `advisor` export, under the same
    /// deadline, replacement and metrics as every call
    /// ([`crate::tiering::advisor`]). A guest without one: [`KvError::NotFound`].
    pub(crate) fn call_advisor<T: Send>(
        &self,
        call: impl AsyncFnOnce(&advisor::Guest, &mut Store<HostState>) -> wasmtime::Result<T> + Send,
    ) -> Result<T, KvError> {
        self.guest.operation(
            0,
            |_| 0,
            |turn| {
                turn.call(async |s, guest| match &guest.advisor {
                    Some(advisor) => call(advisor, s).await.map(Ok::<_, KvError>),
                    None => Ok(Err(KvError::NotFound)),
                })
            },
        )
    }

    /// Whether the guest exports `advisor-moves` (is told the tiered
    /// store's own moves).
    pub(crate) fn observes_moves(&self) -> bool {
        self.guest
            .policy()
            .component
            .subscriber_exports()
            .is_ok_and(|e| e.advisor_moves.is_some())
    }

    /// As [`Subscriber::call_advisor`], on the `advisor-moves` export.
    pub(crate) fn call_advisor_moves<T: Send>(
        &self,
        call: impl AsyncFnOnce(&advisor_moves::Guest, &mut Store<HostState>) -> wasmtime::Result<T>
        + Send,
    ) -> Result<T, KvError> {
        self.guest.operation(
            0,
            |_| 0,
            |turn| {
                turn.call(async |s, guest| match &guest.advisor_moves {
                    Some(moves) => call(moves, s).await.map(Ok::<_, KvError>),
                    None => Ok(Err(KvError::NotFound)),
                })
            },
        )
    }
}

/// The exports of one subscriber instance.
struct SubscriberExports {
    subscriber: subscriber::Guest,
    http_api: Option<http_api::Guest>,
    advisor: Option<advisor::Guest>,
    advisor_moves: Option<advisor_moves::Guest>,
}

impl GuestKind for SubscriberExports {
    const KIND: &'static str = "subscriber";
    type Tied = ();

    fn start(policy: &Backend, deadline: Deadline) -> Result<Instance<Self>, KvError> {
        let exports = policy.component.subscriber_exports()?;
        Instance::start(policy, deadline, async |s| {
            if exports.advisor.is_some() {
                s.set_hostcall_fuel(MAX_LIFT_BYTES);
            }
            let instance = exports.pre.instantiate_async(&mut *s).await?;
            let subscriber = exports.subscriber.load(&mut *s, &instance)?;
            let http_api = match &exports.http_api {
                Some(indices) => Some(indices.load(&mut *s, &instance)?),
                None => None,
            };
            let advisor = match &exports.advisor {
                Some(indices) => Some(indices.load(&mut *s, &instance)?),
                None => None,
            };
            let advisor_moves = match &exports.advisor_moves {
                Some(indices) => Some(indices.load(&mut *s, &instance)?),
                None => None,
            };
            Ok(SubscriberExports {
                subscriber,
                http_api,
                advisor,
                advisor_moves,
            })
        })
    }
}
