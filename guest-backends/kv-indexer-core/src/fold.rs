//! The hasher of the tree's and the table's maps.

use std::hash::{BuildHasher, Hasher};

/// A fast hasher for keys that are already hashes or small ids (a
/// rotate-xor-multiply per word, cheap in wasm too; `std`'s SipHash costs
/// several times more per lookup). Seeded from `RandomState`, so
/// collisions are not trivially planned by a publisher.
#[derive(Clone, Copy)]
pub(crate) struct Fold(u64);

impl Default for Fold {
    fn default() -> Self {
        thread_local! {
            static SEED: u64 = std::collections::hash_map::RandomState::new().hash_one(0u64);
        }
        Fold(SEED.with(|s| *s))
    }
}

impl BuildHasher for Fold {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(self.0)
    }
}

pub(crate) struct FoldHasher(u64);

impl Hasher for FoldHasher {
    /// The product's high half folded down: bucket indices (low bits)
    /// depend on every input bit.
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(0x5851_f42d_4c95_7f2d);
    }

    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }
}
