//! MRDN v1: the frame Meridian (`meridian-kernels`, feature `nixl`) uses to move KV blocks between
//! prefill and decode workers (ADR-0006), byte-exact with the reference encoder, plus the Mooncake
//! envelope ([`mooncake`]). Trusted host code: this crate frames and verifies, so a fabric guest
//! never computes or checks a checksum. No wasmtime dependency; usable alone.
//!
//! # Frame
//!
//! | offset | size     | field    | encoding                                                    |
//! |--------|----------|----------|-------------------------------------------------------------|
//! | 0      | 4        | magic    | `b"MRDN"`                                                   |
//! | 4      | 4        | version  | u32 little-endian, exactly 1                                |
//! | 8      | 4        | body_len | u32 little-endian                                           |
//! | 12     | 1        | tier     | 0 = ThinkComplete, 1 = ThinkActive, 2 = OutputCritical      |
//! | 13     | 3        | padding  | zeros                                                       |
//! | 16     | 16       | checksum | first 16 bytes of the 32-byte Blake3 digest of the body     |
//! | 32     | body_len | body     | opaque                                                      |
//!
//! Only the body is checksummed (as in the reference), so the header is not integrity-protected:
//! a bit flip that turns one valid tier into another decodes, in either mode, as that other tier.
//!
//! # Decode modes
//!
//! [`DecodeMode::Lenient`] is the reference decoder: padding ignored, bytes after the body
//! ignored, an unknown tier read as [`Tier::OutputCritical`]. [`DecodeMode::Strict`], the default,
//! rejects each of those with its own [`DecodeError`]. Both reject a truncated header, bad magic,
//! a version other than 1, a body shorter than `body_len` and a checksum mismatch.
//!
//! # Divergences from the reference
//!
//! - Strict mode (the default) rejects non-zero padding ([`DecodeError::NonZeroPadding`]), bytes
//!   after the body ([`DecodeError::TrailingBytes`]) and unknown tiers
//!   ([`DecodeError::UnknownTier`]); lenient mode does not.
//! - Strict mode checks padding and tier before the body length, and trailing bytes before the
//!   checksum (no hashing of a frame already known bad), so a frame with several faults may report
//!   a different one than the reference would. Lenient mode checks in the reference's order:
//!   header length, magic, version, body length, checksum.
//! - Encoding a body longer than `u32::MAX` bytes fails with [`EncodeError::BodyTooLarge`]; it is
//!   never truncated into `body_len`. Lengths are computed with checked arithmetic, so a
//!   `body_len` near 4 GiB is a [`DecodeError::BodyTruncated`] on 32-bit targets too.
//! - The notes describe only how the Mooncake adapter wraps a frame; unwrapping is ours
//!   (see [`mooncake`]), and an envelope whose frame would not fit its u32 length is refused.
//!
//! # Example
//!
//! ```
//! use kvwasm_mrdn::{DecodeError, Tier, decode, encode_into, frame_len};
//!
//! let body = b"hello disagg world";
//! let mut buf = vec![0; frame_len(body.len())?];
//! encode_into(Tier::ThinkComplete, body, &mut buf)?;
//! let frame = decode(&buf)?; // strict; `frame.body` borrows `buf`
//! assert_eq!((frame.tier, frame.body), (Tier::ThinkComplete, &body[..]));
//!
//! buf.push(0); // the reference ignores trailing bytes; strict mode does not
//! assert_eq!(decode(&buf), Err(DecodeError::TrailingBytes { count: 1 }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Hashing
//!
//! [`checksum`] hashes on the calling thread with the `blake3` crate's SIMD code (AVX-512 here,
//! 4.2–6.1 GiB/s). Its multithreaded `update_rayon` is not used, because on this 2-core shared
//! machine it is not reliably faster. Measured with `examples/rayon_threshold.rs` (blake3 1.8.7,
//! median of 11 interleaved runs), 8 times while other engineers' builds ran, `update_rayon` over
//! `update` was (median of the 8, range): 1 MiB 1.03× (0.83–1.59), 4 MiB 0.98× (0.87–1.45),
//! 8 MiB 1.0× (0.78–1.75), 64 MiB 1.00× (0.98–1.35). An earlier series with a quieter second core
//! gave 1.34–1.50× at 64 MiB. So it wins only while the other core is idle, and loses up to 22%
//! when it is busy; it would also start a thread pool inside the inference engine's process.

pub mod mooncake;

use thiserror::Error;

/// `b"MRDN"`: fail fast on misrouted payloads.
pub const MAGIC: [u8; 4] = *b"MRDN";
/// The only version this codec reads or writes.
pub const VERSION: u32 = 1;
/// Size of the fixed header in front of the body.
pub const HEADER_LEN: usize = 32;
/// Size of the truncated Blake3 digest in the header.
pub const CHECKSUM_LEN: usize = 16;
/// The largest body `body_len` (a u32) can describe.
pub const MAX_BODY_LEN: usize = u32::MAX as usize;

/// The producer's tier label (telemetry and fabric-side admission; the consumer may ingest the
/// block into another tier).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Think KV of a request that has left its thinking phase: known cold.
    ThinkComplete = 0,
    /// Think KV of a request still thinking.
    ThinkActive = 1,
    /// KV of user-visible output.
    OutputCritical = 2,
}

impl Tier {
    /// Every tier, in wire order.
    pub const ALL: [Tier; 3] = [Tier::ThinkComplete, Tier::ThinkActive, Tier::OutputCritical];

    /// The tier a wire byte names, if any.
    pub fn from_byte(byte: u8) -> Option<Tier> {
        Tier::ALL.get(usize::from(byte)).copied()
    }

    /// The wire byte of this tier.
    pub fn as_byte(self) -> u8 {
        self as u8
    }
}

/// How [`decode_with`] treats what the reference decoder tolerates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeMode {
    /// The reference's behaviour: padding and trailing bytes ignored, unknown tier read as
    /// [`Tier::OutputCritical`].
    Lenient,
    /// Non-zero padding, trailing bytes and unknown tiers rejected.
    #[default]
    Strict,
}

/// A decoded, verified frame; `body` borrows the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The producer's tier label.
    pub tier: Tier,
    /// The body, checksum verified.
    pub body: &'a [u8],
}

/// Why a body could not be framed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// `body_len` is a u32; a longer body is refused, never truncated.
    #[error("body of {len} bytes exceeds the MRDN v1 limit of {MAX_BODY_LEN} bytes")]
    BodyTooLarge {
        /// The body's length.
        len: usize,
    },
    /// The caller's buffer cannot hold the frame.
    #[error("buffer of {available} bytes cannot hold {needed} bytes")]
    BufferTooSmall {
        /// Bytes the frame (or envelope) needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The Mooncake length field is a u32; a longer frame is refused, never truncated.
    #[error("frame of {frame_len} bytes exceeds the Mooncake envelope's u32 length")]
    EnvelopeTooLarge {
        /// The frame's length.
        frame_len: usize,
    },
}

/// Why bytes are not a valid frame. The first five are the reference's errors; the last three are
/// raised only in [`DecodeMode::Strict`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer than [`HEADER_LEN`] bytes.
    #[error("truncated header: {len} of {HEADER_LEN} bytes")]
    TruncatedHeader {
        /// Bytes available.
        len: usize,
    },
    /// The first four bytes are not `b"MRDN"`.
    #[error("bad magic {found:02x?}, expected \"MRDN\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A version other than [`VERSION`].
    #[error("version mismatch: frame is v{found}, this codec reads v{VERSION}")]
    VersionMismatch {
        /// The version found.
        found: u32,
    },
    /// Fewer body bytes than `body_len` claims.
    #[error("body shorter than body_len: {available} of {declared} bytes")]
    BodyTruncated {
        /// `body_len` from the header.
        declared: u32,
        /// Bytes after the header.
        available: usize,
    },
    /// The body does not hash to the header's checksum.
    #[error("checksum mismatch: header has {}, body hashes to {}", hex(.expected), hex(.actual))]
    ChecksumMismatch {
        /// The checksum in the header.
        expected: [u8; CHECKSUM_LEN],
        /// The checksum of the body received.
        actual: [u8; CHECKSUM_LEN],
    },
    /// Strict only: a tier byte naming no [`Tier`].
    #[error("unknown tier {found}")]
    UnknownTier {
        /// The tier byte found.
        found: u8,
    },
    /// Strict only: padding that is not all zeros.
    #[error("non-zero padding {found:02x?}")]
    NonZeroPadding {
        /// The padding bytes found.
        found: [u8; 3],
    },
    /// Strict only: bytes after the body.
    #[error("{count} trailing bytes after the body")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The frame checksum of `body`: its Blake3 digest truncated to 16 bytes, hashed on the calling
/// thread (see "Hashing" above for why not `update_rayon`).
pub fn checksum(body: &[u8]) -> [u8; CHECKSUM_LEN] {
    let digest = blake3::hash(body);
    let mut out = [0; CHECKSUM_LEN];
    out.copy_from_slice(&digest.as_bytes()[..CHECKSUM_LEN]);
    out
}

/// A parsed frame header; lets a receiver learn `body_len` from the first [`HEADER_LEN`] bytes
/// before reading the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The tier (in lenient mode an unknown byte reads as [`Tier::OutputCritical`]).
    pub tier: Tier,
    /// The body length.
    pub body_len: u32,
    /// The body's truncated Blake3 digest.
    pub checksum: [u8; CHECKSUM_LEN],
}

impl Header {
    /// The header framing `body` with `tier`.
    pub fn for_body(tier: Tier, body: &[u8]) -> Result<Header, EncodeError> {
        let body_len =
            u32::try_from(body.len()).map_err(|_| EncodeError::BodyTooLarge { len: body.len() })?;
        Ok(Header {
            tier,
            body_len,
            checksum: checksum(body),
        })
    }

    /// The header's wire bytes (padding zero).
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut out = [0; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        out[12] = self.tier.as_byte();
        out[16..32].copy_from_slice(&self.checksum);
        out
    }

    /// Parses the first [`HEADER_LEN`] bytes of `bytes` (the rest is not looked at).
    pub fn parse(bytes: &[u8], mode: DecodeMode) -> Result<Header, DecodeError> {
        let header: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(DecodeError::TruncatedHeader { len: bytes.len() })?;
        let field =
            |at: usize| -> [u8; 4] { [header[at], header[at + 1], header[at + 2], header[at + 3]] };
        if field(0) != MAGIC {
            return Err(DecodeError::BadMagic { found: field(0) });
        }
        let version = u32::from_le_bytes(field(4));
        if version != VERSION {
            return Err(DecodeError::VersionMismatch { found: version });
        }
        let tier = match (Tier::from_byte(header[12]), mode) {
            (Some(tier), _) => tier,
            (None, DecodeMode::Lenient) => Tier::OutputCritical,
            (None, DecodeMode::Strict) => {
                return Err(DecodeError::UnknownTier { found: header[12] });
            }
        };
        let padding = [header[13], header[14], header[15]];
        if mode == DecodeMode::Strict && padding != [0; 3] {
            return Err(DecodeError::NonZeroPadding { found: padding });
        }
        let mut checksum = [0; CHECKSUM_LEN];
        checksum.copy_from_slice(&header[16..32]);
        Ok(Header {
            tier,
            body_len: u32::from_le_bytes(field(8)),
            checksum,
        })
    }

    /// Checks that `body` hashes to this header's checksum.
    pub fn verify(&self, body: &[u8]) -> Result<(), DecodeError> {
        let actual = checksum(body);
        if actual == self.checksum {
            Ok(())
        } else {
            Err(DecodeError::ChecksumMismatch {
                expected: self.checksum,
                actual,
            })
        }
    }
}

/// Length of the frame of a `body_len`-byte body.
pub fn frame_len(body_len: usize) -> Result<usize, EncodeError> {
    if body_len > MAX_BODY_LEN {
        return Err(EncodeError::BodyTooLarge { len: body_len });
    }
    body_len
        .checked_add(HEADER_LEN)
        .ok_or(EncodeError::BodyTooLarge { len: body_len })
}

/// Writes the frame of `body` to the start of `out`, returning its length.
pub fn encode_into(tier: Tier, body: &[u8], out: &mut [u8]) -> Result<usize, EncodeError> {
    let needed = frame_len(body.len())?;
    let available = out.len();
    let out = out
        .get_mut(..needed)
        .ok_or(EncodeError::BufferTooSmall { needed, available })?;
    let (header, dst) = out.split_at_mut(HEADER_LEN);
    let header_of_body = Header {
        tier,
        body_len: body.len() as u32, // frame_len checked the bound
        checksum: copy_and_checksum(body, dst),
    };
    header.copy_from_slice(&header_of_body.to_bytes());
    Ok(needed)
}

/// Bytes copied, then hashed while still in cache, per step of
/// [`copy_and_checksum`]: a power of two, so Blake3 hashes whole subtrees.
const COPY_BLOCK: usize = 64 << 10;

/// Copy `body` into `dst` (the same length) and return its checksum, in one
/// pass over memory: each block is hashed right after it is copied, while
/// it is in cache, instead of copying 16 MiB and reading it all again.
fn copy_and_checksum(body: &[u8], dst: &mut [u8]) -> [u8; CHECKSUM_LEN] {
    let mut hasher = blake3::Hasher::new();
    for (src, dst) in body.chunks(COPY_BLOCK).zip(dst.chunks_mut(COPY_BLOCK)) {
        dst.copy_from_slice(src);
        hasher.update(dst);
    }
    let mut out = [0; CHECKSUM_LEN];
    out.copy_from_slice(&hasher.finalize().as_bytes()[..CHECKSUM_LEN]);
    out
}

/// Appends the frame of `body` to `out`.
pub fn encode_to_vec(tier: Tier, body: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let at = out.len();
    out.resize(at + frame_len(body.len())?, 0);
    encode_into(tier, body, &mut out[at..]).map(|_| ())
}

/// The frame of `body`, in a new buffer.
pub fn encode(tier: Tier, body: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    encode_to_vec(tier, body, &mut out)?;
    Ok(out)
}

/// Frames a body already in place: `frame[HEADER_LEN..]` is the body, and its header is written
/// into `frame[..HEADER_LEN]`, so a producer that fills the body in place copies nothing.
pub fn seal_in_place(tier: Tier, frame: &mut [u8]) -> Result<(), EncodeError> {
    let available = frame.len();
    let (header, body) =
        frame
            .split_at_mut_checked(HEADER_LEN)
            .ok_or(EncodeError::BufferTooSmall {
                needed: HEADER_LEN,
                available,
            })?;
    header.copy_from_slice(&Header::for_body(tier, body)?.to_bytes());
    Ok(())
}

/// Decodes and verifies a frame in [`DecodeMode::Strict`].
pub fn decode(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    decode_with(bytes, DecodeMode::Strict)
}

/// Decodes and verifies a frame; the body borrows `bytes`.
pub fn decode_with(bytes: &[u8], mode: DecodeMode) -> Result<Frame<'_>, DecodeError> {
    let header = Header::parse(bytes, mode)?;
    let rest = &bytes[HEADER_LEN..];
    let truncated = DecodeError::BodyTruncated {
        declared: header.body_len,
        available: rest.len(),
    };
    let body_len = usize::try_from(header.body_len).map_err(|_| truncated.clone())?;
    let body = rest.get(..body_len).ok_or(truncated)?;
    if mode == DecodeMode::Strict && rest.len() > body_len {
        return Err(DecodeError::TrailingBytes {
            count: rest.len() - body_len,
        });
    }
    header.verify(body)?;
    Ok(Frame {
        tier: header.tier,
        body,
    })
}
