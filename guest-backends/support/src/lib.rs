//! Shared code for kvwasm guest backends.
//!
//! Every guest links this crate instead of generating its own bindings, so
//! input rules (hash lengths, manifest names, namespaces) and error mapping
//! are written once and behave the same in every backend.
//!
//! A backend implements [`bindings::exports::kvwasm::kv_store::store::Guest`]
//! and [`GuestStore`](bindings::exports::kvwasm::kv_store::store::GuestStore),
//! then exports itself with [`export_backend!`].

pub mod bindings {
    //! Bindings for the `kvwasm:kv-store/any-backend` world. A guest that
    //! never touches files or settings leaves `payload-io`, the preopens and
    //! `wasi:config` unused; the component then does not import them.
    wit_bindgen::generate!({
        path: "../../wit",
        world: "kvwasm:kv-store/any-backend",
        pub_export_macro: true,
        export_macro_name: "export_backend_bindings",
        generate_all,
    });
}

pub mod fabric_bindings {
    //! Bindings for the `kvwasm:fabric/configured-fabric` world, sharing the
    //! `payload` and `wasi:config` types of [`crate::bindings`], so a fabric
    //! guest uses the same [`Payload`](crate::Payload) and
    //! [`Settings`](crate::Settings) as a backend.
    wit_bindgen::generate!({
        path: ["../../wit", "../../wit/fabric"],
        world: "kvwasm:fabric/configured-fabric",
        with: {
            "kvwasm:kv-store/types@0.1.6": crate::bindings::kvwasm::kv_store::types,
            "wasi:config/store@0.2.0-rc.1": crate::bindings::wasi::config::store,
        },
        pub_export_macro: true,
        export_macro_name: "export_fabric_bindings",
    });
}

pub mod events_bindings {
    //! Bindings for the `kvwasm:events/event-service` world (event
    //! subscribers; a subscriber without an API exports a `handle` that
    //! answers 404). Export a subscriber with [`export_subscriber!`].
    wit_bindgen::generate!({
        path: ["../../wit/events"],
        world: "kvwasm:events/event-service",
        pub_export_macro: true,
        export_macro_name: "export_subscriber_bindings",
    });
}

pub mod tls_bindings {
    //! Bindings for the `kvwasm:kv-store/tls-client` world: a raw
    //! `wasi:sockets` TCP connection and a `wasi:tls` session on it (see
    //! [`crate::net::Stream`]), sharing the `wasi:io` types of
    //! [`crate::bindings`].
    wit_bindgen::generate!({
        path: "../../wit",
        world: "kvwasm:kv-store/tls-client",
        features: ["tls"],
        with: {
            "wasi:io/poll@0.2.12": crate::bindings::wasi::io::poll,
            "wasi:io/streams@0.2.12": crate::bindings::wasi::io::streams,
            "wasi:io/error@0.2.12": crate::bindings::wasi::io::error,
        },
        generate_all,
    });
}

mod errors;
pub mod frames;
mod log;
pub mod net;
mod payload;
pub mod prefetch;
pub mod remote;
pub mod settings;
pub mod validate;

pub use bindings::exports::kvwasm::kv_store::store::{
    BackendInfo, Guest, GuestStore, PutOutcome, Store,
};
pub use bindings::kvwasm::kv_store::types::{Error, Payload};
pub use errors::FsErrorExt;
pub use log::log_line;
pub use payload::{PayloadExt, read_exact_by_handle, write_all_by_handle};
pub use settings::Settings;

pub use fabric_bindings::exports::kvwasm::fabric::transport::Guest as Fabric;

/// Result of a backend call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Export a backend type that implements [`Guest`] and [`GuestStore`].
#[macro_export]
macro_rules! export_backend {
    ($ty:ident) => {
        $crate::bindings::export_backend_bindings!($ty with_types_in $crate::bindings);
    };
}

/// Export a fabric type that implements [`Fabric`].
#[macro_export]
macro_rules! export_fabric {
    ($ty:ident) => {
        $crate::fabric_bindings::export_fabric_bindings!($ty with_types_in $crate::fabric_bindings);
    };
}

/// Export an event subscriber type that implements
/// `events_bindings::exports::kvwasm::events::{subscriber, http_api}::Guest`.
#[macro_export]
macro_rules! export_subscriber {
    ($ty:ident) => {
        $crate::events_bindings::export_subscriber_bindings!($ty with_types_in $crate::events_bindings);
    };
}
