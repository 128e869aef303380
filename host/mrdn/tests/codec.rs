//! Wire vectors from the notes, every malformed-input error, tamper detection for every bit of a
//! 64-byte frame, the Mooncake envelope, and the caller-buffer encoders.

use kvwasm_mrdn::mooncake::{self, EnvelopeError};
use kvwasm_mrdn::{
    DecodeError, DecodeMode, EncodeError, Frame, HEADER_LEN, Header, Tier, decode, decode_with,
    encode, encode_into, encode_to_vec, seal_in_place,
};

const MODES: [DecodeMode; 2] = [DecodeMode::Lenient, DecodeMode::Strict];
const HELLO: &[u8] = b"hello disagg world";

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s.replace(' ', "")).unwrap()
}

/// The worked header from interop-facts.md §2: tier 0, body `hello disagg world`.
#[test]
fn worked_header_vector_is_byte_exact() {
    let expected = unhex("4d52444e 01000000 12000000 00000000 b5991e5ca82b6864630d4c369fd90835");
    let frame = encode(Tier::ThinkComplete, HELLO).unwrap();
    assert_eq!(&frame[..HEADER_LEN], &expected[..]);
    assert_eq!(&frame[HEADER_LEN..], HELLO);
    for mode in MODES {
        let mut wire = expected.clone();
        wire.extend_from_slice(HELLO);
        assert_eq!(
            decode_with(&wire, mode).unwrap(),
            Frame {
                tier: Tier::ThinkComplete,
                body: HELLO
            }
        );
    }
}

/// The empty-body vector: the checksum is Blake3 of the empty input, truncated.
#[test]
fn empty_body_vector_is_byte_exact() {
    let expected = unhex("4d52444e 01000000 00000000 00000000 af1349b9f5f9a1a6a0404dea36dcc949");
    assert_eq!(encode(Tier::ThinkComplete, b"").unwrap(), expected);
    for mode in MODES {
        assert_eq!(
            decode_with(&expected, mode).unwrap(),
            Frame {
                tier: Tier::ThinkComplete,
                body: b""
            }
        );
    }
}

/// Each tier changes only byte 12 of the worked vector.
#[test]
fn every_tier_writes_only_its_byte() {
    let reference = encode(Tier::ThinkComplete, HELLO).unwrap();
    for (byte, tier) in Tier::ALL.into_iter().enumerate() {
        let frame = encode(tier, HELLO).unwrap();
        let mut expected = reference.clone();
        expected[12] = byte as u8;
        assert_eq!(frame, expected);
        assert_eq!(decode(&frame).unwrap().tier, tier);
    }
}

#[test]
fn truncated_header_at_every_length() {
    let frame = encode(Tier::ThinkActive, HELLO).unwrap();
    for len in 0..HEADER_LEN {
        for mode in MODES {
            assert_eq!(
                decode_with(&frame[..len], mode),
                Err(DecodeError::TruncatedHeader { len })
            );
        }
    }
}

#[test]
fn body_shorter_than_body_len_at_every_length() {
    let frame = encode(Tier::ThinkActive, HELLO).unwrap();
    for len in HEADER_LEN..frame.len() {
        for mode in MODES {
            assert_eq!(
                decode_with(&frame[..len], mode),
                Err(DecodeError::BodyTruncated {
                    declared: HELLO.len() as u32,
                    available: len - HEADER_LEN
                })
            );
        }
    }
}

/// A `body_len` claim of ~4 GiB over a short buffer is a truncated body, not an allocation or a
/// wrap-around.
#[test]
fn four_gib_body_len_claim_is_truncated_body() {
    let mut frame = encode(Tier::ThinkActive, HELLO).unwrap();
    frame[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    for mode in MODES {
        assert_eq!(
            decode_with(&frame, mode),
            Err(DecodeError::BodyTruncated {
                declared: u32::MAX,
                available: HELLO.len()
            })
        );
    }
}

#[test]
fn bad_magic_and_wrong_versions_are_rejected() {
    let frame = encode(Tier::ThinkActive, HELLO).unwrap();
    let mut bad = frame.clone();
    bad[..4].copy_from_slice(b"MNCK");
    for mode in MODES {
        assert_eq!(
            decode_with(&bad, mode),
            Err(DecodeError::BadMagic { found: *b"MNCK" })
        );
    }
    for version in [0, 2, u32::MAX] {
        let mut bad = frame.clone();
        bad[4..8].copy_from_slice(&version.to_le_bytes());
        for mode in MODES {
            assert_eq!(
                decode_with(&bad, mode),
                Err(DecodeError::VersionMismatch { found: version })
            );
        }
    }
}

#[test]
fn checksum_mismatch_reports_expected_and_actual() {
    let mut frame = encode(Tier::ThinkActive, HELLO).unwrap();
    let expected: [u8; 16] = frame[16..32].try_into().unwrap();
    frame[HEADER_LEN] ^= 1;
    let actual = kvwasm_mrdn::checksum(&frame[HEADER_LEN..]);
    assert_ne!(expected, actual);
    for mode in MODES {
        assert_eq!(
            decode_with(&frame, mode),
            Err(DecodeError::ChecksumMismatch { expected, actual })
        );
    }
    let message = decode(&frame).unwrap_err().to_string();
    assert!(message.contains(&hex::encode(expected)), "{message}");
    assert!(message.contains(&hex::encode(actual)), "{message}");
}

/// What the reference tolerates: lenient accepts it, strict names it.
#[test]
fn strict_rejects_what_lenient_tolerates() {
    let frame = encode(Tier::ThinkComplete, HELLO).unwrap();
    for byte in 3..=u8::MAX {
        let mut unknown = frame.clone();
        unknown[12] = byte;
        assert_eq!(
            decode(&unknown),
            Err(DecodeError::UnknownTier { found: byte })
        );
        assert_eq!(
            decode_with(&unknown, DecodeMode::Lenient),
            Ok(Frame {
                tier: Tier::OutputCritical,
                body: HELLO
            })
        );
    }
    for at in 13..16 {
        let mut padded = frame.clone();
        padded[at] = 0xa5;
        let mut found = [0; 3];
        found[at - 13] = 0xa5;
        assert_eq!(decode(&padded), Err(DecodeError::NonZeroPadding { found }));
        assert_eq!(
            decode_with(&padded, DecodeMode::Lenient),
            Ok(Frame {
                tier: Tier::ThinkComplete,
                body: HELLO
            })
        );
    }
    for count in [1, 7, 4096] {
        let mut trailing = frame.clone();
        trailing.resize(frame.len() + count, 0xee);
        assert_eq!(decode(&trailing), Err(DecodeError::TrailingBytes { count }));
        assert_eq!(
            decode_with(&trailing, DecodeMode::Lenient),
            Ok(Frame {
                tier: Tier::ThinkComplete,
                body: HELLO
            })
        );
    }
    assert_eq!(DecodeMode::default(), DecodeMode::Strict);
}

/// Every single-bit flip of a 64-byte frame (32-byte header, 32-byte body), for each tier.
///
/// Strict accepts exactly the tier-byte flips that name another valid tier (v1 does not
/// checksum the header), decoding them as that tier: two for ThinkComplete, one for the others. Lenient also accepts the other six tier
/// flips (as OutputCritical) and the 24 padding flips. Everything else is rejected in both modes
/// with the error of the field hit.
#[test]
fn every_single_bit_flip_of_a_64_byte_frame() {
    let body: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    for tier in Tier::ALL {
        let frame = encode(tier, &body).unwrap();
        assert_eq!(frame.len(), 64);
        let (mut strict_ok, mut lenient_ok) = (0, 0);
        for bit in 0..frame.len() * 8 {
            let (at, mask) = (bit / 8, 1u8 << (bit % 8));
            let mut flipped = frame.clone();
            flipped[at] ^= mask;
            let strict = decode_with(&flipped, DecodeMode::Strict);
            let lenient = decode_with(&flipped, DecodeMode::Lenient);
            strict_ok += usize::from(strict.is_ok());
            lenient_ok += usize::from(lenient.is_ok());
            let ok_as = |tier| {
                Ok(Frame {
                    tier,
                    body: &body[..],
                })
            };
            match at {
                0..4 => {
                    assert!(
                        matches!(strict, Err(DecodeError::BadMagic { .. })),
                        "bit {bit}"
                    );
                    assert_eq!(lenient, strict, "bit {bit}");
                }
                4..8 => {
                    assert!(
                        matches!(strict, Err(DecodeError::VersionMismatch { .. })),
                        "bit {bit}"
                    );
                    assert_eq!(lenient, strict, "bit {bit}");
                }
                // body_len is 32: setting a bit claims more than there is; clearing bit 5 claims
                // an empty body, leaving 32 trailing bytes (lenient: wrong checksum).
                8..12 if bit == 8 * 8 + 5 => {
                    assert_eq!(strict, Err(DecodeError::TrailingBytes { count: 32 }));
                    assert!(matches!(lenient, Err(DecodeError::ChecksumMismatch { .. })));
                }
                8..12 => {
                    assert!(
                        matches!(strict, Err(DecodeError::BodyTruncated { .. })),
                        "bit {bit}"
                    );
                    assert_eq!(lenient, strict, "bit {bit}");
                }
                12 => match Tier::from_byte(flipped[12]) {
                    Some(other) => {
                        assert_eq!(strict, ok_as(other), "bit {bit}");
                        assert_eq!(lenient, ok_as(other), "bit {bit}");
                    }
                    None => {
                        assert_eq!(strict, Err(DecodeError::UnknownTier { found: flipped[12] }));
                        assert_eq!(lenient, ok_as(Tier::OutputCritical), "bit {bit}");
                    }
                },
                13..16 => {
                    assert!(
                        matches!(strict, Err(DecodeError::NonZeroPadding { .. })),
                        "bit {bit}"
                    );
                    assert_eq!(lenient, ok_as(tier), "bit {bit}");
                }
                _ => {
                    assert!(
                        matches!(strict, Err(DecodeError::ChecksumMismatch { .. })),
                        "bit {bit}"
                    );
                    assert_eq!(lenient, strict, "bit {bit}");
                }
            }
        }
        // 0 -> 1 and 0 -> 2; 1 -> 0 (1 -> 3 is unknown); 2 -> 0 (2 -> 3 is unknown).
        let tier_to_tier = [2, 1, 1][usize::from(tier.as_byte())];
        assert_eq!(strict_ok, tier_to_tier, "{tier:?}");
        assert_eq!(lenient_ok, 8 + 24, "{tier:?}");
    }
}

#[test]
fn header_parse_then_verify_streams_a_frame() {
    let frame = encode(Tier::OutputCritical, HELLO).unwrap();
    let header = Header::parse(&frame[..HEADER_LEN], DecodeMode::Strict).unwrap();
    assert_eq!(header.tier, Tier::OutputCritical);
    assert_eq!(header.body_len, HELLO.len() as u32);
    assert_eq!(header.to_bytes(), frame[..HEADER_LEN]);
    header.verify(HELLO).unwrap();
    assert!(matches!(
        header.verify(b"hello disagg worle"),
        Err(DecodeError::ChecksumMismatch { .. })
    ));
}

#[test]
fn caller_buffer_encoders_match_encode() {
    let expected = encode(Tier::ThinkActive, HELLO).unwrap();
    let mut buf = vec![0xcc; expected.len() + 5];
    assert_eq!(
        encode_into(Tier::ThinkActive, HELLO, &mut buf[..expected.len() - 1]),
        Err(EncodeError::BufferTooSmall {
            needed: expected.len(),
            available: expected.len() - 1
        })
    );
    assert_eq!(
        encode_into(Tier::ThinkActive, HELLO, &mut buf),
        Ok(expected.len())
    );
    assert_eq!(&buf[..expected.len()], &expected[..]);
    assert_eq!(&buf[expected.len()..], &[0xcc; 5]);

    let mut appended = b"prefix".to_vec();
    encode_to_vec(Tier::ThinkActive, HELLO, &mut appended).unwrap();
    assert_eq!(&appended[..6], b"prefix");
    assert_eq!(&appended[6..], &expected[..]);

    let mut in_place = vec![0xff; HEADER_LEN];
    in_place.extend_from_slice(HELLO);
    seal_in_place(Tier::ThinkActive, &mut in_place).unwrap();
    assert_eq!(in_place, expected);
    assert_eq!(
        seal_in_place(Tier::ThinkActive, &mut [0; HEADER_LEN - 1]),
        Err(EncodeError::BufferTooSmall {
            needed: HEADER_LEN,
            available: HEADER_LEN - 1
        })
    );
}

/// `MNCK`, the frame length as u32 LE, the frame unchanged.
#[test]
fn mooncake_envelope_both_directions() {
    let frame = encode(Tier::ThinkComplete, HELLO).unwrap();
    let mut expected = b"MNCK".to_vec();
    expected.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    expected.extend_from_slice(&frame);

    let mut wrapped = Vec::new();
    mooncake::wrap(&frame, &mut wrapped).unwrap();
    assert_eq!(wrapped, expected);
    let mut direct = vec![0; expected.len()];
    assert_eq!(
        mooncake::encode_into(Tier::ThinkComplete, HELLO, &mut direct),
        Ok(expected.len())
    );
    assert_eq!(direct, expected);
    assert_eq!(
        mooncake::encode_into(
            Tier::ThinkComplete,
            HELLO,
            &mut direct[..expected.len() - 1]
        ),
        Err(EncodeError::BufferTooSmall {
            needed: expected.len(),
            available: expected.len() - 1
        })
    );

    for mode in MODES {
        assert_eq!(mooncake::unwrap(&expected, mode), Ok(&frame[..]));
        assert_eq!(
            mooncake::decode(&expected, mode),
            Ok(Frame {
                tier: Tier::ThinkComplete,
                body: HELLO
            })
        );
        for len in 0..mooncake::ENVELOPE_HEADER_LEN {
            assert_eq!(
                mooncake::unwrap(&expected[..len], mode),
                Err(EnvelopeError::TruncatedHeader { len })
            );
        }
        assert_eq!(
            mooncake::unwrap(&expected[..expected.len() - 1], mode),
            Err(EnvelopeError::FrameTruncated {
                declared: frame.len() as u32,
                available: frame.len() - 1
            })
        );
        let mut bad = expected.clone();
        bad[..4].copy_from_slice(b"MRDN");
        assert_eq!(
            mooncake::unwrap(&bad, mode),
            Err(EnvelopeError::BadMagic { found: *b"MRDN" })
        );
        let mut corrupt = expected.clone();
        *corrupt.last_mut().unwrap() ^= 0x80;
        assert!(matches!(
            mooncake::decode(&corrupt, mode),
            Err(EnvelopeError::Frame(DecodeError::ChecksumMismatch { .. }))
        ));
    }

    let mut trailing = expected.clone();
    trailing.extend_from_slice(b"xyz");
    assert_eq!(
        mooncake::unwrap(&trailing, DecodeMode::Strict),
        Err(EnvelopeError::TrailingBytes { count: 3 })
    );
    assert_eq!(
        mooncake::unwrap(&trailing, DecodeMode::Lenient),
        Ok(&frame[..])
    );
}
