//! The Mooncake envelope: `b"MNCK"`, the frame's length as a u32 little-endian, then the MRDN
//! frame unchanged (the reference's `MooncakeAdapter`).
//!
//! The notes give only the wrapping direction; unwrapping follows the [`DecodeMode`]:
//! [`DecodeMode::Lenient`] ignores bytes after the declared frame, [`DecodeMode::Strict`] rejects
//! them. A frame longer than `u32::MAX` bytes is refused ([`EncodeError::EnvelopeTooLarge`]).

use crate::{DecodeError, DecodeMode, EncodeError, Frame, Tier};
use thiserror::Error;

/// `b"MNCK"`.
pub const MAGIC: [u8; 4] = *b"MNCK";
/// Size of the envelope in front of the frame.
pub const ENVELOPE_HEADER_LEN: usize = 8;

/// Why bytes are not a valid Mooncake envelope (or the frame inside is not valid).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    /// Fewer than [`ENVELOPE_HEADER_LEN`] bytes.
    #[error("truncated Mooncake envelope: {len} of {ENVELOPE_HEADER_LEN} bytes")]
    TruncatedHeader {
        /// Bytes available.
        len: usize,
    },
    /// The first four bytes are not `b"MNCK"`.
    #[error("bad Mooncake magic {found:02x?}, expected \"MNCK\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// Fewer frame bytes than the envelope declares.
    #[error("Mooncake frame shorter than declared: {available} of {declared} bytes")]
    FrameTruncated {
        /// The declared frame length.
        declared: u32,
        /// Bytes after the envelope header.
        available: usize,
    },
    /// Strict only: bytes after the declared frame.
    #[error("{count} trailing bytes after the Mooncake frame")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// The frame inside is not a valid MRDN frame.
    #[error(transparent)]
    Frame(#[from] DecodeError),
}

/// The envelope header for a frame of `frame_len` bytes.
pub fn envelope_header(frame_len: usize) -> Result<[u8; ENVELOPE_HEADER_LEN], EncodeError> {
    let len = u32::try_from(frame_len).map_err(|_| EncodeError::EnvelopeTooLarge { frame_len })?;
    let mut out = [0; ENVELOPE_HEADER_LEN];
    out[..4].copy_from_slice(&MAGIC);
    out[4..].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

/// Appends the envelope of an already encoded `frame` to `out`.
pub fn wrap(frame: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let header = envelope_header(frame.len())?;
    out.reserve(ENVELOPE_HEADER_LEN + frame.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(frame);
    Ok(())
}

/// Writes the envelope of the frame of `body` to the start of `out` in one pass, returning its
/// length.
pub fn encode_into(tier: Tier, body: &[u8], out: &mut [u8]) -> Result<usize, EncodeError> {
    let frame_len = crate::frame_len(body.len())?;
    let header = envelope_header(frame_len)?;
    let needed = frame_len
        .checked_add(ENVELOPE_HEADER_LEN)
        .ok_or(EncodeError::EnvelopeTooLarge { frame_len })?;
    let available = out.len();
    let out = out
        .get_mut(..needed)
        .ok_or(EncodeError::BufferTooSmall { needed, available })?;
    out[..ENVELOPE_HEADER_LEN].copy_from_slice(&header);
    crate::encode_into(tier, body, &mut out[ENVELOPE_HEADER_LEN..])?;
    Ok(needed)
}

/// The frame inside an envelope, borrowed, not yet decoded.
pub fn unwrap(bytes: &[u8], mode: DecodeMode) -> Result<&[u8], EnvelopeError> {
    let (head, rest) = bytes
        .split_at_checked(ENVELOPE_HEADER_LEN)
        .ok_or(EnvelopeError::TruncatedHeader { len: bytes.len() })?;
    let found = [head[0], head[1], head[2], head[3]];
    if found != MAGIC {
        return Err(EnvelopeError::BadMagic { found });
    }
    let declared = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let truncated = EnvelopeError::FrameTruncated {
        declared,
        available: rest.len(),
    };
    let len = usize::try_from(declared).map_err(|_| truncated.clone())?;
    let frame = rest.get(..len).ok_or(truncated)?;
    if mode == DecodeMode::Strict && rest.len() > len {
        return Err(EnvelopeError::TrailingBytes {
            count: rest.len() - len,
        });
    }
    Ok(frame)
}

/// Unwraps an envelope and decodes the frame inside with the same `mode`.
pub fn decode(bytes: &[u8], mode: DecodeMode) -> Result<Frame<'_>, EnvelopeError> {
    Ok(crate::decode_with(unwrap(bytes, mode)?, mode)?)
}
