//! `/query` bodies read in one pass, the token ids parsed in place or kept
//! as raw JSON for a [`TokenJsonHasher`](crate::hash::TokenJsonHasher).

use kvwasm_indexer_protocol::api::{self, MAX_TOKEN_IDS, default_group};
use serde::Deserialize;

use crate::reply::parse;

/// A `/query` body: read in place ([`QueryRequest::parse`]); what that
/// refuses, serde_json reads ([`api::QueryRequest`]), so a refused body gets
/// serde's answer and status, and a body only serde takes (a struct as a
/// JSON array) is still answered.
pub(crate) fn query_request(body: &[u8]) -> Result<QueryRequest<Vec<u32>>, (u16, Vec<u8>)> {
    QueryRequest::parse(body, token_list).or_else(|_| {
        let body: api::QueryRequest = parse(body)?;
        Ok(QueryRequest {
            token_ids: body.token_ids,
            model_name: body.model_name,
            routing_group: body.routing_group,
            tenant_id: body.tenant_id,
            lora_name: body.lora_name,
            cache_salt: body.cache_salt,
        })
    })
}

/// A `/query` body: the fields of Dynamo's request, any order, unknown
/// fields ignored, a field twice refused. `T` is the token ids as read by
/// the `tokens` reader given to [`QueryRequest::parse`]: parsed
/// ([`token_list`]) or as raw JSON ([`raw_token_list`]).
pub(crate) struct QueryRequest<T> {
    pub(crate) token_ids: T,
    pub(crate) model_name: String,
    /// The tree's group; "default" when absent.
    pub(crate) routing_group: String,
    /// Only the workers registered with this tenant, when given.
    pub(crate) tenant_id: Option<String>,
    pub(crate) lora_name: Option<String>,
    pub(crate) cache_salt: Option<String>,
}

/// Reads the token list at a byte index of the body: the value and the
/// index just past it.
pub(crate) type TokenReader<'a, T> = fn(&'a [u8], usize) -> Result<(T, usize), String>;

impl<'a, T> QueryRequest<T> {
    /// One pass over the body: `token_ids` by [`token_list`] where it
    /// stands, every other value by serde_json (they are short). Going
    /// through serde for the whole object would scan the token array twice
    /// (once to find its end, once to read it): that scan was ~40% of a
    /// guest `/query`.
    pub(crate) fn parse(
        body: &'a [u8],
        tokens_at: TokenReader<'a, T>,
    ) -> Result<QueryRequest<T>, String> {
        fn once<V>(slot: &mut Option<V>, value: V, key: &str) -> Result<(), String> {
            match slot.replace(value) {
                None => Ok(()),
                Some(_) => Err(format!("duplicate field `{key}`")),
            }
        }
        let (mut tokens, mut model, mut group, mut tenant, mut lora, mut salt) =
            (None, None, None, None, None, None);
        let mut i = skip_space(body, 0);
        if body.get(i) != Some(&b'{') {
            return Err("expected a JSON object".into());
        }
        i = skip_space(body, i + 1);
        if body.get(i) == Some(&b'}') {
            i += 1;
        } else {
            loop {
                let key: String = json_value(body, &mut i)?;
                i = skip_space(body, i);
                if body.get(i) != Some(&b':') {
                    return Err(format!("expected : at byte {i}"));
                }
                i = skip_space(body, i + 1);
                match key.as_str() {
                    "token_ids" => {
                        let (list, end) =
                            tokens_at(body, i).map_err(|e| format!("token_ids: {e}"))?;
                        i = end;
                        once(&mut tokens, list, "token_ids")?;
                    }
                    "model_name" => once(&mut model, json_value(body, &mut i)?, "model_name")?,
                    "routing_group" => {
                        once(&mut group, json_value(body, &mut i)?, "routing_group")?
                    }
                    "tenant_id" => once(&mut tenant, json_value(body, &mut i)?, "tenant_id")?,
                    "lora_name" => once(&mut lora, json_value(body, &mut i)?, "lora_name")?,
                    "cache_salt" => once(&mut salt, json_value(body, &mut i)?, "cache_salt")?,
                    _ => {
                        json_value::<serde::de::IgnoredAny>(body, &mut i)?;
                    }
                }
                i = skip_space(body, i);
                match body.get(i) {
                    Some(b',') => i = skip_space(body, i + 1),
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    _ => return Err(format!("expected , or }} at byte {i}")),
                }
            }
        }
        if skip_space(body, i) != body.len() {
            return Err("trailing characters after the object".into());
        }
        Ok(QueryRequest {
            token_ids: tokens.ok_or("missing field `token_ids`")?,
            model_name: model.ok_or("missing field `model_name`")?,
            routing_group: group.unwrap_or_else(default_group),
            tenant_id: tenant,
            lora_name: lora.flatten(),
            cache_salt: salt.flatten(),
        })
    }
}

/// The JSON value at `*at` as a `T`; `*at` moves past it.
fn json_value<'a, T: Deserialize<'a>>(body: &'a [u8], at: &mut usize) -> Result<T, String> {
    let rest = &body[*at..];
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
    let value = values
        .next()
        .unwrap_or_else(|| Err(serde::de::Error::custom("expected a value")))
        .map_err(|e| format!("at byte {at}: {e}"))?;
    *at += values.byte_offset();
    Ok(value)
}

/// Index of the first non-whitespace byte of `bytes` at or after `i`.
fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while bytes
        .get(i)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        i += 1;
    }
    i
}

/// The JSON array of u32 token ids (at most [`MAX_TOKEN_IDS`]) at byte
/// `start`, and the index just past it: serde's visitor costs ~10 ns a
/// token natively and more in wasm, which made it most of a `/query`.
/// Stricter than JSON only in refusing `-0`.
pub(crate) fn token_list(bytes: &[u8], start: usize) -> Result<(Vec<u32>, usize), String> {
    let mut i = skip_space(bytes, start);
    if bytes.get(i) != Some(&b'[') {
        return Err("expected a list of token ids".into());
    }
    let mut tokens = Vec::with_capacity(4096);
    i = skip_space(bytes, i + 1);
    if bytes.get(i) == Some(&b']') {
        return Ok((tokens, i + 1));
    }
    loop {
        let (value, digits) = number(bytes, i)?;
        if tokens.len() == MAX_TOKEN_IDS {
            return Err(format!("more than {MAX_TOKEN_IDS} items"));
        }
        tokens.push(value);
        i = skip_space(bytes, i + digits);
        match bytes.get(i) {
            Some(b',') => i = skip_space(bytes, i + 1),
            Some(b']') => return Ok((tokens, i + 1)),
            _ => return Err(format!("expected , or ] at byte {i}")),
        }
    }
}

/// The token array at byte `start` as raw JSON, unchecked: the bytes up to
/// its first `]` (an array of numbers has no other), for a
/// [`TokenJsonHasher`] to parse. Found by `memchr` (a word at a time): a
/// byte loop is most of the cost of skipping a prompt in wasm.
pub(crate) fn raw_token_list(bytes: &[u8], start: usize) -> Result<(&[u8], usize), String> {
    let end = memchr::memchr(b']', &bytes[start..])
        .map(|at| start + at + 1)
        .ok_or("no ] after the token ids")?;
    Ok((&bytes[start..end], end))
}

/// A whole input of one JSON array of u32 token ids (whitespace around it
/// allowed), at most [`MAX_TOKEN_IDS`]: what [`TokenJsonHasher`]s accept,
/// with the rules of `/query`'s in-place parser.
pub fn token_array(json: &[u8]) -> Result<Vec<u32>, String> {
    let (tokens, end) = token_list(json, 0)?;
    if skip_space(json, end) != json.len() {
        return Err(format!("trailing characters at byte {end}"));
    }
    Ok(tokens)
}

/// The u32 written in decimal at `bytes[at..]` and its length in digits.
/// Up to 7 digits are read 8 bytes at a time (SWAR): a few multiplies
/// instead of a loop iteration per digit, which matters most in wasm,
/// where every loop back-edge also checks the epoch deadline.
fn number(bytes: &[u8], at: usize) -> Result<(u32, usize), String> {
    let (value, digits) = match bytes.get(at..at + 8) {
        Some(word) => {
            let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            const HIGH: u64 = 0xf0f0_f0f0_f0f0_f0f0;
            // A byte of `flags` is 0 iff the byte is an ASCII digit (its
            // high nibble is 3, and stays 3 when 6 is added). A carry out
            // of a byte >= 0xfa only affects the bytes after it.
            let flags = ((word & HIGH) | ((word.wrapping_add(0x0606_0606_0606_0606) & HIGH) >> 4))
                ^ 0x3333_3333_3333_3333;
            match flags.trailing_zeros() as usize / 8 {
                8 => scalar_number(bytes, at)?,
                n => (u64::from(swar_digits(word, n)), n),
            }
        }
        None => scalar_number(bytes, at)?,
    };
    if digits == 0 || (bytes[at] == b'0' && digits > 1) {
        return Err(format!("expected a token id at byte {at}"));
    }
    if value > u64::from(u32::MAX) {
        return Err("a token id is above u32::MAX".into());
    }
    Ok((value as u32, digits))
}

/// The value of the first `n` (< 8) bytes of `word`, ASCII digits, most
/// significant first.
fn swar_digits(word: u64, n: usize) -> u32 {
    if n == 0 {
        return 0;
    }
    // The digits move to the top bytes; the bytes below become zeros
    // (leading zeros of an 8-digit number).
    let mut v = (word << (8 * (8 - n))) & 0x0f0f_0f0f_0f0f_0f0f;
    v = (v.wrapping_mul(10 * (1 << 8) + 1) >> 8) & 0x00ff_00ff_00ff_00ff;
    v = (v.wrapping_mul(100 * (1 << 16) + 1) >> 16) & 0x0000_ffff_0000_ffff;
    v = v.wrapping_mul(10_000 * (1 << 32) + 1) >> 32;
    v as u32
}

/// The digits at `bytes[at..]` one by one (the last bytes of a body, or 8
/// digits and more); stops once the value is above u32::MAX.
fn scalar_number(bytes: &[u8], at: usize) -> Result<(u64, usize), String> {
    let mut i = at;
    let mut value = 0u64;
    while let Some(digit) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
        value = value * 10 + u64::from(digit - b'0');
        if value > u64::from(u32::MAX) {
            return Err("a token id is above u32::MAX".into());
        }
        i += 1;
    }
    Ok((value, i - at))
}

#[cfg(test)]
mod tests {
    use super::QueryRequest;
    use proptest::prelude::*;

    /// A `/query` body parsed in place.
    fn parse(body: &[u8]) -> Result<QueryRequest<Vec<u32>>, String> {
        QueryRequest::parse(body, super::token_list)
    }

    /// `raw` as a whole body's token list: parsed by the one-pass reader.
    fn token_list(raw: &str) -> Result<Vec<u32>, String> {
        let body = format!("{{\"model_name\": \"m\", \"token_ids\": {raw}}}");
        parse(body.as_bytes()).map(|q| q.token_ids)
    }

    #[test]
    fn query_bodies_parse_like_serde_would() {
        let q = parse(
            br#" {"x": {"a": [1, "]"]}, "token_ids": [1, 2], "routing_group": "t\u0041",
                  "lora_name": null, "model_name": "m\"n"} "#,
        )
        .unwrap();
        assert_eq!(q.token_ids, [1, 2]);
        assert_eq!(q.model_name, "m\"n");
        assert_eq!((q.routing_group.as_str(), q.tenant_id), ("tA", None));
        assert_eq!(q.lora_name, None);
        let q = parse(
            br#"{"model_name":"m","token_ids":[],"lora_name":"a","tenant_id":"t","cache_salt":"s"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                q.routing_group.as_str(),
                q.tenant_id.as_deref(),
                q.lora_name.as_deref(),
                q.cache_salt.as_deref()
            ),
            ("default", Some("t"), Some("a"), Some("s"))
        );
        for bad in [
            &br#"{"model_name": "m"}"#[..],
            br#"{"token_ids": []}"#,
            br#"{"token_ids": [], "model_name": "m", "token_ids": []}"#,
            br#"{"token_ids": [], "model_name": "m", "tenant_id": null}"#,
            br#"{"token_ids": [], "model_name": "m", "routing_group": null}"#,
            br#"{"token_ids": [], "model_name": 5}"#,
            br#"{"token_ids": [], "model_name": "m",}"#,
            br#"{"token_ids": [], "model_name": "m"} x"#,
            br#"{"token_ids": [] "model_name": "m"}"#,
            br#"{"token_ids": [], "model_name": "m""#,
            br#"[]"#,
            b"",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn token_lists_refuse_what_json_or_u32_refuses() {
        assert_eq!(token_list(" [ ] "), Ok(vec![]));
        assert_eq!(token_list("[0,4294967295]"), Ok(vec![0, u32::MAX]));
        for bad in [
            "",
            "[",
            "]",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[01]",
            "[-1]",
            "[-0]",
            "[1.5]",
            "[1e3]",
            "[4294967296]",
            "[\"1\"]",
            "[1] x",
            "{}",
            "[null]",
            "[99999999999999999999999]",
        ] {
            assert!(token_list(bad).is_err(), "{bad:?}");
        }
    }

    /// Every length of number (the 8-byte reads and the byte loop), next
    /// to every kind of byte after it.
    #[test]
    fn numbers_of_every_length_next_to_any_byte() {
        for digits in 1..=10 {
            let n: u64 = "4123456789"[..digits].parse().unwrap();
            for after in ["]", ",1]", " ]", "]é", "]:", "]/", "]\u{ff}", "]00000000"] {
                let text = format!("[{n}{after}");
                let expected = serde_json::Deserializer::from_str(&text)
                    .into_iter::<Vec<u32>>()
                    .next()
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    super::token_list(text.as_bytes(), 0).unwrap().0,
                    expected,
                    "{text}"
                );
            }
        }
        for bad in ["[1a]", "[1:]", "[12/]", "[0012]", "[1234567:]"] {
            assert!(super::token_list(bad.as_bytes(), 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn raw_token_lists_end_at_the_first_close_bracket() {
        for len in 0..40 {
            for at in 0..len {
                let mut text = vec![b'1'; len];
                text[at] = b']';
                text[len - 1] = b']';
                let (raw, end) = super::raw_token_list(&text, 0).unwrap();
                assert_eq!((raw.len(), end), (at + 1, at + 1), "{len} {at}");
            }
            assert!(super::raw_token_list(&vec![b'1'; len], 0).is_err());
        }
    }
    proptest! {
        /// Any list of u32, however spaced, parses to itself.
        #[test]
        fn lists_round_trip(tokens in prop::collection::vec(prop_oneof![any::<u32>(), 0u32..10_000_000], 0..64),
                            spaces in prop::collection::vec(prop::sample::select(vec!["", " ", "\n", "\t ", "\r\n"]), 130)) {
            let mut text = format!("{}[", spaces[0]);
            for (n, t) in tokens.iter().enumerate() {
                if n > 0 {
                    text.push(',');
                }
                text.push_str(spaces[2 * n + 1]);
                text.push_str(&t.to_string());
                text.push_str(spaces[2 * n + 2]);
            }
            text.push(']');
            text.push_str(spaces[129]);
            prop_assert_eq!(token_list(&text), Ok(tokens));
        }

        /// Whatever it accepts, serde_json reads as the same list.
        #[test]
        fn accepts_only_what_serde_accepts(text in "[ \\[\\]0-9,.e-]{0,24}") {
            if let Ok(tokens) = token_list(&text) {
                prop_assert_eq!(serde_json::from_str::<Vec<u32>>(&text).ok(), Some(tokens));
            }
        }
    }
}
