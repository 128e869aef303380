//! Network grants: outbound TCP to listed peers, and guest name lookups only
//! when granted.
//!
//! Peers are written `host:port`. Names are resolved **by the host when the
//! backend is loaded**, and the guest may connect to exactly the resulting
//! addresses: a guest cannot steer the host's resolver, and a peer whose
//! address changes needs the config to be reloaded. A range of addresses is
//! written as a CIDR block with a port or an inclusive port range,
//! `10.0.0.0/24:6379` or `[fd00::/64]:7000-7005` (the nodes a Redis Cluster
//! may announce). Listening, accepting and UDP are never allowed.

use std::collections::BTreeSet;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::sync::Arc;

use ipnet::IpNet;

use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::sockets::SocketAddrUse;

use crate::metrics::BackendMetrics;

/// The TCP peers a guest may connect to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetGrant {
    /// As written in the config, for display.
    pub peers: Vec<String>,
    /// What they resolved to at load time.
    pub addrs: BTreeSet<SocketAddr>,
    /// Address ranges (CIDR blocks), each with its ports.
    pub ranges: Vec<(IpNet, RangeInclusive<u16>)>,
    /// Whether the guest may resolve names itself (`wasi:sockets/ip-name-lookup`).
    pub dns: bool,
}

impl NetGrant {
    /// Resolve `peers` (each `host:port`) now.
    pub fn resolve(peers: &[String], dns: bool) -> Result<NetGrant, String> {
        let mut addrs = BTreeSet::new();
        let mut ranges = Vec::new();
        for peer in peers {
            if let Some(range) = parse_range(peer)? {
                ranges.push(range);
                continue;
            }
            let (host, port) = peer
                .rsplit_once(':')
                .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
                .ok_or_else(|| format!("net peer {peer:?} must be host:port"))?;
            let found = (
                host.trim_matches(['[', ']']),
                port.parse::<u16>().expect("checked"),
            )
                .to_socket_addrs()
                .map_err(|e| format!("net peer {peer:?}: cannot resolve: {e}"))?;
            addrs.extend(found);
        }
        Ok(NetGrant {
            peers: peers.to_vec(),
            addrs,
            ranges,
            dns,
        })
    }

    /// Whether the guest may connect to `addr`.
    pub fn allows(&self, addr: &SocketAddr) -> bool {
        self.addrs.contains(addr)
            || self
                .ranges
                .iter()
                .any(|(net, ports)| net.contains(&addr.ip()) && ports.contains(&addr.port()))
    }

    pub(crate) fn apply(&self, builder: &mut WasiCtxBuilder, metrics: &Arc<BackendMetrics>) {
        builder
            .allow_udp(false)
            .allow_tcp(self.has_peers())
            .allow_ip_name_lookup(self.dns);
        let allowed = Arc::new(self.clone());
        let metrics = metrics.clone();
        builder.socket_addr_check(move |addr, use_| {
            let ok = match use_ {
                SocketAddrUse::TcpConnect => allowed.allows(&addr),
                // The implicit bind a connect performs (wildcard, any port).
                SocketAddrUse::TcpBind => addr.ip().is_unspecified() && addr.port() == 0,
                _ => false,
            };
            if !ok {
                metrics.denial();
                crate::log_limit::warn(
                    ("net denied", Arc::as_ptr(&metrics) as usize),
                    format_args!("network access denied: {addr} ({use_:?}) is not a granted peer"),
                );
            }
            Box::pin(std::future::ready(ok))
        });
    }

    /// Whether the guest may open any socket at all.
    pub(crate) fn has_peers(&self) -> bool {
        !self.addrs.is_empty() || !self.ranges.is_empty()
    }

    /// One line per peer with its addresses.
    ///
    /// (A range is shown as written: `tcp 10.0.0.0/24:6379`.)
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.peers.iter().map(|p| format!("tcp {p}")).collect();
        if !self.addrs.is_empty() {
            let addrs: Vec<String> = self.addrs.iter().map(ToString::to_string).collect();
            lines.push(format!("  resolved at load: {}", addrs.join(", ")));
        }
        lines.push(format!(
            "guest name lookups: {}",
            if self.dns { "granted" } else { "denied" }
        ));
        lines
    }
}

/// A range grant, `<cidr>:<port>` or `<cidr>:<first>-<last>` (IPv6 in
/// brackets): `None` for anything without a `/` before the port.
fn parse_range(peer: &str) -> Result<Option<(IpNet, RangeInclusive<u16>)>, String> {
    let Some((net, ports)) = peer.rsplit_once(':').filter(|(h, _)| h.contains('/')) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        format!("net peer {peer:?}: {why} (a range is <cidr>:<port> or <cidr>:<first>-<last>)")
    };
    let net: IpNet = net
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|e| bad(&format!("{e}")))?;
    let (first, last) = ports.split_once('-').unwrap_or((ports, ports));
    let (Ok(first), Ok(last)) = (first.parse::<u16>(), last.parse::<u16>()) else {
        return Err(bad("bad port"));
    };
    if first == 0 || first > last {
        return Err(bad("empty port range"));
    }
    Ok(Some((net.trunc(), first..=last)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_grant_exactly_their_addresses_and_ports() {
        let grant = NetGrant::resolve(
            &[
                "10.0.0.0/24:6379".into(),
                "[fd00::/64]:7000-7005".into(),
                "127.0.0.1:1".into(),
            ],
            false,
        )
        .unwrap();
        let allows = |a: &str| grant.allows(&a.parse().unwrap());
        assert!(allows("10.0.0.7:6379") && allows("10.0.0.255:6379"));
        assert!(!allows("10.0.1.7:6379") && !allows("10.0.0.7:6380"));
        assert!(allows("[fd00::1]:7000") && allows("[fd00::1:2]:7005"));
        assert!(!allows("[fd00::1]:7006") && !allows("[fd01::1]:7000"));
        assert!(allows("127.0.0.1:1") && !allows("127.0.0.1:2"));
        assert!(grant.has_peers());
        for bad in [
            "10.0.0.0/33:1",
            "10.0.0.0/8:0",
            "10.0.0.0/8:9-8",
            "10.0.0.0/8:x",
        ] {
            assert!(NetGrant::resolve(&[bad.into()], false).is_err(), "{bad}");
        }
    }
}
