//! Round trips for 0 B, 1 B, 16 KiB, 1 MiB and 64 MiB bodies in every tier, through every encoder
//! and both decode modes; decoded bodies borrow the input (no copy).

use kvwasm_mrdn::mooncake::{self, ENVELOPE_HEADER_LEN};
use kvwasm_mrdn::{
    DecodeMode, HEADER_LEN, Tier, decode_with, encode_into, encode_to_vec, frame_len, seal_in_place,
};

const SIZES: [usize; 5] = [0, 1, 16 << 10, 1 << 20, 64 << 20];

/// A body no two sizes or offsets share (xorshift), so a misplaced byte cannot hash the same.
fn body(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ len as u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn assert_decodes(frame: &[u8], tier: Tier, body: &[u8]) {
    for mode in [DecodeMode::Lenient, DecodeMode::Strict] {
        let decoded = decode_with(frame, mode).unwrap();
        assert_eq!(decoded.tier, tier);
        assert_eq!(decoded.body, body);
        assert_eq!(
            decoded.body.as_ptr(),
            frame[HEADER_LEN..].as_ptr(),
            "body is borrowed, not copied"
        );
    }
}

#[test]
fn round_trips_every_size_and_tier() {
    let mut buf = Vec::new();
    for len in SIZES {
        let body = body(len);
        let n = frame_len(len).unwrap();
        assert_eq!(n, HEADER_LEN + len);
        buf.resize(ENVELOPE_HEADER_LEN + n, 0);
        for tier in Tier::ALL {
            assert_eq!(encode_into(tier, &body, &mut buf[..n]), Ok(n));
            assert_eq!(&buf[8..12], &(len as u32).to_le_bytes(), "{len} B {tier:?}");
            assert_eq!(buf[12], tier.as_byte());
            assert_decodes(&buf[..n], tier, &body);

            let mut vec = Vec::new();
            encode_to_vec(tier, &body, &mut vec).unwrap();
            assert!(vec == buf[..n], "encode_to_vec differs at {len} B {tier:?}");

            // The body already sits in the frame buffer: only the header is written.
            seal_in_place(tier, &mut vec).unwrap();
            assert!(vec == buf[..n], "seal_in_place differs at {len} B {tier:?}");
            drop(vec);

            assert_eq!(
                mooncake::encode_into(tier, &body, &mut buf),
                Ok(ENVELOPE_HEADER_LEN + n)
            );
            for mode in [DecodeMode::Lenient, DecodeMode::Strict] {
                let frame = mooncake::unwrap(&buf, mode).unwrap();
                assert_eq!(frame.len(), n);
                assert_decodes(frame, tier, &body);
            }
        }
    }
}
