//! A guest is confined to what it was granted, and a guest that traps or
//! loops costs one call, not the process.

use kvwasm_tests::{Probe, hostile_config, open_fs};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

#[test]
fn a_trap_fails_one_call_and_the_next_call_works_with_files_intact() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "");
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t").config(&config).run(&[
        "put-manifest:kept=state outside the guest",
        "get-manifest:panic",
        "get-manifest:ping",
        "get-manifest:kept",
        "get-manifest:recurse",
        "get-manifest:ping",
        "get-manifest:alloc:512",
        "get-manifest:ping",
        "get-manifest:alloc:8",
        "get-manifest:loop",
        "get-manifest:kept",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-manifest kept=state outside the guest -> 0",
            "get-manifest panic -> -7",
            "get-manifest ping -> 0 pong",
            "get-manifest kept -> 0 state outside the guest",
            "get-manifest recurse -> -7",
            "get-manifest ping -> 0 pong",
            "get-manifest alloc:512 -> -7",
            "get-manifest ping -> 0 pong",
            "get-manifest alloc:8 -> 0 allocated",
            "get-manifest loop -> -8",
            "get-manifest kept -> 0 state outside the guest",
        ],
        "{err}"
    );
    assert!(err.contains("guest trapped"), "{err}");
    assert!(
        err.contains("guest stderr:")
            && err.contains("panicked at")
            && err.contains("hostile guest panics on purpose"),
        "the panic message is quoted in the log: {err}"
    );
    assert!(
        err.contains("out of memory"),
        "memory cap named in the log: {err}"
    );
    assert!(err.contains("deadline of 300 ms"), "{err}");
}

#[test]
fn a_guest_cannot_read_outside_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), b"host secret").unwrap();
    let config = hostile_config(dir.path(), "");
    let data = dir.path().join("data");
    std::os::unix::fs::symlink(dir.path().join("secret"), data.join("link-out")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", data.join("link-passwd")).unwrap();
    let secret = dir.path().join("secret");
    let abs_secret = format!("get-manifest:abs:{}", secret.display());
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t").config(&config).run(&[
        "get-manifest:abs:/etc/passwd",
        "get-manifest:../secret",
        "get-manifest:../../../../etc/passwd",
        &abs_secret,
        "get-manifest:link-out",
        "get-manifest:link-passwd",
        "get-manifest:abs:/proc/self/environ",
        "get-manifest:env:HOME",
        // payload-io's read-file resolves beneath the directory too.
        "get-manifest:readfile:../secret",
        "get-manifest:readfile:/etc/passwd",
        "get-manifest:readfile:link-out",
        "get-manifest:readfile:link-passwd",
        "get-manifest:readfile:.",
        "get-manifest:writefile:../escaped",
        "get-manifest:writefile:/tmp/kvwasm-escaped",
        "get-manifest:ping",
    ]);
    assert_eq!(out.len(), 17, "{out:?} {err}");
    for line in &out[1..16] {
        assert!(line.contains(" -> -"), "escape succeeded? {line}");
        assert!(
            !line.contains("host secret") && !line.contains("root:"),
            "{line}"
        );
    }
    assert_eq!(out[16], "get-manifest ping -> 0 pong");
    assert!(!dir.path().join("escaped").exists());
    assert!(!std::path::Path::new("/tmp/kvwasm-escaped").exists());
}

/// `payload-io.publish-file` resolves one directory beneath the grant and
/// renames within it: no path, link or name steers the file elsewhere, a
/// failed publish leaves no temp file, and a file it did not create is
/// never removed.
#[test]
fn publish_file_stays_in_one_directory_beneath_the_grant() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "");
    let data = dir.path().join("data");
    std::fs::create_dir(dir.path().join("outside")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside"), data.join("link-dir")).unwrap();
    std::fs::create_dir(data.join("sub")).unwrap();
    std::fs::create_dir(data.join("a-dir")).unwrap();
    std::fs::write(data.join("kept"), b"not the guest's").unwrap();
    std::fs::write(data.join("replaced"), b"old").unwrap();
    std::fs::write(dir.path().join("outside-file"), b"outside").unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside-file"), data.join("link-file")).unwrap();
    let refused = [
        "../t1,../escaped",
        "/tmp/t2,/tmp/kvwasm-escaped",
        "t3,../escaped",
        "t3,sub/escaped",
        "sub/t3,escaped",
        "link-dir/t4,link-dir/escaped",
        "sub/../../t5,sub/../../escaped",
        "t6,.",
        "..,t6",
        "t7,a-dir",
        "kept,published-over-kept",
        "t8,",
    ];
    let mut ops: Vec<String> = refused
        .iter()
        .map(|paths| format!("get-manifest:publishfile:{paths}"))
        .collect();
    ops.push("get-manifest:publishfile:t9,good".into());
    ops.push("get-manifest:publishfile:sub/t10,sub/good".into());
    ops.push("get-manifest:publishfile:t11,replaced".into());
    ops.push("get-manifest:publishfile:t12,link-file".into());
    let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t")
        .config(&config)
        .run(&ops);
    assert_eq!(out.len(), refused.len() + 5, "{out:?} {err}");
    for (line, paths) in out[1..=refused.len()].iter().zip(refused) {
        assert!(line.contains(" -> -"), "{paths}: published? {line}");
    }
    for line in &out[refused.len() + 1..] {
        assert!(line.ends_with("-> 0 published"), "{line} {err}");
    }
    // What was published is whole where it was asked for, and only there.
    assert_eq!(std::fs::read(data.join("good")).unwrap(), b"published");
    assert_eq!(std::fs::read(data.join("sub/good")).unwrap(), b"published");
    assert_eq!(std::fs::read(data.join("replaced")).unwrap(), b"published");
    assert_eq!(
        std::fs::read(data.join("kept")).unwrap(),
        b"not the guest's"
    );
    // A link at the target is replaced, not written through.
    assert!(data.join("link-file").symlink_metadata().unwrap().is_file());
    assert_eq!(
        std::fs::read(dir.path().join("outside-file")).unwrap(),
        b"outside"
    );
    assert!(!dir.path().join("escaped").exists());
    assert!(!std::path::Path::new("/tmp/kvwasm-escaped").exists());
    assert_eq!(
        std::fs::read_dir(dir.path().join("outside"))
            .unwrap()
            .count(),
        0
    );
    assert!(data.join("a-dir").is_dir());
    let mut left: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "a-dir",
            "good",
            "kept",
            "link-dir",
            "link-file",
            "replaced",
            "sub"
        ],
        "no temp file is left"
    );
    assert_eq!(std::fs::read_dir(data.join("sub")).unwrap().count(), 1);
}

#[test]
fn the_embedded_fs_guest_cannot_be_steered_outside_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), b"outside").unwrap();
    let store = open_fs(&dir.path().join("store"));
    for name in ["../secret", "/etc/passwd", "..", "chunks/../../secret"] {
        assert!(store.get_manifest(name).is_err(), "{name:?}");
        assert!(
            store.put_manifest(name, b"overwritten").is_err(),
            "{name:?}"
        );
    }
    assert_eq!(
        std::fs::read(dir.path().join("secret")).unwrap(),
        b"outside"
    );
}

#[test]
fn a_read_only_grant_refuses_writes_in_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "read_only = true\n");
    std::fs::write(dir.path().join("data/existing"), b"readable").unwrap();
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t").config(&config).run(&[
        "get-manifest:existing",
        "put-manifest:new=x",
        "put-manifest:existing=overwrite",
        "get-manifest:publishfile:tmp,new",
        "get-manifest:publishfile:tmp,existing",
    ]);
    assert_eq!(out[1], "get-manifest existing -> 0 readable", "{err}");
    assert!(out[2].ends_with("-> -5"), "{out:?}");
    assert!(out[3].ends_with("-> -5"), "{out:?}");
    // `not-permitted`, which the guest reports as denied (-4).
    assert!(out[4].ends_with("-> -4"), "{out:?}");
    assert!(out[5].ends_with("-> -4"), "{out:?}");
    assert!(!dir.path().join("data/new").exists());
    assert!(!dir.path().join("data/tmp").exists());
    assert_eq!(
        std::fs::read(dir.path().join("data/existing")).unwrap(),
        b"readable"
    );
}

#[test]
fn a_guest_cannot_open_connections_or_resolve_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "");
    // A real listener on loopback, so a refusal is the sandbox, not an
    // absent peer.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let connect = format!("get-manifest:connect:{}", listener.local_addr().unwrap());
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t").config(&config).run(&[
        &connect,
        "get-manifest:resolve:localhost",
        "get-manifest:ping",
    ]);
    assert_eq!(out.len(), 4, "{out:?} {err}");
    assert!(out[1].ends_with("-> -5"), "connect: {}", out[1]);
    assert!(out[2].ends_with("-> -5"), "resolve: {}", out[2]);
    assert_eq!(out[3], "get-manifest ping -> 0 pong");
    assert_eq!(
        listener.accept().map(drop).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the listener must not have seen a connection"
    );
}

#[test]
fn a_guest_cannot_hoard_host_memory_through_payloads() {
    // Payload buffers live in host memory, outside the guest's memory cap;
    // they have their own cap: max_payload_mib held at once per instance.
    let dir = tempfile::tempdir().unwrap();
    let config = hostile_config(dir.path(), "max_payload_mib = 8\n");
    std::fs::write(dir.path().join("data/big"), vec![1u8; 9 << 20]).unwrap();
    let (out, err) = Probe::new(PROBE, "wasm://hostile/t").config(&config).run(&[
        "get-manifest:hoard:4",
        "get-manifest:hoard:100",
        "get-manifest:readfile:big",
        "get-manifest:ping",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "get-manifest hoard:4 -> 0 hoarded",
            "get-manifest hoard:100 -> -7",
            // One payload over the cap: refused before a byte is read.
            "get-manifest readfile:big -> -5",
            "get-manifest ping -> 0 pong"
        ],
        "{err}"
    );
    assert!(err.contains("payload limit"), "{err}");
    assert!(err.contains("file-too-large"), "{err}");
}
