//! `kvwasm fabric send` → `tcp` fabric guest → `kvwasm fabric serve`, end to end: two
//! `kvwasm` processes on loopback hand over a 1 GiB slot, then hand it over again sending
//! nothing, and a fabric without its `net` grant cannot reach the receiver at all; with
//! `--key-env` on both sides a slot crosses too, and a missing, other or malformed key fails.
//!
//! Here rather than in tests/tests: only this package's tests get `CARGO_BIN_EXE_kvwasm`, a
//! `kvwasm` cargo rebuilds before running them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

use kvwasm_host::KvError;
use kvwasm_tests::{fs_uri, pattern, write_config, xxh3_key};

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");
const MIB: usize = 1 << 20;

/// A running `kvwasm fabric serve`, killed when dropped.
struct Receiver {
    child: Child,
    addr: String,
}

/// The environment variable the keyed tests pass the key in.
const KEY_ENV: &str = "KVWASM_TEST_FABRIC_KEY";

/// `--key-env` and the key in the environment when `key` is given (hex, as an operator would
/// set it).
fn keyed<'c>(command: &'c mut Command, key: Option<&str>) -> &'c mut Command {
    command.env_remove(KEY_ENV);
    match key {
        Some(key) => command.args(["--key-env", KEY_ENV]).env(KEY_ENV, key),
        None => command,
    }
}

impl Receiver {
    fn start(into: &Path, log: &Path) -> Receiver {
        Receiver::start_keyed(into, log, None)
    }

    fn start_keyed(into: &Path, log: &Path, key: Option<&str>) -> Receiver {
        Receiver::start_with(into, log, key, &[])
    }

    /// [`Receiver::start_keyed`] with more flags.
    fn start_with(into: &Path, log: &Path, key: Option<&str>, flags: &[&str]) -> Receiver {
        let mut command = Command::new(KVWASM);
        command
            .args(["fabric", "serve", "--listen", "127.0.0.1:0", "--into"])
            .arg(fs_uri(into))
            .args(flags);
        let mut child = keyed(&mut command, key)
            .env_remove("KVWASM_CONFIG")
            .env("KVWASM_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("start kvwasm fabric serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "serve printed {line:?}: {}",
                    std::fs::read_to_string(log).unwrap()
                )
            })
            .to_owned();
        Receiver { child, addr }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config with `[fabrics.tcp]`: the tcp guest, peer `addr`, granted `net` unless `grant` is
/// false.
fn config(dir: &Path, addr: &str, grant: bool) -> std::path::PathBuf {
    let net = if grant {
        format!("net = [{addr:?}]\n")
    } else {
        String::new()
    };
    write_config(
        dir,
        &format!(
            "[fabrics.tcp]\ncomponent = \"builtin:tcp\"\n{net}settings = {{ peer = {addr:?} }}\n"
        ),
    )
}

fn send(config: &Path, from: &Path) -> Output {
    send_keyed(config, from, None)
}

fn send_keyed(config: &Path, from: &Path, key: Option<&str>) -> Output {
    let mut command = Command::new(KVWASM);
    command.args([
        "fabric",
        "send",
        "--manifest",
        "slot",
        "--fabric",
        "tcp",
        "--from",
    ]);
    keyed(command.arg(fs_uri(from)), key)
        .env("KVWASM_CONFIG", config)
        .output()
        .expect("run kvwasm fabric send")
}

/// The JSON line of a successful send.
fn report(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "send failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

/// Chunk `i` of the test slot.
fn chunk(i: usize, len: usize) -> Vec<u8> {
    pattern(len, 0xF00D + i as u64)
}

/// Fills `dir` with a demo-format slot of `count` distinct chunks of `len` bytes; returns its
/// manifest.
fn fill(dir: &Path, count: usize, len: usize) -> Vec<u8> {
    let store = kvwasm_host::open(&fs_uri(dir)).unwrap();
    let mut manifest = b"ggsq".to_vec();
    for word in [4, 4096, count as u32] {
        manifest.extend_from_slice(&word.to_le_bytes());
    }
    for i in 0..count {
        let data = chunk(i, len);
        let key = xxh3_key(&data);
        assert!(!store.put_chunk(&key, &data).unwrap(), "chunk {i} repeats");
        manifest.extend_from_slice(&key);
    }
    store.put_manifest("slot", &manifest).unwrap();
    manifest
}

#[test]
fn a_one_gib_slot_crosses_two_processes_and_a_second_send_sends_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let (a, b) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let started = Instant::now();
    let manifest = fill(&a, 1024, MIB);
    let filled = started.elapsed();
    let receiver = Receiver::start(&b, &scratch.path().join("serve.log"));
    let config = config(scratch.path(), &receiver.addr, true);

    let first = report(&send(&config, &a));
    assert_eq!(first["manifest"], "slot");
    assert_eq!(
        (first["chunks"].as_u64(), first["sent"].as_u64()),
        (Some(1024), Some(1024))
    );
    assert_eq!(first["skipped"], 0);
    assert_eq!(first["chunk_bytes_sent"], 1u64 << 30);
    let frame_bytes = first["frame_bytes"].as_u64().unwrap();
    assert!(
        frame_bytes > 1 << 30 && frame_bytes < (1 << 30) + (1 << 20),
        "{first}"
    );

    let landed = kvwasm_host::open(&fs_uri(&b)).unwrap();
    assert_eq!(
        landed.get_manifest("slot").unwrap().as_slice(),
        &manifest[..]
    );
    for (i, key) in manifest[16..].chunks(8).enumerate() {
        let got = landed.get_chunk(key).unwrap();
        assert!(got.as_slice() == chunk(i, MIB), "chunk {i} differs");
    }

    let second = report(&send(&config, &a));
    assert_eq!(
        (second["sent"].as_u64(), second["skipped"].as_u64()),
        (Some(0), Some(1024))
    );
    assert_eq!(second["chunk_bytes_sent"], 0);
    eprintln!(
        "fill {:.1} s; first send {:.2} s ({:.0} MB/s); second send {:.2} s; total {:.1} s",
        filled.as_secs_f64(),
        first["seconds"].as_f64().unwrap(),
        first["mb_per_s"].as_f64().unwrap(),
        second["seconds"].as_f64().unwrap(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_fabric_without_its_net_grant_reaches_nothing_and_nothing_lands() {
    let scratch = tempfile::tempdir().unwrap();
    let (a, b) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let manifest = fill(&a, 4, 4096);
    let log = scratch.path().join("serve.log");
    let receiver = Receiver::start(&b, &log);

    let out = send(&config(scratch.path(), &receiver.addr, false), &a);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains("fabric: push query: unavailable"),
        "{stderr}"
    );
    assert!(stderr.contains(&receiver.addr), "{stderr}");
    assert!(stderr.contains("not granted in `net`"), "{stderr}");
    let error = stderr.lines().find(|l| l.starts_with("kvwasm: ")).unwrap();
    assert_eq!(
        error.matches("cannot connect").count(),
        1,
        "said once: {error}"
    );

    let target = kvwasm_host::open(&fs_uri(&b)).unwrap();
    assert!(matches!(
        target.get_manifest("slot"),
        Err(KvError::NotFound)
    ));
    for key in manifest[16..].chunks(8) {
        assert!(matches!(target.get_chunk(key), Err(KvError::NotFound)));
    }
    // The receiver never saw a connection.
    drop(receiver);
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap()
            .contains("fabric connection from")
    );

    // Granted, the same send works (so the grant was the only thing missing).
    let receiver = Receiver::start(&b, &log);
    let ok = report(&send(&config(scratch.path(), &receiver.addr, true), &a));
    assert_eq!(ok["sent"], 4);
}

/// The error line of a failed `kvwasm` run (it printed nothing on stdout).
fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty(), "no report line");
    stderr.into_owned()
}

#[test]
fn a_keyed_slot_crosses_two_processes_and_missing_or_other_keys_fail_clearly() {
    let scratch = tempfile::tempdir().unwrap();
    let [a, b, c, unkeyed_cfg, granted_cfg] =
        ["a", "b", "c", "unkeyed", "granted"].map(|d| scratch.path().join(d));
    for dir in [&a, &b, &c, &unkeyed_cfg, &granted_cfg] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let manifest = fill(&a, 32, 256 << 10);
    let key = "5a".repeat(32);
    let other = "a5".repeat(32);
    let log = scratch.path().join("serve.log");
    // Checking each chunk's xxh3-64 name too: the demo slot's chunks are named so.
    let receiver = Receiver::start_with(&b, &log, Some(&key), &["--verify-hash", "xxh3-64"]);
    let keyed_config = config(scratch.path(), &receiver.addr, true);

    // Another key, or none, on the sender: refused at the first exchange, nothing stored.
    let err = failure(&send_keyed(&keyed_config, &a, Some(&other)));
    assert!(
        err.contains("bad tag: the sender's key is not this server's (--key-env)"),
        "{err}"
    );
    assert!(!err.contains(&other) && !err.contains(&key), "{err}");
    let err = failure(&send(&keyed_config, &a));
    assert!(err.contains("this server has a key"), "{err}");
    let target = kvwasm_host::open(&fs_uri(&b)).unwrap();
    assert!(matches!(
        target.get_manifest("slot"),
        Err(KvError::NotFound)
    ));
    for key in manifest[16..].chunks(8) {
        assert!(matches!(target.get_chunk(key), Err(KvError::NotFound)));
    }
    // The receiver says so too, without the key.
    let served = std::fs::read_to_string(&log).unwrap();
    assert!(
        served.contains("authentication failed: bad tag"),
        "{served}"
    );
    assert!(
        served.contains("authentication failed: this server has a key"),
        "{served}"
    );
    assert!(!served.contains(&key) && !served.contains(&other));

    // The same key on both sides: the slot lands byte-identical, then nothing is sent again.
    let first = report(&send_keyed(&keyed_config, &a, Some(&key)));
    assert_eq!(
        (first["sent"].as_u64(), first["skipped"].as_u64()),
        (Some(32), Some(0))
    );
    assert_eq!(
        target.get_manifest("slot").unwrap().as_slice(),
        &manifest[..]
    );
    for (i, key) in manifest[16..].chunks(8).enumerate() {
        let got = target.get_chunk(key).unwrap();
        assert!(got.as_slice() == chunk(i, 256 << 10), "chunk {i} differs");
    }
    let second = report(&send_keyed(&keyed_config, &a, Some(&key)));
    assert_eq!(
        (second["sent"].as_u64(), second["skipped"].as_u64()),
        (Some(0), Some(32))
    );

    // A keyed sender and a receiver without a key.
    let unkeyed = Receiver::start(&c, &scratch.path().join("unkeyed.log"));
    let to_unkeyed = config(&unkeyed_cfg, &unkeyed.addr, true);
    let err = failure(&send_keyed(&to_unkeyed, &a, Some(&key)));
    assert!(
        err.contains("this server has no key; start it with --key-env"),
        "{err}"
    );

    // A malformed or missing key is refused before anything starts, without echoing it.
    for bad in [
        "not-the-key-at-all",
        &key[..62],
        &format!("{}zz", &key[..62]),
    ] {
        let err = failure(&send_keyed(&keyed_config, &a, Some(bad)));
        assert!(
            err.contains(&format!("environment variable {KEY_ENV} must be")),
            "{err}"
        );
        assert!(!err.contains(bad), "{err}");
        let serve = Command::new(KVWASM)
            .args([
                "fabric",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--key-env",
                KEY_ENV,
            ])
            .arg("--into")
            .arg(fs_uri(&c))
            .env(KEY_ENV, bad)
            .output()
            .unwrap();
        let err = failure(&serve);
        assert!(
            err.contains(&format!("environment variable {KEY_ENV} must be")),
            "{err}"
        );
        assert!(!err.contains(bad), "{err}");
    }
    let mut unset = Command::new(KVWASM);
    unset
        .args([
            "fabric",
            "send",
            "--manifest",
            "slot",
            "--fabric",
            "tcp",
            "--key-env",
            KEY_ENV,
        ])
        .arg("--from")
        .arg(fs_uri(&a))
        .env_remove(KEY_ENV)
        .env("KVWASM_CONFIG", &keyed_config);
    let err = failure(&unset.output().unwrap());
    assert!(
        err.contains(&format!("environment variable {KEY_ENV} is not set")),
        "{err}"
    );

    // A fabric granted the key's variable would hand the guest the key: refused.
    let granted = write_config(
        &granted_cfg,
        &format!(
            "[fabrics.tcp]\ncomponent = \"builtin:tcp\"\nnet = [{addr:?}]\nenv = [{KEY_ENV:?}]\n\
             settings = {{ peer = {addr:?} }}\n",
            addr = receiver.addr
        ),
    );
    let err = failure(&send_keyed(&granted, &a, Some(&key)));
    assert!(err.contains("the guest would see the key"), "{err}");
}
