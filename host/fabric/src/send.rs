//! `kvwasm fabric send`: hands a slot (a manifest and the chunks it names) from a source store
//! to a `kvwasm fabric serve` at the other end of a fabric, sending only the chunks the
//! receiver lacks (docs/fabric.md, "Slot handoff"):
//!
//! 1. read the manifest; its chunk list is the demo manifest's keys, or a given list;
//! 2. ask which chunks the receiver holds (KVQ1 → KVA1, each answer naming its query);
//! 3. prefetch and send each missing chunk (KVC1), releasing each handle at once;
//! 4. send the manifest (KVM1, listing its chunks, so the receiver refuses it unless it holds
//!    them all, whatever the answers said) and read it back: responses come in order, so this
//!    also surfaces any earlier refused chunk;
//! 5. report what was sent.
//!
//! Every frame is encoded into one reused buffer, and every frame pulled back is decoded
//! strictly here, whatever the transport already checked. With a key ([`send_keyed`]) every
//! message is wrapped and tagged ([`crate::auth`]), and every reply must carry the receiver's
//! tag, this send's nonce and the connection's nonce, so the fabric cannot make up, alter or
//! replay what the receiver says: the success line is then the receiver's word. A send that fails releases every
//! handle it still holds, so a long-lived fabric does not fill up with a failed send's frames.

use std::collections::HashSet;
use std::time::Instant;

use kvwasm_host::{KvError, StoreHandle};
use kvwasm_mrdn::{CHECKSUM_LEN, DecodeError, DecodeMode, EncodeError, HEADER_LEN, Tier};
use thiserror::Error;

use crate::auth::{self, Direction, Envelope, Key, Nonce, Sealed};
use crate::handoff::{self, Message, MessageError};

/// Moves frames to the receiver: the fabric guest's `transport` interface, as the host exposes
/// it (or a native client of the link protocol).
pub trait Transport {
    /// Why a call failed.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Sends one encoded frame; returns a handle for [`Transport::pull`].
    fn push(&self, frame: &[u8]) -> Result<u64, Self::Error>;
    /// The frame kept under `handle`.
    fn pull(&self, handle: u64) -> Result<Vec<u8>, Self::Error>;
    /// Forgets `handle`.
    fn release(&self, handle: u64) -> Result<(), Self::Error>;
}

/// The host's fabric guests. Pulled frames were verified by the host; [`send`] decodes them
/// again anyway. Only answers and the manifest are pulled, so copying them out is cheap.
impl Transport for kvwasm_host::fabric::Fabric {
    type Error = KvError;

    fn push(&self, frame: &[u8]) -> Result<u64, KvError> {
        kvwasm_host::fabric::Fabric::push(self, frame)
    }

    fn pull(&self, handle: u64) -> Result<Vec<u8>, KvError> {
        Ok(kvwasm_host::fabric::Fabric::pull(self, handle)?
            .as_bytes()
            .to_vec())
    }

    fn release(&self, handle: u64) -> Result<(), KvError> {
        kvwasm_host::fabric::Fabric::release(self, handle)
    }
}

/// Most hashes per query frame: 65,536 × 65 bytes stays far below the receiver's default frame
/// limit of 64 MiB (one query of the protocol's maximum, 2^20 hashes, may not).
pub const QUERY_BATCH: usize = 1 << 16;
/// Missing chunks prefetched from the source at a time.
pub const PREFETCH_BATCH: usize = 256;

/// What to send.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// The manifest's name, in the source store and at the receiver.
    pub manifest: String,
    /// The chunks the manifest names; `None` reads them from the demo manifest format.
    pub hashes: Option<Vec<Vec<u8>>>,
    /// The tier every frame is labelled with.
    pub tier: Tier,
}

/// What a send did (the JSON line of `kvwasm fabric send`).
#[derive(Debug, Clone, PartialEq)]
pub struct SendReport {
    /// The manifest's name.
    pub manifest: String,
    /// Distinct chunks the manifest names.
    pub chunks: usize,
    /// Chunks sent (the receiver lacked them).
    pub sent: usize,
    /// Chunks the receiver already held.
    pub skipped: usize,
    /// Bytes of the chunks sent.
    pub chunk_bytes_sent: u64,
    /// Bytes of every frame pushed: queries, chunks, the manifest.
    pub frame_bytes: u64,
    /// Wall time of the whole send.
    pub seconds: f64,
}

impl SendReport {
    /// Chunk bytes sent per second, in MB (10^6 bytes).
    pub fn mb_per_s(&self) -> f64 {
        self.chunk_bytes_sent as f64 / 1e6 / self.seconds.max(1e-9)
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "manifest": self.manifest,
            "chunks": self.chunks,
            "sent": self.sent,
            "skipped": self.skipped,
            "chunk_bytes_sent": self.chunk_bytes_sent,
            "frame_bytes": self.frame_bytes,
            "seconds": self.seconds,
            "mb_per_s": self.mb_per_s(),
        })
    }
}

/// Why a send stopped; each message carries its cause (no `source()` chain, so `{:#}` does
/// not print it twice). Nothing is rolled back: chunks already sent stay (they are
/// content-addressed and harmless), and the manifest is only ever the last frame.
#[derive(Debug, Error)]
pub enum SendError<E: std::error::Error + 'static> {
    /// The source store failed.
    #[error("source store: {op}: {error}")]
    Source {
        /// The operation.
        op: &'static str,
        /// The store's error.
        error: KvError,
    },
    /// The manifest's chunk list cannot be read.
    #[error("manifest {name:?}: {why} (pass --hashes FILE for other manifest formats)")]
    ManifestFormat {
        /// The manifest.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// A handoff message cannot be encoded (a hash or name out of range).
    #[error("cannot encode the {what}: {error}")]
    Message {
        /// The message.
        what: &'static str,
        /// Why.
        error: MessageError,
    },
    /// A frame cannot be encoded (a body over 4 GiB).
    #[error("cannot frame the {what}: {error}")]
    Encode {
        /// The message.
        what: &'static str,
        /// Why.
        error: EncodeError,
    },
    /// The fabric failed.
    #[error("fabric: {step}: {error}")]
    Fabric {
        /// What the sender was doing.
        step: &'static str,
        /// The transport's error.
        error: E,
    },
    /// A frame pulled back fails strict decoding.
    #[error("{step}: the fabric returned a bad frame: {error}")]
    BadFrame {
        /// What the sender was doing.
        step: &'static str,
        /// Why.
        error: DecodeError,
    },
    /// A reply is a valid frame but not the expected message.
    #[error("{step}: unexpected reply: {why}")]
    BadReply {
        /// What the sender was doing.
        step: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A keyed send has no random nonce.
    #[error("{0}")]
    Random(String),
}

/// The chunk keys of a demo manifest (`kvwasm demo`): `b"ggsq"`, u32 version, u32 tokens,
/// u32 count, then count × 8-byte keys, and nothing else.
pub fn demo_manifest_hashes(manifest: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let (header, keys) = manifest.split_at_checked(16).ok_or_else(|| {
        format!(
            "{} bytes, shorter than a demo manifest header",
            manifest.len()
        )
    })?;
    if &header[..4] != b"ggsq" {
        return Err(format!(
            "magic {:02x?} is not the demo manifest's \"ggsq\"",
            &header[..4]
        ));
    }
    let count = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as usize;
    if keys.len() != count * 8 {
        return Err(format!(
            "header says {count} keys, but {} bytes of keys follow",
            keys.len()
        ));
    }
    Ok(keys.chunks(8).map(<[u8]>::to_vec).collect())
}

/// A `--hashes` file: one hex hash per line (blank lines ignored).
pub fn parse_hash_list(text: &str) -> Result<Vec<Vec<u8>>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            let hash = hex::decode(line.trim()).map_err(|e| format!("line {}: {e}", i + 1))?;
            match hash.len() {
                1..=handoff::MAX_HASH_LEN => Ok(hash),
                n => Err(format!("line {}: a hash of {n} bytes (1..=64)", i + 1)),
            }
        })
        .collect()
}

/// Sends the slot `options` names from `source` over `fabric`, unauthenticated.
pub fn send<T: Transport>(
    source: &StoreHandle,
    fabric: &T,
    options: &SendOptions,
) -> Result<SendReport, SendError<T::Error>> {
    send_keyed(source, fabric, options, None)
}

/// Sends the slot `options` names from `source` over `fabric`; with `key` (the receiver's),
/// every message is wrapped and tagged, and every reply must be the receiver's for this send.
pub fn send_keyed<T: Transport>(
    source: &StoreHandle,
    fabric: &T,
    options: &SendOptions,
    key: Option<&Key>,
) -> Result<SendReport, SendError<T::Error>> {
    let started = Instant::now();
    let name = options.manifest.as_str();
    let tier = options.tier;
    let src = |op| move |error| SendError::Source { op, error };
    let net = |step| move |error| SendError::Fabric { step, error };

    let manifest = source.get_manifest(name).map_err(src("get_manifest"))?;
    let listed = match &options.hashes {
        Some(hashes) => hashes.clone(),
        None => {
            demo_manifest_hashes(manifest.as_slice()).map_err(|why| SendError::ManifestFormat {
                name: name.to_owned(),
                why,
            })?
        }
    };
    // Each chunk once, in the order first listed.
    let mut seen = HashSet::new();
    let first: Vec<bool> = listed.iter().map(|h| seen.insert(h.as_slice())).collect();
    drop(seen);
    let hashes: Vec<Vec<u8>> = listed
        .into_iter()
        .zip(first)
        .filter_map(|(hash, first)| first.then_some(hash))
        .collect();

    let mut replies = Replies {
        key,
        tier,
        sender: match key {
            Some(_) => auth::nonce().map_err(SendError::Random)?,
            None => [0; auth::NONCE_LEN],
        },
        server: None,
    };
    let mut buf = Vec::new();
    let mut live = Live {
        fabric,
        handles: Vec::new(),
        frame_bytes: 0,
    };

    // 2. Ask: every query is pushed before the first answer is pulled. At least one, even for
    // no chunks: its answer carries the receiver's nonce, which a keyed send needs.
    let mut batches: Vec<&[Vec<u8>]> = hashes.chunks(QUERY_BATCH).collect();
    if batches.is_empty() {
        batches.push(&[]);
    }
    let query_envelope = replies.envelope([0; auth::NONCE_LEN]);
    let mut queries = Vec::new();
    for batch in batches {
        frame(&mut buf, tier, "query", query_envelope.as_ref(), |body| {
            handoff::encode_query(batch.iter().map(Vec::as_slice), body)
        })?;
        let checksum: [u8; CHECKSUM_LEN] = buf[HEADER_LEN - CHECKSUM_LEN..HEADER_LEN]
            .try_into()
            .expect("CHECKSUM_LEN bytes");
        queries.push((batch.len(), checksum, live.push(&buf, "push query")?));
    }
    let mut held = Vec::with_capacity(hashes.len());
    for (len, checksum, handle) in queries {
        let reply = fabric.pull(handle).map_err(net("pull answer"))?;
        match replies.open(&reply, "pull answer")? {
            Message::Answer(answer) if answer.query() != &checksum => {
                return Err(SendError::BadReply {
                    step: "pull answer",
                    why: format!(
                        "an answer to another query (checksum {}, expected {})",
                        hex::encode(answer.query()),
                        hex::encode(checksum)
                    ),
                });
            }
            Message::Answer(answer) if answer.len() == len => {
                held.extend((0..len).map(|i| answer.has(i)));
            }
            other => return Err(bad_reply("pull answer", &other, "an answer for the query")),
        }
        live.release(handle, "release answer")?;
    }
    let chunks = hashes.len();
    let missing: Vec<&[u8]> = hashes
        .iter()
        .zip(held)
        .filter_map(|(hash, held)| (!held).then_some(hash.as_slice()))
        .collect();

    // 3. Send what is missing, bound to the connection that answered.
    let envelope = replies.envelope(replies.server.unwrap_or_default());
    let mut chunk_bytes_sent = 0u64;
    for batch in missing.chunks(PREFETCH_BATCH) {
        let owned: Vec<Vec<u8>> = batch.iter().map(|h| h.to_vec()).collect();
        source
            .prefetch_chunks(&owned)
            .map_err(src("prefetch_chunks"))?;
        for hash in batch {
            let data = source.get_chunk(hash).map_err(src("get_chunk"))?;
            frame(&mut buf, tier, "chunk", envelope.as_ref(), |body| {
                handoff::encode_chunk(hash, data.as_slice(), body)
            })?;
            let handle = live.push(&buf, "push chunk")?;
            live.release(handle, "release chunk")?;
            chunk_bytes_sent += data.len() as u64;
        }
    }

    // 4. The manifest, listing its chunks, read back.
    frame(&mut buf, tier, "manifest", envelope.as_ref(), |body| {
        handoff::encode_manifest(
            name,
            hashes.iter().map(Vec::as_slice),
            manifest.as_slice(),
            body,
        )
    })?;
    let handle = live.push(&buf, "push manifest")?;
    let reply = fabric.pull(handle).map_err(net("pull manifest"))?;
    match replies.open(&reply, "pull manifest")? {
        Message::Manifest {
            name: got, data, ..
        } if got == name && data == manifest.as_slice() => {}
        other => {
            return Err(bad_reply("pull manifest", &other, "the manifest as sent"));
        }
    }
    live.release(handle, "release manifest")?;

    Ok(SendReport {
        manifest: name.to_owned(),
        chunks,
        sent: missing.len(),
        skipped: chunks - missing.len(),
        chunk_bytes_sent,
        frame_bytes: live.frame_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The handles a send holds; whatever is left when it is dropped (the send failed) is
/// released, best effort.
struct Live<'f, T: Transport> {
    fabric: &'f T,
    handles: Vec<u64>,
    /// Bytes of every frame pushed.
    frame_bytes: u64,
}

impl<T: Transport> Live<'_, T> {
    fn push(&mut self, frame: &[u8], step: &'static str) -> Result<u64, SendError<T::Error>> {
        self.frame_bytes += frame.len() as u64;
        let handle = self
            .fabric
            .push(frame)
            .map_err(|error| SendError::Fabric { step, error })?;
        self.handles.push(handle);
        Ok(handle)
    }

    /// Forgets `handle` first: a release that fails is not retried on drop.
    fn release(&mut self, handle: u64, step: &'static str) -> Result<(), SendError<T::Error>> {
        if let Some(i) = self.handles.iter().rposition(|&h| h == handle) {
            self.handles.swap_remove(i);
        }
        self.fabric
            .release(handle)
            .map_err(|error| SendError::Fabric { step, error })
    }
}

impl<T: Transport> Drop for Live<'_, T> {
    fn drop(&mut self) {
        for &handle in &self.handles {
            // Best effort: the send already failed with the error that matters.
            let _ = self.fabric.release(handle);
        }
    }
}

/// Replaces `buf` with the frame of the body `encode` appends, wrapped in `envelope` if any.
fn frame<E: std::error::Error>(
    buf: &mut Vec<u8>,
    tier: Tier,
    what: &'static str,
    envelope: Option<&Envelope<'_>>,
    encode: impl FnOnce(&mut Vec<u8>) -> Result<(), MessageError>,
) -> Result<(), SendError<E>> {
    buf.clear();
    buf.resize(HEADER_LEN, 0);
    Envelope::append(envelope, buf, encode).map_err(|error| SendError::Message { what, error })?;
    kvwasm_mrdn::seal_in_place(tier, buf).map_err(|error| SendError::Encode { what, error })
}

/// What a send expects of the receiver's replies.
struct Replies<'k> {
    key: Option<&'k Key>,
    /// The tier this send labels its frames with, which the receiver's replies repeat.
    tier: Tier,
    /// This send's nonce (zeros without a key).
    sender: Nonce,
    /// The connection's nonce, from the first answer.
    server: Option<Nonce>,
}

impl<'k> Replies<'k> {
    /// How this send wraps what it pushes with server nonce `server` (nothing without a key).
    fn envelope(&self, server: Nonce) -> Option<Envelope<'k>> {
        self.key.map(|key| Envelope {
            key,
            direction: Direction::ToServer,
            tier: self.tier,
            sender: self.sender,
            server,
        })
    }

    /// The message of a reply, decoded strictly; with a key, only if the receiver tagged it
    /// for this send on the connection that answered first (which it then learns).
    fn open<'a, E: std::error::Error>(
        &mut self,
        reply: &'a [u8],
        step: &'static str,
    ) -> Result<Message<'a>, SendError<E>> {
        let bad = |why: &str| SendError::BadReply {
            step,
            why: why.to_owned(),
        };
        let frame = kvwasm_mrdn::decode_with(reply, DecodeMode::Strict)
            .map_err(|error| SendError::BadFrame { step, error })?;
        let mut body = frame.body;
        if let Some(key) = self.key {
            let sealed = Sealed::parse(body)
                .map_err(|e| bad(&e.to_string()))?
                .ok_or_else(|| bad("not wrapped (KVS1), but this send has a key"))?;
            if !sealed.verify(key, Direction::ToSender, frame.tier) {
                return Err(bad(
                    "its tag is not the receiver's under this send's key: forged or altered \
                     by the fabric, or the receiver has another key",
                ));
            }
            if sealed.sender != &self.sender {
                return Err(bad(
                    "it answers another send (not this send's nonce): replayed by the fabric",
                ));
            }
            match self.server {
                None => self.server = Some(*sealed.server),
                Some(server) if &server != sealed.server => {
                    return Err(bad(
                        "it comes from another connection than the first answer (server nonce)",
                    ));
                }
                Some(_) => {}
            }
            body = sealed.inner;
        }
        handoff::parse(body).map_err(|e| bad(&e.to_string()))
    }
}

fn bad_reply<E: std::error::Error>(
    step: &'static str,
    got: &Message<'_>,
    expected: &str,
) -> SendError<E> {
    let got = match got {
        Message::Query(q) => format!("a query of {} hashes", q.len()),
        Message::Answer(a) => format!("an answer of {} bits", a.len()),
        Message::Chunk { hash, data } => {
            format!("chunk {} ({} bytes)", hex::encode(hash), data.len())
        }
        Message::Manifest { name, data, .. } => {
            format!("manifest {name:?} ({} bytes)", data.len())
        }
    };
    SendError::BadReply {
        step,
        why: format!("{got}, expected {expected}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_manifests_list_their_keys() {
        let mut m = b"ggsq".to_vec();
        for word in [4u32, 100, 2] {
            m.extend_from_slice(&word.to_le_bytes());
        }
        m.extend_from_slice(b"aaaaaaaabbbbbbbb");
        assert_eq!(
            demo_manifest_hashes(&m).unwrap(),
            [b"aaaaaaaa".to_vec(), b"bbbbbbbb".to_vec()]
        );
        assert!(
            demo_manifest_hashes(&m[..m.len() - 1])
                .unwrap_err()
                .contains("2 keys")
        );
        assert!(
            demo_manifest_hashes(b"kvcrash-slot v1\nname")
                .unwrap_err()
                .contains("magic")
        );
        assert!(
            demo_manifest_hashes(b"ggsq")
                .unwrap_err()
                .contains("shorter")
        );
    }

    #[test]
    fn hash_lists_are_hex_lines() {
        assert_eq!(
            parse_hash_list("00ff\n\n  abcd \n").unwrap(),
            [vec![0, 255], vec![0xab, 0xcd]]
        );
        assert!(
            parse_hash_list("00\nxyz\n")
                .unwrap_err()
                .starts_with("line 2")
        );
        assert!(
            parse_hash_list(&"00".repeat(65))
                .unwrap_err()
                .contains("65 bytes")
        );
    }
}
