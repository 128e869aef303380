//! Conveniences over the host-owned [`Payload`] resource.

use std::mem::ManuallyDrop;

use crate::Payload;
use crate::bindings::kvwasm::kv_store::payload_streams::{
    ReadError, WriteError, read_exact, write_all,
};
use crate::bindings::wasi::io::streams::{InputStream, OutputStream};

/// Whole-buffer helpers for backends that keep bytes in guest memory.
pub trait PayloadExt {
    /// Copy the whole payload into guest memory.
    fn to_vec(&self) -> Vec<u8>;
}

impl PayloadExt for Payload {
    fn to_vec(&self) -> Vec<u8> {
        self.read(0, self.len())
    }
}

/// `payload-streams.read-exact` on an input stream that other bindings
/// own (the `wasip2` crate's, for an HTTP response body), named by its
/// handle: the stream is only borrowed for the call.
pub fn read_exact_by_handle(
    stream: u32,
    head: &[u8],
    len: u64,
    timeout_ns: u64,
) -> Result<Payload, ReadError> {
    // SAFETY: `stream` is a live input-stream handle of this component (the
    // caller holds it); `ManuallyDrop` leaves it to its owner.
    let borrowed = ManuallyDrop::new(unsafe { InputStream::from_handle(stream) });
    read_exact(&borrowed, head, len, timeout_ns)
}

/// `payload-streams.write-all` on an output stream that other bindings own
/// (the `wasip2` crate's, for an HTTP request body), named by its handle:
/// the stream is only borrowed for the call.
pub fn write_all_by_handle(stream: u32, data: &Payload, timeout_ns: u64) -> Result<(), WriteError> {
    // SAFETY: `stream` is a live output-stream handle of this component (the
    // caller holds it); `ManuallyDrop` leaves it to its owner.
    let borrowed = ManuallyDrop::new(unsafe { OutputStream::from_handle(stream) });
    write_all(&borrowed, data, timeout_ns)
}
