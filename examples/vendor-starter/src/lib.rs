//! A kv_store_v1 backend as a WebAssembly component: the vendor starter.
//!
//! Build: `cargo build --release --target wasm32-wasip2`, then name the
//! `.wasm` in a kvwasm config file:
//!
//! ```toml
//! [backends.acme]
//! component = "target/wasm32-wasip2/release/kvwasm_vendor_starter.wasm"
//! dir = "/srv/acme"          # the directory this backend may use, seen at /data
//! ```
//!
//! and open `wasm://acme/<namespace>`. This template keeps everything in
//! plain files through `std::fs`, the simplest way to start. Replace the
//! bodies with calls to your own storage. Keep the rules in the comments:
//! they are what `wit/kv-store.wit` requires of every backend.

use std::io::Write;
use std::path::PathBuf;

wit_bindgen::generate!({
    path: "../../wit",
    world: "kvwasm:kv-store/backend",
});

use exports::kvwasm::kv_store::store::{BackendInfo, Guest, GuestStore, PutOutcome, Store};
use kvwasm::kv_store::types::{Error, Payload};

struct Starter;

impl Guest for Starter {
    type Store = StarterStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "vendor-starter".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // Data lives in files, so several instances may serve one handle.
            shared_state: true,
        }
    }
}

struct StarterStore {
    root: PathBuf,
}

impl GuestStore for StarterStore {
    fn open(namespace: String) -> Result<Store, Error> {
        // The namespace comes from the consumer's URI: never trust it.
        let mut root = PathBuf::from("/data");
        for part in namespace.split('/').filter(|p| !p.is_empty()) {
            check_name(part)?;
            root.push(part);
        }
        std::fs::create_dir_all(root.join("chunks")).map_err(io)?;
        Ok(Store::new(StarterStore { root }))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome, Error> {
        let path = self.chunk_path(&hash)?;
        if path.exists() {
            // Idempotent: an existing hash writes nothing and reports a hit.
            return Ok(PutOutcome::AlreadyPresent);
        }
        write_atomically(&path, &data.read(0, data.len()))?;
        Ok(PutOutcome::Stored)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload, Error> {
        read(&self.chunk_path(&hash)?)
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<(), Error> {
        check_name(&name)?;
        // Chunks are written through in put_chunk, so they are already
        // visible; a buffering backend would flush them here first.
        write_atomically(&self.root.join(&name), &data.read(0, data.len()))
    }

    fn get_manifest(&self, name: String) -> Result<Payload, Error> {
        check_name(&name)?;
        read(&self.root.join(&name))
    }

    fn delete_manifest(&self, name: String) -> Result<(), Error> {
        check_name(&name)?;
        match std::fs::remove_file(self.root.join(&name)) {
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

impl StarterStore {
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
}

/// Manifest names must be one safe path component.
fn check_name(name: &str) -> Result<(), Error> {
    let bad = name.is_empty()
        || name.len() > 255
        || name.contains("..")
        || name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(Error::InvalidArgument(format!("unsafe name {name:?}")));
    }
    Ok(())
}

/// Write to a temporary file, then rename: readers see all or nothing.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), Error> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_data().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

fn read(path: &std::path::Path) -> Result<Payload, Error> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Payload::new(&bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound),
        Err(e) => Err(io(e)),
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Io(e.to_string())
}

export!(Starter);
