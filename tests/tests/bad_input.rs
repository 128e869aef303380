//! Hostile and malformed input through the raw vtable: every case is a
//! negative return (or NULL) with a logged reason, never a crash.

use std::ffi::CString;
use std::ptr;

use kvwasm_tests::{Probe, open_fs, shim, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

#[test]
fn null_and_empty_arguments_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let vt = shim().vtable();
    let h = store.as_ptr();
    let name = CString::new("m").unwrap();
    let mut out: *mut u8 = ptr::null_mut();
    let mut out_len = 0usize;
    let data = [1u8; 4];
    // SAFETY: deliberately hostile calls; the shim must survive each.
    unsafe {
        let put_chunk = vt.put_chunk.unwrap();
        assert!(
            put_chunk(ptr::null_mut(), data.as_ptr(), 4, data.as_ptr(), 4) < 0,
            "NULL handle"
        );
        assert!(
            put_chunk(h, ptr::null(), 8, data.as_ptr(), 4) < 0,
            "NULL hash, len 8"
        );
        assert!(
            put_chunk(h, data.as_ptr(), 0, data.as_ptr(), 4) < 0,
            "hash_len 0"
        );
        assert!(
            put_chunk(h, data.as_ptr(), 4, ptr::null(), 4) < 0,
            "NULL data, len 4"
        );
        assert!(
            put_chunk(h, [9u8; 65].as_ptr(), 65, data.as_ptr(), 4) < 0,
            "hash_len 65"
        );
        // NULL data with length 0 is an empty chunk, which is legal.
        assert_eq!(put_chunk(h, data.as_ptr(), 4, ptr::null(), 0), 0);

        let get_chunk = vt.get_chunk.unwrap();
        assert!(
            get_chunk(h, data.as_ptr(), 4, ptr::null_mut(), &mut out_len) < 0,
            "NULL out"
        );
        assert!(
            get_chunk(h, data.as_ptr(), 4, &mut out, ptr::null_mut()) < 0,
            "NULL out_len"
        );
        assert!(get_chunk(ptr::null_mut(), data.as_ptr(), 4, &mut out, &mut out_len) < 0);
        assert!(get_chunk(h, ptr::null(), 4, &mut out, &mut out_len) < 0);
        assert!(out.is_null());

        let put_manifest = vt.put_manifest.unwrap();
        assert!(
            put_manifest(h, ptr::null(), data.as_ptr(), 4) < 0,
            "NULL name"
        );
        assert!(
            put_manifest(h, name.as_ptr(), ptr::null(), 4) < 0,
            "NULL data, len 4"
        );
        assert!(put_manifest(ptr::null_mut(), name.as_ptr(), data.as_ptr(), 4) < 0);
        let bad_utf8 = [0xffu8, 0xfe, 0];
        assert!(
            put_manifest(h, bad_utf8.as_ptr().cast(), data.as_ptr(), 4) < 0,
            "bad UTF-8"
        );

        let get_manifest = vt.get_manifest.unwrap();
        assert!(get_manifest(h, ptr::null(), &mut out, &mut out_len) < 0);
        let delete_manifest = vt.delete_manifest.unwrap();
        assert!(delete_manifest(h, ptr::null()) < 0);
        assert!(delete_manifest(ptr::null_mut(), name.as_ptr()) < 0);

        let prefetch = vt.prefetch_chunks.unwrap();
        assert!(prefetch(h, ptr::null(), 8, 3) < 0, "NULL hashes");
        assert!(prefetch(h, data.as_ptr(), 0, 3) < 0, "hash_len 0");
        assert!(prefetch(h, data.as_ptr(), usize::MAX, 2) < 0, "overflow");
        assert!(prefetch(ptr::null_mut(), data.as_ptr(), 4, 1) < 0);
        assert_eq!(prefetch(h, ptr::null(), 8, 0), 0, "nothing to prefetch");

        assert!((vt.open.unwrap())(ptr::null()).is_null(), "NULL URI");
        (vt.close.unwrap())(ptr::null_mut());
    }
    // The handle still works after all that.
    store.put_manifest("after", b"ok").unwrap();
    assert_eq!(&*store.get_manifest("after").unwrap(), b"ok");
}

#[test]
fn dangerous_manifest_names_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(&dir.path().join("store"));
    std::fs::write(dir.path().join("secret"), b"outside").unwrap();
    let long = "n".repeat(300);
    for name in [
        "",
        "../secret",
        "..",
        "a/b",
        "/etc/passwd",
        "a\\b",
        "x\ny",
        &long,
    ] {
        assert!(
            store.put_manifest(name, b"x").unwrap_err() < 0,
            "put {name:?}"
        );
        assert!(store.get_manifest(name).unwrap_err() < 0, "get {name:?}");
        assert!(
            store.delete_manifest(name).unwrap_err() < 0,
            "delete {name:?}"
        );
    }
    assert_eq!(
        std::fs::read(dir.path().join("secret")).unwrap(),
        b"outside"
    );
    // 255 bytes is still fine.
    store.put_manifest(&"n".repeat(255), b"x").unwrap();
}

#[test]
fn unknown_uri_forms_return_null_with_a_reason() {
    for uri in [
        "",
        "file:///tmp/x",
        "wasm://",
        "wasm:///",
        "wasm://bad name/x",
        "memkv://h:1/ns",
    ] {
        let (out, err) = Probe::new(PROBE, uri).run(&[]);
        assert_eq!(out, ["open NULL"], "{uri:?}");
        assert!(err.contains("open"), "{uri:?}: no reason logged: {err}");
    }
}

#[test]
fn missing_config_file_returns_null_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let (out, err) = Probe::new(PROBE, "wasm://fs/ns").config(&missing).run(&[]);
    assert_eq!(out, ["open NULL"]);
    assert!(
        err.contains("cannot read config file") && err.contains("nope.toml"),
        "{err}"
    );
}

#[test]
fn config_naming_a_missing_component_returns_null_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[backends.vendor]\ncomponent = \"vendor-missing.wasm\"\ndir = \"data\"\n",
    );
    let (out, err) = Probe::new(PROBE, "wasm://vendor/ns")
        .config(&config)
        .run(&[]);
    assert_eq!(out, ["open NULL"]);
    assert!(err.contains("vendor-missing.wasm"), "{err}");
}

#[test]
fn config_with_an_unknown_backend_or_bad_field_returns_null() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[backends.a]\ncomponent = \"builtin:fs\"\nbogus = 1\n",
    );
    let (out, err) = Probe::new(PROBE, "wasm://a/ns").config(&config).run(&[]);
    assert_eq!(out, ["open NULL"]);
    assert!(err.contains("bogus"), "{err}");

    let config = write_config(
        dir.path(),
        "[backends.a]\ncomponent = \"builtin:fs\"\ndir = \"d\"\n",
    );
    let (out, err) = Probe::new(PROBE, "wasm://zzz/ns").config(&config).run(&[]);
    assert_eq!(out, ["open NULL"]);
    assert!(err.contains("no backend \"zzz\""), "{err}");
}

#[test]
fn named_backends_from_a_config_file_work() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[backends.disk]\ncomponent = \"builtin:fs\"\ndir = \"kv\"\n\n\
         [backends.mem]\ncomponent = \"builtin:memory\"\n",
    );
    let (out, err) = Probe::new(PROBE, "wasm://disk/team/model-a/")
        .config(&config)
        .run(&[
            "put-chunk:0a0b=hello",
            "put-chunk:0a0b=hello",
            "put-manifest:m=0a0b",
            "get-manifest:m",
            "get-chunk:0a0b",
        ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk 0a0b=hello -> 0",
            "put-chunk 0a0b=hello -> 1",
            "put-manifest m=0a0b -> 0",
            "get-manifest m -> 0 0a0b",
            "get-chunk 0a0b -> 0 hello"
        ],
        "{err}"
    );
    // The namespace becomes nested directories under the granted dir.
    assert_eq!(
        std::fs::read(dir.path().join("kv/team/model-a/m")).unwrap(),
        b"0a0b"
    );
    assert!(dir.path().join("kv/team/model-a/chunks/0/0a0b").is_file());

    let (out, err) = Probe::new(PROBE, "wasm://mem/x").config(&config).run(&[
        "get-manifest:m",
        "put-manifest:m=v",
        "get-manifest:m",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "get-manifest m -> -2",
            "put-manifest m=v -> 0",
            "get-manifest m -> 0 v"
        ],
        "{err}"
    );

    let (out, _) = Probe::new(PROBE, "wasm://disk/../escape")
        .config(&config)
        .run(&[]);
    assert_eq!(
        out,
        ["open NULL"],
        "a namespace cannot climb out of the grant"
    );
}

#[test]
fn names_with_nul_are_rejected_by_the_backend() {
    // A C string cannot carry an interior NUL, but the host API can: the
    // guest's own validation must refuse it.
    let dir = tempfile::tempdir().unwrap();
    let store = kvwasm_host::open(&kvwasm_tests::fs_uri(dir.path())).unwrap();
    for name in ["a\0b", "\0", "slot\0/../../etc/passwd"] {
        let err = store.put_manifest(name, b"x").unwrap_err();
        assert_eq!(err.code(), -3, "{name:?}: {err}");
        assert_eq!(store.get_manifest(name).unwrap_err().code(), -3);
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only chunks/ exists"
    );
}

#[test]
fn garbage_closed_and_double_closed_handles_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let vt = shim().vtable();
    let name = CString::new("m").unwrap();
    let (mut out, mut out_len) = (ptr::null_mut::<u8>(), 0usize);
    let store = open_fs(dir.path());
    let closed = store.as_ptr();
    std::mem::forget(store);
    // SAFETY: deliberately hostile handles; the shim must refuse each
    // without dereferencing it.
    unsafe {
        (vt.close.unwrap())(closed);
        let get_manifest = vt.get_manifest.unwrap();
        assert_eq!(
            get_manifest(closed, name.as_ptr(), &mut out, &mut out_len),
            -10
        );
        for garbage in [1usize, 8, 0xdead_beef, usize::MAX & !15, 16 << 40] {
            assert_eq!(
                get_manifest(garbage as *mut _, name.as_ptr(), &mut out, &mut out_len),
                -10,
                "{garbage:#x}"
            );
        }
        // A second close of the same handle is refused, not a double free.
        (vt.close.unwrap())(closed);
    }
}

/// An input length no buffer can have (past `PTRDIFF_MAX`, or running past
/// the end of the address space) is refused before a slice is made of it.
#[test]
fn input_lengths_past_the_address_space_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let vt = shim().vtable();
    let h = store.as_ptr();
    let key = [1u8; 8];
    let data = [2u8; 16];
    let name = CString::new("m").unwrap();
    let high = ptr::without_provenance::<u8>(usize::MAX - 8);
    // SAFETY: lengths past the contract; the shim must refuse them before
    // reading anything.
    unsafe {
        let put_chunk = vt.put_chunk.unwrap();
        let put_manifest = vt.put_manifest.unwrap();
        for (ptr, len, what) in [
            (data.as_ptr(), usize::MAX, "usize::MAX"),
            (data.as_ptr(), isize::MAX as usize + 1, "past isize::MAX"),
            (high, 16, "wraps"),
        ] {
            assert_eq!(put_chunk(h, key.as_ptr(), 8, ptr, len), -10, "{what}");
            assert_eq!(put_manifest(h, name.as_ptr(), ptr, len), -10, "{what}");
        }
        let higher = ptr::without_provenance::<u8>(usize::MAX - 3);
        assert_eq!(
            put_chunk(h, higher, 8, data.as_ptr(), 16),
            -10,
            "a hash that wraps"
        );
    }
    store.put_chunk(&key, &data).unwrap();
    assert_eq!(&*store.get_chunk(&key).unwrap(), &data[..]);
}

#[test]
fn oversized_hashes_and_prefetch_lists_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_fs(dir.path());
    let vt = shim().vtable();
    let h = store.as_ptr();
    let data = [1u8; 128];
    let (mut out, mut out_len) = (ptr::null_mut::<u8>(), 0usize);
    // SAFETY: lengths past the contract; the shim must refuse them before
    // reading anything.
    unsafe {
        let prefetch = vt.prefetch_chunks.unwrap();
        assert_eq!(prefetch(h, data.as_ptr(), 65, 1), -10, "hash_len 65");
        assert_eq!(prefetch(h, data.as_ptr(), 8, 1 << 21), -10, "2M hashes");
        assert_eq!(
            prefetch(h, data.as_ptr(), 64, usize::MAX / 32),
            -10,
            "n × len overflows"
        );
        assert_eq!(
            (vt.get_chunk.unwrap())(h, data.as_ptr(), 65, &mut out, &mut out_len),
            -10
        );
        assert_eq!(
            prefetch(h, data.as_ptr(), 64, 2),
            0,
            "64 bytes is the largest hash"
        );
    }
}

#[test]
fn a_directory_written_with_two_slashes_gets_a_hint() {
    // `wasm://dev/shm/x` reads as backend `dev`; /dev exists, so the
    // consumer most likely meant the directory.
    let (out, err) = Probe::new(PROBE, "wasm://dev/shm/kvwasm-hint").run(&[]);
    assert_eq!(out, ["open NULL"]);
    assert!(
        err.contains("did you mean wasm:///dev/shm/kvwasm-hint"),
        "{err}"
    );
}
