//! The link protocol of `kvwasm fabric serve` (client side), apart from
//! the socket so it is tested natively: responses decoded incrementally
//! from whatever bytes have arrived. The layouts (hello, requests,
//! responses) are `kvwasm-fabric-link`'s, which the server writes with.

use std::ops::Range;

use kvwasm_fabric_link::{ERROR_HEAD_LEN, MAX_MESSAGE_LEN, OK, OK_WITH_LEN};
pub use kvwasm_fabric_link::{HELLO, Op, Status, request};

/// Longest frame there can be: an MRDN header and a body of at most
/// `u32::MAX` bytes. A longer PULL response is malformed, whatever the
/// configured limit.
pub const MAX_FRAME: u64 = 32 + u32::MAX as u64;

/// Bytes asked of the socket per read, at least.
const READ_SIZE: usize = 256 << 10;

/// What the next response answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    Hello,
    Reply(Op),
}

/// One decoded response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The server echoed the hello.
    Hello,
    /// A PUSH was accepted under this server handle.
    Handle(u64),
    /// A PULL's frame: [`Decoder::frame`] of this range, valid until the
    /// decoder is next asked for room.
    Frame(Range<usize>),
    /// A RELEASE was done.
    Released,
    /// The request failed, with the server's message.
    Error(Status, String),
}

/// Bytes received and not yet decoded. An error means the stream is in an
/// unknown state: the connection must be dropped.
pub struct Decoder {
    /// `received[start..end]` is read and not yet decoded. Zeroed only
    /// when it grows, never per read.
    received: Vec<u8>,
    start: usize,
    end: usize,
    /// Longest PULL frame accepted: a longer claim is an error before any
    /// byte of it is buffered.
    max_frame: u64,
    /// Bytes the response being decoded needs in all, once known.
    needed: usize,
}

impl Decoder {
    pub fn new(max_frame: u64) -> Decoder {
        Decoder {
            received: Vec::new(),
            start: 0,
            end: 0,
            max_frame,
            needed: 0,
        }
    }

    /// The next whole response, answering `expect`, or `None` until more
    /// bytes arrive.
    pub fn next(&mut self, expect: Expect) -> Result<Option<Response>, String> {
        let pending = &self.received[self.start..self.end];
        let Some(parsed) = parse(pending, expect, self.max_frame)? else {
            return Ok(None);
        };
        let (response, used) = match parsed {
            Parsed::Need(n) => {
                self.needed = n;
                return Ok(None);
            }
            Parsed::Done(Response::Frame(range), used) => (
                Response::Frame(self.start + range.start..self.start + range.end),
                used,
            ),
            Parsed::Done(response, used) => (response, used),
        };
        self.start += used;
        self.needed = 0;
        Ok(Some(response))
    }

    /// The bytes of a [`Response::Frame`] just returned.
    pub fn frame(&self, range: Range<usize>) -> &[u8] {
        &self.received[range]
    }

    /// Free space to read into, at least [`READ_SIZE`] bytes; then
    /// [`Decoder::filled`] says how many were read. Invalidates the ranges
    /// of earlier [`Response::Frame`]s.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.start > self.received.len() / 2
            || self.start + self.needed > self.received.len()
        {
            self.received.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let want = (self.start + self.needed).max(self.end + READ_SIZE);
        if self.received.len() < want {
            // Grow with the bytes that arrive, not the length a response
            // claims: at most twice what was received, plus one read.
            let len = want.min((self.received.len() * 2).max(self.end + READ_SIZE));
            self.received.resize(len, 0);
        }
        &mut self.received[self.end..]
    }

    /// `n` bytes were read into [`Decoder::spare`].
    pub fn filled(&mut self, n: usize) {
        self.end += n;
    }
}

enum Parsed {
    /// A whole response and the bytes it took.
    Done(Response, usize),
    /// Incomplete; the response takes this many bytes in all.
    Need(usize),
}

/// Decode one response from the start of `pending`; `None` when more bytes
/// are needed and their number is not known yet.
fn parse(pending: &[u8], expect: Expect, max_frame: u64) -> Result<Option<Parsed>, String> {
    let Some(&status) = pending.first() else {
        return Ok(None);
    };
    match (expect, Status::from_byte(status)) {
        // Also how a server refuses the hello's version.
        (_, Some(status)) => parse_error(pending, status, expect).map(Some),
        (Expect::Hello, None) => parse_hello(pending).map(Some),
        (Expect::Reply(op), None) if status == OK => parse_ok(pending, op, max_frame).map(Some),
        (Expect::Reply(op), None) => Err(format!(
            "unknown status byte {status} answering {}",
            op.name()
        )),
    }
}

fn parse_hello(pending: &[u8]) -> Result<Parsed, String> {
    let seen = pending.len().min(HELLO.len());
    if pending[..seen] != HELLO[..seen] {
        return Err(format!(
            "not a kvwasm fabric server (or another protocol version): its hello starts {:?}",
            String::from_utf8_lossy(&pending[..seen])
        ));
    }
    Ok(if seen == HELLO.len() {
        Parsed::Done(Response::Hello, HELLO.len())
    } else {
        Parsed::Need(HELLO.len())
    })
}

fn parse_ok(pending: &[u8], op: Op, max_frame: u64) -> Result<Parsed, String> {
    if op == Op::Release {
        return Ok(Parsed::Done(Response::Released, 1));
    }
    let Some(head) = pending.first_chunk::<OK_WITH_LEN>() else {
        return Ok(Parsed::Need(OK_WITH_LEN));
    };
    let value = kvwasm_fabric_link::arg(head);
    if op == Op::Push {
        return Ok(Parsed::Done(Response::Handle(value), OK_WITH_LEN));
    }
    if value > max_frame.min(MAX_FRAME) {
        return Err(format!(
            "a PULL response of {value} bytes, over the {}-byte limit (setting \
             `max_frame_mib`, at most an MRDN frame's size)",
            max_frame.min(MAX_FRAME)
        ));
    }
    let total = usize::try_from(value)
        .ok()
        .and_then(|len| len.checked_add(OK_WITH_LEN))
        .ok_or_else(|| format!("a PULL response of {value} bytes cannot be addressed"))?;
    Ok(if pending.len() < total {
        Parsed::Need(total)
    } else {
        Parsed::Done(Response::Frame(OK_WITH_LEN..total), total)
    })
}

fn parse_error(pending: &[u8], status: Status, expect: Expect) -> Result<Parsed, String> {
    if pending.len() < ERROR_HEAD_LEN {
        return Ok(Parsed::Need(ERROR_HEAD_LEN));
    }
    let what = match expect {
        Expect::Hello => "the hello",
        Expect::Reply(op) => op.name(),
    };
    let len = usize::from(u16::from_le_bytes([pending[1], pending[2]]));
    if len > MAX_MESSAGE_LEN {
        return Err(format!(
            "an error message of {len} bytes answering {what}, over the {MAX_MESSAGE_LEN}-byte limit"
        ));
    }
    let end = ERROR_HEAD_LEN + len;
    let Some(text) = pending.get(ERROR_HEAD_LEN..end) else {
        return Ok(Parsed::Need(end));
    };
    let message = std::str::from_utf8(text)
        .map_err(|_| format!("an error message answering {what} is not UTF-8"))?;
    Ok(Parsed::Done(
        Response::Error(status, message.to_owned()),
        end,
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A response as the server sends it, with what it answers.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Sent {
        Hello,
        Handle(u64),
        Frame(Vec<u8>),
        Released,
        Error(Status, String),
    }

    fn encode(responses: &[(Expect, Sent)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (_, sent) in responses {
            match sent {
                Sent::Hello => out.extend_from_slice(&HELLO),
                Sent::Handle(h) => {
                    out.push(0);
                    out.extend_from_slice(&h.to_le_bytes());
                }
                Sent::Frame(bytes) => {
                    out.push(0);
                    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                    out.extend_from_slice(bytes);
                }
                Sent::Released => out.push(0),
                Sent::Error(status, message) => {
                    out.push(*status as u8);
                    out.extend_from_slice(&(message.len() as u16).to_le_bytes());
                    out.extend_from_slice(message.as_bytes());
                }
            }
        }
        out
    }

    /// Feed `stream` as reads cut at `cuts` (taken modulo its length; a
    /// read also ends where the spare room does), decoding after each read
    /// as the link does, each response answering the next of `expects`;
    /// stop at the first error.
    fn feed(
        stream: &[u8],
        expects: &[Expect],
        cuts: &[usize],
        max_frame: u64,
    ) -> (Vec<Sent>, Option<String>) {
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        ends.push(stream.len());
        ends.sort_unstable();
        let (mut decoder, mut got, mut at) = (Decoder::new(max_frame), Vec::new(), 0);
        for end in ends {
            while at < end {
                let room = decoder.spare();
                let n = room.len().min(end - at);
                room[..n].copy_from_slice(&stream[at..at + n]);
                decoder.filled(n);
                at += n;
                while let Some(&expect) = expects.get(got.len()) {
                    match decoder.next(expect) {
                        Ok(Some(response)) => got.push(match response {
                            Response::Hello => Sent::Hello,
                            Response::Handle(h) => Sent::Handle(h),
                            Response::Frame(range) => Sent::Frame(decoder.frame(range).to_vec()),
                            Response::Released => Sent::Released,
                            Response::Error(status, message) => Sent::Error(status, message),
                        }),
                        Ok(None) => break,
                        Err(e) => return (got, Some(e)),
                    }
                }
            }
        }
        (got, None)
    }

    fn feed_all(responses: &[(Expect, Sent)], cuts: &[usize]) -> (Vec<Sent>, Option<String>) {
        let expects: Vec<Expect> = responses.iter().map(|(e, _)| *e).collect();
        feed(&encode(responses), &expects, cuts, 64 << 20)
    }

    fn error() -> impl Strategy<Value = Sent> {
        (
            prop_oneof![
                Just(Status::NotFound),
                Just(Status::Refused),
                Just(Status::Failed)
            ],
            "\\PC{0,40}",
        )
            .prop_map(|(status, message)| Sent::Error(status, message))
    }

    /// A request's possible responses, frames up to past one read's size.
    fn response() -> impl Strategy<Value = (Expect, Sent)> {
        prop_oneof![
            prop_oneof![any::<u64>().prop_map(Sent::Handle), error()]
                .prop_map(|s| (Expect::Reply(Op::Push), s)),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..2048).prop_map(Sent::Frame),
                (READ_SIZE - 8..READ_SIZE + 300_000, any::<u8>())
                    .prop_map(|(len, b)| Sent::Frame(vec![b; len])),
                error(),
            ]
            .prop_map(|s| (Expect::Reply(Op::Pull), s)),
            prop_oneof![Just(Sent::Released), error()]
                .prop_map(|s| (Expect::Reply(Op::Release), s)),
        ]
    }

    #[test]
    fn requests_are_an_op_byte_and_a_little_endian_u64() {
        assert_eq!(request(Op::Push, 0x0102), [1, 2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            request(Op::Pull, u64::MAX),
            [2, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        assert_eq!(request(Op::Release, 7)[0], 3);
        assert_eq!(&HELLO, b"KVFL\x01\0\0\0");
    }

    #[test]
    fn a_pull_longer_than_the_limit_is_refused_before_it_is_buffered() {
        let mut stream = vec![0];
        stream.extend_from_slice(&((1u64 << 20) + 1).to_le_bytes());
        let (got, error) = feed(&stream, &[Expect::Reply(Op::Pull)], &[], 1 << 20);
        assert!(got.is_empty());
        assert!(error.unwrap().contains("over the 1048576-byte limit"));
        // At the limit it is a frame on its way, and room is made for it.
        stream[1..9].copy_from_slice(&(1u64 << 20).to_le_bytes());
        let mut decoder = Decoder::new(1 << 20);
        decoder.spare()[..9].copy_from_slice(&stream);
        decoder.filled(9);
        assert_eq!(decoder.next(Expect::Reply(Op::Pull)), Ok(None));
        // Room grows with what arrives, not with the claim.
        assert!(decoder.spare().len() < 1 << 20);
        // No limit is above an MRDN frame's size.
        stream[1..9].copy_from_slice(&(MAX_FRAME + 1).to_le_bytes());
        let (_, error) = feed(&stream, &[Expect::Reply(Op::Pull)], &[], u64::MAX);
        assert!(
            error
                .unwrap()
                .contains(&format!("over the {MAX_FRAME}-byte limit"))
        );
    }

    #[test]
    fn malformed_responses_are_errors() {
        let pull = [Expect::Reply(Op::Pull)];
        let (_, error) = feed(&[9], &pull, &[], 64);
        assert!(
            error
                .unwrap()
                .contains("unknown status byte 9 answering PULL")
        );
        let mut long = vec![2];
        long.extend_from_slice(&1025u16.to_le_bytes());
        let (_, error) = feed(&long, &pull, &[], 64);
        assert!(error.unwrap().contains("over the 1024-byte limit"));
        let (_, error) = feed(&[3, 2, 0, 0xff, 0xfe], &pull, &[], 64);
        assert!(error.unwrap().contains("not UTF-8"));
        // Another protocol is caught at its first wrong byte.
        let (_, error) = feed(b"H", &[Expect::Hello], &[], 64);
        assert!(error.unwrap().contains("not a kvwasm fabric server"));
        let (_, error) = feed(b"KVFL\x02\0\0\0", &[Expect::Hello], &[], 64);
        assert!(error.is_some());
    }

    #[test]
    fn a_refused_hello_is_an_error_response() {
        let refused = [(
            Expect::Hello,
            Sent::Error(Status::Refused, "version 2".into()),
        )];
        assert_eq!(feed_all(&refused, &[3]), (vec![refused[0].1.clone()], None));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// However the bytes are split across reads, every response comes
        /// out whole, in order, and nothing else.
        #[test]
        fn responses_split_anywhere_decode_exactly(
            responses in proptest::collection::vec(response(), 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
        ) {
            let responses: Vec<(Expect, Sent)> =
                std::iter::once((Expect::Hello, Sent::Hello)).chain(responses).collect();
            let sent: Vec<Sent> = responses.iter().map(|(_, s)| s.clone()).collect();
            prop_assert_eq!(feed_all(&responses, &cuts), (sent, None));
        }

        /// A stream cut short yields the whole responses before the cut,
        /// then waits: never an error, never a partial response.
        #[test]
        fn truncated_streams_wait_for_more(
            responses in proptest::collection::vec(response(), 1..8),
            cut in any::<usize>(),
        ) {
            let expects: Vec<Expect> = responses.iter().map(|(e, _)| *e).collect();
            let stream = encode(&responses);
            let cut = cut % stream.len();
            let (got, error) = feed(&stream[..cut], &expects, &[], 64 << 20);
            prop_assert_eq!(error, None);
            prop_assert!(got.len() < responses.len());
            let sent: Vec<Sent> = responses.iter().map(|(_, s)| s.clone()).collect();
            prop_assert_eq!(&got[..], &sent[..got.len()]);
        }

        /// Garbage, alone or after valid status bytes and lengths, with any
        /// expectations and limit: an error or a wait, never a panic.
        #[test]
        fn garbage_never_panics(
            head in proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1), Just(2), Just(3), any::<u8>()], 0..4),
            tail in proptest::collection::vec(any::<u8>(), 0..512),
            expects in proptest::collection::vec(
                prop_oneof![
                    Just(Expect::Hello),
                    Just(Expect::Reply(Op::Push)),
                    Just(Expect::Reply(Op::Pull)),
                    Just(Expect::Reply(Op::Release)),
                ], 1..16),
            max_frame in prop_oneof![Just(u64::MAX), 0..1024u64],
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let stream = [head, tail].concat();
            let _ = feed(&stream, &expects, &cuts, max_frame);
        }
    }
}
