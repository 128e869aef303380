//! Directory grants: a host directory at a guest path. Read-only is
//! enforced by the host (wasmtime-wasi's permission check on every
//! mutation, and kvwasm's own `payload-io` calls), not by the guest.
//!
//! Opening files is kvwasm's own code ([`open_beneath`], also behind
//! `wasi:filesystem`'s `open-at`): nothing a guest opens may block the
//! thread (FIFOs, devices) or exhaust the process's descriptors, and guests
//! may not plant symbolic links (`guards::dirs`).

use std::ffi::CString;
use std::path::PathBuf;

use serde::Deserialize;

use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::descriptors::Headroom;

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
