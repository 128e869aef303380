//! Errors of a kv-store call and their C return codes.

/// Why a call on a store failed. [`KvError::code`] is what the C ABI returns.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The key does not exist (-2).
    #[error("not found")]
    NotFound,
    /// The backend refused an argument (-3).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A capability or credential was refused (-4).
    #[error("denied: {0}")]
    Denied(String),
    /// Storage I/O failed (-5).
    #[error("I/O error: {0}")]
    Io(String),
    /// A remote service is unavailable (-6).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The backend failed in another way (-1).
    #[error("backend error: {0}")]
    Other(String),
    /// The guest trapped; its instance was discarded (-7).
    #[error("guest trapped: {0}")]
    Trapped(String),
    /// The call ran past its deadline and was interrupted (-8).
    #[error("call exceeded its deadline of {0} ms")]
    Timeout(u64),
    /// A host limit refused the call (-9).
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// The caller's input cannot be passed to a backend at all (-10).
    #[error("bad input: {0}")]
    BadInput(String),
    /// The host could not load or start the backend (-1).
    #[error("{0}")]
    Host(String),
}

impl KvError {
    /// The negative C return code for this error (see `wit/kv-store.wit`).
    pub fn code(&self) -> i32 {
        match self {
            KvError::Other(_) | KvError::Host(_) => -1,
            KvError::NotFound => -2,
            KvError::InvalidArgument(_) => -3,
            KvError::Denied(_) => -4,
            KvError::Io(_) => -5,
            KvError::Unavailable(_) => -6,
            KvError::Trapped(_) => -7,
            KvError::Timeout(_) => -8,
            KvError::Limit(_) => -9,
            KvError::BadInput(_) => -10,
        }
    }

    /// Errors that are an ordinary outcome (a lookup miss), logged quietly.
    pub fn is_miss(&self) -> bool {
        matches!(self, KvError::NotFound)
    }

    pub(crate) fn host(context: &str, err: impl std::fmt::Display) -> KvError {
        KvError::Host(format!("{context}: {err:#}"))
    }
}
