//! The `tcp` MRDN fabric: the client side of the link protocol of
//! `kvwasm fabric serve` ([`proto`]), over one TCP connection to the one
//! peer the operator granted. The guest never listens.
//!
//! * The connection opens at the first call (then the hello), and again
//!   at the call after any failure: an I/O error or timeout fails the call
//!   with `unavailable`, a response that breaks the protocol with `io`.
//! * `push` and `release` are pipelined: they send the request and return
//!   without waiting for its response, unless `window` requests are
//!   already unanswered (then they read responses until one is free).
//! * `pull` first reads every response still due: if the server refused
//!   or failed an earlier PUSH, the `pull` fails naming that handle, with
//!   the server's message (REFUSED → `invalid-argument`, FAILED → `io`),
//!   so a manifest is never taken as landed after a lost chunk. A call
//!   that reads such a response while waiting for room in the window
//!   fails the same way, before sending its own request.
//! * Handles are `(connection epoch << 40) | server handle`: the server's
//!   handles die with the connection, so a handle from an earlier one is
//!   `not-found`. Epochs count from 1 and wrap after 2^24 - 1 connections.
//! * A PULL response longer than `max_frame_mib` fails with `io` before
//!   any of it is buffered.
//!
//! Settings (`[fabrics.<name>.settings]`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `peer` | required | `host:port` of `kvwasm fabric serve` (grant the same in `net`) |
//! | `timeout_ms` | `30000` | deadline of one call (connect if needed, then its exchanges); keep it under the host's `call_timeout_ms` |
//! | `window` | `64` | most requests sent and not yet answered |
//! | `max_frame_mib` | `64` | longest frame a PULL may return |

mod link;
pub mod proto;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kvwasm_guest_support::{Error, Fabric, Payload, Settings, export_fabric};

use link::{Link, LinkError};
use proto::{Expect, Op, Response, Status, request};

/// Bits of a host handle that carry the server's handle.
const SERVER_BITS: u32 = 40;
/// Server handles are below this; the bits above are the epoch.
const SERVER_HANDLES: u64 = 1 << SERVER_BITS;
/// Epochs are below this (and never 0).
const EPOCHS: u64 = 1 << (64 - SERVER_BITS);

/// The fabric's settings.
#[derive(Clone, Debug)]
struct Config {
    peer: String,
    timeout: Duration,
    window: usize,
    max_frame: u64,
}

impl Config {
    fn from_settings(settings: &Settings) -> Result<Config, Error> {
        let peer = settings.get("peer").ok_or_else(|| {
            Error::InvalidArgument(
                "setting `peer` (host:port of `kvwasm fabric serve`) is missing from this \
                 fabric's [settings]; the same peer must also be granted in `net`"
                    .into(),
            )
        })?;
        let window: usize = settings.parse_or("window", 64)?;
        if window == 0 {
            return Err(Error::InvalidArgument(
                "setting `window` = 0: at least one request must be in flight".into(),
            ));
        }
        let max_frame_mib: u64 = settings.parse_or("max_frame_mib", 64)?;
        Ok(Config {
            peer: peer.to_owned(),
            timeout: Duration::from_millis(settings.parse_or("timeout_ms", 30_000)?),
            window,
            max_frame: max_frame_mib.saturating_mul(1 << 20),
        })
    }
}

/// A call's failure: the server refused a request (the connection stays),
/// or the connection broke (it is dropped).
enum Failure {
    Server(Error),
    Link(LinkError),
}

impl From<LinkError> for Failure {
    fn from(e: LinkError) -> Failure {
        Failure::Link(e)
    }
}

/// The server's error for a request, as a fabric error.
fn server_error(status: Status, message: String) -> Error {
    match status {
        Status::NotFound => {
            kvwasm_guest_support::log!("{message}");
            Error::NotFound
        }
        Status::Refused => Error::InvalidArgument(message),
        Status::Failed => Error::Io(message),
    }
}

/// One connection and the requests sent on it and not yet answered.
struct Session {
    link: Link,
    epoch: u64,
    /// PUSHes sent on this connection: the last server handle.
    pushed: u64,
    /// (PUSH or RELEASE, server handle), oldest first.
    pending: VecDeque<(Op, u64)>,
}

impl Session {
    fn host_handle(&self, server: u64) -> u64 {
        (self.epoch << SERVER_BITS) | server
    }

    /// Read responses until at most `keep` requests are unanswered. The
    /// first refused or failed request is reported (with a count of the
    /// others) after all are read; a RELEASE of a handle the server does
    /// not hold is only logged (its PUSH failed, reported then, or it was
    /// released twice).
    fn drain(&mut self, keep: usize, peer: &str, deadline: Instant) -> Result<(), Failure> {
        let mut first = None;
        let mut more = 0;
        while self.pending.len() > keep {
            let (op, server) = *self.pending.front().expect("pending is not empty");
            let response = self.link.next_response(Expect::Reply(op), deadline)?;
            self.pending.pop_front();
            let handle = self.host_handle(server);
            match response {
                Response::Handle(got) if op == Op::Push && got == server => {}
                Response::Released if op == Op::Release => {}
                Response::Error(Status::NotFound, message) if op == Op::Release => {
                    kvwasm_guest_support::log!(
                        "fabric peer {peer}: RELEASE of handle {handle}: {message}"
                    );
                }
                Response::Error(status, message) => {
                    let message = format!(
                        "fabric peer {peer}: the {} of handle {handle} failed: {message}",
                        op.name()
                    );
                    if first.is_none() {
                        first = Some((status, message));
                    } else {
                        more += 1;
                    }
                }
                other => {
                    let what = format!("{} of server handle {server}", op.name());
                    return Err(self.link.unexpected(&what, other).into());
                }
            }
        }
        match first {
            None => Ok(()),
            Some((status, message)) if more > 0 => Err(Failure::Server(server_error(
                status,
                format!("{message} (and {more} later requests failed)"),
            ))),
            Some((status, message)) => Err(Failure::Server(server_error(status, message))),
        }
    }
}

/// The fabric's state: its settings and the open connection, if any.
struct Client {
    config: Config,
    session: Option<Session>,
    /// The epoch of the latest connection (0: none yet).
    epoch: u64,
}

impl Client {
    fn new(config: Config) -> Client {
        Client {
            config,
            session: None,
            epoch: 0,
        }
    }

    /// Run `f` on the connection, opened first if needed, within one
    /// `timeout_ms`; a broken connection is dropped.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Session, &Config, Instant) -> Result<T, Failure>,
    ) -> Result<T, Error> {
        let config = &self.config;
        let deadline = Instant::now() + config.timeout;
        if self.session.is_none() {
            let link = Link::open(&config.peer, config.timeout, config.max_frame, deadline)?;
            self.epoch = self.epoch % (EPOCHS - 1) + 1;
            self.session = Some(Session {
                link,
                epoch: self.epoch,
                pushed: 0,
                pending: VecDeque::new(),
            });
        }
        let session = self.session.as_mut().expect("connected above");
        match f(session, config, deadline) {
            Ok(value) => Ok(value),
            Err(Failure::Server(e)) => Err(e),
            Err(Failure::Link(e)) => {
                self.session = None;
                Err(e.into())
            }
        }
    }

    /// The server handle behind a host handle of the open connection;
    /// `not-found` for any other.
    fn server_handle(&self, handle: u64) -> Result<u64, Error> {
        match &self.session {
            Some(session) if handle >> SERVER_BITS == session.epoch => {
                Ok(handle & (SERVER_HANDLES - 1))
            }
            _ => {
                kvwasm_guest_support::log!(
                    "fabric peer {}: handle {handle}: the connection that pushed it was closed",
                    self.config.peer
                );
                Err(Error::NotFound)
            }
        }
    }

    /// Push the `len`-byte frame that `read(offset, len)` copies out.
    fn push(&mut self, len: u64, read: impl FnMut(u64, u64) -> Vec<u8>) -> Result<u64, Error> {
        self.run(|session, config, deadline| {
            session.drain(config.window - 1, &config.peer, deadline)?;
            if session.pushed + 1 >= SERVER_HANDLES {
                let e = session.link.protocol_error(
                    "this connection has used all its handles; the next call reconnects".into(),
                );
                return Err(e.into());
            }
            session.link.send_push(len, read, deadline)?;
            session.pushed += 1;
            session.pending.push_back((Op::Push, session.pushed));
            Ok(session.host_handle(session.pushed))
        })
    }

    /// The frame under `handle`, handed to `make`.
    fn pull<T>(&mut self, handle: u64, make: impl FnOnce(&[u8]) -> T) -> Result<T, Error> {
        let server = self.server_handle(handle)?;
        self.run(|session, config, deadline| {
            session.drain(0, &config.peer, deadline)?;
            let link = &mut session.link;
            link.send(&request(Op::Pull, server), deadline)?;
            match link.next_response(Expect::Reply(Op::Pull), deadline)? {
                Response::Frame(range) => Ok(make(link.frame(range))),
                Response::Error(status, message) => Err(Failure::Server(server_error(
                    status,
                    format!(
                        "fabric peer {}: PULL of handle {handle}: {message}",
                        config.peer
                    ),
                ))),
                other => Err(link.unexpected("PULL", other).into()),
            }
        })
    }

    fn release(&mut self, handle: u64) -> Result<(), Error> {
        let server = self.server_handle(handle)?;
        self.run(|session, config, deadline| {
            session.drain(config.window - 1, &config.peer, deadline)?;
            session.link.send(&request(Op::Release, server), deadline)?;
            session.pending.push_back((Op::Release, server));
            Ok(())
        })
    }
}

thread_local! {
    /// The client, or why the settings are unusable; set up at the first call.
    static CLIENT: RefCell<Result<Client, Error>> = RefCell::new(
        Settings::load().and_then(|s| Config::from_settings(&s)).map(Client::new),
    );
}

fn with_client<T>(f: impl FnOnce(&mut Client) -> Result<T, Error>) -> Result<T, Error> {
    CLIENT.with(|client| match &mut *client.borrow_mut() {
        Ok(client) => f(client),
        Err(e) => Err(e.clone()),
    })
}

struct TcpFabric;

impl Fabric for TcpFabric {
    fn label() -> String {
        "tcp".into()
    }

    fn push(frame: &Payload) -> Result<u64, Error> {
        with_client(|client| client.push(frame.len(), |offset, len| frame.read(offset, len)))
    }

    fn pull(handle: u64) -> Result<Payload, Error> {
        with_client(|client| client.pull(handle, Payload::new))
    }

    fn release(handle: u64) -> Result<(), Error> {
        with_client(|client| client.release(handle))
    }
}

export_fabric!(TcpFabric);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::proto::HELLO;

    /// A minimal `kvwasm fabric serve` on loopback: frames in memory per
    /// connection, handles from 1 in PUSH order. A pushed frame starting
    /// with `refuse` is REFUSED, `fail` FAILED, `garble` answered with an
    /// unknown status byte, `close` closes the connection unanswered,
    /// `mute` makes it stop answering.
    struct FakeServer {
        address: SocketAddr,
        connections: Arc<AtomicUsize>,
    }

    impl FakeServer {
        fn start() -> FakeServer {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let connections = Arc::new(AtomicUsize::new(0));
            let counter = connections.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    counter.fetch_add(1, Ordering::SeqCst);
                    std::thread::spawn(move || serve(stream?));
                }
                std::io::Result::Ok(())
            });
            FakeServer {
                address,
                connections,
            }
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }

        fn client(&self, settings: &[(&str, &str)]) -> Client {
            let peer = self.address.to_string();
            let pairs = [("peer", peer.as_str())]
                .into_iter()
                .chain(settings.iter().copied());
            Client::new(Config::from_settings(&Settings::from_pairs(pairs)).unwrap())
        }
    }

    fn serve(mut stream: TcpStream) -> std::io::Result<()> {
        let mut hello = [0; 8];
        stream.read_exact(&mut hello)?;
        assert_eq!(hello, HELLO);
        stream.write_all(&HELLO)?;
        let (mut frames, mut pushed, mut mute) = (HashMap::new(), 0u64, false);
        let error = |out: &mut Vec<u8>, status: u8, message: &str| {
            out.push(status);
            out.extend_from_slice(&(message.len() as u16).to_le_bytes());
            out.extend_from_slice(message.as_bytes());
        };
        loop {
            let mut head = [0; 9];
            stream.read_exact(&mut head)?;
            let arg = u64::from_le_bytes(head[1..].try_into().unwrap());
            let mut out = Vec::new();
            match head[0] {
                1 => {
                    let mut frame = vec![0; arg as usize];
                    stream.read_exact(&mut frame)?;
                    pushed += 1;
                    if frame.starts_with(b"close") {
                        return Ok(());
                    } else if frame.starts_with(b"mute") {
                        mute = true;
                    } else if frame.starts_with(b"garble") {
                        out.push(9);
                    } else if frame.starts_with(b"refuse") {
                        error(&mut out, 2, "bad frame");
                    } else if frame.starts_with(b"fail") {
                        error(&mut out, 3, "disk full");
                    } else {
                        frames.insert(pushed, frame);
                        out.push(0);
                        out.extend_from_slice(&pushed.to_le_bytes());
                    }
                }
                2 => match frames.get(&arg) {
                    Some(frame) => {
                        out.push(0);
                        out.extend_from_slice(&(frame.len() as u64).to_le_bytes());
                        out.extend_from_slice(frame);
                    }
                    None => error(&mut out, 1, "no such handle"),
                },
                _ => match frames.remove(&arg) {
                    Some(_) => out.push(0),
                    None => error(&mut out, 1, "no such handle"),
                },
            }
            if !mute {
                stream.write_all(&out)?;
            }
        }
    }

    fn push(client: &mut Client, frame: &[u8]) -> Result<u64, Error> {
        client.push(frame.len() as u64, |offset, len| {
            let at = offset as usize;
            frame[at..at + len as usize].to_vec()
        })
    }

    fn pull(client: &mut Client, handle: u64) -> Result<Vec<u8>, Error> {
        client.pull(handle, <[u8]>::to_vec)
    }

    fn pending(client: &Client) -> usize {
        client.session.as_ref().map_or(0, |s| s.pending.len())
    }

    #[test]
    fn pushes_are_pipelined_within_the_window_and_pulls_return_the_frames() {
        let server = FakeServer::start();
        let mut client = server.client(&[("window", "3")]);
        let frames: Vec<Vec<u8>> = (0..10u8)
            .map(|i| match i {
                // Crosses two 1 MiB slices.
                4 => (0..(5 << 19) + 7).map(|b| b as u8).collect(),
                i => vec![i; usize::from(i) * 100],
            })
            .collect();
        let mut handles = Vec::new();
        for frame in &frames {
            handles.push(push(&mut client, frame).unwrap());
            assert!(pending(&client) <= 3);
        }
        assert_eq!(
            pending(&client),
            3,
            "pushes do not wait for their responses"
        );
        let expected: Vec<u64> = (1..=10).map(|n| (1 << 40) | n).collect();
        assert_eq!(handles, expected);
        for (handle, frame) in handles.iter().zip(&frames) {
            assert_eq!(&pull(&mut client, *handle).unwrap(), frame);
        }
        // Pulling keeps the frame; releasing forgets it.
        assert_eq!(pull(&mut client, handles[2]).unwrap(), frames[2]);
        client.release(handles[2]).unwrap();
        assert_eq!(pending(&client), 1);
        assert!(matches!(
            pull(&mut client, handles[2]),
            Err(Error::NotFound)
        ));
        // A second release of it is answered NOT_FOUND, logged only.
        client.release(handles[2]).unwrap();
        assert_eq!(pull(&mut client, handles[3]).unwrap(), frames[3]);
        assert_eq!(server.connections(), 1);
    }

    #[test]
    fn a_refused_or_failed_push_fails_the_next_pull_naming_its_handle() {
        let server = FakeServer::start();
        let mut client = server.client(&[]);
        let good = push(&mut client, b"frame one").unwrap();
        let refused = push(&mut client, b"refuse me").unwrap();
        push(&mut client, b"fail me").unwrap();
        let last = push(&mut client, b"frame four").unwrap();
        let Err(Error::InvalidArgument(message)) = pull(&mut client, last) else {
            panic!("the refused push must fail the pull");
        };
        assert!(
            message.contains(&format!("PUSH of handle {refused} failed: bad frame"))
                && message.contains("and 1 later requests failed"),
            "{message}"
        );
        // Reported once; the connection stays.
        assert_eq!(pull(&mut client, last).unwrap(), b"frame four");
        assert_eq!(pull(&mut client, good).unwrap(), b"frame one");
        assert!(matches!(pull(&mut client, refused), Err(Error::NotFound)));
        let failed = push(&mut client, b"fail again").unwrap();
        let Err(Error::Io(message)) = pull(&mut client, good) else {
            panic!("a FAILED push is an io error");
        };
        assert!(
            message.contains(&format!("handle {failed} failed: disk full")),
            "{message}"
        );
        assert_eq!(server.connections(), 1);
    }

    #[test]
    fn a_call_waiting_for_room_in_the_window_reports_an_earlier_failure() {
        let server = FakeServer::start();
        let mut client = server.client(&[("window", "1")]);
        let refused = push(&mut client, b"refuse me").unwrap();
        let Err(Error::InvalidArgument(message)) = push(&mut client, b"next") else {
            panic!("the push must wait for the refused one's response");
        };
        assert!(message.contains(&format!("handle {refused}")), "{message}");
        // The failing call sent nothing: the next push is handle 2.
        assert_eq!(push(&mut client, b"next").unwrap(), (1 << 40) | 2);
    }

    #[test]
    fn a_broken_connection_fails_the_call_and_old_handles_are_gone() {
        let server = FakeServer::start();
        let mut client = server.client(&[]);
        // No connection yet: nothing to pull, and no connection made for it.
        assert!(matches!(pull(&mut client, 1), Err(Error::NotFound)));
        assert_eq!(server.connections(), 0);
        let old = push(&mut client, b"frame").unwrap();
        push(&mut client, b"close the connection").unwrap();
        let Err(Error::Unavailable(message)) = pull(&mut client, old) else {
            panic!("a closed connection is unavailable");
        };
        assert!(message.contains("closed the connection"), "{message}");
        assert!(matches!(pull(&mut client, old), Err(Error::NotFound)));
        let new = push(&mut client, b"frame").unwrap();
        assert_eq!(new, (2 << 40) | 1, "a new connection, a new epoch");
        assert_eq!(server.connections(), 2);
        assert!(matches!(pull(&mut client, old), Err(Error::NotFound)));
        assert!(matches!(client.release(old), Err(Error::NotFound)));
        assert_eq!(pull(&mut client, new).unwrap(), b"frame");
    }

    #[test]
    fn malformed_or_oversized_responses_are_io_and_drop_the_connection() {
        let server = FakeServer::start();
        let mut client = server.client(&[("max_frame_mib", "1")]);
        let big = push(&mut client, &vec![7; (1 << 20) + 1]).unwrap();
        let Err(Error::Io(message)) = pull(&mut client, big) else {
            panic!("an oversized PULL response is io");
        };
        assert!(message.contains("over the 1048576-byte limit"), "{message}");
        push(&mut client, b"garble the answer").unwrap();
        let handle = push(&mut client, b"frame").unwrap();
        let Err(Error::Io(message)) = pull(&mut client, handle) else {
            panic!("an unknown status byte is io");
        };
        assert!(message.contains("unknown status byte 9"), "{message}");
        let handle = push(&mut client, b"frame").unwrap();
        assert_eq!(handle >> 40, 3);
        assert_eq!(pull(&mut client, handle).unwrap(), b"frame");
        assert_eq!(server.connections(), 3);
    }

    #[test]
    fn an_unanswered_request_times_out_as_unavailable() {
        let server = FakeServer::start();
        let mut client = server.client(&[("window", "1"), ("timeout_ms", "200")]);
        push(&mut client, b"mute from here").unwrap();
        let started = Instant::now();
        let Err(Error::Unavailable(message)) = push(&mut client, b"frame") else {
            panic!("a silent server is unavailable");
        };
        assert!(message.contains("no response within 200 ms"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn unreachable_peers_are_unavailable_and_foreign_servers_io() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = closed.local_addr().unwrap().to_string();
        drop(closed);
        let settings = Settings::from_pairs([("peer", address.as_str())]);
        let mut client = Client::new(Config::from_settings(&settings).unwrap());
        let Err(Error::Unavailable(message)) = push(&mut client, b"frame") else {
            panic!("a closed port is unavailable");
        };
        assert!(message.contains("cannot connect"), "{message}");

        let http = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = http.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut stream, _) = http.accept()?;
            stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")?;
            stream.read(&mut [0; 64])
        });
        let settings = Settings::from_pairs([("peer", address.as_str())]);
        let mut client = Client::new(Config::from_settings(&settings).unwrap());
        let Err(Error::Io(message)) = push(&mut client, b"frame") else {
            panic!("another protocol is io");
        };
        assert!(message.contains("not a kvwasm fabric server"), "{message}");
    }

    #[test]
    fn settings_name_the_peer_grant_and_refuse_an_empty_window() {
        let Err(Error::InvalidArgument(message)) = Config::from_settings(&Settings::default())
        else {
            panic!("the peer is required");
        };
        assert!(
            message.contains("`peer`") && message.contains("`net`"),
            "{message}"
        );
        let zero = Settings::from_pairs([("peer", "127.0.0.1:1"), ("window", "0")]);
        assert!(matches!(
            Config::from_settings(&zero),
            Err(Error::InvalidArgument(_))
        ));
        let config = Config::from_settings(&Settings::from_pairs([("peer", "h:1")])).unwrap();
        assert_eq!(config.window, 64);
        assert_eq!(config.max_frame, 64 << 20);
        assert_eq!(config.timeout, Duration::from_secs(30));
    }
}
