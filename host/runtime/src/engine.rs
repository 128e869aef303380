//! The process-wide wasmtime [`Engine`]s and their epoch ticker.
//!
//! One engine per process for ordinary backends, and a second one, created
//! only if a backend sets `fuel`, whose code counts fuel: metering changes
//! the generated code, so the two never share compiled artifacts (the
//! artifact cache key includes the engine's compatibility hash). The ticker
//! thread that drives call deadlines starts with the first store (not with
//! the engine, which may be built when the library is loaded, where no
//! thread is started: see [`crate::prepare`]) and lives as long as the
//! process.
//!
//! Guests are called asynchronously (wasmtime's `async` feature; every call
//! runs on a fiber) so that a deadline can abandon a guest blocked in a host
//! import: see [`crate::deadline`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use wasmtime::{Config, Engine, OptLevel};

use crate::error::KvError;
use crate::limits::EPOCH_TICK;

/// Whether compiled code meters fuel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metering {
    /// Deadlines only (epoch interruption): no per-instruction cost.
    Off,
    /// Deadlines, and a fuel budget per call.
    Fuel,
}

/// The shared engine for ordinary backends, created on first use.
pub fn engine() -> &'static Engine {
    engine_for(Metering::Off)
}

/// One engine per [`Metering`], each created on first use.
static ENGINES: [OnceLock<Engine>; 2] = [OnceLock::new(), OnceLock::new()];

/// The shared engine for `metering`, created on first use.
pub fn engine_for(metering: Metering) -> &'static Engine {
    ENGINES[metering as usize].get_or_init(|| {
        Engine::new(&config(metering)).expect("the kvwasm engine configuration is valid")
    })
}

/// Start the epoch ticker if it is not running yet: called before any
/// store is created, so every store's deadline is driven. One thread
/// advances every engine created so far (at most two). A failed start
/// (no thread could be created) fails this store only; the next tries
/// again.
pub(crate) fn ensure_ticking() -> Result<(), KvError> {
    static STARTED: AtomicBool = AtomicBool::new(false);
    static STARTING: Mutex<()> = Mutex::new(());
    if STARTED.load(Ordering::Acquire) {
        return Ok(());
    }
    let _starting = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
    if STARTED.load(Ordering::Acquire) {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("kvwasm-epoch".into())
        .spawn(tick_forever)
        .map_err(|e| KvError::host("cannot start the epoch ticker thread", e))?;
    // SAFETY: registers a handler that only stores to an atomic, which is
    // async-signal-safe (all a forked child may run).
    unsafe { libc::pthread_atfork(None, None, Some(mark_forked)) };
    STARTED.store(true, Ordering::Release);
    Ok(())
}

/// The ticker: one tick per [`EPOCH_TICK`] of wall time since it started.
/// It sleeps until each tick's due time rather than for a fixed interval,
/// and a wake-up that comes late (a loaded machine) counts every tick it
/// missed, so the tick count stays in step with the wall clock: deadlines
/// and idle times counted in ticks do not stretch under load.
fn tick_forever() {
    let started = Instant::now();
    let tick_ns = u64::try_from(EPOCH_TICK.as_nanos()).unwrap_or(u64::MAX);
    let mut counted = 0u64;
    loop {
        let due = started + Duration::from_nanos(tick_ns.saturating_mul(counted + 1));
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let now = ticks_in_floor(started.elapsed()).max(counted + 1);
        for _ in counted..now {
            for engine in ENGINES.iter().filter_map(OnceLock::get) {
                engine.increment_epoch();
            }
        }
        TICKS.store(now, Ordering::Relaxed);
        counted = now;
    }
}

/// Ticks since the ticker started, advanced with the engines' epochs.
static TICKS: AtomicU64 = AtomicU64::new(0);

/// A clock of [`EPOCH_TICK`] resolution, kept in step with the wall clock
/// by the ticker, that costs one atomic load: for what is counted in ticks
/// anyway (epoch deadlines) or needs no finer resolution (idle times).
/// Every call would otherwise read the system clock several times.
pub(crate) fn ticks() -> u64 {
    TICKS.load(Ordering::Relaxed)
}

/// `duration` in ticks, rounded up (saturating).
pub(crate) fn ticks_in(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(EPOCH_TICK.as_nanos())).unwrap_or(u64::MAX)
}

/// Whole ticks in `duration`, rounded down (saturating).
fn ticks_in_floor(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos() / EPOCH_TICK.as_nanos()).unwrap_or(u64::MAX)
}

/// Set in a child forked after the host started its threads: the ticker,
/// the I/O runtime and the reaper did not follow it, so a guest call there
/// would run without a deadline or wait forever for I/O.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Refuse, in a process forked after the host started its threads, every
/// call that would need them (a clear error instead of a hang). A fork
/// before the first open is fine: nothing has started yet.
pub fn check_not_forked() -> Result<(), KvError> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(KvError::Host(
            "this process was forked after kvwasm started its threads (first open in the \
             parent): the child cannot run guests; open stores in the child only, or fork \
             before the first open"
                .into(),
        ));
    }
    Ok(())
}

/// The engine configuration. Anything that changes generated code must be
/// set here: [`Engine::precompile_compatibility_hash`] covers it, so cached
/// artifacts from another configuration are never loaded.
fn config(metering: Metering) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.consume_fuel(metering == Metering::Fuel);
    config.cranelift_opt_level(OptLevel::Speed);
    // For profiling guests with `perf` (docs/benchmarks.md): wasmtime
    // writes /tmp/perf-PID.map naming the compiled guest functions.
    if std::env::var_os("KVWASM_PERFMAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    // Proposals no shipped guest uses are off: each is attack surface, and
    // multi-memory would let one core module hold many linear memories.
    // (The instance's total memory is capped by `limits` either way.)
    config.wasm_multi_memory(false);
    config.wasm_memory64(false);
    config.wasm_tail_call(false);
    config.wasm_relaxed_simd(false);
    // Extended constant expressions (integer add, sub and mul in a global
    // or segment initialiser, nothing else): Python backends need them
    // (componentize-py links CPython as shared libraries, whose data
    // segments sit at `__memory_base + offset`).
    config.wasm_extended_const(true);
    config.wasm_wide_arithmetic(false);
    config.wasm_custom_page_sizes(false);
    config
}
