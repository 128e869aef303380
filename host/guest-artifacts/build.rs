//! Builds every guest backend for `wasm32-wasip2` with a nested `cargo build`
//! (as wasmtime's test-programs-artifacts does), so `cargo build` and
//! `cargo test` need nothing beyond `rustup target add wasm32-wasip2`.
//!
//! Guests are always built optimised, into `target/wasm-guests` (shared by
//! every host profile, and separate from the outer build's lock).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (package, name of the generated constant): packages of the guest
/// workspace.
const BACKENDS: &[(&str, &str)] = &[
    ("kvwasm-guest-fs", "FS"),
    ("kvwasm-guest-memory", "MEMORY"),
    ("kvwasm-guest-redis", "REDIS"),
    ("kvwasm-guest-s3", "S3"),
    ("kvwasm-fabric-synthetic", "SYNTHETIC"),
    ("kvwasm-fabric-tcp", "TCP"),
    ("kvwasm-kv-indexer", "KV_INDEXER"),
    ("kvwasm-advisor", "ADVISOR"),
];
/// The test-only guests (tests/guests/), built by every build and not only
/// for tests: then `cargo build` and `cargo test` resolve the same features,
/// and the tests reuse this crate and every crate above it instead of
/// rebuilding them. Only tests name them, so no program embeds them (the
/// linker drops unreferenced statics; tests/tests/shim_contents.rs).
const TEST_GUESTS: &[(&str, &str)] = &[
    ("kvwasm-guest-hostile", "HOSTILE"),
    ("kvwasm-fabric-hostile", "HOSTILE_FABRIC"),
    ("kvwasm-guest-buffered", "BUFFERED"),
    ("kvwasm-guest-namespace-blind", "NAMESPACE_BLIND"),
    ("kvwasm-advisor-hostile", "HOSTILE_ADVISOR"),
    ("kvwasm-subscriber-hostile", "HOSTILE_SUBSCRIBER"),
];

/// The vendor starter is a project of its own, as `kvwasm new` writes it
/// (its own workspace and Cargo.lock): built by itself, under this name.
const VENDOR_STARTER: (&str, &str) = ("kvwasm-vendor-starter", "VENDOR_STARTER");

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let guests_workspace = workspace.join("guest-backends");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());

    let mut guests = [BACKENDS, TEST_GUESTS].concat();

    for dir in [
        "wit",
        "guest-backends",
        "tests/guests",
        "examples/vendor-starter",
    ] {
        watch_sources(&workspace.join(dir));
    }

    let target_dir = guest_target_dir(&out_dir, &workspace);
    let mut cmd = guest_cargo(&guests_workspace, &target_dir);
    for (package, _) in &guests {
        cmd.args(["-p", package]);
    }
    run(cmd);
    let mut starter = guest_cargo(&workspace.join("examples/vendor-starter"), &target_dir);
    starter.args(["-p", VENDOR_STARTER.0]);
    run(starter);
    guests.push(VENDOR_STARTER);

    let mut consts = String::new();
    for (package, konst) in &guests {
        let file = format!("{}.wasm", package.replace('-', "_"));
        let built = target_dir.join("wasm32-wasip2/release").join(&file);
        let embedded = out_dir.join(&file);
        std::fs::copy(&built, &embedded)
            .unwrap_or_else(|e| panic!("missing guest {}: {e}", built.display()));
        consts.push_str(&format!(
            "/// The `{package}` component.\n\
             pub static {konst}: &[u8] = include_bytes!({embedded:?});\n\
             /// Path of the `{package}` component file.\n\
             pub const {konst}_PATH: &str = {embedded:?};\n",
        ));
    }
    std::fs::write(out_dir.join("guests.rs"), consts).unwrap();
}

/// `cargo build` of the wasm32-wasip2 guests of the Cargo project in `dir`.
/// Rebuild the guests when anything under `dir` changes, except build
/// output: a directory's mtime is the newest of everything beneath it, and
/// `cargo test` or `cargo clippy` run inside `guest-backends` (as CI does
/// between the host's build and its tests) writes `guest-backends/target`.
/// Watching that would rebuild the guests and every host crate embedding
/// them. A crate added later changes its workspace's `Cargo.toml`, watched
/// here, so the next build sees it.
fn watch_sources(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        println!("cargo:rerun-if-changed={}", dir.display());
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name() == "target" {
            continue;
        }
        println!("cargo:rerun-if-changed={}", entry.path().display());
    }
}

fn guest_cargo(dir: &Path, target_dir: &Path) -> Command {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--locked",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        // Small, fast components: no debuginfo, whole-program optimisation.
        .args(["--config", "profile.release.debug=false"])
        .args(["--config", "profile.release.strip=true"])
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        // Wasm SIMD (on by default in wasmtime, and compiled natively on
        // x86-64 and aarch64, the hosts kvwasm is built for): LLVM
        // vectorises the guests' copies and scans; `/query` through the KV
        // indexer took ~7% less time (docs/benchmarks.md).
        .args([
            "--config",
            "target.wasm32-wasip2.rustflags=[\"-Ctarget-feature=+simd128\"]",
        ]);
    // The outer build's flags are for the host, not for wasm.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn run(mut cmd: Command) {
    let status = cmd
        .status()
        .expect("failed to run cargo for the wasm guests");
    assert!(
        status.success(),
        "building the wasm32-wasip2 guests failed (cargo output above); if the target is \
         missing: rustup target add wasm32-wasip2"
    );
}

/// `<target>/wasm-guests`, where `<target>` is the outer build's target dir
/// (OUT_DIR is `<target>/<profile>/build/<pkg>-<hash>/out`, or one level
/// deeper when cross-compiling).
fn guest_target_dir(out_dir: &Path, workspace: &Path) -> PathBuf {
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            out_dir
                .ancestors()
                .find(|p| p.join("CACHEDIR.TAG").exists())
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| workspace.join("target"));
    target.join("wasm-guests")
}
