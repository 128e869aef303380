//! The store logic shared by remote backends (Redis, S3), written once.
//!
//! A backend implements [`Remote`]: four batched operations on string keys,
//! each one network round trip (a Redis pipeline, a set of concurrent HTTP
//! requests). [`RemoteStore`] turns them into a kv-store handle the way
//! MinIO's MemKV client does:
//!
//! * `put-chunk` answers `already-present` from what this handle has
//!   staged or any instance on the namespace saw (below), else asks the
//!   server (one existence check per unknown
//!   hash, so the return code is exact) unless the operator chose
//!   `dedup_check = "flush"` or `"write"`, which ask nothing at put time.
//! * The chunk's bytes are kept past the call (the host lends them for it
//!   only): a value of [`LONG_VALUE`] or more as a host copy
//!   (`payload-streams.copy`) if the [`Remote`] sends payloads
//!   ([`Remote::SENDS_PAYLOADS`]), so it never enters linear memory;
//!   anything else in guest memory.
//! * A [`Remote`] that can write a key only if it is absent (Redis `SET
//!   NX`) writes a short chunk ([`Remote::WRITE_THROUGH_BELOW`]) *through*
//!   in `put-chunk` with `dedup_check = "put"`: one round trip both stores
//!   it and answers exactly, and nothing is staged.
//! * A chunk the server was just found not to hold is *written behind* if
//!   the [`Remote`] can ([`Remote::put_behind`], S3): its write starts
//!   during `put-chunk` and is answered later, with at most a window of
//!   writes in flight, as a native client streams a save; its bytes are
//!   dropped once the server has them. A write that fails is staged, as
//!   below, and retried by the flush. With `dedup_check = "write"` a short
//!   chunk ([`Remote::WRITE_THROUGH_BELOW`]) is written behind unchecked:
//!   the remote's write keeps a chunk already stored (Redis `SET NX`, a
//!   pipeline the consumer's puts keep filling). Otherwise
//!   (`dedup_check = "flush"`, a long chunk with `"write"`, or a remote
//!   that can do neither) the chunk is staged until the flush.
//! * `flush` (and `put-manifest`, which flushes first) waits for every
//!   write behind, then sends one batched existence check for the staged
//!   hashes and one batched write of only the missing ones. Only then is
//!   the manifest written, so a reader never sees a manifest before its
//!   chunks. Staged chunks survive a failed flush: after a server restart
//!   the next `put-manifest` retries them.
//! * Chunks written at put time (through or behind) are known from then
//!   on and not checked again at the flush: a store that drops a chunk
//!   between its put and the manifest evicts or expires chunks, which
//!   breaks manifests anyway (next point).
//! * What the server acknowledged holding (a put it answered, an existence
//!   check, a get) is remembered in the host's `known-chunks` record of
//!   this backend and namespace, not in the instance: idle release drops
//!   instances after `idle_release_ms`, and the first save after a pause
//!   would otherwise ask about every chunk again (a round trip each). So
//!   every instance and handle on the namespace, for the life of the
//!   process, answers a hash any of them saw without asking.
//! * Chunks the server may have dropped since this handle saw them (Redis
//!   eviction or a TTL, an S3 lifecycle rule, an operator's `FLUSHDB`):
//!   every hash `put-chunk` answered `already-present` for without staging
//!   it is *vouched for*,
//!   and the next flush re-checks it in the same existence round trip as
//!   the staged ones (a warm save is two round trips: this check and the
//!   manifest). A vouched chunk that is gone is written again if its bytes
//!   are still in the prefetch cache; otherwise the flush, and so the
//!   `put-manifest`, fails with `io` naming it, and the whole record of the
//!   namespace is forgotten (the server lost data it held, so anything
//!   else remembered may be gone too): putting the chunks again asks the
//!   server and stores them. Nothing is published naming a chunk
//!   that was gone at that check; a store that evicts chunks *after* a
//!   manifest names them still breaks that manifest, so keep Redis on
//!   `maxmemory-policy noeviction` and S3 `chunks/` without expiry.
//! * `prefetch-chunks` fetches in waves into a cache that the following
//!   `get-chunk` calls drain ([`crate::prefetch`]): at most
//!   `prefetch_cache_mib` in all, and at most
//!   [`IN_GUEST_BYTES`](crate::prefetch::IN_GUEST_BYTES) of short values
//!   in linear memory. The first wave asks for `prefetch_wave` keys
//!   (default 32); each later one for as many as the cache has room for
//!   at the average size fetched so far, so small chunks cost few round
//!   trips. What does not fit waits in order, and a get of a waiting hash
//!   fetches the next wave. Long values a [`Remote`] read into host
//!   payloads ([`Value::Payload`]) stay there, counted against the host's
//!   payload limit (`max_payload_mib`) rather than linear memory.
//!
//! Keys: `<prefix>/<namespace>/chunks/<hex hash>` and
//! `<prefix>/<namespace>/manifests/<name>`. Manifest names cannot contain
//! `/`, so the two key spaces never meet, whatever the namespace.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use crate::bindings::kvwasm::kv_store::known_chunks;
use crate::bindings::kvwasm::kv_store::payload_streams::copy;
use crate::prefetch::{Cached, Prefetch};
use crate::{
    Error, GuestStore, Payload, PayloadExt, PutOutcome, Result, Settings, Store, validate,
};

mod options;

pub use options::{DedupCheck, KeySpace, StoreOptions};

/// A key-value service reached over the network. Every method is one
/// round trip (or one wave of concurrent requests) and fails with
/// `unavailable` when the service cannot be reached in time.
pub trait Remote: Sized + 'static {
    /// Connect (or prepare to) with the backend's settings.
    fn connect(settings: &Settings) -> Result<Self>;
    /// Which of `keys` exist.
    fn exists(&mut self, keys: &[String]) -> Result<Vec<bool>>;
    /// Start writing `(key, value)` and return without waiting for the
    /// answer, which [`Remote::settle`] collects; the remote keeps `value`
    /// until then. `Err` gives the item back unwritten: this remote does
    /// not write behind (the default), so it is staged.
    fn put_behind(&mut self, key: String, value: Value) -> Result<(), (String, Value)> {
        Err((key, value))
    }
    /// Wait for every write [`Remote::put_behind`] started, and give back
    /// those that failed (or could not start), each with its value and why.
    fn settle(&mut self) -> Vec<(String, Value, Error)> {
        Vec::new()
    }
    /// Chunks shorter than this (none by default) are written through with
    /// [`Remote::put_if_absent`] when `dedup_check = "put"`: one round trip
    /// that both stores the chunk and answers whether it was there (Redis
    /// `SET NX`), instead of an existence check now and a write at the
    /// flush. Only short ones: a chunk already stored is sent for nothing,
    /// which costs no more than the round trip only while it is short.
    const WRITE_THROUGH_BELOW: usize = 0;
    /// Store `data` under `key` unless the key exists, in one round trip:
    /// `true` if this call stored it, `false` if the key was there. Called
    /// only for values shorter than [`Remote::WRITE_THROUGH_BELOW`].
    fn put_if_absent(&mut self, key: &str, data: &Payload) -> Result<bool> {
        let _ = (key, data);
        Err(Error::Io(
            "put_if_absent is not supported by this remote".into(),
        ))
    }
    /// Whether [`Remote::put`] sends a [`Value::Payload`] from host memory
    /// (`payload-streams.write-all`). If not, values are staged in guest
    /// memory, where `put` reads them without a copy.
    const SENDS_PAYLOADS: bool = false;
    /// Store every `(key, value)`; `Ok` only if all were stored.
    fn put(&mut self, items: &[(String, &Value)]) -> Result<()>;
    /// The value of each key, `None` where it is missing.
    fn get(&mut self, keys: &[String]) -> Result<Vec<Option<Value>>>;
    /// Remove `key`; a missing key is success.
    fn delete(&mut self, key: &str) -> Result<()>;
    /// Whether [`Remote::confirm_writes`] confirms anything (the operator
    /// asked for replicated writes): the store then keeps the hashes
    /// written since the last confirmation, to check them again if it
    /// fails.
    fn confirms_writes(&self) -> bool {
        false
    }
    /// Make sure every write acknowledged so far survives the loss of the
    /// server that took it (Redis `WAIT` for replicas). Called before a
    /// manifest is published, after it is written, and at a flush.
    fn confirm_writes(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Values at least this long move between the network and the consumer
/// through host payloads (`payload-streams`), never through linear memory.
pub const LONG_VALUE: usize = 64 << 10;

/// A value as a [`Remote`] received it, or as a handle staged it: in guest
/// memory, or (a long one) in a host payload, which goes to the consumer
/// or to the network without a copy (`payload-streams`).
pub enum Value {
    Bytes(Vec<u8>),
    Payload(Payload),
}

impl Value {
    /// A value staged from a `put-*` payload, which the host lends for the
    /// call only: a host copy if `in_host` and it is long (in guest memory
    /// if the host refuses the copy), else a copy in guest memory.
    fn stage(data: &Payload, in_host: bool) -> Value {
        let len = usize::try_from(data.len()).unwrap_or(usize::MAX);
        if in_host
            && len >= LONG_VALUE
            && let Ok(copy) = copy(data)
        {
            return Value::Payload(copy);
        }
        Value::Bytes(data.to_vec())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Value::Bytes(b) => b.len(),
            Value::Payload(p) => usize::try_from(p.len()).unwrap_or(usize::MAX),
        }
    }

    /// True for an empty value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value as a payload for the consumer (a copy only of bytes).
    fn into_payload(self) -> Payload {
        match self {
            Value::Bytes(b) => Payload::new(&b),
            Value::Payload(p) => p,
        }
    }

    /// A payload for the consumer that leaves the value in place (a staged
    /// chunk read back before its flush): a host copy of a payload.
    fn to_payload(&self) -> Payload {
        match self {
            Value::Bytes(b) => Payload::new(b),
            Value::Payload(p) => copy(p).unwrap_or_else(|_| Payload::new(&p.to_vec())),
        }
    }

    /// The bytes, in guest memory (a copy only of a payload).
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Value::Bytes(b) => Cow::Borrowed(b),
            Value::Payload(p) => Cow::Owned(p.to_vec()),
        }
    }
}

impl Cached for Value {
    fn bytes(&self) -> usize {
        self.len()
    }

    fn in_guest(&self) -> bool {
        matches!(self, Value::Bytes(_))
    }
}

/// Hashes one `known-chunks.remember` call may list (the WIT's bound).
const REMEMBER_PER_CALL: usize = 4096;

/// Record in the host's `known-chunks` that the server holds `hashes`.
fn remember(hashes: &[Vec<u8>]) {
    for batch in hashes.chunks(REMEMBER_PER_CALL) {
        known_chunks::remember(batch);
    }
}

#[derive(Default)]
struct Staging {
    /// Chunks accepted but not yet written, in put order.
    pending: Vec<(Vec<u8>, Value)>,
    /// Hash → its position in `pending`.
    pending_index: HashMap<Vec<u8>, usize>,
    pending_bytes: usize,
    /// Chunks written behind and not yet settled.
    behind: HashSet<Vec<u8>>,
    /// Hashes answered `already-present` without being staged since the
    /// last flush: a manifest may name them, so the flush re-checks them.
    vouched: HashSet<Vec<u8>>,
    /// Values fetched ahead of their gets, and hashes still to fetch.
    prefetch: Prefetch<Value>,
    /// Chunks written since the last [`Remote::confirm_writes`] (kept only
    /// if the remote confirms writes): if it fails, they are unreplicated.
    unconfirmed: Vec<Vec<u8>>,
    /// Chunks a confirmation did not cover (it failed, or a write of them
    /// was cut off before its answer): the next flush writes each again,
    /// present or not, from its bytes if at hand and else read back from
    /// the server, so the confirmation before the next manifest covers it.
    /// Checking only that they exist would not: a master holds a chunk its
    /// replicas may lack.
    unreplicated: HashSet<Vec<u8>>,
}

impl Staging {
    /// Hold a chunk for the next flush.
    fn stage(&mut self, hash: Vec<u8>, value: Value) {
        self.pending_bytes += value.len();
        self.pending_index.insert(hash.clone(), self.pending.len());
        self.pending.push((hash, value));
    }

    fn staged(&self, hash: &[u8]) -> Option<&Value> {
        let at = *self.pending_index.get(hash)?;
        Some(&self.pending[at].1)
    }
}

/// What [`RemoteStore::fetch_wave`] brought.
#[derive(Default)]
struct Wave {
    /// The head's value, if the wave had one (`Some(None)`: not stored).
    first: Option<Option<Value>>,
    /// Whether another wave may fit: all of this one was cached.
    more: bool,
}

/// One open handle on a [`Remote`]: export it as the backend's `Store`.
pub struct RemoteStore<R> {
    remote: RefCell<R>,
    keys: KeySpace,
    options: StoreOptions,
    staging: RefCell<Staging>,
    /// Round trips since the last manifest, for the log line.
    round_trips: Cell<u32>,
    /// Chunks written at put time (behind or through) since the last
    /// manifest, for the log line.
    written_at_put: Cell<u32>,
}

impl<R: Remote> RemoteStore<R> {
    /// Fetch the next prefetch wave into the cache; with `first` (a get's
    /// queued hash) at its head, whose value is handed back instead of
    /// cached. A value that does not fit goes back to the queue with the
    /// rest of its wave. A failed wave forgets the queue: prefetching is a
    /// hint, and the gets then ask the server alone.
    fn fetch_wave(&self, first: Option<&[u8]>) -> Result<Wave> {
        let budget = self.options.prefetch_budget_bytes;
        let wave =
            self.staging
                .borrow_mut()
                .prefetch
                .next_wave(first, self.options.prefetch_wave, budget);
        if wave.is_empty() {
            return Ok(Wave::default());
        }
        let keys: Vec<String> = wave.iter().map(|h| self.keys.chunk(h)).collect();
        let values = self.remote().get(&keys).inspect_err(|_| {
            self.staging.borrow_mut().prefetch.forget_queue();
        })?;
        let mut staging = self.staging.borrow_mut();
        let mut out = Wave::default();
        let mut uncached = Vec::new();
        let mut found = Vec::new();
        for (hash, value) in wave.into_iter().zip(values) {
            if value.is_some() {
                found.push(hash.clone());
            }
            if out.first.is_none() && first == Some(hash.as_slice()) {
                out.first = Some(value);
                continue;
            }
            // A missing chunk is not cached: its get asks the server.
            let Some(value) = value else { continue };
            if !uncached.is_empty() {
                uncached.push(hash);
                continue;
            }
            if let Err((hash, _)) = staging.prefetch.insert(hash, value, budget) {
                uncached.push(hash);
            }
        }
        remember(&found);
        out.more = uncached.is_empty();
        staging.prefetch.requeue(uncached);
        Ok(out)
    }

    /// Note chunks just written, for [`RemoteStore::confirm`].
    fn written(&self, hashes: &[Vec<u8>]) {
        if self.remote.borrow().confirms_writes() {
            self.staging
                .borrow_mut()
                .unconfirmed
                .extend(hashes.iter().cloned());
        }
    }

    /// [`Remote::confirm_writes`]; if it fails, the chunks written since
    /// the last confirmation may be gone (a failover lost them) or held by
    /// a master alone: the next flush writes them again before a manifest
    /// can name them (`unreplicated`), and what every instance remembers
    /// is forgotten.
    fn confirm(&self) -> Result<()> {
        if !self.remote.borrow().confirms_writes() {
            return Ok(());
        }
        match self.remote().confirm_writes() {
            Ok(()) => {
                self.staging.borrow_mut().unconfirmed.clear();
                Ok(())
            }
            Err(e) => {
                let mut staging = self.staging.borrow_mut();
                let unconfirmed = std::mem::take(&mut staging.unconfirmed);
                staging.unreplicated.extend(unconfirmed);
                known_chunks::forget_all();
                Err(e)
            }
        }
    }

    fn remote(&self) -> std::cell::RefMut<'_, R> {
        self.round_trips.set(self.round_trips.get() + 1);
        self.remote.borrow_mut()
    }

    /// Wait for the writes behind: the stored ones are known from now on,
    /// the failed ones staged with their bytes, for the flush to retry.
    fn settle(&self) {
        let behind = std::mem::take(&mut self.staging.borrow_mut().behind);
        if behind.is_empty() {
            return;
        }
        let mut failed: HashMap<String, (Value, Error)> = self
            .remote
            .borrow_mut()
            .settle()
            .into_iter()
            .map(|(key, value, e)| (key, (value, e)))
            .collect();
        if failed.is_empty() {
            let stored: Vec<Vec<u8>> = behind.into_iter().collect();
            self.written(&stored);
            remember(&stored);
            return;
        }
        let confirms = self.remote.borrow().confirms_writes();
        let mut staging = self.staging.borrow_mut();
        let mut first = None;
        let mut count = 0;
        let mut stored = Vec::new();
        for hash in behind {
            match failed.remove(&self.keys.chunk(&hash)) {
                Some((value, e)) => {
                    count += 1;
                    first.get_or_insert_with(|| format!("{}: {e}", validate::hash_hex(&hash)));
                    // The server may have stored it without answering: the
                    // flush then finds it present, and must write it anyway
                    // for a confirmation to cover it.
                    if confirms {
                        staging.unreplicated.insert(hash.clone());
                    }
                    staging.stage(hash, value);
                }
                None => stored.push(hash),
            }
        }
        drop(staging);
        self.written(&stored);
        remember(&stored);
        if let Some(first) = first {
            crate::log!(
                "{count} chunks written behind failed (e.g. {first}); staged for the flush"
            );
        }
    }

    /// Settle the writes behind, write the staged chunks, re-check the
    /// vouched ones and write the unreplicated ones again: one existence
    /// check for all, one read of unreplicated chunks whose bytes are not at
    /// hand, one write. Fails with `io` if a vouched or unreplicated chunk
    /// is gone and its bytes are not at hand.
    fn write_pending(&self) -> Result<Flushed> {
        self.settle();
        let mut staging = self.staging.borrow_mut();
        if staging.pending.is_empty()
            && staging.vouched.is_empty()
            && staging.unreplicated.is_empty()
        {
            return Ok(Flushed::default());
        }
        let vouched: Vec<Vec<u8>> = staging.vouched.iter().cloned().collect();
        let unreplicated: Vec<Vec<u8>> = staging
            .unreplicated
            .iter()
            .filter(|h| !staging.pending_index.contains_key(*h) && !staging.vouched.contains(*h))
            .cloned()
            .collect();
        let staged = staging.pending.len();
        let candidates: Vec<Candidate<'_>> = staging
            .pending
            .iter()
            .map(|(h, value)| (h.as_slice(), Some(value)))
            .chain(
                vouched
                    .iter()
                    .chain(&unreplicated)
                    .map(|h| (h.as_slice(), staging.prefetch.get(h))),
            )
            .collect();
        let keys: Vec<String> = candidates.iter().map(|(h, _)| self.keys.chunk(h)).collect();
        let present = self.remote().exists(&keys)?;
        let again = |at: usize| present[at] && staging.unreplicated.contains(candidates[at].0);
        // Unreplicated chunks the server holds and this handle has no bytes
        // of: read back, to be written again.
        let read_back_at: Vec<usize> = (0..candidates.len())
            .filter(|&at| again(at) && candidates[at].1.is_none())
            .collect();
        let read_back: Vec<Option<Value>> = if read_back_at.is_empty() {
            Vec::new()
        } else {
            let keys: Vec<String> = read_back_at.iter().map(|&at| keys[at].clone()).collect();
            self.remote().get(&keys)?
        };
        let mut missing: Vec<(String, &Value)> = Vec::new();
        let mut missing_staged = 0;
        let mut gone: Vec<Vec<u8>> = Vec::new();
        let mut written: Vec<Vec<u8>> = Vec::new();
        for (at, (key, (hash, bytes))) in keys.into_iter().zip(&candidates).enumerate() {
            let bytes = match read_back_at.binary_search(&at) {
                Ok(pos) => read_back[pos].as_ref(),
                Err(_) => *bytes,
            };
            match (present[at] && !again(at), bytes) {
                (true, _) => {}
                (false, Some(value)) => {
                    missing_staged += usize::from(at < staged);
                    missing.push((key, value));
                    written.push(hash.to_vec());
                }
                (false, None) => gone.push(hash.to_vec()),
            }
        }
        if !missing.is_empty() {
            self.remote().put(&missing)?;
            if self.remote.borrow().confirms_writes() {
                staging.unconfirmed.extend(written);
            }
        }
        staging.unreplicated.clear();
        let flushed = Flushed {
            staged,
            skipped: staged - missing_staged,
            rechecked: vouched.len(),
        };
        let pending: Vec<Vec<u8>> = std::mem::take(&mut staging.pending)
            .into_iter()
            .map(|(hash, _)| hash)
            .collect();
        staging.pending_index.clear();
        staging.pending_bytes = 0;
        staging.vouched.clear();
        if gone.is_empty() {
            remember(&pending);
            return Ok(flushed);
        }
        // The server lost chunks it held: whatever else was remembered may
        // be gone too, so every instance asks again from now on.
        known_chunks::forget_all();
        remember(&pending);
        let names: Vec<String> = gone.iter().take(8).map(|h| validate::hash_hex(h)).collect();
        // Still owed: every later flush checks them again and fails while
        // they are missing, so a retried manifest is not published over
        // them; a put that stores one again takes it off.
        staging.vouched.extend(gone.iter().cloned());
        Err(Error::Io(format!(
            "{} chunks this handle answered already-present for are gone from the server \
             (evicted or expired), e.g. {}; put them again before publishing a manifest that \
             names them",
            gone.len(),
            names.join(", ")
        )))
    }
}

/// A hash to check at a flush, with its value if the handle still holds
/// it.
type Candidate<'a> = (&'a [u8], Option<&'a Value>);

/// What a flush did, for the manifest's log line.
#[derive(Default)]
struct Flushed {
    /// Staged chunks checked.
    staged: usize,
    /// Of those, already on the server.
    skipped: usize,
    /// Vouched chunks re-checked.
    rechecked: usize,
}

/// Vouched hashes a handle holds before it re-checks them early.
const MAX_VOUCHED: usize = 1 << 16;

impl<R: Remote> GuestStore for RemoteStore<R> {
    fn open(namespace: String) -> Result<Store> {
        validate::namespace(&namespace)?;
        let settings = Settings::load()?;
        let options = StoreOptions::from_settings(&settings)?;
        if options.dedup == DedupCheck::Write && R::WRITE_THROUGH_BELOW == 0 {
            return Err(Error::InvalidArgument(
                "setting `dedup_check` = \"write\" needs a store that writes a key only if it \
                 is absent (Redis); use \"flush\""
                    .into(),
            ));
        }
        let remote = R::connect(&settings)?;
        Ok(Store::new(RemoteStore {
            remote: RefCell::new(remote),
            keys: KeySpace::new(&options.prefix, &namespace),
            options,
            staging: RefCell::default(),
            round_trips: Cell::new(0),
            written_at_put: Cell::new(0),
        }))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome> {
        validate::hash(&hash)?;
        {
            let staging = self.staging.borrow();
            if staging.pending_index.contains_key(&hash) || staging.behind.contains(&hash) {
                return Ok(PutOutcome::AlreadyPresent);
            }
        }
        let known = known_chunks::contains(&hash);
        let present = known
            || match self.options.dedup {
                DedupCheck::Put if data.len() < R::WRITE_THROUGH_BELOW as u64 => {
                    if self.remote().put_if_absent(&self.keys.chunk(&hash), data)? {
                        self.written_at_put.set(self.written_at_put.get() + 1);
                        self.written(std::slice::from_ref(&hash));
                        self.staging.borrow_mut().vouched.remove(&hash);
                        remember(std::slice::from_ref(&hash));
                        return Ok(PutOutcome::Stored);
                    }
                    true
                }
                DedupCheck::Put => self.remote().exists(&[self.keys.chunk(&hash)])?[0],
                DedupCheck::Flush | DedupCheck::Write => false,
            };
        if present {
            if !known {
                remember(std::slice::from_ref(&hash));
            }
            let vouched = {
                let mut staging = self.staging.borrow_mut();
                staging.vouched.insert(hash);
                staging.vouched.len()
            };
            if vouched >= MAX_VOUCHED {
                self.write_pending()?;
            }
            return Ok(PutOutcome::AlreadyPresent);
        }
        self.staging.borrow_mut().vouched.remove(&hash);
        let mut value = Value::stage(data, R::SENDS_PAYLOADS);
        // Just found missing (`put`), or short and sent unchecked by a write
        // that keeps a stored chunk (`write`): write it now if the remote can.
        let behind = match self.options.dedup {
            DedupCheck::Put => true,
            DedupCheck::Write => value.len() < R::WRITE_THROUGH_BELOW,
            DedupCheck::Flush => false,
        };
        if behind {
            let key = self.keys.chunk(&hash);
            match self.remote.borrow_mut().put_behind(key, value) {
                Ok(()) => {
                    self.round_trips.set(self.round_trips.get() + 1);
                    self.written_at_put.set(self.written_at_put.get() + 1);
                    self.staging.borrow_mut().behind.insert(hash);
                    return Ok(PutOutcome::Stored);
                }
                Err((_, unwritten)) => value = unwritten,
            }
        }
        let over = self
            .staging
            .borrow()
            .pending_bytes
            .saturating_add(value.len())
            > self.options.max_pending_bytes;
        if over {
            self.write_pending()?;
        }
        // Staged, it is checked as such at the flush.
        self.staging.borrow_mut().stage(hash, value);
        Ok(PutOutcome::Stored)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        validate::hash(&hash)?;
        if self.staging.borrow().behind.contains(&hash) {
            self.settle();
        }
        {
            let mut staging = self.staging.borrow_mut();
            if let Some(value) = staging.staged(&hash) {
                return Ok(value.to_payload());
            }
            if let Some(value) = staging.prefetch.take(&hash) {
                return Ok(value.into_payload());
            }
        }
        // Prefetched but not fetched yet: the next wave, this chunk first.
        if self.staging.borrow().prefetch.is_queued(&hash) {
            match self.fetch_wave(Some(&hash)) {
                Ok(Wave {
                    first: Some(value), ..
                }) => return value.map(Value::into_payload).ok_or(Error::NotFound),
                Ok(_) => {}
                Err(e) => crate::log!("a prefetch wave failed, gets now ask alone: {e}"),
            }
        }
        let value = self
            .remote()
            .get(&[self.keys.chunk(&hash)])?
            .pop()
            .flatten();
        let value = value.ok_or(Error::NotFound)?;
        remember(std::slice::from_ref(&hash));
        Ok(value.into_payload())
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        validate::manifest_name(&name)?;
        let Flushed {
            staged,
            skipped,
            rechecked,
        } = self.write_pending()?;
        // The chunks survive a failover before a manifest names them, and
        // the manifest does before the save is acknowledged.
        self.confirm()?;
        let manifest = Value::Bytes(data.to_vec());
        self.remote()
            .put(&[(self.keys.manifest(&name), &manifest)])?;
        self.confirm()?;
        crate::log!(
            "put-manifest {name:?}: {} chunks written at put time, {staged} staged chunks ({skipped} \
             already stored), {} round trips, {rechecked} dedup hits re-checked",
            self.written_at_put.replace(0),
            self.round_trips.replace(0)
        );
        Ok(())
    }

    fn get_manifest(&self, name: String) -> Result<Payload> {
        validate::manifest_name(&name)?;
        let value = self
            .remote()
            .get(&[self.keys.manifest(&name)])?
            .pop()
            .flatten();
        value.map(Value::into_payload).ok_or(Error::NotFound)
    }

    fn delete_manifest(&self, name: String) -> Result<()> {
        validate::manifest_name(&name)?;
        self.remote().delete(&self.keys.manifest(&name))
    }

    fn prefetch_chunks(&self, hashes: Vec<Vec<u8>>) -> Result<()> {
        hashes.iter().try_for_each(|h| validate::hash(h))?;
        // A chunk still being written would read as missing.
        let writing = {
            let behind = &self.staging.borrow().behind;
            !behind.is_empty() && hashes.iter().any(|h| behind.contains(h))
        };
        if writing {
            self.settle();
        }
        {
            let mut staging = self.staging.borrow_mut();
            let wanted: Vec<Vec<u8>> = hashes
                .into_iter()
                .filter(|h| !staging.pending_index.contains_key(h))
                .collect();
            staging.prefetch.start(wanted);
        }
        while self.fetch_wave(None)?.more {}
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.write_pending()?;
        self.confirm()
    }
}
