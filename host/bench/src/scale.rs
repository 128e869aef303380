//! `kvwasm bench --scale`: many open handles in one process.
//!
//! One process opens N handles (1,000 by default) spread over 10 backends
//! (`[backends.b0..b9]`, builtin:fs on the scratch directory) and 100
//! tenants (`[backends.bK.tenants.tNNN]`, each with its own limits), and as
//! many handles of the native backend. It reports the open latency
//! distribution with a warm artifact cache, the resident memory an idle
//! handle holds (after open, after one call, and after its instance was
//! released for idleness), what the first call after a release costs, the
//! process's RSS, and small calls made round-robin over all the open
//! handles against the native backend's.
//!
//! Each repetition is a fresh child process (`kvwasm bench --scale-probe`)
//! with `KVWASM_CONFIG` naming the generated config, so first opens and
//! resident memory are the process's own. The child prints one JSON line.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kv_store_abi::{Handle, Library};

use crate::stats::Stat;
use crate::workloads::{resident_kib, time};
use crate::{Row, Unit};

/// Backends in the generated config.
pub const BACKENDS: usize = 10;
/// Tenants per backend in the generated config.
pub const TENANTS: usize = 100;
/// Handles opened (and used once) before the resident-memory baseline is
/// taken, so one-time costs (engine, code, first instance of each backend)
/// are not charged to the handles measured.
const WARM_HANDLES: usize = BACKENDS;
const SMALL: usize = 4 << 10;
/// `idle_release_ms` of the generated backends: longer than opening and
/// using every handle takes on a loaded machine, so the rows before the
/// release measure handles that still hold their instance.
pub const IDLE_RELEASE_MS: u64 = 2000;
/// How long the probe leaves the handles idle before measuring them
/// released: the release time plus the reaper's period (a quarter of it)
/// and slack.
const IDLE_WAIT: Duration = Duration::from_millis(IDLE_RELEASE_MS * 3 / 2 + 500);

/// What to run.
#[derive(Debug, Clone)]
pub struct ScalePlan {
    pub native: PathBuf,
    pub shim: PathBuf,
    /// Scratch directory (tmpfs in the reported runs).
    pub dir: PathBuf,
    /// Handles of each library open at once.
    pub handles: usize,
    pub reps: usize,
    pub quick: bool,
    /// How to start the child: `exe args...` (it appends `--scale-probe ...`).
    pub probe: (PathBuf, Vec<OsString>),
}

/// One child's measurements.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ScaleSample {
    /// Loading the library (`dlopen` and `kv_store_get_vtable`, where the
    /// shim does its one-time setup), wall ms.
    pub load_ms: f64,
    pub native_load_ms: f64,
    /// kvwasm `open` times in order, ms (the first of each backend included).
    pub open_ms: Vec<f64>,
    pub native_open_ms: Vec<f64>,
    /// The same opens' CPU time on the opening thread, ms: on a loaded
    /// machine, wall-time outliers are mostly waits for a core.
    pub open_cpu_ms: Vec<f64>,
    pub native_open_cpu_ms: Vec<f64>,
    /// KiB per handle: resident (VmRSS) idle after open, resident after
    /// one put + get, and proportional (PSS, shared pages divided among
    /// their mappers) after the put + get; then resident and proportional
    /// after a manifest and `IDLE_WAIT` idle (kvwasm: instance released).
    pub kib_per_handle: [f64; 5],
    pub native_kib_per_handle: [f64; 5],
    /// The first call on each handle after that wait (get_manifest of a
    /// missing name; kvwasm: starts an instance again), ms.
    pub first_call_ms: Vec<f64>,
    pub native_first_call_ms: Vec<f64>,
    /// The same calls' CPU time on the calling thread, ms.
    pub first_call_cpu_ms: Vec<f64>,
    pub native_first_call_cpu_ms: Vec<f64>,
    /// The process's RSS with every handle of both libraries open, KiB.
    pub process_kib: f64,
    /// ns per call, round-robin over all handles: (case, native, kvwasm).
    pub calls: Vec<(String, f64, f64)>,
}

/// The generated config: `BACKENDS` fs backends, each with `TENANTS`
/// tenants, under `root`.
pub fn config_text(root: &Path) -> String {
    let mut out = String::new();
    for b in 0..BACKENDS {
        let _ = writeln!(
            out,
            "[backends.b{b}]\ncomponent = \"builtin:fs\"\ndir = \"{}\"\n\
             idle_release_ms = {IDLE_RELEASE_MS}\n",
            root.join(format!("b{b}")).display()
        );
        for t in 0..TENANTS {
            // Distinct limits per tenant, so each is its own entry.
            let _ = writeln!(
                out,
                "[backends.b{b}.tenants.t{t:03}]\ncall_timeout_ms = {}\n",
                30_000 + t
            );
        }
    }
    out
}

/// The URI of kvwasm handle `i`: backend `i % BACKENDS`, tenant
/// `(i / BACKENDS) % TENANTS`.
fn uri(i: usize) -> String {
    format!(
        "wasm://b{}/t{:03}/h{i}",
        i % BACKENDS,
        (i / BACKENDS) % TENANTS
    )
}

/// Run the plan: one child per repetition (after an untimed one that warms
/// the artifact cache), as table rows `[native, kvwasm]`.
pub fn run(plan: &ScalePlan) -> Result<Vec<Row>, String> {
    let root = plan
        .dir
        .join(format!("kvwasm-scale-{}", std::process::id()));
    let config = root.join("config.toml");
    for b in 0..BACKENDS {
        let dir = root.join(format!("b{b}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    std::fs::write(&config, config_text(&root)).map_err(|e| format!("write config: {e}"))?;
    let child = |handles: usize, rep: usize| -> Result<ScaleSample, String> {
        let (exe, args) = &plan.probe;
        let out = Command::new(exe)
            .args(args)
            .arg("--scale-probe")
            .arg("--native")
            .arg(&plan.native)
            .arg("--shim")
            .arg(&plan.shim)
            .arg("--dir")
            .arg(format!(
                "scale={}",
                root.join(format!("rep{rep}")).display()
            ))
            .arg("--handles")
            .arg(handles.to_string())
            .args(plan.quick.then_some("--quick"))
            .env(kvwasm_host::config::CONFIG_ENV, &config)
            .output()
            .map_err(|e| format!("scale probe: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).map_err(|e| {
            format!(
                "scale probe printed {text:?} ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    let result = (|| {
        child(WARM_HANDLES, 0)?;
        (1..=plan.reps)
            .map(|rep| child(plan.handles, rep))
            .collect::<Result<Vec<_>, _>>()
    })();
    let _ = std::fs::remove_dir_all(&root);
    Ok(rows(&result?, plan.handles))
}

/// Per-repetition figures as rows.
fn rows(samples: &[ScaleSample], handles: usize) -> Vec<Row> {
    let row = |case: String, unit: Unit, f: &dyn Fn(&ScaleSample) -> (f64, f64)| {
        let (native, kvwasm): (Vec<f64>, Vec<f64>) = samples.iter().map(f).unzip();
        Row {
            medium: "scale".into(),
            case,
            unit,
            per_target: vec![Stat::new(native), Stat::new(kvwasm)],
        }
    };
    let pct = |s: &[f64], p: f64| {
        let mut v = s.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let first_of_backends = |s: &[f64]| {
        s[..BACKENDS.min(s.len())]
            .iter()
            .copied()
            .fold(0.0, f64::max)
    };
    let rest_max = |s: &[f64]| {
        s[BACKENDS.min(s.len())..]
            .iter()
            .copied()
            .fold(0.0, f64::max)
    };
    let mut out = vec![
        row(
            "library load (dlopen + kv_store_get_vtable)".into(),
            Unit::Millis,
            &|s| (s.native_load_ms, s.load_ms),
        ),
        row("open p50".into(), Unit::Millis, &|s| {
            (pct(&s.native_open_ms, 0.5), pct(&s.open_ms, 0.5))
        }),
        row("open p99".into(), Unit::Millis, &|s| {
            (pct(&s.native_open_ms, 0.99), pct(&s.open_ms, 0.99))
        }),
        row("open max".into(), Unit::Millis, &|s| {
            (pct(&s.native_open_ms, 1.0), pct(&s.open_ms, 1.0))
        }),
        row(
            format!("open max, first of each of the {BACKENDS} backends"),
            Unit::Millis,
            &|s| {
                (
                    first_of_backends(&s.native_open_ms),
                    first_of_backends(&s.open_ms),
                )
            },
        ),
        row(
            "open max, all but the first of each backend".into(),
            Unit::Millis,
            &|s| (rest_max(&s.native_open_ms), rest_max(&s.open_ms)),
        ),
        row("open p99, thread CPU time".into(), Unit::Millis, &|s| {
            (pct(&s.native_open_cpu_ms, 0.99), pct(&s.open_cpu_ms, 0.99))
        }),
        row("open max, thread CPU time".into(), Unit::Millis, &|s| {
            (pct(&s.native_open_cpu_ms, 1.0), pct(&s.open_cpu_ms, 1.0))
        }),
        row(
            "resident memory per idle handle, after open".into(),
            Unit::KiB,
            &|s| (s.native_kib_per_handle[0], s.kib_per_handle[0]),
        ),
        row(
            "resident memory per idle handle, after one put + get".into(),
            Unit::KiB,
            &|s| (s.native_kib_per_handle[1], s.kib_per_handle[1]),
        ),
        row(
            "proportional memory (PSS) per idle handle, after one put + get".into(),
            Unit::KiB,
            &|s| (s.native_kib_per_handle[2], s.kib_per_handle[2]),
        ),
        row(
            format!(
                "resident memory per idle handle, after a manifest and {} ms idle \
                 (kvwasm: instance released)",
                IDLE_WAIT.as_millis()
            ),
            Unit::KiB,
            &|s| (s.native_kib_per_handle[3], s.kib_per_handle[3]),
        ),
        row(
            "proportional memory (PSS) per idle handle, after release".into(),
            Unit::KiB,
            &|s| (s.native_kib_per_handle[4], s.kib_per_handle[4]),
        ),
        row(
            "first call after release (get_manifest, missing name) p50".into(),
            Unit::Millis,
            &|s| {
                (
                    pct(&s.native_first_call_ms, 0.5),
                    pct(&s.first_call_ms, 0.5),
                )
            },
        ),
        row("first call after release p99".into(), Unit::Millis, &|s| {
            (
                pct(&s.native_first_call_ms, 0.99),
                pct(&s.first_call_ms, 0.99),
            )
        }),
        row(
            "first call after release p99, thread CPU time".into(),
            Unit::Millis,
            &|s| {
                (
                    pct(&s.native_first_call_cpu_ms, 0.99),
                    pct(&s.first_call_cpu_ms, 0.99),
                )
            },
        ),
        row(
            format!("process RSS, {handles} + {handles} handles open (the total, in both columns)"),
            Unit::KiB,
            &|s| (s.process_kib, s.process_kib),
        ),
    ];
    if let Some(first) = samples.first() {
        for (c, (case, _, _)) in first.calls.iter().enumerate() {
            out.push(row(
                format!("{case}, round-robin over {handles} handles"),
                Unit::Nanos,
                &|s| (s.calls[c].1, s.calls[c].2),
            ));
        }
    }
    out
}

/// Rows as a Markdown table: native, kvwasm, and their ratio.
pub fn markdown(rows: &[Row], plan: &ScalePlan) -> String {
    let mut out = format!(
        "### Performance at scale: {} handles, {BACKENDS} backends × {TENANTS} tenants\n\n\
         {} repetition(s), each a fresh process; median [min–max]; ratios are medians of \
         per-repetition ratios.{}\n\n\
         | case | native | kvwasm | kvwasm ÷ native |\n|---|---|---|---|\n",
        plan.handles,
        plan.reps,
        if plan.quick {
            " QUICK run: not for quoting."
        } else {
            ""
        }
    );
    for r in rows {
        let [native, kvwasm] = [&r.per_target[0], &r.per_target[1]];
        let show = |s: &Stat| format!("{:.3} [{:.3}–{:.3}]", s.median, s.min, s.max);
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {} | {:.2}× |",
            r.case,
            r.unit.label(),
            show(native),
            show(kvwasm),
            kvwasm.paired_ratio(native)
        );
    }
    out
}

/// The child: open `handles` handles of each library under `dir` (the
/// kvwasm ones through the config in `$KVWASM_CONFIG`), measure, and return
/// the sample (printed as JSON by the CLI).
pub fn probe(
    native: &Path,
    shim: &Path,
    dir: &Path,
    handles: usize,
    quick: bool,
) -> Result<ScaleSample, String> {
    let handles = handles.max(WARM_HANDLES + 1);
    let load = |path: &Path| {
        let started = Instant::now();
        let lib = Library::open(path.as_os_str()).map_err(|e| e.to_string())?;
        Ok::<_, String>((lib, started.elapsed().as_secs_f64() * 1e3))
    };
    let (native_lib, native_load_ms) = load(native)?;
    let (shim_lib, load_ms) = load(shim)?;
    let data = vec![0x5a; SMALL];
    let native_uris: Vec<String> = (0..handles)
        .map(|i| {
            let d = dir.join(format!("native/h{i}"));
            std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
            Ok(format!("cfs://{}", d.display()))
        })
        .collect::<Result<_, String>>()?;
    let native = open_all(&native_lib, handles, |i| native_uris[i].clone(), &data)?;
    let kvwasm = open_all(&shim_lib, handles, uri, &data)?;
    let (native_handles, handles_w) = (&native.handles, &kvwasm.handles);
    let process_kib = resident_kib();
    let rounds = if quick { 200 } else { 4_000 };
    let mut calls = Vec::new();
    for (case, op) in [
        ("get_manifest, missing name", Op::Missing),
        ("put 4 KiB", Op::Put),
        ("get 4 KiB", Op::Get),
    ] {
        // Four blocks, the side that goes first alternating; totals per side.
        let mut totals = [0.0; 2];
        for block in 0..4 {
            let sides = [(0, native_handles), (1, handles_w)];
            let order = if block % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let (s, hs) = sides[side];
                let took = time(|| calls_round_robin(hs, op, block, rounds, &data))?;
                totals[s] += took.as_nanos() as f64 / rounds as f64;
            }
        }
        calls.push((case.to_owned(), totals[0] / 4.0, totals[1] / 4.0));
    }
    let [open_ms, open_cpu_ms] = kvwasm.open_ms;
    let [native_open_ms, native_open_cpu_ms] = native.open_ms;
    let [first_call_ms, first_call_cpu_ms] = kvwasm.first_call_ms;
    let [native_first_call_ms, native_first_call_cpu_ms] = native.first_call_ms;
    Ok(ScaleSample {
        load_ms,
        native_load_ms,
        open_ms,
        native_open_ms,
        open_cpu_ms,
        native_open_cpu_ms,
        kib_per_handle: kvwasm.kib,
        native_kib_per_handle: native.kib,
        first_call_ms,
        native_first_call_ms,
        first_call_cpu_ms,
        native_first_call_cpu_ms,
        process_kib,
        calls,
    })
}

/// One library's open handles and what was measured on them.
struct Opened<'l> {
    handles: Vec<Handle<'l>>,
    /// Per open: wall and thread CPU time, ms.
    open_ms: [Vec<f64>; 2],
    /// See [`ScaleSample::kib_per_handle`].
    kib: [f64; 5],
    /// Per handle beyond `WARM_HANDLES`, the first call after the idle
    /// wait: wall and thread CPU time, ms.
    first_call_ms: [Vec<f64>; 2],
}

/// Open `n` handles of `lib` (URIs from `uri`), timing each (wall and
/// thread CPU time, ms); use each once (a 4 KiB put and get). Resident KiB
/// per handle beyond the first `WARM_HANDLES`: idle after open, and after
/// the call. Then each publishes a manifest (which makes its puts durable:
/// an instance holding unflushed puts is never released) and all stay idle
/// for `IDLE_WAIT`, while the `WARM_HANDLES` are kept busy so that the
/// baseline's instances stay; the memory per handle is measured again, and
/// the first call on each is timed.
fn open_all<'l>(
    lib: &'l Library,
    n: usize,
    uri: impl Fn(usize) -> String,
    data: &[u8],
) -> Result<Opened<'l>, String> {
    let mut handles = Vec::with_capacity(n);
    let mut open_ms = [Vec::with_capacity(n), Vec::with_capacity(n)];
    let use_once = |h: &Handle<'_>, i: usize| -> Result<(), String> {
        let key = (i as u64 | 1 << 63).to_le_bytes();
        h.put_chunk(&key, data)
            .map_err(|rc| format!("put_chunk on handle {i}: {rc}"))?;
        let got = h
            .get_chunk(&key)
            .map_err(|rc| format!("get_chunk on handle {i}: {rc}"))?;
        (got.len() == data.len())
            .then_some(())
            .ok_or_else(|| format!("get_chunk on handle {i}: {} bytes", got.len()))
    };
    let mut open = |i: usize, handles: &mut Vec<Handle<'l>>| -> Result<(), String> {
        let u = uri(i);
        let (start, cpu) = (Instant::now(), crate::cpu::thread_ms());
        let h = lib
            .open_store(&u)
            .ok_or(format!("open({u:?}) returned NULL"))?;
        open_ms[0].push(start.elapsed().as_secs_f64() * 1e3);
        open_ms[1].push(crate::cpu::thread_ms() - cpu);
        handles.push(h);
        Ok(())
    };
    for i in 0..WARM_HANDLES {
        open(i, &mut handles)?;
        use_once(&handles[i], i)?;
    }
    // The shim's reaper returns freed heap to the system after a release
    // (`malloc_trim`); trimmed here too, the baseline holds no free heap
    // that the reaper's trim would later subtract from the handles' share.
    trim_heap();
    let (before, pss_before) = (resident_kib(), pss_kib());
    for i in WARM_HANDLES..n {
        open(i, &mut handles)?;
    }
    let opened = resident_kib();
    for (i, h) in handles.iter().enumerate().skip(WARM_HANDLES) {
        use_once(h, i)?;
    }
    let used = resident_kib();
    let pss_used = pss_kib();
    for (i, h) in handles.iter().enumerate() {
        h.put_manifest("idle", b"m")
            .map_err(|rc| format!("put_manifest on handle {i}: {rc}"))?;
    }
    let idle_since = Instant::now();
    while idle_since.elapsed() < IDLE_WAIT {
        std::thread::sleep(Duration::from_millis(100));
        for h in &handles[..WARM_HANDLES] {
            missing_manifest(h)?;
        }
    }
    let (released, pss_released) = (resident_kib(), pss_kib());
    let mut first_call_ms = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for h in &handles[WARM_HANDLES..] {
        let (start, cpu) = (Instant::now(), crate::cpu::thread_ms());
        missing_manifest(h)?;
        first_call_ms[0].push(start.elapsed().as_secs_f64() * 1e3);
        first_call_ms[1].push(crate::cpu::thread_ms() - cpu);
    }
    let per = (n - WARM_HANDLES) as f64;
    Ok(Opened {
        handles,
        open_ms,
        kib: [
            (opened - before) / per,
            (used - before) / per,
            (pss_used - pss_before) / per,
            (released - before) / per,
            (pss_released - pss_before) / per,
        ],
        first_call_ms,
    })
}

/// `get_manifest` of a name never written: must miss.
fn missing_manifest(h: &Handle<'_>) -> Result<(), String> {
    match h.get_manifest("never-written") {
        Ok(_) => Err("get_manifest of a missing name succeeded".into()),
        Err(_) => Ok(()),
    }
}

/// This process's proportional set size (`Pss` in smaps_rollup), KiB.
fn pss_kib() -> f64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Return free heap pages to the system (glibc's allocator, which the
/// shim in this process shares).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[derive(Clone, Copy)]
enum Op {
    Missing,
    Put,
    Get,
}

/// `rounds` calls, each on the next handle in turn. Block `block`'s puts
/// store fresh chunks; its gets read them back.
fn calls_round_robin(
    handles: &[Handle<'_>],
    op: Op,
    block: usize,
    rounds: usize,
    data: &[u8],
) -> Result<(), String> {
    for r in 0..rounds {
        let h = &handles[r % handles.len()];
        let key = ((block * rounds + r) as u64).to_le_bytes();
        match op {
            Op::Missing => missing_manifest(h)?,
            Op::Put => {
                h.put_chunk(&key, data)
                    .map_err(|rc| format!("put_chunk: {rc}"))?;
            }
            Op::Get => {
                let got = h.get_chunk(&key).map_err(|rc| format!("get_chunk: {rc}"))?;
                if got.len() != data.len() {
                    return Err(format!("get_chunk: {} bytes", got.len()));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_has_every_backend_and_tenant() {
        let text = config_text(Path::new("/dev/shm/x"));
        let config = kvwasm_host::config::Config::parse(&text, Path::new("/")).unwrap();
        assert_eq!(config.backends.len(), BACKENDS);
        assert!(config.backends.values().all(|b| b.tenants.len() == TENANTS));
        assert_eq!(uri(1234), "wasm://b4/t023/h1234");
    }
}
