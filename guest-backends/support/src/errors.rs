//! Mapping of WASI filesystem errors onto the kv-store error variant.

use crate::Error;
use crate::bindings::wasi::filesystem::types::ErrorCode;

/// Turn a `wasi:filesystem` error into a kv-store [`Error`], naming what was
/// being done so the host log says more than "io error".
pub trait FsErrorExt<T> {
    /// Attach `what` (e.g. `"open manifest"`) to a filesystem error.
    fn fs_context(self, what: &str) -> Result<T, Error>;
}

impl<T> FsErrorExt<T> for Result<T, ErrorCode> {
    fn fs_context(self, what: &str) -> Result<T, Error> {
        // The code's WIT name (`no-entry`), not its `Debug` form: that one
        // links every code's description, 1.9 KiB of the data image each
        // instance of a backend maps.
        self.map_err(|code| {
            let message = || format!("{what}: {}", code.name());
            match code {
                ErrorCode::NoEntry => Error::NotFound,
                ErrorCode::Access | ErrorCode::NotPermitted | ErrorCode::ReadOnly => {
                    Error::Denied(message())
                }
                ErrorCode::InsufficientSpace
                | ErrorCode::Quota
                | ErrorCode::Io
                | ErrorCode::FileTooLarge
                | ErrorCode::InsufficientMemory => Error::Io(message()),
                _ => Error::Other(message()),
            }
        })
    }
}
