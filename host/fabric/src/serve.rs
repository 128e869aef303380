//! `kvwasm fabric serve`: the receiving end of a handoff. Accepts link connections (a thread
//! each, at most [`Limits::max_connections`]), verifies every pushed frame strictly and parses
//! its handoff message **before** touching the store, then stores chunks and manifests and
//! answers queries. Trusted host code facing an untrusted network peer: every length is checked
//! against a limit before anything is allocated for it. With a key ([`Server::bind_keyed`],
//! [`crate::auth`]) it acts only on messages tagged with that key and bound to the connection,
//! and tags every reply for the send that asked.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvwasm_host::{KvError, StoreHandle};
use kvwasm_mrdn::{CHECKSUM_LEN, DecodeMode, HEADER_LEN, Tier};

use crate::auth::{self, Direction, Envelope, Key, Nonce, Sealed};
use crate::handoff::{self, Message};
use crate::link::{self, LinkError, Request, Status};

mod stats;
mod timed;

pub use stats::Stats;
use stats::{Counters, Event};
use timed::{Timed, is_timeout};

/// The server's limits and checks (the flags of `kvwasm fabric serve`).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest frame a PUSH may carry; a larger one is refused and its connection closed
    /// (`--max-frame-mib`). Also caps what a connection keeps under unreleased handles
    /// (answers, hashes, names, each plus 64 bytes).
    pub max_frame_bytes: usize,
    /// Connections served at once; more are refused at once (`--max-connections`).
    pub max_connections: usize,
    /// A connection with no request for this long is closed (`--idle-timeout-s`).
    pub idle_timeout: Duration,
    /// A connection stalled this long inside a request, or not reading its responses, is
    /// closed (`--io-timeout-ms`).
    pub io_timeout: Duration,
    /// Live handles per connection; a PUSH over it is refused.
    pub max_live_handles: usize,
    /// Slowest a request may arrive, or a response be taken (`--min-kib-per-s`): each must
    /// be done within `io_timeout` + its length at this rate, so a client trickling bytes
    /// (each gap under the I/O timeout) cannot hold a thread for longer.
    pub min_bytes_per_s: u64,
    /// How chunks are named, when the server checks that each chunk's bytes are what its name
    /// says before storing it (`--verify-hash`); `None` takes the sender's word.
    pub verify_hash: Option<ChunkHash>,
}

/// A way of naming chunks by their content that the receiver can check (`--verify-hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkHash {
    /// 8 bytes, the xxh3-64 of the chunk (seed 0) little-endian: how llama.cpp slots
    /// (`examples/llama-slot`), `kvwasm demo` and the C consumer's default keys name chunks.
    Xxh3_64,
}

impl ChunkHash {
    /// The name `--verify-hash` takes.
    pub fn name(self) -> &'static str {
        match self {
            ChunkHash::Xxh3_64 => "xxh3-64",
        }
    }

    /// `Err` with the reason unless `hash` is this scheme's name of `data`.
    pub fn check(self, hash: &[u8], data: &[u8]) -> Result<(), String> {
        let name = self.name();
        match self {
            ChunkHash::Xxh3_64 => {
                let computed = xxhash_rust::xxh3::xxh3_64(data).to_le_bytes();
                if hash.len() != computed.len() {
                    return Err(format!(
                        "chunk {} is named by {} bytes, but {name} names are {} \
                         (--verify-hash {name})",
                        hex::encode(hash),
                        hash.len(),
                        computed.len()
                    ));
                }
                if hash != computed {
                    return Err(format!(
                        "chunk {}: its {} bytes hash to {} ({name}): corrupted or altered on \
                         the way (--verify-hash {name})",
                        hex::encode(hash),
                        data.len(),
                        hex::encode(computed)
                    ));
                }
                Ok(())
            }
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_frame_bytes: 64 << 20,
            max_connections: 16,
            idle_timeout: Duration::from_secs(300),
            io_timeout: Duration::from_millis(30_000),
            max_live_handles: 1 << 20,
            min_bytes_per_s: 1 << 20,
            verify_hash: None,
        }
    }
}

struct Shared {
    store: Arc<StoreHandle>,
    limits: Limits,
    /// The key every message must be tagged with, if any.
    key: Option<Key>,
    counters: Counters,
    active: AtomicUsize,
}

/// A bound `kvwasm fabric serve` listener.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Listen on `addr` (port 0 picks one; see [`Server::local_addr`]) for frames to store
    /// into `store`, from any client (unauthenticated).
    pub fn bind(
        addr: impl ToSocketAddrs,
        store: Arc<StoreHandle>,
        limits: Limits,
    ) -> io::Result<Server> {
        Server::bind_keyed(addr, store, limits, None)
    }

    /// [`Server::bind`]; with `key`, only messages tagged with it are acted on (every other
    /// PUSH is refused) and every reply is tagged with it.
    pub fn bind_keyed(
        addr: impl ToSocketAddrs,
        store: Arc<StoreHandle>,
        limits: Limits,
        key: Option<Key>,
    ) -> io::Result<Server> {
        Ok(Server {
            listener: TcpListener::bind(addr)?,
            shared: Arc::new(Shared {
                store,
                limits,
                key,
                counters: Counters::default(),
                active: AtomicUsize::new(0),
            }),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Counters of every connection so far.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Serve connections until the process ends. A failed accept (out of file descriptors,
    /// say) is logged and retried after a pause, so it never ends the server.
    pub fn run(&self) -> io::Result<()> {
        tracing::info!(addr = %self.local_addr()?, "fabric server listening");
        for stream in self.listener.incoming() {
            match stream {
                Ok(stream) => self.admit(stream),
                Err(e) => {
                    tracing::warn!("fabric server: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Ok(())
    }

    fn admit(&self, stream: TcpStream) {
        let shared = &self.shared;
        shared.counters.apply(Event::Connection);
        let max = shared.limits.max_connections;
        if shared.active.fetch_add(1, Ordering::AcqRel) >= max {
            shared.active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("fabric server: refusing a connection, {max} already open");
            // Non-blocking: the accept loop never waits on a client it refuses.
            let mut stream = stream;
            let _ = stream.set_nonblocking(true);
            let _ = link::write_error(
                &mut stream,
                Status::Refused,
                &format!("server busy: {max} connections open (--max-connections)"),
            );
            return;
        }
        let slot = Slot(shared.clone());
        let spawned = std::thread::Builder::new()
            .name("kvwasm-fabric-conn".into())
            .spawn(move || serve_connection(stream, &slot.0));
        if let Err(e) = spawned {
            tracing::warn!("fabric server: cannot start a connection thread: {e}");
        }
    }
}

/// One admitted connection; frees its place when its thread ends (or never starts).
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    tracing::info!(%peer, "fabric connection from {peer}");
    let nonce = match &shared.key {
        Some(_) => match auth::nonce() {
            Ok(nonce) => nonce,
            Err(e) => {
                tracing::warn!(%peer, "fabric connection from {peer} dropped: {e}");
                return;
            }
        },
        None => [0; auth::NONCE_LEN],
    };
    let timed = Timed::new(&stream);
    let mut conn = Connection::new(&stream, &timed, shared, nonce, peer.clone());
    let result = conn.run();
    let t = conn.tally;
    let totals = shared.counters.snapshot();
    let end = match &result {
        Ok(()) => "closed by the client".to_owned(),
        Err(e) => e.to_string(),
    };
    tracing::info!(
        %peer,
        frames_ok = t.frames_ok,
        frames_refused = t.frames_refused,
        frames_failed = t.frames_failed,
        chunks_stored = t.chunks_stored,
        chunk_bytes_stored = t.chunk_bytes_stored,
        queries = t.queries,
        manifests_stored = t.manifests_stored,
        total_frames_ok = totals.frames_ok,
        total_frames_refused = totals.frames_refused,
        total_chunk_bytes_stored = totals.chunk_bytes_stored,
        "fabric connection ended: {end}"
    );
}

/// What a live handle keeps: an answer as encoded, or what to read back for a PULL (and the
/// nonce of the send that pushed it, to tag the echo for that send).
enum Kept {
    Answer(Vec<u8>),
    Chunk {
        tier: Tier,
        hash: Vec<u8>,
        sender: Nonce,
    },
    Manifest {
        tier: Tier,
        name: String,
        sender: Nonce,
    },
}

/// What a kept handle costs besides its bytes (its map entry, its allocation), so that many
/// small ones count too.
const KEPT_OVERHEAD: usize = 64;

impl Kept {
    /// What it counts against the connection's budget ([`Limits::max_frame_bytes`]).
    fn cost(&self) -> usize {
        KEPT_OVERHEAD
            + match self {
                Kept::Answer(frame) => frame.len(),
                Kept::Chunk { hash, .. } => hash.len(),
                Kept::Manifest { name, .. } => name.len(),
            }
    }
}

/// Why a PUSH or PULL was not done; answered to the client, the connection goes on.
type Refusal = (Status, String);

fn refused(why: impl std::fmt::Display) -> Refusal {
    (Status::Refused, why.to_string())
}

fn failed(op: &str) -> impl FnOnce(KvError) -> Refusal + '_ {
    move |e| (Status::Failed, format!("{op}: {e}"))
}

/// Longest a connection ended for a protocol fault keeps discarding input (see
/// `Connection::fatal`).
const LINGER: Duration = Duration::from_secs(2);

/// How many chunks a connection remembers as present (stored by it, or answered present to
/// it), so queries and manifests need not read them again; past it, they read the store.
/// Each is kept as a 16-byte digest: at most ~8 MiB per connection.
const MAX_REMEMBERED: usize = 1 << 18;

/// A remembered chunk: the Blake3 digest of its hash, truncated as MRDN's checksum is (a
/// client that could collide it could as well have stored the chunk it names).
type Digest = [u8; kvwasm_mrdn::CHECKSUM_LEN];

struct Connection<'a> {
    shared: &'a Shared,
    stream: &'a TcpStream,
    timed: &'a Timed<'a>,
    reader: BufReader<&'a Timed<'a>>,
    writer: BufWriter<&'a Timed<'a>>,
    /// The number the next PUSH gets (refused or not).
    next_handle: u64,
    live: HashMap<u64, Kept>,
    /// The [`Kept::cost`] of every live handle.
    kept_bytes: usize,
    /// Chunks known present: stored on this connection or answered present to it.
    present: HashSet<Digest>,
    /// Some PUSH was refused or failed: manifests are refused from now on.
    poisoned: bool,
    /// The PUSHed frame being handled, reused.
    frame: Vec<u8>,
    /// A PULL's freshly encoded frame, reused.
    out: Vec<u8>,
    tally: Stats,
    /// This connection's nonce (zeros without a key): chunks and manifests must carry it.
    nonce: Nonce,
    /// The client's address, for the log.
    peer: String,
    /// Whether an authentication failure was logged at warn (later ones go to debug).
    warned: bool,
}

impl<'a> Connection<'a> {
    fn new(
        stream: &'a TcpStream,
        timed: &'a Timed<'a>,
        shared: &'a Shared,
        nonce: Nonce,
        peer: String,
    ) -> Connection<'a> {
        Connection {
            shared,
            stream,
            timed,
            reader: BufReader::with_capacity(64 << 10, timed),
            writer: BufWriter::with_capacity(64 << 10, timed),
            next_handle: 1,
            live: HashMap::new(),
            kept_bytes: 0,
            present: HashSet::new(),
            poisoned: false,
            frame: Vec::new(),
            out: Vec::new(),
            tally: Stats::default(),
            nonce,
            peer,
            warned: false,
        }
    }

    fn record(&mut self, event: Event) {
        self.tally.apply(event);
        self.shared.counters.apply(event);
    }

    /// `now` + the I/O timeout + `len` bytes at the slowest rate allowed.
    fn due(&self, len: usize) -> Instant {
        let limits = &self.shared.limits;
        let rate = limits.min_bytes_per_s.max(1) as f64;
        Instant::now() + limits.io_timeout + Duration::from_secs_f64(len as f64 / rate)
    }

    /// Responses of `len` more bytes are owed: the client must take them in time.
    fn owe(&self, len: usize) {
        let io_timeout = self.shared.limits.io_timeout;
        self.timed.write.limit(io_timeout, Some(self.due(len)));
    }

    /// Tells the client why the link ends (when it is a protocol fault), then ends it.
    ///
    /// Closing a socket with unread input resets it, and a reset may destroy the answer before
    /// the client reads it (an oversized PUSH is refused before its body is read). So the
    /// server shuts its side down and discards input until the client closes too, for at most
    /// [`LINGER`]: a client writing a frame it cannot finish reads why instead of a reset.
    fn fatal(&mut self, error: LinkError) -> Result<(), LinkError> {
        if let Some(status) = error.status() {
            self.owe(0);
            let told = link::write_error(&mut self.writer, status, &error.to_string())
                .and_then(|()| self.writer.flush())
                .and_then(|()| self.stream.shutdown(std::net::Shutdown::Write));
            if told.is_ok() {
                self.timed.read.limit(LINGER, Some(Instant::now() + LINGER));
                let mut sink = [0; 64 << 10];
                loop {
                    let drained = self.reader.get_mut().read(&mut sink);
                    if !matches!(drained, Ok(1..)) {
                        break;
                    }
                }
            }
        }
        Err(error)
    }

    fn run(&mut self) -> Result<(), LinkError> {
        let io_timeout = self.shared.limits.io_timeout;
        self.serve().map_err(|e| match e {
            LinkError::Io(e) if is_timeout(&e) => LinkError::Stalled(io_timeout),
            e => e,
        })
    }

    fn serve(&mut self) -> Result<(), LinkError> {
        let limits = &self.shared.limits;
        let (io_timeout, idle_timeout) = (limits.io_timeout, limits.idle_timeout);
        let max_frame = limits.max_frame_bytes;
        self.stream.set_nodelay(true)?;
        self.timed.read.limit(io_timeout, Some(self.due(0)));
        self.owe(0);
        if let Err(e) = link::read_hello(&mut self.reader) {
            return self.fatal(e);
        }
        self.writer.write_all(&link::hello())?;
        loop {
            if self.reader.buffer().is_empty() {
                // About to wait for the client: what it is owed goes out first.
                self.writer.flush()?;
                self.timed.read.limit(idle_timeout, None);
                match self.reader.fill_buf() {
                    Ok([]) => return Ok(()),
                    Ok(_) => {}
                    Err(e) if is_timeout(&e) => return Err(LinkError::Idle(idle_timeout)),
                    Err(e) => return Err(e.into()),
                }
            }
            // The request has begun: all of it must come in time.
            self.timed.read.limit(io_timeout, Some(self.due(0)));
            let request = match link::read_request(&mut self.reader, max_frame) {
                Ok(Some(request)) => request,
                Ok(None) => return Ok(()),
                Err(e) => {
                    if matches!(e, LinkError::FrameTooLarge { .. }) {
                        self.record(Event::Refused);
                    }
                    return self.fatal(e);
                }
            };
            match request {
                Request::Push { frame_len } => {
                    self.timed.read.finish_by(self.due(frame_len));
                    link::read_frame(&mut self.reader, frame_len, &mut self.frame)?;
                    let handle = self.next_handle;
                    self.next_handle += 1;
                    let pushed = self.push();
                    // The store's time is not the client's: its clock starts at the response.
                    self.owe(0);
                    match pushed {
                        Ok(kept) => {
                            self.kept_bytes += kept.cost();
                            self.live.insert(handle, kept);
                            self.record(Event::FrameOk);
                            link::write_handle(&mut self.writer, handle)?;
                        }
                        Err((status, why)) => {
                            tracing::debug!(handle, "fabric PUSH {status:?}: {why}");
                            self.poisoned = true;
                            self.record(if status == Status::Failed {
                                Event::Failed
                            } else {
                                Event::Refused
                            });
                            link::write_error(&mut self.writer, status, &why)?;
                        }
                    }
                }
                Request::Pull { handle } => match self.pull(handle) {
                    Ok(()) => {
                        self.owe(self.out.len());
                        link::write_frame(&mut self.writer, &self.out)?;
                    }
                    Err((status, why)) => {
                        self.owe(0);
                        link::write_error(&mut self.writer, status, &why)?;
                    }
                },
                Request::Release { handle } => {
                    self.owe(0);
                    match self.live.remove(&handle) {
                        Some(kept) => {
                            self.kept_bytes -= kept.cost();
                            link::write_ok(&mut self.writer)?;
                        }
                        None => link::write_error(
                            &mut self.writer,
                            Status::NotFound,
                            &format!("no live handle {handle} on this connection"),
                        )?,
                    }
                }
            }
        }
    }

    /// Verifies the pushed frame and its message, then acts on it.
    fn push(&mut self) -> Result<Kept, Refusal> {
        if self.live.len() >= self.shared.limits.max_live_handles {
            return Err(refused(format!(
                "{} live handles on this connection; release some",
                self.live.len()
            )));
        }
        let bytes = std::mem::take(&mut self.frame);
        let result = self.act(&bytes);
        self.frame = bytes;
        result
    }

    fn act(&mut self, bytes: &[u8]) -> Result<Kept, Refusal> {
        let frame = kvwasm_mrdn::decode_with(bytes, DecodeMode::Strict)
            .map_err(|e| refused(format!("bad frame: {e}")))?;
        let (body, sender) = self.authenticate(frame.body, frame.tier)?;
        let message = handoff::parse(body).map_err(|e| refused(format!("bad message: {e}")))?;
        let shared = self.shared;
        let store = &shared.store;
        let reply = reply_envelope(shared.key.as_ref(), self.nonce);
        match message {
            Message::Query(query) => {
                let len = HEADER_LEN + handoff::answer_len(query.len());
                self.room(len)?;
                let present = self.presence(query)?;
                let checksum = bytes[HEADER_LEN - CHECKSUM_LEN..HEADER_LEN]
                    .try_into()
                    .expect("a verified frame has a header");
                let mut answer = Vec::with_capacity(len);
                sealed(
                    frame.tier,
                    &mut answer,
                    reply(sender, frame.tier).as_ref(),
                    |body| handoff::encode_answer(checksum, present.len(), |i| present[i], body),
                )?;
                self.record(Event::Query);
                Ok(Kept::Answer(answer))
            }
            Message::Chunk { hash, data } => {
                self.room(hash.len())?;
                if let Some(names) = shared.limits.verify_hash {
                    names.check(hash, data).map_err(refused)?;
                }
                let already = store.put_chunk(hash, data).map_err(failed("put_chunk"))?;
                if !already {
                    self.record(Event::ChunkStored(data.len() as u64));
                }
                self.remember(hash);
                Ok(Kept::Chunk {
                    tier: frame.tier,
                    hash: hash.to_vec(),
                    sender,
                })
            }
            Message::Manifest { name, chunks, data } => {
                if self.poisoned {
                    return Err(refused("an earlier frame on this connection failed"));
                }
                self.room(name.len())?;
                // Whatever the sender's fabric claimed, every chunk must be here first.
                let present = self.presence(chunks)?;
                if let Some(i) = present.iter().position(|&p| !p) {
                    let missing = present.iter().filter(|&&p| !p).count();
                    let hash = chunks.hashes().nth(i).expect("i < chunks.len()");
                    return Err(refused(format!(
                        "manifest {name:?} names {missing} chunks this store lacks, first {}",
                        hex::encode(hash)
                    )));
                }
                store
                    .put_manifest(name, data)
                    .map_err(failed("put_manifest"))?;
                self.record(Event::Manifest);
                Ok(Kept::Manifest {
                    tier: frame.tier,
                    name: name.to_owned(),
                    sender,
                })
            }
            Message::Answer(_) => Err(refused("an answer (KVA1) is not a request")),
        }
    }

    /// The handoff message a pushed body carries and the nonce of the send that pushed it.
    /// With a key: only a wrapped message whose tag is the key's for the frame's `tier`, bound
    /// to this connection (its server nonce, or zeros in a query, which is how a send learns the
    /// nonce). Without one: only an unwrapped message.
    fn authenticate<'b>(
        &mut self,
        body: &'b [u8],
        tier: Tier,
    ) -> Result<(&'b [u8], Nonce), Refusal> {
        let sealed = Sealed::parse(body).map_err(|e| refused(format!("bad message: {e}")));
        let checked = match (&self.shared.key, sealed) {
            (_, Err(refusal)) => Err(refusal),
            (None, Ok(None)) => return Ok((body, [0; auth::NONCE_LEN])),
            (None, Ok(Some(_))) => Err(refused("this server has no key; start it with --key-env")),
            (Some(_), Ok(None)) => Err(refused(
                "this server has a key: an unauthenticated message (no KVS1 wrapper) is \
                 refused; send with --key-env and the same key",
            )),
            (Some(key), Ok(Some(sealed))) => {
                let bound = sealed.server == &self.nonce
                    || (sealed.server == &[0; auth::NONCE_LEN]
                        && sealed.inner.starts_with(&handoff::QUERY_MAGIC));
                if !sealed.verify(key, Direction::ToServer, tier) {
                    Err(refused(
                        "bad tag: the sender's key is not this server's (--key-env), or the \
                         message or its tier was altered on the way",
                    ))
                } else if !bound {
                    Err(refused(
                        "a message bound to another connection (its server nonce is not this \
                         connection's): replayed",
                    ))
                } else {
                    Ok((sealed.inner, *sealed.sender))
                }
            }
        };
        checked.inspect_err(|(_, why)| {
            if !std::mem::replace(&mut self.warned, true) {
                let peer = &self.peer;
                tracing::warn!(%peer, "fabric connection from {peer}: authentication failed: {why}");
            }
        })
    }

    /// Refused unless a handle keeping `len` more bytes fits the connection's budget: checked
    /// before acting, so nothing is stored for a PUSH refused over it.
    fn room(&self, len: usize) -> Result<(), Refusal> {
        let max = self.shared.limits.max_frame_bytes;
        if self.kept_bytes + KEPT_OVERHEAD + len > max {
            return Err(refused(format!(
                "unreleased handles on this connection would keep more than {max} bytes; \
                 release some"
            )));
        }
        Ok(())
    }

    /// Remembers `hash` as present, while there is room.
    fn remember(&mut self, hash: &[u8]) {
        if self.present.len() < MAX_REMEMBERED {
            self.present.insert(kvwasm_mrdn::checksum(hash));
        }
    }

    /// Whether the store holds each of `hashes`: remembered, or read (each distinct hash at
    /// most once per frame, so a frame repeating one hash costs one read); those read present
    /// are remembered.
    fn presence(&mut self, hashes: handoff::Hashes<'_>) -> Result<Vec<bool>, Refusal> {
        let mut read: HashMap<&[u8], bool> = HashMap::new();
        let mut out = Vec::with_capacity(hashes.len());
        for hash in hashes.hashes() {
            let has = if self.present.contains(&kvwasm_mrdn::checksum(hash)) {
                true
            } else if let Some(&has) = read.get(hash) {
                has
            } else {
                let has = holds(&self.shared.store, hash)?;
                read.insert(hash, has);
                if has {
                    self.remember(hash);
                }
                has
            };
            out.push(has);
        }
        Ok(out)
    }

    /// Puts the frame kept under `handle` into `self.out`, read back from the store.
    fn pull(&mut self, handle: u64) -> Result<(), Refusal> {
        let store = &self.shared.store;
        let reply = reply_envelope(self.shared.key.as_ref(), self.nonce);
        let out = &mut self.out;
        match self.live.get(&handle) {
            None => {
                return Err((
                    Status::NotFound,
                    format!("no live handle {handle} on this connection"),
                ));
            }
            Some(Kept::Answer(frame)) => {
                out.clear();
                out.extend_from_slice(frame);
            }
            Some(Kept::Chunk { tier, hash, sender }) => {
                let data = store.get_chunk(hash).map_err(failed("get_chunk"))?;
                sealed(*tier, out, reply(*sender, *tier).as_ref(), |body| {
                    handoff::encode_chunk(hash, data.as_slice(), body)
                })?;
            }
            Some(Kept::Manifest { tier, name, sender }) => {
                // Its chunk list is not echoed: the store keeps none.
                let data = store.get_manifest(name).map_err(failed("get_manifest"))?;
                sealed(*tier, out, reply(*sender, *tier).as_ref(), |body| {
                    handoff::encode_manifest(name, std::iter::empty(), data.as_slice(), body)
                })?;
            }
        }
        Ok(())
    }
}

/// Whether the store holds `hash` (kv_store_v1 has no presence check: a read, a miss is no).
fn holds(store: &StoreHandle, hash: &[u8]) -> Result<bool, Refusal> {
    match store.get_chunk(hash) {
        Ok(_) => Ok(true),
        Err(KvError::NotFound) => Ok(false),
        Err(e) => Err(failed("get_chunk")(e)),
    }
}

/// How a connection with server nonce `nonce` wraps its replies to the send with nonce `sender`
/// in frames of `tier` (nothing without a key).
fn reply_envelope<'k>(
    key: Option<&'k Key>,
    nonce: Nonce,
) -> impl Fn(Nonce, Tier) -> Option<Envelope<'k>> + use<'k> {
    move |sender, tier| {
        key.map(|key| Envelope {
            key,
            direction: Direction::ToSender,
            tier,
            sender,
            server: nonce,
        })
    }
}

/// Replaces `out` with the frame (`tier`) of the body `encode` appends, wrapped in `envelope`
/// if any; a body that cannot be framed (the store returned more than a frame holds) is a
/// store failure.
fn sealed(
    tier: Tier,
    out: &mut Vec<u8>,
    envelope: Option<&Envelope<'_>>,
    encode: impl FnOnce(&mut Vec<u8>) -> Result<(), handoff::MessageError>,
) -> Result<(), Refusal> {
    let failed = |e: &dyn std::fmt::Display| (Status::Failed, format!("framing the reply: {e}"));
    out.clear();
    out.resize(HEADER_LEN, 0);
    Envelope::append(envelope, out, encode).map_err(|e| failed(&e))?;
    kvwasm_mrdn::seal_in_place(tier, out).map_err(|e| failed(&e))
}
