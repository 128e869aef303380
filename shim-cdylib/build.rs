//! Link the functions a call runs together at the start of the library's
//! code, in the order of `hot-path.order` (made by
//! `scripts/hot-path-order.sh`). A call that finds the core's caches cold,
//! as after a consumer's large copy, then touches fewer code pages and cache
//! lines (docs/benchmarks.md, "A call with cold caches").
//!
//! lld's `--symbol-ordering-file` is passed only if a probe shows that this
//! build's linker takes it: an empty cdylib is linked first with the same
//! rustc, target, flags and linker. GNU ld and gold do not know the option;
//! rustc links with its own lld on x86_64 Linux, but not every rustc build
//! does. `KVWASM_NO_HOT_PATH_ORDER=1` turns it off.
//!
//! The list names mangled symbols, whose hashes change with the toolchain,
//! `Cargo.lock` and features. Names the build does not have are skipped, so
//! a stale list never breaks the build but can lose all of its effect:
//! `scripts/hot-path-order.sh --check` says how much of it still applies.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() {
    let dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let order = dir.join("hot-path.order");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=KVWASM_NO_HOT_PATH_ORDER");
    // The probe's answer holds for one linker: run again when the one set
    // through the environment changes. (RUSTFLAGS and the toolchain are part
    // of cargo's own fingerprint; after changing `linker` in a cargo config
    // file, `cargo clean -p kvwasm-shim`.)
    let target = env::var("TARGET").expect("set by cargo");
    let linker_var = format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_uppercase().replace('-', "_")
    );
    println!("cargo:rerun-if-env-changed={linker_var}");
    let workspace = dir.parent().expect("the shim is in the workspace");
    let off = env::var("KVWASM_NO_HOT_PATH_ORDER").is_ok_and(|v| v != "0");
    if off || !order.exists() {
        return;
    }
    let args = [
        format!("-Wl,--symbol-ordering-file={}", order.display()),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    match linker_takes(workspace, &target, &args) {
        Ok(()) => {
            for arg in args {
                println!("cargo:rustc-link-arg-cdylib={arg}");
            }
        }
        Err(why) => println!(
            "cargo:warning=libkv_store_wasm.so is linked without hot-path.order: \
             an empty library did not link with --symbol-ordering-file ({why})"
        ),
    }
}

/// Whether an empty cdylib links with `args` added, built as this crate
/// will be: same rustc, target, RUSTFLAGS and configured linker, run from
/// the workspace root (as cargo runs rustc: relative paths in flags hold).
/// The error is the first line of what failed.
fn linker_takes(workspace: &Path, target: &str, args: &[String]) -> Result<(), String> {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let source = out.join("probe.rs");
    std::fs::write(&source, "").map_err(|e| e.to_string())?;
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut probe = Command::new(rustc);
    probe
        .current_dir(workspace)
        .args([
            "--crate-type",
            "cdylib",
            "--crate-name",
            "kvwasm_link_probe",
        ])
        .args(["--cap-lints", "allow", "--target", target])
        .arg("--out-dir")
        .arg(&out);
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        let mut arg = OsString::from("linker=");
        arg.push(linker);
        probe.arg("-C").arg(arg);
    }
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        probe.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    for arg in args {
        probe.arg("-C").arg(format!("link-arg={arg}"));
    }
    let output = probe
        .arg(&source)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first = stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message");
    Err(first.chars().take(200).collect())
}
