//! The handoff messages carried in MRDN frame bodies (docs/fabric.md, "Slot handoff"):
//!
//! | magic  | message  | layout after the magic                                          |
//! |--------|----------|-----------------------------------------------------------------|
//! | `KVQ1` | query    | hash list: u32 count (≤ 2^20), count × (u8 hash_len 1..=64, hash) |
//! | `KVA1` | answer   | 16-byte checksum of the query's frame, u32 count (≤ 2^20), ceil(count/8) bytes bitmap, LSB first |
//! | `KVC1` | chunk    | u8 hash_len 1..=64, hash, the chunk bytes (the rest, may be empty) |
//! | `KVM1` | manifest | u16 name_len 1..=255, UTF-8 name, hash list (the chunks it names), the manifest bytes (the rest) |
//!
//! A manifest lists its chunks so that the receiver, not the sending fabric, decides whether
//! they are all there: a fabric guest can forge a valid "all present" answer (it can compute
//! Blake3 too), and the receiver must still never publish a manifest whose chunks it lacks. An
//! answer names the query it answers (the query frame's checksum), so a fabric cannot hand
//! the sender one query's answer for another's.
//!
//! With a shared key each of these travels inside a `KVS1` wrapper that tags it
//! ([`crate::auth`]).
//!
//! Integers are little-endian. Parsing is strict and total: every byte of the body is accounted
//! for (no trailing bytes after a query or answer, no set bits past an answer's count), so two
//! different bodies never parse to the same message. Encoders append to a caller's `Vec`, so a
//! sender frames every chunk in one reused buffer.

use kvwasm_mrdn::CHECKSUM_LEN;
use thiserror::Error;

/// Magic of a query: which of these hashes does the receiver hold?
pub const QUERY_MAGIC: [u8; 4] = *b"KVQ1";
/// Magic of the answer to a query.
pub const ANSWER_MAGIC: [u8; 4] = *b"KVA1";
/// Magic of a chunk.
pub const CHUNK_MAGIC: [u8; 4] = *b"KVC1";
/// Magic of a manifest.
pub const MANIFEST_MAGIC: [u8; 4] = *b"KVM1";
/// Most hashes one query (and so one answer) may list.
pub const MAX_QUERY_HASHES: usize = 1 << 20;
/// Longest hash (kv_store_v1 hashes are 1..=64 bytes).
pub const MAX_HASH_LEN: usize = 64;
/// Longest manifest name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Why a body is not a handoff message, or a message cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MessageError {
    /// The body ends inside a field.
    #[error("message truncated: {what} needs {needed} more bytes, {available} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the body.
        available: usize,
    },
    /// The first four bytes name no handoff message.
    #[error("unknown message kind {found:02x?}")]
    UnknownKind {
        /// The bytes found (fewer than four when the body is that short).
        found: Vec<u8>,
    },
    /// A hash length outside 1..=64.
    #[error("hash length {len} is outside 1..={MAX_HASH_LEN}")]
    BadHashLen {
        /// The length found.
        len: usize,
    },
    /// A query or answer over [`MAX_QUERY_HASHES`].
    #[error("{count} hashes exceed the limit of {MAX_QUERY_HASHES} per query")]
    TooManyHashes {
        /// The count found.
        count: usize,
    },
    /// A manifest name length outside 1..=255.
    #[error("manifest name length {len} is outside 1..={MAX_NAME_LEN}")]
    BadNameLen {
        /// The length found.
        len: usize,
    },
    /// A manifest name that is not UTF-8.
    #[error("manifest name is not UTF-8")]
    NameNotUtf8,
    /// Bytes after the last field of a query or answer.
    #[error("{count} trailing bytes after the message")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// An answer bit set past its count.
    #[error("answer bitmap has bits set past its count")]
    BitmapPadding,
}

/// A parsed handoff message; every slice borrows the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// `KVQ1`.
    Query(Hashes<'a>),
    /// `KVA1`.
    Answer(Answer<'a>),
    /// `KVC1`.
    Chunk {
        /// The chunk's hash (1..=64 bytes).
        hash: &'a [u8],
        /// The chunk's bytes.
        data: &'a [u8],
    },
    /// `KVM1`.
    Manifest {
        /// The manifest's name (1..=255 bytes).
        name: &'a str,
        /// The chunks the manifest depends on.
        chunks: Hashes<'a>,
        /// The manifest's bytes.
        data: &'a [u8],
    },
}

/// A validated hash list (of a query or a manifest): its hashes, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hashes<'a> {
    count: usize,
    /// The entries (u8 length + hash each), already checked.
    entries: &'a [u8],
}

impl<'a> Hashes<'a> {
    /// How many hashes the list holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The hashes, in order.
    pub fn hashes(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut rest = self.entries;
        std::iter::from_fn(move || {
            let (&len, tail) = rest.split_first()?;
            let (hash, tail) = tail.split_at(usize::from(len));
            rest = tail;
            Some(hash)
        })
    }
}

/// A validated answer: bit i says whether the receiver holds the query's hash i.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    query: &'a [u8; CHECKSUM_LEN],
    count: usize,
    bitmap: &'a [u8],
}

impl<'a> Answer<'a> {
    /// The checksum of the query frame this answers (its MRDN header's checksum field).
    pub fn query(&self) -> &'a [u8; CHECKSUM_LEN] {
        self.query
    }

    /// How many hashes the answer covers.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it covers none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether the receiver holds hash `i` (false past the count).
    pub fn has(&self, i: usize) -> bool {
        i < self.count && self.bitmap[i / 8] & (1 << (i % 8)) != 0
    }
}

/// Reads fields off the front of a body, each short read a typed error.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], MessageError> {
        if self.0.len() < n {
            return Err(MessageError::Truncated {
                what,
                needed: n,
                available: self.0.len(),
            });
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, MessageError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, MessageError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, MessageError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn count(&mut self) -> Result<usize, MessageError> {
        let count = self.u32("count")? as usize;
        if count > MAX_QUERY_HASHES {
            return Err(MessageError::TooManyHashes { count });
        }
        Ok(count)
    }

    fn hash(&mut self) -> Result<&'a [u8], MessageError> {
        let len = usize::from(self.u8("hash length")?);
        check_hash_len(len)?;
        self.take(len, "hash")
    }

    /// A hash list: u32 count, then count × (u8 length, hash).
    fn hashes(&mut self) -> Result<Hashes<'a>, MessageError> {
        let count = self.count()?;
        let entries = self.0;
        for _ in 0..count {
            self.hash()?;
        }
        let entries = &entries[..entries.len() - self.0.len()];
        Ok(Hashes { count, entries })
    }

    fn end(self) -> Result<(), MessageError> {
        match self.0.len() {
            0 => Ok(()),
            count => Err(MessageError::TrailingBytes { count }),
        }
    }
}

fn check_hash_len(len: usize) -> Result<(), MessageError> {
    if (1..=MAX_HASH_LEN).contains(&len) {
        Ok(())
    } else {
        Err(MessageError::BadHashLen { len })
    }
}

/// Parses a frame body as a handoff message, strictly.
pub fn parse(body: &[u8]) -> Result<Message<'_>, MessageError> {
    let (magic, rest) = body
        .split_first_chunk::<4>()
        .ok_or_else(|| MessageError::UnknownKind {
            found: body.to_vec(),
        })?;
    let mut cur = Cursor(rest);
    match *magic {
        QUERY_MAGIC => {
            let hashes = cur.hashes()?;
            cur.end()?;
            Ok(Message::Query(hashes))
        }
        ANSWER_MAGIC => {
            let query = cur
                .take(CHECKSUM_LEN, "query checksum")?
                .try_into()
                .expect("CHECKSUM_LEN bytes");
            let count = cur.count()?;
            let bitmap = cur.take(count.div_ceil(8), "bitmap")?;
            cur.end()?;
            if count % 8 != 0 && bitmap[count / 8] >> (count % 8) != 0 {
                return Err(MessageError::BitmapPadding);
            }
            Ok(Message::Answer(Answer {
                query,
                count,
                bitmap,
            }))
        }
        CHUNK_MAGIC => {
            let hash = cur.hash()?;
            Ok(Message::Chunk { hash, data: cur.0 })
        }
        MANIFEST_MAGIC => {
            let len = usize::from(cur.u16("name length")?);
            check_name_len(len)?;
            let name = std::str::from_utf8(cur.take(len, "name")?)
                .map_err(|_| MessageError::NameNotUtf8)?;
            let chunks = cur.hashes()?;
            Ok(Message::Manifest {
                name,
                chunks,
                data: cur.0,
            })
        }
        _ => Err(MessageError::UnknownKind {
            found: magic.to_vec(),
        }),
    }
}

fn check_name_len(len: usize) -> Result<(), MessageError> {
    if (1..=MAX_NAME_LEN).contains(&len) {
        Ok(())
    } else {
        Err(MessageError::BadNameLen { len })
    }
}

fn check_count(count: usize) -> Result<u32, MessageError> {
    if count > MAX_QUERY_HASHES {
        return Err(MessageError::TooManyHashes { count });
    }
    Ok(count as u32)
}

/// The encoded length of a hash list, checked; nothing is written.
fn hashes_len<'h>(hashes: impl ExactSizeIterator<Item = &'h [u8]>) -> Result<usize, MessageError> {
    check_count(hashes.len())?;
    let mut len = 4;
    for hash in hashes {
        check_hash_len(hash.len())?;
        len += 1 + hash.len();
    }
    Ok(len)
}

/// Appends a hash list already checked by [`hashes_len`].
fn put_hashes<'h>(hashes: impl ExactSizeIterator<Item = &'h [u8]>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
    for hash in hashes {
        out.push(hash.len() as u8);
        out.extend_from_slice(hash);
    }
}

/// Appends a query listing `hashes` to `out`. Nothing is appended on error.
pub fn encode_query<'h>(
    hashes: impl ExactSizeIterator<Item = &'h [u8]> + Clone,
    out: &mut Vec<u8>,
) -> Result<(), MessageError> {
    out.reserve(4 + hashes_len(hashes.clone())?);
    out.extend_from_slice(&QUERY_MAGIC);
    put_hashes(hashes, out);
    Ok(())
}

/// Bytes of the body of an answer of `count` bits.
pub fn answer_len(count: usize) -> usize {
    8 + CHECKSUM_LEN + count.div_ceil(8)
}

/// Appends the answer to the query framed with checksum `query`: `count` bits, bit i =
/// `has(i)`.
pub fn encode_answer(
    query: &[u8; CHECKSUM_LEN],
    count: usize,
    mut has: impl FnMut(usize) -> bool,
    out: &mut Vec<u8>,
) -> Result<(), MessageError> {
    let count32 = check_count(count)?;
    out.reserve(answer_len(count));
    out.extend_from_slice(&ANSWER_MAGIC);
    out.extend_from_slice(query);
    out.extend_from_slice(&count32.to_le_bytes());
    let start = out.len();
    out.resize(start + count.div_ceil(8), 0);
    for i in 0..count {
        if has(i) {
            out[start + i / 8] |= 1 << (i % 8);
        }
    }
    Ok(())
}

/// Appends a chunk message to `out`.
pub fn encode_chunk(hash: &[u8], data: &[u8], out: &mut Vec<u8>) -> Result<(), MessageError> {
    check_hash_len(hash.len())?;
    out.reserve(5 + hash.len() + data.len());
    out.extend_from_slice(&CHUNK_MAGIC);
    out.push(hash.len() as u8);
    out.extend_from_slice(hash);
    out.extend_from_slice(data);
    Ok(())
}

/// Appends a manifest message to `out`: its name, the chunks it names, its bytes. Nothing is
/// appended on error.
pub fn encode_manifest<'h>(
    name: &str,
    chunks: impl ExactSizeIterator<Item = &'h [u8]> + Clone,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), MessageError> {
    check_name_len(name.len())?;
    out.reserve(6 + name.len() + hashes_len(chunks.clone())? + data.len());
    out.extend_from_slice(&MANIFEST_MAGIC);
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    put_hashes(chunks, out);
    out.extend_from_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query checksum for the answers here.
    const Q: [u8; CHECKSUM_LEN] = [0xaa; CHECKSUM_LEN];

    /// `KVA1`, [`Q`], then `rest`.
    fn answer_body(rest: &[u8]) -> Vec<u8> {
        [&b"KVA1"[..], &Q, rest].concat()
    }

    fn query(hashes: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_query(hashes.iter().copied(), &mut out).unwrap();
        out
    }

    #[test]
    fn query_wire_layout_and_round_trip() {
        let body = query(&[b"ab", &[7; 64]]);
        let mut expected = b"KVQ1\x02\x00\x00\x00\x02ab\x40".to_vec();
        expected.extend_from_slice(&[7; 64]);
        assert_eq!(body, expected);
        let Message::Query(q) = parse(&body).unwrap() else {
            panic!("not a query")
        };
        assert_eq!(q.len(), 2);
        assert_eq!(q.hashes().collect::<Vec<_>>(), [&b"ab"[..], &[7; 64][..]]);
    }

    #[test]
    fn answer_bits_are_lsb_first() {
        let mut body = Vec::new();
        encode_answer(&Q, 10, |i| i == 0 || i == 9, &mut body).unwrap();
        assert_eq!(body, answer_body(b"\x0a\x00\x00\x00\x01\x02"));
        assert_eq!(body.len(), answer_len(10));
        let Message::Answer(a) = parse(&body).unwrap() else {
            panic!("not an answer")
        };
        assert_eq!(a.query(), &Q);
        let bits: Vec<bool> = (0..11).map(|i| a.has(i)).collect();
        assert_eq!(
            bits,
            [
                true, false, false, false, false, false, false, false, false, true, false
            ]
        );
    }

    #[test]
    fn chunk_and_manifest_wire_layout() {
        let mut body = Vec::new();
        encode_chunk(b"h", b"", &mut body).unwrap();
        assert_eq!(body, b"KVC1\x01h");
        assert_eq!(
            parse(&body).unwrap(),
            Message::Chunk {
                hash: b"h",
                data: b""
            }
        );
        body.clear();
        encode_manifest("slot", [&b"h1"[..], b"h"].into_iter(), b"m\x00", &mut body).unwrap();
        assert_eq!(body, b"KVM1\x04\x00slot\x02\x00\x00\x00\x02h1\x01hm\x00");
        let Message::Manifest { name, chunks, data } = parse(&body).unwrap() else {
            panic!("not a manifest")
        };
        assert_eq!((name, data), ("slot", &b"m\x00"[..]));
        assert_eq!(chunks.hashes().collect::<Vec<_>>(), [&b"h1"[..], b"h"]);
    }

    #[test]
    fn every_malformed_body_has_its_error() {
        let cases: [(&[u8], MessageError); 14] = [
            (
                b"KV",
                MessageError::UnknownKind {
                    found: b"KV".to_vec(),
                },
            ),
            (
                b"KVX1\x00",
                MessageError::UnknownKind {
                    found: b"KVX1".to_vec(),
                },
            ),
            (
                b"KVQ1\x01\x00",
                MessageError::Truncated {
                    what: "count",
                    needed: 4,
                    available: 2,
                },
            ),
            (
                b"KVQ1\x01\x00\x10\x00",
                MessageError::TooManyHashes { count: 0x10_0001 },
            ),
            (
                b"KVQ1\x01\x00\x00\x00\x00",
                MessageError::BadHashLen { len: 0 },
            ),
            (
                b"KVQ1\x01\x00\x00\x00\x41",
                MessageError::BadHashLen { len: 65 },
            ),
            (
                b"KVQ1\x01\x00\x00\x00\x02a",
                MessageError::Truncated {
                    what: "hash",
                    needed: 2,
                    available: 1,
                },
            ),
            (
                b"KVQ1\x00\x00\x00\x00z",
                MessageError::TrailingBytes { count: 1 },
            ),
            (
                b"KVA1\x01\x00\x00\x00\x01",
                MessageError::Truncated {
                    what: "query checksum",
                    needed: 16,
                    available: 5,
                },
            ),
            (b"KVM1\x00\x00", MessageError::BadNameLen { len: 0 }),
            (b"KVM1\x02\x00\xff\xfe", MessageError::NameNotUtf8),
            (
                b"KVM1\x01\x00n\x01\x00",
                MessageError::Truncated {
                    what: "count",
                    needed: 4,
                    available: 2,
                },
            ),
            (
                b"KVM1\x01\x00n\x02\x00\x00\x00\x01a\x00",
                MessageError::BadHashLen { len: 0 },
            ),
            (
                b"KVM1\x01\x00n\x01\x00\x10\x00",
                MessageError::TooManyHashes { count: 0x10_0001 },
            ),
        ];
        for (body, error) in cases {
            assert_eq!(parse(body), Err(error), "{body:02x?}");
        }
        let answers = [
            (&b"\x03\x00\x00\x00\x08"[..], MessageError::BitmapPadding),
            (
                b"\x08\x00\x00\x00\x01\x00",
                MessageError::TrailingBytes { count: 1 },
            ),
        ];
        for (rest, error) in answers {
            assert_eq!(parse(&answer_body(rest)), Err(error), "{rest:02x?}");
        }
        assert_eq!(parse(b"KVC1\x00"), Err(MessageError::BadHashLen { len: 0 }));
    }

    #[test]
    fn encoders_refuse_what_the_parser_would() {
        let mut out = b"kept".to_vec();
        let long = [0u8; 65];
        let empty: &[u8] = &[];
        assert_eq!(
            encode_query([&b"ok"[..], &long[..]].into_iter(), &mut out),
            Err(MessageError::BadHashLen { len: 65 })
        );
        assert_eq!(
            encode_chunk(empty, b"x", &mut out),
            Err(MessageError::BadHashLen { len: 0 })
        );
        assert_eq!(
            encode_manifest(&"n".repeat(256), std::iter::empty(), b"", &mut out),
            Err(MessageError::BadNameLen { len: 256 })
        );
        assert_eq!(
            encode_manifest("n", [&long[..]].into_iter(), b"", &mut out),
            Err(MessageError::BadHashLen { len: 65 })
        );
        assert_eq!(
            encode_answer(&Q, MAX_QUERY_HASHES + 1, |_| true, &mut out),
            Err(MessageError::TooManyHashes {
                count: MAX_QUERY_HASHES + 1
            })
        );
        assert_eq!(out, b"kept", "a refused encode appends nothing");
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn hash() -> impl Strategy<Value = Vec<u8>> {
            proptest::collection::vec(any::<u8>(), 1..=MAX_HASH_LEN)
        }

        proptest! {
            #[test]
            fn queries_round_trip(hashes in proptest::collection::vec(hash(), 0..40)) {
                let mut body = b"prefix".to_vec();
                encode_query(hashes.iter().map(Vec::as_slice), &mut body).unwrap();
                let Message::Query(q) = parse(&body[6..]).unwrap() else { panic!("not a query") };
                prop_assert_eq!(q.hashes().map(<[u8]>::to_vec).collect::<Vec<_>>(), hashes);
            }

            #[test]
            fn answers_round_trip(bits in proptest::collection::vec(any::<bool>(), 0..100)) {
                let mut body = Vec::new();
                encode_answer(&[7; CHECKSUM_LEN], bits.len(), |i| bits[i], &mut body).unwrap();
                let Message::Answer(a) = parse(&body).unwrap() else { panic!("not an answer") };
                prop_assert_eq!(a.len(), bits.len());
                prop_assert_eq!((0..bits.len()).map(|i| a.has(i)).collect::<Vec<_>>(), bits);
            }

            #[test]
            fn chunks_and_manifests_round_trip(
                hash in hash(),
                listed in proptest::collection::vec(hash(), 0..10),
                name in "[a-z\u{e9}/]{1,60}",
                data in proptest::collection::vec(any::<u8>(), 0..300),
            ) {
                let mut body = Vec::new();
                encode_chunk(&hash, &data, &mut body).unwrap();
                prop_assert_eq!(parse(&body).unwrap(), Message::Chunk { hash: &hash, data: &data });
                body.clear();
                encode_manifest(&name, listed.iter().map(Vec::as_slice), &data, &mut body).unwrap();
                let Message::Manifest { name: got, chunks, data: got_data } = parse(&body).unwrap() else {
                    panic!("not a manifest")
                };
                prop_assert_eq!((got, got_data), (name.as_str(), data.as_slice()));
                prop_assert_eq!(chunks.hashes().map(<[u8]>::to_vec).collect::<Vec<_>>(), listed);
            }

            /// Any bytes, and any bytes behind a valid magic: an error or a message, never a
            /// panic; and whatever parses re-encodes to the same body (parsing is exact).
            #[test]
            fn garbage_never_panics(
                magic in prop_oneof![
                    Just(QUERY_MAGIC), Just(ANSWER_MAGIC), Just(CHUNK_MAGIC),
                    Just(MANIFEST_MAGIC), any::<[u8; 4]>(),
                ],
                rest in proptest::collection::vec(any::<u8>(), 0..200),
            ) {
                let body = [&magic[..], &rest].concat();
                if let Ok(message) = parse(&body) {
                    let mut again = Vec::new();
                    match message {
                        Message::Query(q) => encode_query(q.hashes().collect::<Vec<_>>().into_iter(), &mut again),
                        Message::Answer(a) => encode_answer(a.query(), a.len(), |i| a.has(i), &mut again),
                        Message::Chunk { hash, data } => encode_chunk(hash, data, &mut again),
                        Message::Manifest { name, chunks, data } => encode_manifest(
                            name, chunks.hashes().collect::<Vec<_>>().into_iter(), data, &mut again,
                        ),
                    }.unwrap();
                    prop_assert_eq!(again, body);
                }
                let _ = parse(&rest);
            }
        }
    }
}
