//! The link protocol of `kvwasm fabric serve` (docs/fabric.md, "Slot
//! handoff"), written once for its server (`host/fabric`, the host) and its
//! client (`guest-backends/tcp`, a guest); no I/O, so both sides read and
//! write it their own way (blocking reads on the host, an incremental
//! decoder in the guest). Integers are little-endian.
//!
//! A client opens with [`HELLO`] (`KVFL` + u32 version 1) and the server
//! echoes it. A request is an [`Op`] byte and a u64 ([`request`]): PUSH
//! (frame length, then the frame), PULL (handle), RELEASE (handle). The
//! server answers every request in order with a status byte: [`OK`] and
//! the op's result (PUSH: u64 handle, PULL: u64 length + frame, RELEASE:
//! nothing; [`ok_with`]), or a [`Status`] (NOT_FOUND, REFUSED or FAILED)
//! followed by a u16 length and at most [`MAX_MESSAGE_LEN`] bytes of UTF-8
//! ([`error_head`]).

/// First four bytes of either side's hello.
pub const HELLO_MAGIC: [u8; 4] = *b"KVFL";
/// The only link version.
pub const VERSION: u32 = 1;
/// The hello both sides send: [`HELLO_MAGIC`] and [`VERSION`].
pub const HELLO: [u8; 8] = {
    let mut out = [0; 8];
    let version = VERSION.to_le_bytes();
    let mut i = 0;
    while i < 4 {
        out[i] = HELLO_MAGIC[i];
        out[4 + i] = version[i];
        i += 1;
    }
    out
};
/// Longest error message a response carries, in bytes.
pub const MAX_MESSAGE_LEN: usize = 1024;
/// A request's fixed part: the op byte and its u64.
pub const REQUEST_LEN: usize = 9;
/// An OK response's fixed part when it carries a u64 (PUSH, PULL).
pub const OK_WITH_LEN: usize = 9;
/// An error response's fixed part: the status byte and the u16 length.
pub const ERROR_HEAD_LEN: usize = 3;

/// A request's op byte.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// u64 frame length, then the frame.
    Push = 1,
    /// u64 handle.
    Pull = 2,
    /// u64 handle.
    Release = 3,
}

impl Op {
    /// The op a byte names, if any.
    pub fn from_byte(byte: u8) -> Option<Op> {
        match byte {
            1 => Some(Op::Push),
            2 => Some(Op::Pull),
            3 => Some(Op::Release),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Push => "PUSH",
            Op::Pull => "PULL",
            Op::Release => "RELEASE",
        }
    }
}

/// The status byte of a response that succeeded.
pub const OK: u8 = 0;

/// Why a request failed: an error response's status byte.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No live handle by that number.
    NotFound = 1,
    /// A bad frame, a bad message or a limit.
    Refused = 2,
    /// The store failed.
    Failed = 3,
}

impl Status {
    /// The error status a byte names, if any.
    pub fn from_byte(byte: u8) -> Option<Status> {
        match byte {
            1 => Some(Status::NotFound),
            2 => Some(Status::Refused),
            3 => Some(Status::Failed),
            _ => None,
        }
    }
}

/// A request's fixed part: the op byte and its u64 (the frame length of a
/// PUSH, whose frame bytes follow; the handle of a PULL or RELEASE).
pub fn request(op: Op, arg: u64) -> [u8; REQUEST_LEN] {
    let mut out = [0; REQUEST_LEN];
    out[0] = op as u8;
    out[1..].copy_from_slice(&arg.to_le_bytes());
    out
}

/// An OK response carrying `value` (a PUSH's handle, a PULL's frame
/// length, the frame following).
pub fn ok_with(value: u64) -> [u8; OK_WITH_LEN] {
    let mut out = [0; OK_WITH_LEN];
    out[0] = OK;
    out[1..].copy_from_slice(&value.to_le_bytes());
    out
}

/// An error response's fixed part and the message it carries: `message`
/// cut to [`MAX_MESSAGE_LEN`] bytes on a character boundary.
pub fn error_head(status: Status, message: &str) -> ([u8; ERROR_HEAD_LEN], &str) {
    let mut end = message.len().min(MAX_MESSAGE_LEN);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let len = (end as u16).to_le_bytes();
    ([status as u8, len[0], len[1]], &message[..end])
}

/// The u64 after the first byte of a request or an OK response.
pub fn arg(head: &[u8; 9]) -> u64 {
    u64::from_le_bytes(head[1..].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hello_is_kvfl_version_1() {
        assert_eq!(&HELLO, b"KVFL\x01\x00\x00\x00");
    }

    #[test]
    fn requests_round_trip() {
        for op in [Op::Push, Op::Pull, Op::Release] {
            for value in [0, 7, u64::MAX] {
                let head = request(op, value);
                assert_eq!(Op::from_byte(head[0]), Some(op));
                assert_eq!(arg(&head), value);
            }
        }
        assert_eq!(request(Op::Pull, 7), *b"\x02\x07\0\0\0\0\0\0\0");
        assert_eq!(Op::from_byte(0), None);
        assert_eq!(Op::from_byte(4), None);
    }

    #[test]
    fn responses_have_their_layout_and_messages_are_capped() {
        assert_eq!(ok_with(5), *b"\x00\x05\0\0\0\0\0\0\0");
        assert_eq!(arg(&ok_with(u64::MAX)), u64::MAX);
        assert_eq!(
            error_head(Status::NotFound, "gone"),
            (*b"\x01\x04\x00", "gone")
        );
        // 1023 ASCII bytes then a 2-byte character: the cut falls before it.
        let long = "a".repeat(1023) + "\u{e9}" + &"b".repeat(100);
        let (head, message) = error_head(Status::Refused, &long);
        assert_eq!(head, [2, 0xff, 0x03]);
        assert_eq!(message.len(), 1023);
        for status in [Status::NotFound, Status::Refused, Status::Failed] {
            assert_eq!(Status::from_byte(status as u8), Some(status));
        }
        assert_eq!(Status::from_byte(OK), None);
        assert_eq!(Status::from_byte(4), None);
    }
}
