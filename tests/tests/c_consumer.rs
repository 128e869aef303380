//! examples/c-consumer, built with the system C compiler, loads the shim the
//! way llama.cpp does and round-trips objects through the fs guest.

use std::path::{Path, PathBuf};
use std::process::Command;

use kvwasm_tests::{fs_uri, shim_dir};

fn build_consumer(out: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/c-consumer");
    let exe = out.join("c-consumer");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(src.join("main.c"))
        .arg(format!("-I{}", src.join("../include").display()))
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(
        status.success(),
        "compiling the C consumer failed (is libxxhash-dev installed?)"
    );
    exe
}

fn run(exe: &Path, args: &[&str], uri: &str) -> String {
    let out = Command::new(exe)
        .args(args)
        .arg(uri)
        .env("KV_STORE_LIBRARY_PATH", shim_dir())
        .output()
        .expect("run the C consumer");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "c-consumer {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn c_consumer_round_trips_every_chunk_size_and_hash_length() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_consumer(tmp.path());
    let store = tmp.path().join("store");
    let uri = fs_uri(&store);
    let cases: &[(usize, usize)] = &[
        (0, 0),
        (1, 1),
        (4096, 3 * 4096),
        (1 << 20, 3 << 20),
        (64 << 20, 64 << 20),
    ];
    for &(chunk, object) in cases {
        for hash_len in [1, 8, 32, 64] {
            let name = format!("obj-{chunk}-{hash_len}");
            let stdout = run(
                &exe,
                &[
                    "-c",
                    &chunk.to_string(),
                    "-n",
                    &object.to_string(),
                    "-k",
                    &hash_len.to_string(),
                    "-m",
                    &name,
                ],
                &uri,
            );
            assert!(
                stdout.contains("vtable version 2 (prefetch_chunks)"),
                "{stdout}"
            );
            assert!(stdout.contains("every byte verified"), "{stdout}");
            assert!(
                stdout.contains("all") && stdout.ends_with("OK\n"),
                "{stdout}"
            );
            assert!(store.join(&name).is_file(), "manifest {name} on disk");
        }
    }
}

#[test]
fn c_consumer_default_run_with_a_trailing_slash_uri() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = build_consumer(tmp.path());
    let uri = format!("{}/", fs_uri(&tmp.path().join("store")));
    let stdout = run(&exe, &[], &uri);
    assert!(
        stdout.contains("in 6 chunks (6 stored, 0 dedup hits), 8-byte keys"),
        "{stdout}"
    );
    assert!(
        stdout.contains("saved again: all 6 chunks were dedup hits"),
        "{stdout}"
    );
}
