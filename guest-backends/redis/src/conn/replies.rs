//! Replies as they arrive: bytes read and not yet decoded, checked before
//! the decoder sees them. Apart from the socket, so the decoding is tested
//! natively.

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

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
    /// bytes arrive ([`Connection::nested_command`](super::Connection::nested_command)).
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
