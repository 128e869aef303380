//! Redis backend: chunks and manifests as Redis strings, reached over a
//! `wasi:sockets` TCP connection to the one peer the operator granted.
//!
//! The store logic (staging, batched flush, prefetch cache) is the shared
//! [`RemoteStore`]; this crate supplies [`Remote`] as Redis pipelines: one
//! round trip per batch of `EXISTS`, `SET`, `GET` or `DEL` commands, and
//! `SET NX` to write a short chunk through when puts answer exactly
//! (`dedup_check = "put"`).
//!
//! Settings (`[backends.<name>.settings]`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `address` | required | `host:port` of the server (grant the same in `net`); `rediss://host:port` for TLS |
//! | `tls` | `false` | TLS, done by the host (set by the backend's `tls` grant) |
//! | `db` | `0` | database index (`SELECT`) |
//! | `user` | none | ACL user for `AUTH` |
//! | `password_env` | `REDIS_PASSWORD` | environment variable holding the password (grant it in `env`) |
//! | `timeout_ms` | `5000` | deadline of one operation (connect if needed, then one pipeline); keep it under the host's `call_timeout_ms` |
//! | `prefix`, `dedup_check`, `max_pending_mib`, `prefetch_cache_mib`, `prefetch_wave` | | see `kvwasm_guest_support::remote` |

mod conn;

use std::time::Instant;

use kvwasm_guest_support::remote::{LONG_VALUE, Remote, RemoteStore, Value};
use kvwasm_guest_support::{
    BackendInfo, Error, Guest, Payload, PayloadExt, Result, Settings, export_backend,
};
use redis_protocol::resp2::types::OwnedFrame;

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

/// A Redis server, with the connection kept open between calls and
/// re-established after a failure.
struct Redis {
    endpoint: Endpoint,
    conn: Option<Connection>,
}

impl Redis {
    /// Send `commands` as one pipeline and read one reply per command,
    /// connecting first if needed, all within one `timeout_ms`. A reused
    /// connection that the server dropped (it restarted, or closed an idle
    /// client) is replaced and the pipeline sent once more, within the same
    /// deadline: every command kvwasm sends is idempotent.
    fn pipeline(&mut self, commands: &[Vec<Arg<'_>>]) -> Result<Vec<Reply<Payload>>> {
        let deadline = Instant::now() + self.endpoint.timeout;
        let reused = self.conn.is_some();
        match self.try_pipeline(commands, deadline) {
            Err(e) if reused && e.dropped => {
                eprintln!("redis: {}; reconnecting", e.message);
                self.try_pipeline(commands, deadline).map_err(Error::from)
            }
            other => other.map_err(Error::from),
        }
    }

    fn try_pipeline(
        &mut self,
        commands: &[Vec<Arg<'_>>],
        deadline: Instant,
    ) -> Result<Vec<Reply<Payload>>, ConnError> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => Connection::open(&self.endpoint, deadline)?,
        };
        // On error the connection is dropped here: its state is unknown.
        let replies = conn.pipeline_args(commands, deadline)?;
        self.conn = Some(conn);
        Ok(replies)
    }

    /// One command per key, each with the same verb.
    fn per_key(&mut self, verb: &str, keys: &[String]) -> Result<Vec<Reply<Payload>>> {
        let commands: Vec<Vec<Arg<'_>>> = keys
            .iter()
            .map(|k| vec![Arg::Bytes(verb.as_bytes()), Arg::Bytes(k.as_bytes())])
            .collect();
        self.pipeline(&commands)
    }
}

impl Remote for Redis {
    fn connect(settings: &Settings) -> Result<Self> {
        let endpoint = Endpoint::from_settings(settings)?;
        // Connect now, so a wrong address or password fails the open with
        // the server's reason instead of the first save.
        let deadline = Instant::now() + endpoint.timeout;
        let conn = Connection::open(&endpoint, deadline).map_err(Error::from)?;
        Ok(Redis {
            endpoint,
            conn: Some(conn),
        })
    }

    fn exists(&mut self, keys: &[String]) -> Result<Vec<bool>> {
        self.per_key("EXISTS", keys)?
            .into_iter()
            .map(|reply| match reply {
                Reply::Frame(OwnedFrame::Integer(n)) => Ok(n > 0),
                other => Err(unexpected("EXISTS", other)),
            })
            .collect()
    }

    /// Short chunks are written through: `SET key value NX` answers `OK`
    /// if it stored the value, nil if the key was there. A reply lost with
    /// a dropped connection is asked again (`pipeline`); if the lost `SET`
    /// had landed, the retry finds the key and the put answers "already
    /// present", which is then true. Long chunks are checked with `EXISTS`
    /// and staged, so a warm save does not send their bytes.
    const WRITE_THROUGH_BELOW: usize = LONG_VALUE;

    fn put_if_absent(&mut self, key: &str, data: &Payload) -> Result<bool> {
        let value = data.to_vec();
        let command = vec![
            Arg::Bytes(b"SET"),
            Arg::Bytes(key.as_bytes()),
            Arg::Bytes(&value),
            Arg::Bytes(b"NX"),
        ];
        match self.pipeline(&[command])?.pop() {
            Some(Reply::Frame(OwnedFrame::SimpleString(s))) if s == b"OK" => Ok(true),
            Some(Reply::Frame(OwnedFrame::Null)) => Ok(false),
            other => Err(unexpected(
                "SET NX",
                other.unwrap_or(Reply::Frame(OwnedFrame::Null)),
            )),
        }
    }

    /// Long values are staged as host copies and go from them to the
    /// socket (`payload-streams.write-all`), never through linear memory.
    const SENDS_PAYLOADS: bool = true;

    fn put(&mut self, items: &[(String, &Value)]) -> Result<()> {
        let commands: Vec<Vec<Arg<'_>>> = items
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    Value::Bytes(b) => Arg::Bytes(b),
                    Value::Payload(p) => Arg::Payload(p),
                };
                vec![Arg::Bytes(b"SET"), Arg::Bytes(key.as_bytes()), value]
            })
            .collect();
        for reply in self.pipeline(&commands)? {
            match reply {
                Reply::Frame(OwnedFrame::SimpleString(s)) if s == b"OK" => {}
                other => return Err(unexpected("SET", other)),
            }
        }
        Ok(())
    }

    fn get(&mut self, keys: &[String]) -> Result<Vec<Option<Value>>> {
        self.per_key("GET", keys)?
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
        match self.per_key("DEL", &[key.to_owned()])?.pop() {
            Some(Reply::Frame(OwnedFrame::Integer(_))) => Ok(()),
            other => Err(unexpected(
                "DEL",
                other.unwrap_or(Reply::Frame(OwnedFrame::Null)),
            )),
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
