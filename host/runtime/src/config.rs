//! The operator's configuration file (TOML).
//!
//! ```toml
//! [backends.fast]
//! component = "builtin:fs"        # or a path to a .wasm component
//! dir = "/srv/kv"                 # granted to the guest at /data
//! read_only = false
//! max_instances = 4
//! memory_limit_mib = 256
//! call_timeout_ms = 30000
//! max_payload_mib = 1024
//! ```
//!
//! Relative paths are relative to the config file's directory, or to the
//! top-level `base_dir = "..."` when set. The file is found at
//! `$KVWASM_CONFIG` if set, else the first of
//! `$XDG_CONFIG_HOME/kvwasm/config.toml` (or `~/.config/kvwasm/config.toml`)
//! and `/etc/kvwasm/config.toml` that exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::backend::{Backend, default_max_instances};
use crate::capabilities::{DirGrant, Grants};
use crate::component::{ComponentSource, LoadedComponent};
use crate::limits::Limits;

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "KVWASM_CONFIG";

/// A parsed config file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Backends by name, as used in `wasm://<name>/...`.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendConfig>,
    /// `base_dir`: where relative paths start, if not at the file itself
    /// (lets tools such as `kvwasm check` run a copy of an operator's file).
    #[serde(rename = "base_dir", default)]
    declared_base_dir: Option<PathBuf>,
    /// Directory relative paths start from.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[backends.<name>]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// `builtin:fs`, `builtin:memory`, or a `.wasm` component path.
    pub component: String,
    /// Host directory granted to the guest at `/data` (created if missing).
    pub dir: Option<PathBuf>,
    /// Grant `dir` read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Instances serving one handle at once (default: cores, at most 4).
    pub max_instances: Option<usize>,
    /// Linear memory cap per instance, MiB.
    pub memory_limit_mib: Option<u64>,
    /// Deadline for one call, ms.
    pub call_timeout_ms: Option<u64>,
    /// Largest payload a guest may return, MiB.
    pub max_payload_mib: Option<u64>,
}

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
                .limits()
                .validate()
                .and_then(|()| backend.source().map(drop))
                .map_err(|e| format!("[backends.{name}]: {e}"))?;
            if backend.max_instances == Some(0) {
                return Err(format!(
                    "[backends.{name}]: max_instances must be at least 1"
                ));
            }
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

    /// Build the backend called `name`: load its component, resolve paths.
    pub fn backend(&self, name: &str) -> Result<Backend, String> {
        let spec = self.backends.get(name).ok_or_else(|| {
            let known: Vec<_> = self.backends.keys().map(String::as_str).collect();
            format!("no backend {name:?} in the config (configured: {known:?})")
        })?;
        let source = self.component_source(spec)?;
        let component = LoadedComponent::load(&source)
            .map_err(|e| format!("backend {name:?}: cannot load {source}: {e:#}"))?;
        let data_dir = match &spec.dir {
            Some(dir) => {
                let host = self.base_dir.join(dir);
                if !spec.read_only {
                    std::fs::create_dir_all(&host).map_err(|e| {
                        format!("backend {name:?}: cannot create {}: {e}", host.display())
                    })?;
                }
                Some(DirGrant {
                    host,
                    read_only: spec.read_only,
                })
            }
            None => None,
        };
        Ok(Backend {
            name: name.to_owned(),
            source,
            component,
            grants: Grants { data_dir },
            limits: spec.limits(),
            max_instances: spec.max_instances.unwrap_or_else(default_max_instances),
        })
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
    /// read-write (created if missing), default limits.
    pub fn embedded_fs(dir: &Path) -> Result<Backend, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
        let source = ComponentSource::Builtin(crate::component::Builtin::Fs);
        let component = LoadedComponent::load(&source)
            .map_err(|e| format!("cannot load the embedded fs backend: {e:#}"))?;
        Ok(Backend {
            name: source.to_string(),
            source,
            component,
            grants: Grants {
                data_dir: Some(DirGrant {
                    host: dir.to_owned(),
                    read_only: false,
                }),
            },
            limits: Limits::default(),
            max_instances: default_max_instances(),
        })
    }
}

impl BackendConfig {
    fn source(&self) -> Result<ComponentSource, String> {
        self.component.parse()
    }

    fn limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            memory_limit_mib: self.memory_limit_mib.unwrap_or(d.memory_limit_mib),
            call_timeout_ms: self.call_timeout_ms.unwrap_or(d.call_timeout_ms),
            max_payload_mib: self.max_payload_mib.unwrap_or(d.max_payload_mib),
        }
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
    let backend = Arc::new(Config::load(path)?.backend(name)?);
    Ok(cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key)
        .or_insert(backend)
        .clone())
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
            dir = "data"
            read_only = true
            max_instances = 2
            memory_limit_mib = 64
            call_timeout_ms = 500
            max_payload_mib = 8
            "#,
            Path::new("/etc/kvwasm"),
        )
        .unwrap();
        let fast = &config.backends["fast"];
        assert_eq!(fast.limits().memory_limit_mib, 64);
        assert_eq!(fast.limits().call_timeout_ms, 500);
        assert_eq!(fast.max_instances, Some(2));
        assert!(fast.read_only);
    }

    #[test]
    fn rejects_bad_configs() {
        let base = Path::new("/");
        for (text, why) in [
            (
                "[backends.a]\ncomponent = \"builtin:nope\"",
                "unknown builtin",
            ),
            (
                "[backends.a]\ncomponent = \"builtin:fs\"\ntypo = 1",
                "unknown field",
            ),
            (
                "[backends.a]\ncomponent = \"builtin:fs\"\ncall_timeout_ms = 0",
                "at least 1",
            ),
            ("[backends.a]\ndir = \"/x\"", "missing field"),
            ("backends = 3", "invalid type"),
        ] {
            let err = Config::parse(text, base).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
