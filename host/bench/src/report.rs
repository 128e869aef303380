//! Results as Markdown tables (what `docs/benchmarks.md` quotes), with every
//! figure also given as a ratio to the baseline, and the targets
//! checked against them.

use std::fmt::Write as _;

use crate::{Results, Row, Stat};

/// The whole report.
pub fn markdown(r: &Results) -> String {
    let mut out = String::new();
    let media: Vec<String> = r
        .media
        .iter()
        .map(|m| format!("{} (`{}`)", m.label, m.path.display()))
        .collect();
    let _ = writeln!(
        out,
        "Targets: {} (baseline: {}). Directories: {}. {} repetition(s); median [min–max]; \
         ratios are medians of per-repetition ratios (runs taken back to back).{}\n",
        r.targets.join(", "),
        r.targets[0],
        media.join(", "),
        r.reps,
        if r.quick {
            " QUICK run: tiny sizes, not for quoting."
        } else {
            ""
        }
    );
    // The goals are the fs guest's against the native backend: shown for
    // a full run only.
    if r.targets.len() > 1 && r.sections.len() == crate::Section::ALL.len() {
        section(&mut out, "Targets", &goals(r));
    }
    if r.targets.len() > 1 && !r.idle_saves.is_empty() {
        section(
            &mut out,
            "Targets, warm saves after idle gaps",
            &idle_goals(r),
        );
    }
    let per_medium = [
        (&r.throughput, "Throughput"),
        (&r.save_restore, "Save and restore, 96 × 1 MiB"),
        (&r.idle_saves, "Warm saves after idle gaps"),
    ];
    for (all, title) in per_medium {
        for medium in &r.media {
            let rows: Vec<&Row> = all.iter().filter(|x| x.medium == medium.label).collect();
            if rows.is_empty() {
                continue;
            }
            section(
                &mut out,
                &format!("{title}, {}", medium.label),
                &table(r, &rows),
            );
        }
    }
    let mut rest: Vec<&Row> = r.small_call.iter().chain(&r.cold_call).collect();
    rest.extend(&r.threads);
    rest.extend(&r.open);
    rest.extend(&r.memory_per_handle);
    if !rest.is_empty() {
        section(
            &mut out,
            &format!("Calls, threads, open and memory ({})", r.media[0].label),
            &table(r, &rest),
        );
    }
    if let Some(floor) = &r.call_floor {
        section(
            &mut out,
            "The floor of a component call",
            &call_floor(r, floor),
        );
    }
    out
}

/// The bare wasmtime calls, and how much of the empty call's budget (1.25×
/// the baseline's time, issue 17) the one kvwasm makes takes by itself.
fn call_floor(r: &Results, floor: &crate::floor::CallFloor) -> String {
    let mut out = String::from(
        "| wasmtime component call, `u32` in and out, one host import inside (ns) | median [min–max] |\n|---|---|\n",
    );
    let rows = [
        (
            "`call_async` on a fiber, synchronous import (how kvwasm calls a guest that calls `payload-io`)",
            &floor.asynchronous,
        ),
        (
            "`call_async` on a fiber, async import (the shape of a WASI call)",
            &floor.async_import,
        ),
        ("`call`, synchronous, no fiber", &floor.synchronous),
        (
            "`call_async`, synchronous import, caches evicted before each call",
            &floor.cold,
        ),
    ];
    for (case, stat) in rows {
        let _ = writeln!(out, "| {case} | {} |", cell(stat));
    }
    if let Some(small) = &r.small_call {
        let base = small.per_target[0].median;
        let budget = 0.25 * base;
        let _ = writeln!(
            out,
            "\nAn empty call within 1.25× of {}'s {} ns may take {} ns more than it; wasmtime's \
             `call_async` with a synchronous import alone takes {} ns ({:.0}% of that), its \
             synchronous `call` {} ns ({:.0}%).",
            r.targets[0],
            num(base),
            num(budget),
            num(floor.asynchronous.median),
            100.0 * floor.asynchronous.median / budget,
            num(floor.synchronous.median),
            100.0 * floor.synchronous.median / budget,
        );
    }
    out
}

fn section(out: &mut String, title: &str, body: &str) {
    let _ = writeln!(out, "### {title}\n\n{body}");
}

/// One row per case: each target's median and spread, then each
/// non-baseline target's ratio to the baseline.
fn table(r: &Results, rows: &[&Row]) -> String {
    rows_table(&r.targets, rows)
}

/// [`table`] for any targets, the first the baseline.
pub(crate) fn rows_table(targets: &[String], rows: &[&Row]) -> String {
    let mut out = String::from("| case |");
    for t in targets {
        let _ = write!(out, " {t} |");
    }
    for t in &targets[1..] {
        let _ = write!(out, " {t} ÷ {} |", targets[0]);
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(2 * targets.len() - 1));
    out.push('\n');
    for row in rows {
        let _ = write!(out, "| {} ({}) |", row.case, row.unit.label());
        for s in &row.per_target {
            let _ = write!(out, " {} |", cell(s));
        }
        for s in &row.per_target[1..] {
            let _ = write!(out, " {:.2}× |", s.paired_ratio(&row.per_target[0]));
        }
        out.push('\n');
    }
    out
}

fn cell(s: &Stat) -> String {
    if s.samples.len() > 1 {
        format!("{} [{}–{}]", num(s.median), num(s.min), num(s.max))
    } else {
        num(s.median)
    }
}

fn num(v: f64) -> String {
    match v.abs() {
        x if x >= 100.0 => format!("{v:.0}"),
        x if x >= 10.0 => format!("{v:.1}"),
        x if x >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

/// Every warm save on a long-lived handle, whatever the idle time before
/// it, within 1.5× the baseline's time (issue 37).
fn idle_goals(r: &Results) -> String {
    let mut out = String::from("| goal | measured | met |\n|---|---|---|\n");
    for row in r.idle_saves.iter().filter(|x| x.case.contains("idle")) {
        let x = row.per_target[1].paired_ratio(&row.per_target[0]);
        let _ = writeln!(
            out,
            "| {} ≤ 1.5× {} ({}) | {x:.2}× time | {} |",
            row.case,
            r.targets[0],
            row.medium,
            if x <= 1.5 { "yes" } else { "**no**" }
        );
    }
    out
}

/// The throughput issue's targets, for the second target against the
/// baseline: the goal, the measured value, and whether it was met.
fn goals(r: &Results) -> String {
    let t = 1;
    let mut out = String::from("| goal | measured | met |\n|---|---|---|\n");
    let mut line = |goal: &str, measured: String, met: bool| {
        let _ = writeln!(
            out,
            "| {goal} | {measured} | {} |",
            if met { "yes" } else { "**no**" }
        );
    };
    let ratio = |row: &Row| row.per_target[t].paired_ratio(&row.per_target[0]);
    let find = |rows: &[Row], medium: &str, case: &str| {
        rows.iter()
            .find(|x| x.medium == medium && x.case == case)
            .cloned()
    };
    for medium in &r.media {
        let m = &medium.label;
        for (sizes, floor) in [(&["1 MiB", "16 MiB"][..], 0.9), (&["4 KiB"][..], 0.6)] {
            for op in ["put", "get"] {
                for size in sizes {
                    if let Some(row) = find(&r.throughput, m, &format!("{op} {size}")) {
                        let x = ratio(&row);
                        line(
                            &format!("{op} {size} ≥ {floor}× native ({m})"),
                            format!("{x:.2}×"),
                            x >= floor,
                        );
                    }
                }
            }
        }
        for case in ["cold save", "restore with prefetch"] {
            if let Some(row) = find(&r.save_restore, m, case) {
                let x = ratio(&row);
                line(
                    &format!("{case}, 96 × 1 MiB, within 1.15× native ({m})"),
                    format!("{x:.2}× time"),
                    x <= 1.15,
                );
            }
        }
        if m == &r.media[0].label
            && let Some(row) = find(&r.save_restore, m, "warm save (all chunks present)")
        {
            let ms = row.per_target[t].median;
            line(
                &format!("warm save ≤ 2 ms ({m})"),
                format!("{ms:.2} ms"),
                ms <= 2.0,
            );
        }
    }
    if let Some(row) = &r.small_call {
        let small = ratio(row);
        line(
            "small call ≤ 3× native",
            format!("{small:.2}× time"),
            small <= 3.0,
        );
    }
    for op in ["put", "get"] {
        let find = |case: String| r.threads.iter().find(|x| x.case == case);
        let Some(one) = find(format!("{op} 1 MiB, 1 thread")) else {
            continue;
        };
        for many in ["4 threads", "8 threads on 8 handles"] {
            if let Some(row) = find(format!("{op} 1 MiB, {many}")) {
                let x = row.per_target[t].paired_ratio(&one.per_target[t]);
                line(
                    &format!("{op}: {many} ≥ 1.5× one thread"),
                    format!("{x:.2}×"),
                    x >= 1.5,
                );
            }
        }
    }
    for (case, limit) in [
        ("first open in a process, warm artifact cache", 5.0),
        ("another open in the same process", 0.5),
    ] {
        if let Some(row) = r.open.iter().find(|x| x.case == case) {
            let ms = row.per_target[t].median;
            line(
                &format!("{case} ≤ {limit} ms"),
                format!("{ms:.2} ms"),
                ms <= limit,
            );
        }
    }
    if let Some(row) = r
        .open
        .iter()
        .find(|x| x.case.contains("empty artifact cache"))
    {
        line(
            "first open, empty cache (report only)",
            format!("{:.0} ms", row.per_target[t].median),
            true,
        );
    }
    if let Some(row) = &r.memory_per_handle {
        line(
            "resident memory per handle (report only)",
            format!("{:.0} KiB", row.per_target[t].median),
            true,
        );
    }
    out
}
