//! The differential harness of `indexer_parity.rs`: Dynamo's standalone
//! indexer and `kvwasm serve` fed the same vLLM-shaped streams by the same
//! publishers, their answers compared, a ground truth deciding.

pub mod compare;
pub mod publisher;
pub mod services;
pub mod stream;

use serde_json::{Value, json};
use tokio::runtime::Runtime;

use compare::Report;
use publisher::Publisher;
use services::Service;
use stream::World;

/// A world's feeds, each with its publisher, and the markers that end
/// the streams published so far.
pub struct Scenario {
    pub runtime: Runtime,
    pub world: World,
    pub publishers: Vec<Publisher>,
    markers: Vec<(u64, u32, usize)>,
    /// Every batch is also published here as Dynamo RouterEvents.
    nats: Option<NatsMirror>,
}

/// A NATS connection every published batch is mirrored to, one RouterEvent
/// per event on `subject`.
struct NatsMirror {
    client: async_nats::Client,
    subject: String,
    /// Event ids per (instance, rank).
    next_ids: std::collections::BTreeMap<(u64, u32), u64>,
    published: u64,
}

impl Scenario {
    pub fn new(world: World) -> Scenario {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let publishers = world
            .feeds
            .iter()
            .map(|_| Publisher::start(&runtime))
            .collect();
        Scenario {
            runtime,
            world,
            publishers,
            markers: Vec::new(),
            nats: None,
        }
    }

    /// From now on, mirror every batch to `url` as RouterEvents on `subject`.
    pub fn mirror_to_nats(&mut self, url: &str, subject: &str) {
        let client = self
            .runtime
            .block_on(async_nats::connect(url))
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        self.nats = Some(NatsMirror {
            client,
            subject: subject.to_owned(),
            next_ids: Default::default(),
            published: 0,
        });
    }

    /// How many RouterEvents went to NATS.
    pub fn nats_published(&self) -> u64 {
        self.nats.as_ref().map_or(0, |n| n.published)
    }

    /// Publish one raw NATS message on the mirror's subject.
    pub fn nats_raw(&self, payload: String) {
        let nats = self.nats.as_ref().expect("mirror_to_nats first");
        self.runtime.block_on(async {
            nats.client
                .publish(nats.subject.clone(), payload.into())
                .await
                .unwrap();
            nats.client.flush().await.unwrap();
        });
    }

    /// Send feed `f`'s `batch` to the ZMQ publisher, and to NATS if mirrored.
    fn send(&mut self, f: usize, batch: &stream::Batch, live: bool) {
        self.publishers[f].publish(batch, live);
        let Some(nats) = self.nats.as_mut() else {
            return;
        };
        let feed = &self.world.feeds[f];
        let worker = (feed.instance, batch.rank.unwrap_or(feed.registered_rank));
        let block_size = self.world.models[feed.model].block_size;
        let payloads: Vec<String> = batch
            .events
            .iter()
            .map(|event| {
                let id = nats.next_ids.entry(worker).or_insert(0);
                *id += 1;
                stream::router_event(worker, *id, event, block_size).to_string()
            })
            .collect();
        nats.published += payloads.len() as u64;
        let (client, subject) = (nats.client.clone(), nats.subject.clone());
        self.runtime.block_on(async {
            for payload in payloads {
                client
                    .publish(subject.clone(), payload.into())
                    .await
                    .unwrap();
            }
            client.flush().await.unwrap();
        });
    }

    /// `POST /register` of feed `f` (with its replay endpoint).
    pub fn register_feed(&self, service: &Service, f: usize) {
        let feed = &self.world.feeds[f];
        let model = &self.world.models[feed.model];
        service.expect(
            201,
            "POST",
            "/register",
            Some(&json!({
                "instance_id": feed.instance,
                "dp_rank": feed.registered_rank,
                "endpoint": self.publishers[f].endpoint,
                "replay_endpoint": self.publishers[f].replay_endpoint,
                "model_name": model.name,
                "block_size": model.block_size,
            })),
        );
    }

    /// `POST /register` of every feed's instance and rank without an
    /// endpoint: a worker whose events come over NATS.
    pub fn register_without_endpoints(&self, service: &Service) {
        for feed in &self.world.feeds {
            let model = &self.world.models[feed.model];
            service.expect(
                201,
                "POST",
                "/register",
                Some(&json!({
                    "instance_id": feed.instance,
                    "dp_rank": feed.registered_rank,
                    "model_name": model.name,
                    "block_size": model.block_size,
                })),
            );
        }
    }

    /// `POST /register` of every feed without its replay endpoint: `service`
    /// gets only what is published once it has subscribed (see
    /// [`Scenario::wait_subscribed`]).
    pub fn register_live_only(&self, service: &Service) {
        for (f, feed) in self.world.feeds.iter().enumerate() {
            let model = &self.world.models[feed.model];
            service.expect(
                201,
                "POST",
                "/register",
                Some(&json!({
                    "instance_id": feed.instance,
                    "dp_rank": feed.registered_rank,
                    "endpoint": self.publishers[f].endpoint,
                    "model_name": model.name,
                    "block_size": model.block_size,
                })),
            );
        }
    }

    /// Wait until kvwasm `service` has received a message from every
    /// publisher (each sends its last message again meanwhile): from then
    /// on it receives all they publish.
    pub fn wait_subscribed(&self, service: &Service) {
        for (f, feed) in self.world.feeds.iter().enumerate() {
            let model = &self.world.models[feed.model].name;
            let sample = format!(
                "kvwasm_source_messages_total{{source=\"zmq:{}:{}@{model}/default\"}}",
                feed.instance, feed.registered_rank
            );
            let started = std::time::Instant::now();
            while service.metric(&sample) == 0 {
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(120),
                    "{} never received a message of feed {f}; stderr:\n{}",
                    service.name,
                    service.log()
                );
                self.publishers[f].nudge();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }

    /// Register every feed.
    pub fn register(&self, service: &Service) {
        for f in 0..self.world.feeds.len() {
            self.register_feed(service, f);
        }
    }

    /// Publish `batches` generated batches, spread over the feeds at
    /// random (some kept for replay only: gaps).
    pub fn publish(&mut self, batches: usize) {
        for _ in 0..batches {
            let f = self.world.pick_feed();
            let batch = self.world.next_batch(f);
            let live = self.world.live();
            self.send(f, &batch, live);
        }
    }

    /// Publish one batch of `events` events on feed `f` (sent live).
    pub fn publish_one_batch(&mut self, f: usize, events: usize) {
        let batch = self.world.batch_of(f, events);
        self.send(f, &batch, true);
    }

    /// End every stream with a marker batch (sent live).
    pub fn end_streams(&mut self) {
        self.markers.clear();
        for f in 0..self.publishers.len() {
            let (batch, p) = self.world.marker(f);
            self.send(f, &batch, true);
            let feed = &self.world.feeds[f];
            self.markers.push((feed.instance, feed.registered_rank, p));
        }
    }

    /// Wait until `services` have applied every stream up to its marker.
    pub fn settle(&self, services: &[&Service]) {
        if let Err(stuck) = self.try_settle(services) {
            panic!("{stuck}");
        }
    }

    fn try_settle(&self, services: &[&Service]) -> Result<(), String> {
        let publishers: Vec<&Publisher> = self.publishers.iter().collect();
        compare::settle(&self.world, services, &publishers, &self.markers)
    }

    /// End the streams, wait for `reference` and `subjects`, compare. A
    /// side that never applies its streams fails with the comparison too
    /// (which answers differ, and who is wrong).
    pub fn checkpoint(&mut self, what: &str, reference: &Service, subjects: &[&Service]) {
        self.end_streams();
        let mut all = vec![reference];
        all.extend_from_slice(subjects);
        if let Err(stuck) = self.try_settle(&all) {
            let mut report = Report::default();
            compare::compare_all(&self.world, reference, subjects, &mut report);
            report.mismatches.insert(0, stuck);
            report.assert_clean(what);
        }
        self.compare(what, reference, subjects);
    }

    /// End the streams, wait for `subjects`, and compare their every answer
    /// with the ground truth alone.
    pub fn checkpoint_with_truth(&mut self, what: &str, subjects: &[&Service]) {
        self.end_streams();
        self.settle(subjects);
        let mut report = Report::default();
        compare::compare_with_truth(&self.world, subjects, &mut report);
        report.assert_clean(what);
    }

    /// Compare `subjects`' every answer with the ground truth alone now
    /// (the streams settled).
    pub fn compare_with_truth(&self, what: &str, subjects: &[&Service]) {
        let mut report = Report::default();
        compare::compare_with_truth(&self.world, subjects, &mut report);
        report.assert_clean(what);
    }

    /// End the streams, wait for all, hold `subjects` to the ground truth,
    /// and compare them with `reference`, which may be wrong where they
    /// differ only: the named `difference`.
    pub fn checkpoint_where_reference_is_wrong(
        &mut self,
        what: &str,
        reference: &Service,
        subjects: &[&Service],
        difference: &str,
    ) {
        self.end_streams();
        let mut all = vec![reference];
        all.extend_from_slice(subjects);
        self.settle(&all);
        self.compare_with_truth(what, subjects);
        let mut report = Report::default();
        compare::compare_all(&self.world, reference, subjects, &mut report);
        let wrong = format!("{} is wrong (the ground truth agrees with", reference.name);
        report.mismatches.retain(|m| !m.contains(&wrong));
        report.assert_clean(&format!("{what} (but where {difference})"));
    }

    /// Compare every answer now (the streams settled).
    pub fn compare(&self, what: &str, reference: &Service, subjects: &[&Service]) {
        let mut report = Report::default();
        compare::compare_all(&self.world, reference, subjects, &mut report);
        report.assert_clean(what);
    }

    /// Feed `f`'s publisher restarts on the same endpoints, counting from
    /// seq 0 again, and nobody registers it again. Its first batch, a
    /// marker, is sent until `follower` has applied it (its subscriber
    /// reconnects meanwhile); the marker's prompt.
    pub fn restart_publisher_in_place(&mut self, f: usize, follower: &Service) -> usize {
        let endpoint = self.publishers[f].endpoint.clone();
        let replay_endpoint = self.publishers[f].replay_endpoint.clone();
        drop(self.publishers.remove(f));
        self.publishers.insert(
            f,
            Publisher::start_at(&self.runtime, &endpoint, &replay_endpoint),
        );
        let (batch, p) = self.world.marker(f);
        self.send(f, &batch, true);
        let feed = &self.world.feeds[f];
        let markers = [(feed.instance, feed.registered_rank, p)];
        let publishers = [&self.publishers[f]];
        if let Err(stuck) = compare::settle(&self.world, &[follower], &publishers, &markers) {
            panic!("the restarted publisher's seq 0: {stuck}");
        }
        p
    }

    /// What `service` scores prompt `p` (whole) for feed `f`'s registered rank.
    pub fn marker_score(&self, service: &Service, f: usize, p: usize) -> Value {
        let prompt = &self.world.prompts[p];
        let model = &self.world.models[prompt.model];
        let feed = &self.world.feeds[f];
        let (_, answer) = service.call(
            "POST",
            "/query",
            Some(&json!({"token_ids": prompt.tokens, "model_name": model.name})),
        );
        answer["scores"][feed.instance.to_string()][feed.registered_rank.to_string()].clone()
    }

    /// Feed `f`'s engine restarts: its instance's rank is unregistered from
    /// `services`, a new publisher binds the same endpoints counting from
    /// seq 0, and the rank is registered again.
    pub fn restart_publisher(&mut self, f: usize, services: &[&Service]) {
        let feed = &self.world.feeds[f];
        let model = &self.world.models[feed.model];
        for service in services {
            service.expect(
                200,
                "POST",
                "/unregister",
                Some(
                    &json!({"instance_id": feed.instance, "dp_rank": feed.registered_rank,
                             "model_name": model.name, "routing_group": "default"}),
                ),
            );
        }
        self.world.unregister(f);
        let endpoint = self.publishers[f].endpoint.clone();
        let replay_endpoint = self.publishers[f].replay_endpoint.clone();
        // The old one's task closes its sockets; the new one binds the
        // ports once they are free.
        drop(self.publishers.remove(f));
        self.publishers.insert(
            f,
            Publisher::start_at(&self.runtime, &endpoint, &replay_endpoint),
        );
        for service in services {
            self.register_feed(service, f);
        }
    }
}
