//! Filesystem backend, laid out exactly like llama.cpp's in-tree local store:
//!
//! ```text
//! <root>/<manifest name>
//! <root>/chunks/<first hex digit of hash>/<hex of whole hash>
//! ```
//!
//! `<root>` is the directory granted at guest path [`DATA_DIR`], plus the
//! namespace from the URI, one directory per component. A component that
//! could name a chunk store (`chunks`, in any letter case) is stored as
//! `..chunks` instead: valid namespace components and manifest names never
//! contain `..`, so the escaped name meets no other namespace or manifest,
//! and no namespace can reach into another one's chunks. Every other
//! namespace keeps its plain path, and the empty namespace is the granted
//! directory itself.
//!
//! Writes go to a unique temporary file and are renamed into place, so
//! readers never see a partial file. Durability is ordered: before a
//! manifest is renamed into place, every chunk this instance wrote *or
//! answered `already-present` for* is `fsync`ed along with its directory,
//! unless this instance already synced it. A chunk found in place may have
//! been written by another instance or process that has not synced it yet,
//! so a crash can never leave a visible manifest that names a chunk that did
//! not reach the disk. Warm saves stay cheap: each instance syncs a given
//! chunk once. A directory the store creates (a namespace component,
//! `chunks`) is synced into its parent when it is made. Puts write through
//! (the chunk is visible when `put-chunk` returns), like llama.cpp's local
//! store.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashSet};
use std::hash::{BuildHasher, RandomState};

use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_io;
use kvwasm_guest_support::bindings::wasi::filesystem::preopens;
use kvwasm_guest_support::bindings::wasi::filesystem::types::{
    Advice, Descriptor, DescriptorFlags, ErrorCode, OpenFlags, PathFlags,
};
use kvwasm_guest_support::{
    BackendInfo, Error, FsErrorExt, Guest, GuestStore, Payload, PutOutcome, Result, Store,
    export_backend, validate,
};

/// Guest path at which the operator grants the data directory.
pub const DATA_DIR: &str = "/data";
/// Where chunks live under the root.
const CHUNKS_DIR: &str = "chunks";
/// Prefix of in-flight temporary files. Never a valid result of hex-encoding
/// a hash; a manifest name could start with it only on purpose.
const TMP_PREFIX: &str = ".kvwasm-tmp-";
/// Chunks this instance remembers as synced. Forgotten wholesale when full:
/// a forgotten chunk costs one more `fsync`, never a wrong answer.
const MAX_SYNCED: usize = 1 << 20;

struct FsBackend;

impl Guest for FsBackend {
    type Store = FsStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "fs".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // All state is in files: any number of instances may serve a handle.
            shared_state: true,
        }
    }
}

/// One open store: the namespace directory and its chunk directory.
///
/// Chunk files are reached by `<fan-out>/<hash>` paths under `chunks`
/// rather than through 16 open fan-out directories: an instance holds
/// three descriptors (the grant, `root`, `chunks`), so 1,000 open handles
/// fit in a process's descriptor budget (docs/benchmarks.md, "Performance
/// at scale").
struct FsStore {
    root: Dir,
    chunks: Dir,
    /// Bit `i`: this instance has made sure `chunks/<i>` exists.
    fanout_made: Cell<u16>,
    /// Hashes of the chunks a manifest may name that this instance has not
    /// `fsync`ed. A hash set: an ordered one cost a put about 0.5 µs of
    /// comparisons once thousands of chunks wait for a manifest.
    unsynced: RefCell<HashSet<Vec<u8>>>,
    /// Hashes of the chunks this instance has `fsync`ed: a warm put of one
    /// needs no sync before the next manifest.
    synced: RefCell<HashSet<Vec<u8>>>,
    /// Temp-file names: a per-instance random seed plus a counter.
    tmp_seed: u64,
    tmp_seq: Cell<u64>,
}

/// A directory descriptor and whether writes are allowed under it.
struct Dir {
    fd: Descriptor,
    writable: bool,
}

impl GuestStore for FsStore {
    fn open(namespace: String) -> Result<Store> {
        let parts = validate::namespace(&namespace)?;
        let mut dir = data_dir()?;
        for part in parts {
            dir = dir.subdir(&namespace_dir(part)?)?;
        }
        let chunks = dir.subdir(CHUNKS_DIR)?;
        Ok(Store::new(FsStore {
            root: dir,
            chunks,
            fanout_made: Cell::new(0),
            unsynced: RefCell::default(),
            synced: RefCell::default(),
            // RandomState is seeded from wasi:random; two instances writing
            // the same chunk at once must not share a temp-file name.
            tmp_seed: RandomState::new().hash_one(0u8),
            tmp_seq: Cell::new(0),
        }))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome> {
        validate::hash(&hash)?;
        self.make_fanout_dir(fanout_slot(&hash))?;
        let path = chunk_path(&hash);
        // A chunk is present when a file of the right size is there: a
        // crash between rename and fsync can leave a short file behind,
        // and such a file is rewritten rather than trusted.
        let outcome = match self.chunks.fd.stat_at(PathFlags::empty(), &path) {
            Ok(stat) if stat.size == data.len() => PutOutcome::AlreadyPresent,
            Ok(_) | Err(ErrorCode::NoEntry) => {
                self.write_file(&self.chunks, &path, data, false)?;
                PutOutcome::Stored
            }
            Err(e) => return Err(e).fs_context("stat chunk"),
        };
        // A chunk found in place may be another writer's, not synced
        // yet: sync it before this instance's next manifest too.
        if outcome == PutOutcome::Stored || !self.synced.borrow().contains(&hash) {
            self.unsynced.borrow_mut().insert(hash);
        }
        Ok(outcome)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        validate::hash(&hash)?;
        read_file(&self.chunks, &chunk_path(&hash), "read chunk")
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        validate::manifest_name(&name)?;
        let synced = self.sync_chunks()?;
        self.write_file(&self.root, &name, data, true)?;
        self.root.fd.sync().fs_context("sync manifest directory")?;
        eprintln!("put-manifest {name:?}: {synced} chunks synced first");
        Ok(())
    }

    fn get_manifest(&self, name: String) -> Result<Payload> {
        validate::manifest_name(&name)?;
        read_file(&self.root, &name, "read manifest")
    }

    fn delete_manifest(&self, name: String) -> Result<()> {
        validate::manifest_name(&name)?;
        self.root.require_writable()?;
        match self.root.fd.unlink_file_at(&name) {
            Ok(()) | Err(ErrorCode::NoEntry) => Ok(()),
            Err(e) => Err(e).fs_context("delete manifest"),
        }
    }

    fn prefetch_chunks(&self, hashes: Vec<Vec<u8>>) -> Result<()> {
        // Ask the kernel to start reading every chunk now, so the get-chunk
        // calls that follow hit the page cache. Missing chunks are skipped:
        // the get that follows reports them.
        for hash in &hashes {
            validate::hash(hash)?;
        }
        for hash in hashes {
            let path = chunk_path(&hash);
            let _ = self.chunks.open_file(&path, "open chunk").and_then(|file| {
                let size = file.stat().fs_context("stat chunk")?.size;
                file.advise(0, size, Advice::WillNeed)
                    .fs_context("advise chunk")
            });
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.sync_chunks().map(drop)
    }
}

impl FsStore {
    /// `fsync` every chunk a manifest may name that this instance has not
    /// synced, then their directories; returns how many chunks were synced.
    fn sync_chunks(&self) -> Result<usize> {
        let unsynced = std::mem::take(&mut *self.unsynced.borrow_mut());
        let mut dirs = BTreeSet::new();
        for hash in &unsynced {
            let synced = self
                .chunks
                .open_file(&chunk_path(hash), "open chunk for sync")
                .and_then(|file| file.sync_data().fs_context("sync chunk"));
            if let Err(e) = synced {
                // Keep the rest queued so a retry syncs them.
                self.unsynced.borrow_mut().extend(unsynced.iter().cloned());
                return Err(e);
            }
            dirs.insert(fanout_slot(hash));
        }
        if dirs.is_empty() {
            return Ok(0);
        }
        let dirs_synced = dirs.into_iter().try_for_each(|slot| {
            let dir = open_dir(&self.chunks.fd, FANOUT_DIRS[slot], self.chunks.writable)?;
            dir.fd.sync().fs_context("sync chunk directory")
        });
        // A fan-out directory created since the last flush is an entry here.
        if let Err(e) =
            dirs_synced.and_then(|()| self.chunks.fd.sync().fs_context("sync chunks directory"))
        {
            self.unsynced.borrow_mut().extend(unsynced);
            return Err(e);
        }
        let mut synced = self.synced.borrow_mut();
        if synced.len().saturating_add(unsynced.len()) > MAX_SYNCED {
            synced.clear();
        }
        let count = unsynced.len();
        synced.extend(unsynced);
        Ok(count)
    }

    /// Make sure fan-out directory `slot` exists under `chunks` (once per
    /// instance), if the grant is writable.
    fn make_fanout_dir(&self, slot: usize) -> Result<()> {
        let made = self.fanout_made.get();
        // Under a read-only grant nothing is created: a put then finds its
        // chunk present or is refused when it writes.
        if made & (1 << slot) == 0 && self.chunks.writable {
            match self.chunks.fd.create_directory_at(FANOUT_DIRS[slot]) {
                Ok(()) | Err(ErrorCode::Exist) => {}
                Err(e) => return Err(e).fs_context("create directory"),
            }
            self.fanout_made.set(made | 1 << slot);
        }
        Ok(())
    }

    /// Write `data` to a fresh temp file beside `path` (relative to `dir`),
    /// then rename it to `path`. `durable` syncs the file before the rename
    /// (manifests); chunks are synced in batch by [`GuestStore::flush`].
    fn write_file(&self, dir: &Dir, path: &str, data: &Payload, durable: bool) -> Result<()> {
        dir.require_writable()?;
        let seq = self.tmp_seq.get();
        self.tmp_seq.set(seq + 1);
        let parent = path.rfind('/').map_or("", |slash| &path[..=slash]);
        // `<parent>.kvwasm-tmp-<seed>-<seq>`, both in hex, without `format!`:
        // its machinery took a put about 0.3 µs.
        let mut tmp = String::with_capacity(parent.len() + TMP_PREFIX.len() + 16 + 1 + 16);
        tmp.push_str(parent);
        tmp.push_str(TMP_PREFIX);
        validate::push_hex(&mut tmp, &self.tmp_seed.to_be_bytes());
        tmp.push('-');
        validate::push_hex(&mut tmp, &seq.to_be_bytes());
        // The host removes the temp file if anything fails.
        payload_io::publish_file(&dir.fd, &tmp, path, data, durable).fs_context("publish file")
    }
}

impl Dir {
    /// Open (creating if missing) the subdirectory `name`. Under a read-only
    /// grant an existing directory opens read-only and creation is skipped.
    fn subdir(&self, name: &str) -> Result<Dir> {
        if self.writable {
            match self.fd.create_directory_at(name) {
                // A new entry is made durable at once: a manifest's sync
                // covers its own directory and the chunks', not the ones
                // above them.
                Ok(()) => {
                    self.fd.sync().fs_context("sync directory")?;
                    eprintln!("created directory {name:?} and synced its parent");
                }
                Err(ErrorCode::Exist) => {}
                Err(e) => return Err(e).fs_context("create directory"),
            }
        }
        open_dir(&self.fd, name, self.writable)
    }

    /// Open the existing file `name` for reading.
    fn open_file(&self, name: &str, what: &str) -> Result<Descriptor> {
        self.fd
            .open_at(
                PathFlags::empty(),
                name,
                OpenFlags::empty(),
                DescriptorFlags::READ,
            )
            .fs_context(what)
    }

    fn require_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Error::Denied(format!("{DATA_DIR} is granted read-only")))
        }
    }
}

/// The granted data directory, writable if the grant allows it.
fn data_dir() -> Result<Dir> {
    let (preopen, _) = preopens::get_directories()
        .into_iter()
        .find(|(_, path)| path == DATA_DIR)
        .ok_or_else(|| Error::Denied(format!("no directory granted at {DATA_DIR}")))?;
    open_dir(&preopen, ".", true).or_else(|_| open_dir(&preopen, ".", false))
}

fn open_dir(parent: &Descriptor, name: &str, writable: bool) -> Result<Dir> {
    let mut flags = DescriptorFlags::READ;
    if writable {
        flags |= DescriptorFlags::MUTATE_DIRECTORY;
    }
    let fd = parent
        .open_at(PathFlags::empty(), name, OpenFlags::DIRECTORY, flags)
        .fs_context("open directory")?;
    Ok(Dir { fd, writable })
}

/// Read a whole file into a payload, in one host call, without copying it
/// through guest memory.
fn read_file(dir: &Dir, name: &str, what: &str) -> Result<Payload> {
    payload_io::read_file(&dir.fd, name).fs_context(what)
}

/// The directory name of namespace component `part` (see the module docs):
/// `..<part>` if it could be taken for a chunk store on a case-insensitive
/// filesystem (which may also fold Unicode look-alikes or drop trailing dots
/// and spaces), else `part` itself.
fn namespace_dir(part: &str) -> Result<Cow<'_, str>> {
    let folded = part
        .trim_end_matches(['.', ' '])
        .to_uppercase()
        .to_lowercase();
    if folded != CHUNKS_DIR {
        return Ok(Cow::Borrowed(part));
    }
    let escaped = format!("..{part}");
    if escaped.len() > validate::MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "namespace component {part:?} is too long to escape"
        )));
    }
    Ok(Cow::Owned(escaped))
}

/// Index of a (non-empty) hash's fan-out directory: its first hex digit.
fn fanout_slot(hash: &[u8]) -> usize {
    usize::from(hash[0] >> 4)
}

/// The fan-out directories' names, by slot.
const FANOUT_DIRS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f",
];

/// A chunk's path under `chunks`: `<first hex digit>/<hex of whole hash>`,
/// made in one allocation (every chunk call makes one).
fn chunk_path(hash: &[u8]) -> String {
    let mut path = String::with_capacity(2 + 2 * hash.len());
    path.push_str(FANOUT_DIRS[fanout_slot(hash)]);
    path.push('/');
    validate::push_hex(&mut path, hash);
    path
}

export_backend!(FsBackend);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_paths_are_the_in_tree_layout() {
        // llama.cpp's local store: chunks/<first hex digit>/<hex of hash>.
        let path = chunk_path(&[0xa7, 0x00, 0x3c]);
        assert_eq!(path, "a/a7003c");
        assert_eq!(fanout_slot(&[0xa7]), 10);
        assert_eq!(chunk_path(&[0x05]), "0/05");
        let longest = [0xff; validate::MAX_HASH_LEN];
        assert_eq!(chunk_path(&longest), format!("f/{}", "ff".repeat(64)));
        for (slot, name) in FANOUT_DIRS.iter().enumerate() {
            assert_eq!(*name, format!("{slot:x}"));
        }
    }
}
