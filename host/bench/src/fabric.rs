//! `kvwasm bench --fabric`: the MRDN fabric path against its raw baselines,
//! measured side by side in one run (issue 13's targets).
//!
//! * **Frame and verify** against plain `blake3` of the same bodies: framing
//!   a body already in place (`seal_in_place`: one hash plus the header),
//!   framing with a copy (`encode_into`: the copy and the hash in one pass)
//!   and strict decoding (one hash plus the checks) are each compared with
//!   one `blake3::hash` of the body.
//! * **Handoff** ([`handoff`]): a slot of 1 MiB chunks sent by
//!   `kvwasm_fabric::send` through the `tcp` fabric guest to a
//!   `kvwasm_fabric::Server`, against a plain Rust TCP sender and receiver
//!   on loopback moving the same bytes.
//!
//! Within a repetition the cases run back to back, and each ratio is the
//! median of per-repetition ratios, so drift on a noisy machine cancels.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use kvwasm_mrdn::{DecodeMode, Tier};

use crate::Stat;

/// One compared pair: the kvwasm path and its raw baseline, in GB/s.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pair {
    pub case: String,
    pub baseline_label: String,
    pub baseline: Stat,
    pub measured_label: String,
    pub measured: Stat,
    /// The target the issue sets for `measured / baseline`.
    pub target: f64,
}

impl Pair {
    /// Median of the per-repetition ratios.
    pub fn ratio(&self) -> f64 {
        self.measured.paired_ratio(&self.baseline)
    }
}

/// Bodies of the frame/verify comparison.
const FRAME_SIZES: [usize; 3] = [16 << 10, 1 << 20, 16 << 20];

/// Frame-and-verify throughput against raw hashing, per body size.
pub fn frame_verify(reps: usize, quick: bool) -> Vec<Pair> {
    let total: usize = if quick { 16 << 20 } else { 256 << 20 };
    FRAME_SIZES
        .iter()
        .flat_map(|&size| {
            let body: Vec<u8> = (0..size)
                .map(|i| (i as u8).wrapping_mul(31) ^ 0x5a)
                .collect();
            let count = (total / size).max(1);
            let bytes = (count * size) as f64;
            let mut frame = vec![0u8; kvwasm_mrdn::frame_len(size).expect("small body")];
            let (mut hash, mut encode, mut seal, mut verify) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..reps {
                hash.push(gbps(bytes, || {
                    for _ in 0..count {
                        black_box(blake3::hash(black_box(&body)));
                    }
                }));
                encode.push(gbps(bytes, || {
                    for _ in 0..count {
                        kvwasm_mrdn::encode_into(Tier::ThinkComplete, &body, &mut frame)
                            .expect("fits");
                        black_box(&frame);
                    }
                }));
                seal.push(gbps(bytes, || {
                    for _ in 0..count {
                        kvwasm_mrdn::seal_in_place(Tier::ThinkComplete, &mut frame).expect("fits");
                        black_box(&frame);
                    }
                }));
                verify.push(gbps(bytes, || {
                    for _ in 0..count {
                        kvwasm_mrdn::decode_with(black_box(&frame), DecodeMode::Strict)
                            .expect("valid frame");
                    }
                }));
            }
            let hash = Stat::new(hash);
            let label = format!("{} KiB bodies", size >> 10);
            [
                Pair {
                    case: format!("frame with a copy, {label}"),
                    baseline_label: "blake3".into(),
                    baseline: hash.clone(),
                    measured_label: "encode_into".into(),
                    measured: Stat::new(encode),
                    target: 0.9,
                },
                Pair {
                    case: format!("frame in place, {label}"),
                    baseline_label: "blake3".into(),
                    baseline: hash.clone(),
                    measured_label: "seal_in_place".into(),
                    measured: Stat::new(seal),
                    target: 0.9,
                },
                Pair {
                    case: format!("verify (strict decode), {label}"),
                    baseline_label: "blake3".into(),
                    baseline: hash,
                    measured_label: "decode_with(Strict)".into(),
                    measured: Stat::new(verify),
                    target: 0.9,
                },
            ]
        })
        .collect()
}

/// GB/s of `run` moving `bytes`.
pub(crate) fn gbps(bytes: f64, run: impl FnOnce()) -> f64 {
    let started = Instant::now();
    run();
    bytes / 1e9 / started.elapsed().as_secs_f64().max(1e-9)
}

/// The pairs as a Markdown table.
pub fn markdown(pairs: &[Pair], reps: usize) -> String {
    let mut out = String::from(
        "| case | baseline | GB/s (median, min–max) | kvwasm | GB/s (median, min–max) | ratio | target |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for p in pairs {
        let ratio = p.ratio();
        let verdict = if ratio >= p.target { "met" } else { "missed" };
        out += &format!(
            "| {} | {} | {:.2} ({:.2}–{:.2}) | {} | {:.2} ({:.2}–{:.2}) | {ratio:.2}× | ≥ {:.1}× {verdict} |\n",
            p.case,
            p.baseline_label,
            p.baseline.median,
            p.baseline.min,
            p.baseline.max,
            p.measured_label,
            p.measured.median,
            p.measured.min,
            p.measured.max,
            p.target,
        );
    }
    out += &format!("\n{reps} repetitions; ratios are medians of per-repetition ratios.\n");
    out
}

/// Where the receiver of a handoff stores what it gets.
#[derive(Clone, Copy, Debug)]
enum Receiver {
    /// `builtin:memory`: the transport's cost alone.
    Memory,
    /// `builtin:fs` on the bench directory (tmpfs by default).
    Files,
}

/// A 1 MiB-chunk slot handed from a source store through the `tcp` fabric
/// guest to a `kvwasm fabric serve` server (in this process, on loopback),
/// against a plain Rust TCP sender and receiver moving the same bytes.
pub fn handoff(reps: usize, quick: bool, dir: &Path) -> Result<Vec<Pair>, String> {
    let count = if quick { 32 } else { 256 };
    let chunks: Vec<Vec<u8>> = (0..count).map(|i| chunk(i, 1 << 20)).collect();
    let keys: Vec<[u8; 8]> = chunks
        .iter()
        .map(|c| xxhash_rust::xxh3::xxh3_64(c).to_le_bytes())
        .collect();
    let source = kvwasm_host::open(&format!("wasm://{}", dir.join("source").display()))
        .map_err(|e| format!("opening the source store: {e}"))?;
    for (key, data) in keys.iter().zip(&chunks) {
        source.put_chunk(key, data).map_err(|e| e.to_string())?;
    }
    let mut manifest = b"ggsq".to_vec();
    for field in [4, 0, count as u32] {
        manifest.extend_from_slice(&u32::to_le_bytes(field));
    }
    keys.iter().for_each(|k| manifest.extend_from_slice(k));
    source
        .put_manifest("slot", &manifest)
        .map_err(|e| e.to_string())?;

    let config_path = dir.join("fabric-bench.toml");
    let backends = format!(
        "[backends.mem]\ncomponent = \"builtin:memory\"\nmemory_limit_mib = 2048\n\
         [backends.files]\ncomponent = \"builtin:fs\"\ndir = {:?}\n",
        dir.join("received")
    );
    std::fs::write(&config_path, &backends).map_err(|e| e.to_string())?;
    let bytes = (count << 20) as f64;
    let (mut raw, mut raw_kept) = (Vec::new(), Vec::new());
    let (mut to_memory, mut to_files) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        raw.push(raw_tcp(&chunks, false)?);
        raw_kept.push(raw_tcp(&chunks, true)?);
        for (receiver, samples) in [
            (Receiver::Memory, &mut to_memory),
            (Receiver::Files, &mut to_files),
        ] {
            let seconds = one_handoff(&config_path, &backends, &source, receiver, rep)?;
            samples.push(bytes / 1e9 / seconds);
        }
    }
    let raw = Stat::new(raw);
    let raw_kept = Stat::new(raw_kept);
    let pair = |case: &str, baseline: &Stat, label: &str, measured: &[f64]| Pair {
        case: format!("{case}, {count} × 1 MiB"),
        baseline_label: label.into(),
        baseline: baseline.clone(),
        measured_label: "fabric send → serve (tcp guest)".into(),
        measured: Stat::new(measured.to_vec()),
        target: 0.8,
    };
    let discarded = "raw loopback TCP, received into one reused buffer";
    let kept = "raw loopback TCP, each chunk kept in new memory";
    Ok(vec![
        pair("handoff into a memory store", &raw, discarded, &to_memory),
        pair("handoff into a memory store", &raw_kept, kept, &to_memory),
        pair("handoff into files (tmpfs)", &raw, discarded, &to_files),
        pair("handoff into files (tmpfs)", &raw_kept, kept, &to_files),
    ])
}

/// Seconds for one `kvwasm fabric send` of the slot into a fresh namespace
/// of `receiver`, through a new server and a new tcp fabric.
fn one_handoff(
    config_path: &Path,
    backends: &str,
    source: &kvwasm_host::StoreHandle,
    receiver: Receiver,
    rep: usize,
) -> Result<f64, String> {
    let backend = match receiver {
        Receiver::Memory => "mem",
        Receiver::Files => "files",
    };
    let config = kvwasm_host::config::Config::load(config_path)?;
    let target = kvwasm_host::handle::open_shared(
        std::sync::Arc::new(config.backend(backend)?),
        &format!("rep-{rep}"),
    )
    .map_err(|e| e.to_string())?;
    let server = kvwasm_fabric::Server::bind("127.0.0.1:0", target, Default::default())
        .map_err(|e| e.to_string())?;
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    // The server runs until the process ends, as `kvwasm fabric serve` does.
    std::thread::spawn(move || server.run());
    std::fs::write(
        config_path,
        format!(
            "{backends}[fabrics.tcp]\ncomponent = \"builtin:tcp\"\nnet = [\"{addr}\"]\n\
             settings = {{ peer = \"{addr}\" }}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    kvwasm_fabric::builtins::install();
    let config = kvwasm_host::config::Config::load(config_path)?;
    let fabric = kvwasm_host::fabric::Fabric::start(std::sync::Arc::new(config.fabric("tcp")?))
        .map_err(|e| e.to_string())?;
    let options = kvwasm_fabric::SendOptions {
        manifest: "slot".into(),
        hashes: None,
        tier: Tier::ThinkComplete,
    };
    let report = kvwasm_fabric::send(source, &fabric, &options).map_err(|e| e.to_string())?;
    Ok(report.seconds)
}

/// GB/s of a plain Rust sender writing `chunks` to a receiver thread over
/// loopback TCP, which reads them into one reused 1 MiB buffer, or (`keep`)
/// into a new 1 MiB buffer per chunk that it keeps, as any receiver that
/// stores what it gets must (on this VM, first-touching fresh memory is
/// what a storing receiver mostly pays: docs/benchmarks.md).
fn raw_tcp(chunks: &[Vec<u8>], keep: bool) -> Result<f64, String> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let receiver = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut socket, _) = listener.accept()?;
        let mut kept = Vec::new();
        let mut total = 0;
        loop {
            let mut buf = vec![0u8; 1 << 20];
            let mut filled = 0;
            while filled < buf.len() {
                match socket.read(&mut buf[filled..])? {
                    0 => return Ok(total),
                    n => (filled, total) = (filled + n, total + n as u64),
                }
            }
            if keep {
                kept.push(buf);
            }
        }
    });
    let mut socket = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    for chunk in chunks {
        socket.write_all(chunk).map_err(|e| e.to_string())?;
    }
    socket
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let total = receiver
        .join()
        .map_err(|_| "the receiver thread panicked".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(total as f64 / 1e9 / started.elapsed().as_secs_f64())
}

/// Distinct, incompressible-looking bytes for chunk `i`.
fn chunk(i: usize, len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..len / 8)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .collect()
}
