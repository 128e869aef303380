//! The advisor's benchmark on the simulated two-tier store: restore hit
//! ratio in the hot tier on the shared-prompt trace, the default policy
//! against plain LRU (docs/benchmarks.md), on the default trace and two
//! variants. `cargo run --release --example shared_prompt` in
//! guest-backends/advisor-core.

use kvwasm_advisor_core::{Knobs, Mode, sim};

fn main() {
    let default = sim::Workload::default();
    let variants = [
        (
            "default (hot 30%, a one-off request every 2nd turn)",
            default.clone(),
        ),
        (
            "no one-off requests",
            sim::Workload {
                scan_every: 0,
                ..default.clone()
            },
        ),
        (
            "hot 40%",
            sim::Workload {
                hot_pct: 40,
                ..default.clone()
            },
        ),
    ];
    for (name, w) in variants {
        println!("{name}: {w:?}");
        let modes = [Some(Mode::Frequency), Some(Mode::Lru), None];
        for mode in modes {
            let o = sim::run(
                &w,
                mode.map(|mode| Knobs {
                    mode,
                    ..Knobs::default()
                }),
            );
            let name = mode.map_or("no advisor".to_owned(), |m| format!("{m:?}"));
            println!(
                "  {name}: restore hit ratio {:.3} ({} of {} chunk reads), shared prompt hot \
                 at end {}/{}, moves {}, refused {}, max hot {} of {} bytes, lost {}",
                o.hit_ratio(),
                o.hot_hits,
                o.restore_reads,
                o.prefix_hot_at_end,
                w.prefix_chunks,
                o.moves,
                o.refused,
                o.max_hot_bytes,
                o.capacity,
                o.lost
            );
        }
    }
}
