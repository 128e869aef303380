//! What the `kvwasm serve` tests share: a service on a port of its own.

#![allow(dead_code)] // each test file uses its own part

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvwasm_host::subscriber::Event;
use kvwasm_serve::{Running, ServeConfig};
use serde_json::Value;

/// A service on a port of its own, with its own runtime.
pub struct Harness {
    /// `subscribers.<name>`: the guest's name in /metrics (the registry is
    /// per process, so each harness has its own).
    pub guest: String,
    pub running: Option<Running>,
    pub runtime: tokio::runtime::Runtime,
    pub client: reqwest::blocking::Client,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// `[subscribers.<name>]` (builtin:kv-indexer, with `limits` added) as
    /// the indexer; `serve` is added to `[serve]`.
    pub fn start(name: &str, limits: &str, serve: &str) -> Harness {
        Harness::with_component(name, "builtin:kv-indexer", limits, serve)
    }

    /// As [`Harness::start`], with `component` as the indexer.
    pub fn with_component(name: &str, component: &str, limits: &str, serve: &str) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kvwasm.toml");
        std::fs::write(
            &path,
            format!(
                "[subscribers.{name}]\ncomponent = {component:?}\n{limits}\n\
                 [serve]\nindexer = \"{name}\"\nlisten = \"127.0.0.1:0\"\n{serve}\n"
            ),
        )
        .unwrap();
        let config = kvwasm_host::config::Config::load(&path).unwrap();
        let settings = ServeConfig::parse(config.serve.as_ref()).unwrap();
        let guests = kvwasm_serve::guests_from_config(&config, &settings).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let running = runtime
            .block_on(kvwasm_serve::start(settings, guests))
            .unwrap();
        Harness {
            guest: format!("subscribers.{name}"),
            running: Some(running),
            runtime,
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.as_ref().unwrap().local_addr()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    /// (status, body) of a request; `body` is sent as is.
    pub fn call(&self, method: &str, path: &str, body: impl Into<Vec<u8>>) -> (u16, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = self
            .client
            .request(method, self.url(path))
            .body(body.into())
            .send()
            .unwrap();
        (
            response.status().as_u16(),
            response.bytes().unwrap().to_vec(),
        )
    }

    /// (status, parsed JSON body).
    pub fn json(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let (status, bytes) = self.call(method, path, body.to_string());
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }

    /// Hand `events` to the service exactly as a source does.
    pub fn publish(&self, events: Vec<Event>) {
        let sink = self.running.as_ref().unwrap().sink();
        self.runtime.block_on(sink.send(events)).unwrap();
    }

    pub fn metrics(&self) -> String {
        String::from_utf8(self.call("GET", "/metrics", "").1).unwrap()
    }

    /// The value of `family{<guest label>}` in /metrics.
    pub fn guest_metric(&self, family: &str, label: &str) -> u64 {
        self.metric(&format!("{family}{{{label}=\"{}\"}}", self.guest))
    }

    /// The value of the sample named exactly `sample` in /metrics.
    pub fn metric(&self, sample: &str) -> u64 {
        let text = self.metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{sample} missing:\n{text}"))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _guard = self.runtime.enter();
        self.running.take();
    }
}

pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
