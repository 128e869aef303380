//! {{name}}: a kv_store_v1 backend as a WebAssembly component.
//!
//! This store keeps chunks and manifests in the memory of the instance that
//! serves a namespace (`shared_state: false`): the host gives every
//! namespace its own instance and shares it among the handles open on it.
//! The data is gone when the last handle closes. Replace the bodies with
//! calls to your own storage; keep the rules in the comments: they are what
//! `wit/kv-store.wit` requires of every backend, and what `kvwasm check`
//! tests.

use std::cell::RefCell;
use std::collections::HashMap;

wit_bindgen::generate!({
    path: "wit",
    world: "kvwasm:kv-store/backend",
});

use exports::kvwasm::kv_store::store::{BackendInfo, Guest, GuestStore, PutOutcome, Store};
use kvwasm::kv_store::types::{Error, Payload};

struct Backend;

impl Guest for Backend {
    type Store = MemoryStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "{{name}}".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // The data lives in this instance: one instance per namespace.
            // A backend whose data lives in files or a server says true.
            shared_state: false,
        }
    }
}

#[derive(Default)]
struct MemoryStore {
    chunks: RefCell<HashMap<Vec<u8>, Vec<u8>>>,
    manifests: RefCell<HashMap<String, Vec<u8>>>,
}

impl GuestStore for MemoryStore {
    fn open(namespace: String) -> Result<Store, Error> {
        // The namespace comes from the consumer's URI: never trust it.
        // Namespaces are separate stores; refuse one you cannot keep apart.
        if !namespace.is_empty() {
            for part in namespace.split('/') {
                check_name(part)?;
            }
        }
        Ok(Store::new(MemoryStore::default()))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome, Error> {
        check_hash(&hash)?;
        let mut chunks = self.chunks.borrow_mut();
        if chunks.contains_key(&hash) {
            // Idempotent: an existing hash writes nothing and reports a hit.
            return Ok(PutOutcome::AlreadyPresent);
        }
        chunks.insert(hash, data.read(0, data.len()));
        Ok(PutOutcome::Stored)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload, Error> {
        check_hash(&hash)?;
        let chunks = self.chunks.borrow();
        let bytes = chunks.get(&hash).ok_or(Error::NotFound)?;
        Ok(Payload::new(bytes))
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<(), Error> {
        check_name(&name)?;
        // Chunks are stored in put_chunk, so they are already visible; a
        // buffering backend would flush them here first.
        let bytes = data.read(0, data.len());
        self.manifests.borrow_mut().insert(name, bytes);
        Ok(())
    }

    fn get_manifest(&self, name: String) -> Result<Payload, Error> {
        check_name(&name)?;
        let manifests = self.manifests.borrow();
        let bytes = manifests.get(&name).ok_or(Error::NotFound)?;
        Ok(Payload::new(bytes))
    }

    fn delete_manifest(&self, name: String) -> Result<(), Error> {
        check_name(&name)?;
        self.manifests.borrow_mut().remove(&name); // a missing name is success
        Ok(())
    }

    fn prefetch_chunks(&self, _hashes: Vec<Vec<u8>>) -> Result<(), Error> {
        Ok(()) // a hint: a remote backend would batch-fetch here
    }

    fn flush(&self) -> Result<(), Error> {
        Ok(()) // nothing is buffered
    }
}

/// Hashes are 1 to 64 bytes.
fn check_hash(hash: &[u8]) -> Result<(), Error> {
    if hash.is_empty() || hash.len() > 64 {
        return Err(Error::InvalidArgument(format!(
            "hash of {} bytes",
            hash.len()
        )));
    }
    Ok(())
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

export!(Backend);
