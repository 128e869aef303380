//! Event subscriber guests (`wit/events/events.wit`, docs/events.md).
//!
//! `kvwasm serve` (trusted host code) owns the event sources and the HTTP
//! listener; it hands normalised events to a [`Subscriber`] in batches and
//! routes the requests of a guest's API to it. The guest runs in the same
//! sandbox as every kvwasm guest ([`crate::sandbox`]): grants, limits,
//! deadline, metrics.
//!
//! A subscriber keeps one instance: its state (an index, counters) lives
//! there. An instance that traps or overruns its deadline is discarded and
//! the next call starts a fresh, empty one; [`Subscriber::generation`]
//! changes, so the caller knows to rebuild it (replay its event log) first.

use std::sync::{Arc, Mutex, MutexGuard};

use wasmtime::Store;

use crate::backend::Backend;
use crate::bindings::advisor::exports::kvwasm::events::advisor;
use crate::bindings::events::exports::kvwasm::events::{http_api, subscriber};
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::sandbox::{self, Outcome};
use crate::state::HostState;

pub use crate::bindings::events::exports::kvwasm::events::http_api::{Request, Response};
pub use crate::bindings::events::kvwasm::events::types::{
    BlocksRemoved, BlocksStored, Event, EventData, SourceKind, Tier,
};

/// An event subscriber: one guest instance, called one call at a time.
pub struct Subscriber {
    policy: Arc<Backend>,
    state: Mutex<State>,
}

struct State {
    instance: Option<SubscriberInstance>,
    /// Bumped whenever an instance is discarded.
    generation: u64,
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
        let subscriber = Subscriber {
            policy,
            state: Mutex::new(State {
                instance: None,
                generation: 0,
            }),
        };
        let deadline = subscriber.deadline();
        subscriber.instance(&mut subscriber.lock(), deadline)?;
        Ok(subscriber)
    }

    /// The name in logs and metrics (`subscribers.<name>`).
    pub fn name(&self) -> &str {
        &self.policy.name
    }

    /// Whether the guest exports `http-api`.
    pub fn serves_http(&self) -> bool {
        self.policy
            .component
            .subscriber_exports()
            .is_ok_and(|e| e.http_api.is_some())
    }

    /// Changes each time the instance is discarded: a caller that saw a
    /// different value before must rebuild the guest's state.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Hand `events` to the guest. The guest's own error is
    /// [`KvError::Other`].
    pub fn on_batch(&self, events: &[Event]) -> Result<(), KvError> {
        self.operation(|state, deadline| {
            let instance = self.instance(state, deadline)?;
            let guest = instance.subscriber.clone();
            let outcome = sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                guest
                    .call_on_batch(s, events)
                    .await
                    .map(|r| r.map_err(|m| KvError::Other(crate::log_limit::bounded(m))))
            });
            self.settle(state, outcome)
        })
    }

    /// Ask the guest's API. A guest without `http-api` answers nothing:
    /// [`KvError::NotFound`].
    pub fn handle(&self, request: &Request) -> Result<Response, KvError> {
        self.operation(|state, deadline| {
            let instance = self.instance(state, deadline)?;
            let Some(api) = instance.http_api.clone() else {
                return Err(KvError::NotFound);
            };
            let outcome = sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                api.call_handle(s, request).await.map(Ok::<_, KvError>)
            });
            self.settle(state, outcome)
        })
    }

    /// Run `call` on the instance's `advisor` export, under the same
    /// deadline, replacement and metrics as every call
    /// ([`crate::tiering::advisor`]). A guest without one: [`KvError::NotFound`].
    pub(crate) fn call_advisor<T>(
        &self,
        call: impl AsyncFnOnce(&advisor::Guest, &mut Store<HostState>) -> wasmtime::Result<T>,
    ) -> Result<T, KvError> {
        self.operation(|state, deadline| {
            let instance = self.instance(state, deadline)?;
            let Some(guest) = instance.advisor.clone() else {
                return Err(KvError::NotFound);
            };
            let outcome = sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                call(&guest, s).await.map(Ok::<_, KvError>)
            });
            self.settle(state, outcome)
        })
    }

    /// The live instance, started if there is none.
    fn instance<'s>(
        &self,
        state: &'s mut State,
        deadline: Deadline,
    ) -> Result<&'s mut SubscriberInstance, KvError> {
        if state.instance.is_none() {
            state.instance = Some(SubscriberInstance::start(&self.policy, deadline)?);
        }
        Ok(state.instance.as_mut().expect("just started"))
    }

    /// The result of a call; a lost instance is discarded.
    fn settle<T>(&self, state: &mut State, outcome: Outcome<T>) -> Result<T, KvError> {
        match outcome {
            Outcome::Returned(result) => result,
            Outcome::Lost(err) => {
                tracing::warn!(
                    "subscriber {:?}: guest instance discarded after: {err}; a fresh one \
                     serves the next call",
                    self.policy.name
                );
                state.instance = None;
                state.generation += 1;
                Err(err)
            }
        }
    }

    /// Run one call under the deadline and call gate, counted in metrics.
    fn operation<T>(
        &self,
        call: impl FnOnce(&mut State, Deadline) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let deadline = self.deadline();
        let result = self.policy.enter_call(deadline).and_then(|_slot| {
            let mut state = self.lock();
            call(&mut state, deadline)
        });
        self.policy.metrics.record(0, 0, result.as_ref().err());
        result
    }

    fn deadline(&self) -> Deadline {
        Deadline::after_ms(self.policy.limits.call_timeout_ms)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One instance of a subscriber guest.
struct SubscriberInstance {
    store: Store<HostState>,
    subscriber: subscriber::Guest,
    http_api: Option<http_api::Guest>,
    advisor: Option<advisor::Guest>,
    fuel: Option<u64>,
}

impl SubscriberInstance {
    fn start(policy: &Backend, deadline: Deadline) -> Result<SubscriberInstance, KvError> {
        let exports = policy.component.subscriber_exports()?;
        let (mut store, fuel) = sandbox::new_store(policy, "")?;
        let started = sandbox::run(&mut store, deadline, fuel, async |s| {
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
            Ok(Ok::<_, KvError>((subscriber, http_api, advisor)))
        });
        let (subscriber, http_api, advisor) = match started {
            Outcome::Returned(result) => result?,
            Outcome::Lost(err) => return Err(err),
        };
        Ok(SubscriberInstance {
            store,
            subscriber,
            http_api,
            advisor,
            fuel,
        })
    }
}
