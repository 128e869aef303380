//! `send` and `serve` in one process, over loopback: a native client of the link protocol
//! (written here from the protocol doc, independent of the server's codec) drives a `Server`
//! storing into a real fs store.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvwasm_fabric::auth::{self, Direction, Envelope, Sealed};
use kvwasm_fabric::handoff;
use kvwasm_fabric::{ChunkHash, Key, Limits, SendOptions, Server, Transport, send, send_keyed};
use kvwasm_host::{KvError, StoreHandle};
use kvwasm_mrdn::{HEADER_LEN, Tier};
use kvwasm_tests::{fs_uri, pattern};

const OK: u8 = 0;
const NOT_FOUND: u8 = 1;
const REFUSED: u8 = 2;

fn open(dir: &Path) -> Arc<StoreHandle> {
    kvwasm_host::open(&fs_uri(dir)).expect("open the fs store")
}

/// A server on 127.0.0.1:0 storing into `dir`, running on its own thread.
fn start(dir: &Path, limits: Limits) -> (SocketAddr, Arc<Server>) {
    start_keyed(dir, limits, None)
}

/// [`start`], with a key.
fn start_keyed(dir: &Path, limits: Limits, key: Option<Key>) -> (SocketAddr, Arc<Server>) {
    let server = Arc::new(Server::bind_keyed("127.0.0.1:0", open(dir), limits, key).unwrap());
    let addr = server.local_addr().unwrap();
    let running = server.clone();
    std::thread::spawn(move || running.run());
    (addr, server)
}

/// A reply: OK with its payload, or a status and message.
type Reply = Result<Vec<u8>, (u8, String)>;

/// The client side of the link, one request at a time (or pipelined with `send_*` + `read_*`).
struct Link(TcpStream);

impl Link {
    fn connect(addr: SocketAddr) -> Link {
        let mut link = Link::raw(addr);
        link.0.write_all(b"KVFL\x01\0\0\0").unwrap();
        let mut hello = [0; 8];
        link.0.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"KVFL\x01\0\0\0");
        link
    }

    fn raw(addr: SocketAddr) -> Link {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Link(stream)
    }

    fn send_request(&mut self, op: u8, arg: u64, frame: &[u8]) {
        let mut request = vec![op];
        request.extend_from_slice(&arg.to_le_bytes());
        request.extend_from_slice(frame);
        self.0.write_all(&request).unwrap();
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0; 8];
        self.0.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    }

    /// Reads one response; `ok_len` is the payload of an OK: `Some(n)` bytes, or `None` for a
    /// u64 length then that many bytes (PULL).
    fn read_reply(&mut self, ok_len: Option<usize>) -> Reply {
        let mut status = [0];
        self.0.read_exact(&mut status).unwrap();
        if status[0] != OK {
            let mut len = [0; 2];
            self.0.read_exact(&mut len).unwrap();
            let mut message = vec![0; u16::from_le_bytes(len).into()];
            self.0.read_exact(&mut message).unwrap();
            return Err((status[0], String::from_utf8(message).unwrap()));
        }
        let len = ok_len.unwrap_or_else(|| self.u64() as usize);
        let mut payload = vec![0; len];
        self.0.read_exact(&mut payload).unwrap();
        Ok(payload)
    }

    fn push(&mut self, frame: &[u8]) -> Reply {
        self.send_request(1, frame.len() as u64, frame);
        self.read_reply(Some(8))
    }

    fn pull(&mut self, handle: u64) -> Reply {
        self.send_request(2, handle, b"");
        self.read_reply(None)
    }

    fn release(&mut self, handle: u64) -> Reply {
        self.send_request(3, handle, b"");
        self.read_reply(Some(0))
    }

    /// Whether the server has closed the connection (reads EOF or a reset within 20 s).
    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        match self.0.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[derive(Debug)]
struct LinkError(u8, String);

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {}: {}", self.0, self.1)
    }
}

impl std::error::Error for LinkError {}

/// The test's fabric: the link protocol spoken natively.
struct LinkTransport(Mutex<Link>);

impl LinkTransport {
    fn connect(addr: SocketAddr) -> LinkTransport {
        LinkTransport(Mutex::new(Link::connect(addr)))
    }

    fn call(&self, f: impl FnOnce(&mut Link) -> Reply) -> Result<Vec<u8>, LinkError> {
        f(&mut self.0.lock().unwrap()).map_err(|(status, message)| LinkError(status, message))
    }
}

impl Transport for LinkTransport {
    type Error = LinkError;

    fn push(&self, frame: &[u8]) -> Result<u64, LinkError> {
        let handle = self.call(|l| l.push(frame))?;
        Ok(u64::from_le_bytes(handle.try_into().unwrap()))
    }

    fn pull(&self, handle: u64) -> Result<Vec<u8>, LinkError> {
        self.call(|l| l.pull(handle))
    }

    fn release(&self, handle: u64) -> Result<(), LinkError> {
        self.call(|l| l.release(handle)).map(drop)
    }
}

/// `count` distinct chunks of `size` bytes and their 8-byte keys.
fn chunks(count: usize, size: usize, seed: u64) -> Vec<([u8; 8], Vec<u8>)> {
    (0..count as u64)
        .map(|i| {
            let data = pattern(size, seed + i);
            (kvwasm_tests::xxh3_key(&data), data)
        })
        .collect()
}

/// A demo-format manifest naming `chunks`.
fn demo_manifest(chunks: &[([u8; 8], Vec<u8>)]) -> Vec<u8> {
    let mut m = b"ggsq".to_vec();
    for word in [4, 1000, chunks.len() as u32] {
        m.extend_from_slice(&word.to_le_bytes());
    }
    for (key, _) in chunks {
        m.extend_from_slice(key);
    }
    m
}

fn frame(body: &[u8]) -> Vec<u8> {
    kvwasm_mrdn::encode(Tier::ThinkActive, body).unwrap()
}

fn chunk_frame(hash: &[u8], data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    handoff::encode_chunk(hash, data, &mut body).unwrap();
    frame(&body)
}

fn manifest_frame(name: &str, chunks: &[&[u8]], data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    handoff::encode_manifest(name, chunks.iter().copied(), data, &mut body).unwrap();
    frame(&body)
}

/// The frame of the answer to the query framed with checksum `query`.
fn answer_frame(query: &[u8; 16], bits: &[bool]) -> Vec<u8> {
    let mut body = Vec::new();
    handoff::encode_answer(query, bits.len(), |i| bits[i], &mut body).unwrap();
    frame(&body)
}

fn absent(store: &StoreHandle, hash: &[u8]) -> bool {
    matches!(store.get_chunk(hash), Err(KvError::NotFound))
}

fn options(manifest: &str) -> SendOptions {
    SendOptions {
        manifest: manifest.into(),
        hashes: None,
        tier: Tier::ThinkComplete,
    }
}

#[test]
fn a_slot_lands_byte_identical_and_a_second_send_sends_nothing() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(a.path());
    let slot = chunks(48, 64 << 10, 1);
    for (key, data) in &slot {
        source.put_chunk(key, data).unwrap();
    }
    let manifest = demo_manifest(&slot);
    source.put_manifest("slot", &manifest).unwrap();
    // The receiver already holds the first 16: the query must spare them.
    let target = open(b.path());
    for (key, data) in &slot[..16] {
        target.put_chunk(key, data).unwrap();
    }
    let (addr, server) = start(b.path(), Limits::default());

    let report = send(&source, &LinkTransport::connect(addr), &options("slot")).unwrap();
    assert_eq!((report.chunks, report.sent, report.skipped), (48, 32, 16));
    assert_eq!(report.chunk_bytes_sent, 32 << 16);
    let frames = 32 * (HEADER_LEN + 5 + 8 + (64 << 10)) // chunks
        + HEADER_LEN + 8 + 48 * 9 // the query
        + HEADER_LEN + 6 + 4 + 4 + 48 * 9 + manifest.len(); // the manifest
    assert_eq!(report.frame_bytes, frames as u64);
    assert_eq!(report.to_json()["sent"], 32);

    // Read through a fresh handle: on disk, not just in the server's handle.
    let landed = open(b.path());
    for (key, data) in &slot {
        assert_eq!(landed.get_chunk(key).unwrap().as_slice(), &data[..]);
    }
    assert_eq!(
        landed.get_manifest("slot").unwrap().as_slice(),
        &manifest[..]
    );

    let again = send(&source, &LinkTransport::connect(addr), &options("slot")).unwrap();
    assert_eq!(
        (again.sent, again.skipped, again.chunk_bytes_sent),
        (0, 48, 0)
    );

    let stats = server.stats();
    assert_eq!(stats.chunks_stored, 32);
    assert_eq!(stats.chunk_bytes_stored, 32 << 16);
    assert_eq!((stats.queries, stats.manifests_stored), (2, 2));
    assert_eq!((stats.frames_ok, stats.frames_refused), (32 + 2 + 2, 0));
}

#[test]
fn a_send_names_a_refused_chunk_and_publishes_no_manifest() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(a.path());
    let slot = chunks(3, 2 << 20, 7);
    for (key, data) in &slot {
        source.put_chunk(key, data).unwrap();
    }
    source.put_manifest("slot", &demo_manifest(&slot)).unwrap();
    let limits = Limits {
        max_frame_bytes: 1 << 20,
        ..Limits::default()
    };
    let (addr, _server) = start(b.path(), limits);
    let err = send(&source, &LinkTransport::connect(addr), &options("slot")).unwrap_err();
    assert!(err.to_string().contains("push chunk"), "{err}");
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
    assert!(matches!(
        open(b.path()).get_manifest("slot"),
        Err(KvError::NotFound)
    ));
}

/// One valid chunk frame and variants of it that are each refused.
fn bad_frames(hash: &[u8], data: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let good = chunk_frame(hash, data);
    let mut flipped = good.clone();
    flipped[HEADER_LEN + 20] ^= 0x10;
    let mut magic = good.clone();
    magic[..4].copy_from_slice(b"MRDX");
    let mut v2 = good.clone();
    v2[4] = 2;
    let mut huge = good.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut unknown_kind = good.clone();
    unknown_kind[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(b"KVZ1");
    let unknown_kind = frame(&unknown_kind[HEADER_LEN..]);
    let mut bad_hash_len = good[HEADER_LEN..].to_vec();
    bad_hash_len[4] = 65;
    let mut trailing = good.clone();
    trailing.push(0);
    vec![
        ("checksum mismatch", flipped),
        (
            "body shorter than body_len",
            good[..good.len() - 1].to_vec(),
        ),
        ("bad magic", magic),
        ("version mismatch", v2),
        ("of 4294967295 bytes", huge),
        ("unknown message kind", unknown_kind),
        ("hash length 65", frame(&bad_hash_len)),
        ("trailing bytes", trailing),
        ("truncated header", good[..20].to_vec()),
    ]
}

#[test]
fn bad_frames_are_refused_before_anything_lands_and_poison_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, server) = start(dir.path(), Limits::default());
    let store = open(dir.path());
    let (hash, data) = (b"bad-frame-hash", pattern(2000, 3));
    let cases = bad_frames(hash, &data);
    for (i, (why, frame)) in cases.iter().enumerate() {
        let mut link = Link::connect(addr);
        let (status, message) = link.push(frame).unwrap_err();
        assert_eq!(status, REFUSED, "{why}: {message}");
        assert!(message.contains(why), "{why}: {message}");
        assert!(absent(&store, hash), "{why}: the chunk landed");
        // Poisoned: the manifest is refused; a chunk still lands.
        let manifest = manifest_frame("slot", &[hash], b"names the lost chunk");
        let (status, message) = link.push(&manifest).unwrap_err();
        assert_eq!(status, REFUSED);
        assert_eq!(message, "an earlier frame on this connection failed");
        let (other, data) = (format!("other-{i}"), pattern(100, 1000 + i as u64));
        assert!(
            link.push(&chunk_frame(other.as_bytes(), &data)).is_ok(),
            "{why}"
        );
        assert_eq!(
            store.get_chunk(other.as_bytes()).unwrap().as_slice(),
            &data[..]
        );
        assert!(matches!(store.get_manifest("slot"), Err(KvError::NotFound)));
    }
    // The same frames, unbroken, land (so each refusal was the fault, not the frame).
    let mut link = Link::connect(addr);
    link.push(&chunk_frame(hash, &data)).unwrap();
    link.push(&manifest_frame("slot", &[hash], b"m")).unwrap();
    assert_eq!(store.get_chunk(hash).unwrap().as_slice(), &data[..]);
    let stats = server.stats();
    assert_eq!(stats.frames_refused, 2 * cases.len() as u64);
    assert_eq!(stats.frames_ok, cases.len() as u64 + 2);
}

#[test]
fn an_oversized_push_is_refused_unread_and_the_connection_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _server) = start(dir.path(), Limits::default());
    let mut link = Link::connect(addr);
    // 4 GiB - 1 declared, nothing sent: the server answers without waiting for the body.
    link.send_request(1, u32::MAX as u64, b"");
    let (status, message) = link.read_reply(Some(8)).unwrap_err();
    assert_eq!(status, REFUSED);
    assert!(
        message.contains("4294967295 bytes exceeds the limit of 67108864"),
        "{message}"
    );
    assert!(link.closed());
    // A client that writes the whole oversized frame before reading still reads why (the
    // server discards its input instead of resetting the connection under it).
    let mut link = Link::connect(addr);
    link.send_request(1, 96 << 20, &vec![0; 96 << 20]);
    let (status, message) = link.read_reply(Some(8)).unwrap_err();
    assert_eq!(status, REFUSED);
    assert!(
        message.contains("100663296 bytes exceeds the limit"),
        "{message}"
    );
    assert!(link.closed());
}

#[test]
fn a_protocol_fault_after_a_quiet_spell_is_still_explained() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        io_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let (addr, _server) = start(dir.path(), limits);
    let mut link = Link::connect(addr);
    link.push(&chunk_frame(b"k", b"v")).unwrap();
    // Longer than the I/O timeout, well within the idle one: the last response's deadline is
    // long past when the fault is answered.
    std::thread::sleep(Duration::from_millis(600));
    link.send_request(9, 0, b"");
    let (status, message) = link.read_reply(Some(0)).unwrap_err();
    assert_eq!(
        (status, message.as_str()),
        (REFUSED, "unknown request op 9")
    );
    assert!(link.closed());
}

#[test]
fn handles_count_pushes_in_order_and_answers_come_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _server) = start(dir.path(), Limits::default());
    let mut link = Link::connect(addr);
    let data = pattern(5000, 9);
    let good = chunk_frame(b"k", &data);
    let mut query = Vec::new();
    handoff::encode_query([&b"k"[..], b"nope"].into_iter(), &mut query).unwrap();
    let query_sum = kvwasm_mrdn::checksum(&query);
    // Pipelined: every request written before any response is read.
    link.send_request(1, good.len() as u64, &good); // handle 1
    link.send_request(1, 3, b"bad"); // handle 2, refused
    link.send_request(1, good.len() as u64, &good); // handle 3
    let query = frame(&query);
    link.send_request(1, query.len() as u64, &query); // handle 4
    link.send_request(2, 3, b"");
    link.send_request(2, 2, b"");
    link.send_request(2, 4, b"");
    link.send_request(3, 1, b"");
    link.send_request(3, 1, b"");
    link.send_request(2, 1, b"");
    assert_eq!(link.read_reply(Some(8)), Ok(1u64.to_le_bytes().to_vec()));
    assert_eq!(link.read_reply(Some(8)).unwrap_err().0, REFUSED);
    assert_eq!(link.read_reply(Some(8)), Ok(3u64.to_le_bytes().to_vec()));
    assert_eq!(link.read_reply(Some(8)), Ok(4u64.to_le_bytes().to_vec()));
    // PULL 3: the chunk read back from the store, framed afresh with the pushed tier.
    assert_eq!(link.read_reply(None), Ok(good));
    assert_eq!(link.read_reply(None).unwrap_err().0, NOT_FOUND);
    let answer = link.read_reply(None).unwrap();
    assert_eq!(answer, answer_frame(&query_sum, &[true, false]));
    assert_eq!(link.read_reply(Some(0)), Ok(vec![]));
    assert_eq!(link.read_reply(Some(0)).unwrap_err().0, NOT_FOUND);
    assert_eq!(link.read_reply(None).unwrap_err().0, NOT_FOUND);
}

#[test]
fn a_bad_hello_is_answered_then_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _server) = start(dir.path(), Limits::default());
    let mut link = Link::raw(addr);
    link.0.write_all(b"KVFL\x02\0\0\0").unwrap();
    let (status, message) = link.read_reply(Some(0)).unwrap_err();
    assert_eq!(status, REFUSED);
    assert_eq!(
        message,
        "link version 2 is not supported (this server speaks 1)"
    );
    assert!(link.closed());
}

#[test]
fn stalled_and_idle_clients_are_dropped_while_others_are_served() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let limits = Limits {
        io_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(1500),
        ..Limits::default()
    };
    let (addr, _server) = start(b.path(), limits);
    let started = Instant::now();
    let mut idle = Link::connect(addr);
    let mut stalled = Link::connect(addr);
    let frame = chunk_frame(b"stalled", &pattern(1000, 5));
    stalled.send_request(1, frame.len() as u64, &frame[..500]);

    let source = open(a.path());
    let slot = chunks(4, 1000, 11);
    for (key, data) in &slot {
        source.put_chunk(key, data).unwrap();
    }
    source.put_manifest("slot", &demo_manifest(&slot)).unwrap();
    let report = send(&source, &LinkTransport::connect(addr), &options("slot")).unwrap();
    assert_eq!(report.sent, 4);

    assert!(stalled.closed());
    let stalled_for = started.elapsed();
    assert!(idle.closed());
    let idle_for = started.elapsed();
    assert!(stalled_for < Duration::from_secs(10), "{stalled_for:?}");
    assert!(idle_for >= Duration::from_millis(1500), "{idle_for:?}");
    assert!(idle_for < Duration::from_secs(10), "{idle_for:?}");
    assert!(absent(&open(b.path()), b"stalled"));
}

#[test]
fn connections_over_the_cap_are_refused_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let (addr, server) = start(dir.path(), limits);
    let first = Link::connect(addr);
    let mut second = Link::raw(addr);
    let (status, message) = second.read_reply(Some(0)).unwrap_err();
    assert_eq!(status, REFUSED);
    assert_eq!(
        message,
        "server busy: 1 connections open (--max-connections)"
    );
    drop(first);
    // The first connection's thread notices the close shortly; then a place is free.
    assert!(
        admitted_within(addr, Duration::from_secs(10)),
        "the closed connection's place was never freed"
    );
    assert!(server.stats().connections >= 3);
}

/// Whether a new connection is admitted (its hello echoed) within `limit`, trying every 20 ms.
fn admitted_within(addr: SocketAddr, limit: Duration) -> bool {
    let admitted = || {
        let mut next = Link::raw(addr);
        let mut echo = [0; 8];
        next.0.write_all(b"KVFL\x01\0\0\0").is_ok()
            && next.0.read_exact(&mut echo).is_ok()
            && &echo == b"KVFL\x01\0\0\0"
    };
    let deadline = Instant::now() + limit;
    while !admitted() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Runs `drip` on its own thread for at most 8 s (it returns false to stop early).
fn dripping(mut drip: impl FnMut() -> bool + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(8);
        while Instant::now() < until && drip() {}
    })
}

#[test]
fn a_client_trickling_a_request_is_dropped_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        io_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..Limits::default()
    };
    let (addr, _server) = start(dir.path(), limits);
    // A 100 kB frame declared, then a byte every 100 ms: never a 300 ms stall, but the
    // request is due 300 ms + 100 kB at 1 MiB/s after it began.
    let mut link = Link::connect(addr);
    link.send_request(1, 100_000, b"");
    let drip = dripping(move || {
        std::thread::sleep(Duration::from_millis(100));
        link.0.write_all(b"x").is_ok()
    });
    assert!(
        admitted_within(addr, Duration::from_secs(5)),
        "the trickling client kept the only place"
    );
    drip.join().unwrap();
}

#[test]
fn a_client_trickling_a_response_out_is_dropped_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        io_timeout: Duration::from_millis(300),
        max_connections: 1,
        min_bytes_per_s: 64 << 20,
        ..Limits::default()
    };
    let (addr, _server) = start(dir.path(), limits);
    let mut link = Link::connect(addr);
    let handle = link
        .push(&chunk_frame(b"big", &pattern(32 << 20, 8)))
        .unwrap();
    // 16 KiB every 10 ms: the 32 MiB reply takes ~20 s, but is due 300 ms + 0.5 s after it
    // was framed.
    link.send_request(2, u64::from_le_bytes(handle.try_into().unwrap()), b"");
    let mut buf = vec![0; 16 << 10];
    let drip = dripping(move || {
        std::thread::sleep(Duration::from_millis(10));
        matches!(link.0.read(&mut buf), Ok(1..))
    });
    assert!(
        admitted_within(addr, Duration::from_secs(5)),
        "the trickling client kept the only place"
    );
    drip.join().unwrap();
}

#[test]
fn other_manifest_formats_are_sent_with_a_hash_list() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(a.path());
    // 32-byte hashes, listed with a repeat; the manifest is opaque text.
    let slot: Vec<(Vec<u8>, Vec<u8>)> = (0..5u64)
        .map(|i| (kvwasm_tests::hash_of_len(32, i), pattern(3000, 50 + i)))
        .collect();
    for (hash, data) in &slot {
        source.put_chunk(hash, data).unwrap();
    }
    source
        .put_manifest("crash-slot", b"not a demo manifest")
        .unwrap();
    let (addr, _server) = start(b.path(), Limits::default());

    let demo = send(
        &source,
        &LinkTransport::connect(addr),
        &options("crash-slot"),
    );
    let err = demo.unwrap_err().to_string();
    assert!(err.contains("is not the demo manifest's"), "{err}");
    assert!(err.contains("--hashes"), "{err}");

    let mut listed: Vec<Vec<u8>> = slot.iter().map(|(h, _)| h.clone()).collect();
    listed.push(slot[2].0.clone());
    let options = SendOptions {
        hashes: Some(listed),
        ..options("crash-slot")
    };
    let report = send(&source, &LinkTransport::connect(addr), &options).unwrap();
    assert_eq!((report.chunks, report.sent), (5, 5));
    let landed = open(b.path());
    for (hash, data) in &slot {
        assert_eq!(landed.get_chunk(hash).unwrap().as_slice(), &data[..]);
    }
    assert_eq!(
        landed.get_manifest("crash-slot").unwrap().as_slice(),
        b"not a demo manifest"
    );
}

/// What a [`Tamper`] fabric does with a pushed frame: passes it on (or another frame in its
/// place), or drops it and makes up a handle.
type Pushed = Box<dyn Fn(&[u8]) -> Option<Vec<u8>>>;

/// Handles a [`Tamper`] makes up for frames it drops start here.
const MADE_UP: u64 = 1 << 40;

/// A fabric that hands back `pulled(frame)` instead of what the receiver sent (an empty
/// `frame` for a handle it made up), may alter or drop pushes, counts pushes and tracks the
/// handles it holds.
struct Tamper<F> {
    link: LinkTransport,
    pulled: F,
    pushed: Pushed,
    pushes: std::sync::atomic::AtomicUsize,
    live: Mutex<std::collections::HashSet<u64>>,
}

impl<F: Fn(Vec<u8>) -> Vec<u8>> Tamper<F> {
    fn connect(addr: SocketAddr, pulled: F) -> Tamper<F> {
        Tamper {
            link: LinkTransport::connect(addr),
            pulled,
            pushed: Box::new(|frame| Some(frame.to_vec())),
            pushes: Default::default(),
            live: Default::default(),
        }
    }

    /// The same fabric, doing `pushed` with each pushed frame.
    fn pushing(self, pushed: impl Fn(&[u8]) -> Option<Vec<u8>> + 'static) -> Tamper<F> {
        Tamper {
            pushed: Box::new(pushed),
            ..self
        }
    }

    /// The send's error, the pushes, and the handles it left unreleased.
    fn send_fails(self, source: &StoreHandle, options: &SendOptions) -> (String, usize, usize) {
        self.send_keyed_fails(source, options, None)
    }

    /// [`Tamper::send_fails`], the send keyed with `key`.
    fn send_keyed_fails(
        self,
        source: &StoreHandle,
        options: &SendOptions,
        key: Option<&Key>,
    ) -> (String, usize, usize) {
        let err = send_keyed(source, &self, options, key)
            .unwrap_err()
            .to_string();
        let live = self.live.lock().unwrap().len();
        (err, self.pushes.into_inner(), live)
    }
}

impl<F: Fn(Vec<u8>) -> Vec<u8>> Transport for Tamper<F> {
    type Error = LinkError;

    fn push(&self, frame: &[u8]) -> Result<u64, LinkError> {
        let n = self
            .pushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = match (self.pushed)(frame) {
            Some(frame) => self.link.push(&frame)?,
            None => MADE_UP + n as u64,
        };
        self.live.lock().unwrap().insert(handle);
        Ok(handle)
    }

    fn pull(&self, handle: u64) -> Result<Vec<u8>, LinkError> {
        if handle >= MADE_UP {
            return Ok((self.pulled)(Vec::new()));
        }
        self.link.pull(handle).map(&self.pulled)
    }

    fn release(&self, handle: u64) -> Result<(), LinkError> {
        self.live.lock().unwrap().remove(&handle);
        if handle >= MADE_UP {
            return Ok(());
        }
        self.link.release(handle)
    }
}

/// The message of a frame (panics on anything else: for frames the receiver sent).
fn message(frame: &[u8]) -> handoff::Message<'_> {
    handoff::parse(kvwasm_mrdn::decode(frame).unwrap().body).unwrap()
}

/// A source store in `dir` holding a demo slot of `count` chunks of `size` bytes.
fn source_slot(dir: &Path, count: usize, size: usize, seed: u64) -> Arc<StoreHandle> {
    let source = open(dir);
    let slot = chunks(count, size, seed);
    for (key, data) in &slot {
        source.put_chunk(key, data).unwrap();
    }
    source.put_manifest("slot", &demo_manifest(&slot)).unwrap();
    source
}

#[test]
fn the_sender_decodes_every_reply_strictly_and_releases_what_it_holds() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = source_slot(a.path(), 4, 1000, 21);
    let (addr, _server) = start(b.path(), Limits::default());
    let run = |pulled: fn(Vec<u8>) -> Vec<u8>| {
        Tamper::connect(addr, pulled).send_fails(&source, &options("slot"))
    };

    // A bit flipped in the answer: caught, nothing but the query pushed, its handle released.
    let (err, pushes, live) = run(|mut f| {
        f[HEADER_LEN + 8] ^= 1;
        f
    });
    assert!(
        err.starts_with("pull answer: the fabric returned a bad frame: checksum mismatch"),
        "{err}"
    );
    assert_eq!((pushes, live), (1, 0));
    // A valid answer to this query, but of another length.
    let (err, pushes, live) = run(|f| match message(&f) {
        handoff::Message::Answer(a) => answer_frame(a.query(), &[false; 5]),
        _ => f,
    });
    assert_eq!(
        err,
        "pull answer: unexpected reply: an answer of 5 bits, expected an answer for the query"
    );
    assert_eq!((pushes, live), (1, 0));
    let target = open(b.path());
    assert!(
        chunks(4, 1000, 21)
            .iter()
            .all(|(key, _)| absent(&target, key))
    );
    // The manifest read back differs from the one sent: the send fails.
    let (err, pushes, live) = run(|f| match message(&f) {
        handoff::Message::Manifest { .. } => manifest_frame("slot", &[], b"other bytes"),
        _ => f,
    });
    assert_eq!(
        err,
        "pull manifest: unexpected reply: manifest \"slot\" (11 bytes), expected the manifest as sent"
    );
    assert_eq!((pushes, live), (1 + 4 + 1, 0));
}

#[test]
fn a_fabric_forging_all_present_cannot_publish_a_dangling_manifest() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = source_slot(a.path(), 4, 1000, 31);
    let (addr, server) = start(b.path(), Limits::default());
    // The hostile fabric answers for the receiver: a valid frame, bound to the right query,
    // saying every chunk is already there.
    let forge = |f: Vec<u8>| match message(&f) {
        handoff::Message::Answer(a) => answer_frame(a.query(), &vec![true; a.len()]),
        _ => f,
    };
    let (err, pushes, live) = Tamper::connect(addr, forge).send_fails(&source, &options("slot"));
    let first = hex::encode(chunks(1, 1000, 31)[0].0);
    assert_eq!(
        err,
        format!(
            "fabric: push manifest: status 2: manifest \"slot\" names 4 chunks this store \
             lacks, first {first}"
        )
    );
    assert_eq!((pushes, live), (2, 0), "the query, then the manifest alone");
    assert!(matches!(
        open(b.path()).get_manifest("slot"),
        Err(KvError::NotFound)
    ));
    assert_eq!(server.stats().manifests_stored, 0);
    // The honest send afterwards lands the slot.
    let report = send(&source, &LinkTransport::connect(addr), &options("slot")).unwrap();
    assert_eq!(report.sent, 4);
    assert!(open(b.path()).get_manifest("slot").is_ok());
}

#[test]
fn a_replayed_answer_is_refused_by_the_sender() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(a.path());
    // Two full query batches of the same length, so only the binding tells their answers apart.
    let hashes: Vec<Vec<u8>> = (0..2 * kvwasm_fabric::send::QUERY_BATCH as u64)
        .map(|i| i.to_le_bytes().to_vec())
        .collect();
    source.put_manifest("slot", b"opaque").unwrap();
    let (addr, _server) = start(b.path(), Limits::default());
    let first = Mutex::new(None);
    let replay = |f: Vec<u8>| {
        let mut first = first.lock().unwrap();
        first.get_or_insert(f).clone()
    };
    let options = SendOptions {
        hashes: Some(hashes),
        ..options("slot")
    };
    let (err, pushes, live) = Tamper::connect(addr, replay).send_fails(&source, &options);
    assert!(
        err.starts_with("pull answer: unexpected reply: an answer to another query (checksum "),
        "{err}"
    );
    assert_eq!((pushes, live), (2, 0));
}

#[test]
fn the_receiver_publishes_a_manifest_only_when_it_holds_every_chunk_listed() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, server) = start(dir.path(), Limits::default());
    let store = open(dir.path());
    store.put_chunk(b"old", b"stored before").unwrap();
    store
        .put_chunk(b"asked", b"stored before, queried")
        .unwrap();
    // Present in the store (read at the manifest), stored on this connection, answered
    // present on this connection: all count.
    let mut link = Link::connect(addr);
    link.push(&chunk_frame(b"new", b"pushed")).unwrap();
    let mut query = Vec::new();
    handoff::encode_query([&b"asked"[..]].into_iter(), &mut query).unwrap();
    link.push(&frame(&query)).unwrap();
    let listed: [&[u8]; 3] = [b"old", b"new", b"asked"];
    link.push(&manifest_frame("good", &listed, b"m")).unwrap();
    assert_eq!(store.get_manifest("good").unwrap().as_slice(), b"m");
    // One chunk lacking: refused, nothing published.
    let (status, message) = link
        .push(&manifest_frame("bad", &[b"new", b"missing", b"gone"], b"m"))
        .unwrap_err();
    assert_eq!(status, REFUSED);
    assert_eq!(
        message,
        format!(
            "manifest \"bad\" names 2 chunks this store lacks, first {}",
            hex::encode(b"missing")
        )
    );
    assert!(matches!(store.get_manifest("bad"), Err(KvError::NotFound)));
    assert_eq!(server.stats().manifests_stored, 1);
}

#[test]
fn a_query_repeating_one_hash_reads_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _server) = start(dir.path(), Limits::default());
    let big = pattern(8 << 20, 77);
    open(dir.path()).put_chunk(b"big", &big).unwrap();
    // 4096 × an 8 MiB chunk: 32 GiB of reads if each entry read the store.
    let listed: Vec<&[u8]> = [&b"big"[..], b"gone"].repeat(4096);
    let mut query = Vec::new();
    handoff::encode_query(listed.iter().copied(), &mut query).unwrap();
    let read = || -> u64 {
        kvwasm_host::metrics::snapshot()
            .values()
            .map(|c| c.bytes_out)
            .sum()
    };
    let before = read();
    let mut link = Link::connect(addr);
    let handle = u64::from_le_bytes(link.push(&frame(&query)).unwrap().try_into().unwrap());
    let bits: Vec<bool> = (0..listed.len()).map(|i| i % 2 == 0).collect();
    let answer = link.pull(handle).unwrap();
    assert_eq!(answer, answer_frame(&kvwasm_mrdn::checksum(&query), &bits));
    // Other tests in this process read too, but far less than a second copy of every entry.
    let read = read() - before;
    assert!(read < 1 << 30, "{read} bytes read for one query");
}

#[test]
fn live_handles_and_what_they_keep_are_capped_per_connection() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_live_handles: 3,
        max_frame_bytes: 300,
        ..Limits::default()
    };
    let (addr, _server) = start(dir.path(), limits);
    let over = "unreleased handles on this connection would keep more than 300 bytes; release some";
    let mut link = Link::connect(addr);
    let mut query = Vec::new();
    handoff::encode_query([&b"q"[..]].into_iter(), &mut query).unwrap();
    // Each handle costs 64 bytes plus what it keeps: an answer frame (57 bytes), a hash.
    let query = frame(&query);
    assert!(link.push(&query).is_ok()); // 121
    assert!(link.push(&query).is_ok()); // 242
    assert_eq!(link.push(&query), Err((REFUSED, over.to_owned())));
    link.release(1).unwrap(); // 121
    assert_eq!(
        link.push(&chunk_frame(&[b'c'; 64], b"")).unwrap(), // 249
        4u64.to_le_bytes()
    );
    assert_eq!(
        link.push(&chunk_frame(b"d", b"")),
        Err((REFUSED, over.to_owned()))
    );
    assert!(absent(&open(dir.path()), b"d"), "refused before storing");
    link.release(4).unwrap(); // 121
    assert!(link.push(&chunk_frame(b"d", b"")).is_ok()); // 186
    assert!(link.push(&chunk_frame(b"e", b"")).is_ok()); // 251, 3 live
    let (status, message) = link.push(&chunk_frame(b"f", b"")).unwrap_err();
    assert_eq!(status, REFUSED);
    assert_eq!(message, "3 live handles on this connection; release some");
    link.release(2).unwrap();
    assert_eq!(
        link.push(&chunk_frame(b"f", b"")).unwrap(),
        9u64.to_le_bytes()
    );
    // A manifest's name counts too.
    let mut link = Link::connect(addr);
    assert!(
        link.push(&manifest_frame(&"n".repeat(200), &[], b""))
            .is_ok()
    ); // 264
    assert_eq!(
        link.push(&chunk_frame(b"g", b"")),
        Err((REFUSED, over.to_owned()))
    );
    link.release(1).unwrap();
    assert!(link.push(&chunk_frame(b"g", b"")).is_ok());
}

/// The key both hosts share in these tests (or another one, `byte` ≠ 1).
fn key(byte: u8) -> Key {
    Key::new([byte; auth::KEY_LEN])
}

/// The frame `frame` with its body replaced by `edit(body)`, framed afresh (valid MRDN, as a
/// guest can make it).
fn reframe(frame: &[u8], edit: impl FnOnce(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let decoded = kvwasm_mrdn::decode(frame).unwrap();
    kvwasm_mrdn::encode(decoded.tier, &edit(decoded.body)).unwrap()
}

/// The wrapper of a keyed frame and its inner message.
fn unwrap(frame: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let body = kvwasm_mrdn::decode(frame).unwrap().body;
    let (head, inner) = body.split_at(auth::WRAP_LEN);
    (head.to_vec(), inner.to_vec())
}

/// A frame of `body` wrapped for the server with `key` and these nonces, as a sender makes it.
fn keyed_frame(key: &Key, sender: auth::Nonce, server: auth::Nonce, body: &[u8]) -> Vec<u8> {
    let envelope = Envelope {
        key,
        direction: Direction::ToServer,
        tier: Tier::ThinkActive,
        sender,
        server,
    };
    let mut wrapped = Vec::new();
    Envelope::append(Some(&envelope), &mut wrapped, |out| {
        out.extend_from_slice(body);
        Ok::<_, ()>(())
    })
    .unwrap();
    frame(&wrapped)
}

#[test]
fn a_keyed_send_lands_byte_identical_and_a_second_keyed_send_sends_nothing() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(a.path());
    let slot = chunks(24, 64 << 10, 41);
    for (key, data) in &slot {
        source.put_chunk(key, data).unwrap();
    }
    let manifest = demo_manifest(&slot);
    source.put_manifest("slot", &manifest).unwrap();
    let target = open(b.path());
    for (key, data) in &slot[..8] {
        target.put_chunk(key, data).unwrap();
    }
    let (addr, server) = start_keyed(b.path(), Limits::default(), Some(key(1)));
    let keyed =
        |fabric: &LinkTransport| send_keyed(&source, fabric, &options("slot"), Some(&key(1)));

    let report = keyed(&LinkTransport::connect(addr)).unwrap();
    assert_eq!((report.chunks, report.sent, report.skipped), (24, 16, 8));
    // Every frame carries the 68-byte wrapper: the query, 16 chunks, the manifest.
    let frames = 16 * (HEADER_LEN + 5 + 8 + (64 << 10))
        + HEADER_LEN
        + 8
        + 24 * 9
        + HEADER_LEN
        + 6
        + 4
        + 4
        + 24 * 9
        + manifest.len();
    assert_eq!(report.frame_bytes, (frames + 18 * auth::WRAP_LEN) as u64);
    let landed = open(b.path());
    for (key, data) in &slot {
        assert_eq!(landed.get_chunk(key).unwrap().as_slice(), &data[..]);
    }
    assert_eq!(
        landed.get_manifest("slot").unwrap().as_slice(),
        &manifest[..]
    );

    let again = keyed(&LinkTransport::connect(addr)).unwrap();
    assert_eq!(
        (again.sent, again.skipped, again.chunk_bytes_sent),
        (0, 24, 0)
    );
    let stats = server.stats();
    assert_eq!((stats.chunks_stored, stats.manifests_stored), (16, 2));
    assert_eq!(stats.frames_refused, 0);

    // A manifest naming no chunk still asks once: the answer brings the connection's nonce.
    source.put_manifest("empty", b"no chunks").unwrap();
    let options = SendOptions {
        hashes: Some(Vec::new()),
        ..options("empty")
    };
    let empty = send_keyed(
        &source,
        &LinkTransport::connect(addr),
        &options,
        Some(&key(1)),
    );
    assert_eq!(empty.unwrap().sent, 0);
    assert_eq!(
        landed.get_manifest("empty").unwrap().as_slice(),
        b"no chunks"
    );
}

#[test]
fn a_keyed_sender_refuses_forged_and_replayed_answers() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = source_slot(a.path(), 4, 1000, 51);
    let (addr, _server) = start_keyed(b.path(), Limits::default(), Some(key(1)));
    let run = |pulled: Box<dyn Fn(Vec<u8>) -> Vec<u8>>| {
        Tamper::connect(addr, pulled).send_keyed_fails(&source, &options("slot"), Some(&key(1)))
    };
    // "All present", with the wrapper kept (the guest cannot make its tag) ...
    let forged = run(Box::new(|f| {
        reframe(&f, |body| {
            let (head, inner) = body.split_at(auth::WRAP_LEN);
            let handoff::Message::Answer(a) = handoff::parse(inner).unwrap() else {
                panic!("not an answer")
            };
            let mut forged = head.to_vec();
            handoff::encode_answer(a.query(), a.len(), |_| true, &mut forged).unwrap();
            forged
        })
    }));
    assert_eq!(
        forged,
        (
            "pull answer: unexpected reply: its tag is not the receiver's under this send's key: \
             forged or altered by the fabric, or the receiver has another key"
                .to_owned(),
            1,
            0
        )
    );
    // ... or unwrapped, bound to the right query, as the fabric could forge it without a key.
    let (err, pushes, _) = run(Box::new(|f| {
        let (_, inner) = unwrap(&f);
        let handoff::Message::Answer(a) = handoff::parse(&inner).unwrap() else {
            panic!("not an answer")
        };
        answer_frame(a.query(), &vec![true; a.len()])
    }));
    assert_eq!(
        (err.as_str(), pushes),
        (
            "pull answer: unexpected reply: not wrapped (KVS1), but this send has a key",
            1
        )
    );
    // An answer the receiver really sent, recorded in an earlier keyed send and replayed.
    let recorded = Arc::new(Mutex::new(None));
    let record = recorded.clone();
    let tamper = Tamper::connect(addr, move |f: Vec<u8>| {
        record.lock().unwrap().get_or_insert(f.clone());
        f
    });
    send_keyed(&source, &tamper, &options("slot"), Some(&key(1))).unwrap();
    let answer = recorded.lock().unwrap().clone().unwrap();
    let (err, pushes, live) = run(Box::new(move |_| answer.clone()));
    assert_eq!(
        err,
        "pull answer: unexpected reply: it answers another send (not this send's nonce): \
         replayed by the fabric"
    );
    assert_eq!((pushes, live), (1, 0));
}

#[test]
fn a_replayed_manifest_reply_is_no_success_with_a_key() {
    let scratch = tempfile::tempdir().unwrap();
    let [a, b, c, d, e] = ["a", "b", "c", "d", "e"].map(|d| scratch.path().join(d));
    let source = source_slot(&a, 4, 1000, 61);
    // A fabric that keeps the last frame pulled: the manifest reply.
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let recorder = |addr| {
        let record = recorded.clone();
        Tamper::connect(addr, move |f: Vec<u8>| {
            *record.lock().unwrap() = f.clone();
            f
        })
    };
    // The manifest reply of a keyed send that did happen (to receiver b) ...
    let (addr_b, _b) = start_keyed(&b, Limits::default(), Some(key(1)));
    send_keyed(&source, &recorder(addr_b), &options("slot"), Some(&key(1))).unwrap();
    // ... handed back by a fabric that passes the query on and drops every chunk and the
    // manifest, in a send to receiver c, which lacks the slot.
    let (addr_c, server_c) = start_keyed(&c, Limits::default(), Some(key(1)));
    let liar = |addr| {
        let replay = recorded.lock().unwrap().clone();
        let pushes = std::cell::Cell::new(0);
        Tamper::connect(
            addr,
            move |f: Vec<u8>| if f.is_empty() { replay.clone() } else { f },
        )
        .pushing(move |f| {
            pushes.set(pushes.get() + 1);
            (pushes.get() == 1).then(|| f.to_vec())
        })
    };
    let (err, pushes, live) =
        liar(addr_c).send_keyed_fails(&source, &options("slot"), Some(&key(1)));
    assert_eq!(
        err,
        "pull manifest: unexpected reply: it answers another send (not this send's nonce): \
         replayed by the fabric"
    );
    assert_eq!((pushes, live), (1 + 4 + 1, 0));
    assert!(matches!(
        open(&c).get_manifest("slot"),
        Err(KvError::NotFound)
    ));
    assert_eq!(server_c.stats().chunks_stored, 0);

    // Without a key the same lie is a success line for a transfer that did not happen.
    let (addr_d, _d) = start(&d, Limits::default());
    send(&source, &recorder(addr_d), &options("slot")).unwrap();
    let (addr_e, _e) = start(&e, Limits::default());
    let lied = send(&source, &liar(addr_e), &options("slot")).unwrap();
    assert_eq!(lied.sent, 4, "reported sent");
    assert!(matches!(
        open(&e).get_manifest("slot"),
        Err(KvError::NotFound)
    ));
}

#[test]
fn a_chunk_reframed_by_the_fabric_is_refused_with_a_key() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let slot = chunks(3, 1000, 71);
    let source = source_slot(a.path(), 3, 1000, 71);
    // The first chunk goes out under another hash, or with other bytes under its own.
    let rehash = |inner: &[u8]| -> Vec<u8> {
        let handoff::Message::Chunk { data, .. } = handoff::parse(inner).unwrap() else {
            return inner.to_vec();
        };
        let mut out = Vec::new();
        handoff::encode_chunk(b"planted", data, &mut out).unwrap();
        out
    };
    let rebytes = |inner: &[u8]| -> Vec<u8> {
        let handoff::Message::Chunk { hash, .. } = handoff::parse(inner).unwrap() else {
            return inner.to_vec();
        };
        let mut out = Vec::new();
        handoff::encode_chunk(hash, b"planted bytes", &mut out).unwrap();
        out
    };
    for (what, edit) in [("hash", rehash as fn(&[u8]) -> Vec<u8>), ("bytes", rebytes)] {
        let (addr, server) = start_keyed(b.path(), Limits::default(), Some(key(1)));
        let first = std::cell::Cell::new(true);
        let tamper = Tamper::connect(addr, |f: Vec<u8>| f).pushing(move |f| {
            let body = kvwasm_mrdn::decode(f).unwrap().body;
            let (head, inner) = body.split_at(auth::WRAP_LEN);
            if !inner.starts_with(b"KVC1") || !first.replace(false) {
                return Some(f.to_vec());
            }
            Some(reframe(f, |_| [head, &edit(inner)].concat()))
        });
        let (err, pushes, live) = tamper.send_keyed_fails(&source, &options("slot"), Some(&key(1)));
        assert_eq!(
            err,
            "fabric: push chunk: status 2: bad tag: the sender's key is not this server's \
             (--key-env), or the message or its tier was altered on the way",
            "{what}"
        );
        assert_eq!((pushes, live), (2, 0), "{what}");
        let target = open(b.path());
        assert!(absent(&target, b"planted"), "{what}");
        assert!(absent(&target, &slot[0].0), "{what}");
        assert!(matches!(
            target.get_manifest("slot"),
            Err(KvError::NotFound)
        ));
        assert_eq!(server.stats().chunks_stored, 0, "{what}");
    }
}

#[test]
fn keyed_messages_are_bound_to_their_connection_and_replies_to_their_send() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, server) = start_keyed(dir.path(), Limits::default(), Some(key(1)));
    let store = open(dir.path());
    let u64_of = |reply: Reply| u64::from_le_bytes(reply.unwrap().try_into().unwrap());
    let mut query = Vec::new();
    handoff::encode_query([&b"c"[..]].into_iter(), &mut query).unwrap();
    let mut chunk = Vec::new();
    handoff::encode_chunk(b"c", b"bytes", &mut chunk).unwrap();
    let sender = [9; auth::NONCE_LEN];

    // A query (zero server nonce) is answered, wrapped for this send with the server's nonce.
    let mut link = Link::connect(addr);
    let handle = u64_of(link.push(&keyed_frame(&key(1), sender, [0; 16], &query)));
    let answer = link.pull(handle).unwrap();
    let body = kvwasm_mrdn::decode(&answer).unwrap().body;
    let sealed = Sealed::parse(body).unwrap().unwrap();
    assert!(sealed.verify(&key(1), Direction::ToSender, Tier::ThinkActive));
    assert!(!sealed.verify(&key(1), Direction::ToServer, Tier::ThinkActive));
    assert_eq!(sealed.sender, &sender);
    let nonce = *sealed.server;
    assert_ne!(nonce, [0; 16]);
    // A chunk must carry that nonce: zeros are a query's only.
    let unbound = link.push(&keyed_frame(&key(1), sender, [0; 16], &chunk));
    let replayed = (
        REFUSED,
        "a message bound to another connection (its server nonce is not this connection's): \
         replayed"
            .to_owned(),
    );
    assert_eq!(unbound, Err(replayed.clone()));
    let bound = keyed_frame(&key(1), sender, nonce, &chunk);
    let handle = u64_of(link.push(&bound));
    // Its echo is tagged for the send that pushed it.
    let echo = link.pull(handle).unwrap();
    let (head, inner) = unwrap(&echo);
    let body = [&head[..], &inner].concat();
    let sealed = Sealed::parse(&body).unwrap().unwrap();
    assert!(sealed.verify(&key(1), Direction::ToSender, Tier::ThinkActive));
    assert_eq!((sealed.sender, sealed.server), (&sender, &nonce));
    assert_eq!(inner, chunk);
    // The same frame on another connection, which has another nonce: refused, not stored.
    let mut other = Link::connect(addr);
    let mut chunk2 = Vec::new();
    handoff::encode_chunk(b"d", b"bytes", &mut chunk2).unwrap();
    assert_eq!(other.push(&bound), Err(replayed.clone()));
    assert_eq!(
        other.push(&keyed_frame(&key(1), sender, nonce, &chunk2)),
        Err(replayed)
    );
    assert!(absent(&store, b"d"));
    // A reply pushed back as a request: its tag is for the other direction.
    assert_eq!(other.push(&echo).unwrap_err().0, REFUSED);
    assert_eq!(server.stats().frames_refused, 4);
}

#[test]
fn an_unkeyed_client_stores_nothing_on_a_keyed_server() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, server) = start_keyed(dir.path(), Limits::default(), Some(key(1)));
    let store = open(dir.path());
    store.put_chunk(b"held", b"already here").unwrap();
    let unauthenticated = (
        REFUSED,
        "this server has a key: an unauthenticated message (no KVS1 wrapper) is refused; \
         send with --key-env and the same key"
            .to_owned(),
    );
    let mut link = Link::connect(addr);
    let mut query = Vec::new();
    handoff::encode_query([&b"held"[..]].into_iter(), &mut query).unwrap();
    for frame in [
        frame(&query),
        chunk_frame(b"c", b"bytes"),
        chunk_frame(b"held", b"other bytes"),
        manifest_frame("slot", &[b"held"], b"m"),
    ] {
        assert_eq!(link.push(&frame), Err(unauthenticated.clone()));
    }
    // Nor with a key of its own: the first exchange already fails.
    let mut link = Link::connect(addr);
    let err = link
        .push(&keyed_frame(&key(2), [3; 16], [0; 16], &query))
        .unwrap_err();
    assert_eq!(
        err,
        (
            REFUSED,
            "bad tag: the sender's key is not this server's (--key-env), or the message or its \
             tier was altered on the way"
                .to_owned()
        )
    );
    assert!(absent(&store, b"c"));
    assert_eq!(
        store.get_chunk(b"held").unwrap().as_slice(),
        b"already here"
    );
    assert!(matches!(store.get_manifest("slot"), Err(KvError::NotFound)));
    let stats = server.stats();
    assert_eq!(
        (stats.frames_ok, stats.frames_refused, stats.queries),
        (0, 5, 0)
    );
}

#[test]
fn a_key_on_one_side_only_or_another_key_fails_the_first_exchange() {
    let scratch = tempfile::tempdir().unwrap();
    let source = source_slot(&scratch.path().join("a"), 2, 100, 81);
    let cases = [
        (
            Some(key(1)),
            Some(key(2)),
            "fabric: push query: status 2: bad tag: the sender's key is not this server's \
             (--key-env), or the message or its tier was altered on the way",
        ),
        (
            Some(key(1)),
            None,
            "fabric: push query: status 2: this server has a key: an unauthenticated message \
             (no KVS1 wrapper) is refused; send with --key-env and the same key",
        ),
        (
            None,
            Some(key(1)),
            "fabric: push query: status 2: this server has no key; start it with --key-env",
        ),
    ];
    for (i, (server_key, sender_key, expected)) in cases.into_iter().enumerate() {
        let dir = scratch.path().join(format!("b{i}"));
        let (addr, server) = start_keyed(&dir, Limits::default(), server_key);
        let fabric = LinkTransport::connect(addr);
        let err = send_keyed(&source, &fabric, &options("slot"), sender_key.as_ref()).unwrap_err();
        assert_eq!(err.to_string(), expected);
        let stats = server.stats();
        assert_eq!(
            (stats.frames_ok, stats.frames_refused),
            (0, 1),
            "{expected}"
        );
    }
}

/// The frame `frame` with its header's tier byte set to `tier`, the body (and so the Blake3
/// checksum) untouched: valid MRDN, as a man in the middle can make it.
fn relabel(frame: &[u8], tier: Tier) -> Vec<u8> {
    let mut out = frame.to_vec();
    out[12] = tier.as_byte();
    out
}

#[test]
fn a_keyed_frame_relabelled_to_another_tier_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, server) = start_keyed(dir.path(), Limits::default(), Some(key(1)));
    let store = open(dir.path());
    let mut query = Vec::new();
    handoff::encode_query([&b"c"[..]].into_iter(), &mut query).unwrap();
    let mut link = Link::connect(addr);
    let sender = [3; auth::NONCE_LEN];
    // Tagged for ThinkActive, as sent: answered, the reply tagged for its own tier.
    let honest = keyed_frame(&key(1), sender, [0; 16], &query);
    let handle = u64::from_le_bytes(link.push(&honest).unwrap().try_into().unwrap());
    let answer = link.pull(handle).unwrap();
    let decoded = kvwasm_mrdn::decode(&answer).unwrap();
    assert_eq!(decoded.tier, Tier::ThinkActive);
    let sealed = Sealed::parse(decoded.body).unwrap().unwrap();
    assert!(sealed.verify(&key(1), Direction::ToSender, Tier::ThinkActive));
    assert!(!sealed.verify(&key(1), Direction::ToSender, Tier::OutputCritical));
    let nonce = *sealed.server;
    // The same frames with the tier byte flipped: the tag covers it.
    let mut chunk = Vec::new();
    handoff::encode_chunk(b"c", b"bytes", &mut chunk).unwrap();
    let bound = keyed_frame(&key(1), sender, nonce, &chunk);
    for tier in [Tier::ThinkComplete, Tier::OutputCritical] {
        for frame in [&honest, &bound] {
            let (status, why) = link.push(&relabel(frame, tier)).unwrap_err();
            assert_eq!(status, REFUSED);
            assert!(why.starts_with("bad tag:"), "{why}");
        }
    }
    assert!(absent(&store, b"c"));
    assert_eq!(server.stats().frames_refused, 4);
    // Unaltered, it lands.
    assert!(link.push(&bound).is_ok());
    assert_eq!(store.get_chunk(b"c").unwrap().as_slice(), b"bytes");

    // A sender refuses a reply relabelled on its way back.
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = source_slot(a.path(), 2, 100, 91);
    let (addr, _server) = start_keyed(b.path(), Limits::default(), Some(key(1)));
    let tamper = Tamper::connect(addr, |f: Vec<u8>| relabel(&f, Tier::OutputCritical));
    let (err, pushes, live) = tamper.send_keyed_fails(&source, &options("slot"), Some(&key(1)));
    assert_eq!(
        err,
        "pull answer: unexpected reply: its tag is not the receiver's under this send's key: \
         forged or altered by the fabric, or the receiver has another key"
    );
    assert_eq!((pushes, live), (1, 0));
}

/// Without a key, a man in the middle (the fabric) that replaces a chunk's bytes and
/// recomputes the frame's Blake3 lands them under the honest name, and a later clean send
/// skips that chunk. With `--verify-hash xxh3-64` the receiver checks every chunk's bytes
/// against its name: the altered chunk is refused, nothing lands, and a clean send delivers
/// the slot.
#[test]
fn a_chunk_altered_with_its_blake3_recomputed_is_refused_with_verify_hash() {
    let scratch = tempfile::tempdir().unwrap();
    let source = source_slot(&scratch.path().join("a"), 3, 1000, 95);
    let slot = chunks(3, 1000, 95);
    let corrupt = |f: &[u8]| -> Option<Vec<u8>> {
        let body = kvwasm_mrdn::decode(f).unwrap().body;
        let Ok(handoff::Message::Chunk { hash, data }) = handoff::parse(body) else {
            return Some(f.to_vec());
        };
        let mut altered = data.to_vec();
        altered[0] ^= 0xff;
        let mut out = Vec::new();
        handoff::encode_chunk(hash, &altered, &mut out).unwrap();
        Some(reframe(f, |_| out))
    };
    let checked = Limits {
        verify_hash: Some(ChunkHash::Xxh3_64),
        ..Limits::default()
    };
    for (what, limits) in [("unchecked", Limits::default()), ("checked", checked)] {
        let dir = scratch.path().join(what);
        let (addr, server) = start(&dir, limits);
        let tampered = Tamper::connect(addr, |f: Vec<u8>| f).pushing(corrupt);
        let result = send(&source, &tampered, &options("slot"));
        let target = open(&dir);
        let clean = send(&source, &LinkTransport::connect(addr), &options("slot")).unwrap();
        if what == "unchecked" {
            // The lie lands, and sticks.
            assert!(result.is_ok(), "{result:?}");
            assert_eq!(clean.sent, 0);
            let landed = target.get_chunk(&slot[0].0).unwrap();
            assert_ne!(landed.as_slice(), &slot[0].1[..]);
            continue;
        }
        let err = result.unwrap_err().to_string();
        let expected = format!(
            "fabric: push chunk: status 2: chunk {}: its 1000 bytes hash to ",
            hex::encode(slot[0].0)
        );
        assert!(err.starts_with(&expected), "{err}");
        assert!(
            err.ends_with("(xxh3-64): corrupted or altered on the way (--verify-hash xxh3-64)"),
            "{err}"
        );
        assert_eq!(server.stats().chunks_stored, clean.sent as u64);
        assert_eq!(clean.sent, 3, "nothing altered was kept");
        for (hash, data) in &slot {
            assert_eq!(target.get_chunk(hash).unwrap().as_slice(), &data[..]);
        }
    }
    // A name of another length than xxh3-64's is refused too.
    let dir = scratch.path().join("length");
    let (addr, _server) = start(
        &dir,
        Limits {
            verify_hash: Some(ChunkHash::Xxh3_64),
            ..Limits::default()
        },
    );
    let (status, why) = Link::connect(addr)
        .push(&chunk_frame(b"short", b"bytes"))
        .unwrap_err();
    assert_eq!(status, REFUSED);
    assert!(
        why.contains("is named by 5 bytes, but xxh3-64 names are 8"),
        "{why}"
    );
    assert!(absent(&open(&dir), b"short"));
}
