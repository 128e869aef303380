//! Events that arrive before the indexer can place them: a worker fed over
//! NATS sends RouterEvents that name neither a model nor a block size, so
//! they belong nowhere until the worker is registered (`/register`,
//! `[[serve.workers]]`). They are held here, per worker and in order, up
//! to `pending_events` in all (past it new ones are dropped, counted), and
//! handed to the feed when the worker's registration is accepted.
//!
//! An event passes at once when its worker is registered, or when it names
//! a model whose tree exists as far as the host knows: one registered, one
//! restored, or one a store with a block size creates (`[[serve.nats]]`
//! `block_size`). Once a worker has events held, its later ones wait
//! behind them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use kvwasm_host::subscriber::{Event, EventData};

use crate::feed::Feed;

/// (model, tenant)
pub(crate) type Model = (String, String);

#[derive(Default)]
struct State {
    /// Registrations by instance: (model, tenant, rank).
    registered: BTreeMap<u64, BTreeSet<(String, String, u32)>>,
    /// Tenants by model.
    models: BTreeMap<String, BTreeSet<String>>,
    held: BTreeMap<u64, Vec<Event>>,
    held_events: usize,
}

pub(crate) struct Pending {
    state: Mutex<State>,
    limit: usize,
    /// Events dropped because `limit` events were held already.
    pub dropped: AtomicU64,
}

impl Pending {
    pub fn new(limit: usize) -> Pending {
        Pending {
            state: Mutex::default(),
            limit,
            dropped: AtomicU64::new(0),
        }
    }

    /// Events held now.
    pub fn held(&self) -> usize {
        self.lock().held_events
    }

    /// Hand `events` to `feed`, but those that cannot be placed yet. The
    /// lock is held across the fan-out, so a release never overtakes it.
    pub fn admit(&self, events: Vec<Event>, feed: &Feed) {
        let mut state = self.lock();
        let mut placed = Vec::with_capacity(events.len());
        let mut dropped = 0;
        for event in events {
            let waiting = state.held.contains_key(&event.worker_id);
            if !waiting && state.places(&event) {
                placed.push(event);
            } else if state.held_events < self.limit {
                state.held_events += 1;
                state.held.entry(event.worker_id).or_default().push(event);
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.dropped.fetch_add(dropped, Relaxed);
            kvwasm_host::log_limit::warn(
                ("pending events dropped", ""),
                format_args!(
                    "{dropped} events of unregistered workers dropped: {} are held already \
                     ([serve].pending_events); register the workers (/register or \
                     [[serve.workers]]) or give [[serve.nats]] a model and block_size",
                    self.limit
                ),
            );
        }
        feed.fan_out(placed);
    }

    /// The indexer accepted a registration: its worker's held events (and
    /// any now placed by its model) go to `feed`, in order.
    pub fn registered(&self, instance: u64, model: &str, tenant: &str, rank: u32, feed: &Feed) {
        let mut state = self.lock();
        state.registered.entry(instance).or_default().insert((
            model.to_owned(),
            tenant.to_owned(),
            rank,
        ));
        state.add_model(model.to_owned(), tenant.to_owned());
        self.release(&mut state, feed);
    }

    /// The indexer accepted an unregistration (no tenant: every tenant; no
    /// rank: every rank).
    pub fn unregistered(
        &self,
        instance: u64,
        model: &str,
        tenant: Option<&str>,
        rank: Option<u32>,
    ) {
        let mut state = self.lock();
        let Some(registrations) = state.registered.get_mut(&instance) else {
            return;
        };
        registrations.retain(|(m, t, r)| {
            !(m == model && tenant.is_none_or(|x| x == t) && rank.is_none_or(|x| x == *r))
        });
        if registrations.is_empty() {
            state.registered.remove(&instance);
        }
    }

    /// The indexer restored a `/dump` holding trees of `models`.
    pub fn restored(&self, models: impl IntoIterator<Item = Model>, feed: &Feed) {
        let mut state = self.lock();
        for (model, tenant) in models {
            state.add_model(model, tenant);
        }
        self.release(&mut state, feed);
    }

    /// Hand over the held events of every worker whose first one is now
    /// placed.
    fn release(&self, state: &mut State, feed: &Feed) {
        for (worker, events) in std::mem::take(&mut state.held) {
            if events.first().is_some_and(|e| state.places(e)) {
                state.held_events -= events.len();
                feed.fan_out(events);
            } else {
                state.held.insert(worker, events);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// Whether the indexer can place `event` now (a store naming its model
    /// and block size creates that model's tree).
    fn places(&mut self, event: &Event) -> bool {
        if self.registered.contains_key(&event.worker_id) {
            return true;
        }
        let Some(model) = &event.model else {
            return false;
        };
        let tenant = event.tenant.as_deref().unwrap_or("default");
        if self.models.get(model).is_some_and(|t| t.contains(tenant)) {
            return true;
        }
        let creates =
            matches!(&event.data, EventData::Stored(s) if s.block_size.is_some_and(|b| b > 0));
        if creates {
            self.add_model(model.clone(), tenant.to_owned());
        }
        creates
    }

    fn add_model(&mut self, model: String, tenant: String) {
        self.models.entry(model).or_default().insert(tenant);
    }
}
