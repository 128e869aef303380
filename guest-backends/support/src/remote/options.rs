//! What a remote store is told by its settings, and where its keys live.

use crate::{Error, Result, Settings, validate};

/// When `put-chunk` asks the server whether a hash is already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupCheck {
    /// At every `put-chunk` of a hash this handle has not seen: the return
    /// code is exact (1 for any chunk already stored), one round trip each.
    Put,
    /// Only at flush, in one batch: `put-chunk` returns 1 only for hashes
    /// this handle has already staged or seen.
    Flush,
    /// Never asked apart from the write: a short chunk is written as it is
    /// put, by a write that keeps a stored one (Redis `SET NX`), answered
    /// later; a long one as with `Flush`. `put-chunk` returns 1 only for
    /// hashes this handle has put or any handle on the namespace saw stored
    /// (`known-chunks`). The fastest cold save of short chunks; a remote
    /// that cannot write only absent keys refuses it.
    Write,
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
    /// Keys of the first `prefetch-chunks` request (`prefetch_wave`,
    /// default 32); later ones are sized by the bytes they bring.
    pub prefetch_wave: usize,
    /// `dedup_check`: `put` (default), `flush` or `write`.
    pub dedup: DedupCheck,
}

impl StoreOptions {
    pub fn from_settings(settings: &Settings) -> Result<StoreOptions> {
        let dedup = match settings.get("dedup_check").unwrap_or("put") {
            "put" => DedupCheck::Put,
            "flush" => DedupCheck::Flush,
            "write" => DedupCheck::Write,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "setting `dedup_check` = {other:?}: expected \"put\", \"flush\" or \"write\""
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
            prefetch_wave: settings.parse_or("prefetch_wave", 32)?.max(1),
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
        let mut key = self.space("chunks", 2 * hash.len());
        validate::push_hex(&mut key, hash);
        key
    }

    pub fn manifest(&self, name: &str) -> String {
        self.join("manifests", name)
    }

    fn join(&self, space: &str, leaf: &str) -> String {
        let mut key = self.space(space, leaf.len());
        key.push_str(leaf);
        key
    }

    /// `<base>/<space>/` (`<space>/` without a base), with room for a
    /// `leaf` bytes long leaf.
    fn space(&self, space: &str, leaf: usize) -> String {
        let mut key = String::with_capacity(self.base.len() + space.len() + 2 + leaf);
        if !self.base.is_empty() {
            key.push_str(&self.base);
            key.push('/');
        }
        key.push_str(space);
        key.push('/');
        key
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
        assert_eq!(o.prefetch_wave, 32);
        let write = Settings::from_pairs([("dedup_check", "write")]);
        assert_eq!(
            StoreOptions::from_settings(&write).unwrap().dedup,
            DedupCheck::Write
        );
        let bad = Settings::from_pairs([("dedup_check", "never")]);
        assert!(StoreOptions::from_settings(&bad).is_err());
    }
}
