//! A Redis Cluster's slot map: which master serves each of the 16,384
//! slots, read from `CLUSTER SHARDS` (Redis 7) or `CLUSTER SLOTS` (older
//! servers), and the redirections (`MOVED`, `ASK`) that correct it.

use redis_protocol::resp2::types::OwnedFrame;

/// Slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The slot of `key` (its hash tag's, if it has one), as the cluster
/// computes it.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    redis_protocol::redis_keyslot(key)
}

/// Slot ranges (inclusive) and the `host:port` of the master serving each.
pub(crate) type Ranges = Vec<(u16, u16, String)>;

/// The masters' slot ranges from a `CLUSTER SHARDS` reply; `asked` is the
/// `host:port` of the node that answered (its host stands in for a node
/// whose address it does not know), `tls` picks the nodes' TLS ports.
pub(crate) fn from_shards(reply: &OwnedFrame, asked: &str, tls: bool) -> Result<Ranges, String> {
    let mut ranges = Ranges::new();
    for shard in array(reply, "CLUSTER SHARDS")? {
        let slots = field(shard, "slots")?;
        let nodes = array(field(shard, "nodes")?, "nodes")?;
        let master = nodes
            .iter()
            .find(|node| {
                text(field(node, "role").ok()) == Some("master")
                    && text(field(node, "health").ok()) != Some("failed")
            })
            .map(|node| shard_node_address(node, asked, tls))
            .transpose()?;
        let Some(master) = master else { continue };
        let bounds = array(slots, "slots")?;
        for pair in bounds.chunks(2) {
            let [start, end] = pair else {
                return Err("CLUSTER SHARDS: an odd slot list".into());
            };
            ranges.push((slot(start)?, slot(end)?, master.clone()));
        }
    }
    Ok(ranges)
}

/// The masters' slot ranges from a `CLUSTER SLOTS` reply (as
/// [`from_shards`]).
pub(crate) fn from_slots(reply: &OwnedFrame, asked: &str) -> Result<Ranges, String> {
    let mut ranges = Ranges::new();
    for range in array(reply, "CLUSTER SLOTS")? {
        let parts = array(range, "a slot range")?;
        let [start, end, master, ..] = parts else {
            return Err("CLUSTER SLOTS: a short slot range".into());
        };
        let node = array(master, "a node")?;
        let [host, port, ..] = node else {
            return Err("CLUSTER SLOTS: a short node".into());
        };
        let port = integer(port)?;
        ranges.push((
            slot(start)?,
            slot(end)?,
            address(text(Some(host)).unwrap_or(""), port, asked)?,
        ));
    }
    Ok(ranges)
}

/// A redirection (`MOVED <slot> <host:port>` or `ASK <slot> <host:port>`)
/// in an error reply, with the node's address; `asked` is the node that
/// sent it (for an empty host).
pub(crate) enum Redirect {
    Moved(u16, String),
    Ask(String),
}

pub(crate) fn redirect(error: &str, asked: &str) -> Option<Redirect> {
    let mut words = error.split(' ');
    let (kind, slot, target) = (words.next()?, words.next()?, words.next()?);
    let slot: u16 = slot.parse().ok().filter(|s| usize::from(*s) < SLOTS)?;
    let (host, port) = target.rsplit_once(':')?;
    let target = address(host, i64::from(port.parse::<u16>().ok()?), asked).ok()?;
    match kind {
        "MOVED" => Some(Redirect::Moved(slot, target)),
        "ASK" => Some(Redirect::Ask(target)),
        _ => None,
    }
}

/// `host:port`, with `asked`'s host when the cluster does not know the
/// node's (an empty or `?` host).
fn address(host: &str, port: i64, asked: &str) -> Result<String, String> {
    let port = u16::try_from(port).map_err(|_| format!("a bad port {port}"))?;
    let host = match host {
        "" | "?" => asked.rsplit_once(':').map_or(asked, |(h, _)| h),
        host => host,
    };
    if host.contains(':') && !host.starts_with('[') {
        Ok(format!("[{host}]:{port}"))
    } else {
        Ok(format!("{host}:{port}"))
    }
}

fn shard_node_address(node: &OwnedFrame, asked: &str, tls: bool) -> Result<String, String> {
    let port = match (tls, field(node, "tls-port")) {
        (true, Ok(port)) => integer(port)?,
        _ => integer(field(node, "port")?)?,
    };
    let host = ["endpoint", "ip"]
        .iter()
        .find_map(|name| text(field(node, name).ok()).filter(|h| !h.is_empty() && *h != "?"))
        .unwrap_or("");
    address(host, port, asked)
}

fn array<'a>(frame: &'a OwnedFrame, what: &str) -> Result<&'a [OwnedFrame], String> {
    match frame {
        OwnedFrame::Array(items) => Ok(items),
        other => Err(format!("{what}: expected an array, got {other:?}")),
    }
}

/// The value after `name` in a flat key/value array (RESP2's maps).
fn field<'a>(frame: &'a OwnedFrame, name: &str) -> Result<&'a OwnedFrame, String> {
    array(frame, name)?
        .chunks(2)
        .find(|pair| text(pair.first()) == Some(name))
        .and_then(|pair| pair.get(1))
        .ok_or_else(|| format!("CLUSTER SHARDS: no `{name}`"))
}

fn text(frame: Option<&OwnedFrame>) -> Option<&str> {
    match frame? {
        OwnedFrame::BulkString(b) | OwnedFrame::SimpleString(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn integer(frame: &OwnedFrame) -> Result<i64, String> {
    match frame {
        OwnedFrame::Integer(n) => Ok(*n),
        other => text(Some(other))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| format!("expected an integer, got {other:?}")),
    }
}

fn slot(frame: &OwnedFrame) -> Result<u16, String> {
    integer(frame)
        .ok()
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| usize::from(*n) < SLOTS)
        .ok_or_else(|| format!("a bad slot {frame:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> OwnedFrame {
        OwnedFrame::BulkString(s.as_bytes().to_vec())
    }

    fn node(pairs: &[(&str, OwnedFrame)]) -> OwnedFrame {
        OwnedFrame::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [bulk(k), v.clone()])
                .collect(),
        )
    }

    #[test]
    fn key_slots_are_the_clusters() {
        // `redis-cli cluster keyslot ...`
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"kvwasm/ns/chunks/0a"), 3326);
    }

    #[test]
    fn shards_give_each_masters_ranges_at_its_announced_address() {
        let shard = |slots: &[i64], master: &str, port: i64, replica_port: i64| {
            node(&[
                (
                    "slots",
                    OwnedFrame::Array(slots.iter().map(|s| OwnedFrame::Integer(*s)).collect()),
                ),
                (
                    "nodes",
                    OwnedFrame::Array(vec![
                        node(&[
                            ("port", OwnedFrame::Integer(replica_port)),
                            ("ip", bulk("127.0.0.1")),
                            ("role", bulk("replica")),
                            ("health", bulk("online")),
                        ]),
                        node(&[
                            ("port", OwnedFrame::Integer(port)),
                            ("tls-port", OwnedFrame::Integer(port + 1000)),
                            ("endpoint", bulk(master)),
                            ("role", bulk("master")),
                            ("health", bulk("online")),
                        ]),
                    ]),
                ),
            ])
        };
        let reply = OwnedFrame::Array(vec![
            shard(&[0, 99, 200, 300], "10.0.0.1", 7000, 7003),
            shard(&[100, 199], "?", 7001, 7004),
        ]);
        assert_eq!(
            from_shards(&reply, "10.0.0.9:7002", false).unwrap(),
            [
                (0, 99, "10.0.0.1:7000".into()),
                (200, 300, "10.0.0.1:7000".into()),
                (100, 199, "10.0.0.9:7001".into()),
            ]
        );
        assert_eq!(
            from_shards(&reply, "x:1", true).unwrap()[0],
            (0, 99, "10.0.0.1:8000".into())
        );
        let bad = OwnedFrame::Array(vec![shard(&[0, 99, 16_384, 16_384], "h", 1, 2)]);
        assert!(from_shards(&bad, "x:1", false).is_err());
    }

    #[test]
    fn slots_replies_and_redirections_are_read() {
        let reply = OwnedFrame::Array(vec![OwnedFrame::Array(vec![
            OwnedFrame::Integer(0),
            OwnedFrame::Integer(5460),
            OwnedFrame::Array(vec![bulk("::1"), OwnedFrame::Integer(7000), bulk("id")]),
            OwnedFrame::Array(vec![bulk("::1"), OwnedFrame::Integer(7003), bulk("id2")]),
        ])]);
        assert_eq!(
            from_slots(&reply, "x:1").unwrap(),
            [(0, 5460, "[::1]:7000".into())]
        );
        assert!(matches!(
            redirect("MOVED 3999 127.0.0.1:6381", "x:1"),
            Some(Redirect::Moved(3999, a)) if a == "127.0.0.1:6381"
        ));
        assert!(matches!(
            redirect("ASK 3999 :6381", "10.1.1.1:7000"),
            Some(Redirect::Ask(a)) if a == "10.1.1.1:6381"
        ));
        assert!(redirect("MOVED 16384 h:1", "x:1").is_none());
        assert!(redirect("ERR wrong", "x:1").is_none());
    }
}
