//! `kvwasm bench`: backends side by side through the C ABI.

use std::path::PathBuf;

use anyhow::{Context, bail};
use kvwasm_bench::{Medium, Plan, Section, Target};

/// Measure kv_store_v1 backends side by side through the C ABI.
///
/// Put/get throughput at 4 KiB to 16 MiB chunks on each directory, 96 × 1 MiB
/// saves and restores, warm saves after idle gaps (0, 0.2, 1.5, 5 s; --quick:
/// up to 50 ms) and on a new handle per save, small-call cost, thread scaling, open latency and
/// memory per handle; medians, spread, ratios to the first target, a plot.
///
/// By default it compares the native C backend (libkv_store_cfs.so, the
/// baseline) with libkv_store_wasm.so running the fs guest, on tmpfs
/// (/dev/shm) and disk (/var/tmp). `bash scripts/bench.sh` builds the
/// native backend and runs this with the plot written to docs/.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// A backend to measure, LABEL=LIBRARY=URI with {dir} in the URI (repeat;
    /// the first is the baseline), e.g. native=./libkv_store_cfs.so=cfs://{dir}
    #[arg(long = "target", value_name = "LABEL=LIB=URI")]
    targets: Vec<String>,
    /// The native baseline for the default targets (default: libkv_store_cfs.so
    /// in $KV_STORE_LIBRARY_PATH or next to this executable).
    #[arg(long, value_name = "PATH")]
    native: Option<PathBuf>,
    /// The shim for the default targets (default: as `kvwasm demo` finds it).
    #[arg(long, value_name = "PATH")]
    shim: Option<PathBuf>,
    /// A directory to run in, LABEL=PATH (repeat; default tmpfs=/dev/shm and
    /// disk=/var/tmp). The first also hosts the thread, call, open and memory runs.
    #[arg(long = "dir", value_name = "LABEL=PATH")]
    dirs: Vec<String>,
    /// Repetitions of every measurement.
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Seconds, not minutes: tiny sizes and one repetition (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Write the throughput plot (SVG) here (with --remote: the remote
    /// comparison; with --scale: the scale figures and their targets).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Write all samples as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Run only these sections (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "SECTIONS")]
    only: Vec<Section>,
    /// Measure the MRDN fabric path instead (frame and verify against raw
    /// blake3; the tcp handoff against raw loopback TCP).
    #[arg(long)]
    fabric: bool,
    /// Measure the KV indexer instead: event ingest and /query latency of
    /// the builtin:kv-indexer guest against the same indexer run natively.
    #[arg(long, conflicts_with = "fabric")]
    events: bool,
    /// Measure many open handles in one process instead: 1,000 handles over
    /// 10 fs backends × 100 tenants (a generated config) against as many
    /// native handles: open p50/p99/max, resident memory per idle handle,
    /// process RSS, calls round-robin over all handles (--quick: 100).
    #[arg(long, conflicts_with_all = ["fabric", "events"])]
    scale: bool,
    /// Handles of each library for --scale (default 1000; 100 with --quick).
    #[arg(long, value_name = "N")]
    handles: Option<usize>,
    /// Internal: one --scale repetition in this fresh process.
    #[arg(long, hide = true)]
    scale_probe: bool,
    /// Measure the remote backends instead: builtin:redis and builtin:s3
    /// against native clients (the `redis` crate; reqwest with aws-sigv4)
    /// on the servers given by --redis and --s3 (scripts/bench-remote.sh
    /// starts both on loopback).
    #[arg(long, conflicts_with_all = ["fabric", "events", "scale"])]
    remote: bool,
    /// With --remote: `host:port` of a Redis server (password, if any, in
    /// $KVWASM_BENCH_REDIS_PASSWORD).
    #[arg(long, value_name = "HOST:PORT", requires = "remote")]
    redis: Option<String>,
    /// With --remote: every node of a Redis Cluster (comma-separated
    /// HOST:PORTs; same password variable): builtin:redis in
    /// `mode = "cluster"` against the `redis` crate's cluster client, and
    /// each against itself on the --redis server.
    #[arg(
        long,
        value_name = "HOST:PORT,...",
        value_delimiter = ',',
        requires = "remote"
    )]
    redis_cluster: Vec<String>,
    /// With --redis: also measure the C client on hiredis, this
    /// libkvwasm_bench_hiredis.so (`make -C examples/hiredis-baseline`,
    /// needs libhiredis-dev); without it that row is skipped.
    #[arg(long, value_name = "LIB", requires = "redis")]
    hiredis: Option<PathBuf>,
    /// With --remote: `http://host:port` of an S3 service with the bucket
    /// `kv-cache` (credentials in $AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY).
    #[arg(long, value_name = "URL", requires = "remote")]
    s3: Option<String>,
    /// With --remote: run kvwasm_guest_redis.wasm and kvwasm_guest_s3.wasm
    /// from this directory instead of the built-in guests (to compare builds).
    #[arg(long, value_name = "DIR", requires = "remote")]
    guests: Option<PathBuf>,
    /// With --remote: the Redis server's process id, to report its CPU
    /// time per operation next to the client's.
    #[arg(long, value_name = "PID", requires = "redis")]
    redis_pid: Option<u32>,
    /// With --remote: the S3 service's process id, to report its CPU time
    /// per operation next to the client's.
    #[arg(long, value_name = "PID", requires = "s3")]
    s3_pid: Option<u32>,
    /// With --remote: restore on the handle that saved (its guest instance
    /// has run before, as when a consumer keeps one handle) instead of on a
    /// new handle, which starts a new instance.
    #[arg(long, requires = "remote")]
    same_handle: bool,
    /// Measure backend components instead, each against the Rust memory
    /// guest (builtin:memory) in the same run: component size, first open
    /// with an empty artifact cache (the compile), first open with the
    /// cache warm, resident memory per instance, put/get at 4 KiB and
    /// 1 MiB. SPEC (repeat): a project's kvwasm.toml (run under the limits
    /// it sets; NAME=FILE picks one of several backends), a .wasm file or
    /// builtin:NAME (default limits).
    #[arg(long = "component", value_name = "SPEC", conflicts_with_all = ["fabric", "events", "scale", "remote"])]
    components: Vec<String>,
    /// Internal: measure the backend --backend (config in $KVWASM_CONFIG)
    /// in this fresh process.
    #[arg(long, hide = true)]
    component_probe: bool,
    #[arg(long, hide = true)]
    backend: Option<String>,
    /// Internal: time dlopen and the first open in this fresh process.
    #[arg(long, hide = true)]
    open_probe: bool,
    #[arg(long, hide = true)]
    lib: Option<PathBuf>,
    #[arg(long, hide = true)]
    uri: Option<String>,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.open_probe {
        let (Some(lib), Some(uri)) = (&args.lib, &args.uri) else {
            bail!("--open-probe needs --lib and --uri");
        };
        println!(
            "{}",
            kvwasm_bench::open_probe(lib, uri).map_err(anyhow::Error::msg)?
        );
        return Ok(());
    }
    if args.component_probe || !args.components.is_empty() {
        return bench_components(&args);
    }
    if args.scale_probe || args.scale {
        return bench_scale(&args);
    }
    if args.fabric {
        return bench_fabric(&args);
    }
    if args.events {
        return bench_events(&args);
    }
    if args.remote {
        return bench_remote(&args);
    }
    let targets = if args.targets.is_empty() {
        default_targets(&args)?.to_vec()
    } else {
        args.targets
            .iter()
            .map(|t| Target::parse(t))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?
    };
    let media = if args.dirs.is_empty() {
        default_media()
    } else {
        args.dirs
            .iter()
            .map(|d| Medium::parse(d))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?
    };
    for medium in &media {
        anyhow::ensure!(
            medium.path.is_dir(),
            "{} is not a directory",
            medium.path.display()
        );
    }
    let plan = Plan {
        targets,
        media,
        reps: if args.quick { 1 } else { args.reps.max(1) },
        quick: args.quick,
        open_probe: Some((
            std::env::current_exe().context("locating this executable")?,
            vec!["bench".into(), "--open-probe".into()],
        )),
        progress: !args.no_progress,
        sections: if args.only.is_empty() {
            Section::ALL.to_vec()
        } else {
            args.only.clone()
        },
    };
    let results = kvwasm_bench::run(&plan).map_err(anyhow::Error::msg)?;
    print!("{}", kvwasm_bench::report::markdown(&results));
    if let Some(path) = &args.plot {
        anyhow::ensure!(
            !results.throughput.is_empty(),
            "--plot draws the throughput section, which did not run"
        );
        kvwasm_bench::plot::write_svg(&results, path).map_err(anyhow::Error::msg)?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
        eprintln!("samples written to {}", path.display());
    }
    Ok(())
}

fn default_targets(args: &BenchArgs) -> anyhow::Result<[Target; 2]> {
    let native = args
        .native
        .clone()
        .or_else(|| crate::consumer::locate_library("cfs"))
        .context(
            "the native baseline libkv_store_cfs.so was not found: pass --native, or build it with \
             `make -C examples/native-backend OUT=$PWD/target/release` (scripts/bench.sh does)",
        )?;
    let shim = shim_path(args)?;
    Ok([
        Target {
            label: "native".into(),
            lib: native,
            uri_template: "cfs://{dir}".into(),
        },
        Target {
            label: "kvwasm".into(),
            lib: shim,
            uri_template: "wasm://{dir}".into(),
        },
    ])
}

fn default_media() -> Vec<Medium> {
    let mut media = Vec::new();
    if std::path::Path::new("/dev/shm").is_dir() {
        media.push(Medium {
            label: "tmpfs".into(),
            path: "/dev/shm".into(),
        });
    }
    media.push(Medium {
        label: "disk".into(),
        path: "/var/tmp".into(),
    });
    media
}

/// `--fabric`: every pair of the fabric benchmark, as a Markdown table.
fn bench_fabric(args: &BenchArgs) -> anyhow::Result<()> {
    let reps = if args.quick { 1 } else { args.reps.max(1) };
    let mut pairs = kvwasm_bench::fabric::frame_verify(reps, args.quick);
    let dir = args.dirs.first().map_or_else(
        || Ok(std::path::PathBuf::from("/dev/shm")),
        |d| Medium::parse(d).map(|m| m.path),
    );
    let dir = tempfile::tempdir_in(dir.map_err(anyhow::Error::msg)?)?;
    pairs.extend(
        kvwasm_bench::fabric::handoff(reps, args.quick, dir.path()).map_err(anyhow::Error::msg)?,
    );
    print!("{}", kvwasm_bench::fabric::markdown(&pairs, reps));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&pairs)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The shim to bench: `--shim`, or the one beside this binary.
fn shim_path(args: &BenchArgs) -> anyhow::Result<PathBuf> {
    args.shim
        .clone()
        .or_else(|| crate::consumer::locate_library("wasm"))
        .context("libkv_store_wasm.so not found: pass --shim or build it (cargo build --release)")
}

/// `--component` (and its child, `--component-probe`): components against
/// the Rust memory guest.
fn bench_components(args: &BenchArgs) -> anyhow::Result<()> {
    let shim = shim_path(args)?;
    if args.component_probe {
        let backend = args
            .backend
            .as_deref()
            .context("--component-probe needs --backend")?;
        let sample = kvwasm_bench::component::probe(&shim, backend, args.quick)
            .map_err(anyhow::Error::msg)?;
        println!("{}", serde_json::to_string(&sample)?);
        return Ok(());
    }
    let scratch = tempfile::tempdir()?;
    let targets = std::iter::once(kvwasm_bench::component::BASELINE)
        .chain(args.components.iter().map(String::as_str))
        .map(|spec| kvwasm_bench::component::ComponentTarget::parse(spec, scratch.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let plan = kvwasm_bench::component::ComponentPlan {
        targets,
        shim,
        reps: if args.quick { 1 } else { args.reps.max(1) },
        quick: args.quick,
        scratch: scratch.path().to_owned(),
        probe: (
            std::env::current_exe().context("locating this executable")?,
            vec!["bench".into()],
        ),
    };
    let results = kvwasm_bench::component::run(&plan).map_err(anyhow::Error::msg)?;
    print!("{}", kvwasm_bench::component::markdown(&results));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--scale` (and its child, `--scale-probe`): many handles in one process.
fn bench_scale(args: &BenchArgs) -> anyhow::Result<()> {
    let [native, shim] = default_targets(args)?.map(|t| t.lib);
    let dir = match args.dirs.first() {
        Some(d) => Medium::parse(d).map_err(anyhow::Error::msg)?.path,
        None => "/dev/shm".into(),
    };
    let handles = args.handles.unwrap_or(if args.quick { 100 } else { 1000 });
    if args.scale_probe {
        let sample = kvwasm_bench::scale::probe(&native, &shim, &dir, handles, args.quick)
            .map_err(anyhow::Error::msg)?;
        println!("{}", serde_json::to_string(&sample)?);
        return Ok(());
    }
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let plan = kvwasm_bench::scale::ScalePlan {
        native,
        shim,
        dir,
        handles,
        reps: if args.quick { 1 } else { args.reps.max(1) },
        quick: args.quick,
        probe: (
            std::env::current_exe().context("locating this executable")?,
            vec!["bench".into()],
        ),
    };
    let rows = kvwasm_bench::scale::run(&plan).map_err(anyhow::Error::msg)?;
    print!("{}", kvwasm_bench::scale::markdown(&rows, &plan));
    if let Some(path) = &args.plot {
        kvwasm_bench::plot::write_scale_svg(&rows, path).map_err(anyhow::Error::msg)?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--events`: the KV indexer guest against the native core, as Markdown.
fn bench_events(args: &BenchArgs) -> anyhow::Result<()> {
    let reps = if args.quick { 1 } else { args.reps.max(1) };
    let shape = kvwasm_bench::events::Shape::new(args.quick);
    let report = kvwasm_bench::events::run(shape, reps).map_err(anyhow::Error::msg)?;
    print!("{}", kvwasm_bench::events::markdown(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--remote`: the remote backends against native clients, as Markdown.
fn bench_remote(args: &BenchArgs) -> anyhow::Result<()> {
    let servers = kvwasm_bench::remote::Servers {
        redis: args.redis.clone(),
        redis_cluster: args.redis_cluster.clone(),
        hiredis: args.hiredis.clone(),
        s3: args.s3.clone(),
        guests: args.guests.clone(),
        redis_pid: args.redis_pid,
        s3_pid: args.s3_pid,
        same_handle: args.same_handle,
    };
    anyhow::ensure!(
        servers.redis.is_some() || !servers.redis_cluster.is_empty() || servers.s3.is_some(),
        "--remote needs --redis HOST:PORT, --redis-cluster HOST:PORT,..., --s3 URL or some of them"
    );
    if servers.redis.is_some() && servers.hiredis.is_none() {
        eprintln!(
            "the hiredis (C) rows are skipped: pass --hiredis LIB \
             (make -C examples/hiredis-baseline OUT=DIR; needs libhiredis-dev)"
        );
    }
    let reps = if args.quick { 1 } else { args.reps.max(1) };
    let scratch = tempfile::tempdir()?;
    let pairs = kvwasm_bench::remote::run(&servers, reps, args.quick, scratch.path())
        .map_err(anyhow::Error::msg)?;
    print!(
        "{}",
        kvwasm_bench::remote::markdown(&pairs, reps, servers.same_handle)
    );
    if let Some(path) = &args.plot {
        kvwasm_bench::plot::write_remote_svg(&pairs, path).map_err(anyhow::Error::msg)?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&pairs)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
