//! `kvwasm serve`: KV-cache events from the sources, fed to subscriber
//! guests, and the KV indexer's HTTP API (docs/events.md).
//!
//! * [`config`] — the `[serve]` table;
//! * `feed` — the fan-out, the per-guest queues and threads, guest rebuilds;
//! * `log` — the replay log a replaced guest instance is rebuilt from;
//! * `http` — the listener: host routes, the guest's API, body limits;
//! * `metrics` — `/metrics`;
//! * `pending` — events held until their worker is registered;
//! * `peers` — peer replicas, and their `/dump` for startup recovery and
//!   the rebuild of a diverged indexer.

mod cell;
pub mod config;
mod feed;
mod http;
mod log;
mod metrics;
mod peers;
mod pending;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use kvwasm_host::subscriber::{Event, Request, Subscriber};
use kvwasm_indexer_protocol::api::{RegisterRequest, UnregisterRequest};
use kvwasm_indexer_protocol::dump::split_dump_key;

use cell::request;
pub use cell::{Guest, GuestCell, GuestStats};
pub use config::ServeConfig;
use feed::Feed;
use kvwasm_event_sources::{self as sources, NatsSource, Sink, SourceHandle, ZmqWorker};

/// How long a starting replica lets its sources connect before it takes a
/// peer's `/dump` (so the dump covers what they missed while joining).
const RECOVERY_DELAY: Duration = Duration::from_secs(1);
/// Batches the sources may have in flight to the fan-out.
const SINK_BATCHES: usize = 1024;
/// How long a diverged indexer waits after a failed rebuild from a peer,
/// at first; doubled after each failure up to [`REBUILD_RETRY_MAX`].
const REBUILD_RETRY_FIRST: Duration = Duration::from_millis(200);
const REBUILD_RETRY_MAX: Duration = Duration::from_secs(30);

/// The running service's shared state.
pub(crate) struct Service {
    settings: ServeConfig,
    feed: Feed,
    pending: pending::Pending,
    sink: Sink,
    peers: peers::Peers,
    http_stats: http::HttpStats,
    caps: http::Caps,
    /// ZMQ sources by (model, routing group, instance_id, dp_rank).
    zmq: Mutex<BTreeMap<WorkerKey, ZmqSource>>,
    nats: Vec<(String, SourceHandle)>,
    rebuilds: Rebuilds,
}

/// The automatic rebuilds of a diverged indexer from a peer's `/dump`.
#[derive(Default)]
struct Rebuilds {
    done: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    /// Why the last attempt failed, while the indexer stays diverged.
    last_failure: Mutex<Option<String>>,
}

impl Rebuilds {
    fn succeeded(&self) {
        self.done.fetch_add(1, Relaxed);
        *self.failure() = None;
    }

    fn failed(&self, why: String) {
        self.failed.fetch_add(1, Relaxed);
        *self.failure() = Some(why);
    }

    fn failure(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.last_failure.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type WorkerKey = (String, String, u64, u32);

/// A worker's ZMQ source and the `tenant_id` it registered with (a tag
/// within its routing group that `/unregister` may name).
struct ZmqSource {
    tenant: String,
    handle: SourceHandle,
}

/// A started service; dropping it stops the listener and the sources.
pub struct Running {
    addr: SocketAddr,
    service: Arc<Service>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.service
            .zmq
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

impl Running {
    /// The listener's address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where sources deliver: events sent here reach every guest.
    pub fn sink(&self) -> Sink {
        self.service.sink.clone()
    }

    /// Every guest, the indexer first.
    pub fn guests(&self) -> &[Arc<GuestCell>] {
        &self.service.feed.cells
    }
}

/// The guests `[serve]` names, started from the config's
/// `[subscribers.NAME]` tables: the indexer (which must export `http-api`)
/// first.
pub fn guests_from_config(
    config: &kvwasm_host::config::Config,
    settings: &ServeConfig,
) -> anyhow::Result<Vec<Arc<dyn Guest>>> {
    // builtin:kv-indexer, its block-hash import and prehash_tokens.
    kvwasm_kv_indexer_host::install();
    let mut guests: Vec<Arc<dyn Guest>> = Vec::new();
    for name in settings.guest_names() {
        let policy = config.subscriber(name).map_err(anyhow::Error::msg)?;
        let subscriber = Subscriber::start(Arc::new(policy))
            .with_context(|| format!("cannot start subscriber {name:?}"))?;
        if settings.indexer.as_deref() == Some(name) && !subscriber.serves_http() {
            anyhow::bail!(
                "[serve].indexer = {name:?}, but that subscriber does not export \
                 kvwasm:events/http-api"
            );
        }
        guests.push(Arc::new(subscriber));
    }
    if guests.is_empty() {
        anyhow::bail!("[serve] names no subscriber: set `indexer` and/or `subscribers`");
    }
    Ok(guests)
}

/// Start the service on the current tokio runtime: sources, recovery from a
/// peer, the guest threads, then the listener. `guests` are those of
/// `settings.guest_names()`, in that order.
pub async fn start(settings: ServeConfig, guests: Vec<Arc<dyn Guest>>) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let (feed, receivers) = Feed::new(guests, &settings);
    let (sink, mut events) = tokio::sync::mpsc::channel::<Vec<Event>>(SINK_BATCHES);
    let nats = settings
        .nats
        .iter()
        .map(|n| {
            let source = NatsSource {
                url: n.url.clone(),
                subjects: n.subjects.clone(),
                model: n.model.clone(),
                tenant: n.tenant.clone(),
                block_size: n.block_size,
            };
            (
                format!("nats:{}", n.url),
                sources::spawn_nats(source, sink.clone()),
            )
        })
        .collect();
    let service = Arc::new(Service {
        peers: peers::Peers::new(&settings.peers),
        caps: http::Caps::new(&settings),
        pending: pending::Pending::new(settings.pending_events),
        settings,
        feed,
        sink,
        http_stats: Default::default(),
        zmq: Mutex::default(),
        nats,
        rebuilds: Rebuilds::default(),
    });
    let fan_out = {
        let service = service.clone();
        tokio::spawn(async move {
            while let Some(batch) = events.recv().await {
                service.pending.admit(batch, &service.feed);
            }
        })
    };
    // Workers' sources connect now; the guest hears of them after any
    // recovery, whose /restore replaces its state.
    for worker in &service.settings.workers {
        service.start_zmq(&worker.registration());
    }
    if let Some(indexer) = service.indexer()
        && !service.settings.peers.is_empty()
    {
        tokio::time::sleep(RECOVERY_DELAY).await;
        match service.restore_from_peers(&indexer).await {
            Ok(url) => tracing::info!("recovered from {url}"),
            Err(e) => tracing::warn!("recovery: {e}; starting empty"),
        }
    }
    service.register_configured_workers().await?;
    service.feed.start(receivers)?;
    let mut tasks = vec![fan_out];
    if let Some(indexer) = service.indexer() {
        tasks.push(tokio::spawn(service.clone().rebuild_when_diverged(indexer)));
    }
    tasks.push(tokio::spawn(http::serve(listener, service.clone())));
    tracing::info!(%addr, "kvwasm serve: listening");
    Ok(Running {
        addr,
        service,
        tasks,
    })
}

/// `kvwasm serve`: run until interrupted.
pub fn run(config_path: &Path, listen: Option<SocketAddr>) -> anyhow::Result<()> {
    let config = kvwasm_host::config::Config::load(config_path).map_err(anyhow::Error::msg)?;
    let mut settings = ServeConfig::parse(config.serve.as_ref()).map_err(anyhow::Error::msg)?;
    if let Some(listen) = listen {
        settings.listen = listen;
    }
    let guests = guests_from_config(&config, &settings)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kvwasm-serve")
        .build()?;
    runtime.block_on(async {
        let running = start(settings, guests).await?;
        // Machine-readable for scripts and tests.
        println!("listening on http://{}", running.local_addr());
        shutdown_signal().await;
        drop(running);
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The ZMQ source key of a registration: (model, routing group,
/// instance, rank). The indexer keeps one tree per (model,
/// `routing_group`), as Dynamo 1.6.1 does; `tenant_id` only tags the
/// registration (docs/events.md).
fn worker_key(r: &RegisterRequest) -> WorkerKey {
    (
        r.model_name.clone(),
        r.routing_group.clone(),
        r.instance_id,
        r.rank(),
    )
}

/// What the host does after the guest accepts an API call.
pub(crate) enum Effect {
    Register(RegisterRequest),
    Unregister(UnregisterRequest),
    /// A `/restore` of a dump holding these (model, tenant) trees.
    Restore(Vec<pending::Model>),
}

impl Effect {
    /// The effect `request` would have, if it is a well-formed `/register`
    /// or `/unregister` (the guest answers malformed ones itself).
    pub(crate) fn of(request: &Request) -> Option<Effect> {
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/register") => serde_json::from_slice(&request.body)
                .ok()
                .map(Effect::Register),
            ("POST", "/unregister") => serde_json::from_slice(&request.body)
                .ok()
                .map(Effect::Unregister),
            ("POST", log::RESTORE) => Some(Effect::Restore(dumped_models(&request.body))),
            _ => None,
        }
    }
}

impl Service {
    /// The guest answering the API, if `[serve].indexer` is set.
    fn indexer(&self) -> Option<Arc<GuestCell>> {
        self.settings
            .indexer
            .as_ref()
            .and_then(|_| self.feed.cells.first().cloned())
    }

    /// Start (201 to `/register`) or stop (200 to `/unregister`) sources,
    /// and hand over the events held for what the guest can now place.
    pub(crate) fn apply(&self, effect: Effect, status: u16) {
        match effect {
            Effect::Register(r) if status == 201 => {
                self.registered(&r);
                self.start_zmq(&r);
            }
            Effect::Restore(models) if status == 200 => self.pending.restored(models, &self.feed),
            Effect::Unregister(u) if status == 200 => {
                // Held events are kept by (model, group): with a tenant
                // named, the group's other tenants stay registered.
                if u.tenant_id.is_none() {
                    self.pending.unregistered(
                        u.instance_id,
                        &u.model_name,
                        u.routing_group.as_deref(),
                        u.dp_rank,
                    );
                }
                let mut zmq = self.zmq.lock().unwrap_or_else(|p| p.into_inner());
                zmq.retain(|(model, group, instance, rank), source| {
                    !(*model == u.model_name
                        && *instance == u.instance_id
                        && u.routing_group.as_ref().is_none_or(|g| g == group)
                        && u.tenant_id.as_ref().is_none_or(|t| *t == source.tenant)
                        && u.dp_rank.is_none_or(|r| r == *rank))
                });
            }
            _ => {}
        }
    }

    /// Restore `indexer` from the first peer that answers `/dump`, as a
    /// `POST /restore` of it would (logged for replay; events held for
    /// its trees handed over); the peer's URL.
    async fn restore_from_peers(&self, indexer: &Arc<GuestCell>) -> Result<String, String> {
        let peers = self.peers.list();
        let dump = peers::first_dump(&peers, self.settings.max_body_bytes()).await?;
        let models = dumped_models(&dump.body);
        let restore = request("POST", log::RESTORE, dump.body);
        let call = {
            let indexer = indexer.clone();
            tokio::task::spawn_blocking(move || indexer.handle(restore))
        };
        match call.await {
            Ok(Ok(r)) if r.status == 200 => {
                self.apply(Effect::Restore(models), r.status);
                Ok(dump.url)
            }
            Ok(Ok(r)) => Err(format!(
                "the indexer refused {}: {} {}",
                dump.url,
                r.status,
                guest_text(&r.body)
            )),
            Ok(Err(e)) => Err(format!("restoring {} failed: {e}", dump.url)),
            Err(e) => Err(format!("restoring {}: {e}", dump.url)),
        }
    }

    /// While `indexer` is diverged, rebuild it from a peer's `/dump`,
    /// retrying with back-off; with no peer registered, wait for one (or
    /// an operator's `/restore`). Runs until the service stops.
    ///
    /// The rebuilt state is the peer's at its `/dump`, then every event
    /// this replica receives after: as for startup recovery, both replicas
    /// follow the same publishers. Events lost again while the dump was
    /// fetched mark the indexer diverged again.
    async fn rebuild_when_diverged(self: Arc<Service>, indexer: Arc<GuestCell>) {
        let mut retry = REBUILD_RETRY_FIRST;
        loop {
            if !indexer.diverged() {
                retry = REBUILD_RETRY_FIRST;
                indexer.rebuild_wanted().await;
                continue;
            }
            if self.peers.list().is_empty() {
                tracing::error!(
                    "subscriber {:?} diverged and no peer is registered to rebuild it from: \
                     POST /register_peer a replica (or set [serve] peers), or POST /restore \
                     a /dump",
                    indexer.name()
                );
                self.rebuilds.failed("no peer is registered".into());
                indexer.rebuild_wanted().await;
                continue;
            }
            let lost_before = indexer.stats.dropped.load(Relaxed);
            match self.restore_from_peers(&indexer).await {
                Ok(url) => {
                    self.rebuilds.succeeded();
                    tracing::warn!(
                        "subscriber {:?} diverged: rebuilt from {url}",
                        indexer.name()
                    );
                    if indexer.stats.dropped.load(Relaxed) != lost_before {
                        indexer.mark_diverged();
                    }
                    retry = REBUILD_RETRY_FIRST;
                }
                Err(why) => {
                    kvwasm_host::log_limit::warn(
                        ("rebuild from a peer", indexer.name()),
                        format_args!(
                            "subscriber {:?} diverged; rebuilding it from a peer failed \
                             (retrying in {retry:?}): {why}",
                            indexer.name()
                        ),
                    );
                    self.rebuilds.failed(why);
                    // A peer registered meanwhile is tried at once.
                    let _ = tokio::time::timeout(retry, indexer.rebuild_wanted()).await;
                    retry = (retry * 2).min(REBUILD_RETRY_MAX);
                }
            }
        }
    }

    /// What `/health` says of a diverged indexer's rebuild.
    fn rebuild_status(&self) -> String {
        let failure = self.rebuilds.failure().clone();
        match failure {
            _ if self.peers.list().is_empty() => "no peer is registered to rebuild it from: \
                POST /register_peer a replica (or set [serve] peers), or POST /restore a /dump"
                .into(),
            Some(why) => format!("rebuilding from a peer's /dump, retrying: {why}"),
            None => "rebuilding from a peer's /dump".into(),
        }
    }

    fn registered(&self, r: &RegisterRequest) {
        self.pending.registered(
            r.instance_id,
            &r.model_name,
            &r.routing_group,
            r.rank(),
            &self.feed,
        );
    }

    /// The worker's ZMQ source, if it has an endpoint.
    fn start_zmq(&self, r: &RegisterRequest) {
        let Some(endpoint) = r.endpoint.clone() else {
            return;
        };
        let worker = ZmqWorker {
            instance_id: r.instance_id,
            dp_rank: r.rank(),
            endpoint,
            replay_endpoint: r.replay_endpoint.clone(),
            model: r.model_name.clone(),
            tenant: r.routing_group.clone(),
        };
        let handle = sources::spawn_zmq(worker, self.sink.clone());
        let mut zmq = self.zmq.lock().unwrap_or_else(|p| p.into_inner());
        let source = ZmqSource {
            tenant: r.tenant().to_owned(),
            handle,
        };
        zmq.insert(worker_key(r), source);
    }

    /// `/register` each `[[serve.workers]]` with the indexer; a refused one
    /// loses its source.
    async fn register_configured_workers(self: &Arc<Service>) -> anyhow::Result<()> {
        let Some(indexer) = self.indexer() else {
            return Ok(());
        };
        for worker in &self.settings.workers {
            let registration = worker.registration();
            let body = serde_json::to_vec(&registration)?;
            let indexer = indexer.clone();
            let answer = tokio::task::spawn_blocking(move || {
                indexer.handle(request("POST", "/register", body))
            })
            .await?;
            match answer {
                Ok(r) if r.status == 201 => self.registered(&registration),
                other => {
                    let why = match other {
                        Ok(r) => format!("{}: {}", r.status, guest_text(&r.body)),
                        Err(e) => e.to_string(),
                    };
                    tracing::error!(
                        "[[serve.workers]] instance {} rank {}: the indexer refused it ({why})",
                        worker.instance_id,
                        worker.dp_rank
                    );
                    self.zmq
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&worker_key(&registration));
                }
            }
        }
        Ok(())
    }

    /// The API guests whose answers would be wrong: their state diverged
    /// from the sources. (A plain subscriber's shows in `/metrics` only:
    /// it answers nothing, and nothing but a restart can replace its state.)
    fn diverged(&self) -> Vec<&str> {
        self.feed
            .cells
            .iter()
            .filter(|c| c.diverged() && c.serves_http())
            .map(|c| c.name())
            .collect()
    }
}

/// A guest's answer for a log line: cut to the log's limit.
pub(crate) fn guest_text(body: &[u8]) -> String {
    kvwasm_host::log_limit::bounded(String::from_utf8_lossy(body).into_owned())
}

/// The (model, routing group) trees of a `/dump` document.
fn dumped_models(dump: &[u8]) -> Vec<pending::Model> {
    serde_json::from_slice::<BTreeMap<String, serde::de::IgnoredAny>>(dump)
        .map(|trees| {
            trees
                .into_keys()
                .filter_map(|key| {
                    let (model, group) = split_dump_key(&key)?;
                    Some((model.to_owned(), group.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    //! The automatic rebuild of a diverged indexer from a peer: the feed's
    //! in-memory guest behind the real listener, its peer another service.

    use super::*;
    use crate::feed::tests::{Recorder, events};
    use std::time::Instant;

    /// An indexer whose log holds 8 events at most (twice `log_events`):
    /// a batch of more is gone from the log before the guest can take it.
    fn tiny_log() -> ServeConfig {
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            indexer: Some("recorder".into()),
            queue_events: 2,
            log_events: 4,
            max_body_mib: 1,
            ..Default::default()
        }
    }

    /// A service answering `/dump` with the ids `ids`.
    async fn peer(ids: Vec<u64>) -> Running {
        let guest = Arc::new(Recorder::default());
        guest.state.lock().unwrap().1 = ids;
        start(tiny_log(), vec![guest]).await.unwrap()
    }

    async fn call(running: &Running, method: &str, path: &str, body: &str) -> (u16, String) {
        let url = format!("http://{}{path}", running.local_addr());
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = reqwest::Client::new()
            .request(method, url)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// GET `path` until its answer is what `want` wants; only a stuck
    /// service reaches the limit.
    async fn eventually(
        running: &Running,
        what: &str,
        path: &str,
        want: impl Fn(u16, &str) -> bool,
    ) {
        let started = Instant::now();
        loop {
            let (status, body) = call(running, "GET", path, "").await;
            if want(status, &body) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{what}: GET {path} still answers {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn sample(metrics: &str, name: &str) -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
            .parse()
            .unwrap()
    }

    /// Diverge `running`'s indexer: one batch larger than its whole log.
    async fn lose_events(running: &Running) {
        running.service.feed.fan_out(events(0..2));
        running.service.feed.fan_out(events(2..12));
        eventually(running, "the loss", "/health", |status, _| status == 503).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_diverged_indexer_is_rebuilt_from_a_peer_once_one_is_registered() {
        let peer = peer(vec![40, 41, 42]).await;
        let running = start(tiny_log(), vec![Arc::new(Recorder::default())])
            .await
            .unwrap();
        lose_events(&running).await;
        let (_, health) = call(&running, "GET", "/health", "").await;
        let health: serde_json::Value = serde_json::from_str(&health).unwrap();
        assert_eq!(health["diverged"], serde_json::json!(["recorder"]));
        let rebuild = health["rebuild"].as_str().unwrap();
        assert!(
            rebuild.contains("no peer is registered") && rebuild.contains("/register_peer"),
            "{rebuild}"
        );
        assert_eq!(call(&running, "GET", "/query", "").await.0, 503);

        let body = format!("{{\"url\": \"http://{}\"}}", peer.local_addr());
        assert_eq!(call(&running, "POST", "/register_peer", &body).await.0, 201);
        eventually(&running, "the rebuild", "/health", |status, _| {
            status == 200
        })
        .await;
        assert_eq!(
            call(&running, "GET", "/query", "").await,
            (200, "[[40,41,42],[]]".into())
        );
        let (_, metrics) = call(&running, "GET", "/metrics", "").await;
        let rebuilds = "kvwasm_serve_peer_rebuilds_total{guest=\"recorder\"}";
        assert_eq!(sample(&metrics, rebuilds), 1);
        assert_eq!(
            sample(&metrics, "kvwasm_serve_diverged{guest=\"recorder\"}"),
            0
        );
        assert_eq!(
            sample(
                &metrics,
                "kvwasm_serve_events_dropped_total{guest=\"recorder\"}"
            ),
            10
        );

        // It follows the sources again, and a rebuild of its instance
        // replays the peer's dump (logged as a /restore).
        running.service.feed.fan_out(events([50]));
        eventually(&running, "a later event", "/query", |_, body| {
            body == "[[40,41,42,50],[]]"
        })
        .await;
    }

    /// A peer whose `/dump` exceeds `max_body_mib` is refused without being
    /// read past it; the rebuild is retried and takes the next peer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_dump_past_max_body_mib_is_refused_and_the_rebuild_retried() {
        // About 1.3 MiB of JSON, past the 1 MiB limit.
        let large = peer((1_000_000..1_160_000).collect()).await;
        let small = peer(vec![7]).await;
        let running = start(tiny_log(), vec![Arc::new(Recorder::default())])
            .await
            .unwrap();
        let body = format!("{{\"url\": \"http://{}\"}}", large.local_addr());
        assert_eq!(call(&running, "POST", "/register_peer", &body).await.0, 201);
        lose_events(&running).await;
        eventually(&running, "a refused dump", "/health", |status, body| {
            status == 503 && body.contains("exceeds 1048576 bytes")
        })
        .await;
        let (_, metrics) = call(&running, "GET", "/metrics", "").await;
        assert!(
            sample(
                &metrics,
                "kvwasm_serve_peer_rebuild_failures_total{guest=\"recorder\"}"
            ) >= 1
        );
        assert_eq!(
            sample(
                &metrics,
                "kvwasm_serve_peer_rebuilds_total{guest=\"recorder\"}"
            ),
            0
        );

        let body = format!("{{\"url\": \"http://{}\"}}", small.local_addr());
        assert_eq!(call(&running, "POST", "/register_peer", &body).await.0, 201);
        eventually(&running, "the rebuild", "/health", |status, _| {
            status == 200
        })
        .await;
        assert_eq!(
            call(&running, "GET", "/query", "").await,
            (200, "[[7],[]]".into())
        );
    }
}
