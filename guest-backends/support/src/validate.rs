//! Input rules every backend applies before touching storage.
//!
//! The C shim already rejects NULL pointers and non-UTF-8 names; these rules
//! are the backend's own contract (see `wit/kv-store.wit`), enforced inside
//! the sandbox so a buggy or hostile consumer cannot steer a backend outside
//! its key space.

use crate::Error;

/// Longest hash accepted, in bytes (SHA-512 size; llama.cpp uses 8, oMLX 32).
pub const MAX_HASH_LEN: usize = 64;
/// Longest manifest name accepted, in bytes (a common filesystem name limit).
pub const MAX_NAME_LEN: usize = 255;

/// A hash must be 1 to [`MAX_HASH_LEN`] bytes.
pub fn hash(hash: &[u8]) -> Result<(), Error> {
    if hash.is_empty() || hash.len() > MAX_HASH_LEN {
        return Err(Error::InvalidArgument(format!(
            "hash length {} is outside 1..={MAX_HASH_LEN}",
            hash.len()
        )));
    }
    Ok(())
}

/// Lowercase hex of a hash: the on-disk / on-wire chunk key.
pub fn hash_hex(hash: &[u8]) -> String {
    let mut hex = String::with_capacity(2 * hash.len());
    push_hex(&mut hex, hash);
    hex
}

/// Append the lowercase hex of `bytes` to `out`, so a key with a prefix
/// takes one allocation. Every chunk call keys by it: `hex::encode`, which
/// pushes one character at a time through an iterator, and the `format!`
/// around it took about a tenth of a 4 KiB get through the fs guest.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut digits = [0u8; 2 * MAX_HASH_LEN];
    match digits.get_mut(..2 * bytes.len()) {
        Some(digits) => {
            hex::encode_to_slice(bytes, digits).expect("two digits a byte");
            out.push_str(std::str::from_utf8(digits).expect("hex digits are ASCII"));
        }
        // Longer than a valid hash: only ever written into a message.
        None => out.push_str(&hex::encode(bytes)),
    }
}

/// A manifest name must be one safe path component: non-empty, at most
/// [`MAX_NAME_LEN`] bytes, no `/`, `\`, NUL or other control character, and
/// no `..` anywhere (nor the name `.`).
pub fn manifest_name(name: &str) -> Result<(), Error> {
    let reject = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "manifest name {:?} rejected: {why}",
            truncate(name)
        )))
    };
    if name.is_empty() {
        return reject("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return reject(&format!("{} bytes, limit {MAX_NAME_LEN}", name.len()));
    }
    if name == "." || name.contains("..") {
        return reject("relative path component");
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == '\\' || c.is_control())
    {
        return reject(&format!("contains {c:?}"));
    }
    Ok(())
}

/// A namespace is empty, or `/`-separated components that each obey
/// [`manifest_name`] (so `a/b` is fine, `a//b`, `/a` and `a/../b` are not).
pub fn namespace(namespace: &str) -> Result<Vec<&str>, Error> {
    if namespace.is_empty() {
        return Ok(Vec::new());
    }
    namespace
        .split('/')
        .map(|part| {
            manifest_name(part).map(|()| part).map_err(|_| {
                Error::InvalidArgument(format!(
                    "namespace {:?} rejected: component {:?} is not a safe name",
                    truncate(namespace),
                    truncate(part)
                ))
            })
        })
        .collect()
}

/// Names go into log lines; keep hostile 100 KB names from flooding them.
fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes() {
        assert!(hash(&[]).is_err());
        assert!(hash(&[0]).is_ok());
        assert!(hash(&[0; 64]).is_ok());
        assert!(hash(&[0; 65]).is_err());
        assert_eq!(hash_hex(&[0xab, 0x01]), "ab01");
        let longest = [0xc3; MAX_HASH_LEN];
        assert_eq!(hash_hex(&longest), "c3".repeat(MAX_HASH_LEN));
        assert_eq!(
            hash_hex(&[0x0f; MAX_HASH_LEN + 1]),
            "0f".repeat(MAX_HASH_LEN + 1)
        );
        let mut key = String::from("chunks/");
        push_hex(&mut key, &[0x00, 0x9a, 0xff]);
        assert_eq!(key, "chunks/009aff");
    }

    #[test]
    fn names() {
        for ok in [
            "slot0.bin",
            "__omlx_index__",
            ".hidden",
            "a.b",
            &"x".repeat(255),
        ] {
            assert!(manifest_name(ok).is_ok(), "{ok:?} should be accepted");
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "a/b",
            "/abs",
            "a\\b",
            "a\0b",
            "a\nb",
            "x..y",
            &"x".repeat(256),
        ] {
            assert!(manifest_name(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn namespaces() {
        assert_eq!(namespace("").unwrap(), Vec::<&str>::new());
        assert_eq!(
            namespace("prod/Qwen3-8B").unwrap(),
            vec!["prod", "Qwen3-8B"]
        );
        for bad in ["/a", "a//b", "a/../b", "a/", ".."] {
            assert!(namespace(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
