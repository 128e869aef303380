//! `kvwasm bench --component`: backend components, each under its own
//! config (a project's `kvwasm.toml` with the limits it asks for), side by
//! side with the Rust memory guest (`builtin:memory`, the baseline) in the
//! same run: component size, the first open of a process with an empty
//! artifact cache (which compiles the component), the first open of a
//! process with the cache warm, resident memory per instance, and
//! put/get throughput at 4 KiB and 1 MiB.
//!
//! Every figure but the size comes from fresh child processes
//! (`kvwasm bench --component-probe`) with `KVWASM_CONFIG` naming the
//! component's config and `KVWASM_CACHE_DIR` a cache of this run's own, so
//! first opens and resident memory are a process's own and no earlier
//! compile is reused. The compile is measured once per component (it takes
//! minutes for a component carrying an interpreter); the rest once per
//! repetition, the components in alternating order.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kv_store_abi::{Handle, Library};
use kvwasm_host::component::ComponentSource;
use kvwasm_host::config::{CONFIG_ENV, Config};

use crate::stats::Stat;
use crate::workloads::{gbps, key, millis, parse_probe, random_bytes, resident_kib, stamp, time};
use crate::{Row, Unit};

/// The baseline every component is compared with.
pub const BASELINE: &str = "builtin:memory";
/// Chunk sizes of the throughput rows.
const SIZES: [usize; 2] = [4 << 10, 1 << 20];

/// A component to measure, as the shim will run it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ComponentTarget {
    /// The backend's name, shown in the table.
    pub label: String,
    /// The config naming it (with its limits and grants).
    pub config: PathBuf,
    /// Its entry in that config: `wasm://<backend>/...`.
    pub backend: String,
    /// Bytes of the component file.
    pub size_bytes: u64,
}

impl ComponentTarget {
    /// `[NAME=]SPEC`: SPEC is a config file (`*.toml`; NAME picks its
    /// backend when it has several), a `.wasm` file or `builtin:NAME`
    /// (both run under the default limits, from a config written in
    /// `scratch`).
    pub fn parse(spec: &str, scratch: &Path) -> Result<ComponentTarget, String> {
        let (name, path) = match spec.split_once('=') {
            Some((name, path)) if !name.is_empty() && !name.contains('/') => (Some(name), path),
            _ => (None, spec),
        };
        if path.ends_with(".toml") {
            return Self::from_config(Path::new(path), name);
        }
        let source: ComponentSource = path.parse()?;
        let backend = match (name, &source) {
            (Some(name), _) => name.to_owned(),
            (None, ComponentSource::Builtin(b)) => b.name().to_owned(),
            (None, ComponentSource::LinkedBuiltin(name)) => name.clone(),
            (None, ComponentSource::File(file)) => backend_name(file),
        };
        let component = match &source {
            ComponentSource::Builtin(_) | ComponentSource::LinkedBuiltin(_) => path.to_owned(),
            ComponentSource::File(file) => std::path::absolute(file)
                .map_err(|e| format!("{}: {e}", file.display()))?
                .display()
                .to_string(),
        };
        let mut entry = toml::Table::new();
        entry.insert("component".into(), component.into());
        let mut backends = toml::Table::new();
        backends.insert(backend.clone(), entry.into());
        let mut config = toml::Table::new();
        config.insert("backends".into(), backends.into());
        let file = scratch.join(format!("{backend}.toml"));
        std::fs::write(&file, config.to_string())
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
        Ok(ComponentTarget {
            label: path.to_owned(),
            config: file,
            backend,
            size_bytes: size(&source)?,
        })
    }

    fn from_config(path: &Path, name: Option<&str>) -> Result<ComponentTarget, String> {
        let config = Config::load(path)?;
        let backend = match name {
            Some(name) => name.to_owned(),
            None => {
                let mut names = config.backends.keys();
                match (names.next(), names.next()) {
                    (Some(only), None) => only.clone(),
                    _ => {
                        return Err(format!(
                            "{}: name the backend to measure (NAME={})",
                            path.display(),
                            path.display()
                        ));
                    }
                }
            }
        };
        let entry = config
            .backends
            .get(&backend)
            .ok_or_else(|| format!("{}: no [backends.{backend}]", path.display()))?;
        let source = match entry.component.parse()? {
            ComponentSource::File(file) => ComponentSource::File(config.base_dir.join(file)),
            builtin => builtin,
        };
        Ok(ComponentTarget {
            label: backend.clone(),
            config: std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?,
            backend,
            size_bytes: size(&source)?,
        })
    }
}

/// A backend name from a file name: `acme_kv.wasm` → `acme-kv`.
fn backend_name(file: &Path) -> String {
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("component");
    stem.chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect()
}

fn size(source: &ComponentSource) -> Result<u64, String> {
    match (source, source.builtin_bytes()) {
        (ComponentSource::File(file), _) => std::fs::metadata(file)
            .map(|m| m.len())
            .map_err(|e| format!("{}: {e}", file.display())),
        (_, Some(bytes)) => bytes
            .map(|bytes| bytes.len() as u64)
            .map_err(|e| format!("{source}: {e}")),
        (_, None) => Err(format!("{source}: neither a file nor a builtin")),
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ComponentPlan {
    /// The baseline first.
    pub targets: Vec<ComponentTarget>,
    pub shim: PathBuf,
    pub reps: usize,
    pub quick: bool,
    /// Scratch directory: the artifact caches of the run.
    pub scratch: PathBuf,
    /// How to start a child: `exe args...` (it appends the probe's flags).
    pub probe: (PathBuf, Vec<OsString>),
}

/// One child's measurements of one component.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ComponentSample {
    /// The process's first open (artifact cache warm), ms.
    pub first_open_ms: f64,
    /// Resident memory an instance adds: a handle on a namespace of its
    /// own, after a put and a get of 4 KiB, KiB.
    pub kib_per_instance: f64,
    /// GB/s of put and of get, per size of [`SIZES`].
    pub put_gbps: Vec<f64>,
    pub get_gbps: Vec<f64>,
}

/// Every figure of a run, for the table and `--json`.
#[derive(Debug, serde::Serialize)]
pub struct ComponentResults {
    pub targets: Vec<ComponentTarget>,
    pub reps: usize,
    pub quick: bool,
    pub rows: Vec<Row>,
}

/// The child: open `backend` through the shim (its config in
/// `$KVWASM_CONFIG`) and measure it.
pub fn probe(shim: &Path, backend: &str, quick: bool) -> Result<ComponentSample, String> {
    let lib = Library::open(shim.as_os_str()).map_err(|e| e.to_string())?;
    let run = std::process::id();
    let open = |what: &str| -> Result<Handle<'_>, String> {
        let uri = format!("wasm://{backend}/bench-{run}-{what}");
        lib.open_store(&uri)
            .ok_or_else(|| format!("open({uri:?}) returned NULL"))
    };
    let started = Instant::now();
    let keep = open("keep")?;
    let first_open_ms = millis(started.elapsed());
    let data = random_bytes(*SIZES.last().expect("sizes"));

    // One instance is up (and its one-time costs paid) before counting.
    let mut small = data[..SIZES[0]].to_vec();
    stamp(&mut small, 0);
    put_new(&keep, 0, &small)?;
    get_stamped(&keep, 0, small.len())?;
    let instances = if quick { 2 } else { 8 };
    let before = resident_kib();
    let mut handles = Vec::new();
    for i in 0..instances {
        let h = open(&format!("instance-{i}"))?;
        stamp(&mut small, i);
        put_new(&h, i, &small)?;
        get_stamped(&h, i, small.len())?;
        handles.push(h);
    }
    let kib_per_instance = (resident_kib() - before) / instances as f64;
    drop(handles);
    drop(keep);

    let (mut put_gbps, mut get_gbps) = (Vec::new(), Vec::new());
    for size in SIZES {
        let count = chunk_count(size, quick);
        let h = open(&format!("throughput-{size}"))?;
        let mut buf = data[..size].to_vec();
        let put = time(|| {
            for i in 0..count {
                stamp(&mut buf, i);
                put_new(&h, i, &buf)?;
            }
            h.put_manifest("bench", &[0; 64])
                .map_err(|rc| format!("put_manifest: {rc}"))
        })?;
        let get = time(|| (0..count).try_for_each(|i| get_stamped(&h, i, size)))?;
        let bytes = (size * count) as f64;
        put_gbps.push(gbps(bytes, put));
        get_gbps.push(gbps(bytes, get));
    }
    Ok(ComponentSample {
        first_open_ms,
        kib_per_instance,
        put_gbps,
        get_gbps,
    })
}

/// Chunks per throughput run: 16 MiB of 4 KiB chunks, 64 MiB of 1 MiB
/// ones (a memory store holds them all: within the default 256 MiB).
fn chunk_count(size: usize, quick: bool) -> usize {
    let total = if quick { 1 << 20 } else { 16 << 20 };
    let total = if size >= 1 << 20 { 4 * total } else { total };
    (total / size).max(2)
}

/// Put chunk `i`, which must be new.
fn put_new(h: &Handle<'_>, i: usize, bytes: &[u8]) -> Result<(), String> {
    match h.put_chunk(&key(i), bytes) {
        Ok(false) => Ok(()),
        Ok(true) => Err(format!("put_chunk {i}: already present in a new namespace")),
        Err(rc) => Err(format!("put_chunk {i} ({} bytes): {rc}", bytes.len())),
    }
}

/// Get chunk `i` and check its size and stamp.
fn get_stamped(h: &Handle<'_>, i: usize, size: usize) -> Result<(), String> {
    let got = h
        .get_chunk(&key(i))
        .map_err(|rc| format!("get_chunk {i}: {rc}"))?;
    if got.len() != size || got[..8] != (i as u64).to_le_bytes() {
        return Err(format!(
            "get_chunk {i}: wrong bytes ({} of {size})",
            got.len()
        ));
    }
    Ok(())
}

/// Run the plan: each component's compile once, then one child per
/// component and repetition.
pub fn run(plan: &ComponentPlan) -> Result<ComponentResults, String> {
    let child = |target: &ComponentTarget, cache: &Path, args: &[&str]| -> Result<String, String> {
        let (exe, base) = &plan.probe;
        let out = Command::new(exe)
            .args(base)
            .args(args)
            .env(CONFIG_ENV, &target.config)
            .env("KVWASM_CACHE_DIR", cache)
            .output()
            .map_err(|e| format!("{}: probe: {e}", target.label))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "{}: probe failed: {text}{}",
                target.label,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(text)
    };
    let shim = plan.shim.to_str().ok_or("the shim's path is not UTF-8")?;
    let n = plan.targets.len();
    let caches: Vec<PathBuf> = (0..n)
        .map(|t| plan.scratch.join(format!("cache-{t}")))
        .collect();
    let mut compile_ms = Vec::new();
    for (target, cache) in plan.targets.iter().zip(&caches) {
        eprintln!(
            "{}: first open with an empty artifact cache (compiles it)",
            target.label
        );
        let uri = format!("wasm://{}/bench-compile", target.backend);
        let text = child(
            target,
            cache,
            &["--open-probe", "--lib", shim, "--uri", &uri],
        )?;
        let (_, open_ms) = parse_probe(&text)
            .ok_or_else(|| format!("{}: the open probe printed {text:?}", target.label))?;
        compile_ms.push(open_ms);
    }
    let mut samples: Vec<Vec<ComponentSample>> = (0..n).map(|_| Vec::new()).collect();
    for rep in 0..plan.reps {
        let mut order: Vec<usize> = (0..n).collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        for t in order {
            let target = &plan.targets[t];
            eprintln!("{}: repetition {} of {}", target.label, rep + 1, plan.reps);
            let mut args = vec!["--component-probe", "--shim", shim, "--backend"];
            args.push(&target.backend);
            if plan.quick {
                args.push("--quick");
            }
            let text = child(target, &caches[t], &args)?;
            let sample = serde_json::from_str(text.trim())
                .map_err(|e| format!("{}: the probe printed {text:?} ({e})", target.label))?;
            samples[t].push(sample);
        }
    }
    Ok(ComponentResults {
        targets: plan.targets.clone(),
        reps: plan.reps,
        quick: plan.quick,
        rows: rows(plan, &compile_ms, &samples),
    })
}

fn rows(plan: &ComponentPlan, compile_ms: &[f64], samples: &[Vec<ComponentSample>]) -> Vec<Row> {
    let row = |case: String, unit: Unit, per_target: Vec<Vec<f64>>| Row {
        medium: "component".into(),
        case,
        unit,
        per_target: per_target.into_iter().map(Stat::new).collect(),
    };
    let each = |f: &dyn Fn(&ComponentSample) -> f64| -> Vec<Vec<f64>> {
        samples.iter().map(|s| s.iter().map(f).collect()).collect()
    };
    let mut rows = vec![
        row(
            "component size".into(),
            Unit::KiB,
            plan.targets
                .iter()
                .map(|t| vec![t.size_bytes as f64 / 1024.0])
                .collect(),
        ),
        row(
            "first open, empty artifact cache (compiles the component; once)".into(),
            Unit::Millis,
            compile_ms.iter().map(|&ms| vec![ms]).collect(),
        ),
        row(
            "first open in a process, warm artifact cache".into(),
            Unit::Millis,
            each(&|s| s.first_open_ms),
        ),
        row(
            "resident memory per instance (a namespace's handle, 4 KiB put and got)".into(),
            Unit::KiB,
            each(&|s| s.kib_per_instance),
        ),
    ];
    for (i, size) in SIZES.into_iter().enumerate() {
        let label = crate::workloads::size_label(size);
        rows.push(row(
            format!("put {label}"),
            Unit::GBps,
            each(&|s| s.put_gbps[i]),
        ));
        rows.push(row(
            format!("get {label}"),
            Unit::GBps,
            each(&|s| s.get_gbps[i]),
        ));
    }
    rows
}

/// The table: every figure per component, and its ratio to the baseline.
pub fn markdown(r: &ComponentResults) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Components against {BASELINE} (the Rust memory guest), each under its config; {} \
         repetition(s); median [min–max]; ratios are medians of per-repetition ratios (runs \
         taken back to back).{}\n",
        r.reps,
        if r.quick {
            " QUICK run: tiny sizes, not for quoting."
        } else {
            ""
        }
    );
    for t in &r.targets {
        let _ = writeln!(
            out,
            "- {}: `wasm://{}/…` of `{}`",
            t.label,
            t.backend,
            t.config.display()
        );
    }
    out.push('\n');
    let labels: Vec<String> = r.targets.iter().map(|t| t.label.clone()).collect();
    let rows: Vec<&Row> = r.rows.iter().collect();
    out.push_str(&crate::report::rows_table(&labels, &rows));
    out
}
