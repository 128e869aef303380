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
//! `..chunks` instead (`kvwasm_fs_layout`, which the host shares: it finds
//! chunks in place itself, see docs/architecture.md). Every other
//! namespace keeps its plain path, and the empty namespace is the granted
//! directory itself.
//!
//! Writes go to a unique temporary file and are renamed into place, so
//! readers never see a partial file. Durability is ordered: before a
//! manifest is renamed into place, every chunk this instance wrote *or
//! answered `already-present` for* is made durable along with its
//! directory (`payload-io.sync-paths`). Their writeback is started as
//! they are put, a batch per MiB (`payload-io.start-writeback`), so that
//! sync mostly finds their data written. A chunk found in place may have
//! been written by another instance or process that has not synced it yet
//! (or never will: it crashed), so a crash can never leave a visible
//! manifest that names a chunk that did not reach the disk. Warm saves stay
//! cheap: the host remembers, across instances and idle releases, which
//! files and directories it synced and in what version, and skips those
//! unchanged since; the guest holds no such knowledge (see
//! docs/architecture.md, "Durable ordering"). A directory the store creates
//! (a namespace component, `chunks`) is synced into its parent when it is
//! made. Puts write through (the chunk is visible when `put-chunk`
//! returns), like llama.cpp's local store.
//!
//! Settings (`[backends.<name>.settings]`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `durability` | `ordered` | `ordered`: as above. `none`: nothing is synced, as llama.cpp's own slot files are not; for a cache whose loss costs a recompute (see below) |
//!
//! With `durability = "none"` a manifest is still published atomically
//! (temp file + rename: a reader sees the old one or the new one, whole),
//! but after a crash of the *system* (not of a process: the page cache
//! survives those) a manifest may name chunks that never reached the disk.
//! A consumer that verifies what it reads (llama-server's kv_slot checks
//! every chunk's xxh3-64) then reports a miss, never wrong data; a chunk
//! left shorter than its put is rewritten by the next put, as always.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

use kvwasm_fs_layout::{CHUNKS_DIR, FANOUT_DIRS, chunk_path, fanout_slot, namespace_dir};
use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_io;
use kvwasm_guest_support::bindings::wasi::filesystem::preopens;
use kvwasm_guest_support::bindings::wasi::filesystem::types::{
    Advice, Descriptor, DescriptorFlags, ErrorCode, OpenFlags, PathFlags,
};
use kvwasm_guest_support::{
    BackendInfo, Error, FsErrorExt, Guest, GuestStore, Payload, PutOutcome, Result, Settings,
    Store, export_backend, validate,
};

/// Guest path at which the operator grants the data directory.
pub const DATA_DIR: &str = "/data";
/// Prefix of in-flight temporary files. Never a valid result of hex-encoding
/// a hash; a manifest name could start with it only on purpose.
const TMP_PREFIX: &str = ".kvwasm-tmp-";
/// Paths one `sync-paths` or `start-writeback` call may list (the host's
/// bound).
const MAX_SYNC_PATHS: usize = 512;
/// Bytes of unsynced chunks put before their writeback is started: the
/// device then writes while the save goes on, and the sync before the
/// manifest mostly finds their data written. Small enough to start early,
/// large enough that small chunks cost one host call per many puts.
const WRITEBACK_BATCH: u64 = 1 << 20;

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
    /// Hashes of the chunks put (written, or found in place and not known
    /// to be durable) since the last sync: a manifest may name them, so
    /// they are made durable first. A hash set: an ordered one cost a put
    /// about 0.5 µs of comparisons once thousands of chunks wait for a
    /// manifest.
    unsynced: RefCell<HashSet<Vec<u8>>>,
    /// Bit `i`: a chunk in `chunks/<i>` was put since the last sync. Its
    /// directory entry is durable only once the directory is, so the
    /// directory is listed for the sync even when every such chunk was
    /// found durable (the host skips it if unchanged since it synced it).
    touched: Cell<u16>,
    /// Unsynced chunks whose writeback is not started yet, and their bytes.
    writeback: RefCell<(Vec<String>, u64)>,
    /// Temp-file names: a per-instance random seed plus a counter.
    tmp_seed: u64,
    tmp_seq: Cell<u64>,
    /// `durability = "ordered"` (true) or `"none"`.
    ordered: bool,
}

/// The `durability` setting: whether chunks and manifests are synced.
fn ordered_durability(settings: &Settings) -> Result<bool> {
    match settings.get("durability").unwrap_or("ordered") {
        "ordered" => Ok(true),
        "none" => Ok(false),
        other => Err(Error::InvalidArgument(format!(
            "setting `durability` = {other:?}: expected \"ordered\" or \"none\""
        ))),
    }
}

/// A directory descriptor and whether writes are allowed under it.
struct Dir {
    fd: Descriptor,
    writable: bool,
}

impl GuestStore for FsStore {
    fn open(namespace: String) -> Result<Store> {
        let ordered = ordered_durability(&Settings::load()?)?;
        let parts = validate::namespace(&namespace)?;
        let mut dir = data_dir()?;
        for part in parts {
            dir = dir.subdir(&namespace_dir_checked(part)?)?;
        }
        let chunks = dir.subdir(CHUNKS_DIR)?;
        Ok(Store::new(FsStore {
            root: dir,
            chunks,
            fanout_made: Cell::new(0),
            unsynced: RefCell::default(),
            touched: Cell::new(0),
            writeback: RefCell::default(),
            // RandomState is seeded from wasi:random; two instances writing
            // the same chunk at once must not share a temp-file name.
            tmp_seed: RandomState::new().hash_one(0u8),
            tmp_seq: Cell::new(0),
            ordered,
        }))
    }

    fn put_chunk(&self, hash: Vec<u8>, data: &Payload) -> Result<PutOutcome> {
        validate::hash(&hash)?;
        let slot = fanout_slot(&hash);
        // A chunk is present when a file of the right size is there: a
        // crash between rename and fsync can leave a short file behind,
        // and such a file is rewritten rather than trusted.
        let outcome = match self.find_chunk(&hash)? {
            Some(found) if found.size == data.len() => {
                // Found in place, it may be another writer's, not synced
                // yet (or never: it crashed). Unless the host synced this
                // very file before, it is made durable before this
                // instance's next manifest.
                if self.ordered && !found.durable {
                    self.start_writeback_soon(&hash, found.size);
                    self.unsynced.borrow_mut().insert(hash);
                }
                PutOutcome::AlreadyPresent
            }
            _ => {
                // Only a write needs the fan-out directory: a warm save on
                // a new instance (after an idle release) makes none.
                self.make_fanout_dir(slot)?;
                self.write_file(&self.chunks, &chunk_path(&hash), data, false)?;
                if self.ordered {
                    self.start_writeback_soon(&hash, data.len());
                    self.unsynced.borrow_mut().insert(hash);
                }
                PutOutcome::Stored
            }
        };
        if self.ordered {
            self.touched.set(self.touched.get() | 1 << slot);
        }
        Ok(outcome)
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        validate::hash(&hash)?;
        read_file(&self.chunks, &chunk_path(&hash), "read chunk")
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        validate::manifest_name(&name)?;
        if !self.ordered {
            return self.write_file(&self.root, &name, data, false);
        }
        let synced = self.sync_chunks()?;
        self.write_file(&self.root, &name, data, true)?;
        self.root.fd.sync().fs_context("sync manifest directory")?;
        kvwasm_guest_support::log!("put-manifest {name:?}: {synced} chunks synced first");
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
    /// Make every chunk a manifest may name durable, then their fan-out
    /// directories and `chunks` (a fan-out directory made since is an entry
    /// there); the host skips what it synced before and has not changed
    /// since. Returns how many chunk files had to be synced.
    fn sync_chunks(&self) -> Result<u32> {
        // The sync starts what is still pending itself.
        *self.writeback.borrow_mut() = Default::default();
        let unsynced = std::mem::take(&mut *self.unsynced.borrow_mut());
        let slots = self.touched.replace(0);
        if slots == 0 {
            return Ok(0);
        }
        let mut paths: Vec<String> = unsynced.iter().map(|hash| chunk_path(hash)).collect();
        paths.extend(
            (0..FANOUT_DIRS.len())
                .filter(|slot| slots & 1 << slot != 0)
                .map(|slot| FANOUT_DIRS[slot].to_owned()),
        );
        paths.push(".".to_owned());
        let mut files = 0;
        for batch in paths.chunks(MAX_SYNC_PATHS) {
            match payload_io::sync_paths(&self.chunks.fd, batch) {
                Ok(synced) => files += synced.files,
                Err(e) => {
                    // Keep them queued so a retry syncs them.
                    self.unsynced.borrow_mut().extend(unsynced);
                    self.touched.set(self.touched.get() | slots);
                    return Err(e).fs_context("sync chunks");
                }
            }
        }
        Ok(files)
    }

    /// Queue the unsynced chunk `hash` of `size` bytes for writeback, and
    /// have the host start it once a batch is queued. A hint: the sync
    /// before the next manifest reports what fails.
    fn start_writeback_soon(&self, hash: &[u8], size: u64) {
        let mut pending = self.writeback.borrow_mut();
        let (paths, bytes) = &mut *pending;
        paths.push(chunk_path(hash));
        *bytes += size;
        if *bytes >= WRITEBACK_BATCH || paths.len() == MAX_SYNC_PATHS {
            let _ = payload_io::start_writeback(&self.chunks.fd, paths);
            *pending = Default::default();
        }
    }

    /// The chunk `hash`, if a regular file is there: its size and whether
    /// the host knows it durable (one host call).
    fn find_chunk(&self, hash: &[u8]) -> Result<Option<payload_io::FoundFile>> {
        match payload_io::find_file(&self.chunks.fd, &chunk_path(hash)) {
            Ok(found) => Ok(found),
            // Not a regular file: the put replaces it (the rename does).
            Err(ErrorCode::Unsupported) => Ok(None),
            Err(e) => Err(e).fs_context("find chunk"),
        }
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
                    kvwasm_guest_support::log!("created directory {name:?} and synced its parent");
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

/// The directory of namespace component `part` ([`namespace_dir`]), if
/// its escaped form is still a valid name.
fn namespace_dir_checked(part: &str) -> Result<Cow<'_, str>> {
    let dir = namespace_dir(part);
    if dir.len() > validate::MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "namespace component {part:?} is too long to escape"
        )));
    }
    Ok(dir)
}

export_backend!(FsBackend);
