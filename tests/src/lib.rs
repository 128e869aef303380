//! Helpers shared by the end-to-end tests.
//!
//! Tests load `libkv_store_wasm.so` from the build's target directory with
//! `libloading`, exactly as a consumer does. Anything that needs a config
//! file (`KVWASM_CONFIG`) runs in a child process through the `kv-probe`
//! binary, so no test mutates the environment of the multi-threaded test
//! process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub mod backoff;
pub mod logs;
pub mod servers;
pub mod tls;

pub use kv_store_abi::{Handle, Library};

/// Directory holding the `libkv_store_wasm.so` these tests were built with:
/// `target/<profile>/deps`. This crate depends on the shim, so building the
/// tests always rebuilds it there (`target/<profile>/` holds a copy only
/// after a top-level build, which may be stale).
pub fn shim_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test binary>, or target/<profile>/<binary>
    let profile_dir = exe
        .ancestors()
        .find(|p| p.join("deps").is_dir() && p.join("build").is_dir())
        .unwrap_or_else(|| panic!("no target/<profile> above {}", exe.display()));
    let deps = profile_dir.join("deps");
    assert!(
        deps.join(kv_store_abi::library_file_name("wasm")).is_file(),
        "libkv_store_wasm.so missing in {}; build the tests with cargo",
        deps.display()
    );
    deps
}

/// Path of the built shim.
pub fn shim_path() -> PathBuf {
    shim_dir().join(kv_store_abi::library_file_name("wasm"))
}

/// The shim, loaded once per test process.
pub fn shim() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| Library::open(shim_path().as_os_str()).expect("load the shim"))
}

/// `wasm://` URI of the embedded fs backend on `dir`.
pub fn fs_uri(dir: &Path) -> String {
    format!("wasm://{}", dir.display())
}

/// Open the embedded fs backend on `dir`.
pub fn open_fs(dir: &Path) -> Handle<'static> {
    shim()
        .open_store(&fs_uri(dir))
        .unwrap_or_else(|| panic!("open {} failed", fs_uri(dir)))
}

/// Deterministic, non-repeating test bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A hash of `len` bytes derived from `seed` (for hash-length tests).
pub fn hash_of_len(len: usize, seed: u64) -> Vec<u8> {
    pattern(len, seed ^ 0xA5A5)
}

/// The xxh3-64 key llama.cpp uses, as 8 little-endian bytes.
pub fn xxh3_key(data: &[u8]) -> [u8; 8] {
    xxhash_rust::xxh3::xxh3_64(data).to_le_bytes()
}

/// A child run of `kv-probe`.
pub struct Probe {
    cmd: Command,
}

impl Probe {
    /// `kv-probe <uri> <ops...>` with a clean kvwasm environment.
    pub fn new(probe_exe: &str, uri: &str) -> Probe {
        let mut cmd = Command::new(probe_exe);
        cmd.arg(shim_path()).arg(uri);
        cmd.env_remove("KVWASM_CONFIG").env("KVWASM_LOG", "debug");
        Probe { cmd }
    }

    /// Use this config file.
    pub fn config(mut self, path: &Path) -> Probe {
        self.cmd.env("KVWASM_CONFIG", path);
        self
    }

    /// Set an environment variable for the child.
    pub fn env(mut self, key: &str, value: &str) -> Probe {
        self.cmd.env(key, value);
        self
    }

    /// Start the ops and return at once, to read the lines as they come
    /// and answer `pause` steps.
    pub fn spawn(mut self, ops: &[&str]) -> RunningProbe {
        use std::process::Stdio;
        let mut child = self
            .cmd
            .args(ops)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kv-probe");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        // Drained as it comes, so a chatty child never blocks on a full pipe.
        let mut stderr_pipe = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr_pipe, &mut text);
            text
        });
        RunningProbe {
            child,
            stdout,
            stderr,
        }
    }

    /// Run the ops; returns (stdout lines, stderr).
    pub fn run(mut self, ops: &[&str]) -> (Vec<String>, String) {
        let out = self.cmd.args(ops).output().expect("run kv-probe");
        let stdout = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        (stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A `kv-probe` child that is still running.
pub struct RunningProbe {
    child: std::process::Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    stderr: std::thread::JoinHandle<String>,
}

impl RunningProbe {
    /// The next line the probe prints (panics at end of output).
    pub fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read kv-probe");
        if n == 0 {
            let _ = self.child.wait();
            panic!("kv-probe ended early");
        }
        line.trim_end().to_owned()
    }

    /// Lines up to the next `pause`, which is consumed.
    pub fn until_pause(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            match self.line() {
                l if l == "pause" => return lines,
                l => lines.push(l),
            }
        }
    }

    /// Let a paused probe go on.
    pub fn resume(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"\n")
            .and_then(|()| stdin.flush())
            .expect("resume kv-probe");
    }

    /// Wait for the probe to end; returns its remaining lines and stderr.
    pub fn finish(self) -> (Vec<String>, String) {
        use std::io::Read;
        let RunningProbe {
            mut child,
            mut stdout,
            stderr,
        } = self;
        drop(child.stdin.take());
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).expect("read kv-probe");
        child.wait().expect("wait kv-probe");
        let stderr = stderr.join().expect("stderr reader");
        (rest.lines().map(str::to_owned).collect(), stderr)
    }
}

/// A probe's `open` was refused promptly, its log names every one of
/// `reasons`, and `secret` appears nowhere in it.
pub fn assert_open_refused(
    run: (Vec<String>, String),
    took: std::time::Duration,
    reasons: &[&str],
    secret: &str,
) {
    let (out, stderr) = run;
    assert_eq!(out, ["open NULL"], "{stderr}");
    for reason in reasons {
        assert!(stderr.contains(reason), "{reason:?} missing: {stderr}");
    }
    assert!(!stderr.contains(secret), "the secret was logged: {stderr}");
    // Not a hang: a process that starts, loads its guest and fails `open`.
    // The bound is loose because a loaded machine takes seconds for that;
    // each caller's `reasons` say what failed, and not at which deadline.
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
}

/// Write a config file into `dir` and return its path.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("kvwasm.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// A config with the hostile test guest (backend `hostile`) granted
/// `dir/data` at `/data`, 64 MiB and 300 ms per call, plus `extra` lines.
pub fn hostile_config(dir: &Path, extra: &str) -> PathBuf {
    hostile_config_with_deadline(dir, 300, extra)
}

/// [`hostile_config`] with a 30 s deadline, for attacks whose verdict is a
/// limit other than the deadline (descriptors, log bytes): their work (a
/// thousand opens, 40 MiB strings) must not run into a 300 ms deadline on
/// a loaded machine, or the test sees -8 instead of the limit's code.
pub fn patient_hostile_config(dir: &Path, extra: &str) -> PathBuf {
    hostile_config_with_deadline(dir, 30_000, extra)
}

fn hostile_config_with_deadline(dir: &Path, call_timeout_ms: u64, extra: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("data")).expect("create data dir");
    write_config(
        dir,
        &format!(
            "[backends.hostile]\ncomponent = {:?}\ndir = \"data\"\n\
             memory_limit_mib = 64\ncall_timeout_ms = {call_timeout_ms}\n{extra}",
            kvwasm_guest_artifacts::HOSTILE_PATH
        ),
    )
}

/// A loopback HTTP server answering every request with `200 <body>`;
/// returns its address and a counter of requests served.
pub fn http_server(
    body: &'static str,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = write!(
                &stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, served)
}

/// The crash-loop workload (`kv-crash-writer`) and its checker, shared by
/// the writer binary and `tests/crash_loop.rs`: llama.cpp-like slot saves
/// whose manifests say exactly which chunks they need, so a store left
/// behind by a killed consumer can be audited through the C ABI alone.
pub mod crash {
    use super::{Handle, pattern, xxh3_key};

    /// Manifest names the writer uses (`slot-0` ..), reused so saves replace
    /// and delete each other's manifests.
    pub const SLOTS: usize = 8;
    /// Content ids every epoch draws from: the dedup path across slots and
    /// across restarts.
    const SHARED_IDS: u64 = 32;
    /// Content ids an epoch draws from besides the shared ones: epoch `e`
    /// uses `[e * WINDOW, (e + 2) * WINDOW)`. Each window overlaps the last
    /// one by half, so a restarted writer puts again chunks the killed one
    /// may have been writing (a torn chunk trusted as a dedup hit would be
    /// caught), and fresh ones.
    const WINDOW: u64 = 192;
    const MAGIC: &str = "kvcrash-slot v1";

    pub fn slot_name(slot: usize) -> String {
        format!("slot-{slot}")
    }

    /// SplitMix64: small, seedable, and the same on every platform.
    #[derive(Clone, Debug)]
    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Rng {
            Rng(seed)
        }

        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in `lo..hi` (`hi > lo`; the modulo bias is irrelevant here).
        pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
            lo + self.next_u64() % (hi - lo)
        }
    }

    /// The bytes of chunk content `id`: 4 KiB to 256 KiB, fixed per id.
    pub fn chunk_content(id: u64) -> Vec<u8> {
        let size = 4096usize << (Rng::new(id).next_u64() % 7);
        pattern(size, id ^ 0xC4A5_11D0)
    }

    /// The content ids of one save in `epoch`: 8 to 32 chunks, a quarter
    /// shared by every save, the rest from the epoch's window.
    pub fn save_ids(rng: &mut Rng, epoch: u64) -> Vec<u64> {
        let n = rng.range(8, 33);
        (0..n)
            .map(|_| {
                if rng.range(0, 4) == 0 {
                    rng.range(0, SHARED_IDS)
                } else {
                    SHARED_IDS + rng.range(epoch * WINDOW, (epoch + 2) * WINDOW)
                }
            })
            .collect()
    }

    /// The chunks of `kv-crash-writer stage SEED` and `publish SEED`: 16
    /// contents of 4 to 256 KiB, fixed per seed.
    pub fn staged_chunks(seed: u64) -> Vec<Vec<u8>> {
        (0..16).map(|i| chunk_content(seed << 8 | i)).collect()
    }

    /// A chunk as a manifest names it: its key and length.
    pub type ChunkRef = ([u8; 8], usize);

    /// The manifest of slot `name`: a header, one line per chunk, and a
    /// trailer with the line count and an xxh3 of everything before it, so
    /// any prefix or mix of two versions fails [`parse_manifest`].
    pub fn encode_manifest(name: &str, writer: &str, chunks: &[ChunkRef]) -> Vec<u8> {
        let mut text = format!("{MAGIC}\nname {name}\nwriter {writer}\n");
        for (key, len) in chunks {
            text.push_str(&format!("chunk {} {len}\n", hex::encode(key)));
        }
        let sum = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
        text.push_str(&format!("end {} {sum:016x}\n", chunks.len()));
        text.into_bytes()
    }

    /// The chunks a manifest of slot `name` names, or why it is torn.
    pub fn parse_manifest(name: &str, bytes: &[u8]) -> Result<Vec<ChunkRef>, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        let body_end = text
            .trim_end_matches('\n')
            .rfind('\n')
            .map(|at| at + 1)
            .ok_or("no trailer")?;
        let (body, trailer) = text.split_at(body_end);
        let sum = xxhash_rust::xxh3::xxh3_64(body.as_bytes());
        let mut lines = body.lines();
        if lines.next() != Some(MAGIC) {
            return Err("bad header".into());
        }
        if lines.next() != Some(&format!("name {name}")) {
            return Err("names another slot".into());
        }
        if !lines.next().is_some_and(|l| l.starts_with("writer ")) {
            return Err("no writer line".into());
        }
        let chunks = lines
            .map(|line| {
                let mut words = line.strip_prefix("chunk ")?.split(' ');
                let key = hex::decode(words.next()?).ok()?.try_into().ok()?;
                let len = words.next()?.parse().ok()?;
                words.next().is_none().then_some((key, len))
            })
            .collect::<Option<Vec<ChunkRef>>>()
            .ok_or("a malformed chunk line")?;
        if trailer != format!("end {} {sum:016x}\n", chunks.len()) {
            return Err(format!(
                "trailer {:?} does not match the body",
                trailer.trim_end()
            ));
        }
        Ok(chunks)
    }

    /// The kinds of problem a [`CheckReport`] lists.
    const PROBLEMS: [&str; 4] = ["torn", "dangling", "corrupt", "error"];

    /// What the checker found in a store.
    #[derive(Debug, Default)]
    pub struct CheckReport {
        /// Manifests that were visible (and so checked).
        pub manifests: usize,
        /// Chunk reads that returned the bytes their key is the hash of.
        pub chunks: usize,
        /// One line per problem: `torn`, `dangling`, `corrupt` or `error`,
        /// then the slot and the details.
        pub problems: Vec<String>,
    }

    impl CheckReport {
        /// Problems of `kind` (`torn`, `dangling`, `corrupt`, `error`).
        pub fn count(&self, kind: &str) -> usize {
            self.problems
                .iter()
                .filter(|p| p.split(' ').next() == Some(kind))
                .count()
        }

        /// Lines for a child to print; [`CheckReport::from_lines`] reads them.
        pub fn to_lines(&self) -> Vec<String> {
            let mut lines = self.problems.clone();
            lines.push(format!(
                "checked manifests={} chunks={}",
                self.manifests, self.chunks
            ));
            lines
        }

        /// The report in a child's output (other lines are ignored); `None`
        /// if it has no summary.
        pub fn from_lines(lines: &str) -> Option<CheckReport> {
            let mut report = CheckReport::default();
            for line in lines.lines() {
                if let Some(counts) = line.strip_prefix("checked manifests=") {
                    let (manifests, chunks) = counts.split_once(" chunks=")?;
                    report.manifests = manifests.parse().ok()?;
                    report.chunks = chunks.parse().ok()?;
                    return Some(report);
                }
                if PROBLEMS.contains(&line.split(' ').next().unwrap_or_default()) {
                    report.problems.push(line.to_owned());
                }
            }
            None
        }
    }

    /// Audit every slot through `store` as a restoring consumer would
    /// (`get_manifest`, `prefetch_chunks`, `get_chunk`): each visible
    /// manifest must parse completely, and every chunk it names must be
    /// readable, of its length, and hash to its key. A missing manifest
    /// (-2) is fine; any other failure is a problem.
    pub fn check(store: &Handle<'_>) -> CheckReport {
        const NOT_FOUND: i32 = -2;
        let mut report = CheckReport::default();
        for name in (0..SLOTS).map(slot_name) {
            let bytes = match store.get_manifest(&name) {
                Ok(bytes) => bytes,
                Err(NOT_FOUND) => continue,
                Err(rc) => {
                    report
                        .problems
                        .push(format!("error {name}: get_manifest -> {rc}"));
                    continue;
                }
            };
            report.manifests += 1;
            let chunks = match parse_manifest(&name, &bytes) {
                Ok(chunks) => chunks,
                Err(why) => {
                    report.problems.push(format!("torn {name}: {why}"));
                    continue;
                }
            };
            // The restore path of a v2 consumer; a failed prefetch is only a
            // lost hint (the gets below still decide).
            let keys: Vec<&[u8]> = chunks.iter().map(|(key, _)| &key[..]).collect();
            let _ = store.prefetch_chunks(&keys);
            for (key, len) in chunks {
                let hex = hex::encode(key);
                match store.get_chunk(&key) {
                    Ok(data) if data.len() == len && xxh3_key(&data) == key => report.chunks += 1,
                    Ok(data) => report.problems.push(format!(
                        "corrupt {name}: chunk {hex} has {} bytes hashing to {}, expected {len}",
                        data.len(),
                        hex::encode(xxh3_key(&data))
                    )),
                    Err(NOT_FOUND) => report
                        .problems
                        .push(format!("dangling {name}: chunk {hex} is missing")),
                    Err(rc) => report
                        .problems
                        .push(format!("error {name}: get_chunk {hex} -> {rc}")),
                }
            }
        }
        report
    }
}

/// Tiered stores (docs/tiering.md) for the tests.
pub mod tiered {
    use std::path::{Path, PathBuf};

    use crate::servers::S3Server;

    /// `[backends.cold]` on `server` (a `builtin:s3` last tier), and the
    /// environment its credentials come from.
    pub fn s3_cold(server: &S3Server) -> (String, Vec<(&'static str, String)>) {
        let entry = format!(
            "[backends.cold]\ncomponent = \"builtin:s3\"\nhttp = [\"{0}\"]\n\
             env = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\n\
             settings = {{ endpoint = \"{0}\", bucket = \"{1}\" }}\n",
            server.endpoint, server.bucket
        );
        let env = vec![
            ("AWS_ACCESS_KEY_ID", server.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", server.secret_key.clone()),
        ];
        (entry, env)
    }

    /// `[backends.cold]`: a `builtin:fs` last tier in `dir/cold`.
    pub fn fs_cold(dir: &Path) -> String {
        format!(
            "[backends.cold]\ncomponent = \"builtin:fs\"\ndir = {:?}\n",
            dir.join("cold")
        )
    }

    /// A config in `dir` with the tiered store `kv`: `builtin:fs` hot tier
    /// in `dir/hot` holding `hot_mib`, over the `cold` entry; `knobs` are
    /// added to `[backends.kv]`.
    pub fn config(dir: &Path, hot_mib: u64, cold: &str, knobs: &str) -> PathBuf {
        crate::write_config(
            dir,
            &format!(
                "[backends.hot]\ncomponent = \"builtin:fs\"\ndir = {:?}\ncapacity_mib = {hot_mib}\n\
                 {cold}[backends.kv]\ntiers = [\"hot\", \"cold\"]\n{knobs}",
                dir.join("hot")
            ),
        )
    }

    /// Bytes and files in the chunk directories of a `builtin:fs` store
    /// rooted at `root` (temporary files of writes in flight included):
    /// what the tier really holds.
    pub fn fs_chunk_usage(root: &Path) -> (u64, u64) {
        let mut total = (0, 0);
        for slot in 0..16 {
            let Ok(entries) = std::fs::read_dir(root.join(format!("chunks/{slot:x}"))) else {
                continue;
            };
            for meta in entries.flatten().filter_map(|e| e.metadata().ok()) {
                total.0 += meta.len();
                total.1 += 1;
            }
        }
        total
    }

    /// Files under `dir`, recursively, whose directory is named `chunks`
    /// (chunk objects of a remote store, whatever the namespace).
    pub fn chunk_files(dir: &Path) -> usize {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        let in_chunks = dir.file_name().is_some_and(|n| n == "chunks");
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => chunk_files(&e.path()),
                Ok(_) => usize::from(in_chunks),
                Err(_) => 0,
            })
            .sum()
    }
}

/// Backends that release idle instances (`idle_release_ms`), for the tests
/// of the release thread.
/// Wait until the kernel's coarse clock (the one it stamps files with) has
/// passed the change time of everything under `dir`. The host remembers a
/// sync only of a version whose change time is older than that clock
/// (`payload-io.sync-paths`), so after this wait, a sync of anything under
/// `dir` is remembered: a condition, not a guess at how long it takes.
pub fn wait_past_change_times(dir: &Path) {
    fn newest(path: &Path) -> (i64, i64) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).unwrap();
        let mut latest = (meta.ctime(), meta.ctime_nsec());
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                latest = latest.max(newest(&entry.unwrap().path()));
            }
        }
        latest
    }
    let newest = newest(dir);
    loop {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) };
        if (now.tv_sec, now.tv_nsec) > newest {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

pub mod idle {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use kvwasm_host::config::Config;
    use kvwasm_host::{Backend, StoreHandle};

    /// Backend `name` of `component` with `dir = "data"` under `dir`,
    /// releasing instances idle for `release_ms`, warm handles included
    /// (`warm_handles = 0`: a lone handle on a `builtin:fs` backend would
    /// otherwise always be its most recently used, and keep its instance).
    pub fn releasing_after(
        dir: &Path,
        name: &str,
        component: &str,
        release_ms: u64,
    ) -> Arc<Backend> {
        let text = format!(
            "[backends.{name}]\ncomponent = {component:?}\ndir = \"data\"\n\
             idle_release_ms = {release_ms}\nwarm_handles = 0\ncall_timeout_ms = 2000\n"
        );
        Arc::new(Config::parse(&text, dir).unwrap().backend(name).unwrap())
    }

    /// Wait until `handle` has no live instance (up to a minute: the
    /// release thread may be slow to run on a busy machine).
    pub fn wait_for_release(handle: &StoreHandle) {
        let start = Instant::now();
        while handle.live_instances() > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the idle instance was never released"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Run `command` with its output captured, killing it past `limit`:
/// (status, stdout, stderr). `what` names it in the panic.
pub fn run_bounded(
    mut command: Command,
    what: &str,
    limit: std::time::Duration,
) -> (std::process::ExitStatus, String, String) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    (
        status,
        out.join().expect("reader").expect("stdout"),
        err.join().expect("reader").expect("stderr"),
    )
}
