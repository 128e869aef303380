//! kvwasm-vendor-starter: a kv_store_v1 backend as a WebAssembly component.
//!
//! This store keeps everything in plain files through `std::fs`, in the
//! directory the operator grants it (seen at `/data`):
//!
//! ```text
//! /data/chunks/<hex of hash>            chunks of the empty namespace
//! /data/manifests/<name>                its manifests
//! /data/ns/<a>/ns/<b>/chunks/...        namespace `a/b`
//! ```
//!
//! Each namespace component is a directory under `ns/`, so no namespace can
//! name another one's `chunks` or `manifests`. Replace the bodies with calls
//! to your own storage; keep the rules in the comments: they are what
//! `wit/kv-store.wit` requires of every backend, and what `kvwasm check`
//! tests.

use std::hash::{BuildHasher, RandomState};
use std::io::Write;
use std::path::{Path, PathBuf};

wit_bindgen::generate!({
    path: "wit",
    world: "kvwasm:kv-store/backend",
});

use exports::kvwasm::kv_store::store::{BackendInfo, Guest, GuestStore, PutOutcome, Store};
use kvwasm::kv_store::types::{Error, Payload};

struct Backend;

impl Guest for Backend {
    type Store = FileStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "kvwasm-vendor-starter".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // Data lives in files, so several instances may serve one handle.
            shared_state: true,
        }
    }
}

struct FileStore {
    root: PathBuf,
}

impl GuestStore for FileStore {
    fn open(namespace: String) -> Result<Store, Error> {
        // The namespace comes from the consumer's URI: never trust it. Each
        // component is a directory under `ns/`, so no namespace can name
        // another one's `chunks` or `manifests` directory; an empty
        // component (`a//b`, `/a`) or an unsafe one is refused, never merged
        // with another namespace.
        let mut root = PathBuf::from("/data");
        if !namespace.is_empty() {
            for part in namespace.split('/') {
                check_name(part)?;
                root.push("ns");
                root.push(part);
            }
        }
        std::fs::create_dir_all(root.join("chunks")).map_err(io)?;
        std::fs::create_dir_all(root.join("manifests")).map_err(io)?;
        std::fs::create_dir_all(root.join("tmp")).map_err(io)?;
        Ok(Store::new(FileStore { root }))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome, Error> {
        let path = self.chunk_path(&hash)?;
        if path.exists() {
            // Idempotent: an existing hash writes nothing and reports a hit.
            return Ok(PutOutcome::AlreadyPresent);
        }
        self.write_atomically(&path, &data.read(0, data.len()))?;
        Ok(PutOutcome::Stored)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload, Error> {
        read(&self.chunk_path(&hash)?)
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<(), Error> {
        // Chunks are written through in put_chunk, so they are already
        // visible; a buffering backend would flush them here first.
        self.write_atomically(&self.manifest_path(&name)?, &data.read(0, data.len()))
    }

    fn get_manifest(&self, name: String) -> Result<Payload, Error> {
        read(&self.manifest_path(&name)?)
    }

    fn delete_manifest(&self, name: String) -> Result<(), Error> {
        match std::fs::remove_file(self.manifest_path(&name)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()), // a missing manifest is success
        }
    }

    fn prefetch_chunks(&self, _hashes: Vec<Vec<u8>>) -> Result<(), Error> {
        Ok(()) // a hint: a remote backend would batch-fetch here
    }

    fn flush(&self) -> Result<(), Error> {
        Ok(()) // nothing is buffered
    }
}

impl FileStore {
    fn chunk_path(&self, hash: &[u8]) -> Result<PathBuf, Error> {
        if hash.is_empty() || hash.len() > 64 {
            return Err(Error::InvalidArgument(format!(
                "hash of {} bytes",
                hash.len()
            )));
        }
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        Ok(self.root.join("chunks").join(hex))
    }

    /// Write to a new temporary file, then rename: readers see all or
    /// nothing, and concurrent writers never share a temporary file.
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), Error> {
        let unique = RandomState::new().hash_one(std::time::SystemTime::now());
        let tmp = self.root.join("tmp").join(format!("{unique:016x}"));
        let mut file = std::fs::File::create_new(&tmp).map_err(io)?;
        let written = file.write_all(bytes).and_then(|()| file.sync_data());
        match written.and_then(|()| std::fs::rename(&tmp, path)) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(io(e))
            }
        }
    }

    fn manifest_path(&self, name: &str) -> Result<PathBuf, Error> {
        check_name(name)?;
        Ok(self.root.join("manifests").join(name))
    }
}

/// Manifest names and namespace components must be one safe path component.
fn check_name(name: &str) -> Result<(), Error> {
    let bad = name.is_empty()
        || name.len() > 255
        || name == "."
        || name.contains("..")
        || name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(Error::InvalidArgument(format!("unsafe name {name:?}")));
    }
    Ok(())
}

fn read(path: &Path) -> Result<Payload, Error> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Payload::new(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound),
        Err(e) => Err(io(e)),
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Io(e.to_string())
}

export!(Backend);
