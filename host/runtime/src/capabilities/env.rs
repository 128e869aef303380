//! Environment grants: variables passed through from the host process by
//! name, for credentials. The guest sees no other variable. Values are
//! never logged or printed; only names and whether they are set.

use wasmtime_wasi::WasiCtxBuilder;

/// The names of the variables a guest may read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvGrant {
    pub names: Vec<String>,
}

impl EnvGrant {
    pub(crate) fn apply(&self, builder: &mut WasiCtxBuilder) {
        for name in &self.names {
            if let Some(value) = std::env::var_os(name).and_then(|v| v.into_string().ok()) {
                builder.env(name, value);
            }
        }
    }

    /// `NAME (set)` / `NAME (not set)` for each name; never a value.
    pub fn describe(&self) -> Vec<String> {
        self.names
            .iter()
            .map(|n| {
                let state = if std::env::var_os(n).is_some() {
                    "set"
                } else {
                    "not set"
                };
                format!("{n} ({state})")
            })
            .collect()
    }
}

/// A variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn validate_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!("{name:?} is not an environment variable name"))
    }
}
