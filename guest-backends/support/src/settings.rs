//! The operator's `[backends.<name>.settings]`, read through `wasi:config`,
//! with typed getters whose errors name the setting.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::Error;
use crate::bindings::wasi::config::store as config;

/// A backend's settings, read once when a store opens.
#[derive(Debug, Default)]
pub struct Settings {
    values: BTreeMap<String, String>,
}

impl Settings {
    /// Everything the operator set for this backend.
    pub fn load() -> Result<Settings, Error> {
        let pairs = config::get_all()
            .map_err(|e| Error::Other(format!("cannot read the backend's settings: {e:?}")))?;
        Ok(Settings {
            values: pairs.into_iter().collect(),
        })
    }

    /// Settings from explicit pairs (tests, defaults).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Settings {
        Settings {
            values: pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value of `key`, or an `invalid-argument` saying it is missing.
    pub fn required(&self, key: &str) -> Result<&str, Error> {
        self.get(key).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "setting `{key}` is missing from this backend's [settings]"
            ))
        })
    }

    /// `key` parsed as `T`, or `default` when unset.
    pub fn parse_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, Error>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|e| Error::InvalidArgument(format!("setting `{key}` = {text:?}: {e}"))),
        }
    }

    /// A secret from the environment: the variable named by setting
    /// `<key>_env`, else `default_var`. `None` when that variable is unset
    /// (or not granted: the guest cannot tell the difference).
    pub fn secret(&self, key: &str, default_var: &str) -> Option<String> {
        let var = self
            .get(&format!("{key}_env"))
            .unwrap_or(default_var)
            .to_owned();
        std::env::var(var).ok().filter(|v| !v.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_getters_name_the_setting() {
        let s = Settings::from_pairs([("db", "2"), ("timeout_ms", "soon")]);
        assert_eq!(s.parse_or("db", 0u32).unwrap(), 2);
        assert_eq!(s.parse_or("absent", 7u32).unwrap(), 7);
        let err = format!("{:?}", s.parse_or("timeout_ms", 0u64).unwrap_err());
        assert!(err.contains("timeout_ms") && err.contains("soon"), "{err}");
        let err = format!("{:?}", s.required("address").unwrap_err());
        assert!(err.contains("`address` is missing"), "{err}");
    }
}
