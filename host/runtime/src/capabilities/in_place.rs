//! A `put_chunk` on a `builtin:fs` store answered by the host, without a
//! guest instance, when the fs guest would only find the chunk in place.
//!
//! A warm save puts chunks that are already there. The fs guest answers
//! such a put "already present" after one `find-file` and, at the next
//! manifest, asks the host to sync the file, its fan-out directory and
//! `chunks` unless the host synced those very versions before
//! ([`super::durable`]). When all three are versions the host synced, and
//! the file has the put's length, the guest's answer is known in advance
//! and it would sync nothing for this put: the host answers itself. After
//! an idle release a warm save then starts an instance only for its
//! manifest.
//!
//! The guest's layout (`kvwasm_fs_layout`) names the paths:
//! `<grant>/<namespace dirs>/chunks/<fan-out>/<hex of hash>`. Each call
//! checks that every directory on that path is still the one kept open for
//! it, by a `stat` of its name that follows no link: the first one beneath
//! the grant by its whole path (the grant's own path is resolved as its
//! preopen is: it is the operator's), each further one by `fstatat` in the
//! directory kept before it. A directory renamed or replaced since is thus
//! never trusted. The chunk file is then `fstatat`ed in its fan-out
//! directory without following it. For the empty namespace that is three
//! system calls (native: one `stat`). Anything unexpected (a link, a
//! missing name, a size or version mismatch, no descriptor room) sends the
//! put to the guest as before.
//!
//! Kept open per store (granted directory and namespace), shared by its
//! handles: the namespace directories, `chunks` and up to 16 fan-out
//! directories, as `O_PATH` descriptors, and only while the process holds
//! fewer than half the descriptors a store may reach
//! ([`Headroom::may_share`]). They are closed once no handle on the store
//! has an instance ([`FoundInPlace::in_use`]: all were released at idle),
//! and with the store's last handle; the next lookup opens them again
//! (about 40 system calls).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock, Weak};

use kvwasm_fs_layout::{FANOUT_DIRS, MAX_HASH_LEN, fanout_slot, push_chunk_name};

use super::descriptors::Headroom;
use super::durable::{self, Stamps, all_synced};
use super::store_dirs::StoreDirs;

/// The chunks of one `builtin:fs` store the host may find in place.
pub(crate) struct FoundInPlace {
    dirs: StoreDirs,
    kept: RwLock<Option<Kept>>,
    /// Pools on this store with live instances ([`InUse`]).
    users: Mutex<usize>,
    /// `chunks` is on a filesystem where the host remembers no sync
    /// (network, FUSE, whole-second times): no put is ever answered here,
    /// so none is looked up.
    never: AtomicBool,
}

/// Directories kept open, each with the (device, inode) it had when
/// opened.
struct Kept {
    /// The first directory beneath the grant, then one for each name of
    /// [`StoreDirs::rest`]: the last is `chunks`.
    path: Vec<KeptDir>,
    fanout: [Option<KeptDir>; FANOUT_DIRS.len()],
}

struct KeptDir {
    fd: OwnedFd,
    id: (u64, u64),
}

/// A fan-out directory and `chunks`, as a lookup just saw them.
struct FanOut {
    fanout: libc::stat,
    chunks: libc::stat,
}

impl Kept {
    /// Open the fan-out directory `slot` where it was just seen, keep it
    /// (while there is room) and look the chunk up in it; used only if it
    /// is that directory, not one renamed into its place since.
    fn open_fanout(&mut self, slot: usize, seen: &FanOut, name: &CStr, len: usize) -> bool {
        let Some(chunks_dir) = self.path.last() else {
            return false;
        };
        let Some(dir) = open_dir_at(chunks_dir.fd.as_raw_fd(), &FANOUT_NAMES[slot]) else {
            return false;
        };
        if dir.id != id(&seen.fanout) {
            return false;
        }
        let durable = file_durable(dir.fd.as_raw_fd(), name, len, &seen.fanout, &seen.chunks);
        // The one kept before, if any, names a directory no longer there.
        self.fanout[slot] = Headroom::may_share(dir.fd.as_raw_fd()).then_some(dir);
        durable
    }
}

/// Whether the regular file `name` in `fanout_fd` has `len` bytes, and it,
/// `fanout` and `chunks` are versions the host synced.
fn file_durable(
    fanout_fd: RawFd,
    name: &CStr,
    len: usize,
    fanout: &libc::stat,
    chunks: &libc::stat,
) -> bool {
    match stat_at(fanout_fd, name) {
        Some(file)
            if file.st_mode & libc::S_IFMT == libc::S_IFREG
                && u64::try_from(file.st_size) == Ok(len as u64) =>
        {
            all_synced(&[&file, fanout, chunks])
        }
        _ => false,
    }
}

/// Stores with an open handle, by granted directory and namespace.
type Stores = HashMap<(CString, String), Weak<FoundInPlace>>;
static STORES: LazyLock<Mutex<Stores>> = LazyLock::new(Default::default);

impl FoundInPlace {
    /// The store of `namespace` (a valid one: the guest opened it) in the
    /// directory granted at `grant`, shared with the other open handles on
    /// it.
    pub(crate) fn for_store(grant: &Path, namespace: &str) -> Option<Arc<FoundInPlace>> {
        let key = (
            CString::new(grant.as_os_str().as_bytes()).ok()?,
            namespace.to_owned(),
        );
        let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(store) = stores.get(&key).and_then(Weak::upgrade) {
            return Some(store);
        }
        let store = Arc::new(FoundInPlace {
            dirs: StoreDirs::new(grant, namespace)?,
            kept: RwLock::default(),
            users: Mutex::new(0),
            never: AtomicBool::new(false),
        });
        stores.retain(|_, store| store.strong_count() > 0);
        stores.insert(key, Arc::downgrade(&store));
        Some(store)
    }

    /// A pool on this store has live instances: the directories kept stay
    /// open until no pool has (each [`InUse`] dropped), so that an idle
    /// process holds nothing open beneath the grant, while one handle's
    /// release leaves a sibling's kept directories open.
    pub(crate) fn in_use(self: &Arc<Self>) -> InUse {
        *self.users.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        InUse(self.clone())
    }

    /// Whether the chunk `hash` is in place with `len` bytes, and it, its
    /// fan-out directory and `chunks` are versions the host synced: the
    /// guest would answer "already present" and sync nothing for it.
    ///
    /// Looked up under a read lock, so the puts of concurrent saves on the
    /// store do not wait for each other; the write lock is taken only to
    /// open what is not kept yet (or no longer names the kept directory).
    pub(crate) fn durable(&self, hash: &[u8], len: usize) -> bool {
        if hash.is_empty() || hash.len() > MAX_HASH_LEN || self.never.load(Ordering::Relaxed) {
            return false;
        }
        let mut name = String::with_capacity(2 * MAX_HASH_LEN + 1);
        push_chunk_name(&mut name, hash);
        name.push('\0');
        let Ok(name) = CStr::from_bytes_with_nul(name.as_bytes()) else {
            return false;
        };
        let slot = fanout_slot(hash);
        if let Some(kept) = self.kept.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            match self.look(kept, slot, name, len) {
                Look::Answer(durable) => return durable,
                Look::Stale | Look::OpenFanOut(_) => {}
            }
        }
        let mut kept = self.kept.write().unwrap_or_else(|e| e.into_inner());
        // Kept directories found renamed or replaced are opened afresh,
        // once.
        for _ in 0..2 {
            if kept.is_none() {
                let Some(path) = self.open_path() else {
                    return false;
                };
                *kept = Some(Kept {
                    path,
                    fanout: Default::default(),
                });
            }
            let Some(open) = kept.as_mut() else {
                return false;
            };
            match self.look(open, slot, name, len) {
                Look::Answer(durable) => return durable,
                Look::Stale => *kept = None,
                Look::OpenFanOut(fanout) => return open.open_fanout(slot, &fanout, name, len),
            }
        }
        false
    }

    /// The lookup through the directories kept, up to the fan-out
    /// directory: `OpenFanOut` with its `stat` if the one kept for `slot`
    /// (if any) is not the one its name names now.
    fn look(&self, kept: &Kept, slot: usize, name: &CStr, len: usize) -> Look {
        let mut seen = match stat_at(libc::AT_FDCWD, &self.dirs.first) {
            Some(st) if is_dir(&st) && id(&st) == kept.path[0].id => st,
            _ => return Look::Stale,
        };
        for (pair, name) in kept.path.windows(2).zip(&self.dirs.rest) {
            match stat_at(pair[0].fd.as_raw_fd(), name) {
                Some(st) if is_dir(&st) && id(&st) == pair[1].id => seen = st,
                _ => return Look::Stale,
            }
        }
        let (chunks, Some(chunks_dir)) = (seen, kept.path.last()) else {
            return Look::Answer(false);
        };
        let fanout = match stat_at(chunks_dir.fd.as_raw_fd(), &FANOUT_NAMES[slot]) {
            Some(st) if is_dir(&st) && all_synced(&[&chunks, &st]) => st,
            _ => return Look::Answer(false),
        };
        match &kept.fanout[slot] {
            Some(dir) if dir.id == id(&fanout) => Look::Answer(file_durable(
                dir.fd.as_raw_fd(),
                name,
                len,
                &fanout,
                &chunks,
            )),
            _ => Look::OpenFanOut(Box::new(FanOut { fanout, chunks })),
        }
    }

    /// The directories beneath the grant down to `chunks`, each opened in
    /// the one before without following a link; `None` if one is missing,
    /// no descriptor may be kept, or `chunks` is where no sync is
    /// remembered.
    fn open_path(&self) -> Option<Vec<KeptDir>> {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let StoreDirs { grant, first, rest } = &self.dirs;
        // SAFETY: `grant` is NUL-terminated.
        let grant_dir = keep(unsafe { libc::open(grant.as_ptr(), flags) })?;
        let first_name =
            CString::new(&first.as_bytes()[grant.as_bytes().len() + 1..]).expect("no NUL");
        let shareable = |dir: &KeptDir| Headroom::may_share(dir.fd.as_raw_fd());
        let mut path = vec![open_dir_at(grant_dir.fd.as_raw_fd(), &first_name).filter(shareable)?];
        for name in rest {
            let parent = path.last()?.fd.as_raw_fd();
            path.push(open_dir_at(parent, name).filter(shareable)?);
        }
        let chunks = path.last()?.fd.as_raw_fd();
        if durable::stamps(chunks) == Stamps::Elsewhere || whole_second_times(chunks) {
            self.never.store(true, Ordering::Relaxed);
            return None;
        }
        Some(path)
    }
}

/// A pool on a store with live instances ([`FoundInPlace::in_use`]). When
/// the last is dropped the store's kept directories close; the next lookup
/// opens them again.
pub(crate) struct InUse(Arc<FoundInPlace>);

impl Drop for InUse {
    fn drop(&mut self) {
        let mut users = self.0.users.lock().unwrap_or_else(|e| e.into_inner());
        *users -= 1;
        if *users == 0 {
            let closed = self
                .0
                .kept
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            drop(closed);
        }
    }
}

/// Whether `dir` carries whole-second times (ext2, ext3, ext4 with small
/// inodes share ext4's magic number): the host remembers no sync there
/// ([`super::durable`]), so it could never answer. A directory whose
/// times both fall on a whole second by chance only loses the lookup.
fn whole_second_times(dir: RawFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `dir` is open; `st` is read only after a successful call.
    unsafe {
        libc::fstat(dir, st.as_mut_ptr()) != 0 || {
            let st = st.assume_init();
            st.st_ctime_nsec == 0 && st.st_mtime_nsec == 0
        }
    }
}

/// [`FANOUT_DIRS`], NUL-terminated.
static FANOUT_NAMES: LazyLock<Vec<CString>> = LazyLock::new(|| {
    FANOUT_DIRS
        .iter()
        .map(|dir| CString::new(*dir).expect("no NUL"))
        .collect()
});

enum Look {
    Answer(bool),
    /// A kept directory is no longer the one its name names.
    Stale,
    /// The fan-out directory is to be opened (see [`FoundInPlace::look`]).
    OpenFanOut(Box<FanOut>),
}

/// Open the directory `name` (a plain name) in `parent` as an `O_PATH`
/// descriptor, never through a link (`O_NOFOLLOW` on `O_PATH` would open
/// the link itself: the `fstat` refuses it).
fn open_dir_at(parent: RawFd, name: &CStr) -> Option<KeptDir> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated, `parent` a descriptor the caller holds.
    keep(unsafe { libc::openat(parent, name.as_ptr(), flags) })
}

/// Own `fd` (if the open succeeded) and read its identity; only a
/// directory.
fn keep(fd: RawFd) -> Option<KeptDir> {
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fd` is open; `st` is read only after a successful call.
    let st = unsafe {
        if libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) != 0 {
            return None;
        }
        st.assume_init()
    };
    is_dir(&st).then(|| KeptDir { id: id(&st), fd })
}

/// `fstatat` without following a last link (`AT_FDCWD` for a whole path).
fn stat_at(dir: RawFd, name: &CStr) -> Option<libc::stat> {
    durable::stat_at(dir, name).ok()
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn id(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::descriptors::Share;
    use crate::capabilities::durable::{coarse_clock, sync_paths};
    use std::os::unix::fs::MetadataExt;

    /// A store's directory with one chunk in place, not yet synced.
    struct Store {
        _dir: tempfile::TempDir,
        grant: std::path::PathBuf,
        hash: Vec<u8>,
        found: Arc<FoundInPlace>,
    }

    const CHUNK: &[u8] = b"chunk bytes";

    impl Store {
        fn new(namespace: &str) -> Store {
            let dir = tempfile::tempdir().unwrap();
            let grant = dir.path().join("grant");
            let hash = vec![0xa7, 0x01];
            let store = Store {
                found: FoundInPlace::for_store(&grant, namespace).unwrap(),
                grant,
                hash,
                _dir: dir,
            };
            std::fs::create_dir_all(store.fanout()).unwrap();
            std::fs::write(store.file(), CHUNK).unwrap();
            store
        }

        fn chunks(&self) -> std::path::PathBuf {
            let mut chunks = std::path::PathBuf::from(self.found.dirs.first.to_str().unwrap());
            for part in self.found.dirs.rest.iter() {
                chunks.push(part.to_str().unwrap());
            }
            chunks
        }

        fn fanout(&self) -> std::path::PathBuf {
            self.chunks().join("a")
        }

        fn file(&self) -> std::path::PathBuf {
            self.fanout().join("a701")
        }

        /// Sync `paths` (beneath `chunks`) as a guest's `sync-paths` does,
        /// once every change so far is older than the coarse clock (so the
        /// syncs are remembered).
        fn sync(&self, paths: &[&str]) {
            for path in paths {
                let meta = std::fs::symlink_metadata(self.chunks().join(path)).unwrap();
                while coarse_clock() <= (meta.ctime(), meta.ctime_nsec()) {
                    std::thread::yield_now();
                }
            }
            let chunks = std::fs::File::open(self.chunks()).unwrap();
            let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
            let headroom = Headroom::new("test".into(), Share::Store, None);
            sync_paths(&chunks, &paths, &headroom).unwrap();
        }

        fn durable(&self) -> bool {
            self.found.durable(&self.hash, CHUNK.len())
        }
    }

    #[test]
    fn only_a_file_and_directories_the_host_synced_unchanged_with_the_size_are_found() {
        let store = Store::new("");
        assert!(!store.durable(), "never synced");
        store.sync(&["a/a701", "a"]);
        assert!(!store.durable(), "`chunks` not synced");
        store.sync(&["."]);
        assert!(store.durable());
        assert!(!store.found.durable(&store.hash, CHUNK.len() + 1), "size");
        assert!(!store.found.durable(&[0xa7, 0x02], CHUNK.len()), "missing");
        assert!(!store.found.durable(&[], 0) && !store.found.durable(&[0xa7; 65], 0));

        // Another file added to the fan-out directory: its new version was
        // never synced.
        std::fs::write(store.fanout().join("a702"), CHUNK).unwrap();
        assert!(!store.durable(), "fan-out directory changed");
        store.sync(&["a"]);
        assert!(store.durable());
        std::fs::create_dir(store.chunks().join("b")).unwrap();
        assert!(!store.durable(), "`chunks` changed");
    }

    #[test]
    fn a_rewritten_replaced_or_touched_chunk_is_not_found() {
        let store = Store::new("team/chunks");
        assert!(store.chunks().ends_with("team/..chunks/chunks"));
        let synced = || {
            store.sync(&["a/a701", "a", "."]);
            assert!(store.durable());
        };
        synced();
        std::fs::write(store.file(), b"CHUNK BYTES").unwrap();
        assert!(!store.durable(), "rewritten in place, same size");
        synced();
        std::fs::File::options()
            .write(true)
            .open(store.file())
            .unwrap()
            .set_modified(std::time::SystemTime::UNIX_EPOCH)
            .unwrap();
        assert!(!store.durable(), "touched");
        synced();
        let tmp = store.fanout().join("tmp");
        std::fs::write(&tmp, CHUNK).unwrap();
        std::fs::rename(&tmp, store.file()).unwrap();
        store.sync(&["a", "."]);
        assert!(!store.durable(), "replaced: a new inode, never synced");
    }

    /// A kept directory moved away and replaced by another real one is
    /// not looked through: the synced chunk beneath the old one would
    /// otherwise answer for the new, never synced, one.
    #[test]
    fn a_replaced_namespace_or_fanout_directory_is_looked_up_afresh() {
        let store = Store::new("team");
        store.sync(&["a/a701", "a", "."]);
        assert!(store.durable());

        let namespace = store.grant.join("team");
        std::fs::rename(&namespace, store.grant.join("team-old")).unwrap();
        std::fs::create_dir_all(store.fanout()).unwrap();
        std::fs::write(store.file(), CHUNK).unwrap();
        store.sync(&["a", "."]);
        assert!(
            !store.durable(),
            "the new namespace's chunk was never synced"
        );
        store.sync(&["a/a701"]);
        assert!(store.durable());

        std::fs::rename(store.fanout(), store.chunks().join("a-old")).unwrap();
        std::fs::create_dir(store.fanout()).unwrap();
        std::fs::write(store.file(), CHUNK).unwrap();
        store.sync(&["a", "."]);
        assert!(!store.durable(), "the new fan-out's chunk was never synced");
        store.sync(&["a/a701"]);
        assert!(store.durable());
    }

    #[test]
    fn no_link_is_followed_and_a_replaced_directory_is_not_trusted() {
        let store = Store::new("");
        let synced = |paths: &[&str]| {
            store.sync(paths);
            store.durable()
        };
        let all = ["a/a701", "a", "."];
        assert!(synced(&all));

        // The chunk a link to a synced file.
        let elsewhere = store.grant.join("elsewhere");
        std::fs::rename(store.file(), &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, store.file()).unwrap();
        assert!(!synced(&["a", "."]), "a chunk that is a link");
        std::fs::remove_file(store.file()).unwrap();
        std::fs::rename(&elsewhere, store.file()).unwrap();
        assert!(synced(&all));

        // The fan-out directory a link to the synced one.
        std::fs::rename(store.fanout(), store.chunks().join("real-a")).unwrap();
        std::os::unix::fs::symlink("real-a", store.fanout()).unwrap();
        store.sync(&["real-a", "."]);
        assert!(!store.durable(), "a fan-out directory that is a link");
        std::fs::remove_file(store.fanout()).unwrap();
        std::fs::rename(store.chunks().join("real-a"), store.fanout()).unwrap();
        assert!(synced(&all));

        // `chunks` moved away (its kept descriptor still reaches the synced
        // file) and replaced by another directory, then by a link to it.
        let moved = store.grant.join("moved");
        std::fs::rename(store.chunks(), &moved).unwrap();
        std::fs::create_dir_all(store.fanout()).unwrap();
        assert!(!synced(&["a", "."]), "the new `chunks` has no such chunk");
        std::fs::remove_dir_all(store.chunks()).unwrap();
        std::os::unix::fs::symlink("moved", store.chunks()).unwrap();
        assert!(!store.durable(), "`chunks` is a link");
        std::fs::remove_file(store.chunks()).unwrap();
        std::fs::rename(&moved, store.chunks()).unwrap();
        assert!(synced(&all), "back, as a directory");
    }

    #[test]
    fn handles_on_one_store_share_its_directories_closed_when_no_pool_uses_them_and_with_the_last()
    {
        let store = Store::new("ns");
        let other = FoundInPlace::for_store(&store.grant, "ns").unwrap();
        assert!(Arc::ptr_eq(&store.found, &other));
        let elsewhere = FoundInPlace::for_store(&store.grant, "other").unwrap();
        assert!(!Arc::ptr_eq(&store.found, &elsewhere));
        store.sync(&["a/a701", "a", "."]);
        assert!(store.durable());
        let grant = store.grant.canonicalize().unwrap();
        let held = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.starts_with(&grant))
                .count()
        };
        assert_eq!(held(), 3, "`ns`, `chunks`, `a`");

        // Two pools with live instances; one is released at idle.
        let (first, second) = (store.found.in_use(), other.in_use());
        drop(first);
        assert_eq!(held(), 3, "the other pool still has an instance");
        drop(second);
        assert_eq!(held(), 0, "no pool on the store has an instance");
        assert!(store.durable(), "opened again by the next lookup");
        assert_eq!(held(), 3);

        drop(other);
        assert_eq!(held(), 3, "a handle on the store is still open");
        let Store { _dir, found, .. } = store;
        drop(found);
        assert_eq!(held(), 0, "closed with the store's last handle");
    }
}
