//! Finding and loading libkv_store_wasm.so as a consumer would.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kv_store_abi::{Library, library_file_name};

/// The shim: see [`locate_library`].
pub fn locate_shim() -> Option<PathBuf> {
    locate_library("wasm")
}

/// `libkv_store_<scheme>.so`: in `$KV_STORE_LIBRARY_PATH` if it exists there
/// (the consumers' rule), else the copy next to this executable (a build
/// tree), else in `../lib` from it (an install prefix, `scripts/install.sh`).
pub fn locate_library(scheme: &str) -> Option<PathBuf> {
    let name = library_file_name(scheme);
    let from_env = std::env::var_os("KV_STORE_LIBRARY_PATH")
        .map(|dir| PathBuf::from(dir).join(&name))
        .filter(|p| p.is_file());
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let near_exe = exe_dir.and_then(|dir| {
        [dir.join(&name), dir.join("../lib").join(&name)]
            .into_iter()
            .find(|p| p.is_file())
    });
    from_env.or(near_exe)
}

/// Load the shim: `--lib` if given; else [`locate_shim`]; else the system
/// loader's search path.
pub fn load_shim(explicit: Option<PathBuf>) -> anyhow::Result<Library> {
    match explicit.or_else(locate_shim) {
        Some(path) => Library::open(path.as_os_str())
            .with_context(|| format!("loading {}", path.display())),
        None => Library::for_scheme("wasm").with_context(|| {
            format!(
                "{} not found: pass --lib, set KV_STORE_LIBRARY_PATH, or build it (cargo build --release)",
                library_file_name("wasm")
            )
        }),
    }
}
