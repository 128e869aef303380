//! One TCP connection to Redis, speaking RESP2 through `redis-protocol`,
//! with every wait bounded by the configured deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use kvwasm_guest_support::{Error, Settings};
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::encode::encode_borrowed;
use redis_protocol::resp2::types::{BorrowedFrame, OwnedFrame};

/// Where and how to connect, from settings.
pub(crate) struct Endpoint {
    address: String,
    db: u32,
    user: Option<String>,
    password: Option<String>,
    /// The budget of one operation: connecting (if needed) and one
    /// pipeline, together.
    pub(crate) timeout: Duration,
}

impl Endpoint {
    pub(crate) fn from_settings(settings: &Settings) -> Result<Endpoint, Error> {
        Ok(Endpoint {
            address: settings.required("address")?.to_owned(),
            db: settings.parse_or("db", 0)?,
            user: settings.get("user").map(str::to_owned),
            password: settings.secret("password", "REDIS_PASSWORD"),
            timeout: Duration::from_millis(settings.parse_or("timeout_ms", 5000)?),
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
    denied: bool,
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
    stream: TcpStream,
    address: String,
    timeout: Duration,
    /// Receive buffer: `received[start..end]` is read and not yet decoded.
    /// It is zeroed only when it grows, never per read.
    received: Vec<u8>,
    start: usize,
    end: usize,
}

/// Writes are sent in pieces of about this size while encoding.
const WRITE_BATCH: usize = 256 << 10;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 256 << 10;

impl Connection {
    /// Connect, then `AUTH` and `SELECT` as configured.
    pub(crate) fn open(endpoint: &Endpoint, deadline: Instant) -> Result<Connection, ConnError> {
        let address = &endpoint.address;
        let fail = |what: String| ConnError {
            message: format!("redis at {address}: {what}"),
            dropped: false,
            denied: false,
        };
        let peer: SocketAddr = address
            .to_socket_addrs()
            .map_err(|e| {
                fail(format!(
                    "cannot resolve the address: {e} (is `dns = true` granted?)"
                ))
            })?
            .next()
            .ok_or_else(|| fail("the address resolves to nothing".into()))?;
        let wait = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                fail(format!(
                    "no time left to connect within {} ms",
                    endpoint.timeout.as_millis()
                ))
            })?;
        let stream = TcpStream::connect_timeout(&peer, wait).map_err(|e| {
            let hint = match e.kind() {
                ErrorKind::PermissionDenied => " (the peer is not granted in `net`)",
                _ => "",
            };
            fail(format!("cannot connect: {e}{hint}"))
        })?;
        // On wasm32-wasip2, std's `connect_timeout` can return before the
        // handshake has failed (a refused port); ask the socket.
        if let Some(e) = stream.take_error().ok().flatten() {
            return Err(fail(format!("cannot connect: {e}")));
        }
        stream
            .peer_addr()
            .map_err(|e| fail(format!("cannot connect: {e} (is the server up?)")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| fail(format!("cannot set TCP_NODELAY: {e}")))?;
        let mut conn = Connection {
            stream,
            address: address.clone(),
            timeout: endpoint.timeout,
            received: Vec::new(),
            start: 0,
            end: 0,
        };
        let mut hello: Vec<Vec<&[u8]>> = Vec::new();
        if let Some(password) = &endpoint.password {
            let mut auth: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &endpoint.user {
                auth.push(user.as_bytes());
            }
            auth.push(password.as_bytes());
            hello.push(auth);
        }
        let db = endpoint.db.to_string();
        if endpoint.db != 0 {
            hello.push(vec![b"SELECT", db.as_bytes()]);
        }
        if !hello.is_empty() {
            for reply in conn.pipeline(&hello, deadline)? {
                if let OwnedFrame::Error(message) = reply {
                    return Err(ConnError {
                        denied: is_auth_error(&message),
                        ..fail(format!(
                            "the server refused the connection setup: {message}"
                        ))
                    });
                }
            }
        }
        Ok(conn)
    }

    /// Send every command, then read exactly one reply per command, by
    /// `deadline`. Error replies are returned as frames, for the caller.
    pub(crate) fn pipeline(
        &mut self,
        commands: &[Vec<&[u8]>],
        deadline: Instant,
    ) -> Result<Vec<OwnedFrame>, ConnError> {
        let mut out = Vec::with_capacity(WRITE_BATCH);
        for command in commands {
            let args: Vec<BorrowedFrame<'_>> = command
                .iter()
                .map(|a| BorrowedFrame::BulkString(a))
                .collect();
            let frame = BorrowedFrame::Array(&args);
            let at = out.len();
            out.resize(at + frame.encode_len(false), 0);
            encode_borrowed(&mut out[at..], &frame, false)
                .map_err(|e| self.failure(format!("cannot encode a command: {e}"), false))?;
            if out.len() >= WRITE_BATCH {
                self.send(&out, deadline)?;
                out.clear();
            }
        }
        self.send(&out, deadline)?;
        let mut replies = Vec::with_capacity(commands.len());
        while replies.len() < commands.len() {
            replies.push(self.next_reply(deadline)?);
        }
        Ok(replies)
    }

    fn send(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), ConnError> {
        while !bytes.is_empty() {
            self.stream
                .set_write_timeout(Some(self.remaining(deadline)?))
                .map_err(|e| self.io_failure("cannot set a write timeout", e))?;
            match self.stream.write(bytes) {
                Ok(0) => return Err(self.failure("the server closed the connection".into(), true)),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_failure("send failed", e)),
            }
        }
        Ok(())
    }

    fn next_reply(&mut self, deadline: Instant) -> Result<OwnedFrame, ConnError> {
        loop {
            match decode(&self.received[self.start..self.end]) {
                Ok(Some((frame, used))) => {
                    self.start += used;
                    return Ok(frame);
                }
                Ok(None) => self.receive(deadline)?,
                Err(e) => {
                    return Err(self.failure(format!("malformed reply: {e:?}"), false));
                }
            }
        }
    }

    /// Append at least one byte from the socket to `received`.
    fn receive(&mut self, deadline: Instant) -> Result<(), ConnError> {
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
        loop {
            let wait = self.remaining(deadline)?;
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(|e| self.io_failure("cannot set a read timeout", e))?;
            match self.stream.read(&mut self.received[self.end..]) {
                Ok(0) => return Err(self.failure("the server closed the connection".into(), true)),
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_failure("receive failed", e)),
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

    fn failure(&self, what: String, dropped: bool) -> ConnError {
        ConnError {
            message: format!("redis at {}: {what}", self.address),
            dropped,
            denied: false,
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
    } else if message.starts_with("LOADING") || message.starts_with("BUSY") {
        Error::Unavailable(text)
    } else {
        Error::Io(text)
    }
}
