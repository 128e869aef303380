//! Where the fs backend (`builtin:fs`) keeps chunks, written once for the
//! guest that writes them and the host that finds, lists and removes them
//! (a tiered store's fs tier; a put answered in place).
//!
//! llama.cpp's in-tree local store:
//!
//! ```text
//! <root>/<manifest name>
//! <root>/chunks/<first hex digit of hash>/<hex of whole hash>
//! ```
//!
//! `<root>` is the granted directory plus the namespace, one directory per
//! component ([`namespace_dir`]). Plain Rust without dependencies, so both
//! the wasm guest and the host build it.

#![no_std]

extern crate alloc;

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// Where chunks live under a store's root.
pub const CHUNKS_DIR: &str = "chunks";

/// The fan-out directories' names under [`CHUNKS_DIR`], by slot.
pub const FANOUT_DIRS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f",
];

/// Index of a (non-empty) hash's fan-out directory: its first hex digit.
pub fn fanout_slot(hash: &[u8]) -> usize {
    usize::from(hash[0] >> 4)
}

/// A chunk's path under [`CHUNKS_DIR`]: `<first hex digit>/<hex of whole
/// hash>`, made in one allocation (every chunk call makes one). `hash` is
/// not empty.
pub fn chunk_path(hash: &[u8]) -> String {
    let mut path = String::with_capacity(2 + 2 * hash.len());
    path.push_str(FANOUT_DIRS[fanout_slot(hash)]);
    path.push('/');
    push_chunk_name(&mut path, hash);
    path
}

/// Append a chunk's file name, the lowercase hex of its hash, to `out`.
pub fn push_chunk_name(out: &mut String, hash: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 * hash.len());
    for byte in hash {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

/// Longest hash a chunk file is named after, in bytes.
pub const MAX_HASH_LEN: usize = 64;

/// A chunk file's name back to its hash: lowercase hex of 1 to
/// [`MAX_HASH_LEN`] bytes, exactly as [`push_chunk_name`] writes it (a
/// temporary file, whose name is not hex, is none).
pub fn hash_of_chunk_name(name: &str) -> Option<Vec<u8>> {
    let digits = name.as_bytes();
    if digits.is_empty() || !digits.len().is_multiple_of(2) || digits.len() > 2 * MAX_HASH_LEN {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    digits
        .chunks_exact(2)
        .map(|pair| Some(value(pair[0])? << 4 | value(pair[1])?))
        .collect()
}

/// The directory name of namespace component `part`: `..<part>` if it
/// could be taken for a chunk store on a case-insensitive filesystem (which
/// may also fold Unicode look-alikes or drop trailing dots and spaces),
/// else `part` itself. Valid namespace components and manifest names never
/// contain `..`, so the escaped name meets no other namespace or manifest,
/// and no namespace can reach into another one's chunks.
pub fn namespace_dir(part: &str) -> Cow<'_, str> {
    if folds_to_chunks_dir(part.trim_end_matches(['.', ' '])) {
        Cow::Owned(format!("..{part}"))
    } else {
        Cow::Borrowed(part)
    }
}

/// `name.to_uppercase().to_lowercase() == CHUNKS_DIR`, without Unicode's
/// case tables: they were 24 KiB of the fs guest's memory image, resident
/// in every instance. Case mapping goes character by character, and the
/// only characters that fold to a letter of `chunks` are its ASCII letters
/// in either case, `ſ` (U+017F, to `s`) and the Kelvin sign (U+212A, to `k`);
/// those that fold to several (`ß` to `ss`) fold to nothing inside `chunks`
/// (the tests check every code point).
///
/// Characters a filesystem may ignore when it compares names (Unicode's
/// default-ignorable code points: zero-width joiners, soft hyphen,
/// variation selectors; HFS+ ignores some, older Linux casefolding all)
/// are left out first, so `chun\u{200D}ks` is escaped too.
fn folds_to_chunks_dir(name: &str) -> bool {
    let fold = |c: char| match c {
        '\u{17F}' => 's',
        '\u{212A}' => 'k',
        c => c.to_ascii_lowercase(),
    };
    name.chars()
        .filter(|&c| !default_ignorable(c))
        .map(fold)
        .eq(CHUNKS_DIR.chars())
}

/// Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt).
fn default_ignorable(c: char) -> bool {
    matches!(
        u32::from(c),
        0xAD | 0x34F
            | 0x61C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    #[test]
    fn chunk_paths_are_the_in_tree_layout() {
        // llama.cpp's local store: chunks/<first hex digit>/<hex of hash>.
        assert_eq!(chunk_path(&[0xa7, 0x00, 0x3c]), "a/a7003c");
        assert_eq!(fanout_slot(&[0xa7]), 10);
        assert_eq!(chunk_path(&[0x05]), "0/05");
        let longest = [0xff; MAX_HASH_LEN];
        assert_eq!(chunk_path(&longest), format!("f/{}", "ff".repeat(64)));
        for (slot, name) in FANOUT_DIRS.iter().enumerate() {
            assert_eq!(*name, format!("{slot:x}"));
        }
    }

    #[test]
    fn chunk_names_round_trip_and_nothing_else_is_a_chunk() {
        let hash = vec![0x0a, 0xff, 0x00, 0x7c];
        let mut name = String::new();
        push_chunk_name(&mut name, &hash);
        assert_eq!(name, "0aff007c");
        assert_eq!(hash_of_chunk_name(&name), Some(hash));
        let longest = "ab".repeat(MAX_HASH_LEN);
        assert_eq!(hash_of_chunk_name(&longest).map(|h| h.len()), Some(64));
        let too_long = "ab".repeat(MAX_HASH_LEN + 1);
        for name in [".kvwasm-tmp-1-2", "ABCD", "abc", "", "zz", "0g", &too_long] {
            assert_eq!(hash_of_chunk_name(name), None, "{name}");
        }
    }

    #[test]
    fn a_namespace_that_could_name_a_chunk_store_is_escaped() {
        for part in ["chunks", "Chunks.", "CHUNKS ", "chunks. ."] {
            assert_eq!(namespace_dir(part), format!("..{part}"));
        }
        for part in ["alice", "chunk", "chunks-2", ".chunks"] {
            assert_eq!(namespace_dir(part), part.to_string());
        }
        // the look-alikes a case-insensitive filesystem may fold
        for part in ["chunk\u{17F}", "CHUN\u{212A}S", "\u{17F}"] {
            let escaped = namespace_dir(part) != part;
            assert_eq!(escaped, part.len() > 3, "{part:?}");
        }
    }

    #[test]
    fn a_namespace_with_characters_a_filesystem_ignores_is_escaped() {
        for part in [
            "chun\u{200D}ks",
            "\u{AD}chunks",
            "chunks\u{FEFF}",
            "c\u{FE0F}hunks",
        ] {
            assert_eq!(namespace_dir(part), format!("..{part}"), "{part:?}");
        }
        assert_eq!(namespace_dir("chun\u{200D}k"), "chun\u{200D}k");
    }

    #[test]
    fn the_fold_without_case_tables_is_unicodes_for_every_character() {
        let letters = |s: &str| !s.is_empty() && s.chars().all(|c| CHUNKS_DIR.contains(c));
        let unicodes = |name: &str| {
            let kept: String = name.chars().filter(|&c| !default_ignorable(c)).collect();
            kept.to_uppercase().to_lowercase() == CHUNKS_DIR
        };
        for c in (0..=u32::from(char::MAX)).filter_map(char::from_u32) {
            let folded = c.to_uppercase().collect::<String>().to_lowercase();
            let single = c.to_string();
            // `chunks` with each letter in turn replaced by `c`: the two
            // folds agree on every one
            for at in 0..CHUNKS_DIR.len() {
                let mut name = String::from(CHUNKS_DIR);
                name.replace_range(at..at + 1, &single);
                assert_eq!(folds_to_chunks_dir(&name), unicodes(&name), "{name:?}");
            }
            if letters(&folded) && folded.chars().count() > 1 {
                // (`ß` to `ss`): never inside `chunks`, so in no name that folds to it
                assert!(
                    !CHUNKS_DIR.contains(folded.as_str()),
                    "{c:?} folds to {folded:?}"
                );
            } else if letters(&folded) {
                // one letter of `chunks`, from one character: then a name
                // folds to `chunks` exactly when each character folds to
                // its letter, which is what folds_to_chunks_dir checks
                let mut probe = String::from(CHUNKS_DIR);
                let at = probe.find(folded.as_str()).unwrap();
                probe.replace_range(at..at + 1, &single);
                assert!(folds_to_chunks_dir(&probe), "{c:?} in {probe:?}");
            }
        }
    }
}
