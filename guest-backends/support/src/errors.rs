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
        self.map_err(|code| match code {
            ErrorCode::NoEntry => Error::NotFound,
            ErrorCode::Access | ErrorCode::NotPermitted | ErrorCode::ReadOnly => {
                Error::Denied(format!("{what}: {code:?}"))
            }
            ErrorCode::InsufficientSpace
            | ErrorCode::Quota
            | ErrorCode::Io
            | ErrorCode::FileTooLarge
            | ErrorCode::InsufficientMemory => Error::Io(format!("{what}: {code:?}")),
            other => Error::Other(format!("{what}: {other:?}")),
        })
    }
}
