//! Directory grants: a host directory at a guest path. Read-only is
//! enforced by the host (wasmtime-wasi's permission check on every
//! mutation, and kvwasm's own `payload-io` calls), not by the guest.
//!
//! Opening files is kvwasm's own code ([`open_beneath`], also behind
//! `wasi:filesystem`'s `open-at`): nothing a guest opens may block the
//! thread (FIFOs, devices) or exhaust the process's descriptors, and guests
//! may not plant symbolic links ([`add_guards_to_linker`]).

use std::ffi::CString;
use std::path::PathBuf;

use serde::Deserialize;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, Dir, File};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::bindings::sockets::network::{
    ErrorCode as SocketErrorCode, IpAddressFamily,
};
use wasmtime_wasi::{FsPerms, OpenMode, WasiCtxBuilder};

use super::descriptors::Headroom;
use crate::state::HostState;

/// Guest path of the default data directory (the fs backend's root).
pub const DATA_DIR: &str = "/data";

/// One entry of `dirs`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DirConfig {
    /// Host path, relative to the config file's directory (or `base_dir`).
    pub host: PathBuf,
    /// Guest path (default `/data`).
    #[serde(default = "default_guest_dir")]
    pub guest: String,
    #[serde(default)]
    pub read_only: bool,
}

fn default_guest_dir() -> String {
    DATA_DIR.to_owned()
}

impl DirConfig {
    /// The grant, with a relative host path resolved against `base_dir`.
    pub fn grant(self, base_dir: &std::path::Path) -> DirGrant {
        DirGrant {
            host: base_dir.join(&self.host),
            guest: self.guest,
            read_only: self.read_only,
        }
    }
}

/// One directory grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// Host path.
    pub host: PathBuf,
    /// Where the guest sees it (an absolute guest path).
    pub guest: String,
    /// Read-only grants refuse every mutation in the host, whatever the guest does.
    pub read_only: bool,
}

impl DirGrant {
    pub(crate) fn apply(&self, builder: &mut WasiCtxBuilder) -> wasmtime::Result<()> {
        let perms = if self.read_only {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        builder
            .preopened_dir(&self.host, &self.guest, perms)
            .map(drop)
            .map_err(|e| {
                wasmtime::format_err!("cannot grant directory {}: {e}", self.host.display())
            })
    }

    /// `host → guest (ro|rw)`, for logs and `kvwasm check-config`.
    pub fn describe(&self) -> String {
        format!(
            "{} → {} ({})",
            self.host.display(),
            self.guest,
            if self.read_only {
                "read-only"
            } else {
                "read-write"
            }
        )
    }
}

/// A guest path must be absolute, without `.` or `..` components.
pub fn validate_guest_path(path: &str) -> Result<(), String> {
    let ok = path.starts_with('/')
        && path
            .split('/')
            .skip(1)
            .all(|c| !c.is_empty() && c != "." && c != "..")
        || path == "/";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "guest path {path:?} must be absolute, without empty, `.` or `..` components"
        ))
    }
}

/// How a file or directory beneath a grant was opened.
pub(crate) enum Opened {
    /// A regular file, and its size when opened (one `fstat` serves both
    /// the check and the caller).
    File(std::fs::File, u64),
    Dir(std::fs::File),
}

/// Open `path` beneath `dir` (never outside it: openat2 `RESOLVE_BENEATH`,
/// or cap-std's own resolution) without ever blocking the calling thread.
///
/// `open(2)` on a FIFO blocks until a writer appears, and device files do
/// what their drivers do; no deadline can interrupt a thread stuck there.
/// So the file is opened `O_NONBLOCK` and `fstat`ed, and anything but a
/// regular file or a directory is refused (`unsupported`). The descriptor
/// must also fit the guest's share of the process's descriptors (see
/// [`super::descriptors`]).
pub(crate) fn open_beneath(
    dir: &std::fs::File,
    path: &str,
    options: &mut cap_primitives::fs::OpenOptions,
    follow_symlinks: bool,
    headroom: &Headroom,
) -> Result<Opened, ErrorCode> {
    use cap_primitives::fs::OpenOptionsExt;
    let mut flags = libc::O_NONBLOCK;
    if !follow_symlinks {
        flags |= libc::O_NOFOLLOW;
    }
    options.custom_flags(flags);
    let file = keep_within_headroom(
        cap_primitives::fs::open(dir, std::path::Path::new(path), options),
        headroom,
    )?;
    let meta = file.metadata().map_err(io_error_code)?;
    let kind = meta.file_type();
    if kind.is_dir() {
        Ok(Opened::Dir(file))
    } else if kind.is_file() {
        Ok(Opened::File(file, meta.len()))
    } else {
        let backend = &*headroom.backend;
        crate::log_limit::warn(
            ("non-regular file", backend),
            format_args!(
                "backend {backend:?}: refused to open {:?}: not a regular file or directory \
                 (a FIFO or device could block the call past its deadline)",
                crate::log_limit::bounded(path.to_owned())
            ),
        );
        Err(ErrorCode::Unsupported)
    }
}

/// Linux's `NAME_MAX` and `PATH_MAX`: longer names are refused before
/// anything is copied or resolved.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;

/// Split `path` into its directory (`""` for a bare name) and its last
/// component, which must be a plain name (not empty, `.` or `..`).
pub(crate) fn split_name(path: &str) -> Result<(&str, &str), ErrorCode> {
    if path.len() > PATH_MAX {
        return Err(ErrorCode::NameTooLong);
    }
    let (dir, name) = match path.rsplit_once('/') {
        // An absolute path is outside every grant.
        Some(("", _)) => return Err(ErrorCode::NotPermitted),
        Some(split) => split,
        None => ("", path),
    };
    if matches!(name, "" | "." | "..") || name.contains('\0') {
        return Err(ErrorCode::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(ErrorCode::NameTooLong);
    }
    Ok((dir, name))
}

/// Open the directory `path` beneath `dir` to create entries in it; `None`
/// for `""` (`dir` itself). A symbolic link at `path` is refused, and
/// `O_DIRECTORY` opens nothing that could block, so unlike
/// [`open_beneath`] no `fstat` is needed.
pub(crate) fn open_dir_beneath(
    dir: &std::fs::File,
    path: &str,
    headroom: &Headroom,
) -> Result<Option<std::fs::File>, ErrorCode> {
    if path.is_empty() {
        return Ok(None);
    }
    keep_within_headroom(
        cap_primitives::fs::open_dir_nofollow(dir, std::path::Path::new(path)),
        headroom,
    )
    .map(Some)
}

/// A regular file this host call created under a plain name in `parent`,
/// open for writing; [`NewFile::remove`] takes it back if what follows
/// fails.
pub(crate) struct NewFile<'a> {
    pub(crate) file: std::fs::File,
    parent: &'a std::fs::File,
    name: CString,
}

impl<'a> NewFile<'a> {
    /// Create `name` (a plain name, see [`split_name`]) in `parent`.
    /// `O_CREAT | O_EXCL` only ever makes a new regular file: anything
    /// already there (a FIFO, a link) is `exist`, so no `fstat` is needed.
    pub(crate) fn create(
        parent: &'a std::fs::File,
        name: &str,
        headroom: &Headroom,
    ) -> Result<NewFile<'a>, ErrorCode> {
        use cap_primitives::fs::OpenOptionsExt;
        use std::os::fd::AsRawFd;
        let c_name = CString::new(name).map_err(|_| ErrorCode::Invalid)?;
        let mut options = cap_primitives::fs::OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
        let file = cap_primitives::fs::open(parent, std::path::Path::new(name), &options)
            .map_err(io_error_code)?;
        let created = NewFile {
            file,
            parent,
            name: c_name,
        };
        if !headroom.keeps(created.file.as_raw_fd(), "creating a file") {
            created.remove();
            return Err(ErrorCode::InsufficientMemory);
        }
        Ok(created)
    }

    /// Rename the file to `name` (a plain name) in the same directory,
    /// replacing what is there; a rename never follows a link. On failure
    /// the file is removed.
    pub(crate) fn rename(self, name: &str) -> Result<(), ErrorCode> {
        use std::os::fd::AsRawFd;
        let Ok(target) = CString::new(name) else {
            self.remove();
            return Err(ErrorCode::Invalid);
        };
        let dir = self.parent.as_raw_fd();
        // SAFETY: two NUL-terminated names that outlive the call, resolved
        // in `parent`, a descriptor we hold.
        if unsafe { libc::renameat(dir, self.name.as_ptr(), dir, target.as_ptr()) } == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        self.remove();
        Err(io_error_code(error))
    }

    /// Remove the file, if its name still leads to it: another process
    /// sharing the directory may have put something else there since.
    pub(crate) fn remove(self) {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let Ok(ours) = self.file.metadata() else {
            return;
        };
        let mut there = std::mem::MaybeUninit::<libc::stat>::uninit();
        let dir = self.parent.as_raw_fd();
        // SAFETY: `there` is written by a successful `fstatat` before it is
        // read; the name is NUL-terminated and outlives both calls.
        unsafe {
            if libc::fstatat(
                dir,
                self.name.as_ptr(),
                there.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            ) == 0
            {
                let there = there.assume_init();
                if there.st_dev == ours.dev() && there.st_ino == ours.ino() {
                    libc::unlinkat(dir, self.name.as_ptr(), 0);
                }
            }
        }
    }
}

/// A descriptor just opened, kept only if it fits the guest's share of
/// the process's descriptors (see [`super::descriptors`]).
fn keep_within_headroom(
    opened: std::io::Result<std::fs::File>,
    headroom: &Headroom,
) -> Result<std::fs::File, ErrorCode> {
    use std::os::fd::AsRawFd;
    let file = opened.map_err(io_error_code)?;
    if !headroom.keeps(file.as_raw_fd(), "opening a file") {
        return Err(ErrorCode::InsufficientMemory);
    }
    Ok(file)
}

/// The `wasi:filesystem` error code closest to an I/O error.
pub(crate) fn io_error_code(e: std::io::Error) -> ErrorCode {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => ErrorCode::InsufficientSpace,
        Some(libc::EDQUOT) => ErrorCode::Quota,
        Some(libc::EFBIG) => ErrorCode::FileTooLarge,
        Some(libc::EACCES) => ErrorCode::Access,
        Some(libc::EPERM) => ErrorCode::NotPermitted,
        Some(libc::EBADF) => ErrorCode::BadDescriptor,
        Some(libc::EISDIR) => ErrorCode::IsDirectory,
        Some(libc::ENOENT) => ErrorCode::NoEntry,
        Some(libc::ENOTDIR) => ErrorCode::NotDirectory,
        Some(libc::ELOOP) => ErrorCode::Loop,
        Some(libc::EEXIST) => ErrorCode::Exist,
        Some(libc::EXDEV) => ErrorCode::NotPermitted,
        Some(libc::EMFILE | libc::ENFILE) => ErrorCode::InsufficientMemory,
        _ if e.kind() == std::io::ErrorKind::OutOfMemory => ErrorCode::InsufficientMemory,
        _ => ErrorCode::Io,
    }
}

/// Replace the `wasi:filesystem` and `wasi:sockets` functions whose stock
/// versions could block past a deadline or reach outside a grant:
///
/// * `open-at` opens through [`open_beneath`] (no FIFOs, no devices, within
///   the instance's `max_descriptors` and its share of the process's
///   descriptors);
/// * `symlink-at` is refused: a link the guest plants inside its grant is
///   harmless to the host (which never follows it out) but not to another
///   program sharing the directory, such as a native backend;
/// * `read-directory` is refused unless the backend sets `list_dirs`:
///   wasmtime-wasi reads the whole listing (an `fstatat` per entry) into
///   host memory, inline, so a guest that filled its grant with entries
///   could hold host memory past its caps and overrun its deadline;
/// * `create-tcp-socket` first checks the same two limits.
pub(crate) fn add_guards_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut fs = linker.instance(FILESYSTEM_TYPES)?;
    fs.func_wrap(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, HostState>,
         (dir, path_flags, path, oflags, flags): OpenAtParams| {
            Ok((open_at(
                store.data_mut(),
                dir,
                path_flags,
                path,
                oflags,
                flags,
            )?,))
        },
    )?;
    fs.func_wrap(
        "[method]descriptor.symlink-at",
        |store: StoreContextMut<'_, HostState>,
         (_dir, _target, link): (Resource<Descriptor>, String, String)| {
            let backend = &store.data().backend;
            crate::log_limit::warn(
                ("symlink refused", backend.as_ref()),
                format_args!(
                    "backend {backend:?}: refused to create the symbolic link {:?}: \
                     guests may not create links in their grants",
                    crate::log_limit::bounded(link)
                ),
            );
            Ok((Err::<(), _>(ErrorCode::NotPermitted),))
        },
    )?;
    fs.func_wrap_async(
        "[method]descriptor.read-directory",
        |mut store: StoreContextMut<'_, HostState>, (dir,): (Resource<Descriptor>,)| {
            Box::new(async move {
                use wasmtime_wasi::filesystem::WasiFilesystemView;
                use wasmtime_wasi::p2::bindings::filesystem::types::HostDescriptor;
                let state = store.data_mut();
                if !state.list_dirs {
                    let backend = state.backend.clone();
                    crate::log_limit::warn(
                        ("listing refused", backend.as_ref()),
                        format_args!(
                            "backend {backend:?}: refused to list a directory \
                             (not granted: `list_dirs`)"
                        ),
                    );
                    return Ok((Err(ErrorCode::NotPermitted),));
                }
                match state.filesystem().read_directory(dir).await {
                    Ok(stream) => Ok((Ok(stream),)),
                    Err(e) => Ok((Err(e.downcast()?),)),
                }
            })
        },
    )?;
    let mut tcp = linker.instance(SOCKETS_TCP_CREATE)?;
    tcp.func_wrap(
        "create-tcp-socket",
        |mut store: StoreContextMut<'_, HostState>, (family,): (IpAddressFamily,)| {
            use wasmtime_wasi::p2::bindings::sockets::tcp_create_socket::Host;
            use wasmtime_wasi::sockets::WasiSocketsView;
            let state = store.data_mut();
            let what = "creating a socket";
            if !state.headroom.may_open(&mut state.table, what) || !state.headroom.has_room(what) {
                return Ok((Err(SocketErrorCode::NewSocketLimit),));
            }
            match state.sockets().create_tcp_socket(family) {
                Ok(socket) => Ok((Ok(socket),)),
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interfaces [`add_guards_to_linker`] replaces functions of, as
/// wasmtime-wasi 48 names them (guests importing any 0.2.x resolve to them).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";
const SOCKETS_TCP_CREATE: &str = "wasi:sockets/tcp-create-socket@0.2.12";

type OpenAtParams = (
    Resource<Descriptor>,
    PathFlags,
    String,
    OpenFlags,
    DescriptorFlags,
);

/// `open-at` with the same permission rules as wasmtime-wasi's, opened by
/// [`open_beneath`].
fn open_at(
    state: &mut HostState,
    dir: Resource<Descriptor>,
    path_flags: PathFlags,
    path: String,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> wasmtime::Result<Result<Resource<Descriptor>, ErrorCode>> {
    let dir = match state.table.get(&dir)? {
        Descriptor::Dir(d) => d.clone(),
        Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
    };
    let mut options = cap_primitives::fs::OpenOptions::new();
    let mut mode = OpenMode::empty();
    let create = oflags.contains(OpenFlags::CREATE);
    if create {
        options.write(true);
        if oflags.contains(OpenFlags::EXCLUSIVE) {
            options.create_new(true);
        } else {
            options.create(true);
        }
        mode |= OpenMode::WRITE;
    }
    if oflags.contains(OpenFlags::TRUNCATE) {
        options.truncate(true).write(true);
        mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::WRITE) {
        options.write(true);
        mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::READ) || !flags.contains(DescriptorFlags::WRITE) {
        // Opened for reading unless only writing was asked for; the
        // descriptor's mode still governs what the guest may do with it.
        options.read(true);
        mode |= OpenMode::READ;
    }
    let wants_dir = oflags.contains(OpenFlags::DIRECTORY);
    if wants_dir && (create || oflags.contains(OpenFlags::TRUNCATE)) {
        return Ok(Err(ErrorCode::Invalid));
    }
    if flags.intersects(
        DescriptorFlags::FILE_INTEGRITY_SYNC
            | DescriptorFlags::DATA_INTEGRITY_SYNC
            | DescriptorFlags::REQUESTED_WRITE_SYNC,
    ) {
        return Ok(Err(ErrorCode::Unsupported));
    }
    if dir.perms.write_not_permitted() && mode.contains(OpenMode::WRITE) {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    if !state.headroom.may_open(&mut state.table, "opening a file") {
        return Ok(Err(ErrorCode::InsufficientMemory));
    }
    let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
    let opened = match open_beneath(&dir.dir, &path, &mut options, follow, &state.headroom) {
        Ok(opened) => opened,
        Err(code) => return Ok(Err(code)),
    };
    // `allow_blocking_current_thread` is always on (see `Grants::wasi_ctx`).
    let descriptor = match opened {
        Opened::Dir(d) => Descriptor::Dir(Dir::new(d, dir.perms, mode, true)),
        Opened::File(..) if wants_dir => return Ok(Err(ErrorCode::NotDirectory)),
        Opened::File(f, _) => Descriptor::File(File::new(f, dir.perms, mode, true)),
    };
    Ok(Ok(state.table.push(descriptor)?))
}
