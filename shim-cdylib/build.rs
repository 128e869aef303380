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
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    let dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let order = dir.join("hot-path.order");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=KVWASM_NO_HOT_PATH_ORDER");
    let off = env::var("KVWASM_NO_HOT_PATH_ORDER").is_ok_and(|v| v != "0");
    if off || !order.exists() {
        return;
    }
    let args = [
        format!("-Wl,--symbol-ordering-file={}", order.display()),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    if linker_takes(&args) {
        for arg in args {
            println!("cargo:rustc-link-arg-cdylib={arg}");
        }
    } else {
        println!(
            "cargo:warning=the linker does not take --symbol-ordering-file: \
             libkv_store_wasm.so is linked without hot-path.order"
        );
    }
}

/// Whether an empty cdylib links with `args` added, built as this crate
/// will be: same rustc, target, RUSTFLAGS and configured linker.
fn linker_takes(args: &[String]) -> bool {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let source = out.join("probe.rs");
    if std::fs::write(&source, "").is_err() {
        return false;
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut probe = Command::new(rustc);
    probe
        .args([
            "--crate-type",
            "cdylib",
            "--crate-name",
            "kvwasm_link_probe",
        ])
        .arg("--target")
        .arg(env::var("TARGET").expect("set by cargo"))
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
    probe
        .arg(&source)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
