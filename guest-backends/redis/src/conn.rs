//! One TCP connection to Redis, speaking RESP2 through `redis-protocol`,
//! with every wait bounded by the configured deadline.

use std::cell::Cell;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_streams::{
    ReadError, WriteError, read_exact, write_all,
};
use kvwasm_guest_support::net::Stream;
use kvwasm_guest_support::{Error, Payload, Settings};
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::encode::encode_borrowed;
use redis_protocol::resp2::types::{BorrowedFrame, OwnedFrame};

/// Where and how to connect, from settings.
pub(crate) struct Endpoint {
    /// `host:port` of the server (`mode = "single"`), or of the seed nodes
    /// a cluster's map is first asked of (`mode = "cluster"`).
    pub(crate) addresses: Vec<String>,
    /// `mode = "cluster"`: keys are routed to the master serving their slot.
    pub(crate) cluster: bool,
    /// Ask the host for a TLS session on the socket (`tls = true`, which
    /// the host sets with a `tls` grant, or a `rediss://` address).
    pub(crate) tls: bool,
    db: u32,
    user: Option<String>,
    password: Option<String>,
    /// The budget of one operation: connecting (if needed) and one
    /// pipeline, together.
    pub(crate) timeout: Duration,
    /// Replicas that must acknowledge a save's writes before its manifest
    /// is published (`wait_replicas`, `WAIT`); 0: none asked.
    pub(crate) wait_replicas: u32,
    /// How long `WAIT` may take, ms (`wait_timeout_ms`).
    pub(crate) wait_timeout_ms: u64,
}

impl Endpoint {
    pub(crate) fn from_settings(settings: &Settings) -> Result<Endpoint, Error> {
        let cluster = match settings.get("mode").unwrap_or("single") {
            "single" => false,
            "cluster" => true,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "setting `mode` = {other:?}: expected \"single\" or \"cluster\""
                )));
            }
        };
        // A cluster's seeds: `addresses` (a list, which the host hands over
        // comma-separated), else `address`.
        let listed = match (cluster, settings.get("addresses")) {
            (true, Some(list)) => list
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .collect(),
            _ => vec![settings.required("address")?],
        };
        if listed.is_empty() {
            return Err(Error::InvalidArgument(
                "setting `addresses` lists no seed node".into(),
            ));
        }
        let mut rediss = false;
        let addresses = listed
            .into_iter()
            .map(|a| match a.strip_prefix("rediss://") {
                Some(rest) => {
                    rediss = true;
                    rest.to_owned()
                }
                None => a.to_owned(),
            })
            .collect();
        let db = settings.parse_or("db", 0)?;
        if cluster && db != 0 {
            return Err(Error::InvalidArgument(
                "setting `db`: a Redis Cluster has only database 0".into(),
            ));
        }
        Ok(Endpoint {
            addresses,
            cluster,
            tls: rediss || settings.parse_or("tls", false)?,
            db,
            user: settings.get("user").map(str::to_owned),
            password: settings.secret("password", "REDIS_PASSWORD"),
            timeout: Duration::from_millis(settings.parse_or("timeout_ms", 5000)?),
            wait_replicas: settings.parse_or("wait_replicas", 0)?,
            wait_timeout_ms: settings.parse_or("wait_timeout_ms", 1000)?,
        })
    }
}

/// A failed exchange. `dropped` means the server closed or reset the
/// connection (worth one retry on a new one), as opposed to a timeout or
/// a refused connection.
#[derive(Debug)]
pub(crate) struct ConnError {
    pub(crate) message: String,
    pub(crate) dropped: bool,
    /// The server refused us (bad credentials): not a network failure.
    pub(crate) denied: bool,
    /// The sandbox refused the peer: it is not granted in `net`.
    pub(crate) not_granted: bool,
}

impl From<ConnError> for Error {
    fn from(e: ConnError) -> Error {
        if e.denied {
            Error::Denied(e.message)
        } else {
            Error::Unavailable(e.message)
        }
    }
}

/// An open, authenticated connection with its read buffer.
pub(crate) struct Connection {
    stream: Stream,
    peer: Peer,
    replies: Replies,
}

/// Whom a connection talks to, for deadlines and error messages (apart
/// from the stream, so a read can borrow both).
struct Peer {
    address: String,
    timeout: Duration,
    /// Bytes the next read asks the socket for ([`Peer::receive`]).
    read_request: Cell<usize>,
}

/// What one read asks the socket for, adapted to the replies: it starts at
/// [`SMALL_READ`], doubles after a read that filled it and halves after one
/// that brought less than a quarter of it, within [`SMALL_READ`] and
/// [`LARGE_READ`]. The host allocates and zeroes the size asked for on every
/// read, the one that finds no reply yet included, so asking for the whole
/// read buffer to get a 5-byte `+OK` cost two zeroed 64 KiB buffers per
/// round trip; a pipeline's replies or a value still grow it in a few reads.
const SMALL_READ: usize = 4 << 10;
/// The most the host hands over per read (wasmtime-wasi's limit).
const LARGE_READ: usize = 64 << 10;

/// The next read request after one of `asked` bytes brought `got`.
fn next_read_request(asked: usize, got: usize) -> usize {
    if got >= asked {
        (asked * 2).min(LARGE_READ)
    } else if got < asked / 4 {
        (asked / 2).max(SMALL_READ)
    } else {
        asked
    }
}

/// Writes are sent in pieces of about this size while encoding.
const WRITE_BATCH: usize = 256 << 10;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 256 << 10;
/// Longest status, error or integer line, or bulk string header, accepted.
const MAX_LINE: usize = 64 << 10;
/// Longest bulk string accepted: Redis's own limit (`proto-max-bulk-len`).
const MAX_BULK: u64 = 512 << 20;
/// Bulk strings at least this long are read from the socket straight into
/// their own buffer instead of through the read buffer and the decoder
/// (two copies fewer per byte, and no compaction of the read buffer).
const DIRECT_BULK: usize = 64 << 10;

/// One argument of a command: bytes in guest memory, or a host payload
/// (a long value being saved), which goes to the socket without entering
/// linear memory.
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    Payload(&'a Payload),
}

impl<'a> Arg<'a> {
    fn bytes(&self) -> Option<&'a [u8]> {
        match *self {
            Arg::Bytes(b) => Some(b),
            Arg::Payload(_) => None,
        }
    }
}

/// Append `frame`, encoded, to `out`.
fn append(out: &mut Vec<u8>, frame: &BorrowedFrame<'_>) -> Result<(), String> {
    let at = out.len();
    out.resize(at + frame.encode_len(false), 0);
    encode_borrowed(&mut out[at..], frame, false)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// One reply: a decoded frame, or a long bulk string that was read by the
/// caller's `read_long` (in the guest, into a host payload).
#[derive(Debug, PartialEq)]
pub(crate) enum Reply<V> {
    Frame(OwnedFrame),
    Long(V),
}

/// Bytes received and not yet decoded, and the replies decoded from them.
/// Apart from the socket, so the decoding is tested natively.
#[derive(Default)]
pub(crate) struct Replies {
    /// `received[start..end]` is read and not yet decoded. It is zeroed
    /// only when it grows, never per read.
    received: Vec<u8>,
    start: usize,
    end: usize,
}

impl Replies {
    /// The next whole reply, or `None` until more bytes arrive. An error
    /// leaves the stream in an unknown state: the connection is dropped.
    pub(crate) fn next(&mut self) -> Result<Option<OwnedFrame>, String> {
        let pending = &self.received[self.start..self.end];
        check_header(pending)?;
        match decode(pending) {
            Ok(Some((frame, used))) => {
                self.start += used;
                Ok(Some(frame))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(format!("malformed reply: {e:?}")),
        }
    }

    /// The next whole reply, which may be an array, or `None` until more
    /// bytes arrive ([`Connection::nested_command`]).
    pub(crate) fn next_nested(&mut self) -> Result<Option<OwnedFrame>, String> {
        let pending = &self.received[self.start..self.end];
        let Some(len) = nested_len(pending)? else {
            return Ok(None);
        };
        match decode(&pending[..len]) {
            Ok(Some((frame, used))) if used == len => {
                self.start += used;
                Ok(Some(frame))
            }
            Ok(_) => Err("malformed reply: not one whole value".into()),
            Err(e) => Err(format!("malformed reply: {e:?}")),
        }
    }

    /// Free space for at least [`READ_SIZE`] more bytes, to read into; then
    /// [`Replies::filled`] says how many were read.
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.start > self.received.len() / 2 {
            self.received.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if self.received.len() - self.end < READ_SIZE {
            let len = (self.received.len() * 2).max(self.end + READ_SIZE);
            self.received.resize(len, 0);
        }
        &mut self.received[self.end..]
    }

    /// `n` bytes were read into [`Replies::spare`].
    pub(crate) fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// The next whole reply, calling `read` (which reads at least one
    /// byte into the buffer it is given, or fails) until it is in. A long
    /// bulk string goes to `read_long` with the part of it already read
    /// and its length; it reads the rest itself (the host, straight into a
    /// payload) or declines with `None` before reading anything, and the
    /// value is then read into its own buffer, exactly as long as the
    /// reply. Either way nothing past the reply is consumed.
    pub(crate) fn read_reply<V, E>(
        &mut self,
        mut read: impl FnMut(&mut [u8]) -> Result<usize, E>,
        mut read_long: impl FnMut(&[u8], usize) -> Result<Option<V>, E>,
        malformed: impl Fn(String) -> E,
    ) -> Result<Reply<V>, E> {
        loop {
            if let Some(len) = self.long_bulk().map_err(&malformed)? {
                // Fewer than `len + 2` bytes are buffered (`long_bulk`).
                let head = &self.received[self.start..self.end.min(self.start + len)];
                if let Some(value) = read_long(head, len)? {
                    self.start += head.len();
                    self.expect_crlf(&mut read, &malformed)?;
                    return Ok(Reply::Long(value));
                }
                let mut value = vec![0; len + 2];
                let mut filled = self.end - self.start;
                value[..filled].copy_from_slice(&self.received[self.start..self.end]);
                (self.start, self.end) = (0, 0);
                while filled < value.len() {
                    filled += read(&mut value[filled..])?;
                }
                if value[len..] != *b"\r\n" {
                    return Err(malformed("a bulk string not followed by CRLF".into()));
                }
                value.truncate(len);
                return Ok(Reply::Frame(OwnedFrame::BulkString(value)));
            }
            match self.next().map_err(&malformed)? {
                Some(frame) => return Ok(Reply::Frame(frame)),
                None => {
                    let n = read(self.spare())?;
                    self.filled(n);
                }
            }
        }
    }

    /// Consume the CRLF that ends a bulk string read by `read_long`.
    fn expect_crlf<E>(
        &mut self,
        mut read: impl FnMut(&mut [u8]) -> Result<usize, E>,
        malformed: impl Fn(String) -> E,
    ) -> Result<(), E> {
        while self.end - self.start < 2 {
            let n = read(self.spare())?;
            self.filled(n);
        }
        if self.received[self.start..self.start + 2] != *b"\r\n" {
            return Err(malformed("a bulk string not followed by CRLF".into()));
        }
        self.start += 2;
        Ok(())
    }

    /// If the pending reply is a bulk string of at least [`DIRECT_BULK`]
    /// bytes whose header is in and whose body is not yet all in: consume
    /// the header and return the length.
    fn long_bulk(&mut self) -> Result<Option<usize>, String> {
        let pending = &self.received[self.start..self.end];
        if pending.first() != Some(&b'$') {
            return Ok(None);
        }
        check_header(pending)?;
        let head = &pending[..pending.len().min(MAX_LINE)];
        let Some(eol) = head.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        // Anything else (`$-1`, a malformed length) is the decoder's.
        let len = std::str::from_utf8(&head[1..eol])
            .ok()
            .and_then(|n| n.parse::<usize>().ok());
        match len {
            Some(len) if len >= DIRECT_BULK && pending.len() < eol + 2 + len + 2 => {
                self.start += eol + 2;
                Ok(Some(len))
            }
            _ => Ok(None),
        }
    }
}

/// Longest reply accepted from a command answered with an array (a
/// cluster's map: a few hundred bytes per node).
pub(crate) const MAX_NESTED_REPLY: usize = 4 << 20;
/// Deepest nesting of arrays accepted (`CLUSTER SHARDS` uses three).
pub(crate) const MAX_DEPTH: usize = 6;

/// The length of the RESP2 value at the start of `bytes` once it is all
/// in (`None` before), walking only its headers: arrays nested deeper than
/// [`MAX_DEPTH`], longer than [`MAX_NESTED_REPLY`] or of other types than
/// RESP2's are refused before the (recursive) decoder sees them.
fn nested_len(bytes: &[u8]) -> Result<Option<usize>, String> {
    let mut at = 0;
    // Values still to come at each open level.
    let mut open: Vec<u64> = vec![1];
    while let Some(left) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        if at > MAX_NESTED_REPLY {
            return Err(format!("a reply longer than {MAX_NESTED_REPLY} bytes"));
        }
        let rest = &bytes[at..];
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return if rest.len() > MAX_LINE {
                Err(format!("a reply line longer than {MAX_LINE} bytes"))
            } else {
                Ok(None)
            };
        };
        let number = || {
            std::str::from_utf8(&rest[1..eol])
                .ok()
                .and_then(|n| n.parse::<i64>().ok())
                .ok_or_else(|| "malformed reply: a bad length".to_owned())
        };
        at += eol + 2;
        match rest[0] {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let len = number()?;
                if let Ok(len) = usize::try_from(len) {
                    if len > MAX_NESTED_REPLY {
                        return Err(format!("a reply longer than {MAX_NESTED_REPLY} bytes"));
                    }
                    at += len + 2;
                    if bytes.len() < at {
                        return Ok(None);
                    }
                }
            }
            b'*' => {
                if let Ok(count) = u64::try_from(number()?)
                    && count > 0
                {
                    if open.len() > MAX_DEPTH {
                        return Err(format!("a reply nested deeper than {MAX_DEPTH} arrays"));
                    }
                    open.push(count);
                }
            }
            other => {
                return Err(format!(
                    "unexpected reply type {:?} in an array",
                    char::from(other)
                ));
            }
        }
    }
    Ok(Some(at))
}

/// Refuse, before decoding, what no command kvwasm sends is answered with:
/// arrays (the decoder recurses into nested ones, so a hostile server
/// could overflow the stack), other reply types, endless lines, and bulk
/// strings longer than Redis stores.
fn check_header(pending: &[u8]) -> Result<(), String> {
    let Some(&kind) = pending.first() else {
        return Ok(());
    };
    if !matches!(kind, b'+' | b'-' | b':' | b'$') {
        return Err(format!(
            "unexpected reply type {:?}: no command kvwasm sends is answered with it",
            char::from(kind)
        ));
    }
    let head = &pending[..pending.len().min(MAX_LINE)];
    let Some(eol) = head.windows(2).position(|w| w == b"\r\n") else {
        if pending.len() >= MAX_LINE {
            return Err(format!("a reply line longer than {MAX_LINE} bytes"));
        }
        return Ok(());
    };
    let bulk_len = std::str::from_utf8(&head[1..eol])
        .ok()
        .and_then(|n| n.parse::<u64>().ok());
    match bulk_len {
        Some(len) if kind == b'$' && len > MAX_BULK => Err(format!(
            "a bulk reply of {len} bytes, over the {MAX_BULK}-byte limit"
        )),
        _ => Ok(()),
    }
}

impl Connection {
    /// Connect to every one of `addresses`, then `AUTH` and `SELECT` as
    /// configured: the connects and TLS handshakes all under way at once,
    /// then the setup sent on every connection before any reply is read,
    /// so N nodes cost about one round of each, not N. One result per
    /// address, in order.
    pub(crate) fn open_all(
        endpoint: &Endpoint,
        addresses: &[&str],
        deadline: Instant,
    ) -> Vec<Result<Connection, ConnError>> {
        let fail = |address: &str, what: String| ConnError {
            message: format!("redis at {address}: {what}"),
            dropped: false,
            denied: false,
            not_granted: false,
        };
        let streams = kvwasm_guest_support::net::connect_streams(addresses, endpoint.tls, deadline);
        let mut opened: Vec<Result<Connection, ConnError>> = streams
            .into_iter()
            .zip(addresses)
            .map(|(stream, address)| {
                let stream = stream.map_err(|e| ConnError {
                    not_granted: e.contains(kvwasm_guest_support::net::NOT_GRANTED),
                    ..fail(address, e)
                })?;
                Ok(Connection {
                    stream,
                    peer: Peer {
                        address: (*address).to_owned(),
                        timeout: endpoint.timeout,
                        read_request: Cell::new(SMALL_READ),
                    },
                    replies: Replies::default(),
                })
            })
            .collect();
        let mut setup: Vec<Vec<Arg<'_>>> = Vec::new();
        if let Some(password) = &endpoint.password {
            let mut auth = vec![Arg::Bytes(b"AUTH")];
            if let Some(user) = &endpoint.user {
                auth.push(Arg::Bytes(user.as_bytes()));
            }
            auth.push(Arg::Bytes(password.as_bytes()));
            setup.push(auth);
        }
        let db = endpoint.db.to_string();
        if endpoint.db != 0 {
            setup.push(vec![Arg::Bytes(b"SELECT"), Arg::Bytes(db.as_bytes())]);
        }
        if setup.is_empty() {
            return opened;
        }
        for conn in &mut opened {
            if let Ok(open) = conn
                && let Err(e) = open.send_commands(setup.iter().map(Vec::as_slice), deadline)
            {
                *conn = Err(e);
            }
        }
        for conn in &mut opened {
            let Ok(open) = conn else { continue };
            let refusal = match open.read_replies(setup.len(), deadline) {
                Err(e) => Some(e),
                Ok(replies) => replies.into_iter().find_map(|reply| match reply {
                    Reply::Frame(OwnedFrame::Error(message)) => Some(ConnError {
                        denied: is_auth_error(&message),
                        ..fail(
                            &open.peer.address,
                            format!("the server refused the connection setup: {message}"),
                        )
                    }),
                    _ => None,
                }),
            };
            if let Some(e) = refusal {
                *conn = Err(e);
            }
        }
        opened
    }

    /// Send every command without reading: the replies are read later by
    /// [`Connection::read_replies`], so several servers work at once.
    pub(crate) fn send_commands<'c, 'a: 'c>(
        &mut self,
        commands: impl Iterator<Item = &'c [Arg<'a>]>,
        deadline: Instant,
    ) -> Result<(), ConnError> {
        let mut out = Vec::with_capacity(WRITE_BATCH);
        for command in commands {
            self.encode(&mut out, command, deadline)?;
            if out.len() >= WRITE_BATCH {
                self.send(&out, deadline)?;
                out.clear();
            }
        }
        self.send(&out, deadline)
    }

    /// Read `count` replies, in order, by `deadline`.
    pub(crate) fn read_replies(
        &mut self,
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<Reply<Payload>>, ConnError> {
        let mut replies = Vec::with_capacity(count);
        while replies.len() < count {
            replies.push(self.next_reply(deadline)?);
        }
        Ok(replies)
    }

    /// Send `command`, whose reply may be an array (`CLUSTER SHARDS`), and
    /// read that reply: at most [`MAX_NESTED_REPLY`] bytes, nested at most
    /// [`MAX_DEPTH`] deep (checked before the recursive decoder sees it).
    pub(crate) fn nested_command(
        &mut self,
        command: &[&[u8]],
        deadline: Instant,
    ) -> Result<OwnedFrame, ConnError> {
        let args: Vec<Arg<'_>> = command.iter().map(|a| Arg::Bytes(a)).collect();
        self.send_commands(std::iter::once(args.as_slice()), deadline)?;
        loop {
            match self
                .replies
                .next_nested()
                .map_err(|e| self.peer.failure(e, false))?
            {
                Some(frame) => return Ok(frame),
                None => {
                    let buf = self.replies.spare();
                    let n = self.peer.receive(&self.stream, buf, deadline)?;
                    self.replies.filled(n);
                }
            }
        }
    }

    /// Append `command` to `out` as a RESP array of bulk strings. A payload
    /// argument is sent at once, after what `out` holds so far, straight
    /// from host memory (`payload-streams.write-all`); `out` then holds
    /// what follows it.
    fn encode(
        &mut self,
        out: &mut Vec<u8>,
        command: &[Arg<'_>],
        deadline: Instant,
    ) -> Result<(), ConnError> {
        let Some(bytes) = command.iter().map(Arg::bytes).collect::<Option<Vec<_>>>() else {
            out.extend_from_slice(format!("*{}\r\n", command.len()).as_bytes());
            for arg in command {
                match arg {
                    Arg::Bytes(b) => append(out, &BorrowedFrame::BulkString(b))
                        .map_err(|e| self.peer.encode_failed(e))?,
                    Arg::Payload(p) => {
                        out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
                        self.send(out, deadline)?;
                        out.clear();
                        self.send_payload(p, deadline)?;
                        out.extend_from_slice(b"\r\n");
                    }
                }
            }
            return Ok(());
        };
        let args: Vec<BorrowedFrame<'_>> =
            bytes.into_iter().map(BorrowedFrame::BulkString).collect();
        append(out, &BorrowedFrame::Array(&args)).map_err(|e| self.peer.encode_failed(e))
    }

    /// Hand a payload to the socket: the host writes it from its own
    /// memory, waiting while the socket is full, within `deadline`.
    fn send_payload(&mut self, data: &Payload, deadline: Instant) -> Result<(), ConnError> {
        let wait = self.peer.remaining(deadline)?;
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        match write_all(self.stream.output(), data, nanos) {
            Ok(()) => Ok(()),
            Err(WriteError::TimedOut) => Err(self.peer.timed_out()),
            Err(WriteError::Closed) => Err(self
                .peer
                .failure("the server closed the connection".into(), true)),
            Err(WriteError::Failed(why)) => {
                Err(self.peer.failure(format!("send failed: {why}"), false))
            }
        }
    }

    fn send(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), ConnError> {
        while !bytes.is_empty() {
            self.stream
                .set_write_timeout(Some(self.peer.remaining(deadline)?))
                .map_err(|e| self.peer.io_failure("cannot set a write timeout", e))?;
            match self.stream.write(bytes) {
                Ok(0) => {
                    return Err(self
                        .peer
                        .failure("the server closed the connection".into(), true));
                }
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.peer.io_failure("send failed", e)),
            }
        }
        Ok(())
    }

    fn next_reply(&mut self, deadline: Instant) -> Result<Reply<Payload>, ConnError> {
        let mut replies = std::mem::take(&mut self.replies);
        let (stream, peer) = (&self.stream, &self.peer);
        let reply = replies.read_reply(
            |buf| peer.receive(stream, buf, deadline),
            |head, len| peer.receive_payload(stream, head, len, deadline),
            |e| peer.failure(e, false),
        );
        self.replies = replies;
        reply
    }
}

/// Whether `commands` can go through [`send_together`]: they hold no host
/// payload (a long value, which the host writes whole).
pub(crate) fn all_bytes(commands: &[&[Arg<'_>]]) -> bool {
    commands
        .iter()
        .all(|command| command.iter().all(|a| a.bytes().is_some()))
}

/// One pipeline of [`send_together`]: the commands still to encode, and
/// the encoded bytes not yet taken by the socket.
struct Outgoing<'p, 'c, 'a> {
    conn: &'p Connection,
    commands: std::slice::Iter<'p, &'c [Arg<'a>]>,
    out: Vec<u8>,
    sent: usize,
    result: Option<Result<(), ConnError>>,
}

/// Send each pipeline on its connection, all at once: bytes go to whichever
/// connection takes them now, and only when none does is there a wait (for
/// any of them), so a server slow to read holds back only its own
/// pipeline. Commands must hold bytes only ([`all_bytes`]).
/// One result per pipeline; after an error a connection's state is
/// unknown (drop it).
pub(crate) fn send_together(
    pipelines: &[(&Connection, Vec<&[Arg<'_>]>)],
    deadline: Instant,
) -> Vec<Result<(), ConnError>> {
    let mut outgoing: Vec<Outgoing<'_, '_, '_>> = pipelines
        .iter()
        .map(|(conn, commands)| Outgoing {
            conn,
            commands: commands.iter(),
            out: Vec::new(),
            sent: 0,
            result: None,
        })
        .collect();
    loop {
        let mut progressed = false;
        let mut blocked: Vec<usize> = Vec::new();
        for (at, o) in outgoing.iter_mut().enumerate() {
            if o.result.is_some() {
                continue;
            }
            if o.sent == o.out.len() {
                (o.sent, progressed) = (0, true);
                o.out.clear();
                while o.out.len() < WRITE_BATCH
                    && let Some(command) = o.commands.next()
                {
                    if let Err(e) = encode_bytes(&mut o.out, command) {
                        o.result = Some(Err(o.conn.peer.encode_failed(e)));
                        break;
                    }
                }
                if o.out.is_empty() && o.result.is_none() {
                    o.result = Some(Ok(()));
                }
                if o.result.is_some() {
                    continue;
                }
            }
            match o.conn.stream.try_write(&o.out[o.sent..]) {
                Ok(0) => blocked.push(at),
                Ok(n) => (o.sent, progressed) = (o.sent + n, true),
                Err(e) => o.result = Some(Err(o.conn.peer.io_failure("send failed", e))),
            }
        }
        if blocked.is_empty() && !progressed {
            break;
        }
        if progressed {
            continue;
        }
        // Every pipeline left is waiting for its server to read.
        let conns: Vec<&Connection> = blocked.iter().map(|&b| outgoing[b].conn).collect();
        let streams: Vec<&Stream> = conns.iter().map(|c| &c.stream).collect();
        let waited = conns[0].peer.remaining(deadline).and_then(|wait| {
            kvwasm_guest_support::net::wait_writable(&streams, wait)
                .map_err(|e| conns[0].peer.io_failure("send failed", e))
        });
        if waited.is_err() {
            for (&b, conn) in blocked.iter().zip(&conns) {
                outgoing[b].result = Some(Err(conn.peer.timed_out()));
            }
        }
    }
    outgoing
        .into_iter()
        .map(|o| o.result.unwrap_or(Ok(())))
        .collect()
}

/// Append `command`, which holds bytes only, to `out` as a RESP array of
/// bulk strings.
fn encode_bytes(out: &mut Vec<u8>, command: &[Arg<'_>]) -> Result<(), String> {
    let args: Vec<BorrowedFrame<'_>> = command
        .iter()
        .map(|a| a.bytes().map(BorrowedFrame::BulkString))
        .collect::<Option<_>>()
        .ok_or("a host payload in a command sent with others")?;
    append(out, &BorrowedFrame::Array(&args))
}

impl Peer {
    /// Read at least one byte from `stream` into `buf`, asking for no more
    /// than the current read request (see [`SMALL_READ`]).
    fn receive(
        &self,
        stream: &Stream,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<usize, ConnError> {
        let asked = self.read_request.get().min(buf.len());
        let buf = &mut buf[..asked];
        loop {
            let wait = self.remaining(deadline)?;
            stream
                .set_read_timeout(Some(wait))
                .map_err(|e| self.io_failure("cannot set a read timeout", e))?;
            match stream.read(buf) {
                Ok(0) => return Err(self.failure("the server closed the connection".into(), true)),
                Ok(n) => {
                    self.read_request.set(next_read_request(asked, n));
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_failure("receive failed", e)),
            }
        }
    }

    /// Read a long value straight into a host payload: `head` is its start,
    /// already received. `None` if the host declined before reading (a
    /// payload limit): then the caller reads it.
    fn receive_payload(
        &self,
        stream: &Stream,
        head: &[u8],
        len: usize,
        deadline: Instant,
    ) -> Result<Option<Payload>, ConnError> {
        let wait = self.remaining(deadline)?;
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        match read_exact(stream.input(), head, len as u64, nanos) {
            Ok(payload) => Ok(Some(payload)),
            Err(ReadError::Limit(_)) => Ok(None),
            Err(ReadError::Closed) => {
                Err(self.failure("the server closed the connection".into(), true))
            }
            Err(ReadError::TimedOut) => Err(self.timed_out()),
            Err(ReadError::Failed(why)) => {
                Err(self.failure(format!("receive failed: {why}"), false))
            }
        }
    }

    fn remaining(&self, deadline: Instant) -> Result<Duration, ConnError> {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| self.timed_out())
    }

    fn timed_out(&self) -> ConnError {
        self.failure(
            format!("no reply within {} ms", self.timeout.as_millis()),
            false,
        )
    }

    fn io_failure(&self, what: &str, e: std::io::Error) -> ConnError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self.timed_out(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted => {
                self.failure(format!("{what}: {e}"), true)
            }
            _ => self.failure(format!("{what}: {e}"), false),
        }
    }

    fn encode_failed(&self, why: String) -> ConnError {
        self.failure(format!("cannot encode a command: {why}"), false)
    }

    fn failure(&self, what: String, dropped: bool) -> ConnError {
        ConnError {
            message: format!("redis at {}: {what}", self.address),
            dropped,
            denied: false,
            not_granted: false,
        }
    }
}

/// `AUTH` failures and missing permissions, as Redis words them.
fn is_auth_error(message: &str) -> bool {
    [
        "WRONGPASS",
        "NOAUTH",
        "NOPERM",
        "invalid password",
        "invalid username",
    ]
    .iter()
    .any(|w| message.contains(w))
}

/// An error reply to `command`, with the server's words.
pub(crate) fn server_error(command: &str, message: &str) -> Error {
    let text = format!("redis {command}: {message}");
    if is_auth_error(message) {
        Error::Denied(text)
    } else if ["LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN"]
        .iter()
        .any(|w| message.starts_with(w))
    {
        Error::Unavailable(text)
    } else {
        Error::Io(text)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use redis_protocol::resp2::encode::encode;
    use redis_protocol::resp2::types::Resp2Frame;

    use super::*;

    /// Feed `stream` as reads cut at `cuts` (taken modulo its length; a
    /// read also ends where the spare room does), decoding after each read
    /// as the connection does; stop at the first error.
    fn feed(stream: &[u8], cuts: &[usize]) -> (Vec<OwnedFrame>, Option<String>) {
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        ends.push(stream.len());
        ends.sort_unstable();
        let (mut replies, mut frames, mut at) = (Replies::default(), Vec::new(), 0);
        for end in ends {
            while at < end {
                let room = replies.spare();
                let n = room.len().min(end - at);
                room[..n].copy_from_slice(&stream[at..at + n]);
                replies.filled(n);
                at += n;
                loop {
                    match replies.next() {
                        Ok(Some(frame)) => frames.push(frame),
                        Ok(None) => break,
                        Err(e) => return (frames, Some(e)),
                    }
                }
            }
        }
        (frames, None)
    }

    fn encoded(frames: &[OwnedFrame]) -> Vec<u8> {
        let mut out = Vec::new();
        for frame in frames {
            let at = out.len();
            out.resize(at + frame.encode_len(false), 0);
            encode(&mut out[at..], frame, false).unwrap();
        }
        out
    }

    /// The replies the commands kvwasm sends get (`+OK`, `-ERR …`, `:1`,
    /// `$…`, `$-1`), with bulk strings up to past one read's size.
    fn reply() -> impl Strategy<Value = OwnedFrame> {
        prop_oneof![
            "[ -~]{0,40}".prop_map(|s| OwnedFrame::SimpleString(s.into_bytes())),
            "[ -~]{0,80}".prop_map(OwnedFrame::Error),
            any::<i64>().prop_map(OwnedFrame::Integer),
            Just(OwnedFrame::Null),
            proptest::collection::vec(any::<u8>(), 0..2048).prop_map(OwnedFrame::BulkString),
            (READ_SIZE - 8..READ_SIZE + 300_000, any::<u8>())
                .prop_map(|(len, b)| OwnedFrame::BulkString(vec![b; len])),
        ]
    }

    #[test]
    fn read_requests_grow_with_full_reads_and_shrink_with_short_ones() {
        // A pipeline's replies: each full read doubles the next, to the
        // host's most per read.
        let mut asked = SMALL_READ;
        let mut sizes = vec![asked];
        while asked < LARGE_READ {
            asked = next_read_request(asked, asked);
            sizes.push(asked);
        }
        assert_eq!(sizes, [4, 8, 16, 32, 64].map(|k| k << 10));
        assert_eq!(next_read_request(LARGE_READ, LARGE_READ), LARGE_READ);
        // Then `+OK` replies, one per round trip: back down to the least.
        assert_eq!(next_read_request(LARGE_READ, 5), LARGE_READ / 2);
        assert_eq!(next_read_request(SMALL_READ, 5), SMALL_READ);
        // A read between a quarter and all of the request keeps it.
        assert_eq!(next_read_request(16 << 10, 4 << 10), 16 << 10);
        assert_eq!(next_read_request(16 << 10, (16 << 10) - 1), 16 << 10);
    }

    #[test]
    fn deeply_nested_arrays_are_refused_before_decoding() {
        // The decoder recurses once per level: this would overflow any stack.
        let stream = b"*1\r\n".repeat(1_000_000);
        let (frames, error) = feed(&stream, &[]);
        assert!(frames.is_empty());
        assert!(error.unwrap().contains("unexpected reply type '*'"));
    }

    #[test]
    fn nested_replies_are_read_whole_and_bounded_in_depth() {
        let ok = b"*3\r\n*2\r\n:1\r\n$3\r\nabc\r\n$-1\r\n+x\r\n";
        assert_eq!(nested_len(ok), Ok(Some(ok.len())));
        for cut in 0..ok.len() {
            assert_eq!(nested_len(&ok[..cut]), Ok(None), "cut at {cut}");
        }
        let deep = [b"*1\r\n".repeat(MAX_DEPTH + 1), b":1\r\n".to_vec()].concat();
        assert!(nested_len(&deep).unwrap_err().contains("deeper"));
        assert!(nested_len(&b"*1\r\n".repeat(1_000_000)).is_err());
        let shallow = [b"*1\r\n".repeat(MAX_DEPTH), b":1\r\n".to_vec()].concat();
        assert_eq!(nested_len(&shallow), Ok(Some(shallow.len())));
        assert!(nested_len(b"%1\r\n").is_err());
    }

    #[test]
    fn endless_lines_and_oversized_bulk_strings_are_refused() {
        let (_, error) = feed(&vec![b'+'; MAX_LINE + 1], &[]);
        assert!(error.unwrap().contains("longer than"));
        let (_, error) = feed(b"$536870913\r\nxyz", &[]);
        assert!(error.unwrap().contains("over the"));
        // At the limit it is a reply still on its way.
        assert_eq!(feed(b"$536870912\r\nxyz", &[]), (vec![], None));
    }

    /// `stream` read 64 KiB at a time (as wasi:sockets hands it over),
    /// long values read by a stand-in for the host when `host_reads`.
    fn read_all(
        stream: &[u8],
        replies: usize,
        host_reads: bool,
    ) -> (Vec<Result<Reply<Vec<u8>>, String>>, Replies) {
        let at = std::cell::Cell::new(0);
        let read = |buf: &mut [u8]| -> Result<usize, String> {
            let n = buf.len().min(stream.len() - at.get()).min(64 << 10);
            buf[..n].copy_from_slice(&stream[at.get()..at.get() + n]);
            at.set(at.get() + n);
            Ok(n)
        };
        let read_long = |head: &[u8], len: usize| -> Result<Option<Vec<u8>>, String> {
            if !host_reads {
                return Ok(None);
            }
            let rest = len - head.len();
            let mut value = head.to_vec();
            value.extend_from_slice(&stream[at.get()..at.get() + rest]);
            at.set(at.get() + rest);
            Ok(Some(value))
        };
        let mut state = Replies::default();
        let got = (0..replies)
            .map(|_| state.read_reply(read, read_long, |e| e))
            .collect();
        (got, state)
    }

    #[test]
    fn long_bulk_strings_bypass_the_read_buffer() {
        // Three 1 MiB values and a status: the read buffer never holds a
        // value, whether the host reads them or the guest does.
        let values: Vec<OwnedFrame> = (0..3u8)
            .map(|i| OwnedFrame::BulkString(vec![i; 1 << 20]))
            .chain([OwnedFrame::SimpleString(b"OK".to_vec())])
            .collect();
        let stream = encoded(&values);
        for host_reads in [false, true] {
            let (got, replies) = read_all(&stream, values.len(), host_reads);
            for (got, value) in got.into_iter().zip(&values) {
                let got = match got.unwrap() {
                    Reply::Long(bytes) if host_reads => OwnedFrame::BulkString(bytes),
                    Reply::Frame(frame) => frame,
                    Reply::Long(_) => panic!("read by the host, which declined"),
                };
                assert_eq!(&got, value);
            }
            assert!(
                replies.received.len() <= READ_SIZE,
                "{}",
                replies.received.len()
            );
            // A body not followed by CRLF is refused.
            let mut bad = encoded(&values[..1]);
            let crlf = bad.len() - 2;
            bad[crlf] = b'x';
            let (got, _) = read_all(&bad, 1, host_reads);
            let error = got.into_iter().next().unwrap().unwrap_err();
            assert!(error.contains("CRLF"), "{error}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// However the bytes are split across reads, every reply comes out
        /// whole, in order, and nothing else.
        #[test]
        fn replies_split_anywhere_decode_exactly(
            frames in proptest::collection::vec(reply(), 1..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
        ) {
            let stream = encoded(&frames);
            prop_assert_eq!(feed(&stream, &cuts), (frames, None));
        }

        /// The same through `read_reply`, which hands long bulk strings to
        /// `read_long` (the host, in the guest) or, when it declines, reads
        /// them straight into their own buffers: every reply whole, in
        /// order, and exactly the bytes of the replies consumed.
        #[test]
        fn replies_read_directly_decode_exactly(
            frames in proptest::collection::vec(reply(), 1..12),
            cuts in proptest::collection::vec(1..400_000usize, 0..24),
            host_reads in any::<bool>(),
        ) {
            let stream = encoded(&frames);
            let source = std::cell::RefCell::new((0usize, cuts.into_iter().cycle()));
            let mut read = |buf: &mut [u8]| -> Result<usize, String> {
                let (at, cuts) = &mut *source.borrow_mut();
                let n = buf.len().min(stream.len() - *at).min(cuts.next().unwrap_or(usize::MAX));
                if n == 0 {
                    return Err("read past the replies".into());
                }
                buf[..n].copy_from_slice(&stream[*at..*at + n]);
                *at += n;
                Ok(n)
            };
            let mut long_reads = 0;
            let mut read_long = |head: &[u8], len: usize| -> Result<Option<Vec<u8>>, String> {
                if !host_reads {
                    return Ok(None);
                }
                long_reads += 1;
                let (at, _) = &mut *source.borrow_mut();
                let rest = len - head.len();
                if stream.len() - *at < rest {
                    return Err("read past the replies".into());
                }
                let mut value = head.to_vec();
                value.extend_from_slice(&stream[*at..*at + rest]);
                *at += rest;
                Ok(Some(value))
            };
            let mut replies = Replies::default();
            for frame in &frames {
                let got = match replies
                    .read_reply(&mut read, &mut read_long, |e| e)
                    .map_err(TestCaseError::fail)?
                {
                    Reply::Frame(frame) => frame,
                    Reply::Long(value) => OwnedFrame::BulkString(value),
                };
                prop_assert_eq!(&got, frame);
            }
            prop_assert_eq!(replies.start, replies.end, "nothing left over");
            let long = frames.iter().filter(|f| matches!(f, OwnedFrame::BulkString(b) if b.len() >= DIRECT_BULK)).count();
            prop_assert!(long_reads <= long);
        }

        /// A stream cut short yields the whole replies before the cut,
        /// then waits: never an error, never a partial reply.
        #[test]
        fn truncated_streams_wait_for_more(
            frames in proptest::collection::vec(reply(), 1..8),
            cut in any::<usize>(),
        ) {
            let stream = encoded(&frames);
            let cut = cut % stream.len();
            let (got, error) = feed(&stream[..cut], &[]);
            prop_assert_eq!(error, None);
            prop_assert!(got.len() < frames.len());
            prop_assert_eq!(&got[..], &frames[..got.len()]);
        }

        /// Garbage (random bytes, or random bytes after a valid type byte
        /// and length): an error or a wait, never a panic or an abort.
        #[test]
        fn garbage_is_refused_or_awaited_never_a_crash(
            head in prop_oneof![
                Just(Vec::new()),
                "[-+:$*%_,#!=(|~>][-0-9]{0,24}(\r\n)?".prop_map(String::into_bytes),
            ],
            tail in proptest::collection::vec(any::<u8>(), 0..512),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let stream = [head, tail].concat();
            let _ = feed(&stream, &cuts);
        }
    }
}
