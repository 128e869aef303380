//! `kvwasm bench`: kv_store_v1 backends measured side by side through the C
//! ABI, loaded with `dlopen` as a consumer does.
//!
//! The first target is the baseline (normally the native C backend); every
//! figure of the others is also given as a ratio to it. Within a repetition
//! the targets run back to back, alternating which goes first, so that slow
//! drift on a noisy machine hits them alike.

pub mod component;
mod cpu;
pub mod events;
pub mod fabric;
pub mod floor;
pub mod plot;
pub mod remote;
pub mod report;
pub mod scale;
mod stats;
mod target;
mod workloads;

use std::path::PathBuf;
use std::time::Duration;

pub use stats::Stat;
pub use target::{Medium, Target};
pub use workloads::open_probe;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Backends; the first is the baseline.
    pub targets: Vec<Target>,
    /// Directories to run on (e.g. tmpfs and disk); the first also hosts
    /// the thread, small-call, open and memory measurements.
    pub media: Vec<Medium>,
    pub reps: usize,
    /// Seconds, not minutes: tiny sizes, one repetition. For CI smoke runs.
    pub quick: bool,
    /// How to start a fresh process that times its first `open`
    /// (`exe args... --lib L --uri U`), for the first-use latency.
    pub open_probe: Option<(PathBuf, Vec<std::ffi::OsString>)>,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// The sections to run (all by default).
    pub sections: Vec<Section>,
}

/// A part of the benchmark, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum Section {
    /// put/get throughput per chunk size, per directory.
    Throughput,
    /// 96 × 1 MiB saves (cold, warm, warm on a new handle) and restores.
    SaveRestore,
    /// Warm saves of 96 × 1 MiB and 257 × 2 KiB on one long-lived handle
    /// after 0, 0.2, 1.5 and 5 s idle, and on a new handle per save.
    IdleSaves,
    /// The cost of one call that does nothing, warm and with the core's
    /// caches swept first, and under it the floor: a bare wasmtime component
    /// call.
    SmallCall,
    /// 1 and 4 threads on one handle, and 8 threads on 8 handles.
    Threads,
    /// `open` latency.
    Open,
    /// Resident memory per open handle.
    Memory,
}

impl Section {
    pub const ALL: [Section; 7] = [
        Section::Throughput,
        Section::SaveRestore,
        Section::IdleSaves,
        Section::SmallCall,
        Section::Threads,
        Section::Open,
        Section::Memory,
    ];
}

/// Chunk sizes of the throughput matrix.
pub const CHUNK_SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

/// Every measurement of one run.
#[derive(Debug, serde::Serialize)]
pub struct Results {
    pub targets: Vec<String>,
    pub media: Vec<Medium>,
    pub reps: usize,
    pub quick: bool,
    /// The sections that ran; the others are empty.
    pub sections: Vec<Section>,
    /// GB/s per target, by medium, chunk size and operation.
    pub throughput: Vec<Row>,
    /// Milliseconds per target: 96 × 1 MiB saves and restores, by medium.
    pub save_restore: Vec<Row>,
    /// Milliseconds per target: warm saves after idle gaps, by medium.
    pub idle_saves: Vec<Row>,
    /// Nanoseconds per `get_manifest` of a missing name.
    pub small_call: Option<Row>,
    /// The same with the core's caches swept before each call.
    pub cold_call: Option<Row>,
    /// Nanoseconds per bare wasmtime component call: the floor under the
    /// small call, measured with it.
    pub call_floor: Option<floor::CallFloor>,
    /// GB/s at 1 MiB with 1 and with 4 threads on one handle, and with 8
    /// threads on 8 handles.
    pub threads: Vec<Row>,
    /// Milliseconds for `open`.
    pub open: Vec<Row>,
    /// Resident memory per open handle, KiB.
    pub memory_per_handle: Option<Row>,
}

/// One measured case: a statistic per target, in `Results::targets` order.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub medium: String,
    pub case: String,
    pub unit: Unit,
    pub per_target: Vec<Stat>,
}

/// The unit of a row's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Unit {
    GBps,
    Millis,
    Nanos,
    KiB,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::GBps => "GB/s",
            Unit::Millis => "ms",
            Unit::Nanos => "ns",
            Unit::KiB => "KiB",
        }
    }
}

/// Run the plan.
pub fn run(plan: &Plan) -> Result<Results, String> {
    if plan.targets.is_empty() || plan.media.is_empty() {
        return Err("nothing to measure: no targets or no directories".into());
    }
    let loaded = plan
        .targets
        .iter()
        .map(Target::load)
        .collect::<Result<Vec<_>, _>>()?;
    let mut w = workloads::Workloads::new(plan, &loaded);
    let on = |s: Section| plan.sections.contains(&s);
    let results = Results {
        targets: plan.targets.iter().map(|t| t.label.clone()).collect(),
        media: plan.media.clone(),
        reps: plan.reps,
        quick: plan.quick,
        sections: plan.sections.clone(),
        throughput: when(on(Section::Throughput), || w.throughput())?,
        save_restore: when(on(Section::SaveRestore), || w.save_restore())?,
        idle_saves: when(on(Section::IdleSaves), || w.idle_saves())?,
        small_call: when(on(Section::SmallCall), || w.small_call().map(Some))?,
        cold_call: when(on(Section::SmallCall), || w.cold_small_call().map(Some))?,
        call_floor: when(on(Section::SmallCall), || {
            let calls = if plan.quick { 20_000 } else { 200_000 };
            floor::measure(plan.reps, calls).map(Some)
        })?,
        threads: when(on(Section::Threads), || w.threads())?,
        open: when(on(Section::Open), || w.open_latency())?,
        memory_per_handle: when(on(Section::Memory), || w.memory_per_handle().map(Some))?,
    };
    w.finish();
    Ok(results)
}

/// Run a section if it was asked for; an empty result if not.
fn when<T: Default>(wanted: bool, run: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    if wanted { run() } else { Ok(T::default()) }
}

/// A pause between phases lets writeback from the previous one settle.
const SETTLE: Duration = Duration::from_millis(200);
