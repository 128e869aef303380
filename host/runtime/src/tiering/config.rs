//! The tiered-store keys of a `[backends.<name>]` entry, checked as a whole
//! config: a tiered entry names existing, plain entries as its tiers.
//!
//! ```toml
//! [backends.hot]
//! component = "builtin:fs"
//! dir = "/nvme/kv"
//! capacity_mib = 1024        # required on every tier but the last
//!
//! [backends.cold]
//! component = "builtin:s3"   # the last tier: durable, unbounded, holds manifests
//!
//! [backends.kv]
//! tiers = ["hot", "cold"]
//! ```

use crate::config_file::{BackendConfig, Config, LoopConfig};

/// Advised moves per second when `max_moves_per_sec` is not set.
pub const DEFAULT_MAX_MOVES_PER_SEC: u64 = 200;
/// Advised MiB per second when `max_move_mib_per_sec` is not set.
pub const DEFAULT_MAX_MOVE_MIB_PER_SEC: u64 = 64;
/// Background demotion target when `low_water_pct` is not set.
pub const DEFAULT_LOW_WATER_PCT: u64 = 80;
/// Background demoter period when `demote_interval_ms` is not set.
pub const DEFAULT_DEMOTE_INTERVAL_MS: u64 = 500;
/// Most tiers in one store (a tier set is a bit mask in the index).
pub const MAX_TIERS: usize = 8;

/// A tiered entry's settings, defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieredConfig {
    /// The tiers' entry names, fastest first.
    pub tiers: Vec<String>,
    /// Each tier's capacity in bytes (`None` on the last).
    pub capacities: Vec<Option<u64>>,
    /// The advisor subscriber, if any (run by the advisor loop).
    pub advisor: Option<String>,
    /// The advisor loop's knobs.
    pub advisor_loop: LoopConfig,
    pub max_moves_per_sec: u64,
    pub max_move_bytes_per_sec: u64,
    pub low_water_pct: u64,
    pub demote_interval_ms: u64,
}

impl TieredConfig {
    /// The tiered entry `name` of `config`, or `None` if it is a plain one.
    pub fn of(config: &Config, name: &str) -> Result<Option<TieredConfig>, String> {
        let Some(spec) = config.backends.get(name) else {
            let known: Vec<_> = config.backends.keys().map(String::as_str).collect();
            return Err(format!(
                "no backend {name:?} in the config (configured: {known:?})"
            ));
        };
        if spec.tiers.is_empty() {
            return Ok(None);
        }
        let capacities = spec
            .tiers
            .iter()
            .enumerate()
            .map(|(i, tier)| {
                let last = i + 1 == spec.tiers.len();
                let mib = config.backends[tier].capacity_mib;
                if last { None } else { mib.map(|m| m << 20) }
            })
            .collect();
        Ok(Some(TieredConfig {
            tiers: spec.tiers.clone(),
            capacities,
            advisor: spec.advisor.clone(),
            advisor_loop: spec.advisor_loop.clone().unwrap_or_default(),
            max_moves_per_sec: spec.max_moves_per_sec.unwrap_or(DEFAULT_MAX_MOVES_PER_SEC),
            max_move_bytes_per_sec: spec
                .max_move_mib_per_sec
                .unwrap_or(DEFAULT_MAX_MOVE_MIB_PER_SEC)
                << 20,
            // With an advisor, the advisor decides what leaves the hot tier
            // below capacity; the store's own LRU demotion only makes room.
            low_water_pct: spec.low_water_pct.unwrap_or(if spec.advisor.is_some() {
                100
            } else {
                DEFAULT_LOW_WATER_PCT
            }),
            demote_interval_ms: spec
                .demote_interval_ms
                .unwrap_or(DEFAULT_DEMOTE_INTERVAL_MS),
        }))
    }
}

/// A tiered entry on its own: no component keys, sane knobs.
pub(crate) fn validate_entry(spec: &BackendConfig) -> Result<(), String> {
    if !spec.component.is_empty() {
        return Err("a tiered store (`tiers`) has no component of its own".into());
    }
    if spec.tiers.len() < 2 || spec.tiers.len() > MAX_TIERS {
        return Err(format!(
            "`tiers` needs 2 to {MAX_TIERS} entries, not {}",
            spec.tiers.len()
        ));
    }
    if spec.capacity_mib.is_some() {
        return Err("capacity_mib belongs on the tier entries, not the tiered one".into());
    }
    if spec.warm_handles.is_some() {
        return Err("warm_handles belongs on the tier entries, not the tiered one".into());
    }
    for (key, value) in [
        ("max_moves_per_sec", spec.max_moves_per_sec),
        ("max_move_mib_per_sec", spec.max_move_mib_per_sec),
        ("demote_interval_ms", spec.demote_interval_ms),
    ] {
        if value == Some(0) {
            return Err(format!("{key} must be at least 1"));
        }
    }
    if spec.low_water_pct.is_some_and(|p| p > 100) {
        return Err("low_water_pct is a percentage (0-100)".into());
    }
    Ok(())
}

/// A plain entry carries no tiered-store keys (`capacity_mib` is allowed:
/// it applies when the entry serves as a tier).
pub(crate) fn validate_plain(spec: &BackendConfig) -> Result<(), String> {
    let tiered_only = [
        ("advisor", spec.advisor.is_some()),
        ("advisor_loop", spec.advisor_loop.is_some()),
        ("max_moves_per_sec", spec.max_moves_per_sec.is_some()),
        ("max_move_mib_per_sec", spec.max_move_mib_per_sec.is_some()),
        ("low_water_pct", spec.low_water_pct.is_some()),
        ("demote_interval_ms", spec.demote_interval_ms.is_some()),
    ];
    if let Some((key, _)) = tiered_only.iter().find(|(_, set)| *set) {
        return Err(format!("{key} applies only to a tiered store (`tiers`)"));
    }
    if spec.capacity_mib == Some(0) {
        return Err("capacity_mib must be at least 1".into());
    }
    Ok(())
}

/// Every tiered entry of `config`: its tiers exist, are plain entries
/// (so no cycle can form), appear once, and all but the last have a
/// capacity; every tier but the last is `builtin:fs` (the host lists and
/// removes chunks there, see [`super::fs_tier`]); the advisor exists.
pub(crate) fn validate(config: &Config) -> Result<(), String> {
    for (name, spec) in config.backends.iter().filter(|(_, s)| !s.tiers.is_empty()) {
        let err = |e: String| format!("[backends.{name}]: {e}");
        for (i, tier) in spec.tiers.iter().enumerate() {
            if spec.tiers[..i].contains(tier) {
                return Err(err(format!("tier {tier:?} is listed twice")));
            }
            let Some(entry) = config.backends.get(tier) else {
                return Err(err(format!("unknown tier {tier:?}: no [backends.{tier}]")));
            };
            if !entry.tiers.is_empty() {
                return Err(err(format!(
                    "tier {tier:?} is itself a tiered store (tiers do not nest)"
                )));
            }
            let last = i + 1 == spec.tiers.len();
            if !last && entry.capacity_mib.is_none() {
                return Err(err(format!(
                    "tier {tier:?} needs capacity_mib (every tier but the last has one)"
                )));
            }
            if !last && entry.component != "builtin:fs" {
                return Err(err(format!(
                    "tier {tier:?} is {:?}: every tier but the last must be builtin:fs",
                    entry.component
                )));
            }
            if !last && entry.read_only {
                return Err(err(format!("tier {tier:?} is read-only")));
            }
        }
        if let Some(advisor) = &spec.advisor
            && !config.subscribers.contains_key(advisor)
        {
            return Err(err(format!(
                "advisor {advisor:?}: no [subscribers.{advisor}]"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const TIERS: &str = "[backends.hot]\ncomponent = \"builtin:fs\"\ndir = \"/h\"\ncapacity_mib = 4\n\
        [backends.cold]\ncomponent = \"builtin:fs\"\ndir = \"/c\"\n";

    #[test]
    fn parses_a_tiered_store_with_defaults() {
        let text =
            format!("{TIERS}[backends.kv]\ntiers = [\"hot\", \"cold\"]\nlow_water_pct = 50\n");
        let config = Config::parse(&text, Path::new("/")).unwrap();
        let tiered = TieredConfig::of(&config, "kv").unwrap().unwrap();
        assert_eq!(tiered.capacities, [Some(4 << 20), None]);
        assert_eq!(tiered.low_water_pct, 50);
        assert_eq!(tiered.max_moves_per_sec, DEFAULT_MAX_MOVES_PER_SEC);
        assert_eq!(TieredConfig::of(&config, "hot").unwrap(), None);
        let err = config.backend("kv").unwrap_err();
        assert!(err.contains("tiered store"), "{err}");
    }

    #[test]
    fn rejects_broken_tier_sets() {
        for (extra, why) in [
            (
                "[backends.kv]\ntiers = [\"hot\", \"nope\"]",
                "unknown tier \"nope\"",
            ),
            ("[backends.kv]\ntiers = [\"hot\"]", "2 to 8 entries"),
            ("[backends.kv]\ntiers = [\"hot\", \"hot\"]", "listed twice"),
            (
                "[backends.kv]\ntiers = [\"cold\", \"hot\"]",
                "needs capacity_mib",
            ),
            (
                "[backends.kv]\ntiers = [\"hot\", \"kv2\"]\n[backends.kv2]\ntiers = [\"hot\", \"cold\"]",
                "itself a tiered store",
            ),
            (
                "[backends.kv]\ntiers = [\"hot\", \"kv\"]",
                "itself a tiered store",
            ),
            (
                "[backends.kv]\ntiers = [\"hot\", \"cold\"]\ncomponent = \"builtin:fs\"",
                "no component of its own",
            ),
            (
                "[backends.kv]\ntiers = [\"hot\", \"cold\"]\nadvisor = \"a\"",
                "no [subscribers.a]",
            ),
            (
                "[backends.kv]\ntiers = [\"hot\", \"cold\"]\nmax_moves_per_sec = 0",
                "at least 1",
            ),
            (
                "[backends.kv]\ntiers = [\"hot\", \"cold\"]\nlow_water_pct = 101",
                "percentage",
            ),
            (
                "[backends.x]\ncomponent = \"builtin:fs\"\nadvisor = \"a\"",
                "only to a tiered",
            ),
            (
                "[backends.m]\ncomponent = \"builtin:memory\"\ncapacity_mib = 1\n\
                 [backends.kv]\ntiers = [\"m\", \"cold\"]",
                "must be builtin:fs",
            ),
        ] {
            let err = Config::parse(&format!("{TIERS}{extra}\n"), Path::new("/")).unwrap_err();
            assert!(err.contains(why), "{extra:?}: {err}");
        }
    }
}
