//! The guest kinds, told apart by what a component exports: a leaf, so
//! that limits and descriptor shares can depend on the kind without
//! depending on the component loader (which depends on them).

/// What kind of guest a component is, by what it exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestKind {
    /// Exports `kvwasm:kv-store/store`: a storage backend.
    KvStore,
    /// Exports `kvwasm:fabric/transport`: a fabric guest.
    Fabric,
    /// Exports `kvwasm:events/subscriber`: an event subscriber (and maybe
    /// `kvwasm:events/http-api`).
    Subscriber,
}

impl GuestKind {
    /// The config table guests of this kind are configured in.
    pub fn config_table(self) -> &'static str {
        match self {
            GuestKind::KvStore => "backends",
            GuestKind::Fabric => "fabrics",
            GuestKind::Subscriber => "subscribers",
        }
    }
}

impl std::fmt::Display for GuestKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GuestKind::KvStore => "kv-store backend",
            GuestKind::Fabric => "fabric",
            GuestKind::Subscriber => "event subscriber",
        })
    }
}
