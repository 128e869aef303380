//! In-memory backend: the maps live in the one instance serving a
//! namespace (`shared-state: false`); the host shares that instance among
//! the handles open on the same backend and namespace, and the data is gone
//! when the last of them closes. For tests and development; bounded by the
//! guest's memory limit.

use std::cell::RefCell;
use std::collections::HashMap;

use kvwasm_guest_support::{
    BackendInfo, Error, Guest, GuestStore, Payload, PayloadExt, PutOutcome, Result, Store,
    export_backend, validate,
};

struct MemoryBackend;

impl Guest for MemoryBackend {
    type Store = MemoryStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "memory".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // The data lives in this instance: one instance per handle.
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
    fn open(namespace: String) -> Result<Store> {
        validate::namespace(&namespace)?;
        Ok(Store::new(MemoryStore::default()))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome> {
        validate::hash(&hash)?;
        let mut chunks = self.chunks.borrow_mut();
        if chunks.contains_key(&hash) {
            return Ok(PutOutcome::AlreadyPresent);
        }
        chunks.insert(hash, data.to_vec());
        Ok(PutOutcome::Stored)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        validate::hash(&hash)?;
        let chunks = self.chunks.borrow();
        chunks
            .get(&hash)
            .map(|b| Payload::new(b))
            .ok_or(Error::NotFound)
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        validate::manifest_name(&name)?;
        self.manifests.borrow_mut().insert(name, data.to_vec());
        Ok(())
    }

    fn get_manifest(&self, name: String) -> Result<Payload> {
        validate::manifest_name(&name)?;
        let manifests = self.manifests.borrow();
        manifests
            .get(&name)
            .map(|b| Payload::new(b))
            .ok_or(Error::NotFound)
    }

    fn delete_manifest(&self, name: String) -> Result<()> {
        validate::manifest_name(&name)?;
        self.manifests.borrow_mut().remove(&name);
        Ok(())
    }

    fn prefetch_chunks(&self, hashes: Vec<Vec<u8>>) -> Result<()> {
        hashes.iter().try_for_each(|h| validate::hash(h))
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

export_backend!(MemoryBackend);
