//! `kvwasm bench --fabric`: the MRDN fabric path against its raw baselines,
//! measured side by side in one run (issue 13's targets).
//!
//! * **Frame and verify** against plain `blake3` of the same bodies: framing
//!   a body already in place (`seal_in_place`: one hash plus the header),
//!   framing with a copy (`encode_into`: the copy and the hash in one pass)
//!   and strict decoding (one hash plus the checks) are each compared with
//!   one `blake3::hash` of the body.
//! * **Handoff** (added by [`handoff`]) against a plain Rust TCP sender and
//!   receiver on loopback moving the same bytes.
//!
//! Within a repetition the cases run back to back, and each ratio is the
//! median of per-repetition ratios, so drift on a noisy machine cancels.

use std::hint::black_box;
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
    let mut out = format!(
        "| case | baseline | GB/s (median, min–max) | kvwasm | GB/s (median, min–max) | ratio | target |\n\
         |---|---|---|---|---|---|---|\n"
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
