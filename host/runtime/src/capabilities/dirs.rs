//! Directory grants: a host directory at a guest path. Read-only is
//! enforced by the host (wasmtime-wasi's permission check on every
//! mutation, and kvwasm's own `payload-io` calls), not by the guest.

use std::path::PathBuf;

use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// Guest path of the default data directory (the fs backend's root).
pub const DATA_DIR: &str = "/data";

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
