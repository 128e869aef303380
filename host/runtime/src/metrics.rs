//! Per-backend counters, exported as Prometheus text.
//!
//! Every process that opens stores keeps counters for each backend: calls,
//! errors, traps, timeouts, denials (capabilities the host refused, and
//! calls that returned `denied`) and payload bytes in and out. With
//! `KVWASM_METRICS_ADDR=host:port` set, the process (an inference engine
//! using the shim, or `kvwasm demo`) serves them at
//! `http://host:port/metrics`; `kvwasm metrics --addr host:port` reads them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::KvError;

/// Environment variable naming the address to serve `/metrics` on.
pub const METRICS_ADDR_ENV: &str = "KVWASM_METRICS_ADDR";

/// The counters of one backend.
#[derive(Debug, Default)]
pub struct BackendMetrics {
    calls: AtomicU64,
    errors: AtomicU64,
    traps: AtomicU64,
    timeouts: AtomicU64,
    denials: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    events_dropped: AtomicU64,
    instances_released: AtomicU64,
    instances_restarted: AtomicU64,
    syncs: AtomicU64,
    syncs_skipped: AtomicU64,
    puts_found_in_place: AtomicU64,
    known_chunk_hits: AtomicU64,
    http_requests: AtomicU64,
    chunks_read_in_place: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub calls: u64,
    pub errors: u64,
    pub traps: u64,
    pub timeouts: u64,
    pub denials: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// KV events of this backend's traffic (`publish_events`) dropped.
    pub events_dropped: u64,
    /// Idle guest instances released after `idle_release_ms`.
    pub instances_released: u64,
    /// Instances started to replace released ones, on a handle's next call.
    pub instances_restarted: u64,
    /// Files and directories `payload-io.sync-paths` synced.
    pub syncs: u64,
    /// Files and directories `sync-paths` found durable already (the host
    /// synced them before, and they have not changed since).
    pub syncs_skipped: u64,
    /// `put_chunk` calls the host answered "already present" itself: the
    /// chunk was in place, in a version it synced (no guest call).
    pub puts_found_in_place: u64,
    /// Hashes a guest found in the host's `known-chunks` record (each one
    /// a server round trip saved after an idle release).
    pub known_chunk_hits: u64,
    /// `wasi:http` requests the host sent for the guest (allowed ones).
    pub http_requests: u64,
    /// `get_chunk_into` calls whose chunk the host read straight into the
    /// caller's buffer (no block, no copy): the rest were copied in.
    pub chunks_read_in_place: u64,
}

impl BackendMetrics {
    /// A capability the host refused.
    pub fn denial(&self) {
        self.denials.fetch_add(1, Relaxed);
    }

    /// A KV event of the backend's traffic dropped (`publish_events`: its
    /// queue was full, or its socket could not bind or send).
    pub fn event_dropped(&self) {
        self.events_dropped.fetch_add(1, Relaxed);
    }

    /// `n` idle instances released.
    pub(crate) fn released(&self, n: usize) {
        self.instances_released.fetch_add(n as u64, Relaxed);
    }

    /// A released instance replaced by a fresh one.
    pub(crate) fn restarted(&self) {
        self.instances_restarted.fetch_add(1, Relaxed);
    }

    /// What one `sync-paths` call synced and skipped.
    pub(crate) fn synced(&self, synced: u64, skipped: u64) {
        self.syncs.fetch_add(synced, Relaxed);
        self.syncs_skipped.fetch_add(skipped, Relaxed);
    }

    /// A `put_chunk` the host answered without the guest.
    pub(crate) fn put_found_in_place(&self) {
        self.puts_found_in_place.fetch_add(1, Relaxed);
    }

    /// A `known-chunks.contains` that found its hash.
    pub(crate) fn known_chunk_hit(&self) {
        self.known_chunk_hits.fetch_add(1, Relaxed);
    }

    /// An outgoing `wasi:http` request the grant allowed.
    pub(crate) fn http_request(&self) {
        self.http_requests.fetch_add(1, Relaxed);
    }

    /// A `get_chunk_into` answered with the chunk read into its buffer.
    pub(crate) fn chunk_read_in_place(&self) {
        self.chunks_read_in_place.fetch_add(1, Relaxed);
    }

    /// One finished call: `bytes_in` from the consumer, `bytes_out` to it.
    pub(crate) fn record(&self, bytes_in: usize, bytes_out: usize, error: Option<&KvError>) {
        self.calls.fetch_add(1, Relaxed);
        // Most calls move bytes one way only: no locked add for nothing.
        if bytes_in != 0 {
            self.bytes_in.fetch_add(bytes_in as u64, Relaxed);
        }
        if bytes_out != 0 {
            self.bytes_out.fetch_add(bytes_out as u64, Relaxed);
        }
        let Some(error) = error else { return };
        // A miss is an answer, not a failure.
        if error.is_miss() {
            return;
        }
        self.errors.fetch_add(1, Relaxed);
        match error {
            KvError::Trapped(_) => self.traps.fetch_add(1, Relaxed),
            KvError::Timeout(_) => self.timeouts.fetch_add(1, Relaxed),
            KvError::Denied(_) => self.denials.fetch_add(1, Relaxed),
            _ => 0,
        };
    }

    pub fn snapshot(&self) -> Counters {
        Counters {
            calls: self.calls.load(Relaxed),
            errors: self.errors.load(Relaxed),
            traps: self.traps.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            denials: self.denials.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            events_dropped: self.events_dropped.load(Relaxed),
            instances_released: self.instances_released.load(Relaxed),
            instances_restarted: self.instances_restarted.load(Relaxed),
            syncs: self.syncs.load(Relaxed),
            syncs_skipped: self.syncs_skipped.load(Relaxed),
            puts_found_in_place: self.puts_found_in_place.load(Relaxed),
            known_chunk_hits: self.known_chunk_hits.load(Relaxed),
            http_requests: self.http_requests.load(Relaxed),
            chunks_read_in_place: self.chunks_read_in_place.load(Relaxed),
        }
    }
}

fn registry() -> &'static Mutex<BTreeMap<String, Arc<BackendMetrics>>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<String, Arc<BackendMetrics>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The counters of backend `name` (created on first use).
pub fn for_backend(name: &str) -> Arc<BackendMetrics> {
    let mut registry = registry().lock().unwrap_or_else(|p| p.into_inner());
    registry.entry(name.to_owned()).or_default().clone()
}

/// Every backend's counters, by name.
pub fn snapshot() -> BTreeMap<String, Counters> {
    let registry = registry().lock().unwrap_or_else(|p| p.into_inner());
    registry
        .iter()
        .map(|(k, v)| (k.clone(), v.snapshot()))
        .collect()
}

/// The Prometheus text exposition of every counter.
pub fn prometheus_text() -> String {
    let all = snapshot();
    type Family = (&'static str, &'static str, fn(&Counters) -> u64);
    let families: [Family; 16] = [
        (
            "calls",
            "Calls to the backend (puts the host answers in place included).",
            |c| c.calls,
        ),
        ("errors", "Calls that failed (misses excluded).", |c| {
            c.errors
        }),
        ("traps", "Calls whose guest instance trapped.", |c| c.traps),
        ("timeouts", "Calls interrupted at their deadline.", |c| {
            c.timeouts
        }),
        (
            "denials",
            "Capabilities refused by the host, and calls that returned denied.",
            |c| c.denials,
        ),
        ("bytes_in", "Payload bytes passed to backends.", |c| {
            c.bytes_in
        }),
        ("bytes_out", "Payload bytes returned by backends.", |c| {
            c.bytes_out
        }),
        (
            "events_dropped",
            "KV events of the backend's traffic dropped (publish_events).",
            |c| c.events_dropped,
        ),
        (
            "instances_released",
            "Idle guest instances released (idle_release_ms).",
            |c| c.instances_released,
        ),
        (
            "instances_restarted",
            "Guest instances started again on a call after an idle release.",
            |c| c.instances_restarted,
        ),
        (
            "syncs",
            "Files and directories made durable for the backend (payload-io sync-paths).",
            |c| c.syncs,
        ),
        (
            "syncs_skipped",
            "Files and directories sync-paths found durable already, unchanged since the host synced them.",
            |c| c.syncs_skipped,
        ),
        (
            "puts_found_in_place",
            "Chunk puts the host answered already-present itself: a durable chunk in place (builtin:fs).",
            |c| c.puts_found_in_place,
        ),
        (
            "known_chunk_hits",
            "Chunk hashes a guest found in the host's record of what its server holds (known-chunks).",
            |c| c.known_chunk_hits,
        ),
        (
            "http_requests",
            "Outgoing wasi:http requests sent for the backend.",
            |c| c.http_requests,
        ),
        (
            "chunks_read_in_place",
            "get_chunk_into calls whose chunk was read straight into the caller's buffer.",
            |c| c.chunks_read_in_place,
        ),
    ];
    let mut out = String::new();
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP kvwasm_{name}_total {help}");
        let _ = writeln!(out, "# TYPE kvwasm_{name}_total counter");
        for (backend, counters) in &all {
            let _ = writeln!(
                out,
                "kvwasm_{name}_total{{backend=\"{}\"}} {}",
                escape_label(backend),
                value(counters)
            );
        }
    }
    tiered_text(&mut out);
    out
}

/// The counters of one open tiered store (docs/tiering.md): per tier,
/// what it holds and how often reads were served from it; for the store,
/// misses, moves and what the host refused of its advisor's advice.
#[derive(Debug, Default)]
pub struct TierMetrics {
    /// Per tier, fastest first.
    pub tiers: Vec<TierGauges>,
    pub misses: AtomicU64,
    pub promotions: AtomicU64,
    pub demotions: AtomicU64,
    pub evictions: AtomicU64,
    pub moved_bytes: AtomicU64,
    /// Moves whose copy read back different bytes (the source was kept).
    pub verify_failures: AtomicU64,
    /// Advised chunks the host refused.
    pub refused: AtomicU64,
    /// Access records dropped because nobody drained them in time.
    pub accesses_dropped: AtomicU64,
    /// Chunks a move could not take out of their tier (the read of the
    /// source or the copy failed): each is tried at most once per
    /// reservation or demoter pass.
    pub move_failures: AtomicU64,
}

/// One tier's figures.
#[derive(Debug, Default)]
pub struct TierGauges {
    pub name: String,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: AtomicU64,
    pub chunks: AtomicU64,
    pub hits: AtomicU64,
}

fn tier_registry() -> &'static Mutex<BTreeMap<String, std::sync::Weak<TierMetrics>>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<String, std::sync::Weak<TierMetrics>>>> =
        OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Serve `metrics` in `/metrics` as tiered store `label` while it lives.
pub fn register_tiered(label: &str, metrics: &Arc<TierMetrics>) {
    let mut registry = tier_registry().lock().unwrap_or_else(|p| p.into_inner());
    registry.retain(|_, m| m.strong_count() > 0);
    registry.insert(label.to_owned(), Arc::downgrade(metrics));
}

/// The tiered stores' figures, Prometheus text.
fn tiered_text(out: &mut String) {
    let live: Vec<(String, Arc<TierMetrics>)> = {
        let registry = tier_registry().lock().unwrap_or_else(|p| p.into_inner());
        registry
            .iter()
            .filter_map(|(k, m)| m.upgrade().map(|m| (k.clone(), m)))
            .collect()
    };
    if live.is_empty() {
        return;
    }
    type PerTier = (
        &'static str,
        &'static str,
        &'static str,
        fn(&TierGauges) -> u64,
    );
    let per_tier: [PerTier; 4] = [
        ("tier_used_bytes", "gauge", "Bytes held in the tier.", |t| {
            t.used_bytes.load(Relaxed)
        }),
        ("tier_chunks", "gauge", "Chunks held in the tier.", |t| {
            t.chunks.load(Relaxed)
        }),
        (
            "tier_capacity_bytes",
            "gauge",
            "The tier's byte capacity.",
            |t| t.capacity_bytes.unwrap_or(0),
        ),
        (
            "tier_hits_total",
            "counter",
            "Chunk reads served by the tier.",
            |t| t.hits.load(Relaxed),
        ),
    ];
    for (name, kind, help, value) in per_tier {
        let _ = writeln!(
            out,
            "# HELP kvwasm_{name} {help}\n# TYPE kvwasm_{name} {kind}"
        );
        for (store, m) in &live {
            for t in &m.tiers {
                let _ = writeln!(
                    out,
                    "kvwasm_{name}{{store=\"{}\",tier=\"{}\"}} {}",
                    escape_label(store),
                    escape_label(&t.name),
                    value(t)
                );
            }
        }
    }
    type PerStore = (&'static str, &'static str, fn(&TierMetrics) -> &AtomicU64);
    let per_store: [PerStore; 9] = [
        ("tier_misses", "Chunk reads no tier could serve.", |m| {
            &m.misses
        }),
        ("tier_promotions", "Chunks copied one tier up.", |m| {
            &m.promotions
        }),
        ("tier_demotions", "Chunks moved one tier down.", |m| {
            &m.demotions
        }),
        (
            "tier_evictions",
            "Chunk copies removed where another tier keeps one.",
            |m| &m.evictions,
        ),
        ("tier_moved_bytes", "Bytes copied between tiers.", |m| {
            &m.moved_bytes
        }),
        (
            "tier_verify_failures",
            "Moves whose copy read back wrong (source kept).",
            |m| &m.verify_failures,
        ),
        (
            "tier_advice_refused",
            "Advised chunks the host refused.",
            |m| &m.refused,
        ),
        (
            "tier_accesses_dropped",
            "Access records no advisor drained in time.",
            |m| &m.accesses_dropped,
        ),
        (
            "tier_move_failures",
            "Chunks a move could not take out of their tier (source kept).",
            |m| &m.move_failures,
        ),
    ];
    for (name, help, value) in per_store {
        let _ = writeln!(
            out,
            "# HELP kvwasm_{name}_total {help}\n# TYPE kvwasm_{name}_total counter"
        );
        for (store, m) in &live {
            let _ = writeln!(
                out,
                "kvwasm_{name}_total{{store=\"{}\"}} {}",
                escape_label(store),
                value(m).load(Relaxed)
            );
        }
    }
}

/// `value` as a Prometheus label value (backslash, quote and newline escaped).
pub fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serve `/metrics` on `$KVWASM_METRICS_ADDR`, once per process, if set.
pub fn serve_from_env() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let Some(addr) = std::env::var_os(METRICS_ADDR_ENV).and_then(|a| a.into_string().ok())
        else {
            return;
        };
        match tiny_http::Server::http(&addr) {
            Ok(server) => {
                tracing::info!(%addr, "serving kvwasm metrics at /metrics");
                let spawned = std::thread::Builder::new()
                    .name("kvwasm-metrics".into())
                    .spawn(move || serve(server));
                if let Err(e) = spawned {
                    tracing::warn!("cannot start the metrics thread: {e}");
                }
            }
            Err(e) => tracing::warn!(%addr, "cannot serve metrics on {METRICS_ADDR_ENV}: {e}"),
        }
    });
}

fn serve(server: tiny_http::Server) {
    for request in server.incoming_requests() {
        let response = if request.url() == "/metrics" {
            let header = tiny_http::Header::from_bytes(
                "Content-Type",
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .expect("static header");
            tiny_http::Response::from_string(prometheus_text()).with_header(header)
        } else {
            tiny_http::Response::from_string("kvwasm: try /metrics\n").with_status_code(404)
        };
        let _ = request.respond(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_and_failure_kinds() {
        let m = for_backend("metrics-test");
        m.record(10, 0, None);
        m.record(0, 5, Some(&KvError::NotFound));
        m.record(0, 0, Some(&KvError::Trapped("x".into())));
        m.record(0, 0, Some(&KvError::Timeout(5)));
        m.record(0, 0, Some(&KvError::Denied("no".into())));
        m.denial();
        let c = m.snapshot();
        assert_eq!((c.calls, c.errors, c.traps, c.timeouts), (5, 3, 1, 1));
        assert_eq!((c.denials, c.bytes_in, c.bytes_out), (2, 10, 5));
        let text = prometheus_text();
        assert!(
            text.contains("kvwasm_calls_total{backend=\"metrics-test\"} 5"),
            "{text}"
        );
        assert!(text.contains("# TYPE kvwasm_denials_total counter"));
    }
}
