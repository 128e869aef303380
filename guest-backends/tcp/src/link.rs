//! One TCP connection to `kvwasm fabric serve`, with every wait bounded
//! by the call's deadline. What goes over it is [`crate::proto`].

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::{Duration, Instant};

use kvwasm_guest_support::Error;

use crate::proto::{Decoder, Expect, HELLO, Op, Response, request};

/// Frame bytes copied out of the host's payload per read.
const SLICE: u64 = 1 << 20;

/// A failed exchange: the connection is in an unknown state and must be
/// dropped. `protocol` means the peer broke the protocol (`io`), as
/// opposed to a network failure or a timeout (`unavailable`).
#[derive(Debug)]
pub(crate) struct LinkError {
    pub(crate) message: String,
    protocol: bool,
}

impl From<LinkError> for Error {
    fn from(e: LinkError) -> Error {
        if e.protocol {
            Error::Io(e.message)
        } else {
            Error::Unavailable(e.message)
        }
    }
}

/// An open connection that has exchanged the hello.
pub(crate) struct Link {
    stream: TcpStream,
    peer: String,
    timeout: Duration,
    decoder: Decoder,
}

impl Link {
    /// Connect to `peer` and exchange the hello, by `deadline`.
    pub(crate) fn open(
        peer: &str,
        timeout: Duration,
        max_frame: u64,
        deadline: Instant,
    ) -> Result<Link, LinkError> {
        let fail = |what: String| LinkError {
            message: format!("fabric peer {peer}: {what}"),
            protocol: false,
        };
        let stream = kvwasm_guest_support::net::connect(peer, deadline).map_err(fail)?;
        let mut link = Link {
            stream,
            peer: peer.to_owned(),
            timeout,
            decoder: Decoder::new(max_frame),
        };
        link.send(&HELLO, deadline)?;
        match link.next_response(Expect::Hello, deadline)? {
            Response::Hello => Ok(link),
            other => Err(link.unexpected("the hello", other)),
        }
    }

    /// Send a PUSH of the `len`-byte frame that `read(offset, len)` copies
    /// out of the host's payload, a slice of at most [`SLICE`] bytes at a
    /// time (the request header goes out with the first).
    pub(crate) fn send_push(
        &mut self,
        len: u64,
        mut read: impl FnMut(u64, u64) -> Vec<u8>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let mut out = request(Op::Push, len).to_vec();
        let mut sent = 0;
        loop {
            let want = (len - sent).min(SLICE);
            if want > 0 {
                let slice = read(sent, want);
                if slice.is_empty() || slice.len() as u64 > want {
                    return Err(self.protocol_error(format!(
                        "the frame payload gave {} bytes at offset {sent} of {len}",
                        slice.len()
                    )));
                }
                sent += slice.len() as u64;
                if out.is_empty() {
                    out = slice;
                } else {
                    out.extend_from_slice(&slice);
                }
            }
            self.send(&out, deadline)?;
            out.clear();
            if sent == len {
                return Ok(());
            }
        }
    }

    /// Write all of `bytes`.
    pub(crate) fn send(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), LinkError> {
        while !bytes.is_empty() {
            let wait = self.remaining(deadline)?;
            self.stream
                .set_write_timeout(Some(wait))
                .map_err(|e| self.io_error("cannot set a write timeout", e))?;
            match self.stream.write(bytes) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error("send failed", e)),
            }
        }
        Ok(())
    }

    /// The next response, answering `expect`.
    pub(crate) fn next_response(
        &mut self,
        expect: Expect,
        deadline: Instant,
    ) -> Result<Response, LinkError> {
        loop {
            match self.decoder.next(expect) {
                Ok(Some(response)) => return Ok(response),
                Ok(None) => self.receive(deadline)?,
                Err(e) => return Err(self.protocol_error(e)),
            }
        }
    }

    /// The bytes of a [`Response::Frame`] just returned.
    pub(crate) fn frame(&self, range: Range<usize>) -> &[u8] {
        self.decoder.frame(range)
    }

    /// A well-formed response that does not answer what was asked.
    pub(crate) fn unexpected(&self, what: &str, response: Response) -> LinkError {
        let response = match response {
            Response::Error(status, message) => format!("{status:?}: {message}"),
            other => format!("{other:?}"),
        };
        self.protocol_error(format!("{what} was answered with {response}"))
    }

    pub(crate) fn protocol_error(&self, what: String) -> LinkError {
        LinkError {
            message: format!("fabric peer {}: {what}", self.peer),
            protocol: true,
        }
    }

    /// Append at least one byte from the socket to the decoder.
    fn receive(&mut self, deadline: Instant) -> Result<(), LinkError> {
        loop {
            let wait = self.remaining(deadline)?;
            self.stream
                .set_read_timeout(Some(wait))
                .map_err(|e| self.io_error("cannot set a read timeout", e))?;
            match self.stream.read(self.decoder.spare()) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => {
                    self.decoder.filled(n);
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error("receive failed", e)),
            }
        }
    }

    fn remaining(&self, deadline: Instant) -> Result<Duration, LinkError> {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| self.timed_out())
    }

    fn timed_out(&self) -> LinkError {
        self.network_error(format!(
            "no response within {} ms (setting `timeout_ms`)",
            self.timeout.as_millis()
        ))
    }

    fn closed(&self) -> LinkError {
        self.network_error("the server closed the connection".into())
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> LinkError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self.timed_out(),
            _ => self.network_error(format!("{what}: {e}")),
        }
    }

    fn network_error(&self, what: String) -> LinkError {
        LinkError {
            message: format!("fabric peer {}: {what}", self.peer),
            protocol: false,
        }
    }
}
