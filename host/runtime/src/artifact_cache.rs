//! On-disk cache of precompiled components.
//!
//! Compiling a component with Cranelift takes ~0.2 s; loading a precompiled
//! artifact with `mmap` takes well under a millisecond. Artifacts are keyed
//! by the BLAKE3 hash of the component bytes and of the engine's
//! compatibility hash (wasmtime version, target, every codegen setting), so
//! a changed component or engine never loads a stale artifact.
//!
//! Location: `$KVWASM_CACHE_DIR`, else `$XDG_CACHE_HOME/kvwasm`, else
//! `$HOME/.cache/kvwasm`. The directory is created with mode 0700: loading
//! an artifact executes its machine code, so only its owner may write it.
//! `KVWASM_CACHE_DIR=off` disables the cache.

use std::hash::Hash;
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// The cache directory, or `None` when disabled or no home is known.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("KVWASM_CACHE_DIR") {
        Some(dir) if dir == "off" => None,
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("kvwasm")),
    }
}

/// Where the artifact for `component_hash` lives under `dir`.
fn artifact_path(engine: &Engine, dir: &Path, component_hash: &blake3::Hash) -> PathBuf {
    let mut hasher = Blake3Hasher(blake3::Hasher::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let engine_hash = hasher.0.finalize().to_hex();
    dir.join(format!(
        "{}-{}.cwasm",
        &component_hash.to_hex()[..32],
        &engine_hash[..16]
    ))
}

/// How a component was obtained, for logs and `kvwasm compile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Loaded from the on-disk cache.
    Cached,
    /// Compiled now and written to the cache.
    Compiled,
    /// Compiled now; no cache is configured or it is not writable.
    CompiledUncached,
}

/// Load `bytes` as a component for `engine`, from the cache when possible.
pub fn load(
    engine: &Engine,
    bytes: &[u8],
    component_hash: &blake3::Hash,
) -> wasmtime::Result<(Component, Origin)> {
    let Some(dir) = cache_dir() else {
        return Ok((Component::new(engine, bytes)?, Origin::CompiledUncached));
    };
    let path = artifact_path(engine, &dir, component_hash);
    if path.is_file() {
        // SAFETY: artifacts in the cache were produced by `store` below with
        // this engine configuration (the file name pins both), in a directory
        // only this user can write. wasmtime still checks the header.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok((component, Origin::Cached)),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring unusable cached artifact: {e}")
            }
        }
    }
    let artifact = engine.precompile_component(bytes)?;
    if let Err(e) = store(&dir, &path, &artifact) {
        tracing::warn!(dir = %dir.display(), "cannot write the artifact cache: {e}");
        return Ok((Component::new(engine, bytes)?, Origin::CompiledUncached));
    }
    // SAFETY: just produced by this engine from `bytes`.
    let component = unsafe { Component::deserialize(engine, &artifact)? };
    Ok((component, Origin::Compiled))
}

/// Write atomically: a concurrent loader sees the whole artifact or none.
fn store(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // NamedTempFile is created with mode 0600.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(artifact)?;
    tmp.as_file().sync_data()?;
    tmp.persist(path).map(drop).map_err(|e| e.error)
}

/// Feeds `Hash` impls into BLAKE3 (std's hashers are not stable).
struct Blake3Hasher(blake3::Hasher);

impl std::hash::Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        unreachable!("only the full digest is used")
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
