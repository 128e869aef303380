//! Network grants: outbound TCP to listed peers, and guest name lookups only
//! when granted.
//!
//! Peers are written `host:port`. Names are resolved **by the host when the
//! backend is loaded**, and the guest may connect to exactly the resulting
//! addresses: a guest cannot steer the host's resolver, and a peer whose
//! address changes needs the config to be reloaded. Listening, accepting
//! and UDP are never allowed.

use std::collections::BTreeSet;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

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
    /// Whether the guest may resolve names itself (`wasi:sockets/ip-name-lookup`).
    pub dns: bool,
}

impl NetGrant {
    /// Resolve `peers` (each `host:port`) now.
    pub fn resolve(peers: &[String], dns: bool) -> Result<NetGrant, String> {
        let mut addrs = BTreeSet::new();
        for peer in peers {
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
            dns,
        })
    }

    pub(crate) fn apply(&self, builder: &mut WasiCtxBuilder, metrics: &Arc<BackendMetrics>) {
        builder
            .allow_udp(false)
            .allow_tcp(!self.addrs.is_empty())
            .allow_ip_name_lookup(self.dns);
        let allowed = Arc::new(self.addrs.clone());
        let metrics = metrics.clone();
        builder.socket_addr_check(move |addr, use_| {
            let ok = match use_ {
                SocketAddrUse::TcpConnect => allowed.contains(&addr),
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
        !self.addrs.is_empty()
    }

    /// One line per peer with its addresses.
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
