//! The operator's configuration file (TOML).
//!
//! ```toml
//! [backends.acme]
//! component = "acme.wasm"           # or builtin:fs / builtin:memory
//! sha256 = "9f86d0…"                # optional: refuse any other component bytes
//! dir = "/srv/kv"                   # shorthand for one read-write dir at /data
//! dirs = [{ host = "/srv/models", guest = "/models", read_only = true }]
//! list_dirs = false                 # guest directory listings (default: denied)
//! net = ["redis.internal:6379"]     # TCP peers, resolved by the host at load
//! dns = false                       # guest name lookups (default: denied)
//! http = ["http://127.0.0.1:9000"]  # wasi:http origins
//! env = ["ACME_TOKEN"]              # variables passed through, by name
//! settings = { bucket = "kv" }      # read by the guest through wasi:config
//! max_instances = 4                 # instances serving one handle
//! idle_release_ms = 1000            # release an instance idle this long (0: never)
//! warm_handles = 1                  # except on the most recently used handle (builtin:fs default)
//! max_concurrent_calls = 64         # calls in flight on this backend
//! memory_limit_mib = 256
//! call_timeout_ms = 30000
//! max_payload_mib = 1024
//! fuel = 50000000                   # optional: instructions per call (metered engine)
//! max_resources = 1024              # files, sockets, payloads... one instance may hold
//! max_descriptors = 256             # files and sockets one instance may hold open
//!                                   # (default: none for backends, 16 for fabrics
//!                                   # and subscribers)
//! publish_events = "tcp://127.0.0.1:5557"  # optional: stored chunks as KV events (ZMQ PUB)
//! tls = true                        # TLS to the peers/origins (public roots), or:
//! # [backends.acme.tls]             # ca_file, ca_mode = "replace"|"extend",
//! #                                 # client_cert, client_key, server_name
//!
//! [backends.acme.tenants.alice]     # limits for wasm://acme/alice/...
//! memory_limit_mib = 64
//! call_timeout_ms = 2000
//!
//! [backends.tiered]                 # a tiered store (docs/tiering.md):
//! tiers = ["hot", "cold"]           # existing entries, fastest first
//! advisor = "policy"                # optional: a [subscribers.*] advisor
//! max_moves_per_sec = 200           # advised moves: chunks per second
//! max_move_mib_per_sec = 64         #   and MiB per second
//! low_water_pct = 80                # background demotion target, % of capacity
//! demote_interval_ms = 500          # how often the background demoter looks
//! # on each tier but the last: capacity_mib = 1024
//!
//! [subscribers.idx]                 # an event subscriber (`kvwasm serve`): the same
//! component = "builtin:kv-indexer"  # keys and sandbox, one instance, no tenants
//! prehash_tokens = true             # token ids hashed by the host (default: on
//!                                   # for builtin:kv-indexer only)
//!
//! [fabrics.tcp]                     # a fabric guest: the same keys and sandbox,
//! component = "builtin:tcp"         # one instance, no tenants
//! net = ["10.0.0.7:7070"]
//! settings = { peer = "10.0.0.7:7070" }
//! ```
//!
//! Relative paths are relative to the config file's directory, or to the
//! top-level `base_dir = "..."` when set. The file is found at
//! `$KVWASM_CONFIG` if set, else the first of
//! `$XDG_CONFIG_HOME/kvwasm/config.toml` (or `~/.config/kvwasm/config.toml`)
//! and `/etc/kvwasm/config.toml` that exists.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::config_file::{BackendConfig, Config, LoopConfig};

use crate::backend::{Backend, DEFAULT_IDLE_RELEASE_MS, default_max_instances};
use crate::capabilities::dirs::DirConfig;
use crate::capabilities::http::Origin;
use crate::capabilities::settings::SettingValue;
use crate::capabilities::tls::{TlsConfig, TlsGrant};
use crate::capabilities::{DATA_DIR, EnvGrant, Grants, HttpGrant, NetGrant, SettingsGrant};
use crate::component::{ComponentSource, GuestKind, LoadedComponent};
use crate::engine::Metering;
use crate::limits::{Limits, LimitsConfig};

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "KVWASM_CONFIG";

impl Config {
    /// Parse `text`; `base_dir` anchors relative paths.
    pub fn parse(text: &str, base_dir: &Path) -> Result<Config, String> {
        let mut config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        config.base_dir = match &config.declared_base_dir {
            Some(declared) => base_dir.join(declared),
            None => base_dir.to_owned(),
        };
        for (name, backend) in &config.backends {
            backend
                .validate()
                .and_then(|()| backend.no_subscriber_keys())
                .map_err(|e| format!("[backends.{name}]: {e}"))?;
        }
        crate::tiering::config::validate(&config)?;
        for (name, fabric) in &config.fabrics {
            fabric
                .validate_single()
                .and_then(|()| fabric.no_subscriber_keys())
                .map_err(|e| format!("[fabrics.{name}]: {e}"))?;
        }
        for (name, subscriber) in &config.subscribers {
            subscriber
                .validate_single()
                .map_err(|e| format!("[subscribers.{name}]: {e}"))?;
        }
        Ok(config)
    }

    /// Read and parse the file at `path`.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, base).map_err(|e| format!("config file {}: {e}", path.display()))
    }

    /// Build the backend called `name`: load its component (checking its
    /// pin), resolve paths and peers, create its missing writable
    /// directories.
    pub fn backend(&self, name: &str) -> Result<Backend, String> {
        self.opened(GuestKind::KvStore, name)
    }

    /// Build the fabric called `name`, in the same sandbox as a backend. Its
    /// [`Backend::name`] is `fabrics.<name>` (logs and metrics).
    pub fn fabric(&self, name: &str) -> Result<Backend, String> {
        self.opened(GuestKind::Fabric, name)
    }

    /// Build the event subscriber called `name`, in the same sandbox as a
    /// backend. Its [`Backend::name`] is `subscribers.<name>`.
    pub fn subscriber(&self, name: &str) -> Result<Backend, String> {
        self.opened(GuestKind::Subscriber, name)
    }

    /// [`Config::inspect`], then the guest's missing writable directories
    /// created: it is about to run.
    fn opened(&self, kind: GuestKind, name: &str) -> Result<Backend, String> {
        let backend = self.inspect(kind, name)?;
        for dir in backend.grants.dirs.iter().filter(|d| !d.read_only) {
            std::fs::create_dir_all(&dir.host).map_err(|e| {
                format!(
                    "{} {name:?}: cannot create {}: {e}",
                    kind_word(kind),
                    dir.host.display()
                )
            })?;
        }
        Ok(backend)
    }

    /// The guest `name` of `kind`'s table built as [`Config::backend`],
    /// [`Config::fabric`] and [`Config::subscriber`] build it, except that
    /// nothing is created: a writable directory that does not exist yet is
    /// left missing. For `kvwasm check-config`, which must change nothing.
    pub fn inspect(&self, kind: GuestKind, name: &str) -> Result<Backend, String> {
        let table = match kind {
            GuestKind::KvStore => &self.backends,
            GuestKind::Fabric => &self.fabrics,
            GuestKind::Subscriber => &self.subscribers,
        };
        let word = kind_word(kind);
        let spec = table.get(name).ok_or_else(|| {
            let known: Vec<_> = table.keys().map(String::as_str).collect();
            format!("no {word} {name:?} in the config (configured: {known:?})")
        })?;
        if !spec.tiers.is_empty() {
            return Err(format!(
                "backend {name:?} is a tiered store of {:?}, not a component",
                spec.tiers
            ));
        }
        let label = match kind {
            GuestKind::KvStore => name.to_owned(),
            _ => format!("{}.{name}", kind.config_table()),
        };
        self.guest(&label, spec, kind)
            .map_err(|e| format!("{word} {name:?}: {e}"))
    }

    /// Load `spec`'s component (checking its pin and its kind), resolve its
    /// grants and limits. Creates nothing.
    fn guest(&self, name: &str, spec: &BackendConfig, kind: GuestKind) -> Result<Backend, String> {
        let source = self.component_source(spec)?;
        let component = LoadedComponent::load_for(&source, spec.metering())
            .map_err(|e| format!("cannot load {source}: {e:#}"))?;
        if let Some(pin) = &spec.sha256
            && !pin.eq_ignore_ascii_case(&component.sha256)
        {
            return Err(format!(
                "{source} has sha256 {}, but the config pins {pin}: refusing to load it",
                component.sha256
            ));
        }
        if component.kind() != kind {
            return Err(format!("{source} is a {}, not a {kind}", component.kind()));
        }
        let grants = self.grants(spec)?;
        let limits = spec.limits();
        // The KV indexer's default: on for a builtin that asks for it.
        let prehash_by_default = match &source {
            ComponentSource::LinkedBuiltin(name) => {
                crate::extension::linked_builtin(name).is_some_and(|b| b.prehash_tokens)
            }
            _ => false,
        };
        let mut backend = Backend::new(name, source, component, grants);
        backend.tenant_limits = spec
            .tenants
            .iter()
            .map(|(tenant, l)| (tenant.clone(), l.over(&limits)))
            .collect();
        backend.limits = limits;
        backend.max_instances = spec.max_instances.unwrap_or_else(default_max_instances);
        backend.idle_release_ms = spec.idle_release_ms.unwrap_or(DEFAULT_IDLE_RELEASE_MS);
        if let Some(warm) = spec.warm_handles {
            backend.warm_handles = warm;
        } else if !backend.tenant_limits.is_empty() {
            // Tenants share their backend's warm ranking, so one could time
            // its first call after an idle gap to learn whether another
            // was active (docs/security.md): none unless the operator asks.
            backend.warm_handles = 0;
        }
        backend.max_concurrent_calls = spec.max_concurrent_calls;
        backend.events_out = spec
            .publish_events
            .as_ref()
            .map(|address| crate::events_out::EventsOut::new(address, backend.metrics.clone()));
        backend.prehash_tokens = spec.prehash_tokens.unwrap_or(prehash_by_default);
        // An advisor's events are never rewritten (the tiered store feeds
        // it its own), so the setting asks nothing of this program there.
        if backend.prehash_tokens
            && !backend.component.is_advisor()
            && crate::extension::token_hasher().is_none()
        {
            return Err(
                "prehash_tokens needs the host's block hashing, which this program \
                 does not link: event subscribers run in `kvwasm serve`"
                    .into(),
            );
        }
        Ok(backend)
    }

    /// The grants of `spec`: directories, peers resolved now, origins and
    /// variable names. Nothing is created ([`Config::backend`] creates
    /// missing writable directories).
    pub fn grants(&self, spec: &BackendConfig) -> Result<Grants, String> {
        let shorthand = spec.dir.iter().map(|host| DirConfig {
            host: host.clone(),
            guest: DATA_DIR.to_owned(),
            read_only: spec.read_only,
        });
        let dirs = shorthand
            .chain(spec.dirs.iter().cloned())
            .map(|d| d.grant(&self.base_dir))
            .collect();
        let origins: Vec<Origin> = spec
            .http
            .iter()
            .map(|o| Origin::parse(o))
            .collect::<Result<_, _>>()?;
        let tls = self.tls_grant(spec, &origins)?;
        // The guest learns that the host will do TLS from its settings.
        let mut settings = spec.settings.clone();
        if tls.is_some() {
            settings
                .entry("tls".into())
                .or_insert(SettingValue::Flag(true));
        }
        Ok(Grants {
            dirs,
            list_dirs: spec.list_dirs,
            net: NetGrant::resolve(&spec.net, spec.dns)?,
            http: Arc::new(HttpGrant { origins }),
            env: EnvGrant {
                names: spec.env.clone(),
            },
            settings: Arc::new(SettingsGrant::from_table(&settings)?),
            tls,
        })
    }

    /// `spec`'s TLS grant, its files read now.
    fn tls_grant(
        &self,
        spec: &BackendConfig,
        origins: &[Origin],
    ) -> Result<Option<Arc<TlsGrant>>, String> {
        let Some(table) = spec.tls.as_ref().and_then(TlsConfig::table) else {
            return Ok(None);
        };
        let hosts = spec
            .net
            .iter()
            .filter_map(|p| p.rsplit_once(':'))
            .filter(|(h, _)| !h.contains('/'))
            .map(|(h, _)| h.trim_matches(['[', ']']).to_ascii_lowercase())
            .chain(
                origins
                    .iter()
                    .map(|o| o.host.trim_matches(['[', ']']).to_owned()),
            )
            .collect();
        TlsGrant::load(&table, &self.base_dir, hosts).map(|g| Some(Arc::new(g)))
    }

    /// Where `spec`'s component comes from, with a relative path resolved
    /// against the config file's directory.
    pub fn component_source(&self, spec: &BackendConfig) -> Result<ComponentSource, String> {
        Ok(match spec.source()? {
            ComponentSource::File(p) => ComponentSource::File(self.base_dir.join(p)),
            builtin => builtin,
        })
    }

    /// The backend for `wasm:///dir`: the builtin fs guest, `dir` granted
    /// read-write at `/data` (created if missing), default limits.
    pub fn embedded_fs(dir: &Path) -> Result<Backend, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let source = ComponentSource::Builtin(crate::component::Builtin::Fs);
        let component = LoadedComponent::load(&source)
            .map_err(|e| format!("cannot load the embedded fs backend: {e:#}"))?;
        let grants = Grants {
            dirs: vec![crate::capabilities::DirGrant {
                host: dir.to_owned(),
                guest: DATA_DIR.to_owned(),
                read_only: false,
            }],
            ..Grants::default()
        };
        Ok(Backend::new(
            &source.to_string(),
            source.clone(),
            component,
            grants,
        ))
    }
}

impl BackendConfig {
    /// The engine this guest's code is compiled for: metered if the guest
    /// or any of its tenants sets a fuel budget.
    pub(crate) fn metering(&self) -> Metering {
        if self.fuel.is_some() || self.tenants.values().any(|t| t.fuel.is_some()) {
            Metering::Fuel
        } else {
            Metering::Off
        }
    }

    pub(crate) fn source(&self) -> Result<ComponentSource, String> {
        self.component.parse()
    }

    /// The backend's limits (defaults for what it does not set).
    pub fn limits(&self) -> Limits {
        LimitsConfig {
            memory_limit_mib: self.memory_limit_mib,
            call_timeout_ms: self.call_timeout_ms,
            max_payload_mib: self.max_payload_mib,
            fuel: self.fuel,
            max_resources: self.max_resources,
            max_descriptors: self.max_descriptors,
        }
        .over(&Limits::default())
    }

    /// Refuses the keys only an event subscriber reads.
    fn no_subscriber_keys(&self) -> Result<(), String> {
        match self.prehash_tokens {
            Some(_) => Err("prehash_tokens applies to [subscribers.*] only".into()),
            None => Ok(()),
        }
    }

    /// As [`BackendConfig::validate`], for a guest that runs one instance
    /// and has no tenants (`[fabrics.<name>]`, `[subscribers.<name>]`).
    fn validate_single(&self) -> Result<(), String> {
        if !self.tenants.is_empty() {
            return Err("this guest has no tenants".into());
        }
        if self.max_instances.is_some() {
            return Err("this guest runs one instance; max_instances does not apply".into());
        }
        if self.idle_release_ms.is_some() {
            return Err("this guest keeps its one instance; idle_release_ms does not apply".into());
        }
        if self.warm_handles.is_some() {
            return Err("this guest keeps its one instance; warm_handles does not apply".into());
        }
        if self.publish_events.is_some() {
            return Err("this guest has no kv_store traffic; publish_events does not apply".into());
        }
        self.validate()
    }

    /// Everything that can be checked without touching the system.
    fn validate(&self) -> Result<(), String> {
        if !self.tiers.is_empty() {
            return crate::tiering::config::validate_entry(self);
        }
        if self.component.is_empty() {
            return Err("missing field `component` (or `tiers`, for a tiered store)".into());
        }
        crate::tiering::config::validate_plain(self)?;
        let source = self.source()?;
        if self.warm_handles.is_some_and(|w| w > 0) {
            if source != ComponentSource::Builtin(crate::component::Builtin::Fs) {
                return Err(
                    "warm_handles applies to builtin:fs only: the host checks that a \
                     kept instance's store directories are still in place before using it \
                     again, which it can do only for its own fs guest"
                        .into(),
                );
            }
            if self.idle_release_ms == Some(0) {
                return Err("warm_handles keeps instances through idle release, and \
                     idle_release_ms = 0 releases none: set one of the two"
                    .into());
            }
        }
        let limits = self.limits();
        limits.validate()?;
        for (tenant, l) in &self.tenants {
            l.over(&limits)
                .validate()
                .map_err(|e| format!("tenants.{tenant}: {e}"))?;
        }
        if self.max_instances == Some(0) {
            return Err("max_instances must be at least 1".into());
        }
        if self.max_concurrent_calls == Some(0) {
            return Err("max_concurrent_calls must be at least 1".into());
        }
        if let Some(address) = &self.publish_events {
            crate::events_out::validate_address(address)?;
        }
        if let Some(pin) = &self.sha256
            && (pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!("sha256 {pin:?} must be 64 hex digits"));
        }
        let mut guests = std::collections::BTreeSet::new();
        if self.dir.is_some() {
            guests.insert(DATA_DIR.to_owned());
        }
        for d in &self.dirs {
            crate::capabilities::dirs::validate_guest_path(&d.guest)?;
            if !guests.insert(d.guest.clone()) {
                return Err(format!("two directories are granted at {}", d.guest));
            }
        }
        for o in &self.http {
            Origin::parse(o)?;
        }
        for name in &self.env {
            crate::capabilities::env::validate_name(name)?;
        }
        SettingsGrant::from_table(&self.settings)?;
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        Ok(())
    }
}

/// The config file to use, per the search order above; `Err` when
/// `$KVWASM_CONFIG` names a missing file or no file exists.
pub fn locate() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let user = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|base| base.join("kvwasm/config.toml"));
    let candidates: Vec<PathBuf> = user
        .into_iter()
        .chain([PathBuf::from("/etc/kvwasm/config.toml")])
        .collect();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "no config file: set {CONFIG_ENV} or create one of {}",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// Backends built from config files, by (file, name), so repeated opens in
/// one process reuse the compiled component and parsed policy. A changed
/// config takes effect in the next process.
pub(crate) fn cached_backend(path: &Path, name: &str) -> Result<Arc<Backend>, String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Cache = Mutex<HashMap<(PathBuf, String), Arc<Backend>>>;
    static BACKENDS: OnceLock<Cache> = OnceLock::new();
    let key = (path.to_owned(), name.to_owned());
    let cache = BACKENDS.get_or_init(Default::default);
    if let Some(found) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(found.clone());
    }
    let backend = Arc::new(cached_config(path)?.backend(name)?);
    Ok(cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key)
        .or_insert(backend)
        .clone())
}

/// The config file at `path`, read and parsed once per process: the first
/// open of each backend would otherwise parse the whole file again (with
/// 10 backends × 100 tenants, milliseconds each; docs/benchmarks.md,
/// "Performance at scale").
pub(crate) fn cached_config(path: &Path) -> Result<Arc<Config>, String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CONFIGS: OnceLock<Mutex<HashMap<PathBuf, Arc<Config>>>> = OnceLock::new();
    let configs = CONFIGS.get_or_init(Default::default);
    if let Some(found) = configs.lock().unwrap_or_else(|p| p.into_inner()).get(path) {
        return Ok(found.clone());
    }
    let config = Arc::new(Config::load(path)?);
    Ok(configs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(path.to_owned())
        .or_insert(config)
        .clone())
}

/// How errors name a guest of `kind`: `backend "x"`, `fabric "x"`.
fn kind_word(kind: GuestKind) -> &'static str {
    match kind {
        GuestKind::KvStore => "backend",
        GuestKind::Fabric => "fabric",
        GuestKind::Subscriber => "subscriber",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_backend() {
        let config = Config::parse(
            r#"
            [backends.fast]
            component = "guests/x.wasm"
            sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
            dir = "data"
            read_only = true
            dirs = [{ host = "models", guest = "/models", read_only = true }]
            net = ["127.0.0.1:6379"]
            http = ["http://127.0.0.1:9000"]
            env = ["ACME_TOKEN"]
            max_instances = 2
            max_concurrent_calls = 8
            memory_limit_mib = 64
            call_timeout_ms = 500
            max_payload_mib = 8

            [backends.fast.tenants.alice]
            call_timeout_ms = 100
            "#,
            Path::new("/etc/kvwasm"),
        )
        .unwrap();
        let fast = &config.backends["fast"];
        let limits = fast.limits();
        assert_eq!(limits.memory_limit_mib, 64);
        assert_eq!(limits.call_timeout_ms, 500);
        let alice = fast.tenants["alice"].over(&limits);
        assert_eq!((alice.call_timeout_ms, alice.memory_limit_mib), (100, 64));
        assert_eq!(fast.max_instances, Some(2));
        assert!(fast.read_only);
        assert_eq!(fast.dirs[0].guest, "/models");
        let grants = config.grants(fast).unwrap();
        assert_eq!(grants.dirs.len(), 2);
        assert_eq!(grants.dirs[1].host, Path::new("/etc/kvwasm/models"));
        assert_eq!(grants.net.addrs.len(), 1);
        assert_eq!(grants.http.origins[0].to_string(), "http://127.0.0.1:9000");
    }

    #[test]
    fn a_config_file_is_parsed_once_per_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let memory = |name: &str| format!("[backends.{name}]\ncomponent = \"builtin:memory\"\n");
        std::fs::write(&path, memory("first") + &memory("second")).unwrap();
        cached_backend(&path, "first").unwrap();
        // The file changes under a running process: its backends are still
        // the ones it read first (a changed config takes effect in the next
        // process), and the new text is not parsed again.
        std::fs::write(&path, "not toml [").unwrap();
        let second = cached_backend(&path, "second").unwrap();
        assert_eq!(second.name, "second");
    }

    #[test]
    fn warm_handles_is_one_for_builtin_fs_without_tenants_and_zero_for_other_backends() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[backends.fs]\ncomponent = \"builtin:fs\"\ndir = \"d\"\n\
                    [backends.mem]\ncomponent = \"builtin:memory\"\nwarm_handles = 0\n\
                    [backends.cold]\ncomponent = \"builtin:fs\"\ndir = \"d\"\nwarm_handles = 0\n\
                    [backends.shared]\ncomponent = \"builtin:fs\"\ndir = \"d\"\n\
                    [backends.shared.tenants.t]\ncall_timeout_ms = 100\n\
                    [backends.asked]\ncomponent = \"builtin:fs\"\ndir = \"d\"\nwarm_handles = 2\n\
                    [backends.asked.tenants.t]\ncall_timeout_ms = 100\n";
        let config = Config::parse(text, dir.path()).unwrap();
        let warm = |name: &str| config.backend(name).unwrap().warm_handles;
        assert_eq!(
            [
                warm("fs"),
                warm("mem"),
                warm("cold"),
                warm("shared"),
                warm("asked")
            ],
            [1, 0, 0, 0, 2],
            "tenants: none unless asked"
        );
        assert_eq!(
            Config::embedded_fs(dir.path()).unwrap().warm_handles,
            1,
            "wasm:///dir"
        );
    }

    #[test]
    fn rejects_bad_configs() {
        let base = Path::new("/");
        let fs = "[backends.a]\ncomponent = \"builtin:fs\"\n";
        for (text, why) in [
            (
                "[backends.a]\ncomponent = \"builtin:No pe\"".to_owned(),
                "unknown builtin",
            ),
            (format!("{fs}typo = 1"), "unknown field"),
            (format!("{fs}call_timeout_ms = 0"), "at least 1"),
            ("[backends.a]\ndir = \"/x\"".to_owned(), "missing field"),
            ("backends = 3".to_owned(), "invalid type"),
            (format!("{fs}sha256 = \"abc\""), "64 hex digits"),
            (
                format!("{fs}dirs = [{{ host = \"/x\", guest = \"../up\" }}]"),
                "must be absolute",
            ),
            (
                format!("{fs}dir = \"/x\"\ndirs = [{{ host = \"/y\" }}]"),
                "two directories",
            ),
            (format!("{fs}http = [\"ftp://x\"]"), "http or https"),
            (format!("{fs}http = [\"http://x/path\"]"), "no path"),
            (
                format!("{fs}env = [\"A=B\"]"),
                "not an environment variable",
            ),
            (format!("{fs}max_concurrent_calls = 0"), "at least 1"),
            (
                format!("{fs}publish_events = \"127.0.0.1:5557\""),
                "expected tcp://host:port",
            ),
            (
                "[subscribers.s]\ncomponent = \"builtin:fs\"\npublish_events = \"tcp://127.0.0.1:1\""
                    .to_owned(),
                "publish_events does not apply",
            ),
            (
                "[fabrics.f]\ncomponent = \"builtin:fs\"\nidle_release_ms = 5".to_owned(),
                "idle_release_ms does not apply",
            ),
            (
                "[fabrics.f]\ncomponent = \"builtin:fs\"\nwarm_handles = 1".to_owned(),
                "warm_handles does not apply",
            ),
            (
                "[backends.a]\ncomponent = \"builtin:memory\"\nwarm_handles = 1".to_owned(),
                "warm_handles applies to builtin:fs only",
            ),
            (
                format!("{fs}idle_release_ms = 0\nwarm_handles = 2"),
                "idle_release_ms = 0 releases none",
            ),
            (
                format!("{fs}[backends.t]\ntiers = [\"a\", \"a\"]\nwarm_handles = 1"),
                "warm_handles belongs on the tier entries",
            ),
            (
                format!("{fs}prehash_tokens = true"),
                "prehash_tokens applies to [subscribers.*] only",
            ),
            (
                "[fabrics.f]\ncomponent = \"builtin:fs\"\nprehash_tokens = false".to_owned(),
                "prehash_tokens applies to [subscribers.*] only",
            ),
            (
                "[subscribers.s]\ncomponent = \"builtin:kv-indexer\"\nprehash_tokens = \"yes\""
                    .to_owned(),
                "expected a boolean",
            ),
            (
                format!("{fs}[backends.a.tenants.t]\nmemory_limit_mib = 0"),
                "tenants.t",
            ),
        ] {
            let err = Config::parse(&text, base).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
        let config = Config::parse(&format!("{fs}net = [\"no-port\"]"), base).unwrap();
        let err = config.grants(&config.backends["a"]).unwrap_err();
        assert!(err.contains("host:port"), "{err}");
    }

    /// A builtin of another kind's crate parses (a config shared with
    /// `kvwasm` names them) and is refused when built, with the reason.
    #[test]
    fn a_builtin_this_program_does_not_link_is_refused_when_built() {
        let config = Config::parse(
            "[backends.tcp]\ncomponent = \"builtin:tcp\"\n\
             [fabrics.tcp]\ncomponent = \"builtin:tcp\"\n\
             [subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\n\
             [backends.typo]\ncomponent = \"builtin:tpc\"\n",
            Path::new("/tmp"),
        )
        .unwrap();
        for err in [
            config.backend("tcp").unwrap_err(),
            config.fabric("tcp").unwrap_err(),
            config.subscriber("idx").unwrap_err(),
        ] {
            assert!(err.contains("is not linked into this program"), "{err}");
            assert!(
                err.contains("fabrics and event subscribers run in `kvwasm`"),
                "{err}"
            );
        }
        // A name no crate ships is a misspelling, not a missing link.
        let typo = config.backend("typo").unwrap_err();
        assert!(
            typo.contains("unknown builtin component \"tpc\"")
                && typo.contains("this program links builtin:fs")
                && typo.contains("in `kvwasm` also builtin:synthetic, builtin:tcp"),
            "{typo}"
        );
    }

    /// Token hashing is the KV indexer's crate's: off for this crate's
    /// builtins, and asks nothing of an advisor, whose events are never
    /// rewritten (a subscriber asking for it where it is not linked is
    /// refused: `tests/block_hash_refusal.rs`).
    #[test]
    fn token_prehashing_is_off_here_and_asks_nothing_of_an_advisor() {
        let config = Config::parse(
            "[subscribers.advisor]\ncomponent = \"builtin:advisor\"\n\
             [subscribers.on]\ncomponent = \"builtin:advisor\"\nprehash_tokens = true\n",
            Path::new("/tmp"),
        )
        .unwrap();
        assert!(!config.subscriber("advisor").unwrap().prehash_tokens);
        assert!(config.subscriber("on").is_ok());
    }
}
