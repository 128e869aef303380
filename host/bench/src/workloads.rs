//! The measurements. Every call goes through the C vtable of a library
//! loaded with `dlopen`, exactly as a consumer makes it; outputs are
//! released with `free`.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kv_store_abi::Handle;

use crate::stats::Stat;
use crate::target::{Loaded, Medium};
use crate::{CHUNK_SIZES, Plan, Row, SETTLE, Unit};

const MIB: usize = 1 << 20;
/// The llama.cpp fork's typical save: 96 chunks of 1 MiB.
const SAVE_CHUNKS: usize = 96;
const THREADS: usize = 4;
const HANDLES_FOR_MEMORY: usize = 16;
/// Warm saves of [`Workloads::idle_saves`]: (chunks, bytes each). 257 ×
/// 2 KiB is a small model's slot at llama.cpp's default chunking.
const IDLE_SHAPES: [(usize, usize); 2] = [(SAVE_CHUNKS, MIB), (257, 2 << 10)];
/// Idle time before each warm save: none, less than kvwasm's default
/// `idle_release_ms` (1 s), and more (the instance is released).
const IDLE_GAPS: &[Duration] = &[
    Duration::ZERO,
    Duration::from_millis(200),
    Duration::from_millis(1500),
    Duration::from_secs(5),
];
/// The same for `--quick`: the saves run, the gaps do not reach a release.
const QUICK_IDLE_GAPS: &[Duration] = &[
    Duration::ZERO,
    Duration::from_millis(20),
    Duration::from_millis(50),
];

/// What `put_chunk` must report for the chunks of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    New,
    Present,
    /// Either: a backend that batches its existence checks (e.g. the remote
    /// ones with `dedup_check = "flush"`) cannot tell a new handle's put
    /// of a stored chunk from a new one.
    Unchecked,
}

pub(crate) struct Workloads<'a> {
    plan: &'a Plan,
    targets: &'a [Loaded],
    bar: ProgressBar,
    /// Pseudo-random bytes, as large as the largest chunk.
    data: Vec<u8>,
    runs: usize,
}

impl<'a> Workloads<'a> {
    pub fn new(plan: &'a Plan, targets: &'a [Loaded]) -> Workloads<'a> {
        let (t, m, r) = (
            targets.len() as u64,
            plan.media.len() as u64,
            plan.reps as u64,
        );
        // One step per target and repetition of each sampled phase: the
        // throughput sizes, save/restore and the idle-save shapes per
        // medium, then small calls, threads, open (same and fresh process)
        // and memory.
        let per_medium = CHUNK_SIZES.len() + 1 + IDLE_SHAPES.len();
        let steps = t * r * (m * per_medium as u64 + 5);
        let bar = ProgressBar::with_draw_target(
            Some(steps),
            if plan.progress {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {wide_msg}")
                .expect("valid template"),
        );
        Workloads {
            plan,
            targets,
            bar,
            data: random_bytes(*CHUNK_SIZES.last().expect("sizes")),
            runs: 0,
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
        for medium in &self.plan.media {
            let _ = std::fs::remove_dir_all(scratch_root(medium));
        }
    }

    /// Target indices for repetition `rep`, alternating who goes first.
    fn order(&self, rep: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.targets.len()).collect();
        if rep % 2 == 1 {
            order.reverse();
        }
        order
    }

    /// A fresh, empty directory on `medium` and a handle opened on it.
    fn fresh<'t>(
        &mut self,
        target: &'t Loaded,
        medium: &Medium,
    ) -> Result<(Handle<'t>, PathBuf), String> {
        self.runs += 1;
        let dir = scratch_root(medium).join(format!("{}-{}", target.target.label, self.runs));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let uri = target.target.uri(&dir);
        let handle = target
            .lib
            .open_store(&uri)
            .ok_or_else(|| format!("{}: open({uri:?}) returned NULL", target.target.label))?;
        Ok((handle, dir))
    }

    fn step(&self, msg: String) {
        self.bar.set_message(msg);
        self.bar.inc(1);
    }

    /// `cases` × targets samples, filled by `measure(target, rep)` which
    /// returns one value per case.
    fn sample(
        &mut self,
        medium: &Medium,
        cases: &[(&str, Unit)],
        what: &str,
        mut measure: impl FnMut(&mut Self, &'a Loaded, &Medium) -> Result<Vec<f64>, String>,
    ) -> Result<Vec<Row>, String> {
        let n = self.targets.len();
        let mut samples = vec![vec![Vec::new(); n]; cases.len()];
        for rep in 0..self.plan.reps {
            for t in self.order(rep) {
                let target = &self.targets[t];
                self.step(format!(
                    "{what} · {} · {}",
                    medium.label, target.target.label
                ));
                let values = measure(self, target, medium)?;
                for (case, v) in values.into_iter().enumerate() {
                    samples[case][t].push(v);
                }
            }
        }
        Ok(cases
            .iter()
            .zip(samples)
            .map(|((case, unit), per_target)| Row {
                medium: medium.label.clone(),
                case: (*case).to_owned(),
                unit: *unit,
                per_target: per_target.into_iter().map(Stat::new).collect(),
            })
            .collect())
    }

    /// One case measured on the first medium, one value per run.
    fn sample_one(
        &mut self,
        case: (&str, Unit),
        what: &str,
        mut measure: impl FnMut(&mut Self, &'a Loaded, &Medium) -> Result<f64, String>,
    ) -> Result<Row, String> {
        let medium = self.plan.media[0].clone();
        let mut rows = self.sample(&medium, &[case], what, |w, target, medium| {
            measure(w, target, medium).map(|v| vec![v])
        })?;
        Ok(rows.remove(0))
    }

    /// `put_chunk` and `get_chunk` throughput per chunk size.
    pub fn throughput(&mut self) -> Result<Vec<Row>, String> {
        let mut rows = Vec::new();
        for medium in self.plan.media.clone() {
            for size in CHUNK_SIZES {
                let count = chunk_count(size, self.plan.quick);
                let (put, get) = (
                    format!("put {}", size_label(size)),
                    format!("get {}", size_label(size)),
                );
                let cases = [(put.as_str(), Unit::GBps), (get.as_str(), Unit::GBps)];
                rows.extend(self.sample(&medium, &cases, &put, |w, target, medium| {
                    let (h, dir) = w.fresh(target, medium)?;
                    let bytes = (size * count) as f64;
                    let put = time(|| w.put_chunks(&h, size, 0..count, Expect::New))?;
                    let get = time(|| w.get_chunks(&h, size, 0..count))?;
                    drop(h);
                    cleanup(&dir);
                    Ok(vec![gbps(bytes, put), gbps(bytes, get)])
                })?);
                std::thread::sleep(SETTLE);
            }
        }
        Ok(rows)
    }

    /// The llama.cpp fork's save (96 × 1 MiB); the same save again, on the
    /// same handle and on a new one (a restarted engine: nothing cached
    /// in the backend); and its restore.
    pub fn save_restore(&mut self) -> Result<Vec<Row>, String> {
        let chunks = if self.plan.quick { 8 } else { SAVE_CHUNKS };
        let cases = [
            ("cold save", Unit::Millis),
            ("warm save (all chunks present)", Unit::Millis),
            ("warm save, new handle", Unit::Millis),
            ("restore with prefetch", Unit::Millis),
            ("restore without prefetch", Unit::Millis),
        ];
        let mut rows = Vec::new();
        for medium in self.plan.media.clone() {
            rows.extend(
                self.sample(&medium, &cases, "save/restore", |w, target, medium| {
                    let (h, dir) = w.fresh(target, medium)?;
                    let cold = time(|| w.put_chunks(&h, MIB, 0..chunks, Expect::New))?;
                    let warm = time(|| w.put_chunks(&h, MIB, 0..chunks, Expect::Present))?;
                    let uri = target.target.uri(&dir);
                    let second = target
                        .lib
                        .open_store(&uri)
                        .ok_or_else(|| format!("open({uri:?}) again returned NULL"))?;
                    let warm_new =
                        time(|| w.put_chunks(&second, MIB, 0..chunks, Expect::Unchecked))?;
                    drop(second);
                    let hashes: Vec<[u8; 8]> = (0..chunks).map(key).collect();
                    let restore = |prefetch: bool| {
                        time(|| {
                            h.get_manifest("bench")
                                .map_err(|rc| format!("get_manifest: {rc}"))?;
                            if prefetch {
                                let list: Vec<&[u8]> =
                                    hashes.iter().map(|k| k.as_slice()).collect();
                                let _ = h.prefetch_chunks(&list);
                            }
                            w.get_chunks(&h, MIB, 0..chunks)
                        })
                    };
                    let without = restore(false)?;
                    let with = restore(true)?;
                    drop(h);
                    cleanup(&dir);
                    Ok(vec![
                        millis(cold),
                        millis(warm),
                        millis(warm_new),
                        millis(with),
                        millis(without),
                    ])
                })?,
            );
        }
        Ok(rows)
    }

    /// A long-lived handle saving the same slot again and again, as a
    /// llama.cpp server does, with the engine idle between saves for each
    /// of [`IDLE_GAPS`] (an idle instance may be released meanwhile:
    /// kvwasm's default `idle_release_ms` is 1 s), for llama.cpp's two
    /// usual shapes; then the same save on a new handle (open, save,
    /// close: llama.cpp's slot code), and a restore. `--quick` shrinks the
    /// gaps to [`QUICK_IDLE_GAPS`] and the saves to a few chunks.
    pub fn idle_saves(&mut self) -> Result<Vec<Row>, String> {
        let gaps = if self.plan.quick {
            QUICK_IDLE_GAPS
        } else {
            IDLE_GAPS
        };
        let mut rows = Vec::new();
        for medium in self.plan.media.clone() {
            for (chunks, size) in IDLE_SHAPES {
                let chunks = if self.plan.quick {
                    chunks.min(8)
                } else {
                    chunks
                };
                let shape = format!("{chunks} × {}", size_label(size));
                let mut names = vec![format!("{shape}: cold save")];
                names.extend(
                    gaps.iter().map(|gap| {
                        format!("{shape}: warm save after {} s idle", gap.as_secs_f64())
                    }),
                );
                names.push(format!(
                    "{shape}: warm save, new handle (open, save, close)"
                ));
                names.push(format!("{shape}: restore with prefetch"));
                let cases: Vec<(&str, Unit)> =
                    names.iter().map(|n| (n.as_str(), Unit::Millis)).collect();
                rows.extend(self.sample(&medium, &cases, &shape, |w, target, medium| {
                    let (h, dir) = w.fresh(target, medium)?;
                    let mut out = vec![millis(time(|| {
                        w.put_chunks(&h, size, 0..chunks, Expect::New)
                    })?)];
                    for gap in gaps {
                        std::thread::sleep(*gap);
                        out.push(millis(time(|| {
                            w.put_chunks(&h, size, 0..chunks, Expect::Present)
                        })?));
                    }
                    let uri = target.target.uri(&dir);
                    out.push(millis(time(|| {
                        let fresh = target
                            .lib
                            .open_store(&uri)
                            .ok_or_else(|| format!("open({uri:?}) again returned NULL"))?;
                        w.put_chunks(&fresh, size, 0..chunks, Expect::Present)
                    })?));
                    let hashes: Vec<[u8; 8]> = (0..chunks).map(key).collect();
                    out.push(millis(time(|| {
                        h.get_manifest("bench")
                            .map_err(|rc| format!("get_manifest: {rc}"))?;
                        let list: Vec<&[u8]> = hashes.iter().map(|k| k.as_slice()).collect();
                        let _ = h.prefetch_chunks(&list);
                        w.get_chunks(&h, size, 0..chunks)
                    })?));
                    drop(h);
                    cleanup(&dir);
                    Ok(out)
                })?);
            }
        }
        Ok(rows)
    }

    /// The cost of one call that does nothing: `get_manifest` of a missing name.
    pub fn small_call(&mut self) -> Result<Row, String> {
        let calls = if self.plan.quick { 2_000 } else { 20_000 };
        self.sample_one(
            ("get_manifest, missing name", Unit::Nanos),
            "small calls",
            |w, target, medium| {
                let (h, dir) = w.fresh(target, medium)?;
                missing_manifests(&h, calls / 10)?;
                let elapsed = time(|| missing_manifests(&h, calls))?;
                drop(h);
                cleanup(&dir);
                Ok(elapsed.as_nanos() as f64 / calls as f64)
            },
        )
    }

    /// The same call with the core's caches cold, as after a large transfer:
    /// a consumer that has just copied a MiB or more reaches the backend with
    /// little of its data (and, in caches shared by code and data, its code)
    /// in L1 and L2. Before each timed call, [`evict_caches`] runs (not
    /// timed).
    pub fn cold_small_call(&mut self) -> Result<Row, String> {
        let calls = if self.plan.quick { 50 } else { 500 };
        let mut sweep = vec![0u8; EVICT_BYTES];
        self.sample_one(
            (
                "get_manifest, missing name, caches evicted first",
                Unit::Nanos,
            ),
            "cold small calls",
            |w, target, medium| {
                let (h, dir) = w.fresh(target, medium)?;
                missing_manifests(&h, 100)?;
                let mut total = Duration::ZERO;
                for _ in 0..calls {
                    evict_caches(&mut sweep);
                    total += time(|| missing_manifests(&h, 1))?;
                }
                drop(h);
                cleanup(&dir);
                Ok(total.as_nanos() as f64 / calls as f64)
            },
        )
    }

    /// 1 MiB puts and gets with 1 and with 4 threads on one handle, and
    /// with 8 threads on 8 handles (one each).
    pub fn threads(&mut self) -> Result<Vec<Row>, String> {
        let count = if self.plan.quick { 16 } else { 128 };
        let cases = [
            ("put 1 MiB, 1 thread", Unit::GBps),
            ("put 1 MiB, 4 threads", Unit::GBps),
            ("put 1 MiB, 8 threads on 8 handles", Unit::GBps),
            ("get 1 MiB, 1 thread", Unit::GBps),
            ("get 1 MiB, 4 threads", Unit::GBps),
            ("get 1 MiB, 8 threads on 8 handles", Unit::GBps),
        ];
        let medium = self.plan.media[0].clone();
        self.sample(&medium, &cases, "threads", |w, target, medium| {
            let mut out = Vec::new();
            let bytes = (count * MIB) as f64;
            let mut gets = Vec::new();
            for (threads, handles) in [(1, 1), (THREADS, 1), (8, 8)] {
                let (first, dir) = w.fresh(target, medium)?;
                let uri = target.target.uri(&dir);
                let mut hs = vec![first];
                for _ in 1..handles {
                    hs.push(target.lib.open_store(&uri).ok_or("open returned NULL")?);
                }
                let w = &*w;
                // Thread `t` runs on handle `t % handles`.
                let parts: Vec<_> = (0..threads)
                    .map(|t| {
                        (
                            &hs[t % handles],
                            (t * count / threads)..((t + 1) * count / threads),
                        )
                    })
                    .collect();
                let put = time(|| {
                    std::thread::scope(|s| {
                        let jobs: Vec<_> = parts
                            .iter()
                            .map(|(h, range)| {
                                s.spawn(|| w.put_chunks_only(h, MIB, range.clone(), Expect::New))
                            })
                            .collect();
                        jobs.into_iter().try_for_each(|j| {
                            j.join().unwrap_or_else(|_| Err("thread panicked".into()))
                        })
                    })?;
                    hs.iter().try_for_each(|h| {
                        h.put_manifest("bench", b"threads")
                            .map_err(|rc| format!("put_manifest: {rc}"))
                    })
                })?;
                let get = time(|| {
                    std::thread::scope(|s| {
                        let jobs: Vec<_> = parts
                            .iter()
                            .map(|(h, range)| s.spawn(|| w.get_chunks(h, MIB, range.clone())))
                            .collect();
                        jobs.into_iter().try_for_each(|j| {
                            j.join().unwrap_or_else(|_| Err("thread panicked".into()))
                        })
                    })
                })?;
                drop(hs);
                cleanup(&dir);
                out.push(gbps(bytes, put));
                gets.push(gbps(bytes, get));
            }
            out.extend(gets);
            Ok(out)
        })
    }

    /// `open` latency: another open in the same process, and (with a probe
    /// executable) the first open in a fresh process, with the artifact
    /// cache warm and empty.
    pub fn open_latency(&mut self) -> Result<Vec<Row>, String> {
        let medium = self.plan.media[0].clone();
        let mut rows = self.sample(
            &medium,
            &[("another open in the same process", Unit::Millis)],
            "open",
            |w, target, medium| {
                let (first, dir) = w.fresh(target, medium)?;
                let uri = target.target.uri(&dir);
                let mut best = Vec::new();
                for _ in 0..10 {
                    let start = Instant::now();
                    let h = target.lib.open_store(&uri).ok_or("open returned NULL")?;
                    best.push(millis(start.elapsed()));
                    drop(h);
                }
                drop(first);
                cleanup(&dir);
                Ok(vec![Stat::new(best).median])
            },
        )?;
        let Some((exe, args)) = self.plan.open_probe.clone() else {
            return Ok(rows);
        };
        let cases = [
            ("dlopen of the library (once per process)", Unit::Millis),
            ("first open in a process, warm artifact cache", Unit::Millis),
            (
                "first open in a process, empty artifact cache",
                Unit::Millis,
            ),
        ];
        rows.extend(self.sample(
            &medium,
            &cases,
            "open (fresh process)",
            |w, target, medium| {
                let (h, dir) = w.fresh(target, medium)?;
                drop(h);
                let uri = target.target.uri(&dir);
                let probe = |cache: Option<&Path>| -> Result<(f64, f64), String> {
                    let mut cmd = Command::new(&exe);
                    cmd.args(&args)
                        .arg("--lib")
                        .arg(&target.target.lib)
                        .arg("--uri")
                        .arg(&uri);
                    if let Some(cache) = cache {
                        cmd.env("KVWASM_CACHE_DIR", cache);
                    }
                    let out = cmd.output().map_err(|e| format!("open probe: {e}"))?;
                    let text = String::from_utf8_lossy(&out.stdout);
                    parse_probe(&text).ok_or_else(|| {
                        format!(
                            "open probe printed {text:?}: {}",
                            String::from_utf8_lossy(&out.stderr)
                        )
                    })
                };
                let (dlopen, warm) = probe(None)?;
                let empty = dir.join("empty-cache");
                let (_, cold) = probe(Some(&empty))?;
                cleanup(&dir);
                Ok(vec![dlopen, warm, cold])
            },
        )?);
        Ok(rows)
    }

    /// Resident memory an open handle adds (each handle used once).
    pub fn memory_per_handle(&mut self) -> Result<Row, String> {
        self.sample_one(
            ("resident memory per open handle", Unit::KiB),
            "memory",
            |w, target, medium| {
                // One handle stays open so one-time costs are not counted.
                let (keep, dir) = w.fresh(target, medium)?;
                w.put_chunks(&keep, 4096, 0..1, Expect::New)?;
                let before = resident_kib();
                let uri = target.target.uri(&dir);
                let mut handles = Vec::new();
                for i in 0..HANDLES_FOR_MEMORY {
                    let h = target.lib.open_store(&uri).ok_or("open returned NULL")?;
                    w.put_chunks_only(&h, 4096, 1 + i..2 + i, Expect::New)?;
                    w.get_chunks(&h, 4096, 1 + i..2 + i)?;
                    handles.push(h);
                }
                let after = resident_kib();
                drop(handles);
                drop(keep);
                cleanup(&dir);
                Ok((after - before) / HANDLES_FOR_MEMORY as f64)
            },
        )
    }

    /// Put chunks `range`, then the manifest (a save).
    fn put_chunks(
        &self,
        h: &Handle<'_>,
        size: usize,
        range: Range<usize>,
        expect: Expect,
    ) -> Result<(), String> {
        self.put_chunks_only(h, size, range, expect)?;
        h.put_manifest("bench", &[0; 64])
            .map_err(|rc| format!("put_manifest: {rc}"))
    }

    /// Put chunks `range`: chunk `i` is the shared random bytes stamped with `i`.
    fn put_chunks_only(
        &self,
        h: &Handle<'_>,
        size: usize,
        range: Range<usize>,
        expect: Expect,
    ) -> Result<(), String> {
        let mut buf = self.data[..size].to_vec();
        for i in range {
            stamp(&mut buf, i);
            let present = h
                .put_chunk(&key(i), &buf)
                .map_err(|rc| format!("put_chunk {i} ({size} bytes): {rc}"))?;
            if expect == Expect::New && present || expect == Expect::Present && !present {
                return Err(format!(
                    "put_chunk {i}: expected {expect:?}, got present={present}"
                ));
            }
        }
        Ok(())
    }

    /// Get chunks `range` and check their size and stamp.
    fn get_chunks(&self, h: &Handle<'_>, size: usize, range: Range<usize>) -> Result<(), String> {
        for i in range {
            let got = h
                .get_chunk(&key(i))
                .map_err(|rc| format!("get_chunk {i}: {rc}"))?;
            if got.len() != size || got[..8] != (i as u64).to_le_bytes() {
                return Err(format!(
                    "get_chunk {i}: wrong bytes ({} of {size})",
                    got.len()
                ));
            }
        }
        Ok(())
    }
}

/// `open_probe` in a fresh process: the time to `dlopen` the library and
/// the time of its first `open`, printed as one line.
pub fn open_probe(lib: &Path, uri: &str) -> Result<String, String> {
    let start = Instant::now();
    let library = kv_store_abi::Library::open(lib.as_os_str()).map_err(|e| e.to_string())?;
    let dlopen = start.elapsed();
    let start = Instant::now();
    let handle = library.open_store(uri).ok_or("open returned NULL")?;
    let open = start.elapsed();
    drop(handle);
    Ok(format!(
        "dlopen_ms={} open_ms={}",
        millis(dlopen),
        millis(open)
    ))
}

pub(crate) fn parse_probe(text: &str) -> Option<(f64, f64)> {
    let line = text.lines().find(|l| l.starts_with("dlopen_ms="))?;
    let mut values = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=')?.1.parse().ok());
    Some((values.next()?, values.next()?))
}

fn scratch_root(medium: &Medium) -> PathBuf {
    medium
        .path
        .join(format!("kvwasm-bench-{}", std::process::id()))
}

fn cleanup(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// Chunks per throughput run: enough bytes for a stable figure.
fn chunk_count(size: usize, quick: bool) -> usize {
    let total = match (quick, size) {
        (true, _) => 4 * MIB,
        (false, s) if s <= 4 << 10 => 48 * MIB,
        (false, s) if s <= 64 << 10 => 128 * MIB,
        (false, s) if s <= MIB => 192 * MIB,
        _ => 256 * MIB,
    };
    (total / size).max(2)
}

/// The 8-byte key of chunk `i` (xxh3-64, as llama.cpp keys its chunks).
pub(crate) fn key(i: usize) -> [u8; 8] {
    xxhash_rust::xxh3::xxh3_64(&(i as u64).to_le_bytes()).to_le_bytes()
}

/// Make chunk `i`'s bytes unique: its index in the first 8 bytes.
pub(crate) fn stamp(buf: &mut [u8], i: usize) {
    if buf.len() >= 8 {
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
    }
}

pub(crate) fn random_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Bytes [`evict_caches`] sweeps: eight times a large core's L2 cache. A
/// shared L3 may be larger (a VM can report its host's): the calls measured
/// after a sweep find their code and data in L3 at best.
pub(crate) const EVICT_BYTES: usize = 16 << 20;

/// Read and write every byte of `sweep`, pushing what a call would find in
/// the core's data caches out of them. Plain stores (not a
/// `memcpy`, which may bypass the caches above a size that depends on the
/// machine), the same for every target.
pub(crate) fn evict_caches(sweep: &mut [u8]) {
    for byte in sweep.iter_mut() {
        *byte = byte.wrapping_add(1);
    }
    std::hint::black_box(sweep);
}

/// `n` calls of `get_manifest` on a name never written.
fn missing_manifests(h: &Handle, n: usize) -> Result<(), String> {
    for _ in 0..n {
        if h.get_manifest("never-written").is_ok() {
            return Err("get_manifest of a missing name succeeded".into());
        }
    }
    Ok(())
}

pub(crate) fn time(f: impl FnOnce() -> Result<(), String>) -> Result<Duration, String> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}

pub(crate) fn gbps(bytes: f64, d: Duration) -> f64 {
    bytes / d.as_secs_f64() / 1e9
}

pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `VmRSS` of this process, KiB.
pub(crate) fn resident_kib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// `4 KiB`, `64 KiB`, `1 MiB`, `16 MiB`.
pub(crate) fn size_label(size: usize) -> String {
    if size >= MIB {
        format!("{} MiB", size / MIB)
    } else {
        format!("{} KiB", size >> 10)
    }
}
