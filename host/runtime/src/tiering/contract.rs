//! The contract between the tiered store and its advisor: what the store
//! reports ([`Access`], [`TierUsage`]), what the advisor answers
//! ([`Advice`]), and what the store did with it ([`AdviceReport`]).

/// What the advisor asks the host to do with some chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Copy the chunks one tier up (towards tier 0, the fastest).
    Promote,
    /// Move the chunks one tier down (copy, verify, then remove).
    Demote,
    /// Remove the chunks from `tier`, only where another tier keeps a copy.
    Evict,
}

/// One piece of advice: an action on chunks named by their full kv_store
/// hash (the bytes the consumer chose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub action: Action,
    /// The tier the chunks are in now (0 = hottest).
    pub tier: u32,
    pub hashes: Vec<Vec<u8>>,
}

/// What the host did with a batch of advice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdviceReport {
    /// Chunks moved, copied or evicted as advised.
    pub applied: u64,
    /// Chunks the host refused (unknown, last copy, over the rate limit...).
    pub refused: u64,
    /// Why, one short line per distinct reason (bounded).
    pub reasons: Vec<String>,
}

/// Where the store's consumer traffic went, as the advisor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// A chunk was stored: a new one (in tier 0, or the first tier that
    /// can hold it), or one the store already held (deduplicated; `tier`
    /// is then the hottest tier holding it).
    Put,
    /// A chunk was read, from the tier given in [`Access::tier`].
    Hit,
    /// A chunk was asked for and no tier had it.
    Miss,
    /// The chunk left the store's last tier (it no longer exists).
    Gone,
    /// The store moved the chunk, on its own or on advice: copied it from
    /// `tier` one tier up ([`Action::Promote`]), moved it from `tier` one
    /// tier down ([`Action::Demote`]), or removed the copy in `tier`
    /// where a colder tier keeps one ([`Action::Evict`]).
    Moved(Action),
}

/// One chunk-level event of the tiered store's own traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub kind: AccessKind,
    pub hash: Vec<u8>,
    /// The chunk's length in bytes.
    pub len: u64,
    /// The tier involved (the tier read for `Hit`, the one stored into or
    /// holding the chunk for `Put`, the one moved from for `Moved`).
    pub tier: u32,
    /// The manifest read or written just before, when the store knows it:
    /// lets a policy see which sessions share a chunk.
    pub manifest: Option<String>,
}

/// What one tier holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierUsage {
    pub name: String,
    /// The operator's byte capacity, if the tier has one.
    pub capacity_bytes: Option<u64>,
    pub used_bytes: u64,
    pub chunks: u64,
}

/// Implemented by the tiered store: applies advice under the host's rules.
pub trait AdviceSink: Send + Sync {
    fn apply(&self, advice: Vec<Advice>) -> AdviceReport;
    fn usage(&self) -> Vec<TierUsage>;
}
