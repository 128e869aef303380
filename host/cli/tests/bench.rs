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
