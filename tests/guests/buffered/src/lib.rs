//! Test-only backend that buffers chunk puts in instance memory and writes
//! them to `/data/<hex>` only on `flush` (or `put-manifest`, which flushes
//! this instance first), like a remote backend that batches puts. It
//! declares shared state, so the host serves a handle with several instances
//! and must flush the others before a manifest. Each put sleeps 20 ms so
//! concurrent callers really do land on different instances. A `get_chunk`
//! of the hash `sleep-then-trap` sleeps 300 ms and then traps, losing the
//! instance's buffered chunks.

use std::cell::RefCell;
use std::collections::HashMap;

use kvwasm_guest_support::{
    BackendInfo, Error, Guest, GuestStore, Payload, PayloadExt, PutOutcome, Result, Store,
    export_backend, validate,
};

struct Buffered;

/// `get_chunk` of this hash sleeps 300 ms, then traps.
const TRAP_HASH: &[u8] = b"sleep-then-trap";

impl Guest for Buffered {
    type Store = BufferedStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "buffered".into(),
            version: "0".into(),
            shared_state: true,
        }
    }
}

#[derive(Default)]
struct BufferedStore {
    pending: RefCell<HashMap<String, Vec<u8>>>,
}

fn path(name: &str) -> String {
    format!("/data/{name}")
}

fn io(e: std::io::Error) -> Error {
    Error::Io(e.to_string())
}

impl GuestStore for BufferedStore {
    fn open(_namespace: String) -> Result<Store> {
        Ok(Store::new(BufferedStore::default()))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome> {
        validate::hash(&hash)?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        let key = validate::hash_hex(&hash);
        if std::fs::exists(path(&key)).map_err(io)? {
            return Ok(PutOutcome::AlreadyPresent);
        }
        let fresh = self
            .pending
            .borrow_mut()
            .insert(key, data.to_vec())
            .is_none();
        Ok(if fresh {
            PutOutcome::Stored
        } else {
            PutOutcome::AlreadyPresent
        })
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        validate::hash(&hash)?;
        if hash == TRAP_HASH {
            // A fault on command, between this instance's puts and its flush.
            std::thread::sleep(std::time::Duration::from_millis(300));
            panic!("buffered guest traps on command, with chunks still buffered");
        }
        match std::fs::read(path(&validate::hash_hex(&hash))) {
            Ok(bytes) => Ok(Payload::new(&bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound),
            Err(e) => Err(io(e)),
        }
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        validate::manifest_name(&name)?;
        self.flush()?;
        std::fs::write(path(&format!("manifest-{name}")), data.to_vec()).map_err(io)
    }

    fn get_manifest(&self, name: String) -> Result<Payload> {
        validate::manifest_name(&name)?;
        std::fs::read(path(&format!("manifest-{name}")))
            .map(|b| Payload::new(&b))
            .map_err(|_| Error::NotFound)
    }

    fn delete_manifest(&self, _name: String) -> Result<()> {
        Ok(())
    }

    fn prefetch_chunks(&self, _hashes: Vec<Vec<u8>>) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        for (key, bytes) in self.pending.borrow_mut().drain() {
            std::fs::write(path(&key), bytes).map_err(io)?;
        }
        Ok(())
    }
}

export_backend!(Buffered);
