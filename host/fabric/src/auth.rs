//! The shared key of a handoff (docs/fabric.md, "Slot handoff", "Trust"): a 32-byte key the two
//! hosts hold and the fabric guest never sees. With a key, every handoff message travels
//! wrapped:
//!
//! `KVS1` | sender_nonce[16] | server_nonce[16] | tag[32] | inner message (KVQ1/KVA1/KVC1/KVM1)
//!
//! tag = keyed Blake3 over `kvwasm-fabric-v2`, the direction (`S` sender → server, `R` server →
//! sender), the MRDN frame's tier byte, both nonces and the inner message. The sender picks a fresh sender nonce per send;
//! the server a fresh server nonce per connection, first sent back in its answers. Chunks and
//! manifests must carry the connection's server nonce (no replay from another connection) and
//! replies the send's sender nonce (no replay from another send), so neither a guest nor any
//! other client of the server can make up, alter or replay a message the other side accepts,
//! nor relabel its tier.

use std::fmt;

use kvwasm_mrdn::Tier;

use crate::handoff::MessageError;

/// Magic of a wrapped (keyed) message.
pub const SEALED_MAGIC: [u8; 4] = *b"KVS1";
/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a tag.
pub const TAG_LEN: usize = 32;
/// Bytes the wrapper adds before the inner message.
pub const WRAP_LEN: usize = 4 + 2 * NONCE_LEN + TAG_LEN;
/// What every tag covers first, so these tags mean nothing to any other use of the key. `v2`:
/// the tag covers the frame's tier byte (`v1` tags did not), so a `v1` peer fails with "bad
/// tag" rather than accepting tags of another layout.
const CONTEXT: &[u8] = b"kvwasm-fabric-v2";

/// A nonce; all zeros is "no server nonce yet" (a query's).
pub type Nonce = [u8; NONCE_LEN];

/// Which way a message goes; part of its tag, so a reply cannot be pushed back as a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sender → server (queries, chunks, manifests).
    ToServer,
    /// Server → sender (answers and the chunk and manifest echoes).
    ToSender,
}

impl Direction {
    fn byte(self) -> u8 {
        match self {
            Direction::ToServer => b'S',
            Direction::ToSender => b'R',
        }
    }
}

/// The shared key. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Key([u8; KEY_LEN]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// A key from its 32 bytes.
    pub fn new(bytes: [u8; KEY_LEN]) -> Key {
        Key(bytes)
    }

    /// A key from 64 hex characters (surrounding whitespace ignored). The error never
    /// contains the text.
    pub fn from_hex(text: &str) -> Result<Key, String> {
        let text = text.trim();
        let mut bytes = [0; KEY_LEN];
        if text.len() != 2 * KEY_LEN {
            return Err(format!(
                "must be {} hex characters (a {KEY_LEN}-byte key), not {}",
                2 * KEY_LEN,
                text.chars().count()
            ));
        }
        hex::decode_to_slice(text, &mut bytes).map_err(|_| "must be hex digits only".to_owned())?;
        Ok(Key(bytes))
    }

    /// The key held by the environment variable `name` (`--key-env NAME`). The error names
    /// the variable, never its value.
    pub fn from_env(name: &str) -> Result<Key, String> {
        let value = std::env::var_os(name)
            .ok_or_else(|| format!("--key-env: environment variable {name} is not set"))?;
        let text = value.to_str().ok_or_else(|| {
            format!("--key-env: environment variable {name} must be hex digits only")
        })?;
        Key::from_hex(text).map_err(|why| format!("--key-env: environment variable {name} {why}"))
    }

    /// The tag of `inner` going `direction` in a frame of `tier`, with these nonces.
    pub fn tag(
        &self,
        direction: Direction,
        tier: Tier,
        sender: &Nonce,
        server: &Nonce,
        inner: &[u8],
    ) -> blake3::Hash {
        blake3::Hasher::new_keyed(&self.0)
            .update(CONTEXT)
            .update(&[direction.byte(), tier.as_byte()])
            .update(sender)
            .update(server)
            .update(inner)
            .finalize()
    }
}

/// A fresh random nonce (the OS's generator).
pub fn nonce() -> Result<Nonce, String> {
    let mut nonce = [0; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| format!("no random nonce: {e}"))?;
    Ok(nonce)
}

/// How to wrap the messages going one way.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'k> {
    /// The shared key.
    pub key: &'k Key,
    /// Which way they go.
    pub direction: Direction,
    /// The tier of the frames they go in (the MRDN header's byte, outside the body).
    pub tier: Tier,
    /// The send's nonce.
    pub sender: Nonce,
    /// The connection's nonce (zeros in a query).
    pub server: Nonce,
}

impl Envelope<'_> {
    /// Appends to `out` the wrapper (when there is an envelope) and the message `encode`
    /// appends, then fills in the tag. Nothing is appended on error.
    pub fn append<E>(
        envelope: Option<&Self>,
        out: &mut Vec<u8>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(env) = envelope else {
            return encode(out);
        };
        let start = out.len();
        out.extend_from_slice(&SEALED_MAGIC);
        out.extend_from_slice(&env.sender);
        out.extend_from_slice(&env.server);
        out.extend_from_slice(&[0; TAG_LEN]);
        if let Err(e) = encode(out) {
            out.truncate(start);
            return Err(e);
        }
        let (head, inner) = out[start..].split_at_mut(WRAP_LEN);
        let tag = env
            .key
            .tag(env.direction, env.tier, &env.sender, &env.server, inner);
        head[WRAP_LEN - TAG_LEN..].copy_from_slice(tag.as_bytes());
        Ok(())
    }
}

/// A wrapped message, parsed but not yet checked ([`Sealed::verify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed<'a> {
    /// The send's nonce.
    pub sender: &'a Nonce,
    /// The connection's nonce (zeros in a query).
    pub server: &'a Nonce,
    tag: &'a [u8; TAG_LEN],
    /// The inner message.
    pub inner: &'a [u8],
}

impl<'a> Sealed<'a> {
    /// The wrapped message `body` holds, or `None` when it is not wrapped (no `KVS1` magic).
    pub fn parse(body: &'a [u8]) -> Result<Option<Sealed<'a>>, MessageError> {
        if !body.starts_with(&SEALED_MAGIC) {
            return Ok(None);
        }
        let Some((head, inner)) = body.split_at_checked(WRAP_LEN) else {
            return Err(MessageError::Truncated {
                what: "KVS1 wrapper",
                needed: WRAP_LEN,
                available: body.len(),
            });
        };
        let field = |at: usize| &head[at..at + NONCE_LEN];
        Ok(Some(Sealed {
            sender: field(4).try_into().expect("NONCE_LEN bytes"),
            server: field(4 + NONCE_LEN).try_into().expect("NONCE_LEN bytes"),
            tag: head[WRAP_LEN - TAG_LEN..]
                .try_into()
                .expect("TAG_LEN bytes"),
            inner,
        }))
    }

    /// Whether its tag is `key`'s for `direction` in a frame of `tier` (compared in constant
    /// time).
    pub fn verify(&self, key: &Key, direction: Direction, tier: Tier) -> bool {
        key.tag(direction, tier, self.sender, self.server, self.inner)
            == blake3::Hash::from(*self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Key {
        Key::new([byte; KEY_LEN])
    }

    #[test]
    fn the_tag_is_keyed_blake3_of_the_documented_bytes() {
        let env = Envelope {
            key: &key(7),
            direction: Direction::ToServer,
            tier: Tier::ThinkActive,
            sender: [1; NONCE_LEN],
            server: [2; NONCE_LEN],
        };
        let mut body = Vec::new();
        Envelope::append(Some(&env), &mut body, |out| {
            out.extend_from_slice(b"KVC1\x01hdata");
            Ok::<_, ()>(())
        })
        .unwrap();
        let mut input = b"kvwasm-fabric-v2S\x01".to_vec();
        input.extend_from_slice(&[1; NONCE_LEN]);
        input.extend_from_slice(&[2; NONCE_LEN]);
        input.extend_from_slice(b"KVC1\x01hdata");
        let tag = blake3::keyed_hash(&[7; KEY_LEN], &input);
        let expected = [
            &b"KVS1"[..],
            &[1; NONCE_LEN],
            &[2; NONCE_LEN],
            tag.as_bytes(),
            b"KVC1\x01hdata",
        ]
        .concat();
        assert_eq!(body, expected);

        let sealed = Sealed::parse(&body).unwrap().unwrap();
        assert_eq!(sealed.inner, b"KVC1\x01hdata");
        let active = Tier::ThinkActive;
        assert!(sealed.verify(&key(7), Direction::ToServer, active));
        assert!(
            !sealed.verify(&key(7), Direction::ToSender, active),
            "direction"
        );
        assert!(!sealed.verify(&key(8), Direction::ToServer, active), "key");
        for other in [Tier::ThinkComplete, Tier::OutputCritical] {
            assert!(
                !sealed.verify(&key(7), Direction::ToServer, other),
                "{other:?}"
            );
        }
        for at in [4, 4 + NONCE_LEN, WRAP_LEN - 1, body.len() - 1] {
            let mut altered = body.clone();
            altered[at] ^= 1;
            let sealed = Sealed::parse(&altered).unwrap().unwrap();
            assert!(
                !sealed.verify(&key(7), Direction::ToServer, active),
                "byte {at}"
            );
        }
        assert_eq!(Sealed::parse(b"KVC1\x01h"), Ok(None));
        assert!(Sealed::parse(&body[..WRAP_LEN - 1]).is_err());
    }

    #[test]
    fn a_failed_encode_appends_nothing() {
        let env = Envelope {
            key: &key(1),
            direction: Direction::ToSender,
            tier: Tier::OutputCritical,
            sender: [0; NONCE_LEN],
            server: [0; NONCE_LEN],
        };
        let mut out = b"kept".to_vec();
        let result = Envelope::append(Some(&env), &mut out, |out| {
            out.push(9);
            Err("no")
        });
        assert_eq!((result, out.as_slice()), (Err("no"), &b"kept"[..]));
    }

    #[test]
    fn malformed_keys_are_refused_without_echoing_them() {
        let good = "0123456789abcdef".repeat(4);
        assert!(Key::from_hex(&format!(" {good}\n")).is_ok());
        for bad in [
            "secret-but-short".to_owned(),
            good.replace('a', "z"),
            format!("{good}00"),
        ] {
            let err = Key::from_hex(&bad).unwrap_err();
            assert!(!err.contains(&bad) && !err.contains("secret"), "{err}");
        }
        assert_eq!(
            Key::from_hex("abc").unwrap_err(),
            "must be 64 hex characters (a 32-byte key), not 3"
        );
        assert_eq!(format!("{:?}", key(0xab)), "Key(..)");
        let err = Key::from_env("KVWASM_TEST_KEY_THAT_IS_NOT_SET").unwrap_err();
        assert_eq!(
            err,
            "--key-env: environment variable KVWASM_TEST_KEY_THAT_IS_NOT_SET is not set"
        );
    }
}
