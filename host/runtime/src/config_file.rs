//! The config file's tables as parsed: serde types only, the keys every
//! guest kind shares. What they mean and how they are checked and built
//! into guests is [`crate::config`] (which re-exports them) and, for the
//! tiered keys, [`crate::tiering::config`]; both read these types, and
//! neither is read from here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::capabilities::dirs::DirConfig;
use crate::capabilities::settings::SettingValue;
use crate::capabilities::tls::TlsConfig;
use crate::limits::LimitsConfig;

/// A parsed config file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Backends by name, as used in `wasm://<name>/...`.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendConfig>,
    /// Fabric guests by name (`kvwasm fabric send --fabric <name>`): the
    /// same keys and the same sandbox as backends; one instance each, no
    /// tenants.
    #[serde(default)]
    pub fabrics: BTreeMap<String, BackendConfig>,
    /// Event subscriber guests by name (`kvwasm serve`): the same keys and
    /// sandbox as backends; one instance each, no tenants.
    #[serde(default)]
    pub subscribers: BTreeMap<String, BackendConfig>,
    /// `[serve]`: the settings of `kvwasm serve` (its listener, sources and
    /// queues), parsed by that command; kept as TOML here.
    #[serde(default)]
    pub serve: Option<toml::Table>,
    /// `base_dir`: where relative paths start, if not at the file itself
    /// (lets tools such as `kvwasm check` run a copy of an operator's file).
    #[serde(rename = "base_dir", default)]
    pub(crate) declared_base_dir: Option<PathBuf>,
    /// Directory relative paths start from.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[backends.<name>]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// `builtin:fs`, `builtin:memory`, or a `.wasm` component path. Empty
    /// (absent) only on a tiered entry.
    #[serde(default)]
    pub component: String,
    /// Hex SHA-256 the component's bytes must have.
    pub sha256: Option<String>,
    /// Host directory granted read-write (or `read_only`) at `/data`.
    pub dir: Option<PathBuf>,
    /// Grant `dir` read-only.
    #[serde(default)]
    pub read_only: bool,
    /// More directory grants.
    #[serde(default)]
    pub dirs: Vec<DirConfig>,
    /// Let the guest list directories (`read-directory`). Off by default:
    /// wasmtime-wasi reads a whole listing into host memory at once.
    #[serde(default)]
    pub list_dirs: bool,
    /// TCP peers, `host:port`.
    #[serde(default)]
    pub net: Vec<String>,
    /// Allow the guest to resolve names itself.
    #[serde(default)]
    pub dns: bool,
    /// `wasi:http` origins, `scheme://host[:port]`.
    #[serde(default)]
    pub http: Vec<String>,
    /// Environment variables passed through, by name.
    #[serde(default)]
    pub env: Vec<String>,
    /// The guest's own settings (server address, bucket...), served through
    /// `wasi:config/store`. Never secrets: those come through `env`.
    #[serde(default)]
    pub settings: BTreeMap<String, SettingValue>,
    /// Instances serving one handle at once (default 4).
    pub max_instances: Option<usize>,
    /// Release an instance idle this long, ms (default 1000; 0: never).
    pub idle_release_ms: Option<u64>,
    /// Of this backend's handles, the most recently used this many keep
    /// one instance through idle release (default 1 for builtin:fs, else 0).
    pub warm_handles: Option<usize>,
    /// Calls in flight on this backend at once, over all handles.
    pub max_concurrent_calls: Option<usize>,
    /// Linear memory cap per instance, MiB.
    pub memory_limit_mib: Option<u64>,
    /// Deadline for one call, ms.
    pub call_timeout_ms: Option<u64>,
    /// Largest payload a guest may return, MiB.
    pub max_payload_mib: Option<u64>,
    /// Fuel per call (enables metering for this backend).
    pub fuel: Option<u64>,
    /// Resources (files, sockets, payloads...) one instance may hold.
    pub max_resources: Option<usize>,
    /// Files, directories and TCP sockets one instance may hold open
    /// (default: unset for backends, 16 for fabrics and subscribers).
    pub max_descriptors: Option<usize>,
    /// Limits for tenants (the first component of the namespace).
    #[serde(default)]
    pub tenants: BTreeMap<String, LimitsConfig>,
    /// Publish every stored chunk as a vLLM-format KV event on a ZMQ PUB
    /// socket bound here (`tcp://host:port`, see [`crate::events_out`]).
    pub publish_events: Option<String>,
    /// TLS to the remote store, done by the host (see [`TlsConfig`]).
    pub tls: Option<TlsConfig>,
    /// Subscribers: hand stored events over with their token ids already
    /// hashed into `tokens-hashes` (default: on for `builtin:kv-indexer`).
    pub prehash_tokens: Option<bool>,
    /// Tiered store: the entries composed as tiers, fastest first
    /// (docs/tiering.md; checked by [`crate::tiering::config`]).
    #[serde(default)]
    pub tiers: Vec<String>,
    /// As a tier (all but the last): its byte capacity, MiB.
    pub capacity_mib: Option<u64>,
    /// Tiered store: the `[subscribers.<name>]` advisor guest.
    pub advisor: Option<String>,
    /// Tiered store: the advisor loop's knobs (`[backends.NAME.advisor_loop]`).
    pub advisor_loop: Option<LoopConfig>,
    /// Tiered store: most advised moves per second.
    pub max_moves_per_sec: Option<u64>,
    /// Tiered store: most MiB moved on advice per second.
    pub max_move_mib_per_sec: Option<u64>,
    /// Tiered store: the background demoter keeps tier 0 at or below this
    /// share of its capacity (0-100).
    pub low_water_pct: Option<u64>,
    /// Tiered store: how often the background demoter looks, ms.
    pub demote_interval_ms: Option<u64>,
}

/// The loop's knobs (docs/tiering.md): a tiered backend's
/// `[backends.NAME.advisor_loop]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoopConfig {
    /// Milliseconds between two `advise` calls.
    pub interval_ms: u64,
    /// Milliseconds between two drains of the store's access log (keep
    /// it short enough that the log does not overflow and drop).
    pub drain_ms: u64,
    /// Accesses per `observe` call at most.
    pub observe_batch: usize,
    /// `observe` calls per drain at most (bounded work per wake-up).
    pub max_batches: usize,
    /// Advice records taken from one `advise` answer.
    pub max_advice: usize,
    /// Hashes handed to the store per round, over all records: the rate
    /// limit of a move storm (`max_hashes` per `interval_ms`; the store
    /// adds its own moves-per-second limit).
    pub max_hashes: usize,
}

impl Default for LoopConfig {
    fn default() -> LoopConfig {
        LoopConfig {
            interval_ms: 1000,
            drain_ms: 100,
            observe_batch: 4096,
            max_batches: 16,
            max_advice: 64,
            max_hashes: 4096,
        }
    }
}
