//! Writes behind (`dedup_check = "write"`): a short chunk goes out as
//! `SET key value NX` while the consumer goes on putting, pipelined on the
//! connection of the node serving its key, and its reply is read later, as
//! a native client pipelines a save. `NX` keeps a chunk already stored, so
//! the write is its own existence check.
//!
//! Every other command on a connection waits until its writes behind are
//! answered ([`Redis::drain_behind`]): replies come in order, and a `WAIT`
//! must count them. A write that fails (an error reply, `MOVED` or `ASK`
//! during a resharding, a lost connection) is handed back by
//! [`Redis::settle_behind`] with its value, and the store stages it for the
//! flush, which sends it through [`Redis::run`] with redirections and
//! reconnection.

use std::collections::VecDeque;
use std::time::Instant;

use kvwasm_guest_support::Error;
use kvwasm_guest_support::remote::{LONG_VALUE, Value};
use redis_protocol::resp2::types::OwnedFrame;

use crate::conn::{self, Arg, ConnError, Reply, WRITE_BATCH};
use crate::{Node, Redis, unexpected};

/// Bytes of values one connection may hold unanswered: past it a put waits
/// for the oldest replies. A value is dropped once answered, so a save's
/// chunks reuse the same memory instead of growing the instance's.
const WINDOW: usize = 1 << 20;

/// A connection's writes behind, oldest first.
#[derive(Default)]
pub(crate) struct Behind {
    /// Encoded commands the socket has not taken yet.
    out: Vec<u8>,
    /// Each write's key and value until its reply is read, in the order
    /// sent.
    waiting: VecDeque<(String, Value)>,
    /// Bytes of the values in `waiting`.
    bytes: usize,
}

/// A write behind that failed, with its value and why.
pub(crate) type Failed = (String, Value, Error);

impl Node {
    /// Queue `SET key value NX`; send once a batch has gathered, and read
    /// the oldest replies once the window is full.
    fn queue(
        &mut self,
        key: String,
        value: Vec<u8>,
        failed: &mut Vec<Failed>,
        deadline: Instant,
    ) -> Result<(), ConnError> {
        let command = [
            Arg::Bytes(b"SET"),
            Arg::Bytes(key.as_bytes()),
            Arg::Bytes(&value),
            Arg::Bytes(b"NX"),
        ];
        conn::encode_bytes(&mut self.behind.out, &command).map_err(|e| ConnError {
            message: format!("cannot encode a command: {e}"),
            dropped: false,
            denied: false,
            not_granted: false,
        })?;
        self.behind.bytes += value.len();
        self.behind.waiting.push_back((key, Value::Bytes(value)));
        if self.behind.out.len() >= WRITE_BATCH || self.behind.bytes > WINDOW {
            self.send_behind(deadline)?;
        }
        if self.behind.bytes > WINDOW {
            let mut over = self.behind.bytes - WINDOW / 2;
            let count = self
                .behind
                .waiting
                .iter()
                .take_while(|(_, v)| {
                    let more = over > 0;
                    over = over.saturating_sub(v.len());
                    more
                })
                .count();
            self.answer_behind(count, failed, deadline)?;
        }
        Ok(())
    }

    fn send_behind(&mut self, deadline: Instant) -> Result<(), ConnError> {
        let out = std::mem::take(&mut self.behind.out);
        let sent = self.conn.send(&out, deadline);
        // The buffer is kept for the next batch.
        self.behind.out = out;
        self.behind.out.clear();
        sent
    }

    /// Read the replies of the `count` oldest writes behind (all sent).
    fn answer_behind(
        &mut self,
        count: usize,
        failed: &mut Vec<Failed>,
        deadline: Instant,
    ) -> Result<(), ConnError> {
        for reply in self.conn.read_replies(count, deadline)? {
            let (key, value) = self.behind.waiting.pop_front().expect("one per reply");
            self.behind.bytes -= value.len();
            match reply {
                // Stored, or already there (`NX`): a `WAIT` covers it either
                // way, as `run` counts every write that did not fail.
                Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK" => self.unconfirmed = true,
                Reply::Frame(OwnedFrame::Null) => self.unconfirmed = true,
                other => failed.push((key, value, unexpected("SET NX", other))),
            }
        }
        Ok(())
    }

    /// Send what is left and read every reply.
    fn drain(&mut self, failed: &mut Vec<Failed>, deadline: Instant) -> Result<(), ConnError> {
        if self.behind.waiting.is_empty() {
            return Ok(());
        }
        self.send_behind(deadline)?;
        self.answer_behind(self.behind.waiting.len(), failed, deadline)
    }
}

impl Redis {
    /// Start writing a short chunk behind; `Err` gives it back unwritten
    /// (too long, no node for its key, no connection, or too many failed
    /// writes not yet handed back), to be staged.
    pub(crate) fn write_behind(
        &mut self,
        key: String,
        value: Value,
    ) -> Result<(), (String, Value)> {
        let failed_bytes: usize = self.behind_failed.iter().map(|(_, v, _)| v.len()).sum();
        let bytes = match value {
            Value::Bytes(bytes) if bytes.len() < LONG_VALUE && failed_bytes < WINDOW => bytes,
            other => return Err((key, other)),
        };
        let deadline = Instant::now() + self.endpoint.timeout;
        let address = match self.node_of(key.as_bytes()) {
            Ok(address) => address,
            Err(_) => return Err((key, Value::Bytes(bytes))),
        };
        if !self.nodes.contains_key(&address) && self.connect(&address, deadline).is_err() {
            return Err((key, Value::Bytes(bytes)));
        }
        let node = self.nodes.get_mut(&address).expect("connected");
        if let Err(e) = node.queue(key, bytes, &mut self.behind_failed, deadline) {
            self.lose_behind(&address, e);
        }
        Ok(())
    }

    /// Answer every write behind: afterwards each connection is free for
    /// other commands. Failures are kept for [`Redis::settle_behind`].
    pub(crate) fn drain_behind(&mut self) {
        let waiting: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| !node.behind.waiting.is_empty())
            .map(|(address, _)| address.clone())
            .collect();
        if waiting.is_empty() {
            return;
        }
        let deadline = Instant::now() + self.endpoint.timeout;
        for address in waiting {
            let node = self.nodes.get_mut(&address).expect("listed");
            if let Err(e) = node.drain(&mut self.behind_failed, deadline) {
                self.lose_behind(&address, e);
            }
        }
    }

    /// Every write behind answered; those that failed, with their values.
    pub(crate) fn settle_behind(&mut self) -> Vec<Failed> {
        self.drain_behind();
        std::mem::take(&mut self.behind_failed)
    }

    /// `address`'s connection failed with writes behind unanswered: drop
    /// it, and hand every one of them back as failed.
    fn lose_behind(&mut self, address: &str, e: ConnError) {
        let waiting = self
            .nodes
            .get_mut(address)
            .map(|node| std::mem::take(&mut node.behind.waiting))
            .unwrap_or_default();
        self.drop_node(address);
        for (key, value) in waiting {
            let why = Error::Unavailable(e.message.clone());
            self.behind_failed.push((key, value, why));
        }
    }
}
