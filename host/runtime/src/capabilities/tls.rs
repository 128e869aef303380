//! TLS grants: the host, not the guest, speaks TLS to a remote store.
//!
//! A backend with a `tls` entry may ask for a `wasi:tls` client session on
//! a socket it was granted (the Redis guest), and its `https` requests
//! (`wasi:http`, the S3 guest) are made with the same client config. The
//! host performs every handshake with rustls and verifies the server's
//! certificate against the roots the operator chose: the public roots
//! (webpki-roots), a CA bundle (`ca_file`) replacing or extending them,
//! and optionally presents a client certificate (mutual TLS). There is no
//! way to skip verification.
//!
//! The CA bundle and the client certificate and key are read by the host
//! when the backend is loaded; the guest never sees them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use wasmtime_wasi_tls::{TlsProvider, TlsStream, TlsTransport};

use crate::metrics::BackendMetrics;

/// `tls = true`, or `[backends.<name>.tls]` with its keys.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(
    untagged,
    expecting = "tls = true, or a table of ca_file, ca_mode, client_cert, client_key, \
                 server_name (there is no way to skip verification)"
)]
pub enum TlsConfig {
    /// `tls = true`: the public roots, no client certificate.
    On(bool),
    Table(TlsTable),
}

/// The keys of `[backends.<name>.tls]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsTable {
    /// PEM bundle of CA certificates.
    pub ca_file: Option<PathBuf>,
    /// Whether `ca_file` replaces the public roots (default) or extends them.
    #[serde(default)]
    pub ca_mode: CaMode,
    /// PEM client certificate chain, for mutual TLS (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the
    /// host of the granted peer or origin.
    pub server_name: Option<String>,
}

/// How `ca_file` combines with the public roots.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CaMode {
    /// Only the operator's CAs: a private store trusts nothing else.
    #[default]
    Replace,
    /// The public roots and the operator's CAs.
    Extend,
}

impl TlsConfig {
    /// The table, or `None` for `tls = false`.
    pub fn table(&self) -> Option<TlsTable> {
        match self {
            TlsConfig::On(false) => None,
            TlsConfig::On(true) => Some(TlsTable::default()),
            TlsConfig::Table(t) => Some(t.clone()),
        }
    }

    /// What can be checked without reading files.
    pub fn validate(&self) -> Result<(), String> {
        let Some(t) = self.table() else {
            return Ok(());
        };
        if t.client_cert.is_some() != t.client_key.is_some() {
            return Err("tls: client_cert and client_key go together".into());
        }
        if t.ca_mode == CaMode::Extend && t.ca_file.is_none() {
            return Err("tls: ca_mode = \"extend\" needs a ca_file".into());
        }
        if let Some(name) = &t.server_name {
            ServerName::try_from(name.as_str())
                .map_err(|_| format!("tls: server_name {name:?} is not a DNS name or an IP"))?;
        }
        Ok(())
    }
}

/// The TLS grant of one backend: the client config every handshake uses.
#[derive(Clone, Debug)]
pub struct TlsGrant {
    /// `ca_file`, resolved, with the SHA-256 of its bytes (hex).
    pub ca: Option<(PathBuf, String)>,
    pub ca_mode: CaMode,
    /// `client_cert`, resolved, with the SHA-256 of its bytes (hex).
    pub client_cert: Option<(PathBuf, String)>,
    pub server_name: Option<String>,
    /// Hosts of the granted peers and origins: the names a guest may ask
    /// for when no `server_name` is set.
    pub hosts: Vec<String>,
    pub config: Arc<rustls::ClientConfig>,
}

impl PartialEq for TlsGrant {
    fn eq(&self, other: &TlsGrant) -> bool {
        (
            &self.ca,
            self.ca_mode,
            &self.client_cert,
            &self.server_name,
            &self.hosts,
        ) == (
            &other.ca,
            other.ca_mode,
            &other.client_cert,
            &other.server_name,
            &other.hosts,
        )
    }
}
impl Eq for TlsGrant {}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("tls: cannot read {what} {}: {e}", path.display()))
}

impl TlsGrant {
    /// Read the files of `table` (relative to `base`) and build the client
    /// config. `hosts` are the hosts of the backend's peers and origins.
    pub fn load(table: &TlsTable, base: &Path, hosts: Vec<String>) -> Result<TlsGrant, String> {
        let mut roots = rustls::RootCertStore::empty();
        if table.ca_file.is_none() || table.ca_mode == CaMode::Extend {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        let ca = match &table.ca_file {
            Some(path) => {
                let path = base.join(path);
                let bytes = read("ca_file", &path)?;
                let certs = CertificateDer::pem_slice_iter(&bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("tls: ca_file {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "tls: ca_file {} holds no PEM certificate",
                        path.display()
                    ));
                }
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| format!("tls: ca_file {}: {e}", path.display()))?;
                }
                Some((path, sha256_hex(&bytes)))
            }
            None => None,
        };
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_root_certificates(roots);
        let (config, client_cert) = match (&table.client_cert, &table.client_key) {
            (Some(cert), Some(key)) => {
                let (cert, key) = (base.join(cert), base.join(key));
                let cert_bytes = read("client_cert", &cert)?;
                let chain = CertificateDer::pem_slice_iter(&cert_bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("tls: client_cert {}: {e}", cert.display()))?;
                // Not echoed: the key's text.
                let key_der = PrivateKeyDer::from_pem_slice(&read("client_key", &key)?)
                    .map_err(|_| format!("tls: client_key {} is no PEM key", key.display()))?;
                let config = builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("tls: client certificate: {e}"))?;
                let fingerprint = sha256_hex(&cert_bytes);
                (config, Some((cert, fingerprint)))
            }
            _ => (builder.with_no_client_auth(), None),
        };
        Ok(TlsGrant {
            ca,
            ca_mode: table.ca_mode,
            client_cert,
            server_name: table.server_name.clone(),
            hosts,
            config: Arc::new(config),
        })
    }

    /// The name to verify the certificate of `requested` against: the
    /// operator's `server_name` if set, else `requested` if it is the host
    /// of a granted peer or origin.
    pub fn server_name(&self, requested: &str) -> Result<ServerName<'static>, String> {
        let requested = requested.trim_matches(['[', ']']);
        let name = match &self.server_name {
            Some(name) => name.as_str(),
            None if self.hosts.iter().any(|h| h.eq_ignore_ascii_case(requested)) => requested,
            None => {
                return Err(format!(
                    "TLS to {requested:?} refused: not the host of a granted peer \
                     (set tls.server_name)"
                ));
            }
        };
        ServerName::try_from(name.to_owned())
            .map_err(|_| format!("TLS server name {name:?} is not a DNS name or an IP"))
    }

    /// Lines for `kvwasm check-config`.
    pub fn describe(&self) -> Vec<String> {
        let roots = match (&self.ca, self.ca_mode) {
            (None, _) => "public roots (webpki-roots)".to_owned(),
            (Some((p, sha)), CaMode::Replace) => {
                format!("ca_file {} only (sha256 {sha})", p.display())
            }
            (Some((p, sha)), CaMode::Extend) => {
                format!("public roots + ca_file {} (sha256 {sha})", p.display())
            }
        };
        let mut lines = vec![format!("on: {roots}")];
        lines.push(match &self.server_name {
            Some(n) => format!("server name {n}"),
            None => "server name: the peer's host".to_owned(),
        });
        if let Some((p, sha)) = &self.client_cert {
            lines.push(format!("client certificate {} (sha256 {sha})", p.display()));
        }
        lines
    }
}

/// The `wasi:tls` provider of one instance: handshakes with the backend's
/// grant, or refused when it has none.
pub(crate) struct HostTls {
    pub grant: Option<Arc<TlsGrant>>,
    pub metrics: Arc<BackendMetrics>,
    pub backend: Arc<str>,
}

impl TlsProvider for HostTls {
    fn connect(
        &self,
        server_name: String,
        transport: Box<dyn TlsTransport>,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = Result<Box<dyn TlsStream>, wasmtime_wasi_tls::Error>> + Send>,
    > {
        let backend = self.backend.clone();
        let refuse = |why: String| {
            crate::log_limit::warn(
                ("tls", Arc::as_ptr(&self.metrics) as usize),
                format_args!("backend {backend}: {why}"),
            );
            let failed: Result<Box<dyn TlsStream>, _> = Err(wasmtime_wasi_tls::Error::msg(why));
            Box::pin(std::future::ready(failed))
        };
        let Some(grant) = &self.grant else {
            self.metrics.denial();
            return refuse("TLS refused: the backend has no `tls` grant".into());
        };
        let name = match grant.server_name(&crate::log_limit::bounded(server_name)) {
            Ok(name) => name,
            Err(why) => {
                self.metrics.denial();
                return refuse(why);
            }
        };
        let config = grant.config.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let shown = name.to_str().into_owned();
            match tokio_rustls::TlsConnector::from(config)
                .connect(name, transport)
                .await
            {
                Ok(stream) => Ok(Box::new(stream) as Box<dyn TlsStream>),
                Err(e) => {
                    crate::log_limit::warn(
                        ("tls", Arc::as_ptr(&metrics) as usize),
                        format_args!("backend {backend}: TLS handshake with {shown} failed: {e}"),
                    );
                    Err(wasmtime_wasi_tls::Error::msg(format!("{shown}: {e}")))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(server_name: Option<&str>) -> TlsGrant {
        let table = TlsTable {
            server_name: server_name.map(str::to_owned),
            ..TlsTable::default()
        };
        let hosts = vec!["127.0.0.1".to_owned(), "redis.internal".to_owned()];
        TlsGrant::load(&table, Path::new("/"), hosts).unwrap()
    }

    #[test]
    fn a_guest_names_only_a_granted_peer_and_the_operator_name_wins() {
        let g = grant(None);
        let dns = |n: &str| ServerName::try_from(n.to_owned()).unwrap();
        assert_eq!(
            g.server_name("redis.internal").unwrap(),
            dns("redis.internal")
        );
        assert_eq!(
            g.server_name("REDIS.internal").unwrap(),
            dns("REDIS.internal")
        );
        assert_eq!(g.server_name("127.0.0.1").unwrap(), dns("127.0.0.1"));
        let refused = g.server_name("bank.example").unwrap_err();
        assert!(
            refused.contains("not the host of a granted peer"),
            "{refused}"
        );
        // With `server_name`, that name is verified whatever the guest asks.
        let g = grant(Some("cache.example"));
        assert_eq!(g.server_name("bank.example").unwrap(), dns("cache.example"));
    }

    #[test]
    fn tls_entries_are_checked_before_any_file_is_read() {
        let table = |t: TlsTable| TlsConfig::Table(t).validate();
        assert!(TlsConfig::On(true).validate().is_ok());
        assert_eq!(TlsConfig::On(false).table(), None);
        let half = TlsTable {
            client_key: Some("k.pem".into()),
            ..TlsTable::default()
        };
        assert!(table(half).unwrap_err().contains("go together"));
        let extend = TlsTable {
            ca_mode: CaMode::Extend,
            ..TlsTable::default()
        };
        assert!(table(extend).unwrap_err().contains("needs a ca_file"));
        let name = TlsTable {
            server_name: Some("not a name".into()),
            ..TlsTable::default()
        };
        assert!(table(name).unwrap_err().contains("not a DNS name"));
    }
}
