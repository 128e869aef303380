//! Slot handoff between two kvwasm stores over an MRDN fabric (docs/fabric.md, "Slot handoff").
//!
//! The sender (`kvwasm fabric send`, [`send`]) pushes frames through a fabric guest; the
//! receiver (`kvwasm fabric serve`, [`serve`]) is trusted host code at the other end of the
//! `tcp` guest's link ([`link`]). Frame bodies are [`handoff`] messages: a query for the
//! chunks the receiver lacks, the chunks, then the manifest. Both ends verify every frame they
//! receive (`kvwasm_mrdn`, strict mode) before acting on it. With a key the two hosts share
//! ([`auth`]), every message is also tagged, so the guest can neither forge nor replay one.
//! The builtin fabric guests are this crate's too ([`builtins`]): kvwasm-host does not embed them.

pub mod auth;
pub mod builtins;
pub mod handoff;
pub mod link;
pub mod send;
pub mod serve;

pub use auth::Key;
pub use send::{SendError, SendOptions, SendReport, Transport, send, send_keyed};
pub use serve::{ChunkHash, Limits, Server, Stats};
