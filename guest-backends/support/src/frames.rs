//! An in-memory frame store for fabric guests: pushed frames in guest
//! memory under handles counted from 1, as the reference's synthetic fabric
//! keeps them. The synthetic fabric is this store; the test-only hostile
//! fabric is this store plus its commands.

use std::collections::HashMap;

use crate::Error;

/// Frames by handle.
#[derive(Default)]
pub struct Frames {
    frames: HashMap<u64, Vec<u8>>,
    /// The last handle given out (0: none yet).
    last: u64,
}

impl Frames {
    /// Keep `frame`; its handle is one more than the last one.
    pub fn push(&mut self, frame: Vec<u8>) -> u64 {
        self.last += 1;
        self.frames.insert(self.last, frame);
        self.last
    }

    /// The frame under `handle`, which stays until released.
    pub fn get(&self, handle: u64) -> Result<&[u8], Error> {
        self.frames
            .get(&handle)
            .map(Vec::as_slice)
            .ok_or(Error::NotFound)
    }

    /// Forget `handle`; `not-found` if it is not held.
    pub fn release(&mut self, handle: u64) -> Result<(), Error> {
        self.frames.remove(&handle).map(drop).ok_or(Error::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_count_from_one_pull_keeps_release_forgets() {
        let mut frames = Frames::default();
        assert_eq!(frames.push(b"a".to_vec()), 1);
        assert_eq!(frames.push(b"b".to_vec()), 2);
        assert_eq!(frames.get(1).unwrap(), b"a");
        assert_eq!(frames.get(1).unwrap(), b"a");
        frames.release(1).unwrap();
        assert!(matches!(frames.get(1), Err(Error::NotFound)));
        assert!(matches!(frames.release(1), Err(Error::NotFound)));
        assert!(matches!(frames.release(0), Err(Error::NotFound)));
        // Handles are never reused.
        assert_eq!(frames.push(b"c".to_vec()), 3);
        assert_eq!(frames.get(2).unwrap(), b"b");
    }
}
