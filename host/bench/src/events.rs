//! `kvwasm bench --events`: the KV indexer guest (`builtin:kv-indexer`
//! behind [`kvwasm_host::subscriber::Subscriber`]) against the same
//! indexer core running natively, in one run (issue 14's targets).
//!
//! * **Ingest**: a synthetic trace ([`trace`]) of stored and removed
//!   blocks over many workers with shared prefixes, handed over in batches
//!   (`on-batch` for the guest, [`Indexer::ingest`] natively); events/s.
//! * **Query**: `/query` of 4,096-token prompts through the guest's
//!   `http-api.handle` and through [`Indexer::handle`], alternating per
//!   prompt; latency percentiles.
//!
//! The WIT events and request bodies are built before the clock starts:
//! a host feeding the guest already holds them, so what is measured is the
//! crossing into the sandbox and the guest's own work.

use std::sync::Arc;
use std::time::Instant;

use kvwasm_host::subscriber::{self as wit, Subscriber};
use kvwasm_indexer_protocol::api::{RegisterRequest, default_group};
use kvwasm_kv_indexer_core::{Event, EventData, Indexer, Stored, hash};

use crate::Stat;

/// The model every trace event and query names.
pub const MODEL: &str = "bench";

/// What a run measures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Shape {
    /// Stored blocks in the trace (removals come on top).
    pub blocks: usize,
    pub workers: u64,
    pub block_size: u32,
    /// Events per `on-batch`.
    pub batch: usize,
    /// Tokens per `/query` prompt.
    pub prompt_tokens: usize,
    /// `/query` calls per repetition, per side.
    pub queries: usize,
}

impl Shape {
    /// The shape (1,000,000 blocks over 64 workers, 4,096-token
    /// prompts), or a seconds-long smoke run.
    pub fn new(quick: bool) -> Shape {
        Shape {
            blocks: if quick { 20_000 } else { 1_000_000 },
            workers: if quick { 8 } else { 64 },
            block_size: 16,
            batch: 1024,
            prompt_tokens: 4096,
            queries: if quick { 50 } else { 1000 },
        }
    }
}

/// A synthetic event stream and prompts to query it with.
pub struct Trace {
    pub events: Vec<Event>,
    /// Stored blocks in `events`.
    pub blocks: usize,
    pub prompts: Vec<Vec<u32>>,
}

/// Shared prompt prefixes (system prompts, few-shot headers).
const PREFIXES: usize = 256;
const PREFIX_BLOCKS: usize = 32;
/// Blocks per stored event (an engine step stores a few blocks at a time).
const BLOCKS_PER_EVENT: usize = 16;

/// Requests on random workers, each a shared prefix (skewed: a few are
/// popular) plus a unique suffix, up to `prompt_tokens`. A worker stores a
/// prefix once and then only suffixes, and evicts its oldest suffixes
/// (leaf first) beyond half its share of the blocks. Engine hashes chain
/// over the prefix, so equal blocks have equal hashes on every worker.
/// Events name the (model, tenant), as a registered source tags them.
pub fn trace(shape: &Shape) -> Trace {
    let size = shape.block_size as usize;
    let max_blocks = shape.prompt_tokens / size;
    let mut rng = Rng(0x243f_6a88_85a3_08d3);
    let prefixes: Vec<Vec<u32>> = (0..PREFIXES)
        .map(|_| rng.tokens(PREFIX_BLOCKS * size))
        .collect();
    let prefix_hashes: Vec<Vec<u64>> = prefixes.iter().map(|p| chain(0, p, size)).collect();
    let capacity = (shape.blocks / shape.workers as usize / 2).max(max_blocks);
    let mut held = vec![vec![false; PREFIXES]; shape.workers as usize];
    let mut fifo: Vec<std::collections::VecDeque<Vec<u64>>> =
        vec![Default::default(); shape.workers as usize];
    let mut retained = vec![0usize; shape.workers as usize];
    let (mut events, mut blocks, mut prompts) = (Vec::new(), 0, Vec::new());
    let mut event_id = 0u64;
    let mut push = |events: &mut Vec<Event>, worker: u64, data: EventData| {
        event_id += 1;
        events.push(Event {
            worker_id: worker,
            dp_rank: 0,
            event_id,
            model: Some(MODEL.into()),
            tenant: Some("default".into()),
            data,
        });
    };
    while blocks < shape.blocks {
        let worker = rng.below(shape.workers);
        let w = worker as usize;
        let unit = rng.below(1 << 16) as f64 / 65536.0;
        let p = ((unit * unit) * PREFIXES as f64) as usize;
        let suffix_blocks = 8 + rng.below((max_blocks - PREFIX_BLOCKS - 8) as u64 + 1) as usize;
        let suffix = rng.tokens(suffix_blocks * size);
        let last_prefix = *prefix_hashes[p].last().expect("prefix blocks");
        let suffix_hashes = chain(last_prefix, &suffix, size);
        let mut stores = Vec::new();
        if !held[w][p] {
            held[w][p] = true;
            stores.push((None, prefix_hashes[p].clone(), prefixes[p].clone()));
        }
        stores.push((Some(last_prefix), suffix_hashes.clone(), suffix.clone()));
        for (mut parent, hashes, tokens) in stores {
            for (h, t) in hashes
                .chunks(BLOCKS_PER_EVENT)
                .zip(tokens.chunks(BLOCKS_PER_EVENT * size))
            {
                let stored = Stored {
                    block_hashes: h.to_vec(),
                    parent_hash: parent,
                    token_ids: t.to_vec(),
                    tokens_hashes: Vec::new(),
                    block_size: Some(shape.block_size),
                    lora_name: None,
                };
                push(&mut events, worker, EventData::Stored(stored));
                blocks += h.len();
                parent = h.last().copied();
            }
        }
        retained[w] += suffix_hashes.len();
        fifo[w].push_back(suffix_hashes);
        while retained[w] > capacity {
            let mut oldest = fifo[w].pop_front().expect("retained blocks");
            retained[w] -= oldest.len();
            oldest.reverse();
            push(&mut events, worker, EventData::Removed(oldest));
        }
        if prompts.len() < shape.queries.min(512) && rng.below(4) == 0 {
            let mut prompt = prefixes[p].clone();
            prompt.extend_from_slice(&suffix);
            prompt.extend(rng.tokens(shape.prompt_tokens - prompt.len()));
            prompts.push(prompt);
        }
    }
    Trace {
        events,
        blocks,
        prompts,
    }
}

/// Engine hashes of the full blocks of `tokens` after `parent`: a chain,
/// as vLLM's are.
fn chain(mut parent: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    hash::block_hashes(tokens, block_size as u32, None)
        .into_iter()
        .map(|local| {
            parent = (parent ^ local)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(29);
            parent
        })
        .collect()
}

/// A core event as the host hands it to a guest (from a ZMQ source, on
/// the device tier).
pub fn to_wit(event: &Event) -> wit::Event {
    let data = match &event.data {
        EventData::Stored(s) => wit::EventData::Stored(wit::BlocksStored {
            block_hashes: s.block_hashes.clone(),
            parent_hash: s.parent_hash,
            token_ids: s.token_ids.clone(),
            tokens_hashes: s.tokens_hashes.clone(),
            block_size: s.block_size,
            lora_name: s.lora_name.clone(),
            tier: Some(wit::Tier::Device),
        }),
        EventData::Removed(hashes) => wit::EventData::Removed(wit::BlocksRemoved {
            block_hashes: hashes.clone(),
            tier: Some(wit::Tier::Device),
        }),
        EventData::Cleared => wit::EventData::Cleared,
    };
    wit::Event {
        worker_id: event.worker_id,
        dp_rank: event.dp_rank,
        event_id: event.event_id,
        source: wit::SourceKind::Zmq,
        model: event.model.clone(),
        tenant: event.tenant.clone(),
        data,
    }
}

/// `/register` bodies for workers `0..workers` (rank 0) of [`MODEL`].
pub fn registrations(shape: &Shape) -> Vec<Vec<u8>> {
    (0..shape.workers)
        .map(|id| {
            let registration = RegisterRequest {
                instance_id: id,
                endpoint: Some(format!("tcp://127.0.0.1:{}", 20000 + id)),
                model_name: MODEL.into(),
                routing_group: default_group(),
                tenant_id: None,
                block_size: shape.block_size,
                dp_rank: None,
                replay_endpoint: None,
                lora_name: None,
            };
            serde_json::to_vec(&registration).expect("plain data serialises")
        })
        .collect()
}

/// A `/query` body for `prompt`.
pub fn query_body(prompt: &[u32]) -> Vec<u8> {
    serde_json::json!({"token_ids": prompt, "model_name": MODEL})
        .to_string()
        .into_bytes()
}

/// A `builtin:kv-indexer` subscriber with room for a large trace.
pub fn start_guest() -> Result<Subscriber, String> {
    kvwasm_kv_indexer_host::install();
    let config = kvwasm_host::config::Config::parse(
        "[subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\nmemory_limit_mib = 4096\n\
         call_timeout_ms = 600000\n",
        std::path::Path::new("."),
    )?;
    Subscriber::start(Arc::new(config.subscriber("idx")?)).map_err(|e| e.to_string())
}

/// One request to the guest's API.
pub fn request(method: &str, path: &str, body: Vec<u8>) -> wit::Request {
    wit::Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        body,
    }
}

/// Everything one `--events` run measured.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub shape: Shape,
    pub events: usize,
    pub blocks: usize,
    /// Events per second, per repetition.
    pub ingest_native: Stat,
    pub ingest_guest: Stat,
    /// `/query` latency in microseconds, all calls of all repetitions.
    pub query_native: Percentiles,
    pub query_guest: Percentiles,
    pub reps: usize,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    fn of(mut micros: Vec<f64>) -> Percentiles {
        micros.sort_by(f64::total_cmp);
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// Run the benchmark: per repetition, the trace into a fresh native
/// indexer and a fresh guest, then the queries against both.
pub fn run(shape: Shape, reps: usize) -> Result<Report, String> {
    let trace = trace(&shape);
    let batches: Vec<&[Event]> = trace.events.chunks(shape.batch).collect();
    let wit_batches: Vec<Vec<wit::Event>> = batches
        .iter()
        .map(|b| b.iter().map(to_wit).collect())
        .collect();
    let bodies: Vec<Vec<u8>> = trace.prompts.iter().map(|p| query_body(p)).collect();
    let registrations = registrations(&shape);
    let events = trace.events.len() as f64;
    let (mut ingest_native, mut ingest_guest) = (Vec::new(), Vec::new());
    let (mut query_native, mut query_guest) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let mut native = Indexer::default();
        for body in &registrations {
            expect(201, native.handle("POST", "/register", "", body).0)?;
        }
        let guest = start_guest()?;
        for body in &registrations {
            let answer = guest
                .handle(&request("POST", "/register", body.clone()))
                .map_err(|e| e.to_string())?;
            expect(201, answer.status)?;
        }
        // Alternate which side goes first, so drift hits both alike.
        for side in [rep % 2, 1 - rep % 2] {
            if side == 0 {
                let started = Instant::now();
                let rejected: usize = batches.iter().map(|batch| native.ingest(batch)).sum();
                ingest_native.push(events / started.elapsed().as_secs_f64());
                if rejected > 0 {
                    return Err(format!("{rejected} trace events were not applied natively"));
                }
            } else {
                // `on_batch` pre-hashes token ids in place: each repetition
                // gets its own copy, made before the clock started.
                let mut copies = wit_batches.clone();
                let started = Instant::now();
                for batch in &mut copies {
                    guest
                        .on_batch(batch)
                        .map_err(|e| format!("on-batch: {e}"))?;
                }
                ingest_guest.push(events / started.elapsed().as_secs_f64());
            }
        }

        for i in 0..shape.queries {
            let body = &bodies[i % bodies.len()];
            let started = Instant::now();
            let (status, native_answer) = native.handle("POST", "/query", "", body);
            query_native.push(started.elapsed().as_secs_f64() * 1e6);
            expect(200, status)?;
            let request = request("POST", "/query", body.clone());
            let started = Instant::now();
            let answer = guest.handle(&request).map_err(|e| e.to_string())?;
            query_guest.push(started.elapsed().as_secs_f64() * 1e6);
            if answer.body != native_answer {
                return Err("the guest and the native indexer answered differently".into());
            }
        }
    }
    Ok(Report {
        shape,
        events: trace.events.len(),
        blocks: trace.blocks,
        ingest_native: Stat::new(ingest_native),
        ingest_guest: Stat::new(ingest_guest),
        query_native: Percentiles::of(query_native),
        query_guest: Percentiles::of(query_guest),
        reps,
    })
}

fn expect(status: u16, got: u16) -> Result<(), String> {
    if got == status {
        Ok(())
    } else {
        Err(format!("expected status {status}, got {got}"))
    }
}

/// The report as a Markdown table with the targets.
pub fn markdown(r: &Report) -> String {
    let ratio = r.ingest_guest.paired_ratio(&r.ingest_native);
    let verdict = |met: bool| if met { "met" } else { "missed" };
    let (p50, p99) = (
        r.query_guest.p50 / r.query_native.p50,
        r.query_guest.p99 / r.query_native.p99,
    );
    let mut out = format!(
        "Trace: {} events ({} stored blocks, removals on top) over {} workers, block size {}, \
         {} events per batch; /query of {}-token prompts, {} calls per side per repetition.\n\n",
        r.events,
        r.blocks,
        r.shape.workers,
        r.shape.block_size,
        r.shape.batch,
        r.shape.prompt_tokens,
        r.shape.queries,
    );
    out += "| case | native core | kv-indexer guest | ratio | target |\n|---|---|---|---|---|\n";
    out += &format!(
        "| ingest, events/s (median, min–max) | {:.0} ({:.0}–{:.0}) | {:.0} ({:.0}–{:.0}) | {ratio:.2}× | ≥ 0.67× {} |\n",
        r.ingest_native.median,
        r.ingest_native.min,
        r.ingest_native.max,
        r.ingest_guest.median,
        r.ingest_guest.min,
        r.ingest_guest.max,
        verdict(ratio >= 0.67),
    );
    out += &format!(
        "| /query p50, µs | {:.1} | {:.1} | {p50:.2}× | ≤ 1.5× {} |\n",
        r.query_native.p50,
        r.query_guest.p50,
        verdict(p50 <= 1.5),
    );
    out += &format!(
        "| /query p99, µs | {:.1} | {:.1} | {p99:.2}× | ≤ 1.5× {} |\n",
        r.query_native.p99,
        r.query_guest.p99,
        verdict(p99 <= 1.5),
    );
    out += &format!(
        "\n{} repetitions; the ingest ratio is the median of per-repetition ratios.\n",
        r.reps
    );
    out
}

/// xorshift64*: a fixed, fast stream for a reproducible trace.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Token ids from a 32,000-token vocabulary.
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.below(32_000) as u32).collect()
    }
}
