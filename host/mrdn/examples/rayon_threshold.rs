//! Measures Blake3 single-threaded `update` against multithreaded `update_rayon` per body size,
//! interleaved, median of 11 runs each; the figures in the crate docs came from this
//! (`cargo run --release -p kvwasm-mrdn --example rayon_threshold`).

use std::hint::black_box;
use std::time::Instant;

fn gib_per_s(data: &[u8], iters: usize, rayon: bool) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        let mut hasher = blake3::Hasher::new();
        if rayon {
            hasher.update_rayon(data);
        } else {
            hasher.update(data);
        }
        black_box(hasher.finalize());
    }
    (iters * data.len()) as f64 / f64::from(1u32 << 30) / start.elapsed().as_secs_f64()
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn main() {
    for mib in [1usize, 2, 4, 8, 16, 64] {
        let data: Vec<u8> = (0..mib << 20).map(|i| (i * 31 + 7) as u8).collect();
        // About 128 MiB hashed per run.
        let iters = (128 / mib).max(2);
        let (mut serial, mut rayon) = (Vec::new(), Vec::new());
        for _ in 0..11 {
            serial.push(gib_per_s(&data, iters, false));
            rayon.push(gib_per_s(&data, iters, true));
        }
        let (s, r) = (median(serial), median(rayon));
        println!(
            "{mib:>3} MiB: update {s:.2} GiB/s, update_rayon {r:.2} GiB/s ({:.2}x)",
            r / s
        );
    }
}
