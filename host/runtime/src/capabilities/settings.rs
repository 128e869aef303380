//! Settings: the operator's `[backends.<name>.settings]` table, served to
//! the guest through `wasi:config/store` (server address, database index,
//! bucket, timeouts).
//!
//! Settings are configuration, not secrets: `check-config` prints them. A
//! key that looks like a secret (`password`, `secret`, `token`, `key_id`)
//! is refused at load unless it names an environment variable (`*_env`),
//! so credentials can only arrive through an `env` grant.

use std::collections::BTreeMap;

use serde::Deserialize;
use wasmtime_wasi_config::WasiConfigVariables;

/// One value of the settings table, handed to the guest as a string (a
/// list of strings comma-separated: a Redis Cluster's seed `addresses`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(
    untagged,
    expecting = "a string, an integer, a boolean or a list of strings"
)]
pub enum SettingValue {
    Text(String),
    Integer(i64),
    Flag(bool),
    List(Vec<String>),
}

/// The key/value pairs a guest may read with `wasi:config/store.get`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingsGrant {
    pub values: BTreeMap<String, String>,
}

impl SettingsGrant {
    /// Build from the config's table, checking every key.
    pub fn from_table(table: &BTreeMap<String, SettingValue>) -> Result<SettingsGrant, String> {
        let mut values = BTreeMap::new();
        for (key, value) in table {
            validate_key(key)?;
            let text = match value {
                SettingValue::Text(s) => s.clone(),
                SettingValue::Integer(i) => i.to_string(),
                SettingValue::Flag(b) => b.to_string(),
                SettingValue::List(items) => {
                    if let Some(item) = items.iter().find(|i| i.contains(',')) {
                        return Err(format!(
                            "settings.{key}: list item {item:?} contains a comma, which \
                             separates the items the guest reads"
                        ));
                    }
                    items.join(",")
                }
            };
            values.insert(key.clone(), text);
        }
        Ok(SettingsGrant { values })
    }

    pub(crate) fn variables(&self) -> WasiConfigVariables {
        self.values.iter().collect()
    }

    /// `key = value` lines for `check-config`.
    pub fn describe(&self) -> Vec<String> {
        self.values
            .iter()
            .map(|(k, v)| format!("{k} = {v:?}"))
            .collect()
    }
}

/// Setting names: `[a-z0-9_.-]+`, and nothing that looks like a secret.
fn validate_key(key: &str) -> Result<(), String> {
    let well_formed = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if !well_formed {
        return Err(format!(
            "settings.{key}: setting names are lower-case letters, digits, `_`, `.` and `-`"
        ));
    }
    const SECRET_WORDS: [&str; 4] = ["password", "secret", "token", "key_id"];
    if SECRET_WORDS.iter().any(|w| key.contains(w)) && !key.ends_with("_env") {
        return Err(format!(
            "settings.{key}: secrets do not belong in settings (they are printed); \
             grant an environment variable with `env = [\"NAME\"]` and name it in `{key}_env`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SettingsGrant, String> {
        let table: BTreeMap<String, SettingValue> =
            toml::from_str(text).map_err(|e| e.to_string())?;
        SettingsGrant::from_table(&table)
    }

    #[test]
    fn values_become_strings() {
        let s = parse("address = \"127.0.0.1:6379\"\ndb = 2\ntls = false").unwrap();
        assert_eq!(
            s.describe(),
            [
                "address = \"127.0.0.1:6379\"",
                "db = \"2\"",
                "tls = \"false\""
            ]
        );
    }

    #[test]
    fn lists_reach_the_guest_comma_separated() {
        let s = parse("addresses = [\"10.0.0.1:7000\", \"10.0.0.2:7000\"]").unwrap();
        assert_eq!(
            s.describe(),
            ["addresses = \"10.0.0.1:7000,10.0.0.2:7000\""]
        );
    }

    #[test]
    fn secrets_and_odd_values_are_refused() {
        for (text, why) in [
            ("password = \"hunter2\"", "secrets do not belong"),
            ("secret_access_key = \"x\"", "secrets do not belong"),
            ("access_key_id = \"x\"", "secrets do not belong"),
            ("Address = \"x\"", "lower-case"),
            ("peers = [1, 2]", "a list of strings"),
            ("ratio = 0.5", "a list of strings"),
            ("addresses = [\"a,b\"]", "contains a comma"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        assert!(parse("password_env = \"REDIS_PASSWORD\"").is_ok());
    }
}
