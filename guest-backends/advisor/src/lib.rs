//! `builtin:advisor`: the storage advisor guest (`kvwasm:events/storage-advisor`).
//! The tiered store's accesses arrive through `observe` and its own moves
//! through `observe-moves`, and `advise` answers with moves; all go to one
//! [`Policy`] (kvwasm-advisor-core),
//! which lives as long as this instance. A replaced instance starts cold:
//! advice only costs hit ratio, so nothing needs replaying.
//!
//! Settings (`[subscribers.NAME.settings]`, docs/tiering.md): `policy`
//! (`frequency` or `lru`), `high_water_pct`, `low_water_pct`, `half_life`,
//! `shared_manifests`, `promote_hits`, `max_moves`, `max_tracked`. A bad
//! value traps the first call, naming the setting.

use std::cell::RefCell;

use kvwasm_advisor_bindings::exports::kvwasm::events::{advisor, advisor_moves, subscriber};
use kvwasm_advisor_bindings::kvwasm::events::types;
use kvwasm_advisor_core::{
    Access, AccessKind, Action, Advice, Knobs, Move, MoveKind, Policy, TierUsage,
};
use kvwasm_guest_support::Settings;

thread_local! {
    static POLICY: RefCell<Option<Policy>> = const { RefCell::new(None) };
}

/// Run `f` on the policy, built from the settings on first use.
fn with_policy<T>(f: impl FnOnce(&mut Policy) -> T) -> T {
    POLICY.with_borrow_mut(|policy| {
        let policy = policy.get_or_insert_with(|| match knobs() {
            Ok(knobs) => Policy::new(knobs),
            Err(e) => panic!("builtin:advisor: {e:?}"),
        });
        f(policy)
    })
}

/// The knobs from the settings, defaults for those unset.
fn knobs() -> Result<Knobs, kvwasm_guest_support::Error> {
    let s = Settings::load()?;
    let d = Knobs::default();
    let knobs = Knobs {
        mode: s.parse_or("policy", d.mode)?,
        high_water_pct: s.parse_or("high_water_pct", d.high_water_pct)?,
        low_water_pct: s.parse_or("low_water_pct", d.low_water_pct)?,
        half_life: s.parse_or("half_life", d.half_life)?,
        shared_manifests: s.parse_or("shared_manifests", d.shared_manifests)?,
        promote_hits: s.parse_or("promote_hits", d.promote_hits)?,
        max_moves: s.parse_or("max_moves", d.max_moves)?,
        max_tracked: s.parse_or("max_tracked", d.max_tracked)?,
    };
    if knobs.low_water_pct > knobs.high_water_pct || knobs.high_water_pct > 100 {
        return Err(kvwasm_guest_support::Error::InvalidArgument(format!(
            "need low_water_pct <= high_water_pct <= 100 (got {} and {})",
            knobs.low_water_pct, knobs.high_water_pct
        )));
    }
    Ok(knobs)
}

struct Advisor;

impl subscriber::Guest for Advisor {
    /// Engine events are optional input this policy does not use yet: the
    /// store's own accesses already say what is read, where and by whom.
    fn on_batch(_events: Vec<types::Event>) -> Result<(), String> {
        Ok(())
    }
}

impl advisor::Guest for Advisor {
    fn observe(accesses: Vec<advisor::ChunkAccess>) {
        let accesses: Vec<Access> = accesses
            .into_iter()
            .map(|a| Access {
                kind: match a.kind {
                    advisor::AccessKind::Put => AccessKind::Put,
                    advisor::AccessKind::Hit => AccessKind::Hit,
                    advisor::AccessKind::Miss => AccessKind::Miss,
                    advisor::AccessKind::Gone => AccessKind::Gone,
                },
                hash: a.hash,
                len: a.len,
                tier: a.tier,
                manifest: a.manifest,
            })
            .collect();
        with_policy(|p| p.observe(&accesses));
    }

    fn advise(usage: Vec<advisor::TierUsage>, _now_ms: u64) -> Vec<advisor::Advice> {
        let usage: Vec<TierUsage> = usage
            .into_iter()
            .map(|u| TierUsage {
                capacity_bytes: u.capacity_bytes,
                used_bytes: u.used_bytes,
            })
            .collect();
        with_policy(|p| p.advise(&usage))
            .into_iter()
            .map(
                |Advice {
                     action,
                     tier,
                     hashes,
                 }| advisor::Advice {
                    action: match action {
                        Action::Promote => advisor::Action::Promote,
                        Action::Demote => advisor::Action::Demote,
                        Action::Evict => advisor::Action::Evict,
                    },
                    tier,
                    hashes,
                },
            )
            .collect()
    }
}

impl advisor_moves::Guest for Advisor {
    fn observe_moves(moves: Vec<advisor_moves::ChunkMove>) {
        let moves: Vec<Move> = moves
            .into_iter()
            .map(|m| Move {
                kind: match m.kind {
                    advisor_moves::MoveKind::Promoted => MoveKind::Promoted,
                    advisor_moves::MoveKind::Demoted => MoveKind::Demoted,
                    advisor_moves::MoveKind::Evicted => MoveKind::Evicted,
                },
                hash: m.hash,
                len: m.len,
                tier: m.tier,
            })
            .collect();
        with_policy(|p| p.observe_moves(&moves));
    }
}

kvwasm_advisor_bindings::export_advisor!(Advisor);
