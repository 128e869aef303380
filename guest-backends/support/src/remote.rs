//! The store logic shared by remote backends (Redis, S3), written once.
//!
//! A backend implements [`Remote`]: four batched operations on string keys,
//! each one network round trip (a Redis pipeline, a set of concurrent HTTP
//! requests). [`RemoteStore`] turns them into a kv-store handle the way
//! MinIO's MemKV client does:
//!
//! * `put-chunk` stages the bytes in guest memory. It answers
//!   `already-present` from what this handle has staged or seen, else asks
//!   the server (one existence check per unknown hash, so the return code is
//!   exact) unless the operator chose `dedup_check = "flush"`.
//! * `flush` (and `put-manifest`, which flushes first) sends one batched
//!   existence check for the staged hashes, then one batched write of only
//!   the missing ones. Only then is the manifest written, so a reader never
//!   sees a manifest before its chunks. Staged chunks survive a failed
//!   flush: after a server restart the next `put-manifest` retries them.
//! * `prefetch-chunks` fetches in one batch into a bounded cache that the
//!   following `get-chunk` calls drain.
//!
//! Keys: `<prefix>/<namespace>/chunks/<hex hash>` and
//! `<prefix>/<namespace>/manifests/<name>`. Manifest names cannot contain
//! `/`, so the two key spaces never meet, whatever the namespace.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use crate::{
    Error, GuestStore, Payload, PayloadExt, PutOutcome, Result, Settings, Store, validate,
};

/// A key-value service reached over the network. Every method is one
/// round trip (or one wave of concurrent requests) and fails with
/// `unavailable` when the service cannot be reached in time.
pub trait Remote: Sized + 'static {
    /// Connect (or prepare to) with the backend's settings.
    fn connect(settings: &Settings) -> Result<Self>;
    /// Which of `keys` exist.
    fn exists(&mut self, keys: &[String]) -> Result<Vec<bool>>;
    /// Store every `(key, value)`; `Ok` only if all were stored.
    fn put(&mut self, items: &[(String, &[u8])]) -> Result<()>;
    /// The value of each key, `None` where it is missing.
    fn get(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>>;
    /// Remove `key`; a missing key is success.
    fn delete(&mut self, key: &str) -> Result<()>;
}

/// When `put-chunk` asks the server whether a hash is already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupCheck {
    /// At every `put-chunk` of a hash this handle has not seen: the return
    /// code is exact (1 for any chunk already stored), one round trip each.
    Put,
    /// Only at flush, in one batch: `put-chunk` returns 1 only for hashes
    /// this handle has already staged or seen. The fastest cold save.
    Flush,
}

/// Tunables, from settings.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Key prefix before the namespace (`prefix`, default `kvwasm`).
    pub prefix: String,
    /// Staged bytes that trigger a flush before the next put
    /// (`max_pending_mib`, default 64).
    pub max_pending_bytes: usize,
    /// Bytes `prefetch-chunks` may hold for later gets
    /// (`prefetch_cache_mib`, default 128).
    pub prefetch_budget_bytes: usize,
    /// `dedup_check`: `put` (default) or `flush`.
    pub dedup: DedupCheck,
}

impl StoreOptions {
    pub fn from_settings(settings: &Settings) -> Result<StoreOptions> {
        let dedup = match settings.get("dedup_check").unwrap_or("put") {
            "put" => DedupCheck::Put,
            "flush" => DedupCheck::Flush,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "setting `dedup_check` = {other:?}: expected \"put\" or \"flush\""
                )));
            }
        };
        let mib = |key, default: usize| -> Result<usize> {
            Ok(settings.parse_or(key, default)?.saturating_mul(1 << 20))
        };
        Ok(StoreOptions {
            prefix: settings.get("prefix").unwrap_or("kvwasm").to_owned(),
            max_pending_bytes: mib("max_pending_mib", 64)?,
            prefetch_budget_bytes: mib("prefetch_cache_mib", 128)?,
            dedup,
        })
    }
}

/// Where a handle's chunks and manifests live in the remote key space.
#[derive(Clone, Debug)]
pub struct KeySpace {
    base: String,
}

impl KeySpace {
    pub fn new(prefix: &str, namespace: &str) -> KeySpace {
        let parts: Vec<&str> = [prefix.trim_matches('/'), namespace]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect();
        KeySpace {
            base: parts.join("/"),
        }
    }

    pub fn chunk(&self, hash: &[u8]) -> String {
        self.join("chunks", &validate::hash_hex(hash))
    }

    pub fn manifest(&self, name: &str) -> String {
        self.join("manifests", name)
    }

    fn join(&self, space: &str, leaf: &str) -> String {
        if self.base.is_empty() {
            format!("{space}/{leaf}")
        } else {
            format!("{}/{space}/{leaf}", self.base)
        }
    }
}

/// Hashes a handle knows to be stored, so repeated saves skip the server.
/// Bounded: forgotten wholesale when full (a forgotten hash costs one
/// existence check, never a wrong answer).
const MAX_KNOWN: usize = 1 << 20;

#[derive(Default)]
struct Staging {
    /// Chunks accepted but not yet written, in put order.
    pending: Vec<(Vec<u8>, Vec<u8>)>,
    /// Hash → its position in `pending`.
    pending_index: HashMap<Vec<u8>, usize>,
    pending_bytes: usize,
    known: HashSet<Vec<u8>>,
    prefetched: HashMap<Vec<u8>, Vec<u8>>,
    prefetched_bytes: usize,
}

impl Staging {
    fn remember(&mut self, hash: Vec<u8>) {
        if self.known.len() >= MAX_KNOWN {
            self.known.clear();
        }
        self.known.insert(hash);
    }

    fn staged(&self, hash: &[u8]) -> Option<&[u8]> {
        let at = *self.pending_index.get(hash)?;
        Some(&self.pending[at].1)
    }
}

/// One open handle on a [`Remote`]: export it as the backend's `Store`.
pub struct RemoteStore<R> {
    remote: RefCell<R>,
    keys: KeySpace,
    options: StoreOptions,
    staging: RefCell<Staging>,
    /// Round trips since the last manifest, for the log line.
    round_trips: Cell<u32>,
}

impl<R: Remote> RemoteStore<R> {
    fn remote(&self) -> std::cell::RefMut<'_, R> {
        self.round_trips.set(self.round_trips.get() + 1);
        self.remote.borrow_mut()
    }

    /// Write the staged chunks: one existence check, one write of the
    /// missing ones. Returns (staged, already present).
    fn write_pending(&self) -> Result<(usize, usize)> {
        let mut staging = self.staging.borrow_mut();
        if staging.pending.is_empty() {
            return Ok((0, 0));
        }
        let keys: Vec<String> = staging
            .pending
            .iter()
            .map(|(h, _)| self.keys.chunk(h))
            .collect();
        let present = self.remote().exists(&keys)?;
        let missing: Vec<(String, &[u8])> = staging
            .pending
            .iter()
            .zip(keys)
            .zip(&present)
            .filter(|(_, there)| !**there)
            .map(|(((_, data), key), _)| (key, data.as_slice()))
            .collect();
        if !missing.is_empty() {
            self.remote().put(&missing)?;
        }
        let staged = staging.pending.len();
        let skipped = staged - missing.len();
        let pending = std::mem::take(&mut staging.pending);
        staging.pending_index.clear();
        staging.pending_bytes = 0;
        for (hash, _) in pending {
            staging.remember(hash);
        }
        Ok((staged, skipped))
    }
}

impl<R: Remote> GuestStore for RemoteStore<R> {
    fn open(namespace: String) -> Result<Store> {
        validate::namespace(&namespace)?;
        let settings = Settings::load()?;
        let options = StoreOptions::from_settings(&settings)?;
        let remote = R::connect(&settings)?;
        Ok(Store::new(RemoteStore {
            remote: RefCell::new(remote),
            keys: KeySpace::new(&options.prefix, &namespace),
            options,
            staging: RefCell::default(),
            round_trips: Cell::new(0),
        }))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome> {
        validate::hash(&hash)?;
        {
            let staging = self.staging.borrow();
            if staging.pending_index.contains_key(&hash) || staging.known.contains(&hash) {
                return Ok(PutOutcome::AlreadyPresent);
            }
        }
        if self.options.dedup == DedupCheck::Put
            && self.remote().exists(&[self.keys.chunk(&hash)])?[0]
        {
            self.staging.borrow_mut().remember(hash);
            return Ok(PutOutcome::AlreadyPresent);
        }
        let len = usize::try_from(data.len()).unwrap_or(usize::MAX);
        if self.staging.borrow().pending_bytes.saturating_add(len) > self.options.max_pending_bytes
        {
            self.write_pending()?;
        }
        let bytes = data.to_vec();
        let mut staging = self.staging.borrow_mut();
        staging.pending_bytes += bytes.len();
        let at = staging.pending.len();
        staging.pending_index.insert(hash.clone(), at);
        staging.pending.push((hash, bytes));
        Ok(PutOutcome::Stored)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        validate::hash(&hash)?;
        {
            let mut staging = self.staging.borrow_mut();
            if let Some(bytes) = staging.staged(&hash) {
                return Ok(Payload::new(bytes));
            }
            if let Some(bytes) = staging.prefetched.remove(&hash) {
                staging.prefetched_bytes -= bytes.len();
                return Ok(Payload::new(&bytes));
            }
        }
        let value = self
            .remote()
            .get(&[self.keys.chunk(&hash)])?
            .pop()
            .flatten();
        let bytes = value.ok_or(Error::NotFound)?;
        self.staging.borrow_mut().remember(hash);
        Ok(Payload::new(&bytes))
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        validate::manifest_name(&name)?;
        let (staged, skipped) = self.write_pending()?;
        let bytes = data.to_vec();
        self.remote().put(&[(self.keys.manifest(&name), &bytes)])?;
        eprintln!(
            "put-manifest {name:?}: {staged} staged chunks ({skipped} already stored), {} round trips",
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
        value.map(|b| Payload::new(&b)).ok_or(Error::NotFound)
    }

    fn delete_manifest(&self, name: String) -> Result<()> {
        validate::manifest_name(&name)?;
        self.remote().delete(&self.keys.manifest(&name))
    }

    fn prefetch_chunks(&self, hashes: Vec<Vec<u8>>) -> Result<()> {
        hashes.iter().try_for_each(|h| validate::hash(h))?;
        let wanted: Vec<Vec<u8>> = {
            let staging = self.staging.borrow();
            let mut seen = HashSet::new();
            hashes
                .into_iter()
                .filter(|h| {
                    !staging.pending_index.contains_key(h)
                        && !staging.prefetched.contains_key(h)
                        && seen.insert(h.clone())
                })
                .collect()
        };
        if wanted.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = wanted.iter().map(|h| self.keys.chunk(h)).collect();
        let values = self.remote().get(&keys)?;
        let mut staging = self.staging.borrow_mut();
        for (hash, value) in wanted.into_iter().zip(values) {
            let Some(bytes) = value else { continue };
            if staging.prefetched_bytes + bytes.len() > self.options.prefetch_budget_bytes {
                break;
            }
            staging.prefetched_bytes += bytes.len();
            staging.remember(hash.clone());
            staging.prefetched.insert(hash, bytes);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.write_pending().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_spaces_never_meet() {
        let ks = KeySpace::new("kvwasm", "team/model");
        assert_eq!(ks.chunk(&[0xab, 0x01]), "kvwasm/team/model/chunks/ab01");
        assert_eq!(ks.manifest("slot0"), "kvwasm/team/model/manifests/slot0");
        assert_eq!(KeySpace::new("", "").manifest("m"), "manifests/m");
        assert_eq!(KeySpace::new("/p/", "").chunk(&[1]), "p/chunks/01");
    }

    #[test]
    fn options_from_settings() {
        let o = StoreOptions::from_settings(&Settings::from_pairs([
            ("dedup_check", "flush"),
            ("max_pending_mib", "8"),
        ]))
        .unwrap();
        assert_eq!(o.dedup, DedupCheck::Flush);
        assert_eq!(o.max_pending_bytes, 8 << 20);
        assert_eq!(o.prefix, "kvwasm");
        let bad = Settings::from_pairs([("dedup_check", "never")]);
        assert!(StoreOptions::from_settings(&bad).is_err());
    }
}
