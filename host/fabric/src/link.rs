//! The server side of the link protocol (docs/fabric.md, "Slot handoff"), whose layouts
//! `kvwasm-fabric-link` holds for both ends: the hello, requests read from a reader under the
//! frame-size limit, and responses written.

use std::io::{self, Read, Write};
use std::time::Duration;

use kvwasm_fabric_link::{self as wire, HELLO_MAGIC, Op, VERSION};
use thiserror::Error;

pub use kvwasm_fabric_link::Status;

/// The hello both sides send.
pub fn hello() -> [u8; 8] {
    wire::HELLO
}

/// A request's fixed part; a PUSH's frame follows it on the wire ([`read_frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A frame of `frame_len` bytes follows.
    Push {
        /// The frame's length, already checked against the limit.
        frame_len: usize,
    },
    /// Return the frame kept under `handle`.
    Pull {
        /// The handle.
        handle: u64,
    },
    /// Forget `handle`.
    Release {
        /// The handle.
        handle: u64,
    },
}

/// Why the link cannot go on; the connection is closed after any of these.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The client's hello does not start with `KVFL`.
    #[error("bad hello {found:02x?}, expected \"KVFL\"")]
    BadHello {
        /// The bytes found.
        found: [u8; 4],
    },
    /// The client speaks another link version.
    #[error("link version {found} is not supported (this server speaks {VERSION})")]
    Version {
        /// The version found.
        found: u32,
    },
    /// An op byte naming no request: the stream cannot be resynchronised.
    #[error("unknown request op {found}")]
    UnknownOp {
        /// The byte found.
        found: u8,
    },
    /// A PUSH over the frame-size limit; its frame is not read.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes (--max-frame-mib)")]
    FrameTooLarge {
        /// The declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// No request came for the idle timeout.
    #[error("idle for more than {0:?} (--idle-timeout-s)")]
    Idle(Duration),
    /// The client stopped inside a request, or stopped reading responses, for the I/O timeout,
    /// or sent a request or took a response slower than the server allows.
    #[error(
        "stalled for more than {0:?}, or too slow, in a request or a response (--io-timeout-ms)"
    )]
    Stalled(Duration),
    /// The socket failed or closed mid-request.
    #[error("link I/O: {0}")]
    Io(#[from] io::Error),
}

impl LinkError {
    /// Whether the client should be told why (a protocol fault) rather than just dropped.
    pub fn status(&self) -> Option<Status> {
        match self {
            LinkError::Idle(_) | LinkError::Stalled(_) | LinkError::Io(_) => None,
            _ => Some(Status::Refused),
        }
    }
}

fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut out = [0; N];
    r.read_exact(&mut out)?;
    Ok(out)
}

/// Reads and checks the client's hello.
pub fn read_hello(r: &mut impl Read) -> Result<(), LinkError> {
    let bytes: [u8; 8] = read_array(r)?;
    let (magic, version) = bytes.split_at(4);
    if magic != HELLO_MAGIC {
        return Err(LinkError::BadHello {
            found: magic.try_into().expect("4 bytes"),
        });
    }
    let found = u32::from_le_bytes(version.try_into().expect("4 bytes"));
    if found != VERSION {
        return Err(LinkError::Version { found });
    }
    Ok(())
}

/// Reads the next request's fixed part; `None` at a clean end of stream before its op byte.
/// A PUSH declaring more than `max_frame_len` bytes is [`LinkError::FrameTooLarge`].
pub fn read_request(r: &mut impl Read, max_frame_len: usize) -> Result<Option<Request>, LinkError> {
    let mut head = [0; wire::REQUEST_LEN];
    if r.read(&mut head[..1])? == 0 {
        return Ok(None);
    }
    r.read_exact(&mut head[1..])?;
    let arg = wire::arg(&head);
    match Op::from_byte(head[0]) {
        Some(Op::Push) => match usize::try_from(arg) {
            Ok(frame_len) if frame_len <= max_frame_len => Ok(Some(Request::Push { frame_len })),
            _ => Err(LinkError::FrameTooLarge {
                len: arg,
                max: max_frame_len,
            }),
        },
        Some(Op::Pull) => Ok(Some(Request::Pull { handle: arg })),
        Some(Op::Release) => Ok(Some(Request::Release { handle: arg })),
        None => Err(LinkError::UnknownOp { found: head[0] }),
    }
}

/// Bytes of a frame received before room for the rest of it is reserved.
const FIRST_STEP: usize = 1 << 20;

/// Reads a PUSH's `frame_len` bytes into `buf` (replacing its contents, reusing its memory).
///
/// Memory follows the bytes that actually arrive: room for a large frame is reserved, exactly,
/// only after its first MiB came, so a client that declares 64 MiB and stalls holds 1 MiB
/// (not 64), and a 64 MiB frame takes 64 MiB (not the 128 a doubling `Vec` would).
pub fn read_frame(r: &mut impl Read, frame_len: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    let first = frame_len.min(FIRST_STEP);
    buf.reserve_exact(first);
    buf.resize(first, 0);
    r.read_exact(buf).map_err(|e| short(e, 0, frame_len))?;
    if frame_len > first {
        buf.reserve_exact(frame_len - first);
        buf.resize(frame_len, 0);
        r.read_exact(&mut buf[first..])
            .map_err(|e| short(e, first, frame_len))?;
    }
    Ok(())
}

/// A frame cut short: say so (the error of `read_exact` does not).
fn short(e: io::Error, at_least: usize, frame_len: usize) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        let why = format!("connection closed after {at_least} or more of {frame_len} frame bytes");
        io::Error::new(io::ErrorKind::UnexpectedEof, why)
    } else {
        e
    }
}

/// OK to a PUSH: its handle.
pub fn write_handle(w: &mut impl Write, handle: u64) -> io::Result<()> {
    w.write_all(&wire::ok_with(handle))
}

/// OK to a PULL: the frame.
pub fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(&wire::ok_with(frame.len() as u64))?;
    w.write_all(frame)
}

/// OK to a RELEASE.
pub fn write_ok(w: &mut impl Write) -> io::Result<()> {
    w.write_all(&[wire::OK])
}

/// An error response; `message` is cut to `kvwasm_fabric_link::MAX_MESSAGE_LEN` bytes on a
/// character boundary.
pub fn write_error(w: &mut impl Write, status: Status, message: &str) -> io::Result<()> {
    let (head, message) = wire::error_head(status, message);
    w.write_all(&head)?;
    w.write_all(message.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request op bytes, as the tests write them.
    mod op {
        use kvwasm_fabric_link::Op;
        pub const PUSH: u8 = Op::Push as u8;
        pub const PULL: u8 = Op::Pull as u8;
        pub const RELEASE: u8 = Op::Release as u8;
    }

    fn request(bytes: &[u8]) -> Result<Option<Request>, LinkError> {
        read_request(&mut &bytes[..], 100)
    }

    #[test]
    fn requests_decode_with_the_frame_limit() {
        let mut push = vec![op::PUSH];
        push.extend_from_slice(&100u64.to_le_bytes());
        assert_eq!(
            request(&push).unwrap(),
            Some(Request::Push { frame_len: 100 })
        );
        push[1] = 101;
        assert!(matches!(
            request(&push),
            Err(LinkError::FrameTooLarge { len: 101, max: 100 })
        ));
        let mut huge = vec![op::PUSH];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            request(&huge),
            Err(LinkError::FrameTooLarge { .. })
        ));
        let mut pull = vec![op::PULL];
        pull.extend_from_slice(&7u64.to_le_bytes());
        assert_eq!(request(&pull).unwrap(), Some(Request::Pull { handle: 7 }));
        pull[0] = op::RELEASE;
        assert_eq!(
            request(&pull).unwrap(),
            Some(Request::Release { handle: 7 })
        );
        pull[0] = 9;
        assert!(matches!(
            request(&pull),
            Err(LinkError::UnknownOp { found: 9 })
        ));
        assert_eq!(request(b"").unwrap(), None);
        assert!(matches!(request(&pull[..5]), Err(LinkError::Io(_))));
    }

    #[test]
    fn hello_is_checked() {
        assert!(read_hello(&mut &hello()[..]).is_ok());
        let mut v2 = hello();
        v2[4] = 2;
        assert!(matches!(
            read_hello(&mut &v2[..]),
            Err(LinkError::Version { found: 2 })
        ));
        assert!(matches!(
            read_hello(&mut &b"HTTP/1.1"[..]),
            Err(LinkError::BadHello { found }) if &found == b"HTTP"
        ));
    }

    #[test]
    fn frames_must_arrive_whole() {
        let mut buf = vec![9; 3];
        read_frame(&mut &b"abcdef"[..], 4, &mut buf).unwrap();
        assert_eq!(buf, b"abcd");
        assert_eq!(
            read_frame(&mut &b"ab"[..], 4, &mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let big: Vec<u8> = (0..FIRST_STEP * 3 + 5).map(|i| i as u8).collect();
        let err = read_frame(&mut &big[..FIRST_STEP + 1], big.len(), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(
            err.to_string().contains("after 1048576 or more of 3145733"),
            "{err}"
        );
    }

    #[test]
    fn frame_memory_follows_the_bytes_that_arrive() {
        let big: Vec<u8> = (0..FIRST_STEP * 3 + 5).map(|i| i as u8).collect();
        let mut buf = Vec::new();
        // Declared 3 MiB, sent 100 bytes: only the first step is held.
        assert!(read_frame(&mut &big[..100], big.len(), &mut buf).is_err());
        assert!(buf.capacity() <= FIRST_STEP);
        let mut buf = Vec::new();
        read_frame(&mut &big[..], big.len(), &mut buf).unwrap();
        assert_eq!(buf, big);
        assert_eq!(buf.capacity(), big.len(), "reserved exactly, not doubled");
    }

    #[test]
    fn responses_have_their_layout_and_messages_are_capped() {
        let mut out = Vec::new();
        write_handle(&mut out, 5).unwrap();
        write_frame(&mut out, b"xy").unwrap();
        write_ok(&mut out).unwrap();
        write_error(&mut out, Status::NotFound, "gone").unwrap();
        assert_eq!(
            out,
            b"\x00\x05\0\0\0\0\0\0\0\x00\x02\0\0\0\0\0\0\0xy\x00\x01\x04\x00gone"
        );
        out.clear();
        // 1023 ASCII bytes then a 2-byte character: the cut falls before it.
        let long = "a".repeat(1023) + "\u{e9}" + &"b".repeat(100);
        write_error(&mut out, Status::Refused, &long).unwrap();
        assert_eq!(&out[..3], &[2, 0xff, 0x03]);
        assert_eq!(out.len(), 3 + 1023);
    }
}
