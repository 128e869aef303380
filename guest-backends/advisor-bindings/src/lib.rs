//! Bindings for the `kvwasm:events/storage-advisor-moves` world (storage
//! advisors: `advisor` and `advisor-moves`, plus the `subscriber` every
//! subscriber exports).
//! They live apart from `kvwasm_guest_support::events_bindings` because
//! wit-bindgen names an interface's export macro after the interface, so
//! two worlds exporting `subscriber` cannot share a crate. Knobs are read
//! with `kvwasm_guest_support::Settings`. Export an advisor with
//! [`export_advisor!`].

wit_bindgen::generate!({
    path: ["../../wit/events"],
    world: "kvwasm:events/storage-advisor-moves",
    pub_export_macro: true,
    export_macro_name: "export_advisor_bindings",
});

/// Export a storage advisor type that implements
/// `exports::kvwasm::events::{advisor, advisor_moves, subscriber}::Guest`.
#[macro_export]
macro_rules! export_advisor {
    ($ty:ident) => {
        $crate::export_advisor_bindings!($ty with_types_in $crate);
    };
}
