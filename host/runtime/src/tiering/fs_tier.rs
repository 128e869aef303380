//! Listing and removing chunks of a `builtin:fs` tier, done by the host.
//!
//! The kv-store WIT has no chunk delete or listing. Rather than widen every
//! guest's contract, a tier above the last must be `builtin:fs`, whose
//! on-disk layout is llama.cpp's and fixed (`kvwasm_fs_layout`, which the
//! guest writes by):
//! `<dir>/<namespace components>/chunks/<first hex digit>/<hex of hash>`,
//! with a namespace component that folds to `chunks` stored as
//! `..<component>`. The host owns that directory grant anyway; it only
//! lists and unlinks whole chunk files there (never a temporary file, whose
//! name is not hex), and the guest keeps writing chunks by rename, so a
//! chunk file is always whole.

use std::path::{Path, PathBuf};

use kvwasm_fs_layout::{CHUNKS_DIR, FANOUT_DIRS, chunk_path, hash_of_chunk_name, namespace_dir};

use crate::backend::Backend;
use crate::capabilities::DATA_DIR;

/// The chunk directory of one namespace of a `builtin:fs` tier.
#[derive(Debug, Clone)]
pub(crate) struct FsTier {
    chunks: PathBuf,
}

impl FsTier {
    /// The chunk directory of `namespace` on `backend` (its `/data` grant).
    pub(crate) fn new(backend: &Backend, namespace: &str) -> Result<FsTier, String> {
        let grant = backend
            .grants
            .dirs
            .iter()
            .find(|d| d.guest == DATA_DIR && !d.read_only)
            .ok_or_else(|| {
                format!(
                    "tier {:?} has no writable directory granted at {DATA_DIR}",
                    backend.name
                )
            })?;
        let mut chunks = grant.host.clone();
        for part in namespace.split('/').filter(|p| !p.is_empty()) {
            chunks.push(&*namespace_dir(part));
        }
        chunks.push(CHUNKS_DIR);
        Ok(FsTier { chunks })
    }

    fn path(&self, hash: &[u8]) -> PathBuf {
        self.chunks.join(chunk_path(hash))
    }

    /// Remove the chunk's file (a missing one is success: already gone).
    pub(crate) fn delete(&self, hash: &[u8]) -> Result<(), String> {
        match std::fs::remove_file(self.path(hash)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove a chunk: {e}")),
        }
    }

    /// Whether the chunk's file is there (whole: the guest writes by rename).
    pub(crate) fn holds(&self, hash: &[u8]) -> bool {
        std::fs::symlink_metadata(self.path(hash)).is_ok_and(|m| m.is_file())
    }

    /// Every chunk stored, with its length: what a restart rebuilds the
    /// index from. Files whose names are not a whole hash are skipped.
    pub(crate) fn list(&self) -> Result<Vec<(Vec<u8>, u64)>, String> {
        let mut out = Vec::new();
        for fanout in FANOUT_DIRS {
            let dir = self.chunks.join(fanout);
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
            };
            for entry in entries {
                let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
                let Some(hash) = entry.file_name().to_str().and_then(hash_of_chunk_name) else {
                    continue;
                };
                match entry.metadata() {
                    Ok(meta) if meta.is_file() => out.push((hash, meta.len())),
                    // Removed since the listing began, or not a chunk.
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// The directory listed, for messages.
    pub(crate) fn dir(&self) -> &Path {
        &self.chunks
    }
}
