//! What a check runs against, and the helpers every check shares.

use std::path::Path;

use kv_store_abi::{Buffer, Handle, Library};

/// A check's finding when it does not pass.
#[derive(Debug)]
pub enum Finding {
    /// The backend broke the rule; the text says how.
    Violated(String),
    /// The rule does not apply to this backend (e.g. v2-only on a v1 vtable).
    NotApplicable(String),
}

/// `Ok(detail)` when the rule held.
pub type Outcome = Result<String, Finding>;

/// Shorthand for a violation.
pub fn violated(why: impl Into<String>) -> Finding {
    Finding::Violated(why.into())
}

/// One check's view of the backend under test.
pub struct Ctx<'a> {
    pub lib: &'a Library,
    pub lib_path: &'a Path,
    pub uri: &'a str,
    /// Unique per `kvwasm check` run: keys and names never collide with
    /// earlier runs against a persistent store.
    pub run_id: &'a str,
    pub check: &'static str,
    /// A fast subset: smaller sizes, fewer iterations.
    pub quick: bool,
    /// Leak outputs instead of `free`ing them: set when `malloc-outputs`
    /// failed, so one broken rule does not crash every other check.
    pub leak_outputs: bool,
}

impl<'a> Ctx<'a> {
    /// `open(uri)` on the URI under test.
    pub fn open(&self) -> Result<Handle<'a>, Finding> {
        self.open_uri(self.uri)
    }

    /// `open` on another URI (e.g. with a trailing `/`).
    pub fn open_uri(&self, uri: &str) -> Result<Handle<'a>, Finding> {
        self.lib
            .open_store(uri)
            .ok_or_else(|| violated(format!("open({uri:?}) returned NULL")))
    }

    /// `quick` or `full`, whichever this run asked for.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }

    fn xof(&self, domain: &str, tag: &str, i: u64, out: &mut [u8]) {
        let mut h = blake3::Hasher::new();
        for part in [domain, self.run_id, self.check, tag] {
            h.update(part.as_bytes()).update(&[0]);
        }
        h.update(&i.to_le_bytes());
        h.finalize_xof().fill(out);
    }

    /// A `len`-byte hash unique to this run, check, `tag` and `i`.
    pub fn key(&self, tag: &str, i: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.xof("key", tag, i, &mut out);
        out
    }

    /// `len` bytes of data unique to this run, check, `tag` and `i`.
    pub fn data(&self, tag: &str, i: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.xof("data", tag, i, &mut out);
        out
    }

    /// A manifest name unique to this run and check (a safe, short name).
    pub fn name(&self, tag: &str) -> String {
        format!("kvwasm-check-{}-{}-{tag}", self.run_id, self.check)
    }

    /// Release an output buffer the way a consumer does (`free`), unless
    /// outputs are being leaked.
    pub fn release(&self, buffer: Buffer) {
        if self.leak_outputs {
            let _ = buffer.into_raw();
        }
    }

    /// `get_chunk`, copied out and released.
    pub fn get_chunk(&self, h: &Handle<'_>, hash: &[u8]) -> Result<Vec<u8>, i32> {
        h.get_chunk(hash).map(|b| self.copy_out(b))
    }

    /// `get_manifest`, copied out and released.
    pub fn get_manifest(&self, h: &Handle<'_>, name: &str) -> Result<Vec<u8>, i32> {
        h.get_manifest(name).map(|b| self.copy_out(b))
    }

    fn copy_out(&self, buffer: Buffer) -> Vec<u8> {
        let bytes = buffer.to_vec();
        self.release(buffer);
        bytes
    }

    /// The chunk under `hash` must read back as exactly `want`.
    pub fn expect_chunk(&self, h: &Handle<'_>, hash: &[u8], want: &[u8]) -> Result<(), Finding> {
        match self.get_chunk(h, hash) {
            Ok(got) => same_bytes(&got, want, &format!("chunk {}", short_hex(hash))),
            Err(rc) => Err(violated(format!(
                "get_chunk({}) returned {rc} for a chunk that was put",
                short_hex(hash)
            ))),
        }
    }

    /// The manifest `name` must read back as exactly `want`.
    pub fn expect_manifest(&self, h: &Handle<'_>, name: &str, want: &[u8]) -> Result<(), Finding> {
        match self.get_manifest(h, name) {
            Ok(got) => same_bytes(&got, want, &format!("manifest {name:?}")),
            Err(rc) => Err(violated(format!(
                "get_manifest({name:?}) returned {rc} for a manifest that was put"
            ))),
        }
    }

    /// `put_chunk` of a new hash must return 0.
    pub fn put_new_chunk(&self, h: &Handle<'_>, hash: &[u8], data: &[u8]) -> Result<(), Finding> {
        match h.put_chunk(hash, data) {
            Ok(false) => Ok(()),
            Ok(true) => Err(violated(format!(
                "put_chunk of never-seen hash {} returned 1 (already present)",
                short_hex(hash)
            ))),
            Err(rc) => Err(violated(format!(
                "put_chunk({}, {} bytes) returned {rc}",
                short_hex(hash),
                data.len()
            ))),
        }
    }

    /// `put_manifest` must return 0.
    pub fn put_manifest(&self, h: &Handle<'_>, name: &str, data: &[u8]) -> Result<(), Finding> {
        h.put_manifest(name, data).map_err(|rc| {
            violated(format!(
                "put_manifest({name:?}, {} bytes) returned {rc}",
                data.len()
            ))
        })
    }
}

/// Byte-identical, or a violation naming the first difference.
pub fn same_bytes(got: &[u8], want: &[u8], what: &str) -> Result<(), Finding> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(violated(format!(
            "{what}: read {} bytes, {} were put",
            got.len(),
            want.len()
        )));
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    Err(violated(format!(
        "{what}: {} bytes read back but they differ from what was put, first at offset {at}",
        got.len()
    )))
}

/// A hash for messages: hex, shortened past 8 bytes.
pub fn short_hex(hash: &[u8]) -> String {
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    if hash.len() > 8 {
        format!("{hex}…({} bytes)", hash.len())
    } else {
        hex
    }
}
