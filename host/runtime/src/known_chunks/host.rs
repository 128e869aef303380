//! `known-chunks` for guests: each instance reaches the record of the
//! namespace it opened. Apart from [`KnownChunks`](super::KnownChunks),
//! which [`HostState`] holds, so that the state does not depend on this.

use crate::bindings::kvwasm::kv_store::known_chunks::Host;
use crate::state::HostState;

impl Host for HostState {
    fn contains(&mut self, hash: Vec<u8>) -> wasmtime::Result<bool> {
        let known = self.known_chunks.contains(&self.namespace, &hash);
        if known {
            self.metrics.known_chunk_hit();
        }
        Ok(known)
    }

    fn remember(&mut self, hashes: Vec<Vec<u8>>) -> wasmtime::Result<()> {
        self.known_chunks.remember(&self.namespace, &hashes);
        Ok(())
    }

    fn forget(&mut self, hashes: Vec<Vec<u8>>) -> wasmtime::Result<()> {
        self.known_chunks.forget(&self.namespace, &hashes);
        Ok(())
    }

    fn forget_all(&mut self) -> wasmtime::Result<()> {
        self.known_chunks.forget_all(&self.namespace);
        Ok(())
    }
}
