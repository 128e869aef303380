//! The directories of one `builtin:fs` store on the host, as the fs guest
//! lays them out (`kvwasm_fs_layout`): the granted directory, the
//! namespace's directories beneath it, then `chunks`.
//!
//! The host looks at them itself for two things: to answer the puts of
//! chunks it finds in place ([`super::in_place`]), and to tell whether a
//! warm instance, kept through idle release, would still reach the store
//! it opened ([`StoreDirs::identity`]): its descriptors name directories,
//! not paths, so a store moved away or replaced while it idled would
//! otherwise take its next save somewhere no reader looks.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kvwasm_fs_layout::{CHUNKS_DIR, namespace_dir};

/// The paths of one store's directories.
pub(crate) struct StoreDirs {
    /// The granted directory's host path.
    pub(crate) grant: CString,
    /// The first directory beneath the grant (a namespace directory, or
    /// `chunks`), by its whole path.
    pub(crate) first: CString,
    /// The names of the directories after the first, down to `chunks`.
    pub(crate) rest: Vec<CString>,
}

/// The (device, inode) of each of a store's directories, from the grant
/// down to `chunks` (`None`: missing, or not a directory).
pub(crate) type Identity = Vec<Option<(u64, u64)>>;

impl StoreDirs {
    /// The store of `namespace` (a valid one: the guest opened it) in the
    /// directory granted at `grant`.
    pub(crate) fn new(grant: &Path, namespace: &str) -> Option<StoreDirs> {
        let mut beneath = Vec::new();
        for part in namespace.split('/').filter(|p| !p.is_empty()) {
            beneath.push(CString::new(namespace_dir(part).as_bytes()).ok()?);
        }
        beneath.push(CString::new(CHUNKS_DIR).ok()?);
        let mut first = grant.as_os_str().as_bytes().to_vec();
        first.push(b'/');
        first.extend_from_slice(beneath.remove(0).as_bytes());
        Some(StoreDirs {
            grant: CString::new(grant.as_os_str().as_bytes()).ok()?,
            first: CString::new(first).ok()?,
            rest: beneath,
        })
    }

    /// Which directories the store's paths name now: the grant resolved as
    /// its preopen is (it is the operator's path), each directory beneath
    /// it without following it if it is a link.
    pub(crate) fn identity(&self) -> Identity {
        let id = |meta: std::fs::Metadata| meta.is_dir().then(|| (meta.dev(), meta.ino()));
        let path = |c: &CString| PathBuf::from(OsStr::from_bytes(c.as_bytes()));
        let mut ids = vec![std::fs::metadata(path(&self.grant)).ok().and_then(id)];
        let mut dir = path(&self.first);
        ids.push(std::fs::symlink_metadata(&dir).ok().and_then(id));
        for name in &self.rest {
            dir.push(OsStr::from_bytes(name.as_bytes()));
            ids.push(std::fs::symlink_metadata(&dir).ok().and_then(id));
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_changes_when_a_directory_is_replaced_removed_or_made_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let grant = dir.path().join("data");
        let dirs = StoreDirs::new(&grant, "team").unwrap();
        let ns = PathBuf::from(OsStr::from_bytes(dirs.first.as_bytes()));
        assert_eq!(ns, grant.join(namespace_dir("team").as_ref()));
        let chunks = ns.join(CHUNKS_DIR);
        std::fs::create_dir_all(&chunks).unwrap();
        let kept = dirs.identity();
        assert_eq!(kept.len(), 3);
        assert!(kept.iter().all(Option::is_some), "{kept:?}");
        assert_eq!(dirs.identity(), kept, "nothing changed");

        std::fs::rename(&chunks, ns.join("old")).unwrap();
        assert_eq!(dirs.identity()[2], None, "removed");
        std::fs::create_dir(&chunks).unwrap();
        assert_ne!(dirs.identity(), kept, "replaced");
        std::fs::remove_dir(&chunks).unwrap();
        std::os::unix::fs::symlink("old", &chunks).unwrap();
        assert_eq!(dirs.identity()[2], None, "a link is not followed");
        std::fs::remove_file(&chunks).unwrap();
        std::fs::rename(ns.join("old"), &chunks).unwrap();
        assert_eq!(dirs.identity(), kept, "back in place");

        std::fs::rename(&grant, dir.path().join("moved")).unwrap();
        std::fs::create_dir_all(&chunks).unwrap();
        assert_ne!(dirs.identity()[0], kept[0], "the grant replaced");
    }
}
