//! Property tests of encode/decode (4,096 cases each, under a second in release).

use kvwasm_mrdn::mooncake;
use kvwasm_mrdn::{DecodeMode, Frame, HEADER_LEN, Tier, checksum, decode, decode_with, encode};
use proptest::prelude::*;

fn tier() -> impl Strategy<Value = Tier> {
    prop::sample::select(Tier::ALL.to_vec())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 4096,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn encode_then_decode_is_identity(tier in tier(), body in prop::collection::vec(any::<u8>(), 0..4096)) {
        let frame = encode(tier, &body).unwrap();
        for mode in [DecodeMode::Lenient, DecodeMode::Strict] {
            prop_assert_eq!(decode_with(&frame, mode), Ok(Frame { tier, body: &body[..] }));
        }
        let mut envelope = Vec::new();
        mooncake::wrap(&frame, &mut envelope).unwrap();
        prop_assert_eq!(mooncake::decode(&envelope, DecodeMode::Strict), Ok(Frame { tier, body: &body[..] }));
    }

    /// Strict accepts only canonical frames: whatever it decodes re-encodes to the same bytes.
    /// Lenient's body is exactly the `body_len` bytes after the header, with a matching checksum.
    /// Neither panics on any input.
    #[test]
    fn decoders_accept_only_what_they_should(
        tier in tier(),
        body in prop::collection::vec(any::<u8>(), 0..256),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<u8>(), 0..4),
    ) {
        let mut bytes = encode(tier, &body).unwrap();
        for (at, value) in &edits {
            let at = at.index(bytes.len());
            bytes[at] = *value;
        }
        if !edits.is_empty() {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        bytes.extend_from_slice(&extra);
        if let Ok(frame) = decode(&bytes) {
            prop_assert_eq!(encode(frame.tier, frame.body).unwrap(), bytes.clone());
        }
        if let Ok(frame) = decode_with(&bytes, DecodeMode::Lenient) {
            let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
            prop_assert_eq!(frame.body, &bytes[HEADER_LEN..HEADER_LEN + len]);
            prop_assert_eq!(&checksum(frame.body)[..], &bytes[16..32]);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        for mode in [DecodeMode::Lenient, DecodeMode::Strict] {
            let _ = decode_with(&bytes, mode);
            let _ = mooncake::decode(&bytes, mode);
        }
    }
}
