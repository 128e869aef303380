//! A body of more than `u32::MAX` bytes is refused with a typed error, never truncated into
//! `body_len`. The body is a read-only anonymous mapping: address space only, never touched, so
//! the test needs no memory and fails fast if an encoder starts hashing or copying it.

use kvwasm_mrdn::mooncake;
use kvwasm_mrdn::{
    EncodeError, HEADER_LEN, Header, MAX_BODY_LEN, Tier, encode, encode_into, encode_to_vec,
    frame_len,
};

/// `len` bytes of unbacked, read-only zero pages.
struct Unbacked {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Unbacked {
    fn new(len: usize) -> Unbacked {
        // SAFETY: a fresh private anonymous mapping, aliasing nothing; read-only, so Linux
        // charges no commit for it and NORESERVE reserves no swap.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap {len} bytes");
        Unbacked { ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, lives as long as `self`, and nothing
        // writes it.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }
}

impl Drop for Unbacked {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

#[test]
fn bodies_beyond_u32_are_refused_on_encode() {
    let huge = Unbacked::new(MAX_BODY_LEN + 1);
    let body = huge.bytes();
    let too_large = EncodeError::BodyTooLarge {
        len: MAX_BODY_LEN + 1,
    };
    assert_eq!(frame_len(body.len()), Err(too_large.clone()));
    let tier = Tier::ThinkComplete;
    assert_eq!(Header::for_body(tier, body).err(), Some(too_large.clone()));
    assert_eq!(encode(tier, body).err(), Some(too_large.clone()));
    assert_eq!(
        encode_into(tier, body, &mut [0; 64]).err(),
        Some(too_large.clone())
    );
    let mut vec = b"kept".to_vec();
    assert_eq!(
        encode_to_vec(tier, body, &mut vec).err(),
        Some(too_large.clone())
    );
    assert_eq!(vec, b"kept", "nothing appended on refusal");
    let mooncake = mooncake::encode_into(tier, body, &mut [0; 64]);
    assert_eq!(mooncake.err(), Some(too_large));

    // The largest body MRDN can frame is still too large for the Mooncake envelope's u32 length.
    assert_eq!(frame_len(MAX_BODY_LEN), Ok(MAX_BODY_LEN + HEADER_LEN));
    let frame_len = MAX_BODY_LEN + 1;
    assert_eq!(
        mooncake::encode_into(
            Tier::ThinkComplete,
            &body[..frame_len - HEADER_LEN],
            &mut [0; 64]
        ),
        Err(EncodeError::EnvelopeTooLarge { frame_len })
    );
    let mut vec = Vec::new();
    assert_eq!(
        mooncake::wrap(&body[..frame_len], &mut vec),
        Err(EncodeError::EnvelopeTooLarge { frame_len })
    );
    assert!(vec.is_empty());
}
