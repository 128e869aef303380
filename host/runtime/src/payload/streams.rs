//! `payload-streams`: a value arriving on a guest's socket, TLS session or
//! HTTP response body, read straight into a host payload. The guest names
//! the stream and the length; the host reads, waits for the stream when it
//! runs dry, and copies each read into the payload's `malloc`'d block. No
//! byte lands in linear memory, and the payload can go back to the
//! consumer from `get-chunk` as it is.
//!
//! The stream is the guest's own `wasi:io` resource, read through the same
//! `InputStream` the guest's reads go through, so every rule on it still
//! applies (a TLS-only socket refuses plain text, see
//! [`crate::capabilities::tls`]).

use std::time::Duration;

use wasmtime::component::{Resource, ResourceTableError};
use wasmtime_wasi::p2::{DynInputStream, StreamError};

use super::{MallocBuffer, Payload};
use crate::bindings::kvwasm::kv_store::payload_streams::{self, ReadError};
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
        let max = self.limits.max_payload_bytes;
        let Some(size) = usize::try_from(len).ok().filter(|_| len <= max) else {
            return Ok(Err(ReadError::Limit(format!(
                "{len} bytes is over the payload limit of {max} bytes"
            ))));
        };
        if head.len() > size {
            return Ok(Err(ReadError::Limit(format!(
                "a head of {} bytes is longer than the {len}-byte value",
                head.len()
            ))));
        }
        if !self.limits.reserve_payload(len) {
            return Ok(Err(ReadError::Limit(format!(
                "{len} more bytes would exceed the {max} bytes of payloads an instance may hold"
            ))));
        }
        let slot = match MallocBuffer::alloc(0).map(|empty| self.table.push(Payload::Owned(empty)))
        {
            Some(Ok(slot)) => slot,
            Some(Err(ResourceTableError::Full)) | None => {
                self.limits.release_payload(len);
                return Ok(Err(ReadError::Limit(
                    "the instance holds its maximum of resources (`max_resources`)".into(),
                )));
            }
            Some(Err(e)) => return Err(e.into()),
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
}

impl HostState {
    /// Give back the table slot and the bytes `read-exact` reserved.
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
