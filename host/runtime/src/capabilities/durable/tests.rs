use super::*;
use crate::capabilities::descriptors::Share;
use std::os::unix::fs::MetadataExt;

fn headroom() -> Headroom {
    Headroom::new("test".into(), Share::Store, None)
}

/// Wait until the coarse clock has passed `path`'s change time, so the
/// next sync of it is remembered (a condition, not a guess at time).
fn past_change_time(path: &std::path::Path) {
    let meta = std::fs::metadata(path).unwrap();
    while coarse_clock() <= (meta.ctime(), meta.ctime_nsec()) {
        std::thread::yield_now();
    }
}

fn sync(dir: &std::path::Path, paths: &[&str]) -> (u32, u32) {
    let dir = std::fs::File::open(dir).unwrap();
    let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
    let synced = sync_paths(&dir, &paths, &headroom()).unwrap();
    (synced.files, synced.directories)
}

#[test]
fn a_synced_file_is_not_synced_again_until_it_changes_or_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    let file = dir.path().join("a/chunk");
    std::fs::write(&file, b"bytes").unwrap();
    past_change_time(&file);
    past_change_time(&dir.path().join("a"));
    assert_eq!(sync(dir.path(), &["a/chunk", "a", "."]), (1, 2));
    assert_eq!(sync(dir.path(), &["a/chunk", "a"]), (0, 0), "remembered");

    // Replaced: same name, same size, a new inode (and a new entry).
    let tmp = dir.path().join("a/tmp");
    std::fs::write(&tmp, b"BYTES").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    assert_eq!(sync(dir.path(), &["a/chunk", "a"]), (1, 1));

    // Written in place, same size: a new change time. (Whether the
    // sync above was remembered depends on the tick it fell in; past
    // the change time, this one is.)
    past_change_time(&file);
    sync(dir.path(), &["a/chunk"]);
    assert_eq!(sync(dir.path(), &["a/chunk"]), (0, 0));
    std::fs::write(&file, b"bytez").unwrap();
    assert_eq!(sync(dir.path(), &["a/chunk"]), (1, 0));
}

#[test]
fn paths_stay_in_the_directory_and_only_files_and_directories_sync() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(dir.path().join("outside"), b"x").unwrap();
    std::os::unix::fs::symlink("../outside", inner.join("link")).unwrap();
    let open = std::fs::File::open(&inner).unwrap();
    let one = |p: &str| sync_paths(&open, &[p.to_owned()], &headroom()).map(drop);
    assert!(one("../outside").is_err());
    assert!(one("/etc/passwd").is_err());
    assert!(one("/passwd").is_err());
    assert_eq!(one("link"), Err(ErrorCode::Unsupported));
    assert_eq!(one("missing"), Err(ErrorCode::NoEntry));
    assert_eq!(one(".."), Err(ErrorCode::Invalid));
    let too_many = vec![".".to_owned(); MAX_PATHS + 1];
    assert_eq!(
        sync_paths(&open, &too_many, &headroom()).map(drop),
        Err(ErrorCode::Invalid)
    );
}
/// The type of the mount `path` lives on, as /proc/self/mountinfo says.
fn mounted_type(path: &std::path::Path) -> String {
    let dev = std::fs::metadata(path).unwrap().dev();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mount_type(&mounts, libc::major(dev), libc::minor(dev))
        .unwrap()
        .to_owned()
}

#[test]
fn only_tmpfs_and_ramfs_count_as_in_memory() {
    let scratch = tempfile::tempdir().unwrap();
    let paths = [
        std::path::Path::new("/dev/shm"),
        scratch.path(),
        std::path::Path::new("/"),
    ];
    for path in paths.into_iter().filter(|p| p.exists()) {
        let dir = std::fs::File::open(path).unwrap();
        let kind = mounted_type(path);
        assert_eq!(
            in_memory(dir.as_raw_fd()),
            kind == "tmpfs" || kind == "ramfs",
            "{} on {kind}",
            path.display()
        );
    }
}

#[test]
fn writeback_starts_only_for_unsynced_regular_files_beneath_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner");
    std::fs::create_dir_all(inner.join("sub")).unwrap();
    std::fs::write(inner.join("a"), b"a").unwrap();
    std::fs::write(inner.join("sub/b"), b"b").unwrap();
    std::fs::write(dir.path().join("outside"), b"x").unwrap();
    std::os::unix::fs::symlink("../outside", inner.join("link")).unwrap();
    let fifo = CString::new(inner.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let open = std::fs::File::open(&inner).unwrap();
    let start = |paths: &[&str]| {
        let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
        start_writeback(&open, &paths, &headroom())
    };
    // Where files live in memory there is nothing to write back.
    let kind = mounted_type(&inner);
    let on_a_device = |n: u32| {
        if kind == "tmpfs" || kind == "ramfs" {
            0
        } else {
            n
        }
    };

    // The two files; not the link (nor what it names), the fifo (which
    // would not block either), a directory, what is missing or lies
    // beneath a file or a missing directory.
    let all = [
        "a", "sub/b", "link", "fifo", "missing", "sub", ".", "nosuch/a", "a/b",
    ];
    assert_eq!(start(&all), Ok(on_a_device(2)));
    // Never outside the directory, on any filesystem.
    assert!(start(&["../outside"]).is_err());
    assert!(start(&["/etc/passwd"]).is_err());
    assert_eq!(start(&[".."]), Err(ErrorCode::Invalid));
    assert_eq!(start(&["."; MAX_PATHS]), Ok(0));
    assert_eq!(start(&["."; MAX_PATHS + 1]), Err(ErrorCode::Invalid));

    // A version the host synced has nothing left to write.
    past_change_time(&inner.join("a"));
    assert_eq!(sync(&inner, &["a"]), (1, 0));
    assert_eq!(start(&["a", "sub/b"]), Ok(on_a_device(1)));
}

#[test]
fn whole_second_times_are_never_remembered() {
    let seen = Seen {
        id: (u64::MAX, u64::MAX),
        version: Version {
            size: 1,
            modified: (10, 0),
            changed: (10, 0),
        },
        is_dir: false,
    };
    seen.record(Stamps::CoarseClock, (10, 500_000_000));
    assert!(
        !seen.is_synced(),
        "a change later in that second reads the same time"
    );
    let fine = Seen {
        version: Version {
            changed: (10, 1),
            ..seen.version
        },
        ..seen
    };
    fine.record(Stamps::CoarseClock, (10, 500_000_000));
    assert!(fine.is_synced());

    let multigrain = Seen {
        id: (u64::MAX, u64::MAX - 1),
        ..seen
    };
    multigrain.record(Stamps::Multigrain, (10, 500_000_000));
    assert!(!multigrain.is_synced(), "whole seconds, multigrain or not");
}

#[test]
fn the_coarse_clock_guard_holds_except_where_times_are_multigrain() {
    let seen = |ino| Seen {
        id: (u64::MAX - 1, ino),
        version: Version {
            size: 1,
            modified: (10, 7),
            changed: (10, 7),
        },
        is_dir: false,
    };
    let in_its_tick = (10, 7);
    seen(1).record(Stamps::CoarseClock, in_its_tick);
    assert!(!seen(1).is_synced(), "a later change may read (10, 7)");
    seen(2).record(Stamps::Elsewhere, (11, 0));
    assert!(!seen(2).is_synced(), "times from elsewhere");
    seen(3).record(Stamps::Multigrain, in_its_tick);
    assert!(seen(3).is_synced(), "a later change reads a later time");
}

#[test]
fn only_a_mount_of_type_ext4_counts_as_ext4() {
    let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 8:1 / /old rw,relatime shared:2 - ext3 /dev/sda1 rw,errors=continue
24 22 8:2 / /older rw - ext2 /dev/sda2 rw
25 22 0:21 / /dev/shm rw,nosuid shared:3 - tmpfs tmpfs rw
26 22 254:0 /srv /srv rw shared:1 - ext4 /dev/vda rw";
    assert_eq!(mount_type(mountinfo, 254, 0), Some("ext4"));
    assert_eq!(mount_type(mountinfo, 8, 1), Some("ext3"));
    assert_eq!(mount_type(mountinfo, 8, 2), Some("ext2"));
    assert_eq!(mount_type(mountinfo, 8, 3), None);
    assert_eq!(mount_type(mountinfo, 0, 21), Some("tmpfs"));
}

#[test]
fn linux_versions_are_read_from_the_release() {
    assert_eq!(linux_version("6.18.44-fc-v657"), Some((6, 18)));
    assert_eq!(linux_version("6.13-rc1"), Some((6, 13)));
    assert_eq!(linux_version("6.12.9+deb13-amd64"), Some((6, 12)));
    assert_eq!(linux_version("5.15.0-91-generic"), Some((5, 15)));
    assert_eq!(linux_version("6"), None);
    assert_eq!(linux_version("x.y"), None);
    assert!((6, 12) < (6, 13) && (7, 0) > (6, 13));
}

/// What the host relies on where it says times are multigrain: a
/// change made after a `stat` reads a change time later than that
/// `stat` did, even within one tick of the coarse clock (thousands of
/// changes here, most within one tick). A kernel or filesystem that
/// stamped with the coarse clock alone would fail this.
#[test]
fn where_times_are_multigrain_a_change_after_a_stat_reads_a_later_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chunk");
    let mut file = std::fs::File::create(&path).unwrap();
    let kind = stamps(file.as_raw_fd());
    if kind != Stamps::Multigrain {
        // Nothing to check: the host keeps the coarse-clock guard here
        // (`the_coarse_clock_guard_holds_except_where_times_are_multigrain`).
        eprintln!(
            "not checked: {} is {kind:?}, not multigrain",
            dir.path().display()
        );
        return;
    }
    let changed = |file: &std::fs::File| {
        let st = stat_fd(file.as_raw_fd()).unwrap();
        (st.st_ctime, st.st_ctime_nsec, st.st_mtime, st.st_mtime_nsec)
    };
    for round in 0..2_000u32 {
        use std::io::{Seek, Write};
        let before = changed(&file);
        file.seek(std::io::SeekFrom::Start(0)).unwrap();
        file.write_all(&round.to_le_bytes()).unwrap();
        let after = changed(&file);
        assert!(
            (after.0, after.1) > (before.0, before.1) && (after.2, after.3) > (before.2, before.3),
            "round {round}: {before:?} then {after:?}"
        );
    }
}

/// Where times are multigrain, a file synced within the tick of its
/// change (right after a cold save) is remembered, and a change right
/// after the sync is still seen.
#[test]
fn where_times_are_multigrain_a_sync_in_the_tick_of_the_change_is_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chunk");
    std::fs::write(&file, b"0000").unwrap();
    let multigrain = stamps(std::fs::File::open(&file).unwrap().as_raw_fd()) == Stamps::Multigrain;
    for round in 0..200u32 {
        std::fs::write(&file, format!("{:04}", round % 10_000)).unwrap();
        assert_eq!(
            sync(dir.path(), &["chunk"]),
            (1, 0),
            "round {round}: changed"
        );
        if multigrain {
            assert_eq!(
                sync(dir.path(), &["chunk"]),
                (0, 0),
                "round {round}: remembered"
            );
        }
    }
}

#[test]
fn find_file_says_durable_only_for_the_version_the_host_synced() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chunk");
    std::fs::write(&file, b"bytes").unwrap();
    past_change_time(&file);
    let open = std::fs::File::open(dir.path()).unwrap();
    let found = |name: &str| {
        find_file(&open, name, &headroom(), &KeptDirs::default())
            .map(|f| f.map(|f| (f.size, f.durable)))
    };
    assert_eq!(found("chunk"), Ok(Some((5, false))), "never synced");
    assert_eq!(sync(dir.path(), &["chunk"]), (1, 0));
    assert_eq!(found("chunk"), Ok(Some((5, true))));

    // Replaced by another writer: the same name, not the synced file.
    let tmp = dir.path().join("tmp");
    std::fs::write(&tmp, b"BYTES").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    assert_eq!(found("chunk"), Ok(Some((5, false))));
    assert_eq!(found("missing"), Ok(None));
}

/// Descriptors of this process open on `dir` or beneath it.
fn held_beneath(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

#[test]
fn a_kept_directory_serves_only_while_its_name_still_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("a")).unwrap();
    std::fs::write(root.join("a/x"), b"old").unwrap();
    let open = std::fs::File::open(&root).unwrap();
    let kept = KeptDirs::default();
    let found = |name: &str| find_file(&open, name, &headroom(), &kept).map(|f| f.map(|f| f.size));
    assert_eq!(found("a/x"), Ok(Some(3)));
    assert_eq!(kept.dirs.lock().unwrap().len(), 1, "`a` is kept");

    // `a` moved away and a new `a` made: the kept descriptor follows the
    // old directory, which `a` no longer names.
    std::fs::rename(root.join("a"), root.join("moved")).unwrap();
    std::fs::create_dir(root.join("a")).unwrap();
    assert_eq!(found("a/x"), Ok(None));
    std::fs::write(root.join("a/x"), b"newer").unwrap();
    assert_eq!(found("a/x"), Ok(Some(5)));
    assert_eq!(found("moved/x"), Ok(Some(3)));

    // `a` replaced by a link to the old directory: not followed.
    std::fs::remove_dir_all(root.join("a")).unwrap();
    std::os::unix::fs::symlink("moved", root.join("a")).unwrap();
    assert!(found("a/x").is_err(), "a link is not a kept directory");
    std::fs::remove_file(root.join("a")).unwrap();
    assert_eq!(found("a/x"), Ok(None));
}

#[test]
fn each_store_keeps_its_own_directories_while_an_instance_uses_them() {
    let by_store = KeptDirsByStore::default();
    let (here, there) = (
        std::path::Path::new("/srv/a"),
        std::path::Path::new("/srv/b"),
    );
    let first = by_store.for_store([here], "tenant-a");
    assert!(Arc::ptr_eq(&first, &by_store.for_store([here], "tenant-a")));
    assert!(!Arc::ptr_eq(
        &first,
        &by_store.for_store([here], "tenant-b")
    ));
    assert!(!Arc::ptr_eq(
        &first,
        &by_store.for_store([there], "tenant-a")
    ));
    let old = Arc::downgrade(&first);
    drop(first);
    assert!(old.upgrade().is_none(), "gone with its last instance");
    assert_eq!(
        Arc::strong_count(&by_store.for_store([here], "tenant-a")),
        1
    );
}

#[test]
fn kept_directories_are_bounded_and_close_with_their_last_user() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    for i in 0..2 * KEPT_DIRS {
        std::fs::create_dir(root.join(format!("{i}"))).unwrap();
    }
    let open = std::fs::File::open(&root).unwrap();
    let kept = Arc::new(KeptDirs::default());
    let user = kept.clone();
    for i in 0..2 * KEPT_DIRS {
        let path = format!("{i}/chunk");
        assert!(matches!(
            find_file(&open, &path, &headroom(), &user),
            Ok(None)
        ));
    }
    assert_eq!(kept.dirs.lock().unwrap().len(), KEPT_DIRS);
    assert_eq!(
        held_beneath(&root),
        1 + KEPT_DIRS,
        "`open` and the kept ones"
    );
    drop(user);
    drop(kept);
    assert_eq!(held_beneath(&root), 1, "only `open`");
}

#[test]
fn find_file_stays_in_the_directory_and_follows_no_last_link() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(dir.path().join("outside"), b"x").unwrap();
    std::fs::create_dir(inner.join("sub")).unwrap();
    std::fs::write(inner.join("sub/file"), b"xy").unwrap();
    std::os::unix::fs::symlink("../outside", inner.join("link")).unwrap();
    std::os::unix::fs::symlink("..", inner.join("up")).unwrap();
    let open = std::fs::File::open(&inner).unwrap();
    let kept = KeptDirs::default();
    let found = |name: &str| find_file(&open, name, &headroom(), &kept).map(|f| f.map(|f| f.size));
    assert_eq!(found("sub/file"), Ok(Some(2)));
    assert_eq!(found("sub/missing"), Ok(None));
    assert_eq!(found("nowhere/file"), Ok(None));
    for name in ["..", ".", "", "sub/.."] {
        assert_eq!(found(name), Err(ErrorCode::Invalid), "{name:?}");
    }
    for name in ["../outside", "up/outside", "/etc/passwd"] {
        assert!(found(name).is_err(), "{name:?} is outside the directory");
    }
    assert_eq!(
        found("link"),
        Err(ErrorCode::Unsupported),
        "a link is not followed"
    );
    assert_eq!(
        found("sub"),
        Err(ErrorCode::Unsupported),
        "a directory is no file"
    );
}
