//! `wasm://` URIs, as passed to `open()` by the consumer.
//!
//! * `wasm:///abs/dir` — the embedded filesystem backend rooted at `/abs/dir`.
//! * `wasm://<backend>/<namespace...>` — backend `<backend>` from the config
//!   file; the namespace may be empty or contain `/`.
//!
//! One trailing `/` is trimmed, as the reference consumers expect of backends.

use std::path::PathBuf;

/// What a URI asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The embedded fs backend on this directory.
    EmbeddedFs(PathBuf),
    /// A named backend from the config file.
    Named {
        /// `[backends.<backend>]` in the config.
        backend: String,
        /// Passed to the guest's `store.open`.
        namespace: String,
    },
}

/// The URI scheme; it matches the library name `libkv_store_wasm.so`.
pub const SCHEME: &str = "wasm";

/// Parse a `wasm://` URI.
pub fn parse(uri: &str) -> Result<Target, String> {
    let rest = uri
        .strip_prefix("wasm://")
        .ok_or_else(|| format!("URI {uri:?} does not start with wasm://"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.starts_with('/') && rest.len() > 1 {
        // A directory below the root, without `..`: `wasm:///.` or
        // `wasm:////` would otherwise grant the whole filesystem.
        use std::path::Component;
        let path = PathBuf::from(rest);
        let parts: Vec<Component> = path.components().collect();
        let below_root = parts.iter().any(|c| matches!(c, Component::Normal(_)));
        if !below_root || parts.contains(&Component::ParentDir) {
            return Err(format!(
                "URI {uri:?}: the directory must be an absolute path below / without `..`"
            ));
        }
        return Ok(Target::EmbeddedFs(path));
    }
    if rest.is_empty() || rest == "/" {
        return Err(format!(
            "URI {uri:?} names neither a directory (wasm:///abs/dir) nor a backend (wasm://name/namespace)"
        ));
    }
    let (backend, namespace) = rest.split_once('/').unwrap_or((rest, ""));
    if !backend
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "URI {uri:?}: backend name {backend:?} may only contain letters, digits, '-' and '_'"
        ));
    }
    Ok(Target::Named {
        backend: backend.to_owned(),
        namespace: namespace.to_owned(),
    })
}

/// For a backend name that is not configured: if `/<backend>/<namespace>`
/// looks like a directory path (its first component exists), a hint that
/// the consumer meant `wasm:///...` (three slashes); else nothing.
pub fn directory_hint(backend: &str, namespace: &str) -> String {
    if std::path::Path::new("/").join(backend).is_dir() {
        let path = format!("/{backend}/{namespace}");
        format!(
            " (did you mean {SCHEME}://{}? a directory takes three slashes)",
            path.trim_end_matches('/')
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded() {
        assert_eq!(
            parse("wasm:///tmp/kv"),
            Ok(Target::EmbeddedFs("/tmp/kv".into()))
        );
        assert_eq!(
            parse("wasm:///tmp/kv/"),
            Ok(Target::EmbeddedFs("/tmp/kv".into()))
        );
    }

    #[test]
    fn named() {
        let named = |b: &str, n: &str| Target::Named {
            backend: b.into(),
            namespace: n.into(),
        };
        assert_eq!(parse("wasm://fs"), Ok(named("fs", "")));
        assert_eq!(parse("wasm://fs/"), Ok(named("fs", "")));
        assert_eq!(
            parse("wasm://redis/prod/Qwen3-8B/"),
            Ok(named("redis", "prod/Qwen3-8B"))
        );
    }

    #[test]
    fn rejected() {
        for bad in [
            "",
            "file:///tmp",
            "wasm:/x",
            "wasm://",
            "wasm:///",
            "wasm:///.",
            "wasm:////",
            "wasm:///tmp/../etc",
            "wasm://a b/c",
            "wasm://../x",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
