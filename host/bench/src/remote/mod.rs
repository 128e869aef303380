//! `kvwasm bench --remote`: `builtin:redis` and `builtin:s3` against native
//! Rust clients on the same servers, in the same run (issue 17's targets 2
//! and 3).
//!
//! Every repetition runs each case on every side back to back (who goes
//! first alternates), each side in a key space of its own, fresh per
//! repetition, so every save is cold. A save is `put_chunk` per chunk and
//! a `put_manifest`; a restore, on a new handle (or with `--same-handle`
//! on the one that saved), is `get_manifest`,
//! `prefetch_chunks` of everything, then `get_chunk` per chunk, each
//! returned buffer released as a consumer releases it. kvwasm runs in this
//! process (`kvwasm_host`, what the shim calls).
//!
//! The native clients are the fastest straightforward use of each crate,
//! written once here:
//! * Redis: the `redis` crate on one connection; a save is one pipeline of
//!   `SET`s (chunks, then the manifest), a restore a `GET` of the manifest
//!   and one pipeline of `GET`s.
//! * Redis, in C (`--hiredis`): hiredis on one connection
//!   (examples/hiredis-baseline), what a native `kv_store_v1` backend in C
//!   would do; a save is one pipeline of `SET … NX` and the manifest, a
//!   restore as above.
//! * Redis Cluster (`--redis-cluster`): the `redis` crate's cluster client,
//!   one pipeline per node; the same kvwasm guest in `mode = "cluster"`
//!   against it (exact puts; `dedup_check = "flush"`: one batched check
//!   and write per node at the manifest; `"write"`: short chunks written
//!   behind as they are put), and each against its one-server self (the
//!   cost of cluster mode).
//! * S3: `reqwest` (blocking) with `aws-sigv4` signing set up as the s3
//!   guest sets it up, 16 requests in flight (the guest's default
//!   `max_concurrency`): `PUT`s of the chunks, then of the manifest; a
//!   restore `GET`s the manifest, then the chunks.
//!
//! All copy each value they receive into a `malloc`'d buffer, as a
//! consumer receives it (kvwasm returns one), and drop it. The warm-up
//! repetition (not kept) compares every restored byte on every side.

use std::path::Path;
use std::sync::Arc;

use kvwasm_host::{Backend, MallocBuffer, StoreHandle};

use crate::Stat;

mod hiredis;
mod measure;
mod redis_clients;
mod s3;

use hiredis::Hiredis;
pub use measure::Cpu;
use measure::{Measured, Meter, Samples};
use redis_clients::{NativeCluster, NativeRedis};
use s3::NativeS3;

/// The environment variable holding the Redis password, if it has one
/// (scripts/bench-remote.sh sets it); granted to the guest the same way.
pub const REDIS_PASSWORD_ENV: &str = "KVWASM_BENCH_REDIS_PASSWORD";
/// The S3 bucket (it must exist); credentials come from
/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
pub const BUCKET: &str = "kv-cache";
/// S3 requests in flight at once, on both sides.
const S3_CONCURRENCY: usize = 16;

/// The servers to measure against; either may be absent.
#[derive(Debug, Clone, Default)]
pub struct Servers {
    /// `host:port` of a Redis server.
    pub redis: Option<String>,
    /// `host:port` of every node of a Redis Cluster (empty: none).
    pub redis_cluster: Vec<String>,
    /// The C baseline on hiredis (`libkvwasm_bench_hiredis.so`, built by
    /// examples/hiredis-baseline), measured on the Redis server if given.
    pub hiredis: Option<std::path::PathBuf>,
    /// `http://host:port` of an S3 service.
    pub s3: Option<String>,
    /// A directory holding `kvwasm_guest_redis.wasm` and
    /// `kvwasm_guest_s3.wasm` to run instead of the built-in guests (to
    /// compare two builds of them).
    pub guests: Option<std::path::PathBuf>,
    /// Process ids of the Redis server and the S3 service, if known: their
    /// CPU time per operation is reported next to the client's.
    pub redis_pid: Option<u32>,
    pub s3_pid: Option<u32>,
    /// Restore on the handle that saved (whose guest instance already ran,
    /// as a consumer keeps one handle) instead of on a new handle (a new
    /// instance, the default).
    pub same_handle: bool,
}

/// One compared case: the native client's time and kvwasm's, in ms.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pair {
    pub case: String,
    pub native_label: String,
    pub native: Stat,
    pub kvwasm_label: String,
    pub kvwasm: Stat,
    /// The most `kvwasm / native` time the issue allows; `None` for a
    /// like-for-like comparison the issue sets no target for.
    pub target: Option<f64>,
    /// CPU time per operation, ms: of this process (the client, all its
    /// threads) and of the server, if its pid was given.
    pub native_cpu: Cpu,
    pub kvwasm_cpu: Cpu,
}

impl Pair {
    /// Median of the per-repetition time ratios.
    pub fn ratio(&self) -> f64 {
        self.kvwasm.paired_ratio(&self.native)
    }
}

/// A save's chunks: `count` distinct hashes of `size` bytes each, and the
/// manifest naming them (their hashes, concatenated).
struct Load {
    label: String,
    size: usize,
    data: Vec<u8>,
    hashes: Vec<[u8; 8]>,
    manifest: Vec<u8>,
    /// The most `kvwasm / native` time allowed at this size.
    target: f64,
}

impl Load {
    fn new(count: usize, size: usize, target: f64) -> Load {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let data = (0..size)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let hashes: Vec<[u8; 8]> = (0..count as u64)
            .map(|i| (i ^ 0x6b76_7761_736d_0000).to_be_bytes())
            .collect();
        let unit = if size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else {
            format!("{} KiB", size >> 10)
        };
        Load {
            label: format!("{count} × {unit}"),
            size,
            data,
            manifest: hashes.concat(),
            hashes,
            target,
        }
    }
}

/// The hashes a manifest names.
fn manifest_hashes(manifest: &[u8]) -> Vec<Vec<u8>> {
    manifest.chunks(8).map(<[u8]>::to_vec).collect()
}

/// Keys as the remote guests name them (`kvwasm_guest_support::remote`).
fn chunk_key(base: &str, hash: &[u8]) -> String {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{base}/chunks/{hex}")
}

fn manifest_key(base: &str) -> String {
    format!("{base}/manifests/bench")
}

/// A client under test: a save into and a restore from the key space
/// `ns`, each measuring the client's calls only (not opening a handle).
trait Side {
    fn label(&self) -> String;
    /// Whether a save learns, chunk by chunk, if the server already held
    /// it: what `put_chunk`'s return code `1` needs, and costs a round trip
    /// per chunk the client has not seen.
    fn exact_puts(&self) -> bool;
    /// Whether kvwasm sides are held to the load's target against this
    /// (native) side.
    fn baseline(&self) -> bool {
        false
    }
    /// Whether it runs against the Redis Cluster (sides meet only sides on
    /// the same servers, but for the cost of cluster mode).
    fn cluster(&self) -> bool {
        false
    }
    /// The same client on one server and on the cluster share a twin name
    /// (empty: none): the pair shows what cluster mode costs.
    fn twin(&self) -> &'static str {
        ""
    }
    fn save(&self, ns: &str, load: &Load, meter: Meter) -> Result<Measured, String>;
    /// With `verify`, every restored byte is compared (outside the kept
    /// repetitions: it costs a pass over the data).
    fn restore(
        &self,
        ns: &str,
        load: &Load,
        meter: Meter,
        verify: bool,
    ) -> Result<Measured, String>;
    /// The key space's base key (for cleanup by the native client).
    fn base(&self, ns: &str) -> String;
}

/// kvwasm through one configured remote backend.
struct Kvwasm {
    name: &'static str,
    cluster: bool,
    twin: &'static str,
    backend: Arc<Backend>,
    /// `dedup_check = "put"`: `put_chunk` asks the server.
    exact_puts: bool,
    /// Restore on the handle the last save used, not a new one.
    same_handle: bool,
    saved_with: std::sync::Mutex<Option<Arc<StoreHandle>>>,
}

impl Side for Kvwasm {
    fn label(&self) -> String {
        format!("kvwasm ({})", self.name)
    }

    fn exact_puts(&self) -> bool {
        self.exact_puts
    }

    fn cluster(&self) -> bool {
        self.cluster
    }

    fn twin(&self) -> &'static str {
        self.twin
    }

    fn save(&self, ns: &str, load: &Load, meter: Meter) -> Result<Measured, String> {
        let h = self.open(ns)?;
        let span = meter.start();
        for hash in &load.hashes {
            h.put_chunk(hash, &load.data).map_err(|e| e.to_string())?;
        }
        h.put_manifest("bench", &load.manifest)
            .map_err(|e| e.to_string())?;
        let measured = span.stop();
        if self.same_handle {
            *self.saved_with.lock().expect("not poisoned") = Some(h);
        }
        Ok(measured)
    }

    fn restore(
        &self,
        ns: &str,
        load: &Load,
        meter: Meter,
        verify: bool,
    ) -> Result<Measured, String> {
        let saved_with = self.saved_with.lock().expect("not poisoned").take();
        let h = match saved_with {
            Some(h) => h,
            None => self.open(ns)?,
        };
        let span = meter.start();
        let manifest = h.get_manifest("bench").map_err(|e| e.to_string())?;
        check_manifest(manifest.as_slice(), load)?;
        let hashes = manifest_hashes(manifest.as_slice());
        h.prefetch_chunks(&hashes).map_err(|e| e.to_string())?;
        for hash in &hashes {
            let value = h.get_chunk(hash).map_err(|e| e.to_string())?;
            check(value.as_slice(), load, verify)?;
        }
        Ok(span.stop())
    }

    fn base(&self, ns: &str) -> String {
        format!("kvwasm/{ns}")
    }
}

impl Kvwasm {
    fn open(&self, ns: &str) -> Result<Arc<StoreHandle>, String> {
        kvwasm_host::handle::open_shared(self.backend.clone(), ns)
            .map_err(|e| format!("{}: open {ns:?}: {e}", self.name))
    }
}

/// The restored manifest is the one saved: a missing manifest (which a
/// client may read as empty) would otherwise restore nothing, fast.
fn check_manifest(manifest: &[u8], load: &Load) -> Result<(), String> {
    if manifest == load.manifest.as_slice() {
        Ok(())
    } else {
        Err(format!(
            "the restored manifest ({} bytes) is not the one saved ({} bytes)",
            manifest.len(),
            load.manifest.len()
        ))
    }
}

/// A restored chunk's length, and with `verify` its bytes.
fn check(value: &[u8], load: &Load, verify: bool) -> Result<(), String> {
    if value.len() != load.size {
        Err(format!(
            "a restored chunk has {} bytes, not {}",
            value.len(),
            load.size
        ))
    } else if verify && value != load.data.as_slice() {
        Err("a restored chunk's bytes differ from those saved".into())
    } else {
        Ok(())
    }
}

/// The value as a consumer receives it: in a `malloc`'d buffer it frees.
fn deliver(value: &[u8], load: &Load, verify: bool) -> Result<(), String> {
    let buffer = MallocBuffer::copy_from(value).ok_or("out of memory")?;
    check(buffer.as_slice(), load, verify)
}

/// The kvwasm sides of each service: a backend name and its
/// `dedup_check` (`put` answers every put exactly).
type Sides<const N: usize> = [(&'static str, &'static str); N];
/// The Redis sides: exact puts, one batched check at the flush, and short
/// chunks written behind as they are put (`SET NX`, like hiredis's save).
const REDIS_SIDES: Sides<3> = [
    ("redis", "put"),
    ("redis-batched", "flush"),
    ("redis-written", "write"),
];
/// What links a Redis side to its twin on the other deployment (one server,
/// the cluster), by position in [`REDIS_SIDES`] and [`REDIS_CLUSTER_SIDES`].
const TWINS: [&str; 3] = ["kvwasm", "kvwasm-batched", "kvwasm-written"];
/// `redis` (put) restoring on the handle that saved, beside `redis` on a
/// new handle (unless `--same-handle` makes every side restore so).
const REDIS_SAME_HANDLE: &str = "redis-same-handle";
/// The kvwasm sides on the Redis Cluster (`mode = "cluster"`), as
/// [`REDIS_SIDES`] on one server, each node's share in its own pipeline.
const REDIS_CLUSTER_SIDES: Sides<3> = [
    ("redis-cluster", "put"),
    ("redis-cluster-batched", "flush"),
    ("redis-cluster-written", "write"),
];
const S3_SIDES: Sides<2> = [("s3", "put"), ("s3-batched", "flush")];

/// The kvwasm configuration of the remote backends: for each server, the
/// default `dedup_check = "put"` (exact `put_chunk` return codes),
/// `"flush"` (existence checked in one batch at the flush, each staging a
/// whole 96 MiB save) and, for Redis, `"write"`.
fn config(servers: &Servers) -> String {
    let component = |guest: &str| match &servers.guests {
        Some(dir) => format!("{:?}", dir.join(format!("kvwasm_guest_{guest}.wasm"))),
        None => format!("\"builtin:{guest}\""),
    };
    // A handle restored with `--same-handle` must keep its instance between
    // its save and its restore, however long the other sides take.
    let idle = if servers.same_handle {
        "idle_release_ms = 0\n"
    } else {
        ""
    };
    let limits = format!("memory_limit_mib = 512\ncall_timeout_ms = 30000\n{idle}");
    let tuning = "max_pending_mib = 128, timeout_ms = 20000";
    let (env, password) = match std::env::var_os(REDIS_PASSWORD_ENV) {
        Some(_) => (
            format!("env = [\"{REDIS_PASSWORD_ENV}\"]\n"),
            format!("password_env = \"{REDIS_PASSWORD_ENV}\", "),
        ),
        None => (String::new(), String::new()),
    };
    let mut out = String::new();
    for (name, dedup) in REDIS_SIDES {
        let Some(address) = &servers.redis else { break };
        out += &format!(
            "[backends.{name}]\ncomponent = {}\nnet = [\"{address}\"]\n{env}{limits}\
             settings = {{ address = \"{address}\", {password}dedup_check = \"{dedup}\", {tuning} }}\n",
            component("redis")
        );
    }
    if let Some(address) = servers.redis.as_ref().filter(|_| !servers.same_handle) {
        out += &format!(
            "[backends.{REDIS_SAME_HANDLE}]\ncomponent = {}\nnet = [\"{address}\"]\n{env}{limits}\
             idle_release_ms = 0\n\
             settings = {{ address = \"{address}\", {password}dedup_check = \"put\", {tuning} }}\n",
            component("redis")
        );
    }
    if !servers.redis_cluster.is_empty() {
        let list = |nodes: &[String]| {
            let quoted: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
            quoted.join(", ")
        };
        let nodes = &servers.redis_cluster;
        for (name, dedup) in REDIS_CLUSTER_SIDES {
            out += &format!(
                "[backends.{name}]\ncomponent = {}\nnet = [{}]\n{env}{limits}\
                 settings = {{ mode = \"cluster\", addresses = [{}], {password}dedup_check = \"{dedup}\", {tuning} }}\n",
                component("redis"),
                list(nodes),
                list(&nodes[..nodes.len().min(2)]),
            );
        }
    }
    for (name, dedup) in S3_SIDES {
        let Some(endpoint) = &servers.s3 else { break };
        out += &format!(
            "[backends.{name}]\ncomponent = {}\nhttp = [\"{endpoint}\"]\n\
             env = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\n{limits}\
             settings = {{ endpoint = \"{endpoint}\", bucket = \"{BUCKET}\", dedup_check = \"{dedup}\", {tuning} }}\n",
            component("s3")
        );
    }
    out
}

/// Every case against every server given, `reps` times. The kvwasm
/// configuration is written to `scratch`.
pub fn run(
    servers: &Servers,
    reps: usize,
    quick: bool,
    scratch: &Path,
) -> Result<Vec<Pair>, String> {
    let config_path = scratch.join("remote-bench.toml");
    std::fs::write(&config_path, config(servers)).map_err(|e| e.to_string())?;
    let config = kvwasm_host::config::Config::load(&config_path)?;
    let side = |name: &'static str, dedup: &str| -> Result<Kvwasm, String> {
        Ok(Kvwasm {
            name,
            cluster: false,
            twin: "",
            backend: Arc::new(config.backend(name)?),
            exact_puts: dedup == "put",
            same_handle: servers.same_handle,
            saved_with: Default::default(),
        })
    };
    let kvwasm = |sides: Sides<2>| -> Result<Vec<Box<dyn Side>>, String> {
        sides
            .into_iter()
            .map(|(name, dedup)| -> Result<Box<dyn Side>, String> {
                Ok(Box::new(side(name, dedup)?))
            })
            .collect()
    };
    let big = if quick { 8 } else { 96 };
    let small = if quick { 256 } else { 4096 };
    let mut pairs = Vec::new();
    if servers.redis.is_some() || !servers.redis_cluster.is_empty() {
        let one = servers
            .redis
            .as_deref()
            .map(|address| -> Result<_, String> {
                let native = NativeRedis::connect(address, false)?;
                let exact = NativeRedis::connect(address, true)?;
                let hiredis = servers
                    .hiredis
                    .as_deref()
                    .map(|library| Hiredis::connect(library, address))
                    .transpose()?;
                Ok((native, exact, hiredis))
            })
            .transpose()?;
        let cluster = (!servers.redis_cluster.is_empty())
            .then(|| -> Result<_, String> {
                Ok((
                    NativeCluster::connect(&servers.redis_cluster, false)?,
                    NativeCluster::connect(&servers.redis_cluster, true)?,
                ))
            })
            .transpose()?;
        let mut natives: Vec<&dyn Side> = Vec::new();
        let mut sides: Vec<Box<dyn Side>> = Vec::new();
        if let Some((native, exact, hiredis)) = &one {
            natives.extend([native as &dyn Side, exact]);
            natives.extend(hiredis.iter().map(|h| h as &dyn Side));
            for ((name, dedup), twin) in REDIS_SIDES.into_iter().zip(TWINS) {
                sides.push(Box::new(Kvwasm {
                    twin,
                    ..side(name, dedup)?
                }));
            }
            if !servers.same_handle {
                sides.push(Box::new(Kvwasm {
                    same_handle: true,
                    ..side(REDIS_SAME_HANDLE, "put")?
                }));
            }
        }
        if let Some((cluster, exact)) = &cluster {
            natives.extend([cluster as &dyn Side, exact]);
            for ((name, dedup), twin) in REDIS_CLUSTER_SIDES.into_iter().zip(TWINS) {
                sides.push(Box::new(Kvwasm {
                    cluster: true,
                    twin,
                    ..side(name, dedup)?
                }));
            }
        }
        let loads = [Load::new(big, 1 << 20, 1.3), Load::new(small, 4 << 10, 1.5)];
        pairs.extend(compare(
            &natives,
            &sides,
            &loads,
            reps,
            servers.redis_pid,
            |base, load| {
                if let Some((native, ..)) = &one {
                    native.clean(base, load)?;
                }
                cluster
                    .as_ref()
                    .map_or(Ok(()), |(c, _)| c.clean(base, load))
            },
        )?);
    }
    if let Some(endpoint) = &servers.s3 {
        let native = NativeS3::new(endpoint)?;
        let loads = [Load::new(big, 1 << 20, 1.3)];
        let sides = kvwasm(S3_SIDES)?;
        pairs.extend(compare(
            &[&native],
            &sides,
            &loads,
            reps,
            servers.s3_pid,
            |base, load| native.clean(base, load),
        )?);
    }
    Ok(pairs)
}

/// Save and restore each load on every native client and every kvwasm
/// side, alternating who goes first, then delete what they stored. The CPU
/// time of the server `server_pid`, if given, is read around each
/// operation. Every kvwasm side is held to the load's target against each
/// baseline native client on the same servers (one server or the
/// cluster); the saves of sides that answer puts exactly are also set
/// beside each further native client that does (like for like, no
/// target); each side on the cluster is set beside its twin on one server
/// (the cost of cluster mode, no target).
fn compare(
    natives: &[&dyn Side],
    sides: &[Box<dyn Side>],
    loads: &[Load],
    reps: usize,
    server_pid: Option<u32>,
    clean: impl Fn(&str, &Load) -> Result<(), String>,
) -> Result<Vec<Pair>, String> {
    let all: Vec<&dyn Side> = natives
        .iter()
        .copied()
        .chain(sides.iter().map(|s| s.as_ref()))
        .collect();
    let meter = Meter { server_pid };
    let mut pairs = Vec::new();
    for load in loads {
        // [side][save, restore], in repetition order.
        let mut samples = vec![[Samples::default(), Samples::default()]; all.len()];
        // Repetition 0 warms up (connections, compiled guests) and is not kept.
        for rep in 0..=reps {
            let mut order: Vec<usize> = (0..all.len()).collect();
            if rep % 2 == 1 {
                order.reverse();
            }
            // A key space per load too: the loads share hashes, and the host
            // remembers per namespace which chunks a backend's server held
            // (known-chunks), which the cleanup deleted behind its back.
            let ns = |side: usize| {
                let pid = std::process::id();
                format!("bench-{pid}-{}-{rep}-{side}", load.size)
            };
            for &side in &order {
                let measured = all[side].save(&ns(side), load, meter)?;
                if rep > 0 {
                    samples[side][0].push(measured);
                }
            }
            for &side in &order {
                let measured = all[side].restore(&ns(side), load, meter, rep == 0)?;
                if rep > 0 {
                    samples[side][1].push(measured);
                }
            }
            for (side, s) in all.iter().enumerate() {
                clean(&s.base(&ns(side)), load)?;
            }
        }
        let pair = |op: usize, native: usize, side: usize, target: Option<f64>| Pair {
            case: format!(
                "{} {}{}",
                ["save", "restore with prefetch"][op],
                load.label,
                if all[native].cluster() == all[side].cluster() {
                    ""
                } else {
                    CLUSTER_COST
                }
            ),
            native_label: all[native].label(),
            native: Stat::new(samples[native][op].ms.clone()),
            kvwasm_label: all[side].label(),
            kvwasm: Stat::new(samples[side][op].ms.clone()),
            target,
            native_cpu: samples[native][op].cpu(),
            kvwasm_cpu: samples[side][op].cpu(),
        };
        let kvwasm_sides = natives.len()..all.len();
        let together = |a: usize, b: usize| all[a].cluster() == all[b].cluster();
        for op in 0..2 {
            for native in (0..natives.len()).filter(|&n| all[n].baseline()) {
                for side in kvwasm_sides.clone().filter(|&s| together(native, s)) {
                    pairs.push(pair(op, native, side, Some(load.target)));
                }
            }
        }
        for native in (0..natives.len()).filter(|&n| !all[n].baseline()) {
            for side in kvwasm_sides.clone().filter(|&s| together(native, s)) {
                if all[native].exact_puts() && all[side].exact_puts() {
                    pairs.push(pair(0, native, side, None));
                }
            }
        }
        for op in 0..2 {
            for on_cluster in (0..all.len()).filter(|&c| all[c].cluster()) {
                let twin = all[on_cluster].twin();
                let alone = (0..all.len())
                    .find(|&o| !twin.is_empty() && !all[o].cluster() && all[o].twin() == twin);
                if let Some(alone) = alone {
                    pairs.push(pair(op, alone, on_cluster, None));
                }
            }
        }
    }
    Ok(pairs)
}

/// The case suffix of a side on the cluster set beside its twin on one
/// server.
pub const CLUSTER_COST: &str = ", cluster ÷ one server";

/// The pairs as a Markdown table: times (lower is better) and ratios.
pub fn markdown(pairs: &[Pair], reps: usize, same_handle: bool) -> String {
    let mut out = String::from(
        "| case | native client | ms (median, min–max) | kvwasm | ms (median, min–max) | ratio | target |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for p in pairs {
        let ratio = p.ratio();
        let target = match p.target {
            Some(t) if ratio <= t => format!("≤ {t:.1}× met"),
            Some(t) => format!("≤ {t:.1}× missed"),
            None if p.case.ends_with(CLUSTER_COST) => "— (cost of cluster mode)".to_owned(),
            None => "— (like for like)".to_owned(),
        };
        out += &format!(
            "| {} | {} | {:.1} ({:.1}–{:.1}) | {} | {:.1} ({:.1}–{:.1}) | {ratio:.2}× | {target} |\n",
            p.case,
            p.native_label,
            p.native.median,
            p.native.min,
            p.native.max,
            p.kvwasm_label,
            p.kvwasm.median,
            p.kvwasm.min,
            p.kvwasm.max,
        );
    }
    let restores = if same_handle {
        "on the handle that saved (`--same-handle`)"
    } else {
        "on a new handle (a new guest instance)"
    };
    out += &format!(
        "\n{reps} repetitions; ratios (kvwasm time / native time) are medians of \
         per-repetition ratios. kvwasm restored {restores}{}. Rows `{CLUSTER_COST}` \
         set the same client on the Redis Cluster (right) beside one server (left). \
         Every restore on every side was verified byte for byte in the warm-up \
         repetition (not kept).\n\n",
        if same_handle {
            ""
        } else {
            "; `kvwasm (redis-same-handle)` on the handle that saved"
        }
    );
    out += &cpu_markdown(pairs);
    out
}

/// CPU time per operation, client and server, as a Markdown table: a
/// slower side that spends no more CPU is waiting, not working.
fn cpu_markdown(pairs: &[Pair]) -> String {
    let ms = |s: &Stat| format!("{:.1} ({:.1}–{:.1})", s.median, s.min, s.max);
    let server = |s: &Option<Stat>| s.as_ref().map_or_else(|| "—".to_owned(), ms);
    let faults = |s: &Stat| format!("{:.0}", s.median);
    let mut out = String::from(
        "CPU time per operation, ms (median, min–max): the client is this whole process \
         (all its threads), the server its process (`--redis-pid`, `--s3-pid`; clock ticks, \
         10 ms). Minor faults: pages the client process touched for the first time (median).\n\n\
         | case | native client | kvwasm | client CPU, native | client CPU, kvwasm | server CPU, native | server CPU, kvwasm | minor faults, native | minor faults, kvwasm |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for p in pairs {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            p.case,
            p.native_label,
            p.kvwasm_label,
            ms(&p.native_cpu.client),
            ms(&p.kvwasm_cpu.client),
            server(&p.native_cpu.server),
            server(&p.kvwasm_cpu.server),
            faults(&p.native_cpu.client_faults),
            faults(&p.kvwasm_cpu.client_faults),
        );
    }
    out
}

#[cfg(test)]
mod tests;
