//! Redis backend: chunks and manifests as Redis strings, reached over
//! `wasi:sockets` TCP connections to the peers the operator granted: one
//! server, or the masters of a Redis Cluster (`mode = "cluster"`, keys
//! routed by slot, docs/redis-cluster.md).
//!
//! The store logic (staging, batched flush, prefetch cache) is the shared
//! [`RemoteStore`]; this crate supplies [`Remote`] as Redis pipelines: one
//! round trip per batch of `EXISTS`, `SET`, `GET` or `DEL` commands, and
//! `SET NX` to write a short chunk through when puts answer exactly
//! (`dedup_check = "put"`), or behind, pipelined while the consumer goes on
//! putting (`dedup_check = "write"`, the `behind` module).
//!
//! Settings (`[backends.<name>.settings]`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `mode` | `single` | `single`: one server at `address`; `cluster`: a Redis Cluster |
//! | `address` | required (single) | `host:port` of the server (grant the same in `net`); `rediss://host:port` for TLS |
//! | `addresses` | `address` | cluster: seed nodes asked for the slot map (a list); grant every node in `net` |
//! | `wait_replicas` | `0` | replicas that must acknowledge a save's writes (`WAIT`) before its manifest is published |
//! | `wait_timeout_ms` | `1000` | how long that `WAIT` may take |
//! | `tls` | `false` | TLS, done by the host (set by the backend's `tls` grant) |
//! | `db` | `0` | database index (`SELECT`; a cluster has only 0) |
//! | `user` | none | ACL user for `AUTH` |
//! | `password_env` | `REDIS_PASSWORD` | environment variable holding the password (grant it in `env`) |
//! | `timeout_ms` | `5000` | deadline of one operation (connect if needed, then one pipeline); keep it under the host's `call_timeout_ms` |
//! | `prefix`, `dedup_check`, `max_pending_mib`, `prefetch_cache_mib`, `prefetch_wave` | | see `kvwasm_guest_support::remote` |

mod behind;
mod cluster;
mod conn;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use kvwasm_guest_support::remote::{LONG_VALUE, Remote, RemoteStore, Value};
use kvwasm_guest_support::{
    BackendInfo, Error, Guest, Payload, PayloadExt, Result, Settings, export_backend,
};
use redis_protocol::resp2::types::OwnedFrame;

use cluster::Redirect;
use conn::{Arg, ConnError, Connection, Endpoint, Reply};

struct RedisBackend;

impl Guest for RedisBackend {
    type Store = RemoteStore<Redis>;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "redis".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // The data lives in the server: any instance sees it.
            shared_state: true,
        }
    }
}

/// A Redis server, or the masters of a Redis Cluster, with one connection
/// per node kept open between calls and re-established after a failure.
struct Redis {
    endpoint: Endpoint,
    /// Open connections, by `host:port`.
    nodes: HashMap<String, Node>,
    /// Cluster mode: the master serving each slot, as an index into
    /// `masters` (`u16::MAX`: no master known).
    slots: Vec<u16>,
    masters: Vec<String>,
    /// Announced nodes the sandbox refused (not granted in `net`): never
    /// connected to again by this instance, and logged once.
    refused: HashSet<String>,
    /// A node whose connection was lost while it held writes not yet
    /// confirmed on `wait_replicas` replicas: the next confirmation fails.
    lost_unconfirmed: Option<String>,
    /// Writes behind that failed, until the store settles them.
    behind_failed: behind::FailedWrites,
}

/// An open connection and whether writes went through it since the last
/// `WAIT` (which covers only the writes of its own connection).
struct Node {
    conn: Connection,
    unconfirmed: bool,
    /// Writes behind on this connection, not yet answered.
    behind: behind::Behind,
}

/// One command and the key it is routed by.
struct Command<'a> {
    key: &'a [u8],
    args: Vec<Arg<'a>>,
    /// Whether it writes (a `WAIT` must then cover its node).
    writes: bool,
}

/// The commands bound for one node: its address, each command's index
/// and whether an `ASK` sent it there, and whether the node's connection
/// was open before this operation.
type Group = (String, Vec<(usize, bool)>, bool);

/// Redirections and reconnections one operation follows before failing.
const MAX_ATTEMPTS: usize = 5;
const NO_MASTER: u16 = u16::MAX;

impl Redis {
    /// Run `commands`, each on the node serving its key (the one server in
    /// single mode), as one pipeline per node: every pipeline is sent
    /// before any reply is read, so the nodes work at once. All within one
    /// `timeout_ms`, connecting first if needed. Every command kvwasm
    /// sends is idempotent, so a command is sent again, within the same
    /// deadline, after a dropped connection (a reused one the server
    /// closed, or a cluster node that went away: the map is then read
    /// again), a `MOVED` (to the new owner, whose slot the map learns) or
    /// an `ASK` (to the importing node, after `ASKING`).
    fn run(&mut self, commands: &[Command<'_>]) -> Result<Vec<Reply<Payload>>> {
        let deadline = Instant::now() + self.endpoint.timeout;
        self.drain_behind(deadline);
        let mut replies: Vec<Option<Reply<Payload>>> = commands.iter().map(|_| None).collect();
        // Each command still to answer, with the node an `ASK` sent it to.
        let mut todo: Vec<(usize, Option<String>)> =
            (0..commands.len()).map(|i| (i, None)).collect();
        let mut failure = None;
        let mut reconnected = false;
        for _ in 0..MAX_ATTEMPTS {
            if todo.is_empty() {
                break;
            }
            let mut groups: BTreeMap<String, Vec<(usize, bool)>> = BTreeMap::new();
            for (at, asked) in todo.drain(..) {
                let (node, asking) = match asked {
                    Some(node) => (node, true),
                    None => (self.node_of(commands[at].key, deadline)?, false),
                };
                groups.entry(node).or_default().push((at, asking));
            }
            let mut refresh = false;
            let mut connected = Vec::new();
            let new: Vec<String> = groups
                .keys()
                .filter(|address| !self.nodes.contains_key(*address))
                .cloned()
                .collect();
            let mut opened: HashMap<String, Result<(), ConnError>> = if new.is_empty() {
                HashMap::new()
            } else {
                new.iter()
                    .cloned()
                    .zip(self.connect_all(&new, deadline))
                    .collect()
            };
            for (address, group) in groups {
                let reused = !opened.contains_key(&address);
                let opened = opened.remove(&address).unwrap_or(Ok(()));
                match opened {
                    Ok(()) => connected.push((address, group, reused)),
                    Err(e) => {
                        self.failed(e, reused, &mut reconnected)?;
                        refresh = true;
                        failure = Some(address);
                        todo.extend(group.into_iter().map(|(at, _)| (at, None)));
                    }
                }
            }
            let mut sent = Vec::new();
            let results = self.send(commands, &connected, deadline);
            for (result, (address, group, reused)) in results.into_iter().zip(connected) {
                match result {
                    Ok(()) => sent.push((address, group, reused)),
                    Err(e) => {
                        self.drop_node(&address);
                        self.failed(e, reused, &mut reconnected)?;
                        refresh = true;
                        failure = Some(address);
                        todo.extend(group.into_iter().map(|(at, _)| (at, None)));
                    }
                }
            }
            for (address, group, reused) in sent {
                let expected = group.len() + group.iter().filter(|(_, asking)| *asking).count();
                let node = self.nodes.get_mut(&address).expect("sent to it");
                let got = match node.conn.read_replies(expected, deadline) {
                    Ok(got) => got,
                    Err(e) => {
                        self.drop_node(&address);
                        self.failed(e, reused, &mut reconnected)?;
                        refresh = true;
                        failure = Some(address);
                        todo.extend(group.into_iter().map(|(at, _)| (at, None)));
                        continue;
                    }
                };
                let mut got = got.into_iter();
                for (at, asking) in group {
                    if asking {
                        got.next();
                    }
                    let reply = got.next().expect("one reply per command");
                    let redirect = match &reply {
                        Reply::Frame(OwnedFrame::Error(e)) if self.endpoint.cluster => {
                            cluster::redirect(e, &address)
                        }
                        _ => None,
                    };
                    match redirect {
                        Some(Redirect::Moved(slot, owner)) => {
                            self.set_owner(slot, owner);
                            refresh = true;
                            todo.push((at, None));
                        }
                        Some(Redirect::Ask(node)) => todo.push((at, Some(node))),
                        None => {
                            if commands[at].writes
                                && !matches!(reply, Reply::Frame(OwnedFrame::Error(_)))
                                && let Some(node) = self.nodes.get_mut(&address)
                            {
                                node.unconfirmed = true;
                            }
                            replies[at] = Some(reply);
                        }
                    }
                }
            }
            if refresh
                && self.endpoint.cluster
                && !todo.is_empty()
                && let Err(e) = self.refresh(deadline)
            {
                kvwasm_guest_support::log!("redis cluster: cannot read the slot map again: {e:?}");
            }
        }
        if !todo.is_empty() {
            return Err(Error::Unavailable(match failure {
                Some(node) => format!(
                    "redis cluster: {node} failed and no other node answered for its keys \
                     within {MAX_ATTEMPTS} attempts"
                ),
                None => format!("redis cluster: still redirected after {MAX_ATTEMPTS} attempts"),
            }));
        }
        Ok(replies.into_iter().map(|r| r.expect("answered")).collect())
    }

    /// After a failed exchange: whether to send the commands again. One
    /// server: once, if a reused connection was found dropped (the server
    /// restarted, or closed an idle client). A cluster: while attempts
    /// last, with the map read again (a node failed over, or moved), except
    /// to a node the sandbox refused.
    fn failed(&self, e: ConnError, reused: bool, reconnected: &mut bool) -> Result<()> {
        if self.endpoint.cluster && !e.denied {
            kvwasm_guest_support::log!("redis cluster: {}; reading the slot map again", e.message);
            return Ok(());
        }
        if !self.endpoint.cluster && e.dropped && reused && !*reconnected {
            kvwasm_guest_support::log!("redis: {}; reconnecting", e.message);
            *reconnected = true;
            return Ok(());
        }
        Err(e.into())
    }

    /// Send each group of `commands` to its node, connected (`ASKING`
    /// before each command an `ASK` redirected): to all nodes at once
    /// ([`conn::send_together`]), or, when long values are among them
    /// (written whole by the host), one node after the other. One result
    /// per group; a node that failed is in an unknown state (drop it).
    fn send(
        &mut self,
        commands: &[Command<'_>],
        groups: &[Group],
        deadline: Instant,
    ) -> Vec<Result<(), ConnError>> {
        let asking = [Arg::Bytes(b"ASKING")];
        let pipeline = |group: &[(usize, bool)]| -> Vec<&[Arg<'_>]> {
            group
                .iter()
                .flat_map(|&(at, ask)| {
                    let first: Option<&[Arg<'_>]> = ask.then_some(&asking);
                    first.into_iter().chain([commands[at].args.as_slice()])
                })
                .collect()
        };
        let pipelines: Vec<Vec<&[Arg<'_>]>> = groups.iter().map(|(_, g, _)| pipeline(g)).collect();
        if pipelines.iter().all(|p| conn::all_bytes(p)) {
            let together: Vec<(&Connection, Vec<&[Arg<'_>]>)> = groups
                .iter()
                .zip(pipelines)
                .map(|((address, _, _), p)| (&self.nodes[address].conn, p))
                .collect();
            return conn::send_together(&together, deadline);
        }
        groups
            .iter()
            .zip(pipelines)
            .map(|((address, _, _), p)| {
                let node = self.nodes.get_mut(address).expect("connected");
                node.conn.send_commands(p.into_iter(), deadline)
            })
            .collect()
    }

    fn connect(&mut self, address: &str, deadline: Instant) -> Result<(), ConnError> {
        let mut opened = self.connect_all(&[address.to_owned()], deadline);
        opened.pop().expect("one result per address")
    }

    /// Connect to every one of `addresses` at once ([`Connection::open_all`]),
    /// except nodes the sandbox refused before; one result per address.
    fn connect_all(
        &mut self,
        addresses: &[String],
        deadline: Instant,
    ) -> Vec<Result<(), ConnError>> {
        let to_open: Vec<&str> = addresses
            .iter()
            .filter(|a| !self.refused.contains(*a))
            .map(String::as_str)
            .collect();
        let mut opened = Connection::open_all(&self.endpoint, &to_open, deadline).into_iter();
        let mut results = Vec::with_capacity(addresses.len());
        for address in addresses {
            if self.refused.contains(address) {
                results.push(Err(refused(address)));
                continue;
            }
            let result = match opened.next().expect("one connection per address") {
                Ok(conn) => {
                    self.nodes.insert(
                        address.clone(),
                        Node {
                            conn,
                            unconfirmed: false,
                            behind: behind::Behind::default(),
                        },
                    );
                    Ok(())
                }
                Err(e) if e.not_granted && self.endpoint.cluster && !self.is_seed(address) => {
                    kvwasm_guest_support::log!(
                        "redis cluster: node {address}, announced by the cluster, is not granted \
                         in `net`: nothing is sent to it, and calls for the keys it serves fail \
                         (grant it, or its address range, to reach it)"
                    );
                    self.refused.insert(address.clone());
                    Err(refused(address))
                }
                Err(e) => Err(e),
            };
            results.push(result);
        }
        results
    }

    fn is_seed(&self, address: &str) -> bool {
        self.endpoint.addresses.iter().any(|a| a == address)
    }

    /// Forget `address`'s connection; writes it carried that no `WAIT`
    /// confirmed can no longer be confirmed.
    fn drop_node(&mut self, address: &str) {
        if let Some(node) = self.nodes.remove(address)
            && node.unconfirmed
        {
            self.lost_unconfirmed = Some(address.to_owned());
        }
    }

    /// The node serving `key`: the server in single mode; in cluster mode
    /// the master of its slot, reading the map first (by `deadline`, the
    /// operation's) if no master is known for it.
    fn node_of(&mut self, key: &[u8], deadline: Instant) -> Result<String> {
        if !self.endpoint.cluster {
            return Ok(self.endpoint.addresses[0].clone());
        }
        let slot = usize::from(cluster::slot_of(key));
        if self.slots[slot] == NO_MASTER {
            self.refresh(deadline)?;
        }
        match self.masters.get(usize::from(self.slots[slot])) {
            Some(master) => Ok(master.clone()),
            None => Err(Error::Unavailable(format!(
                "redis cluster: no master serves slot {slot} (is the cluster down?)"
            ))),
        }
    }

    fn set_owner(&mut self, slot: u16, owner: String) {
        let at = match self.masters.iter().position(|m| *m == owner) {
            Some(at) => at,
            None => {
                self.masters.push(owner);
                self.masters.len() - 1
            }
        };
        self.slots[usize::from(slot)] = u16::try_from(at).unwrap_or(NO_MASTER);
    }

    /// Read the slot map from the first node that answers: those already
    /// connected, then the seeds, then the other known masters.
    fn refresh(&mut self, deadline: Instant) -> Result<()> {
        self.drain_behind(deadline);
        let mut candidates: Vec<String> = self.nodes.keys().cloned().collect();
        for address in self.endpoint.addresses.iter().chain(&self.masters) {
            if !candidates.contains(address) {
                candidates.push(address.clone());
            }
        }
        let mut failure =
            Error::Unavailable("redis cluster: no node to ask for the slot map".into());
        for address in candidates {
            if self.refused.contains(&address) {
                continue;
            }
            match self.read_map(&address, deadline) {
                Ok(ranges) if !ranges.is_empty() => {
                    self.slots.fill(NO_MASTER);
                    self.masters.clear();
                    for (start, end, master) in ranges {
                        for slot in start..=end {
                            self.set_owner(slot, master.clone());
                        }
                    }
                    return Ok(());
                }
                Ok(_) => {
                    failure =
                        Error::Unavailable(format!("redis cluster: {address} knows no slot owner"));
                }
                Err(e) => failure = e,
            }
        }
        Err(failure)
    }

    /// `CLUSTER SHARDS` (`CLUSTER SLOTS` if the server predates it) asked
    /// of `address`.
    fn read_map(&mut self, address: &str, deadline: Instant) -> Result<cluster::Ranges> {
        if !self.nodes.contains_key(address) {
            self.connect(address, deadline).map_err(Error::from)?;
        }
        let tls = self.endpoint.tls;
        let node = self.nodes.get_mut(address).expect("connected");
        let mut ask = |command: &[&[u8]]| node.conn.nested_command(command, deadline);
        let parsed = match ask(&[b"CLUSTER", b"SHARDS"]) {
            Ok(OwnedFrame::Error(e)) if e.contains("unknown subcommand") => {
                match ask(&[b"CLUSTER", b"SLOTS"]) {
                    Ok(OwnedFrame::Error(e)) => Err(conn::server_error("CLUSTER SLOTS", &e)),
                    Ok(reply) => cluster::from_slots(&reply, address).map_err(Error::Io),
                    Err(e) => Err(e.into()),
                }
            }
            Ok(OwnedFrame::Error(e)) => Err(conn::server_error("CLUSTER SHARDS", &e)),
            Ok(reply) => cluster::from_shards(&reply, address, tls).map_err(Error::Io),
            Err(e) => Err(e.into()),
        };
        if parsed.is_err() {
            self.drop_node(address);
        }
        parsed
    }

    /// One command per key, each with the same verb.
    fn per_key(
        &mut self,
        verb: &str,
        keys: &[String],
        writes: bool,
    ) -> Result<Vec<Reply<Payload>>> {
        let commands: Vec<Command<'_>> = keys
            .iter()
            .map(|k| Command {
                key: k.as_bytes(),
                args: vec![Arg::Bytes(verb.as_bytes()), Arg::Bytes(k.as_bytes())],
                writes,
            })
            .collect();
        self.run(&commands)
    }
}

/// The error of a call for keys on a node the sandbox refused.
fn refused(address: &str) -> ConnError {
    ConnError {
        message: format!(
            "redis cluster: node {address} is not granted in `net`; nothing was sent to it"
        ),
        dropped: false,
        denied: true,
        not_granted: true,
    }
}

impl Remote for Redis {
    fn connect(settings: &Settings) -> Result<Self> {
        let endpoint = Endpoint::from_settings(settings)?;
        let mut redis = Redis {
            nodes: HashMap::new(),
            slots: vec![NO_MASTER; if endpoint.cluster { cluster::SLOTS } else { 0 }],
            masters: Vec::new(),
            refused: HashSet::new(),
            lost_unconfirmed: None,
            behind_failed: behind::FailedWrites::default(),
            endpoint,
        };
        // Connect now (and read a cluster's map), so a wrong address or
        // password fails the open with the server's reason instead of the
        // first save.
        let deadline = Instant::now() + redis.endpoint.timeout;
        if redis.endpoint.cluster {
            redis.refresh(deadline)?;
        } else {
            let address = redis.endpoint.addresses[0].clone();
            redis.connect(&address, deadline).map_err(Error::from)?;
        }
        Ok(redis)
    }

    fn exists(&mut self, keys: &[String]) -> Result<Vec<bool>> {
        self.per_key("EXISTS", keys, false)?
            .into_iter()
            .map(|reply| match reply {
                Reply::Frame(OwnedFrame::Integer(n)) => Ok(n > 0),
                other => Err(unexpected("EXISTS", other)),
            })
            .collect()
    }

    /// Short chunks are written through: `SET key value NX` answers `OK`
    /// if it stored the value, nil if the key was there. A reply lost with
    /// a dropped connection is asked again (`run`); if the lost `SET`
    /// had landed, the retry finds the key and the put answers "already
    /// present", which is then true. Long chunks are checked with `EXISTS`
    /// and staged, so a warm save does not send their bytes.
    const WRITE_THROUGH_BELOW: usize = LONG_VALUE;

    fn put_if_absent(&mut self, key: &str, data: &Payload) -> Result<bool> {
        let value = data.to_vec();
        let command = Command {
            key: key.as_bytes(),
            args: vec![
                Arg::Bytes(b"SET"),
                Arg::Bytes(key.as_bytes()),
                Arg::Bytes(&value),
                Arg::Bytes(b"NX"),
            ],
            writes: true,
        };
        match self.run(&[command])?.pop() {
            Some(Reply::Frame(OwnedFrame::SimpleString(s))) if s == b"OK" => Ok(true),
            Some(Reply::Frame(OwnedFrame::Null)) => Ok(false),
            other => Err(unexpected(
                "SET NX",
                other.unwrap_or(Reply::Frame(OwnedFrame::Null)),
            )),
        }
    }

    /// With `dedup_check = "write"`, a short chunk is sent as `SET key
    /// value NX` at once, its reply read later (the `behind` module).
    fn put_behind(&mut self, key: String, value: Value) -> Result<(), (String, Value)> {
        self.write_behind(key, value)
    }

    fn settle(&mut self) -> Vec<(String, Value, Error)> {
        self.settle_behind()
    }

    /// Long values are staged as host copies and go from them to the
    /// socket (`payload-streams.write-all`), never through linear memory.
    const SENDS_PAYLOADS: bool = true;

    fn put(&mut self, items: &[(String, &Value)]) -> Result<()> {
        let commands: Vec<Command<'_>> = items
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    Value::Bytes(b) => Arg::Bytes(b),
                    Value::Payload(p) => Arg::Payload(p),
                };
                Command {
                    key: key.as_bytes(),
                    args: vec![Arg::Bytes(b"SET"), Arg::Bytes(key.as_bytes()), value],
                    writes: true,
                }
            })
            .collect();
        for reply in self.run(&commands)? {
            match reply {
                Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK" => {}
                other => return Err(unexpected("SET", other)),
            }
        }
        Ok(())
    }

    fn get(&mut self, keys: &[String]) -> Result<Vec<Option<Value>>> {
        self.per_key("GET", keys, false)?
            .into_iter()
            .map(|reply| match reply {
                Reply::Long(payload) => Ok(Some(Value::Payload(payload))),
                Reply::Frame(OwnedFrame::BulkString(bytes)) => Ok(Some(Value::Bytes(bytes))),
                Reply::Frame(OwnedFrame::Null) => Ok(None),
                other => Err(unexpected("GET", other)),
            })
            .collect()
    }

    fn delete(&mut self, key: &str) -> Result<()> {
        match self.per_key("DEL", &[key.to_owned()], true)?.pop() {
            Some(Reply::Frame(OwnedFrame::Integer(_))) => Ok(()),
            other => Err(unexpected(
                "DEL",
                other.unwrap_or(Reply::Frame(OwnedFrame::Null)),
            )),
        }
    }

    fn confirms_writes(&self) -> bool {
        self.endpoint.wait_replicas > 0
    }

    /// `WAIT wait_replicas wait_timeout_ms` on every node written to since
    /// the last confirmation, all at once: `Ok` only if each counted enough
    /// replicas. A node whose connection was lost meanwhile cannot say
    /// (`WAIT` covers its own connection's writes): that fails too.
    fn confirm_writes(&mut self) -> Result<()> {
        let replicas = self.endpoint.wait_replicas;
        if replicas == 0 {
            return Ok(());
        }
        let wait_ms = self.endpoint.wait_timeout_ms;
        let deadline = Instant::now() + self.endpoint.timeout + Duration::from_millis(wait_ms);
        self.drain_behind(deadline);
        if let Some(node) = self.lost_unconfirmed.take() {
            return Err(Error::Unavailable(format!(
                "redis at {node}: the connection was lost before its writes were confirmed on \
                 {replicas} replicas (wait_replicas); they may be lost in a failover"
            )));
        }
        let (replicas_arg, wait_arg) = (replicas.to_string(), wait_ms.to_string());
        let wait = [
            Arg::Bytes(b"WAIT"),
            Arg::Bytes(replicas_arg.as_bytes()),
            Arg::Bytes(wait_arg.as_bytes()),
        ];
        let written: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.unconfirmed)
            .map(|(address, _)| address.clone())
            .collect();
        let mut failure = None;
        let mut asked = Vec::new();
        for address in written {
            let node = self.nodes.get_mut(&address).expect("listed");
            match node
                .conn
                .send_commands(std::iter::once(&wait[..]), deadline)
            {
                Ok(()) => asked.push(address),
                Err(e) => {
                    self.drop_node(&address);
                    failure = Some(Error::from(e));
                }
            }
        }
        for address in asked {
            let node = self.nodes.get_mut(&address).expect("asked");
            match node.conn.read_replies(1, deadline).map(|mut r| r.pop()) {
                Ok(Some(Reply::Frame(OwnedFrame::Integer(n)))) if n >= i64::from(replicas) => {
                    node.unconfirmed = false;
                }
                Ok(Some(Reply::Frame(OwnedFrame::Integer(n)))) => {
                    failure = Some(Error::Unavailable(format!(
                        "redis at {address}: {n} of the {replicas} replicas asked for \
                         (wait_replicas) acknowledged the writes within {wait_ms} ms"
                    )));
                }
                Ok(other) => {
                    failure = Some(unexpected(
                        "WAIT",
                        other.unwrap_or(Reply::Frame(OwnedFrame::Null)),
                    ));
                }
                Err(e) => {
                    self.drop_node(&address);
                    failure = Some(e.into());
                }
            }
        }
        // A node dropped here had unconfirmed writes: reported just now.
        self.lost_unconfirmed = None;
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A reply of the wrong shape, or the server's error reply, as an error
/// that carries the server's words.
fn unexpected(command: &str, reply: Reply<Payload>) -> Error {
    match reply {
        Reply::Frame(OwnedFrame::Error(message)) => conn::server_error(command, &message),
        Reply::Frame(other) => Error::Io(format!("redis {command}: unexpected reply {other:?}")),
        Reply::Long(_) => Error::Io(format!("redis {command}: unexpected long bulk string")),
    }
}

export_backend!(RedisBackend);
