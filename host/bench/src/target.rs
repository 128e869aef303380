//! What is measured (a backend library and a URI pattern) and where (a
//! directory on some medium).

use std::path::{Path, PathBuf};

use kv_store_abi::Library;

/// A backend under test: `label=lib=uri-template`, where `{dir}` in the
/// template becomes a fresh directory for each run.
#[derive(Debug, Clone)]
pub struct Target {
    pub label: String,
    pub lib: PathBuf,
    pub uri_template: String,
}

impl Target {
    /// Parse `label=lib=uri-template`.
    pub fn parse(spec: &str) -> Result<Target, String> {
        let mut parts = spec.splitn(3, '=');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(label), Some(lib), Some(uri)) if !label.is_empty() && uri.contains("{dir}") => {
                Ok(Target {
                    label: label.to_owned(),
                    lib: PathBuf::from(lib),
                    uri_template: uri.to_owned(),
                })
            }
            _ => Err(format!(
                "target {spec:?}: expected LABEL=LIBRARY=URI with {{dir}} in the URI, \
                 e.g. native=./libkv_store_cfs.so=cfs://{{dir}}"
            )),
        }
    }

    pub(crate) fn load(&self) -> Result<Loaded, String> {
        let lib = Library::open(self.lib.as_os_str())
            .map_err(|e| format!("{}: {}: {e}", self.label, self.lib.display()))?;
        Ok(Loaded {
            target: self.clone(),
            lib,
        })
    }

    /// The URI for a run in `dir`.
    pub fn uri(&self, dir: &Path) -> String {
        self.uri_template
            .replace("{dir}", &dir.display().to_string())
    }
}

/// A target with its library loaded.
pub(crate) struct Loaded {
    pub target: Target,
    pub lib: Library,
}

/// A directory to run in: `label=path` (e.g. `tmpfs=/dev/shm`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Medium {
    pub label: String,
    pub path: PathBuf,
}

impl Medium {
    pub fn parse(spec: &str) -> Result<Medium, String> {
        match spec.split_once('=') {
            Some((label, path)) if !label.is_empty() && !path.is_empty() => Ok(Medium {
                label: label.to_owned(),
                path: PathBuf::from(path),
            }),
            _ => Err(format!(
                "directory {spec:?}: expected LABEL=PATH, e.g. tmpfs=/dev/shm"
            )),
        }
    }
}
