//! Capability policy: what a guest may reach, turned into a WASI context.
//!
//! A guest gets exactly the grants listed here and nothing else: no
//! environment variables, no arguments, no stdin, no network (TCP, UDP and
//! name lookups are all off), no preopen that was not granted. The guest's
//! stdout goes nowhere; its stderr goes to the host log at debug level (see
//! `guest_log`). What every guest does get from WASI: clocks and random
//! numbers.

use std::path::PathBuf;

use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};

use crate::guest_log::GuestStderr;

/// Guest path of the granted data directory (the fs backend's root).
pub const DATA_DIR: &str = "/data";

/// The capabilities granted to one backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Host directory mounted at [`DATA_DIR`], if any.
    pub data_dir: Option<DirGrant>,
}

/// One directory grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// Host path.
    pub host: PathBuf,
    /// Read-only grants refuse every mutation in the host, whatever the guest does.
    pub read_only: bool,
}

impl Grants {
    /// Build the WASI context for one instance.
    pub(crate) fn wasi_ctx(&self, stderr: GuestStderr) -> wasmtime::Result<WasiCtx> {
        let mut builder = WasiCtxBuilder::new();
        builder.stderr(stderr);
        // Must come before any preopen: each preopen captures it. Without it
        // every file operation hops to a thread pool (~20x slower small calls).
        builder.allow_blocking_current_thread(true);
        // No network: explicit, rather than relying on wasmtime-wasi's
        // defaults (whose address check also denies everything).
        builder
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(dir) = &self.data_dir {
            let perms = if dir.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            builder
                .preopened_dir(&dir.host, DATA_DIR, perms)
                .map_err(|e| {
                    wasmtime::format_err!("cannot grant directory {}: {e}", dir.host.display())
                })?;
        }
        Ok(builder.build())
    }
}
