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
use redis_protocol::resp2::encode::encode_borrowed;
use redis_protocol::resp2::types::{BorrowedFrame, OwnedFrame};

mod replies;

use replies::Replies;
pub(crate) use replies::Reply;

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
pub(crate) const WRITE_BATCH: usize = 256 << 10;

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
    /// read that reply: at most [`replies::MAX_NESTED_REPLY`] bytes, nested at
    /// most [`replies::MAX_DEPTH`] deep (checked before the recursive decoder sees it).
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

    /// Write all of `bytes`, waiting while the socket is full, by `deadline`.
    pub(crate) fn send(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), ConnError> {
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
pub(crate) fn encode_bytes(out: &mut Vec<u8>, command: &[Arg<'_>]) -> Result<(), String> {
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
    use super::*;

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
}
