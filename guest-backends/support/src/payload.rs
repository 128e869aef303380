//! Conveniences over the host-owned [`Payload`] resource.

use crate::Payload;

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
