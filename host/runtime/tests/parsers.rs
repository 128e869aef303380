//! Property tests of the parsers the host owns: `wasm://` URIs, the TOML
//! config and `http` origins. Random and mutated inputs never panic, and
//! what is accepted obeys the documented rules.

use std::path::Path;

use kvwasm_host::capabilities::http::Origin;
use kvwasm_host::config::Config;
use kvwasm_host::uri::{self, Target};
use proptest::prelude::*;

/// A backend name as `wasm://<name>/` allows it.
const BACKEND: &str = "[A-Za-z0-9_-]{1,16}";
/// A namespace component: no `/`, anything else (the guest validates it).
const PART: &str = "[^/]{1,12}";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any text: no panic, and what is accepted is well formed.
    #[test]
    fn uri_parse_accepts_only_well_formed_targets(
        text in prop_oneof!["\\PC{0,64}", "wasm://\\PC{0,64}", "wasm://[a-z/._-]{0,24}"],
    ) {
        match uri::parse(&text) {
            Ok(Target::EmbeddedFs(dir)) => {
                prop_assert!(text.starts_with("wasm:///"), "{text:?}");
                prop_assert!(dir.is_absolute(), "{text:?} → {dir:?}");
                // Never the root itself, never `..`.
                prop_assert!(dir.parent().is_some(), "{text:?} → {dir:?}");
                prop_assert!(
                    !dir.components().any(|c| c == std::path::Component::ParentDir),
                    "{text:?} → {dir:?}"
                );
            }
            Ok(Target::Named { backend, namespace }) => {
                prop_assert!(!backend.is_empty(), "{text:?}");
                prop_assert!(
                    backend.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                    "{text:?} → backend {backend:?}"
                );
                // The canonical spelling parses back to the same target
                // (a namespace ending in `/` is the guest's to refuse).
                if !namespace.ends_with('/') {
                    let again = uri::parse(&format!("wasm://{backend}/{namespace}"));
                    prop_assert_eq!(again, Ok(Target::Named { backend, namespace }));
                }
            }
            Err(_) => {
                // One trailing `/` is trimmed; then `/<something>` is a
                // directory, unless it is `/` itself or climbs with `..`.
                let rest = text.strip_prefix("wasm://").map(|r| r.strip_suffix('/').unwrap_or(r));
                let plain_dir = rest.is_some_and(|r| {
                    let path = std::path::Path::new(r);
                    r.starts_with('/')
                        && path.components().any(|c| matches!(c, std::path::Component::Normal(_)))
                        && !path.components().any(|c| c == std::path::Component::ParentDir)
                });
                prop_assert!(!plain_dir, "an absolute directory was refused: {text:?}");
            }
        }
    }

    /// `wasm://<backend>/<namespace>[/]` names exactly that backend and
    /// namespace.
    #[test]
    fn uri_parse_reads_back_backend_and_namespace(
        backend in BACKEND,
        parts in proptest::collection::vec(PART, 0..4),
        trailing_slash in any::<bool>(),
    ) {
        let namespace = parts.join("/");
        let slash = if trailing_slash { "/" } else { "" };
        let text = format!("wasm://{backend}/{namespace}{slash}");
        prop_assert_eq!(
            uri::parse(&text),
            Ok(Target::Named { backend, namespace }),
            "{}", text
        );
    }

    /// Any text: no panic; an accepted origin is http(s), has a host and
    /// never userinfo, and its canonical spelling parses back to itself.
    #[test]
    fn origin_parse_accepts_only_origins(
        text in prop_oneof![
            "\\PC{0,48}",
            "(http|https|HTTP|ftp)://[a-z0-9.:@\\[\\]/?#%-]{0,32}",
        ],
    ) {
        if let Ok(origin) = Origin::parse(&text) {
            prop_assert!(!text.contains('@'), "userinfo accepted: {text:?}");
            prop_assert!(origin.scheme == "http" || origin.scheme == "https");
            prop_assert!(!origin.host.is_empty());
            prop_assert_eq!(Origin::parse(&origin.to_string()), Ok(origin));
        }
    }

    /// Userinfo is refused, and never echoed (it may be a password).
    #[test]
    fn origins_with_userinfo_are_refused_without_echo(
        scheme in "https?",
        user in "zq[a-z]{1,6}(:PW[A-Za-z0-9]{1,12})?",
        host in "[a-z][a-z0-9-]{0,12}(\\.[a-z]{2,6}){0,2}",
        port in proptest::option::of(1u16..),
    ) {
        let port = port.map(|p| format!(":{p}")).unwrap_or_default();
        let plain = format!("{scheme}://{host}{port}");
        prop_assert!(Origin::parse(&plain).is_ok(), "{}", plain);
        let text = format!("{scheme}://{user}@{host}{port}");
        let err = Origin::parse(&text).unwrap_err();
        prop_assert!(!err.contains(&user), "{err}");
    }
}

/// A TOML value of any type, valid or not for the key it is given to.
fn toml_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("0".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("18446744073709551615".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        "\\PC{0,24}".prop_map(|s| format!("{s:?}")),
        "(builtin:(fs|memory|redis|s3|nope)|[a-z/.]{1,12}\\.wasm)".prop_map(|s| format!("{s:?}")),
        "(https?://)?([a-z]{1,6}(:[a-z0-9]{1,6})?@)?[a-z0-9.]{1,12}(:[0-9]{1,6})?(/[a-z]{0,4})?"
            .prop_map(|s| format!("{s:?}")),
        "[0-9a-fA-F]{60,68}".prop_map(|s| format!("{s:?}")),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(", "))),
            proptest::collection::vec(("[a-z_]{1,10}", inner), 0..4).prop_map(|kv| {
                let kv: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", kv.join(", "))
            }),
        ]
    })
}

/// Every key a backend entry may have, and one it may not.
const KEYS: &[&str] = &[
    "component",
    "sha256",
    "dir",
    "read_only",
    "dirs",
    "net",
    "dns",
    "http",
    "env",
    "settings",
    "max_instances",
    "max_concurrent_calls",
    "memory_limit_mib",
    "call_timeout_ms",
    "max_payload_mib",
    "fuel",
    "tenants",
    "no_such_key",
];
/// Keys whose value 0 makes no sense: a config setting one to 0 is refused.
const NOT_ZERO: &[&str] = &[
    "max_instances",
    "max_concurrent_calls",
    "memory_limit_mib",
    "call_timeout_ms",
    "max_payload_mib",
    "fuel",
];

/// `[backends.<name>]` tables with random keys and values.
fn config_text() -> impl Strategy<Value = (String, Vec<(String, String)>)> {
    let entry = (proptest::sample::select(KEYS), toml_value());
    let backend = (BACKEND, proptest::collection::vec(entry, 0..8));
    proptest::collection::vec(backend, 0..3).prop_map(|backends| {
        let mut text = String::new();
        let mut all = Vec::new();
        for (name, entries) in backends {
            text.push_str(&format!("[backends.{name}]\n"));
            for (key, value) in entries {
                text.push_str(&format!("{key} = {value}\n"));
                all.push((key.to_owned(), value));
            }
        }
        (text, all)
    })
}

/// The documented example, valid: the seed of the mutation test.
const EXAMPLE: &str = r#"
base_dir = "/srv"
[backends.acme]
component = "acme.wasm"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
dir = "/srv/kv"
dirs = [{ host = "/srv/models", guest = "/models", read_only = true }]
net = ["redis.internal:6379"]
dns = false
http = ["http://127.0.0.1:9000"]
env = ["ACME_TOKEN"]
settings = { bucket = "kv", timeout_ms = 500 }
max_instances = 4
max_concurrent_calls = 64
memory_limit_mib = 256
call_timeout_ms = 30000
max_payload_mib = 1024
fuel = 50000000
[backends.acme.tenants.alice]
memory_limit_mib = 64
call_timeout_ms = 2000
"#;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    /// Random backend entries: no panic, and whatever is accepted passed
    /// the rules (no userinfo in an origin, no zero limit).
    #[test]
    fn config_parse_enforces_its_rules((text, entries) in config_text()) {
        let parsed = Config::parse(&text, Path::new("/etc/kvwasm"));
        if let Ok(config) = &parsed {
            for (key, value) in &entries {
                prop_assert!(
                    !(NOT_ZERO.contains(&key.as_str()) && value == "0"),
                    "{key} = 0 accepted:\n{text}"
                );
            }
            for backend in config.backends.values() {
                for origin in &backend.http {
                    prop_assert!(!origin.contains('@'), "userinfo accepted:\n{text}");
                    prop_assert!(Origin::parse(origin).is_ok());
                }
            }
            // Deterministic: the same text gives the same config.
            prop_assert_eq!(&Config::parse(&text, Path::new("/etc/kvwasm")), &parsed);
        }
    }

    /// The example with random bytes inserted, replaced or removed: no
    /// panic, whatever the damage.
    #[test]
    fn damaged_configs_never_panic(
        edits in proptest::collection::vec((any::<usize>(), 0u8..3, any::<char>()), 1..6),
    ) {
        let mut text: Vec<char> = EXAMPLE.chars().collect();
        for (at, kind, c) in edits {
            let at = at % (text.len() + 1);
            match kind {
                0 => text.insert(at, c),
                1 if at < text.len() => text[at] = c,
                _ if at < text.len() => {
                    text.remove(at);
                }
                _ => {}
            }
        }
        let text: String = text.into_iter().collect();
        let _ = Config::parse(&text, Path::new("/etc/kvwasm"));
    }
}

#[test]
fn the_example_config_is_valid() {
    let config = Config::parse(EXAMPLE, Path::new("/etc/kvwasm")).unwrap();
    assert_eq!(config.backends["acme"].http, ["http://127.0.0.1:9000"]);
}

/// Found by `origin_parse_accepts_only_origins`: `http::Uri` accepts the
/// host `a[`, whose canonical spelling did not parse back.
#[test]
fn origins_with_odd_hosts_are_refused() {
    for bad in [
        "http://a[:]#",
        "http://a[:80",
        "http://x%41y",
        "http://[not-v6]",
    ] {
        assert!(Origin::parse(bad).is_err(), "{bad:?}");
    }
    for good in [
        "http://s3.example:9000",
        "https://[::1]:443",
        "http://127.0.0.1",
    ] {
        let origin = Origin::parse(good).unwrap();
        assert_eq!(Origin::parse(&origin.to_string()), Ok(origin), "{good:?}");
    }
}
