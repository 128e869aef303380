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

mod errors;
mod payload;
pub mod remote;
pub mod settings;
pub mod validate;

pub use bindings::exports::kvwasm::kv_store::store::{
    BackendInfo, Guest, GuestStore, PutOutcome, Store,
};
pub use bindings::kvwasm::kv_store::types::{Error, Payload};
pub use errors::FsErrorExt;
pub use payload::PayloadExt;
pub use settings::Settings;

/// Result of a backend call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Export a backend type that implements [`Guest`] and [`GuestStore`].
#[macro_export]
macro_rules! export_backend {
    ($ty:ident) => {
        $crate::bindings::export_backend_bindings!($ty with_types_in $crate::bindings);
    };
}
