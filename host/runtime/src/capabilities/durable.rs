//! What the host has made durable (`payload-io.sync-paths`), remembered
//! for the life of the process, across guest instances.
//!
//! A store that finds a chunk in place cannot tell whether its writer
//! synced it (the writer may have crashed before), so it must sync it
//! before publishing a manifest that names it. Per instance, that
//! knowledge is lost whenever an idle instance is released, and a warm
//! save then pays one `fdatasync` per chunk again. So the host keeps it,
//! where no guest can write it: an entry is made only after the host's own
//! `fdatasync`/`fsync` of a file or directory succeeded, keyed by device
//! and inode, and it holds for the version the host read just before that
//! sync (size, modification and change time). A file replaced since (a new
//! inode), or written, truncated or touched in place (a new change time,
//! which no process can set), no longer matches and is synced again.
//!
//! One subtlety: timestamps are taken from the kernel's coarse clock, so
//! two changes within one tick may carry the same change time. An entry is
//! therefore made only if the change time the host read is older than the
//! coarse clock read after it: any later change then carries a later time.
//! A file changed in the same tick as its sync is simply synced again next
//! time. Where timestamps are multigrain (Linux 6.13 and later, on ext4,
//! XFS, Btrfs and tmpfs), that guard is not needed: the host's own `stat`
//! before the sync marks the change time as queried, and the kernel then
//! stamps the next change with a fine-grained time later than it (and never
//! earlier than a time it handed out before), so no later version can carry
//! the time the host read. (A clock stepped back could in theory give a
//! later change an old time; it would also need the same inode, size and
//! nanoseconds.)

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;

use super::descriptors::Headroom;
use super::dirs::{io_error_code, open_dir_beneath, split_name};
use crate::bindings::kvwasm::kv_store::payload_io::{FoundFile, Synced};

/// Paths one `sync-paths` or `start-writeback` call may list: a call does
/// bounded work before the guest's epoch deadline is checked again.
pub(crate) const MAX_PATHS: usize = 512;
/// Entries kept; forgotten wholesale when full (about 56 bytes each). A
/// forgotten entry costs one more sync, never a wrong answer.
const MAX_ENTRIES: usize = 1 << 18;
/// Subdirectories one call keeps open while it resolves paths.
const OPEN_SUBDIRS: usize = 16;

/// What must be unchanged for a sync to still hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    size: i64,
    modified: (i64, i64),
    changed: (i64, i64),
}

/// (device, inode) → the version the host synced.
static SYNCED: LazyLock<Mutex<HashMap<(u64, u64), Version>>> = LazyLock::new(Default::default);

/// A file or directory as `stat` saw it.
struct Seen {
    id: (u64, u64),
    version: Version,
    is_dir: bool,
}

impl Seen {
    fn new(st: &libc::stat) -> Result<Seen, ErrorCode> {
        let is_dir = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => true,
            libc::S_IFREG => false,
            _ => return Err(ErrorCode::Unsupported),
        };
        Ok(Seen {
            id: (st.st_dev, st.st_ino),
            version: Version {
                size: st.st_size,
                modified: (st.st_mtime, st.st_mtime_nsec),
                changed: (st.st_ctime, st.st_ctime_nsec),
            },
            is_dir,
        })
    }

    fn is_synced(&self) -> bool {
        let synced = SYNCED.lock().unwrap_or_else(|e| e.into_inner());
        synced.get(&self.id) == Some(&self.version)
    }

    /// Remember that this version is durable, if no later change can
    /// carry the same change time (see the module docs): on a coarse-clock
    /// filesystem, only if it is older than `coarse_now`, the coarse clock
    /// read after the `stat` that saw it. Whole-second times say the
    /// filesystem stamps coarser than the clock (ext3, FAT, ext4 with small
    /// inodes): nothing is remembered there.
    fn record(&self, stamps: Stamps, coarse_now: (i64, i64)) {
        let later_changes_differ = match stamps {
            Stamps::Elsewhere => false,
            Stamps::CoarseClock => self.version.changed < coarse_now,
            Stamps::Multigrain => true,
        };
        if !later_changes_differ || (self.version.changed.1 == 0 && self.version.modified.1 == 0) {
            return;
        }
        let mut synced = SYNCED.lock().unwrap_or_else(|e| e.into_inner());
        if synced.len() >= MAX_ENTRIES && !synced.contains_key(&self.id) {
            synced.clear();
        }
        synced.insert(self.id, self.version);
    }
}

/// Whether every one of these files and directories, as `stat` saw them,
/// is a version the host synced (one lock for all).
pub(crate) fn all_synced(seen: &[&libc::stat]) -> bool {
    let synced = SYNCED.lock().unwrap_or_else(|e| e.into_inner());
    seen.iter()
        .all(|st| Seen::new(st).is_ok_and(|seen| synced.get(&seen.id) == Some(&seen.version)))
}

/// `payload-io.sync-paths` on the directory `dir`: see the WIT.
pub(crate) fn sync_paths(
    dir: &std::fs::File,
    paths: &[String],
    headroom: &Headroom,
) -> Result<Synced, ErrorCode> {
    if paths.len() > MAX_PATHS {
        return Err(ErrorCode::Invalid);
    }
    let mut parents = Parents {
        dir,
        headroom,
        open: Vec::new(),
    };
    // Every file's writeback starts before the first wait: the device then
    // writes them together, and each `fdatasync` below mostly finds its
    // data written (a cold save of 385 chunk files of 256 KiB on ext4:
    // 111 ms of syncs one after another, 60 ms so).
    for path in paths {
        if let Some((parent, name)) = parents.resolve(path)?
            && let Some(file) = open_unsynced_file(parent, name, headroom)
        {
            writeback::start(file.as_fd());
        }
    }
    let mut synced = Synced {
        files: 0,
        directories: 0,
    };
    for path in paths {
        match parents.resolve(path)? {
            None => sync_one(dir.as_raw_fd(), None, headroom, &mut synced)?,
            Some((parent, name)) => sync_one(parent, Some(name), headroom, &mut synced)?,
        }
    }
    Ok(synced)
}

/// The directories of one call's paths, opened beneath its
/// directory as they are first named (a few kept open at a time).
struct Parents<'a> {
    dir: &'a std::fs::File,
    headroom: &'a Headroom,
    open: Vec<(&'a str, std::fs::File)>,
}

impl<'a> Parents<'a> {
    /// `path`'s directory and last component; `None` for `.`, the
    /// directory itself.
    fn resolve(&mut self, path: &'a str) -> Result<Option<(RawFd, &'a str)>, ErrorCode> {
        if path == "." {
            return Ok(None);
        }
        let (sub, name) = split_name(path)?;
        if sub.is_empty() {
            return Ok(Some((self.dir.as_raw_fd(), name)));
        }
        if let Some((_, open)) = self.open.iter().find(|(s, _)| *s == sub) {
            return Ok(Some((open.as_raw_fd(), name)));
        }
        if self.open.len() == OPEN_SUBDIRS {
            self.open.clear();
        }
        let Some(open) = open_dir_beneath(self.dir, sub, self.headroom)? else {
            return Err(ErrorCode::Invalid);
        };
        let fd = open.as_raw_fd();
        self.open.push((sub, open));
        Ok(Some((fd, name)))
    }
}

/// `payload-io.start-writeback` on the directory `dir`: see the WIT.
/// Returns how many files were handed to the host's writeback thread,
/// which starts their writeback while the guest goes on writing.
pub(crate) fn start_writeback(
    dir: &std::fs::File,
    paths: &[String],
    headroom: &Headroom,
) -> Result<u32, ErrorCode> {
    if paths.len() > MAX_PATHS {
        return Err(ErrorCode::Invalid);
    }
    let on_a_device = !in_memory(dir.as_raw_fd());
    let mut parents = Parents {
        dir,
        headroom,
        open: Vec::new(),
    };
    let mut queued = 0;
    for path in paths {
        // Every path is resolved, so a bad one fails on any filesystem.
        let (parent, name) = match parents.resolve(path) {
            Ok(Some(found)) => found,
            Ok(None) | Err(ErrorCode::NoEntry | ErrorCode::NotDirectory) => continue,
            Err(refused) => return Err(refused),
        };
        if on_a_device && let Some(file) = open_unsynced_file(parent, name, headroom) {
            queued += u32::from(writeback::queue(file));
        }
    }
    Ok(queued)
}

/// The regular file `name` in `parent`, opened, unless the host synced
/// this version of it: what a writeback may start on. A hint's helper:
/// whatever fails here, the sync that follows finds and reports.
fn open_unsynced_file(parent: RawFd, name: &str, headroom: &Headroom) -> Option<OwnedFd> {
    let name = CString::new(name).ok()?;
    let there = stat_at(parent, &name).ok()?;
    if there.st_mode & libc::S_IFMT != libc::S_IFREG
        || Seen::new(&there).is_ok_and(|seen| seen.is_synced())
    {
        return None;
    }
    let file = open_at(parent, &name, headroom).ok()?;
    // Only the file the `stat` saw: anything renamed into place since (a
    // device node, a directory) is closed again.
    let opened = stat_fd(file.as_raw_fd()).ok()?;
    (opened.st_mode & libc::S_IFMT == libc::S_IFREG
        && (opened.st_dev, opened.st_ino) == (there.st_dev, there.st_ino))
        .then_some(file)
}

/// Whether the filesystem `fd` lives on keeps files in memory only
/// (tmpfs, ramfs): no device to write back to.
fn in_memory(fd: RawFd) -> bool {
    matches!(fs_magic(fd), Some(TMPFS_MAGIC | RAMFS_MAGIC))
}

const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58F6;

/// The magic number of the filesystem `fd` lives on (`statfs`'s `f_type`).
fn fs_magic(fd: RawFd) -> Option<u32> {
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `fd` is open; `fs` is written by a successful call before it
    // is read.
    if unsafe { libc::fstatfs(fd, fs.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: the call succeeded.
    let kind = unsafe { fs.assume_init() }.f_type;
    // Magic numbers are 32 bits; `f_type` is wider on some targets, and
    // signed, so one above 0x7fff_ffff must not be sign-extended.
    #[allow(clippy::unnecessary_cast)]
    Some(kind as u32)
}

/// Files' writeback, started off the guest's thread.
mod writeback {
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
    use std::sync::LazyLock;
    use std::sync::mpsc::{SyncSender, sync_channel};

    /// Descriptors waiting for the thread, for all guests at most: past
    /// it a file is left to the sync that follows, which starts its
    /// writeback itself. Each is closed once its writeback has started.
    pub(super) const MAX_QUEUED: usize = 16;

    /// The writeback thread's queue (`None` if it could not be spawned).
    static QUEUE: LazyLock<Option<SyncSender<OwnedFd>>> = LazyLock::new(|| {
        let (queue, files) = sync_channel::<OwnedFd>(MAX_QUEUED);
        std::thread::Builder::new()
            .name("kvwasm-writeback".into())
            .spawn(move || files.iter().for_each(|file| start(file.as_fd())))
            .ok()?;
        Some(queue)
    });

    /// Have `file`'s writeback started by the thread, if it has room
    /// (whether it had). Full, the sync will start it.
    pub(super) fn queue(file: OwnedFd) -> bool {
        QUEUE
            .as_ref()
            .is_some_and(|queue| queue.try_send(file).is_ok())
    }

    /// Start writing `file`'s dirty pages to the device, without waiting.
    pub(super) fn start(file: BorrowedFd<'_>) {
        // SAFETY: `file` is an open descriptor.
        unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
}

/// `payload-io.find-file`: the regular file at `path` beneath `dir`, its
/// size and whether the host synced this version of it. The directory part
/// is resolved beneath `dir` (never outside the grant); the last component
/// is not followed.
pub(crate) fn find_file(
    dir: &std::fs::File,
    path: &str,
    headroom: &Headroom,
    kept: &KeptDirs,
) -> Result<Option<FoundFile>, ErrorCode> {
    let (sub, name) = split_name(path)?;
    let name = CString::new(name).map_err(|_| ErrorCode::Invalid)?;
    let there = match kept.beneath(dir, sub, headroom)? {
        Beneath::Dir(parent) => stat_at(parent.as_raw_fd(), &name),
        Beneath::Opened(parent) => stat_at(parent.as_raw_fd(), &name),
        Beneath::Itself => stat_at(dir.as_raw_fd(), &name),
        Beneath::Missing => return Ok(None),
    };
    let there = match there {
        Ok(st) => st,
        Err(ErrorCode::NoEntry) => return Ok(None),
        Err(e) => return Err(e),
    };
    match Seen::new(&there)? {
        seen if seen.is_dir => Err(ErrorCode::Unsupported),
        seen => Ok(Some(FoundFile {
            size: seen.version.size as u64,
            durable: seen.is_synced(),
        })),
    }
}

/// Directories kept open for lookups beneath them, shared by every live
/// instance in the process, whatever its backend: a warm save looks up one
/// chunk per put, always in the same 16 fan-out directories, and opening
/// the directory beneath the grant (`openat2`, `close`) cost more than the
/// lookup itself.
///
/// An entry is a directory's descriptor, keyed by its device and inode. It
/// is used for a lookup in `sub` of a guest's directory only when a plain
/// `fstatat` (no link followed) finds that very directory there at the time
/// of the call: the guest reaches it through its own grant anyway, and a
/// directory replaced, moved or removed since it was kept is simply not
/// found under that name (it is opened beneath the grant again, as it was
/// the first time). The descriptor pins the inode, so its number names no
/// other directory while it is kept.
///
/// At most [`KEPT_DIRS`] are kept, and only while the process holds fewer
/// than half the descriptors a store may reach ([`Headroom::may_share`]):
/// 1,000 handles on one store hold three descriptors each plus these 16.
/// Each store (granted directories and namespace) has its own set
/// ([`KeptDirsByStore`]): one store's lookups never go through a directory
/// kept for another, even on a filesystem whose inode numbers do not name
/// one directory (FUSE, overlayfs across filesystems), and a guest looking
/// up in many directories evicts only its own. They close with the store's
/// last instance (an idle release of every instance, or every handle
/// closed), so a filesystem is not held busy by a process that no longer
/// uses it.
#[derive(Default)]
pub(crate) struct KeptDirs {
    dirs: Mutex<Vec<KeptDir>>,
}

/// Directories kept, all instances together: one store's fan-out.
const KEPT_DIRS: usize = 16;

struct KeptDir {
    id: (u64, u64),
    dir: Arc<std::fs::File>,
}

/// Where a lookup beneath a directory happens.
enum Beneath {
    /// In the directory itself (no subdirectory in the path).
    Itself,
    /// In a kept subdirectory.
    Dir(Arc<std::fs::File>),
    /// In a subdirectory opened for this call.
    Opened(std::fs::File),
    /// The subdirectory does not exist.
    Missing,
}

/// Kept directories, one set per store, shared by the store's live
/// instances. A store is its granted host directories and its namespace:
/// handles on the same files share a set (every `wasm:///dir` handle on
/// one directory), other stores never do.
#[derive(Default)]
pub(crate) struct KeptDirsByStore {
    stores: Mutex<HashMap<String, Weak<KeptDirs>>>,
}

impl KeptDirsByStore {
    /// The process's sets.
    pub(crate) fn global() -> &'static KeptDirsByStore {
        static GLOBAL: LazyLock<KeptDirsByStore> = LazyLock::new(KeptDirsByStore::default);
        &GLOBAL
    }

    /// The set the live instances of the store granted `dirs` (host
    /// paths) and opened on `namespace` share (a new one once all are
    /// gone).
    pub(crate) fn for_store<'a>(
        &self,
        dirs: impl IntoIterator<Item = &'a std::path::Path>,
        namespace: &str,
    ) -> Arc<KeptDirs> {
        let dirs: Vec<_> = dirs.into_iter().collect();
        let key = format!("{dirs:?} {namespace:?}");
        let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = stores.get(&key).and_then(Weak::upgrade) {
            return kept;
        }
        stores.retain(|_, kept| kept.strong_count() > 0);
        let kept = Arc::new(KeptDirs::default());
        stores.insert(key, Arc::downgrade(&kept));
        kept
    }
}

impl KeptDirs {
    /// The directory `sub` beneath `dir`: kept if a plain name (one
    /// component) names a kept directory, else opened beneath `dir` (and
    /// kept, while there is room).
    fn beneath(
        &self,
        dir: &std::fs::File,
        sub: &str,
        headroom: &Headroom,
    ) -> Result<Beneath, ErrorCode> {
        if sub.is_empty() {
            return Ok(Beneath::Itself);
        }
        let plain = !sub.contains(['/', '\0']) && sub != "." && sub != "..";
        let mut id = None;
        if plain {
            let name = CString::new(sub).map_err(|_| ErrorCode::Invalid)?;
            match stat_at(dir.as_raw_fd(), &name) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let seen = (st.st_dev, st.st_ino);
                    if let Some(kept) = self.get(seen) {
                        return Ok(Beneath::Dir(kept));
                    }
                    id = Some(seen);
                }
                Err(ErrorCode::NoEntry) => return Ok(Beneath::Missing),
                // A link or a file: opening it beneath `dir` says what.
                _ => {}
            }
        }
        let opened = match open_dir_beneath(dir, sub, headroom) {
            Ok(Some(opened)) => opened,
            Ok(None) => return Ok(Beneath::Itself),
            Err(ErrorCode::NoEntry) => return Ok(Beneath::Missing),
            Err(e) => return Err(e),
        };
        // Kept only if it is the directory the `fstatat` saw (not one
        // renamed into its place since).
        match id {
            Some(id) if Headroom::may_share(opened.as_raw_fd()) => {
                let st = stat_fd(opened.as_raw_fd())?;
                if (st.st_dev, st.st_ino) != id {
                    return Ok(Beneath::Opened(opened));
                }
                let opened = Arc::new(opened);
                self.keep(id, opened.clone());
                Ok(Beneath::Dir(opened))
            }
            _ => Ok(Beneath::Opened(opened)),
        }
    }

    fn get(&self, id: (u64, u64)) -> Option<Arc<std::fs::File>> {
        let dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        dirs.iter().find(|d| d.id == id).map(|d| d.dir.clone())
    }

    /// Keep `dir`, closing the one kept longest if [`KEPT_DIRS`] are.
    fn keep(&self, id: (u64, u64), dir: Arc<std::fs::File>) {
        let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if dirs.iter().any(|d| d.id == id) {
            return;
        }
        if dirs.len() == KEPT_DIRS {
            dirs.remove(0);
        }
        dirs.push(KeptDir { id, dir });
    }
}

/// Sync `name` (a plain name) in `parent`, or `parent` itself, unless the
/// host synced this version of it before.
fn sync_one(
    parent: RawFd,
    name: Option<&str>,
    headroom: &Headroom,
    synced: &mut Synced,
) -> Result<(), ErrorCode> {
    let name = name
        .map(CString::new)
        .transpose()
        .map_err(|_| ErrorCode::Invalid)?;
    let there = match &name {
        Some(name) => stat_at(parent, name)?,
        None => stat_fd(parent)?,
    };
    if Seen::new(&there)?.is_synced() {
        return Ok(());
    }
    let opened = match &name {
        Some(name) => Some(open_at(parent, name, headroom)?),
        None => None,
    };
    let fd = opened.as_ref().map_or(parent, AsRawFd::as_raw_fd);
    // The version synced is the one read from the open descriptor, before
    // the sync: the sync covers it and any change made before it returns.
    let seen = Seen::new(&stat_fd(fd)?)?;
    let coarse_now = coarse_clock();
    // SAFETY: `fd` is a descriptor this call holds open.
    let rc = unsafe {
        if seen.is_dir {
            libc::fsync(fd)
        } else {
            libc::fdatasync(fd)
        }
    };
    if rc != 0 {
        return Err(io_error_code(std::io::Error::last_os_error()));
    }
    seen.record(stamps(fd), coarse_now);
    if seen.is_dir {
        synced.directories += 1;
    } else {
        synced.files += 1;
    }
    Ok(())
}

/// `fstatat` without following a last link (`AT_FDCWD` for a whole path).
pub(super) fn stat_at(dir: RawFd, name: &CStr) -> Result<libc::stat, ErrorCode> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated; `st` is written by a successful call
    // before it is read.
    unsafe {
        if libc::fstatat(
            dir,
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        ) != 0
        {
            return Err(io_error_code(std::io::Error::last_os_error()));
        }
        Ok(st.assume_init())
    }
}

fn stat_fd(fd: RawFd) -> Result<libc::stat, ErrorCode> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: as in `stat_at`.
    unsafe {
        if libc::fstat(fd, st.as_mut_ptr()) != 0 {
            return Err(io_error_code(std::io::Error::last_os_error()));
        }
        Ok(st.assume_init())
    }
}

/// Open the plain name `name` in `dir` to sync it or start its writeback:
/// never a link, and without blocking on (or taking as a terminal) what is
/// not a file or directory, which the callers then refuse.
fn open_at(dir: RawFd, name: &CString, headroom: &Headroom) -> Result<OwnedFd, ErrorCode> {
    let flags =
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated and a plain name (no `/`), resolved
    // in `dir`, a directory descriptor the caller holds.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io_error_code(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if !headroom.keeps(
        fd.as_raw_fd(),
        "opening a file to sync it or start its writeback",
    ) {
        return Err(ErrorCode::InsufficientMemory);
    }
    Ok(fd)
}

/// How the filesystem of a file stamps its changes, as far as the host
/// relies on it to tell versions apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stamps {
    /// Times from elsewhere (a network or FUSE filesystem): what is synced
    /// there is never remembered (each save syncs it again).
    Elsewhere,
    /// This kernel's coarse clock, in nanoseconds: two changes within one
    /// tick may carry the same time.
    CoarseClock,
    /// This kernel's multigrain times: a change after a `stat` carries a
    /// later time than that `stat` read.
    Multigrain,
}

/// How the filesystem `fd` lives on stamps changes: local filesystems the
/// host knows take this kernel's clock; ext4, XFS, Btrfs and tmpfs have
/// multigrain times from Linux 6.13 on (an earlier attempt was reverted
/// before a release, hence the version rather than the filesystem alone).
/// F2FS does not have them, nor do ext2 and ext3, which share ext4's magic
/// number: there the mount's type must say `ext4` ([`mounted_as_ext4`]).
pub(crate) fn stamps(fd: RawFd) -> Stamps {
    const EXT4: u32 = 0xEF53;
    const XFS: u32 = 0x5846_5342;
    const BTRFS: u32 = 0x9123_683E;
    const F2FS: u32 = 0xF2F5_2010;
    let Some(kind) = fs_magic(fd) else {
        return Stamps::Elsewhere;
    };
    match kind {
        XFS | BTRFS | TMPFS_MAGIC if *KERNEL_HAS_MULTIGRAIN_TIMES => Stamps::Multigrain,
        EXT4 if *KERNEL_HAS_MULTIGRAIN_TIMES && mounted_as_ext4(fd) => Stamps::Multigrain,
        EXT4 | XFS | BTRFS | TMPFS_MAGIC | F2FS => Stamps::CoarseClock,
        _ => Stamps::Elsewhere,
    }
}

/// Whether the filesystem `fd` lives on is mounted as `ext4` (not `ext2`
/// or `ext3`, which the same driver serves without multigrain times), by
/// its device in `/proc/self/mountinfo`; remembered per device.
fn mounted_as_ext4(fd: RawFd) -> bool {
    static BY_DEVICE: LazyLock<Mutex<HashMap<u64, bool>>> = LazyLock::new(Default::default);
    let Ok(st) = stat_fd(fd) else {
        return false;
    };
    let mut known = BY_DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ext4) = known.get(&st.st_dev) {
        return *ext4;
    }
    let (major, minor) = (libc::major(st.st_dev), libc::minor(st.st_dev));
    let ext4 = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|mounts| mount_type(&mounts, major, minor) == Some("ext4"));
    if known.len() >= 64 {
        known.clear();
    }
    known.insert(st.st_dev, ext4);
    ext4
}

/// The filesystem type of the mount of device `major:minor` in a
/// `mountinfo` text, if one mount of it is listed (several mounts of one
/// device share its type).
fn mount_type(mountinfo: &str, major: u32, minor: u32) -> Option<&str> {
    let device = format!("{major}:{minor}");
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        (mount.split(' ').nth(2)? == device).then(|| fs.split(' ').next())?
    })
}

/// Whether the running kernel is Linux 6.13 or later (`uname`).
static KERNEL_HAS_MULTIGRAIN_TIMES: LazyLock<bool> = LazyLock::new(|| {
    let mut name = std::mem::MaybeUninit::<libc::utsname>::uninit();
    // SAFETY: `name` is written by a successful call before it is read.
    if unsafe { libc::uname(name.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: the call succeeded; `release` is NUL-terminated.
    let release = unsafe { CStr::from_ptr(name.assume_init_ref().release.as_ptr()) };
    release
        .to_str()
        .ok()
        .and_then(linux_version)
        .is_some_and(|version| version >= (6, 13))
});

/// The major and minor number of a Linux release ("6.18.44-fc" → (6, 18)).
fn linux_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The kernel's coarse real-time clock: what it stamps files with.
pub(super) fn coarse_clock() -> (i64, i64) {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) };
    (now.tv_sec, now.tv_nsec)
}

#[cfg(test)]
mod tests;
