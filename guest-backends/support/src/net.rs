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

/// Connect to `address` (`host:port`) by `deadline`, then, if `tls`, ask
/// the host for a TLS session on the socket with `host` as the server
/// name. A peer that does not complete the handshake by `deadline` fails:
/// there is no fallback to plain text.
pub fn connect_stream(address: &str, tls: bool, deadline: Instant) -> Result<Stream, String> {
    let peer: SocketAddr = address
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve the address: {e} (is `dns = true` granted?)"))?
        .next()
        .ok_or("the address resolves to nothing")?;
    let server_name = tls.then(|| {
        address
            .rsplit_once(':')
            .map_or(address, |(h, _)| h)
            .trim_matches(['[', ']'])
    });
    Stream::connect(peer, server_name, deadline)
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
    use crate::tls_bindings::wasi::tls::types::{ClientConnection, ClientHandshake};

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

    fn left(deadline: Instant) -> Option<Duration> {
        Some(deadline.saturating_duration_since(Instant::now()))
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

    impl Stream {
        /// Connect to `peer`; with a `server_name`, hand the socket's
        /// streams to the host for a TLS handshake with it. All by
        /// `deadline`.
        pub fn connect(
            peer: SocketAddr,
            server_name: Option<&str>,
            deadline: Instant,
        ) -> Result<Stream, String> {
            let (family, addr) = wasi_addr(peer);
            let socket = create_tcp_socket(family).map_err(connect_error)?;
            socket
                .start_connect(&instance_network(), addr)
                .map_err(connect_error)?;
            let (input, output) = {
                let ready = socket.subscribe();
                loop {
                    match socket.finish_connect() {
                        Ok(streams) => break streams,
                        Err(ErrorCode::WouldBlock) => wait(&ready, left(deadline))
                            .map_err(|_| "cannot connect: timed out".to_owned())?,
                        Err(e) => return Err(connect_error(e)),
                    }
                }
            };
            let Some(server_name) = server_name else {
                return Ok(Stream::new(input, output, None, socket));
            };
            let handshake = ClientHandshake::new(server_name, input, output);
            let pending = ClientHandshake::finish(handshake);
            {
                let ready = pending.subscribe();
                wait(&ready, left(deadline)).map_err(|_| {
                    "the TLS handshake did not complete in time (is it a TLS port?)".to_owned()
                })?;
            }
            let (session, input, output) = match pending.get() {
                Some(Ok(Ok(streams))) => streams,
                Some(Ok(Err(e))) => {
                    return Err(format!("TLS handshake failed: {}", e.to_debug_string()));
                }
                _ => return Err("TLS handshake failed: no result".into()),
            };
            Ok(Stream::new(input, output, Some(session), socket))
        }

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
