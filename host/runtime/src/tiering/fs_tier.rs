//! Listing and removing chunks of a `builtin:fs` tier, done by the host.
//!
//! The kv-store WIT has no chunk delete or listing. Rather than widen every
//! guest's contract, a tier above the last must be `builtin:fs`, whose
//! on-disk layout is llama.cpp's and fixed (guest-backends/fs):
//! `<dir>/<namespace components>/chunks/<first hex digit>/<hex of hash>`,
//! with a namespace component that folds to `chunks` stored as
//! `..<component>`. The host owns that directory grant anyway; it only
//! lists and unlinks whole chunk files there (never a temporary file, whose
//! name is not hex), and the guest keeps writing chunks by rename, so a
//! chunk file is always whole.

use std::path::{Path, PathBuf};

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
            chunks.push(namespace_dir(part));
        }
        chunks.push("chunks");
        Ok(FsTier { chunks })
    }

    fn path(&self, hash: &[u8]) -> PathBuf {
        let name = hex::encode(hash);
        self.chunks.join(&name[..1]).join(name)
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
        for slot in 0..16u8 {
            let dir = self.chunks.join(format!("{slot:x}"));
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
            };
            for entry in entries {
                let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
                let Some(hash) = entry.file_name().to_str().and_then(unhex) else {
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

/// As the fs guest's `namespace_dir`: a component that could name a chunk
/// store is escaped with a `..` prefix.
fn namespace_dir(part: &str) -> String {
    let folded = part
        .trim_end_matches(['.', ' '])
        .to_uppercase()
        .to_lowercase();
    if folded == "chunks" {
        format!("..{part}")
    } else {
        part.to_owned()
    }
}

/// A chunk file name back to its hash: lowercase hex of 1 to 64 bytes,
/// exactly as the guest names it.
fn unhex(name: &str) -> Option<Vec<u8>> {
    let hash = hex::decode(name).ok()?;
    (!hash.is_empty() && hash.len() <= 64 && hex::encode(&hash) == name).then_some(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip_and_temporaries_are_skipped() {
        let hash = vec![0x0a, 0xff, 0x00, 0x7c];
        assert_eq!(unhex(&hex::encode(&hash)), Some(hash));
        for name in [".kvwasm-tmp-1-2", "ABCD", "abc", "", "zz"] {
            assert_eq!(unhex(name), None, "{name}");
        }
        assert_eq!(namespace_dir("Chunks."), "..Chunks.");
        assert_eq!(namespace_dir("alice"), "alice");
    }
}
