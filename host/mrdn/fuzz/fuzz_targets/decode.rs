//! Every decoder on arbitrary bytes: never a panic, and what decodes is
//! consistent: a strictly valid frame is also leniently valid with the same
//! tier and body, and re-encoding it gives back exactly its bytes.
#![no_main]

use kvwasm_mrdn::{DecodeMode, Header, decode_with, encode, mooncake};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let lenient = decode_with(bytes, DecodeMode::Lenient);
    if let Ok(strict) = decode_with(bytes, DecodeMode::Strict) {
        let lenient = lenient.expect("strictly valid implies leniently valid");
        assert_eq!((lenient.tier, lenient.body), (strict.tier, strict.body));
        assert_eq!(encode(strict.tier, strict.body).unwrap(), bytes);
    }
    for mode in [DecodeMode::Lenient, DecodeMode::Strict] {
        if let Ok(header) = Header::parse(bytes, mode) {
            let _ = header.verify(&bytes[32.min(bytes.len())..]);
        }
        let _ = mooncake::decode(bytes, mode);
        let _ = mooncake::unwrap(bytes, mode);
    }
});
