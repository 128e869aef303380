//! Tiered stores (docs/tiering.md): existing backends composed as ordered
//! tiers, with an untrusted advisor guest proposing moves that trusted host
//! code validates and applies.
//!
//! The contract between the two halves lives in [`contract`] so each side can be
//! built and tested on its own:
//!
//! * the tiered store reports what its consumers do as [`Access`] records
//!   and what each tier holds as [`TierUsage`];
//! * the advisor turns those into [`Advice`];
//! * the store's [`AdviceSink`] validates and applies it, and says what it
//!   refused and why in an [`AdviceReport`].
//!
//! The store itself is [`TieredStore`] ([`store`]); its consumers reach it
//! through the [`crate::StoreHandle`] that [`open_tiered`] returns.

pub mod config;
mod contract;
mod fs_tier;
mod status;
mod store;

pub use contract::{Access, AccessKind, Action, Advice, AdviceReport, AdviceSink, TierUsage};
pub use status::TierStatus;
pub use store::{MAX_ADVISED_HASHES, TieredStore, is_tiered, open_tiered};

pub mod advisor;
