//! Writes behind (`dedup_check = "write"`): a short chunk goes out as
//! `SET key value NX` while the consumer goes on putting, pipelined on the
//! connection of the node serving its key, and its reply is read later, as
//! a native client pipelines a save. `NX` keeps a chunk already stored, so
//! the write is its own existence check. With `wait_replicas` the write is
//! a plain `SET`: one that finds the key replicates nothing, so no `WAIT`
//! would count it (Redis 7.2 and later), while a plain `SET` of the same
//! bytes is replicated and counted.
//!
//! Every other command on a connection waits until its writes behind are
//! answered ([`Redis::drain_behind`]), so replies stay matched to their
//! commands. A write that fails (an error reply, `MOVED` or `ASK` during a
//! resharding, a lost connection) is handed back by
//! [`Redis::settle_behind`] with its value, and the store stages it for the
//! flush, which checks it and, if it is missing, writes it through
//! [`Redis::run`] with redirections and reconnection. A node is counted as
//! written to ([`Node::unconfirmed`]) as soon as a write is sent, so a
//! connection lost before its replies fails the next `WAIT` instead of
//! skipping it.

use std::collections::VecDeque;
use std::time::Instant;

use kvwasm_guest_support::Error;
use kvwasm_guest_support::remote::{LONG_VALUE, Value};
use redis_protocol::resp2::types::OwnedFrame;

use crate::conn::{self, Arg, ConnError, Reply, WRITE_BATCH};
use crate::{Node, Redis, unexpected};

/// Bytes one connection's writes behind may hold unanswered (values plus
/// [`ENTRY_COST`] each): past it a put waits for the oldest replies. A
/// value is dropped once answered, so a save's chunks reuse the same
/// memory instead of growing the instance's.
const WINDOW: usize = 1 << 20;
/// What a waiting write costs besides its value (its key and queue entry),
/// so a save of tiny chunks is bounded too.
const ENTRY_COST: usize = 128;

/// A connection's writes behind, oldest first.
#[derive(Default)]
pub(crate) struct Behind {
    /// Encoded commands the socket has not taken yet.
    out: Vec<u8>,
    /// Each write's key and value until its reply is read, in the order
    /// sent.
    waiting: VecDeque<(String, Value)>,
    /// What `waiting` holds, counted as [`WINDOW`] counts it.
    bytes: usize,
}

/// A write behind that failed, with its value and why.
pub(crate) type Failed = (String, Value, Error);

/// Writes behind handed back, until the store settles them.
#[derive(Default)]
pub(crate) struct FailedWrites {
    list: Vec<Failed>,
    /// What `list` holds, counted as [`WINDOW`] counts it.
    bytes: usize,
}

impl FailedWrites {
    fn push(&mut self, key: String, value: Value, why: Error) {
        self.bytes += cost(&value);
        self.list.push((key, value, why));
    }
}

fn cost(value: &Value) -> usize {
    value.len() + ENTRY_COST
}

impl Node {
    /// Queue the write of `value` under `key`; send once a batch has
    /// gathered, and read the oldest replies once the window is full.
    /// `Err` gives the value back if it could not even be encoded.
    fn queue(
        &mut self,
        key: String,
        value: Vec<u8>,
        replicated: bool,
        failed: &mut FailedWrites,
        deadline: Instant,
    ) -> Result<Result<(), ConnError>, (String, Vec<u8>)> {
        let set = [
            Arg::Bytes(b"SET"),
            Arg::Bytes(key.as_bytes()),
            Arg::Bytes(&value),
        ];
        let set_nx = [
            Arg::Bytes(b"SET"),
            Arg::Bytes(key.as_bytes()),
            Arg::Bytes(&value),
            Arg::Bytes(b"NX"),
        ];
        let command: &[Arg<'_>] = if replicated { &set } else { &set_nx };
        if conn::encode_bytes(&mut self.behind.out, command).is_err() {
            return Err((key, value));
        }
        let value = Value::Bytes(value);
        self.behind.bytes += cost(&value);
        self.behind.waiting.push_back((key, value));
        Ok(self.pump(failed, deadline))
    }

    fn pump(&mut self, failed: &mut FailedWrites, deadline: Instant) -> Result<(), ConnError> {
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
                    over = over.saturating_sub(cost(v));
                    more
                })
                .count();
            self.answer_behind(count, failed, deadline)?;
        }
        Ok(())
    }

    fn send_behind(&mut self, deadline: Instant) -> Result<(), ConnError> {
        if self.behind.out.is_empty() {
            return Ok(());
        }
        // Sent or not, the server may execute what it received: a `WAIT`
        // must cover this node from now on.
        self.unconfirmed = true;
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
        failed: &mut FailedWrites,
        deadline: Instant,
    ) -> Result<(), ConnError> {
        for reply in self.conn.read_replies(count, deadline)? {
            let (key, value) = self.behind.waiting.pop_front().expect("one per reply");
            self.behind.bytes -= cost(&value);
            match reply {
                // Stored, or (`NX`) already there.
                Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK" => {}
                Reply::Frame(OwnedFrame::Null) => {}
                other => failed.push(key, value, unexpected("SET", other)),
            }
        }
        Ok(())
    }
}

impl Redis {
    /// Start writing a short chunk behind; `Err` gives it back unwritten
    /// (too long, no node for its key, no connection, or a window's worth
    /// of failed writes not yet handed back), to be staged.
    pub(crate) fn write_behind(
        &mut self,
        key: String,
        value: Value,
    ) -> Result<(), (String, Value)> {
        let bytes = match value {
            Value::Bytes(bytes)
                if bytes.len() < LONG_VALUE && self.behind_failed.bytes < WINDOW =>
            {
                bytes
            }
            other => return Err((key, other)),
        };
        let deadline = Instant::now() + self.endpoint.timeout;
        let address = match self.node_of(key.as_bytes(), deadline) {
            Ok(address) => address,
            Err(_) => return Err((key, Value::Bytes(bytes))),
        };
        if !self.nodes.contains_key(&address) && self.connect(&address, deadline).is_err() {
            return Err((key, Value::Bytes(bytes)));
        }
        let replicated = self.endpoint.wait_replicas > 0;
        let node = self.nodes.get_mut(&address).expect("connected");
        match node.queue(key, bytes, replicated, &mut self.behind_failed, deadline) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.lose_behind(&address, e);
                Ok(())
            }
            Err((key, bytes)) => Err((key, Value::Bytes(bytes))),
        }
    }

    /// Answer every write behind by `deadline`: afterwards each connection
    /// is free for other commands. Every node's rest is sent before any
    /// reply is read, so the nodes work at once. Failures are kept for
    /// [`Redis::settle_behind`].
    pub(crate) fn drain_behind(&mut self, deadline: Instant) {
        let waiting: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| !node.behind.waiting.is_empty())
            .map(|(address, _)| address.clone())
            .collect();
        let mut sent = Vec::with_capacity(waiting.len());
        for address in waiting {
            let node = self.nodes.get_mut(&address).expect("listed");
            match node.send_behind(deadline) {
                Ok(()) => sent.push(address),
                Err(e) => self.lose_behind(&address, e),
            }
        }
        for address in sent {
            let node = self.nodes.get_mut(&address).expect("listed");
            let count = node.behind.waiting.len();
            if let Err(e) = node.answer_behind(count, &mut self.behind_failed, deadline) {
                self.lose_behind(&address, e);
            }
        }
    }

    /// Every write behind answered; those that failed, with their values.
    pub(crate) fn settle_behind(&mut self) -> Vec<Failed> {
        self.drain_behind(Instant::now() + self.endpoint.timeout);
        std::mem::take(&mut self.behind_failed).list
    }

    /// `address`'s connection failed with writes behind unanswered: drop
    /// it (a `WAIT` then fails: the node was written to), and hand every
    /// one of them back as failed.
    fn lose_behind(&mut self, address: &str, e: ConnError) {
        let waiting = self
            .nodes
            .get_mut(address)
            .map(|node| std::mem::take(&mut node.behind.waiting))
            .unwrap_or_default();
        self.drop_node(address);
        for (key, value) in waiting {
            let why = Error::Unavailable(e.message.clone());
            self.behind_failed.push(key, value, why);
        }
    }
}
