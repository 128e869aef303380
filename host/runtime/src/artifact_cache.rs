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
//! A directory or artifact that is not owned by this user, or that group or
//! others may write, is not used (a warning, once per process): the
//! component is compiled instead. `KVWASM_CACHE_DIR=off` disables the cache.

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

/// The file name of the artifact for `component_hash` (in the cache dir).
fn artifact_name(engine: &Engine, component_hash: &blake3::Hash) -> String {
    let mut hasher = Blake3Hasher(blake3::Hasher::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let engine_hash = hasher.0.finalize().to_hex();
    format!(
        "{}-{}.cwasm",
        &component_hash.to_hex()[..32],
        &engine_hash[..16]
    )
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
    let uncached = || Ok((Component::new(engine, bytes)?, Origin::CompiledUncached));
    let Some((dir, dir_file)) = trusted_dir() else {
        return uncached();
    };
    let name = artifact_name(engine, component_hash);
    if let Some(component) = lookup(engine, &dir, &dir_file, &name) {
        return Ok((component, Origin::Cached));
    }
    let path = dir.join(&name);
    let artifact = engine.precompile_component(bytes)?;
    if let Err(e) = store(&dir, &path, &artifact) {
        tracing::warn!(dir = %dir.display(), "cannot write the artifact cache: {e}");
        return uncached();
    }
    // SAFETY: just produced by this engine from `bytes`.
    let component = unsafe { Component::deserialize(engine, &artifact)? };
    Ok((component, Origin::Compiled))
}

/// The component for `component_hash` if its artifact is in the cache;
/// `None` otherwise. Never compiles (compiling starts wasmtime's thread
/// pool, which [`crate::prepare`] must not).
pub fn load_cached(engine: &Engine, component_hash: &blake3::Hash) -> Option<Component> {
    let (dir, dir_file) = trusted_dir()?;
    lookup(
        engine,
        &dir,
        &dir_file,
        &artifact_name(engine, component_hash),
    )
}

/// The cache directory and an open descriptor on it, if a cache is
/// configured and only this user can write it (otherwise a warning).
fn trusted_dir() -> Option<(PathBuf, std::fs::File)> {
    let dir = cache_dir()?;
    match open_dir(&dir) {
        Ok(file) => Some((dir, file)),
        Err(Untrusted::Refused(why)) => {
            refuse(&dir, &why);
            None
        }
        Err(Untrusted::Io(e)) => {
            tracing::warn!(dir = %dir.display(), "cannot use the artifact cache: {e}");
            None
        }
    }
}

/// The cached artifact `name` in `dir`, if present, trusted and loadable.
fn lookup(engine: &Engine, dir: &Path, dir_file: &std::fs::File, name: &str) -> Option<Component> {
    let path = dir.join(name);
    match open_artifact(dir_file, name) {
        Ok(Some(artifact)) => {
            // SAFETY: the artifact was written by `store` below with this
            // engine configuration (its name pins both), and the file and
            // its directory were checked (on the open descriptors) to be
            // writable by this user only. wasmtime still checks the header.
            match unsafe { Component::deserialize(engine, &artifact) } {
                Ok(component) => return Some(component),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable cached artifact: {e}")
                }
            }
        }
        Ok(None) => {}
        Err(Untrusted::Refused(why)) => refuse(&path, &why),
        Err(Untrusted::Io(e)) => {
            tracing::warn!(path = %path.display(), "ignoring unreadable cached artifact: {e}")
        }
    }
    None
}

/// Why a cache directory or artifact is not used.
enum Untrusted {
    /// Someone other than this user could have written it.
    Refused(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for Untrusted {
    fn from(e: std::io::Error) -> Untrusted {
        Untrusted::Io(e)
    }
}

/// Loading an artifact runs its machine code: refuse anything another user
/// could have written, checked on the open descriptor (no window between
/// the check and the read).
fn check_owner(meta: &std::fs::Metadata) -> Result<(), Untrusted> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(Untrusted::Refused(format!(
            "owned by uid {}, not by this user (uid {me})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Untrusted::Refused(format!(
            "mode {:o} lets other users write it",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// The cache directory, created `0700` if missing, opened and checked.
fn open_dir(dir: &Path) -> Result<std::fs::File, Untrusted> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let file = std::fs::File::open(dir)?;
    let meta = file.metadata()?;
    if !meta.is_dir() {
        return Err(Untrusted::Io(std::io::Error::other("not a directory")));
    }
    check_owner(&meta)?;
    Ok(file)
}

/// The artifact `name` in the checked directory: `None` if absent. Opened
/// beneath the directory's descriptor, never through a symlink.
fn open_artifact(dir: &std::fs::File, name: &str) -> Result<Option<Vec<u8>>, Untrusted> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd};
    let c_name = std::ffi::CString::new(name).expect("artifact names have no NUL");
    // SAFETY: a valid directory descriptor and NUL-terminated name; the
    // returned descriptor is owned by the `File` below.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c_name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::NotFound => Ok(None),
            _ => Err(e.into()),
        };
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Untrusted::Refused("not a regular file".into()));
    }
    check_owner(&meta)?;
    let mut artifact = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut artifact)?;
    Ok(Some(artifact))
}

/// Log a refused cache entry: a warning the first time in this process
/// (every component would repeat it), then at debug level.
fn refuse(path: &Path, why: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            path = %path.display(),
            "not trusting the artifact cache: {why}; compiling instead (warned once per process)"
        );
    } else {
        tracing::debug!(path = %path.display(), "artifact cache entry refused: {why}");
    }
}

/// Write atomically into the checked directory: a concurrent loader sees
/// the whole artifact or none. A refused artifact is replaced.
fn store(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
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
