//! `send` and `serve` in one process, over loopback: a native client of the link protocol
//! (written here from the protocol doc, independent of the server's codec) drives a `Server`
//! storing into a real fs store.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvwasm_fabric::handoff;
use kvwasm_fabric::{Limits, SendOptions, Server, Transport, send};
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
    let server = Arc::new(Server::bind("127.0.0.1:0", open(dir), limits).unwrap());
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

/// A fabric that hands back `pulled(frame)` instead of what the receiver sent, counts pushes
/// and tracks the handles it holds.
struct Tamper<F> {
    link: LinkTransport,
    pulled: F,
    pushes: std::sync::atomic::AtomicUsize,
    live: Mutex<std::collections::HashSet<u64>>,
}

impl<F: Fn(Vec<u8>) -> Vec<u8>> Tamper<F> {
    fn connect(addr: SocketAddr, pulled: F) -> Tamper<F> {
        Tamper {
            link: LinkTransport::connect(addr),
            pulled,
            pushes: Default::default(),
            live: Default::default(),
        }
    }

    /// The send's error, the pushes, and the handles it left unreleased.
    fn send_fails(self, source: &StoreHandle, options: &SendOptions) -> (String, usize, usize) {
        let err = send(source, &self, options).unwrap_err().to_string();
        let live = self.live.lock().unwrap().len();
        (err, self.pushes.into_inner(), live)
    }
}

impl<F: Fn(Vec<u8>) -> Vec<u8>> Transport for Tamper<F> {
    type Error = LinkError;

    fn push(&self, frame: &[u8]) -> Result<u64, LinkError> {
        self.pushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = self.link.push(frame)?;
        self.live.lock().unwrap().insert(handle);
        Ok(handle)
    }

    fn pull(&self, handle: u64) -> Result<Vec<u8>, LinkError> {
        self.link.pull(handle).map(&self.pulled)
    }

    fn release(&self, handle: u64) -> Result<(), LinkError> {
        self.live.lock().unwrap().remove(&handle);
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
