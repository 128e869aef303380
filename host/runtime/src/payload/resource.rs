//! Payloads in an instance's resource table: the consumer's bytes lent to
//! a guest for one call, a guest's answer taken back out, and the
//! `payload` resource's methods (`kvwasm:kv-store/types`). Kept apart from
//! the [`Payload`] type, which the bindings name, so that the bindings do
//! not depend on [`HostState`].

use wasmtime::component::Resource;

use super::{LentBytes, MallocBuffer, Payload, Taken};
use crate::bindings::kvwasm::kv_store::types;
use crate::state::HostState;

/// Put `bytes` into the table as a payload for the duration of `call`, then
/// remove it, whatever `call` returned.
///
/// If the call's future is abandoned at its deadline, the entry stays in
/// the table, but the caller discards the whole store before it returns to
/// the consumer, so the pointer never outlives the consumer's buffer.
pub(crate) async fn lend<T>(
    state: &mut wasmtime::Store<HostState>,
    bytes: &[u8],
    call: impl AsyncFnOnce(&mut wasmtime::Store<HostState>, Resource<Payload>) -> T,
) -> wasmtime::Result<T> {
    let lent = Payload::Lent(LentBytes {
        ptr: bytes.as_ptr(),
        len: bytes.len(),
    });
    let res = state.data_mut().table.push(lent)?;
    let out = call(state, Resource::new_borrow(res.rep())).await;
    // The guest only ever saw a borrow, so the entry is still ours to delete
    // (unless the instance trapped, in which case the whole store is dropped).
    let _ = state.data_mut().table.delete(res);
    Ok(out)
}

/// Take a payload a guest returned out of the table.
pub(crate) fn take(
    state: &mut wasmtime::Store<HostState>,
    res: Resource<Payload>,
) -> wasmtime::Result<Taken> {
    match state.data_mut().table.delete(res)? {
        Payload::Owned(buf) => {
            state.data_mut().limits.release_payload(buf.len() as u64);
            Ok(Taken::Block(buf))
        }
        // A staged value read back before its flush: the consumer needs a
        // block of its own to `free`. (The shared one's charge goes with its
        // last reference.)
        Payload::Shared(bytes) => MallocBuffer::copy_from(&bytes)
            .map(Taken::Block)
            .ok_or_else(|| wasmtime::format_err!("out of memory for a payload")),
        // Guests only ever hold borrows of lent payloads and cannot return
        // them; reaching this means a host bug, not a guest one.
        Payload::Lent(_) => wasmtime::bail!("a lent payload was returned"),
        // A chunk read into the caller's buffer (revoked: a payload kept
        // from an earlier call, whose bytes are gone).
        Payload::Target(lease) => lease
            .into_target()
            .map(Taken::InTarget)
            .ok_or_else(|| wasmtime::format_err!("a payload read in an earlier call was returned")),
    }
}

impl types::Host for HostState {}

impl types::HostPayload for HostState {
    fn new(&mut self, bytes: Vec<u8>) -> wasmtime::Result<Resource<Payload>> {
        if !self.limits.reserve_payload(bytes.len() as u64) {
            wasmtime::bail!(
                "payload limit: a new payload of {} bytes would exceed the {} bytes of \
                 payloads an instance may hold at once",
                bytes.len(),
                self.limits.max_payload_bytes
            );
        }
        let buf = MallocBuffer::copy_from(&bytes)
            .ok_or_else(|| wasmtime::format_err!("out of memory for a payload"))?;
        Ok(self.table.push(Payload::Owned(buf))?)
    }

    fn len(&mut self, payload: Resource<Payload>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&payload)?.as_slice().len() as u64)
    }

    fn read(
        &mut self,
        payload: Resource<Payload>,
        offset: u64,
        len: u64,
    ) -> wasmtime::Result<Vec<u8>> {
        let bytes = self.table.get(&payload)?.as_slice();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let end = start
            .saturating_add(usize::try_from(len).unwrap_or(usize::MAX))
            .min(bytes.len());
        Ok(bytes[start..end].to_vec())
    }

    fn drop(&mut self, payload: Resource<Payload>) -> wasmtime::Result<()> {
        match self.table.delete(payload)? {
            Payload::Owned(buf) => self.limits.release_payload(buf.len() as u64),
            // Released by its buffer, when no stream holds a slice of it;
            // a target is the caller's memory, never charged.
            Payload::Shared(_) | Payload::Lent(_) | Payload::Target(_) => {}
        }
        Ok(())
    }
}
