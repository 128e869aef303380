//! `/metrics`: the host's guest counters, then the service's and the
//! sources', in Prometheus' text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use kvwasm_host::metrics::escape_label;

use crate::{GuestCell, GuestStats, Service};

impl Service {
    /// `/metrics`: the host's guest counters, then the service's and the
    /// sources'.
    pub(crate) fn metrics_text(&self) -> String {
        let mut out = kvwasm_host::metrics::prometheus_text();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP kvwasm_{name} {help}");
            let _ = writeln!(out, "# TYPE kvwasm_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "kvwasm_{name}{labels} {value}");
            }
        };
        family(
            "serve_events_in_total",
            "counter",
            "Events received from the sources.",
            vec![(String::new(), self.feed.events_in.load(Relaxed))],
        );
        family(
            "serve_held_response_bytes",
            "gauge",
            "Bytes of guest answers held for clients that have not read them yet.",
            vec![(String::new(), self.caps.held_bytes())],
        );
        family(
            "serve_events_pending",
            "gauge",
            "Events held until their worker is registered.",
            vec![(String::new(), self.pending.held() as u64)],
        );
        family(
            "serve_events_pending_dropped_total",
            "counter",
            "Events of unregistered workers dropped: pending_events were held already.",
            vec![(String::new(), self.pending.dropped.load(Relaxed))],
        );
        family(
            "serve_log_events",
            "gauge",
            "Events held by the replay log.",
            vec![(String::new(), self.feed.log.events() as u64)],
        );
        type Stat = fn(&GuestStats) -> u64;
        let guest_families: [(&str, &str, &str, Stat); 8] = [
            (
                "serve_events_delivered_total",
                "counter",
                "Events handed to the guest.",
                |s| s.delivered.load(Relaxed),
            ),
            (
                "serve_events_dropped_total",
                "counter",
                "Events lost to the guest: deferred, then gone from the log.",
                |s| s.dropped.load(Relaxed),
            ),
            (
                "serve_events_deferred_total",
                "counter",
                "Events that did not fit the guest's queue, delivered from the log.",
                |s| s.deferred.load(Relaxed),
            ),
            (
                "serve_queued_events",
                "gauge",
                "Events waiting in the guest's queue.",
                |s| s.queued.load(Relaxed) as u64,
            ),
            ("serve_batches_total", "counter", "on-batch calls.", |s| {
                s.batches.load(Relaxed)
            }),
            (
                "serve_batch_errors_total",
                "counter",
                "on-batch calls that failed.",
                |s| s.batch_errors.load(Relaxed),
            ),
            (
                "serve_rebuilds_total",
                "counter",
                "Replaced instances rebuilt from the log.",
                |s| s.rebuilds.load(Relaxed),
            ),
            (
                "serve_backoffs_total",
                "counter",
                "Back-offs started: instances lost 3 times or more in a row.",
                |s| s.backoffs.load(Relaxed),
            ),
        ];
        for (name, kind, help, stat) in guest_families {
            let samples = self.guest_samples(|c| stat(&c.stats));
            family(name, kind, help, samples);
        }
        family(
            "serve_diverged",
            "gauge",
            "1 while events were lost to the guest and its state was not replaced since.",
            self.guest_samples(|c| u64::from(c.diverged())),
        );
        let indexer = self.indexer();
        let indexer_samples = |value: u64| -> Vec<(String, u64)> {
            indexer
                .iter()
                .map(|c| (format!("{{guest=\"{}\"}}", escape_label(c.name())), value))
                .collect()
        };
        family(
            "serve_peer_rebuilds_total",
            "counter",
            "Diverged indexer states replaced by a peer's /dump, automatically.",
            indexer_samples(self.rebuilds.done.load(Relaxed)),
        );
        family(
            "serve_peer_rebuild_failures_total",
            "counter",
            "Attempts to rebuild a diverged indexer that failed (no peer, or none answered).",
            indexer_samples(self.rebuilds.failed.load(Relaxed)),
        );
        let requests = self
            .http_stats
            .snapshot()
            .into_iter()
            .map(|((endpoint, class), n)| {
                (format!("{{endpoint=\"{endpoint}\",class=\"{class}\"}}"), n)
            })
            .collect();
        family(
            "serve_http_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status class.",
            requests,
        );
        let mut by_counter: BTreeMap<&'static str, Vec<(String, u64)>> = BTreeMap::new();
        let zmq = self.zmq.lock().unwrap_or_else(|p| p.into_inner());
        let zmq_labels = zmq.iter().map(|((model, group, instance, rank), source)| {
            (
                format!("zmq:{instance}:{rank}@{model}/{group}"),
                &source.handle,
            )
        });
        let nats_labels = self
            .nats
            .iter()
            .map(|(label, handle)| (label.clone(), handle));
        for (label, handle) in zmq_labels.chain(nats_labels) {
            for (counter, value) in handle.counters.snapshot() {
                let labels = format!("{{source=\"{}\"}}", escape_label(&label));
                by_counter.entry(counter).or_default().push((labels, value));
            }
        }
        for (counter, samples) in by_counter {
            family(
                &format!("source_{counter}_total"),
                "counter",
                "An event source's counter.",
                samples,
            );
        }
        out
    }

    /// One `{guest="…"}` sample per guest.
    fn guest_samples(&self, value: impl Fn(&GuestCell) -> u64) -> Vec<(String, u64)> {
        self.feed
            .cells
            .iter()
            .map(|c| {
                (
                    format!("{{guest=\"{}\"}}", escape_label(c.name())),
                    value(c),
                )
            })
            .collect()
    }
}
