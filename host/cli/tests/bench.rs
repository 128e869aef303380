//! `kvwasm bench --quick` end to end (a smoke run: seconds, no timing
//! assertions): both default targets through the C ABI, every section of
//! the report, and a plot.

use std::path::Path;
use std::process::Command;

#[test]
fn a_quick_bench_measures_both_targets_and_writes_a_plot() {
    let scratch = tempfile::tempdir().unwrap();
    let status = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/native-backend"))
        .arg(format!("OUT={}", scratch.path().display()))
        .status()
        .expect("run make");
    assert!(status.success());
    let (plot, json) = (
        scratch.path().join("plot.svg"),
        scratch.path().join("samples.json"),
    );
    let data = scratch.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvwasm"))
        .args(["bench", "--quick", "--no-progress"])
        .arg("--native")
        .arg(scratch.path().join("libkv_store_cfs.so"))
        .arg("--shim")
        .arg(kvwasm_tests::shim_path())
        .arg("--dir")
        .arg(format!("scratch={}", data.display()))
        .arg("--plot")
        .arg(&plot)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for section in [
        "### Targets",
        "### Throughput, scratch",
        "### Save and restore, 96 × 1 MiB, scratch",
        "| put 16 MiB (GB/s) |",
        "| get_manifest, missing name (ns) |",
        "| get 1 MiB, 4 threads (GB/s) |",
        "| first open in a process, empty artifact cache (ms) |",
        "| resident memory per open handle (KiB) |",
    ] {
        assert!(report.contains(section), "{section} missing:\n{report}");
    }
    assert!(report.contains("| case | native | kvwasm | kvwasm ÷ native |"));
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("kvwasm put"),
        "{svg:.200}"
    );
    let samples: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(samples["targets"], serde_json::json!(["native", "kvwasm"]));
    // The scratch directory is left empty.
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
}

/// `kvwasm bench --remote --quick` on a real Redis server and a real Redis
/// Cluster (3 masters + 3 replicas), both requiring a password: the rows
/// of issues 42 and 43 (hiredis, a new and the saving handle, the cluster)
/// are reported, and the run succeeds, which it does only if every restore
/// read the saved manifest and every chunk whole (bytes compared in the
/// warm-up). No timing is asserted.
#[test]
fn a_quick_remote_bench_reports_hiredis_new_and_same_handle_and_cluster_rows() {
    let scratch = tempfile::tempdir().unwrap();
    let status = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hiredis-baseline"))
        .arg(format!("OUT={}", scratch.path().display()))
        .status()
        .expect("run make");
    assert!(status.success(), "make examples/hiredis-baseline failed");
    let server = kvwasm_tests::servers::RedisServer::start();
    let password = server.password.clone().unwrap();
    let cluster = kvwasm_tests::servers::RedisCluster::start(3, Some(password.clone()));
    let nodes: Vec<String> = cluster.nodes.iter().map(ToString::to_string).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_kvwasm"))
        .args(["bench", "--remote", "--quick", "--no-progress"])
        .arg("--redis")
        .arg(server.addr.to_string())
        .arg("--redis-cluster")
        .arg(nodes.join(","))
        .arg("--hiredis")
        .arg(scratch.path().join("libkvwasm_bench_hiredis.so"))
        .env("KVWASM_BENCH_REDIS_PASSWORD", &password)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cost = ", cluster ÷ one server";
    let rows = [
        ("save 8 × 1 MiB", "hiredis (C), pipelined", "kvwasm (redis)"),
        (
            "restore with prefetch 8 × 1 MiB",
            "hiredis (C), pipelined",
            "kvwasm (redis)",
        ),
        (
            "restore with prefetch 8 × 1 MiB",
            "hiredis (C), pipelined",
            "kvwasm (redis-same-handle)",
        ),
        (
            "save 256 × 4 KiB",
            "hiredis (C), pipelined",
            "kvwasm (redis)",
        ),
        (
            "restore with prefetch 256 × 4 KiB",
            "redis crate, pipelined",
            "kvwasm (redis-same-handle)",
        ),
        (
            "save 8 × 1 MiB",
            "redis crate, cluster, pipelined per node",
            "kvwasm (redis-cluster)",
        ),
        (
            "restore with prefetch 256 × 4 KiB",
            "redis crate, cluster, pipelined per node",
            "kvwasm (redis-cluster)",
        ),
        (
            "save 256 × 4 KiB",
            "redis crate, cluster, pipelined per node",
            "kvwasm (redis-cluster-batched)",
        ),
        (
            "save 256 × 4 KiB",
            "hiredis (C), pipelined",
            "kvwasm (redis-written)",
        ),
        (
            "save 256 × 4 KiB",
            "redis crate, cluster, pipelined per node",
            "kvwasm (redis-cluster-written)",
        ),
    ];
    let has = |case: &str, native: &str, kvwasm: &str| {
        report.lines().any(|line| {
            line.starts_with(&format!("| {case} | {native} | "))
                && line.contains(&format!(" | {kvwasm} | "))
                && line.contains("× | ≤ ")
        })
    };
    for (case, native, kvwasm) in rows {
        assert!(
            has(case, native, kvwasm),
            "no row {case} / {native} / {kvwasm}:\n{report}"
        );
    }
    for (case, one, on_cluster) in [
        (
            format!("save 8 × 1 MiB{cost}"),
            "redis crate, pipelined",
            "redis crate, cluster, pipelined per node",
        ),
        (
            format!("restore with prefetch 256 × 4 KiB{cost}"),
            "kvwasm (redis)",
            "kvwasm (redis-cluster)",
        ),
        (
            format!("save 256 × 4 KiB{cost}"),
            "kvwasm (redis-batched)",
            "kvwasm (redis-cluster-batched)",
        ),
        (
            format!("save 256 × 4 KiB{cost}"),
            "kvwasm (redis-written)",
            "kvwasm (redis-cluster-written)",
        ),
    ] {
        assert!(
            report.lines().any(|line| {
                line.starts_with(&format!("| {case} | {one} | "))
                    && line.contains(&format!(" | {on_cluster} | "))
                    && line.ends_with("| — (cost of cluster mode) |")
            }),
            "no row {case} / {one} / {on_cluster}:\n{report}"
        );
    }
    // Exact puts on the cluster beside the native client that also waits
    // for each `SET NX`: what is left once the round trips are the same.
    assert!(
        report.lines().any(|line| {
            line.starts_with("| save 256 × 4 KiB | redis crate, cluster, SET NX per chunk | ")
                && line.contains(" | kvwasm (redis-cluster) | ")
                && line.ends_with("| — (like for like) |")
        }),
        "no like-for-like cluster row:\n{report}"
    );
    assert!(
        report.contains("verified byte for byte in the warm-up repetition"),
        "{report}"
    );
}
