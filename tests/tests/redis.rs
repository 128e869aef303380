//! The Redis backend (`builtin:redis`) against a real `redis-server` on
//! loopback, through the shim as an engine loads it. The server is started
//! by each test (`kvwasm_tests::servers`) and requires a password, which
//! reaches the guest only through a granted environment variable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvwasm_host::config::Config;
use kvwasm_host::{Backend, StoreHandle};
use kvwasm_tests::servers::RedisServer;
use kvwasm_tests::{Probe, assert_open_refused, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");
/// The variable the tests' configs name in `password_env`.
const PASSWORD_VAR: &str = "KVWASM_TEST_REDIS_PASSWORD";
/// The guest's per-round-trip deadline in these configs.
const TIMEOUT_MS: u64 = 1000;

/// A config granting `server` (unless `grant` is false) and the password
/// variable, with `settings` lines appended to the backend's settings.
fn config(dir: &Path, server: &RedisServer, grant: bool, settings: &str) -> PathBuf {
    let net = if grant {
        format!("net = [\"{}\"]\n", server.addr)
    } else {
        String::new()
    };
    write_config(
        dir,
        &format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\n{net}env = [\"{PASSWORD_VAR}\"]\n\
             call_timeout_ms = 5000\n\
             [backends.redis.settings]\naddress = \"{}\"\npassword_env = \"{PASSWORD_VAR}\"\n\
             timeout_ms = {TIMEOUT_MS}\n{settings}",
            server.addr
        ),
    )
}

/// The backend `redis` on `server` (no password) for opening handles in
/// this process, with `entry` lines and `settings` pairs added.
fn in_process(dir: &Path, server: &RedisServer, entry: &str, settings: &str) -> Arc<Backend> {
    let text = format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\n{entry}\
         settings = {{ address = \"{0}\"{settings} }}\n",
        server.addr
    );
    let config = Config::parse(&text, dir).unwrap();
    Arc::new(config.backend("redis").unwrap())
}

fn probe(config: &Path, server: &RedisServer, namespace: &str) -> Probe {
    let password = server.password.as_deref().expect("password");
    Probe::new(PROBE, &format!("wasm://redis/{namespace}"))
        .config(config)
        .env(PASSWORD_VAR, password)
}

#[test]
fn saves_restores_and_deduplicates_with_exact_answers() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true, "");

    let (out, stderr) = probe(&config, &server, "team/model").run(&[
        "put-chunk:0a=alpha",
        "put-chunk:0a=alpha",
        "put-chunk:0b=beta",
        "get-chunk:0a",
        "put-manifest:slot0=0a0b",
        "get-manifest:slot0",
        "get-chunk:0b",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk 0a=alpha -> 0",
            "put-chunk 0a=alpha -> 1",
            "put-chunk 0b=beta -> 0",
            "get-chunk 0a -> 0 alpha",
            "put-manifest slot0=0a0b -> 0",
            "get-manifest slot0 -> 0 0a0b",
            "get-chunk 0b -> 0 beta",
        ],
        "{stderr}"
    );
    // Short chunks are written through: one `SET NX` per new hash answers
    // exactly and stores it. The repeated put is answered by the handle and
    // re-checked with one `EXISTS` at the manifest.
    assert_eq!(server.calls("exists"), 1);
    assert_eq!(server.calls("set"), 3);
    // Round trips: two `SET NX`, the get, the re-check, the manifest.
    assert!(
        stderr.contains(
            "2 chunks written at put time, 0 staged chunks (0 already stored), 5 round trips, \
             1 dedup hits re-checked"
        ),
        "{stderr}"
    );

    // Keys live under the namespace, chunks and manifests apart.
    let keys = server.cli(&["--scan", "--pattern", "kvwasm/team/model/*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "kvwasm/team/model/chunks/0a",
            "kvwasm/team/model/chunks/0b",
            "kvwasm/team/model/manifests/slot0"
        ]
    );

    // Another process: the server answers the duplicate and keeps the
    // stored bytes (`SET NX` writes nothing over them).
    let (out, stderr) = probe(&config, &server, "team/model").run(&[
        "put-chunk:0a=other",
        "put-manifest:slot1=0a",
        "get-manifest:slot0",
        "get-chunk:0a",
    ]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk 0a=other -> 1",
            "put-manifest slot1=0a -> 0",
            "get-manifest slot0 -> 0 0a0b",
            "get-chunk 0a -> 0 alpha",
        ],
        "{stderr}"
    );
    assert_eq!(
        server.calls("set"),
        5,
        "the refused SET NX and the new manifest"
    );
}

/// With exact answers, a long chunk (64 KiB or more) is checked with
/// `EXISTS` and staged until the manifest, so a warm save never sends its
/// bytes; a short one is written through at once.
#[test]
fn long_chunks_are_checked_and_staged_short_ones_written_through() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(dir.path(), &server, "", "");
    let writer = StoreHandle::open(backend.clone(), "ns").unwrap();
    let reader = StoreHandle::open(backend.clone(), "ns").unwrap();
    let short = vec![1u8; (64 << 10) - 1];
    let long = vec![2u8; 64 << 10];

    assert!(!writer.put_chunk(b"short", &short).unwrap(), "new");
    assert_eq!((server.calls("set"), server.calls("exists")), (1, 0));
    assert_eq!(reader.get_chunk(b"short").unwrap().as_slice(), &short[..]);

    assert!(!writer.put_chunk(b"long", &long).unwrap(), "new");
    assert_eq!((server.calls("set"), server.calls("exists")), (1, 1));
    assert!(
        reader.get_chunk(b"long").is_err(),
        "staged until the manifest"
    );
    writer.put_manifest("m", b"two").unwrap();
    assert_eq!(server.calls("set"), 3, "the long chunk, then the manifest");
    assert_eq!(reader.get_chunk(b"long").unwrap().as_slice(), &long[..]);

    // A warm save from a new handle: both answered "already present" from
    // what the host remembers the server acknowledged (`known-chunks`),
    // without a command; its manifest would re-check them in one pipeline.
    let again = StoreHandle::open(backend.clone(), "ns").unwrap();
    assert!(again.put_chunk(b"short", &short).unwrap());
    assert!(again.put_chunk(b"long", &long).unwrap());
    assert_eq!((server.calls("set"), server.calls("exists")), (3, 2));

    // Another namespace remembers nothing of this one: its server is asked,
    // and the chunks are new there.
    let other = StoreHandle::open(backend, "other").unwrap();
    assert!(!other.put_chunk(b"short", &short).unwrap(), "new");
    assert!(!other.put_chunk(b"long", &long).unwrap(), "new");
    assert_eq!((server.calls("set"), server.calls("exists")), (4, 3));
}

/// Issue 37: what the server acknowledged outlives the instance that heard
/// it. Idle release drops an instance after `idle_release_ms`; the first
/// warm save after it used to ask the server about every chunk again (a
/// `SET NX` or `EXISTS` round trip per put). Now the new instance finds
/// them in the host's `known-chunks` record of the backend and namespace:
/// the puts send no command, and the manifest re-checks them all in one
/// pipeline. Another backend on the same server and namespace shares
/// nothing of that record.
#[test]
fn a_warm_save_after_an_idle_release_asks_the_server_nothing_per_chunk() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let entry = "idle_release_ms = 30\ncall_timeout_ms = 5000\n";
    let backend = in_process(dir.path(), &server, entry, "");
    let handle = StoreHandle::open(backend.clone(), "slots").unwrap();
    // Long chunks are checked with `EXISTS`, short ones written with `SET NX`.
    let chunks: Vec<Vec<u8>> = (0..8)
        .map(|i| kvwasm_tests::pattern(64 << 10, i))
        .chain((8..24).map(|i| kvwasm_tests::pattern(2048, i)))
        .collect();
    let key = |chunk: &[u8]| kvwasm_tests::xxh3_key(chunk);
    for chunk in &chunks {
        assert!(!handle.put_chunk(&key(chunk), chunk).unwrap(), "new");
    }
    handle.put_manifest("slot", b"names them").unwrap();
    let cold = (server.calls("set"), server.calls("exists"));
    assert_eq!(cold, (16 + 8 + 1, 8 + 8), "{cold:?}");

    kvwasm_tests::idle::wait_for_release(&handle);
    let hits = backend.metrics.snapshot().known_chunk_hits;
    for chunk in &chunks {
        assert!(handle.put_chunk(&key(chunk), chunk).unwrap(), "present");
    }
    assert_eq!(
        (server.calls("set"), server.calls("exists")),
        cold,
        "no command for any put"
    );
    let warm = backend.metrics.snapshot();
    assert!(warm.instances_restarted >= 1, "{warm:?}");
    assert_eq!(warm.known_chunk_hits - hits, 24, "{warm:?}");
    handle.put_manifest("slot", b"names them").unwrap();
    assert_eq!(
        (server.calls("set"), server.calls("exists")),
        (cold.0 + 1, cold.1 + 24),
        "the manifest, after one re-check of all 24"
    );

    // The same server and namespace through another backend entry: its
    // instances ask the server, which answers that the chunks are there.
    let stranger = in_process(dir.path(), &server, entry, "");
    let other = StoreHandle::open(stranger, "slots").unwrap();
    for chunk in &chunks {
        assert!(other.put_chunk(&key(chunk), chunk).unwrap(), "present");
    }
    assert_eq!(
        (server.calls("set"), server.calls("exists")),
        (cold.0 + 1 + 16, cold.1 + 24 + 8),
        "a round trip per chunk"
    );
}

/// A server that lost everything between two saves (`FLUSHALL` here; a
/// restart without persistence alike): the host's record still says the
/// chunks are there, so the puts answer 1, but the manifest's re-check
/// finds them gone and fails, publishing nothing. The guest then forgets
/// the namespace's record (the host's, so for every instance): the next
/// save asks the server, stores every chunk and publishes.
#[test]
fn a_server_that_lost_its_data_fails_one_manifest_then_the_record_is_forgotten() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let entry = "idle_release_ms = 30\ncall_timeout_ms = 5000\n";
    let backend = in_process(dir.path(), &server, entry, "");
    let handle = StoreHandle::open(backend, "slots").unwrap();
    let chunks: Vec<Vec<u8>> = (0..6).map(|i| kvwasm_tests::pattern(2048, i)).collect();
    let key = |chunk: &[u8]| kvwasm_tests::xxh3_key(chunk);
    let save = |expect_present: bool| {
        for chunk in &chunks {
            assert_eq!(
                handle.put_chunk(&key(chunk), chunk).unwrap(),
                expect_present
            );
        }
        handle.put_manifest("slot", b"names them")
    };
    save(false).unwrap();

    server.cli(&["FLUSHALL"]);
    kvwasm_tests::idle::wait_for_release(&handle);
    let err = save(true).unwrap_err();
    assert!(
        matches!(&err, kvwasm_host::KvError::Io(m) if m.contains("6 chunks")),
        "{err:?}"
    );
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "0", "nothing published");
    // A consumer retrying the manifest alone is refused as long as the
    // chunks it names are missing.
    let retry = handle.put_manifest("slot", b"names them").unwrap_err();
    assert!(
        matches!(&retry, kvwasm_host::KvError::Io(m) if m.contains("6 chunks")),
        "{retry:?}"
    );
    assert_eq!(
        server.cli(&["DBSIZE"]).trim(),
        "0",
        "still nothing published"
    );

    save(false).unwrap();
    assert_eq!(
        server.cli(&["DBSIZE"]).trim(),
        "7",
        "six chunks, the manifest"
    );
}

#[test]
fn batched_dedup_saves_in_three_round_trips() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true, "dedup_check = \"flush\"\n");
    let puts: Vec<String> = (0..24)
        .map(|i| format!("put-chunk:{i:04x}=chunk {i}"))
        .collect();
    let save: Vec<&str> = puts
        .iter()
        .map(String::as_str)
        .chain(["put-manifest:m=24 chunks"])
        .collect();

    let (out, stderr) = probe(&config, &server, "ns").run(&save);
    assert!(out[1..25].iter().all(|l| l.ends_with("-> 0")), "{out:?}");
    assert_eq!(out[25], "put-manifest m=24 chunks -> 0");
    assert!(
        stderr.contains("24 staged chunks (0 already stored), 3 round trips"),
        "{stderr}"
    );
    assert_eq!((server.calls("exists"), server.calls("set")), (24, 25));

    // The same save from a new process: one check finds every chunk, only
    // the manifest is written. (Without a per-put check, put_chunk cannot
    // know a stored chunk from a new one: it says 0.)
    let (out, stderr) = probe(&config, &server, "ns").run(&save);
    assert_eq!(out[25], "put-manifest m=24 chunks -> 0");
    assert!(
        stderr.contains("24 staged chunks (24 already stored), 2 round trips"),
        "{stderr}"
    );
    assert_eq!(server.calls("set"), 26);
}

/// `count` distinct chunks of 4 KiB.
fn short_chunks(count: u64) -> Vec<Vec<u8>> {
    (0..count).map(|i| kvwasm_tests::pattern(4096, i)).collect()
}

/// Put each of `chunks` under its xxh3 key; each must be new.
fn put_all_new(handle: &StoreHandle, chunks: &[Vec<u8>]) {
    for chunk in chunks {
        let key = kvwasm_tests::xxh3_key(chunk);
        assert!(!handle.put_chunk(&key, chunk).unwrap(), "new");
    }
}

/// Every one of `chunks` reads back byte for byte through `handle`.
fn assert_restores<'a>(handle: &StoreHandle, chunks: impl IntoIterator<Item = &'a Vec<u8>>) {
    for chunk in chunks {
        let key = kvwasm_tests::xxh3_key(chunk);
        assert_eq!(handle.get_chunk(&key).unwrap().as_slice(), &chunk[..]);
    }
}

/// `dedup_check = "write"`: a short chunk goes out as `SET key value NX`
/// while the consumer goes on putting, pipelined, and its reply is read
/// later; nothing asks `EXISTS`. A long chunk is staged and checked at the
/// flush, as with `"flush"`.
#[test]
fn in_write_mode_short_chunks_go_out_as_they_are_put_and_the_manifest_waits_for_their_answers() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(dir.path(), &server, "", ", dedup_check = \"write\"");
    let writer = StoreHandle::open(backend.clone(), "ns").unwrap();
    let chunks = short_chunks(300);
    put_all_new(&writer, &chunks);
    let long = kvwasm_tests::pattern(64 << 10, 1000);
    put_all_new(&writer, std::slice::from_ref(&long));
    writer.put_manifest("m", b"301 chunks").unwrap();
    assert_eq!(
        (server.calls("set"), server.calls("exists")),
        (302, 1),
        "each short chunk once, unchecked; the long one checked and written; the manifest"
    );
    let reader = StoreHandle::open(backend, "ns").unwrap();
    assert_eq!(reader.get_manifest("m").unwrap().as_slice(), b"301 chunks");
    assert_restores(&reader, chunks.iter().chain([&long]));
}

/// At most 1 MiB of values waits for replies per connection: with the
/// server's writes paused (`CLIENT PAUSE … WRITE`), the put that overflows
/// the window waits for the oldest replies, gives up at `timeout_ms`, and
/// hands every write behind back; the next puts are staged. The manifest,
/// once the server writes again, checks all 300 and writes them.
#[test]
fn in_write_mode_a_full_window_waits_for_replies_and_hands_the_writes_back() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(dir.path(), &server, "", ", dedup_check = \"write\"");
    let writer = StoreHandle::open(backend.clone(), "ns").unwrap();
    assert_eq!(
        server.cli(&["CLIENT", "PAUSE", "600000", "WRITE"]).trim(),
        "OK"
    );
    let chunks = short_chunks(300);
    put_all_new(&writer, &chunks);
    assert_eq!(server.cli(&["CLIENT", "UNPAUSE"]).trim(), "OK");
    writer.put_manifest("m", b"300 chunks").unwrap();
    assert_eq!(
        server.calls("exists"),
        300,
        "every write behind was handed back (none answered within the window) or staged"
    );
    let reader = StoreHandle::open(backend, "ns").unwrap();
    assert_restores(&reader, &chunks);
}

/// A loopback proxy to a server whose first connection forwards what the
/// client sends and drops every reply, until [`ReplyEater::cut`] closes
/// it; later connections forward both ways.
struct ReplyEater {
    addr: std::net::SocketAddr,
    first: Arc<std::sync::Mutex<Option<std::net::TcpStream>>>,
}

impl ReplyEater {
    fn start(server: std::net::SocketAddr) -> ReplyEater {
        use std::io::copy;
        use std::net::{Shutdown, TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let first = Arc::new(std::sync::Mutex::new(None));
        let keep = first.clone();
        std::thread::spawn(move || {
            for (n, client) in listener.incoming().enumerate() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(server) else {
                    return;
                };
                let (back, down) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                // Kept before anything is forwarded: a test cuts it only
                // once the server has executed what came through it.
                if n == 0 {
                    *keep.lock().unwrap() = Some(back.try_clone().unwrap());
                }
                std::thread::spawn(move || {
                    let _ = copy(&mut &client, &mut &upstream);
                    let _ = upstream.shutdown(Shutdown::Both);
                });
                if n == 0 {
                    std::thread::spawn(move || copy(&mut &down, &mut std::io::sink()));
                } else {
                    std::thread::spawn(move || {
                        let _ = copy(&mut &down, &mut &back);
                        let _ = back.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        ReplyEater { addr, first }
    }

    fn cut(&self) {
        let first = self
            .first
            .lock()
            .unwrap()
            .take()
            .expect("a first connection");
        first.shutdown(std::net::Shutdown::Both).unwrap();
    }
}

/// With `wait_replicas`, writes behind the server executed but whose
/// replies never came (the connection lost) must still be confirmed: the
/// manifest is refused, not published without a `WAIT` before it (this
/// server has no replica, so no `WAIT` can succeed), and so is a retry of
/// the manifest alone.
#[test]
fn in_write_mode_with_wait_replicas_writes_lost_before_their_replies_fail_the_manifest() {
    let server = RedisServer::without_password();
    let proxy = ReplyEater::start(server.addr);
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\n\
         settings = {{ address = \"{0}\", dedup_check = \"write\", wait_replicas = 1, \
         wait_timeout_ms = 100, timeout_ms = {TIMEOUT_MS} }}\n",
        proxy.addr
    );
    let backend = Arc::new(
        Config::parse(&text, dir.path())
            .unwrap()
            .backend("redis")
            .unwrap(),
    );
    let writer = StoreHandle::open(backend, "ns").unwrap();
    // 64 plain `SET`s of 4 KiB under 33-byte keys (4,158 bytes each): the
    // 64th takes the batch past 256 KiB, so all are sent during the puts
    // and the manifest's flush finds every chunk stored.
    put_all_new(&writer, &short_chunks(64));
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.calls("set") < 64 {
        assert!(
            Instant::now() < deadline,
            "the server executed {} of the 64 writes behind",
            server.calls("set")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.cut();
    let err = writer.put_manifest("m", b"64 chunks").unwrap_err();
    assert!(
        format!("{err:?}").contains("was lost before its writes were confirmed"),
        "{err:?}"
    );
    assert_eq!(
        server.cli(&["EXISTS", "kvwasm/ns/manifests/m"]).trim(),
        "0",
        "no manifest published"
    );
    // The consumer retries the manifest alone: the chunks exist, but no
    // confirmation covered them, so they are written again (read back from
    // the server) and confirmed first, which fails again here.
    let sets = server.calls("set");
    let err = writer.put_manifest("m", b"64 chunks").unwrap_err();
    assert!(format!("{err:?}").contains("replicas"), "{err:?}");
    assert_eq!(
        server.cli(&["EXISTS", "kvwasm/ns/manifests/m"]).trim(),
        "0",
        "still no manifest published"
    );
    assert_eq!(server.calls("set") - sets, 64, "every chunk written again");
}

/// Writes behind on a connection the server closed before their replies
/// came: the manifest's flush hands them back, checks them and writes
/// those missing on a new connection, and only then publishes.
#[test]
fn in_write_mode_writes_behind_lost_with_their_connection_are_written_again_before_the_manifest() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(dir.path(), &server, "", ", dedup_check = \"write\"");
    let writer = StoreHandle::open(backend.clone(), "ns").unwrap();
    // 400 KiB: more than one batch is sent, less than the window, so no
    // reply has been read when the connection goes.
    let chunks = short_chunks(100);
    put_all_new(&writer, &chunks);
    let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert_eq!(killed.trim(), "1", "the guest's one connection");
    writer.put_manifest("m", b"100 chunks").unwrap();
    assert!(
        server.calls("exists") > 0,
        "the writes whose answers were lost were checked again"
    );
    let reader = StoreHandle::open(backend, "ns").unwrap();
    assert_eq!(reader.get_manifest("m").unwrap().as_slice(), b"100 chunks");
    assert_restores(&reader, &chunks);
}

/// A write behind the server refuses (here an ACL user that may write
/// manifests but not chunks) is never named by a published manifest: the
/// flush tries it again, fails, and the manifest is not written.
#[test]
fn in_write_mode_a_refused_write_behind_fails_the_manifest_and_publishes_nothing() {
    let server = RedisServer::without_password();
    let acl = server.cli(&[
        "ACL",
        "SETUSER",
        "manifests-only",
        "on",
        ">only-manifests",
        "%R~*",
        "%W~kvwasm/ns/manifests/*",
        "+@all",
    ]);
    assert_eq!(acl.trim(), "OK");
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &server,
        true,
        "dedup_check = \"write\"\nuser = \"manifests-only\"\n",
    );
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .env(PASSWORD_VAR, "only-manifests")
        .run(&["put-chunk:0a=alpha", "put-manifest:m=0a", "get-manifest:m"]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-chunk 0a=alpha -> 0",
            "put-manifest m=0a -> -4",
            "get-manifest m -> -2",
        ],
        "{stderr}"
    );
    assert!(stderr.contains("NOPERM"), "the server's reason: {stderr}");
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "0", "nothing published");
}

#[test]
fn an_acl_user_and_a_database_index_are_honoured() {
    let server = RedisServer::start();
    // A user that may touch kvwasm's keys only, with a password of its own.
    let acl = server.cli(&[
        "ACL",
        "SETUSER",
        "kvcache",
        "on",
        ">user-secret",
        "~kvwasm/*",
        "+@all",
    ]);
    assert_eq!(acl.trim(), "OK");
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true, "user = \"kvcache\"\ndb = 3\n");
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .env(PASSWORD_VAR, "user-secret")
        .run(&["put-manifest:m=in db 3", "get-manifest:m"]);
    assert_eq!(
        out,
        [
            "open ok",
            "put-manifest m=in db 3 -> 0",
            "get-manifest m -> 0 in db 3"
        ],
        "{stderr}"
    );
    assert_eq!(
        server
            .cli(&["-n", "3", "GET", "kvwasm/ns/manifests/m"])
            .trim(),
        "in db 3"
    );
    assert_eq!(server.cli(&["-n", "0", "DBSIZE"]).trim(), "0");

    // The user's password is its own: the default user's is refused for it.
    let run = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .env(PASSWORD_VAR, server.password.as_deref().unwrap())
        .run(&["get-manifest:m"]);
    assert_eq!(run.0, ["open NULL"], "{}", run.1);
    assert!(run.1.contains("WRONGPASS"), "{}", run.1);
}

#[test]
fn a_wrong_password_fails_the_open_with_the_servers_reason() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true, "");
    let started = Instant::now();
    let run = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .env(PASSWORD_VAR, "not-the-password")
        .run(&["get-manifest:m"]);
    assert_open_refused(
        run,
        started.elapsed(),
        &["denied", "WRONGPASS"],
        "not-the-password",
    );

    // No password at all: the server's NOAUTH comes back just as clearly.
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .run(&["get-manifest:m"]);
    assert_eq!(out, ["open ok", "get-manifest m -> -4"], "{stderr}");
    assert!(stderr.contains("NOAUTH"), "{stderr}");
}

#[test]
fn without_the_net_grant_the_guest_cannot_connect() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, false, "");
    let connections = || server.info_stat("total_connections_received");
    // Each reading is one redis-cli connection of its own.
    let before = connections();
    let (out, stderr) = probe(&config, &server, "ns").run(&["get-manifest:m"]);
    assert_eq!(out, ["open NULL"]);
    assert!(
        stderr.contains("cannot connect") && stderr.contains("not granted in `net`"),
        "{stderr}"
    );
    assert_eq!(connections(), before + 1, "the server saw no connection");
}

#[test]
fn a_killed_server_fails_calls_fast_and_the_same_handle_recovers_after_restart() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true, "");
    let mut run = probe(&config, &server, "ns").spawn(&[
        "put-chunk:01=acknowledged",
        "put-manifest:m1=01",
        "pause",
        "get-manifest:m1",
        "put-chunk:02=second",
        "put-manifest:m2=02",
        "pause",
        "get-manifest:m1",
        "get-chunk:01",
        "put-chunk:02=second",
        "put-manifest:m2=02",
        "get-manifest:m2",
    ]);
    assert_eq!(
        run.until_pause(),
        [
            "open ok",
            "put-chunk 01=acknowledged -> 0",
            "put-manifest m1=01 -> 0"
        ]
    );

    server.kill();
    let started = Instant::now();
    run.resume();
    let down = run.until_pause();
    let took = started.elapsed();
    assert_eq!(down.len(), 3, "{down:?}");
    for line in &down {
        assert!(line.ends_with("-> -6"), "unavailable while down: {down:?}");
    }
    // Refused connections fail at once; nothing waits for a deadline (the
    // log below names no reply deadline; the time is only shown: a loaded
    // machine may take seconds for three calls).
    eprintln!("3 calls while down took {took:?}");

    server.restart();
    run.resume();
    let (up, stderr) = run.finish();
    assert_eq!(
        up,
        [
            "get-manifest m1 -> 0 01",
            "get-chunk 01 -> 0 acknowledged",
            "put-chunk 02=second -> 0",
            "put-manifest m2=02 -> 0",
            "get-manifest m2 -> 0 02",
        ],
        "the acknowledged save survived the kill (AOF) and the handle works again: {stderr}"
    );
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert!(!stderr.contains("no reply within"), "{stderr}");
}

#[test]
fn a_hung_server_costs_one_deadline_not_a_hang() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &server, true, "");
    let mut run = probe(&config, &server, "ns").spawn(&[
        "put-manifest:m=v",
        "pause",
        "get-manifest:m",
        "pause",
        "get-manifest:m",
    ]);
    assert_eq!(run.until_pause(), ["open ok", "put-manifest m=v -> 0"]);

    server.freeze(true);
    let started = Instant::now();
    run.resume();
    let hung = run.until_pause();
    let took = started.elapsed();
    assert_eq!(hung, ["get-manifest m -> -6"]);
    // At its deadline, not before; and not a hang (the server stays frozen
    // until after this): the upper bound leaves a loaded machine room.
    let deadline = Duration::from_millis(TIMEOUT_MS);
    assert!(
        took >= deadline && took < deadline * 20,
        "failed after {took:?}, deadline {deadline:?}"
    );

    server.freeze(false);
    run.resume();
    let (out, stderr) = run.finish();
    assert_eq!(out, ["get-manifest m -> 0 v"], "{stderr}");
    assert!(stderr.contains("no reply within 1000 ms"), "{stderr}");
}

#[test]
fn chunks_staged_in_any_instance_are_read_back_and_published_by_the_manifest() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    // Batched existence checks: every chunk is staged, short ones too.
    let backend = in_process(
        dir.path(),
        &server,
        "max_instances = 4\n",
        ", dedup_check = \"flush\"",
    );
    let writer = StoreHandle::open(backend.clone(), "pool").unwrap();
    let chunks: Vec<(Vec<u8>, Vec<u8>)> = (0..32u8)
        .map(|i| (vec![i; 8], vec![i; 4096 + usize::from(i)]))
        .collect();
    // Spread over four instances, each staging eight chunks: while the
    // instances that staged earlier parts are held, the next part needs
    // another one (threads that happen to overlap do not guarantee this).
    let mut held = Vec::new();
    for part in chunks.chunks(8) {
        for (hash, data) in part {
            assert!(!writer.put_chunk(hash, data).unwrap(), "fresh chunk");
        }
        held.push(writer.hold_instance().unwrap());
    }
    assert_eq!(
        writer.live_instances(),
        4,
        "puts were spread over instances"
    );
    drop(held);
    assert_eq!(server.calls("set"), 0, "chunks are staged until a manifest");
    let reader = StoreHandle::open(backend, "pool").unwrap();
    assert!(reader.get_chunk(&chunks[0].0).is_err(), "not published yet");

    // The writer reads its own writes, whichever instance staged them.
    for (hash, data) in &chunks {
        assert_eq!(writer.get_chunk(hash).unwrap().as_slice(), data.as_slice());
    }

    writer.put_manifest("m", b"thirty-two").unwrap();
    assert_eq!(
        server.calls("set"),
        33,
        "32 chunks once each, then the manifest"
    );
    for (hash, data) in &chunks {
        assert_eq!(reader.get_chunk(hash).unwrap().as_slice(), data.as_slice());
    }
    assert_eq!(reader.get_manifest("m").unwrap().as_slice(), b"thirty-two");
}
