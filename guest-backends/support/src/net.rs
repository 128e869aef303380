//! Connecting to a granted TCP peer from a guest, the same way in every
//! guest that needs a socket (the Redis backend, the `tcp` fabric), with
//! TLS done by the host when the backend asks for it ([`connect_stream`]).

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Instant;

/// Resolve `address` (`host:port`), connect by `deadline`, make sure the
/// handshake really succeeded, and turn Nagle off. The error says what
/// failed, with a hint at the grant that may be missing; callers prefix it
/// with the peer's name.
pub fn connect(address: &str, deadline: Instant) -> Result<TcpStream, String> {
    let peer: SocketAddr = address
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve the address: {e} (is `dns = true` granted?)"))?
        .next()
        .ok_or("the address resolves to nothing")?;
    let wait = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or("no time left to connect")?;
    let stream = TcpStream::connect_timeout(&peer, wait).map_err(|e| {
        let hint = match e.kind() {
            ErrorKind::PermissionDenied => " (the peer is not granted in `net`)",
            _ => "",
        };
        format!("cannot connect: {e}{hint}")
    })?;
    // On wasm32-wasip2, std's `connect_timeout` can return before the
    // handshake has failed (a refused port); ask the socket.
    if let Some(e) = stream.take_error().ok().flatten() {
        return Err(format!("cannot connect: {e}"));
    }
    stream
        .peer_addr()
        .map_err(|e| format!("cannot connect: {e} (is the server up?)"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    Ok(stream)
}

/// Words in a [`connect_stream`] error when the sandbox refused the peer
/// (it is not granted in the backend's `net`), so callers can tell it from
/// a peer that is down.
pub const NOT_GRANTED: &str = "the peer is not granted in `net`";

/// A connection to a granted peer over raw `wasi:sockets` streams: plain
/// TCP, or a TLS session on it whose handshake and certificate checks the
/// host performed (`wasi:tls`, with the operator's roots). Read, written
/// and timed out like a [`TcpStream`]; unlike one, it hands out its input
/// stream, so a long value can be read straight into a payload
/// ([`crate::bindings::kvwasm::kv_store::payload_streams`]).
pub use raw::{Stream, wait_writable};

/// Connect to every one of `addresses` (`host:port`) by `deadline`, then,
/// if `tls`, ask the host for a TLS session on each socket with its host as
/// the server name: all peers at once ([`drive_all`]), so a client opening
/// N servers waits about one connect and one handshake, not N of each. One
/// result per address, in order. A peer that does not complete the
/// handshake by `deadline` fails: there is no fallback to plain text.
pub fn connect_streams(
    addresses: &[&str],
    tls: bool,
    deadline: Instant,
) -> Vec<Result<Stream, String>> {
    let dials = addresses
        .iter()
        .map(|address| {
            let peer = address
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve the address: {e} (is `dns = true` granted?)"))
                .and_then(|mut a| {
                    a.next()
                        .ok_or_else(|| "the address resolves to nothing".to_owned())
                });
            let server_name = tls.then(|| {
                address
                    .rsplit_once(':')
                    .map_or(*address, |(h, _)| h)
                    .trim_matches(['[', ']'])
            });
            match peer {
                Ok(peer) => raw::Dial::start(peer, server_name),
                Err(e) => raw::Dial::Failed(e),
            }
        })
        .collect();
    drive_all(
        dials,
        raw::Dial::advance,
        |pending| raw::Dial::wait_any(pending, deadline),
        raw::Dial::timed_out,
    )
}

/// [`connect_streams`] for one peer.
pub fn connect_stream(address: &str, tls: bool, deadline: Instant) -> Result<Stream, String> {
    let mut streams = connect_streams(&[address], tls, deadline);
    streams.pop().expect("one result per address")
}

/// Drive every one of `dials` to an outcome together: each is advanced as
/// far as it goes without waiting, then one wait covers all still pending
/// (`wait` says false when the deadline came first: those left get
/// `timed_out`), and again, until each has an outcome. Every peer's connect
/// is thus under way before the first wait. One outcome per dial, in order.
pub(crate) fn drive_all<D, R>(
    mut dials: Vec<D>,
    mut advance: impl FnMut(&mut D) -> Option<R>,
    mut wait: impl FnMut(&[&D]) -> bool,
    timed_out: impl Fn(&D) -> R,
) -> Vec<R> {
    let mut outcomes: Vec<Option<R>> = dials.iter().map(|_| None).collect();
    loop {
        for (dial, outcome) in dials.iter_mut().zip(&mut outcomes) {
            if outcome.is_none() {
                *outcome = advance(dial);
            }
        }
        let pending: Vec<&D> = dials
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| outcome.is_none())
            .map(|(dial, _)| dial)
            .collect();
        if pending.is_empty() {
            break;
        }
        if !wait(&pending) {
            for (dial, outcome) in dials.iter().zip(&mut outcomes) {
                if outcome.is_none() {
                    *outcome = Some(timed_out(dial));
                }
            }
            break;
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| outcome.expect("every dial has an outcome"))
        .collect()
}

mod raw {
    //! A TCP connection on raw `wasi:sockets` streams (std's `TcpStream`
    //! cannot hand its streams over), optionally with a TLS session on
    //! them, with the timeouts of a `TcpStream`.

    use std::cell::Cell;
    use std::io::{Error, ErrorKind};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use crate::bindings::wasi::io::poll::{Pollable, poll};
    use crate::bindings::wasi::io::streams::{InputStream, OutputStream, StreamError};
    use crate::tls_bindings::wasi::clocks::monotonic_clock;
    use crate::tls_bindings::wasi::sockets::instance_network::instance_network;
    use crate::tls_bindings::wasi::sockets::network::{
        ErrorCode, IpAddressFamily, IpSocketAddress, Ipv4SocketAddress, Ipv6SocketAddress,
    };
    use crate::tls_bindings::wasi::sockets::tcp::TcpSocket;
    use crate::tls_bindings::wasi::sockets::tcp_create_socket::create_tcp_socket;
    use crate::tls_bindings::wasi::tls::types::{
        ClientConnection, ClientHandshake, FutureClientStreams,
    };

    /// Fields drop in order: the streams, the TLS session if any, then
    /// the socket (a resource cannot go before its children).
    pub struct Stream {
        input: InputStream,
        output: OutputStream,
        _session: Option<ClientConnection>,
        _socket: TcpSocket,
        read_timeout: Cell<Option<Duration>>,
        write_timeout: Cell<Option<Duration>>,
    }

    /// Wait for `pollable` for at most `timeout` (forever if `None`).
    fn wait(pollable: &Pollable, timeout: Option<Duration>) -> std::io::Result<()> {
        let Some(timeout) = timeout else {
            pollable.block();
            return Ok(());
        };
        let timer = monotonic_clock::subscribe_duration(
            u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        );
        if poll(&[pollable, &timer]).contains(&0) {
            Ok(())
        } else {
            Err(Error::from(ErrorKind::TimedOut))
        }
    }

    /// Why a connect failed, with the grant to check when it was refused.
    fn connect_error(e: ErrorCode) -> String {
        match e {
            ErrorCode::AccessDenied => format!("cannot connect: {}", crate::net::NOT_GRANTED),
            e => format!("cannot connect: {e}"),
        }
    }

    fn stream_error(e: StreamError) -> Error {
        match e {
            StreamError::Closed => Error::from(ErrorKind::ConnectionReset),
            StreamError::LastOperationFailed(e) => Error::other(e.to_debug_string()),
        }
    }

    fn wasi_addr(addr: SocketAddr) -> (IpAddressFamily, IpSocketAddress) {
        match addr {
            SocketAddr::V4(a) => {
                let [a0, a1, a2, a3] = a.ip().octets();
                (
                    IpAddressFamily::Ipv4,
                    IpSocketAddress::Ipv4(Ipv4SocketAddress {
                        port: a.port(),
                        address: (a0, a1, a2, a3),
                    }),
                )
            }
            SocketAddr::V6(a) => {
                let s = a.ip().segments();
                (
                    IpAddressFamily::Ipv6,
                    IpSocketAddress::Ipv6(Ipv6SocketAddress {
                        port: a.port(),
                        flow_info: a.flowinfo(),
                        address: (s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
                        scope_id: a.scope_id(),
                    }),
                )
            }
        }
    }

    /// One peer's connection under way ([`crate::net::connect_streams`]).
    /// Fields drop in order: a handshake holds the socket's streams.
    pub enum Dial {
        Failed(String),
        Connecting {
            socket: TcpSocket,
            server_name: Option<String>,
        },
        Handshaking {
            pending: FutureClientStreams,
            socket: TcpSocket,
        },
        Spent,
    }

    impl Dial {
        /// Start connecting to `peer` (TLS with `server_name`, if any).
        pub fn start(peer: SocketAddr, server_name: Option<&str>) -> Dial {
            let (family, addr) = wasi_addr(peer);
            let started = create_tcp_socket(family).and_then(|socket| {
                socket.start_connect(&instance_network(), addr)?;
                Ok(socket)
            });
            match started {
                Ok(socket) => Dial::Connecting {
                    socket,
                    server_name: server_name.map(str::to_owned),
                },
                Err(e) => Dial::Failed(connect_error(e)),
            }
        }

        /// Go as far as possible without waiting: the outcome, or `None`
        /// while the connect or the TLS handshake is still under way.
        pub fn advance(&mut self) -> Option<Result<Stream, String>> {
            match std::mem::replace(self, Dial::Spent) {
                Dial::Failed(e) => Some(Err(e)),
                Dial::Spent => Some(Err("cannot connect: no connection under way".into())),
                Dial::Connecting {
                    socket,
                    server_name,
                } => match socket.finish_connect() {
                    Err(ErrorCode::WouldBlock) => {
                        *self = Dial::Connecting {
                            socket,
                            server_name,
                        };
                        None
                    }
                    Err(e) => Some(Err(connect_error(e))),
                    Ok((input, output)) => match server_name {
                        None => Some(Ok(Stream::new(input, output, None, socket))),
                        Some(name) => {
                            let handshake = ClientHandshake::new(&name, input, output);
                            *self = Dial::Handshaking {
                                pending: ClientHandshake::finish(handshake),
                                socket,
                            };
                            self.advance()
                        }
                    },
                },
                Dial::Handshaking { pending, socket } => {
                    let Some(outcome) = pending.get() else {
                        *self = Dial::Handshaking { pending, socket };
                        return None;
                    };
                    drop(pending);
                    Some(match outcome {
                        Ok(Ok((session, input, output))) => {
                            Ok(Stream::new(input, output, Some(session), socket))
                        }
                        Ok(Err(e)) => Err(format!("TLS handshake failed: {}", e.to_debug_string())),
                        Err(()) => Err("TLS handshake failed: no result".into()),
                    })
                }
            }
        }

        /// Wait until one of `pending` can go further, or `deadline`
        /// passes (false).
        pub fn wait_any(pending: &[&Dial], deadline: Instant) -> bool {
            let ready: Vec<Pollable> = pending
                .iter()
                .filter_map(|dial| match dial {
                    Dial::Connecting { socket, .. } => Some(socket.subscribe()),
                    Dial::Handshaking { pending, .. } => Some(pending.subscribe()),
                    Dial::Failed(_) | Dial::Spent => None,
                })
                .collect();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let timer = monotonic_clock::subscribe_duration(
                u64::try_from(left.as_nanos()).unwrap_or(u64::MAX),
            );
            let mut waiting: Vec<&Pollable> = ready.iter().collect();
            waiting.push(&timer);
            let peers = u32::try_from(ready.len()).unwrap_or(u32::MAX);
            poll(&waiting).iter().any(|&i| i < peers)
        }

        /// Why a dial still pending at the deadline failed.
        pub fn timed_out(&self) -> Result<Stream, String> {
            Err(match self {
                Dial::Handshaking { .. } => {
                    "the TLS handshake did not complete in time (is it a TLS port?)".into()
                }
                _ => "cannot connect: timed out".into(),
            })
        }
    }

    impl Stream {
        fn new(
            input: InputStream,
            output: OutputStream,
            session: Option<ClientConnection>,
            socket: TcpSocket,
        ) -> Stream {
            Stream {
                input,
                output,
                _session: session,
                _socket: socket,
                read_timeout: Cell::new(None),
                write_timeout: Cell::new(None),
            }
        }

        /// Where the peer's bytes arrive (decrypted, on a TLS session).
        pub fn input(&self) -> &InputStream {
            &self.input
        }

        /// Where bytes for the peer go (encrypted, on a TLS session).
        pub fn output(&self) -> &OutputStream {
            &self.output
        }

        /// As [`std::net::TcpStream::set_read_timeout`].
        pub fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
            self.read_timeout.set(timeout);
            Ok(())
        }

        /// As [`std::net::TcpStream::set_write_timeout`].
        pub fn set_write_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
            self.write_timeout.set(timeout);
            Ok(())
        }

        /// As [`std::io::Read::read`], through a shared reference (the
        /// input stream can be handed to `read-exact` meanwhile).
        pub fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
            loop {
                match self.input.read(buf.len() as u64) {
                    Ok(bytes) if !bytes.is_empty() => {
                        buf[..bytes.len()].copy_from_slice(&bytes);
                        return Ok(bytes.len());
                    }
                    Ok(_) => wait(&self.input.subscribe(), self.read_timeout.get())?,
                    Err(StreamError::Closed) => return Ok(0),
                    Err(e) => return Err(stream_error(e)),
                }
            }
        }

        /// Writes as much of `buf` as the session takes now, and starts
        /// sending it (callers then wait for the reply, not for a flush).
        pub fn write(&self, buf: &[u8]) -> std::io::Result<usize> {
            loop {
                let n = self.try_write(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                wait(&self.output.subscribe(), self.write_timeout.get())?;
            }
        }

        /// As [`Stream::write`] without waiting: 0 if the session takes
        /// nothing now ([`wait_writable`] waits for that).
        pub fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
            let room = self.output.check_write().map_err(stream_error)?;
            let n = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            if n == 0 {
                return Ok(0);
            }
            self.output.write(&buf[..n]).map_err(stream_error)?;
            self.output.flush().map_err(stream_error)?;
            Ok(n)
        }
    }

    /// Wait until at least one of `streams` takes more bytes
    /// ([`Stream::try_write`]), for at most `timeout`: a client writing to
    /// several servers at once waits for whichever reads first.
    pub fn wait_writable(streams: &[&Stream], timeout: Duration) -> std::io::Result<()> {
        let ready: Vec<Pollable> = streams.iter().map(|s| s.output.subscribe()).collect();
        let timer = monotonic_clock::subscribe_duration(
            u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        );
        let mut waiting: Vec<&Pollable> = ready.iter().collect();
        waiting.push(&timer);
        let streams = u32::try_from(ready.len()).unwrap_or(u32::MAX);
        if poll(&waiting).iter().any(|&i| i < streams) {
            Ok(())
        } else {
            Err(Error::from(ErrorKind::TimedOut))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::drive_all;

    /// Peers that each need `steps` waits before they connect; the log
    /// records each advance and each wait.
    fn run(steps: Vec<usize>, waits_allowed: usize) -> (Vec<Result<usize, String>>, Vec<String>) {
        let log = RefCell::new(Vec::new());
        let mut waits = 0;
        let dials: Vec<(usize, usize)> = steps.into_iter().enumerate().collect();
        let outcomes = drive_all(
            dials,
            |(peer, left)| {
                log.borrow_mut().push(format!("advance {peer}"));
                if *left == 0 {
                    Some(Ok(*peer))
                } else {
                    *left -= 1;
                    None
                }
            },
            |pending| {
                let peers: Vec<String> = pending.iter().map(|(p, _)| p.to_string()).collect();
                log.borrow_mut().push(format!("wait {}", peers.join(",")));
                waits += 1;
                waits <= waits_allowed
            },
            |(peer, _)| Err(format!("{peer} timed out")),
        );
        (outcomes, log.into_inner())
    }

    #[test]
    fn every_connect_starts_before_the_first_wait_and_one_wait_covers_all() {
        let (outcomes, log) = run(vec![1, 2, 1], 10);
        assert_eq!(outcomes, vec![Ok(0), Ok(1), Ok(2)]);
        assert_eq!(
            log,
            [
                "advance 0",
                "advance 1",
                "advance 2",
                "wait 0,1,2",
                "advance 0",
                "advance 1",
                "advance 2",
                "wait 1",
                "advance 1",
            ]
        );
    }

    #[test]
    fn peers_left_at_the_deadline_time_out_alone() {
        let (outcomes, log) = run(vec![0, 3, 1], 1);
        assert_eq!(outcomes, vec![Ok(0), Err("1 timed out".into()), Ok(2)]);
        assert_eq!(log.iter().filter(|l| l.starts_with("wait")).count(), 2);
    }
}
