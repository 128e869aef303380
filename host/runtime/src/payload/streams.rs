//! `payload-streams`: values moved between a guest's sockets, TLS sessions
//! or HTTP bodies and host payloads, never through linear memory.
//!
//! * `read-exact`: the guest names an input stream and a length; the host
//!   reads, waits for the stream when it runs dry, and copies each read
//!   into the payload's `malloc`'d block, which can go back to the consumer
//!   from `get-chunk` as it is.
//! * `copy`: a guest keeps the bytes of a lent payload (a `put-chunk`'s)
//!   past the call, as a host buffer ([`Payload::Shared`]) that later
//!   copies reuse ([`super::recycle`]).
//! * `write-all`: the host hands a payload to an output stream, waiting
//!   when it is full; a shared payload goes in reference-counted slices,
//!   without a copy.
//!
//! The streams are the guest's own `wasi:io` resources, used through the
//! same `InputStream`/`OutputStream` the guest's reads and writes go
//! through, so every rule on them still applies (a TLS-only socket refuses
//! plain text, see [`crate::capabilities::tls`]).

use std::time::Duration;

use bytes::Bytes;
use wasmtime::component::{Resource, ResourceTableError};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, StreamError};

use super::recycle::{self, RecycledBuffer};
use super::{MallocBuffer, Payload, SharedBuffer};
use crate::bindings::kvwasm::kv_store::payload_streams::{self, ReadError, WriteError};
use crate::state::HostState;

impl payload_streams::Host for HostState {
    async fn read_exact(
        &mut self,
        src: Resource<DynInputStream>,
        head: Vec<u8>,
        len: u64,
        timeout_ns: u64,
    ) -> wasmtime::Result<Result<Resource<Payload>, ReadError>> {
        // Everything that can refuse does so before a byte is read, so the
        // guest can still read the value itself.
        if head.len() as u64 > len {
            return Ok(Err(ReadError::Limit(format!(
                "a head of {} bytes is longer than the {len}-byte value",
                head.len()
            ))));
        }
        let (slot, size) = match self.admit(len, || MallocBuffer::alloc(0).map(Payload::Owned))? {
            Ok(admitted) => admitted,
            Err(refusal) => return Ok(Err(ReadError::Limit(refusal))),
        };
        // Abandoned at the call's deadline, this future leaves the slot and
        // the reservation behind; the lost call discards the whole store,
        // and the instance's limits with it (`sandbox::Outcome::Lost`).
        let wait = Duration::from_nanos(timeout_ns);
        let read = match tokio::time::timeout(wait, self.read_value(&src, &head, size)).await {
            Ok(read) => read,
            Err(_elapsed) => Ok(Err(ReadError::TimedOut)),
        };
        match read {
            Ok(Ok(buf)) => {
                *self.table.get_mut(&slot)? = Payload::Owned(buf);
                Ok(Ok(slot))
            }
            Ok(Err(e)) => {
                self.discard(slot, len)?;
                Ok(Err(e))
            }
            Err(trap) => {
                self.discard(slot, len)?;
                Err(trap)
            }
        }
    }

    fn copy(
        &mut self,
        data: Resource<Payload>,
    ) -> wasmtime::Result<Result<Resource<Payload>, String>> {
        // Charged for the whole buffer the copy takes (its size class).
        let len = recycle::capacity_for(self.table.get(&data)?.as_slice().len()) as u64;
        let (slot, _) = match self.admit(len, || Some(Payload::Shared(Bytes::new())))? {
            Ok(admitted) => admitted,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let Some(buf) = RecycledBuffer::copy_of(self.table.get(&data)?.as_slice()) else {
            self.discard(slot, len)?;
            return Ok(Err(format!("out of memory for {len} bytes")));
        };
        let shared = SharedBuffer {
            buf,
            _charge: self.limits.charge(len),
        };
        *self.table.get_mut(&slot)? = Payload::Shared(Bytes::from_owner(shared));
        Ok(Ok(slot))
    }

    async fn write_all(
        &mut self,
        dst: Resource<DynOutputStream>,
        data: Resource<Payload>,
        timeout_ns: u64,
    ) -> wasmtime::Result<Result<(), WriteError>> {
        let wait = Duration::from_nanos(timeout_ns);
        match tokio::time::timeout(wait, self.send_payload(&dst, &data)).await {
            Ok(sent) => sent,
            Err(_elapsed) => Ok(Err(WriteError::TimedOut)),
        }
    }
}

impl HostState {
    /// Admit a new payload of `len` bytes: within the size and total
    /// limits, charged to the instance, with a table slot holding
    /// `placeholder` until it is filled. Returns the slot and the size, or
    /// why it was refused (nothing charged then). The outer `Err` is a trap.
    fn admit(
        &mut self,
        len: u64,
        placeholder: impl FnOnce() -> Option<Payload>,
    ) -> wasmtime::Result<Result<(Resource<Payload>, usize), String>> {
        let max = self.limits.max_payload_bytes;
        let Some(size) = usize::try_from(len).ok().filter(|_| len <= max) else {
            return Ok(Err(format!(
                "{len} bytes is over the payload limit of {max} bytes"
            )));
        };
        if !self.limits.reserve_payload(len) {
            return Ok(Err(format!(
                "{len} more bytes would exceed the {max} bytes of payloads an instance may hold"
            )));
        }
        match placeholder().map(|p| self.table.push(p)) {
            Some(Ok(slot)) => Ok(Ok((slot, size))),
            Some(Err(ResourceTableError::Full)) | None => {
                self.limits.release_payload(len);
                Ok(Err(
                    "the instance holds its maximum of resources (`max_resources`)".into(),
                ))
            }
            Some(Err(e)) => Err(e.into()),
        }
    }

    /// Give back the table slot and the bytes `admit` reserved.
    fn discard(&mut self, slot: Resource<Payload>, len: u64) -> wasmtime::Result<()> {
        self.table.delete(slot)?;
        self.limits.release_payload(len);
        Ok(())
    }

    /// A buffer of `size` bytes: `head`, then what `src` brings. The outer
    /// `Err` is a trap.
    async fn read_value(
        &mut self,
        src: &Resource<DynInputStream>,
        head: &[u8],
        size: usize,
    ) -> wasmtime::Result<Result<MallocBuffer, ReadError>> {
        let Some(mut buf) = MallocBuffer::alloc(size) else {
            return Ok(Err(ReadError::Limit(format!(
                "out of memory for {size} bytes"
            ))));
        };
        buf.write_at(0, head);
        let stream = self.table.get_mut(src)?;
        Ok(fill(stream, &mut buf, head.len()).await?.map(|()| buf))
    }

    /// Write all of `data` to `dst` as fast as the stream takes it. A shared
    /// payload goes in slices of itself; another is copied a permitted
    /// write at a time. Writes are at most [`WRITE_STEP`] bytes, with a
    /// yield between them, so the call's deadline can cut a long write into
    /// a stream that takes everything at once. The outer `Err` is a trap.
    async fn send_payload(
        &mut self,
        dst: &Resource<DynOutputStream>,
        data: &Resource<Payload>,
    ) -> wasmtime::Result<Result<(), WriteError>> {
        let (shared, len) = match self.table.get(data)? {
            Payload::Shared(bytes) => (Some(bytes.clone()), bytes.len()),
            other => (None, other.as_slice().len()),
        };
        let mut sent = 0;
        while sent < len {
            let stream = self.table.get_mut(dst)?;
            let permitted = match stream.check_write() {
                Ok(0) => {
                    stream.ready().await;
                    continue;
                }
                Ok(n) => n.min(len - sent).min(WRITE_STEP),
                Err(e) => return stream_failure(e).map(Err),
            };
            let piece = match &shared {
                Some(bytes) => bytes.slice(sent..sent + permitted),
                None => Bytes::copy_from_slice(
                    &self.table.get(data)?.as_slice()[sent..sent + permitted],
                ),
            };
            if let Err(e) = self.table.get_mut(dst)?.write(piece) {
                return stream_failure(e).map(Err);
            }
            sent += permitted;
            if sent < len {
                tokio::task::yield_now().await;
            }
        }
        Ok(Ok(()))
    }
}

/// The most `write-all` hands a stream in one write.
const WRITE_STEP: usize = 1 << 20;

/// A stream's failure as the guest sees it; a trap stays a trap.
fn stream_failure(e: StreamError) -> wasmtime::Result<WriteError> {
    match e {
        StreamError::Closed => Ok(WriteError::Closed),
        StreamError::LastOperationFailed(e) => Ok(WriteError::Failed(crate::log_limit::bounded(
            format!("{e:#}"),
        ))),
        StreamError::Trap(e) => Err(e),
    }
}

/// Read `stream` into `buf` past its first `filled` bytes until it is
/// full, waiting whenever the stream has nothing. The outer `Err` is a
/// trap.
async fn fill(
    stream: &mut DynInputStream,
    buf: &mut MallocBuffer,
    mut filled: usize,
) -> wasmtime::Result<Result<(), ReadError>> {
    while filled < buf.len() {
        match stream.read(buf.len() - filled) {
            Ok(bytes) if bytes.is_empty() => stream.ready().await,
            Ok(bytes) => {
                if !buf.write_at(filled, &bytes) {
                    wasmtime::bail!("an input stream returned more bytes than asked for");
                }
                filled += bytes.len();
            }
            Err(StreamError::Closed) => return Ok(Err(ReadError::Closed)),
            Err(StreamError::LastOperationFailed(e)) => {
                return Ok(Err(ReadError::Failed(crate::log_limit::bounded(format!(
                    "{e:#}"
                )))));
            }
            Err(StreamError::Trap(e)) => return Err(e),
        }
    }
    Ok(Ok(()))
}
