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

pub(crate) mod https;

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
/// Not `Clone`: it owns the backend's pool of https connections, which
/// must not be shared with another grant.
#[derive(Debug)]
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
    /// The grant's keep-alive https client, made on its first request
    /// ([`https`]).
    pub(crate) https: std::sync::OnceLock<https::HttpsClient>,
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

/// The public roots (webpki-roots): what `tls = true` trusts, and an
/// `https` origin of a backend without a `tls` entry
/// ([`https::public_https`]).
pub(crate) fn public_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    roots
}

/// A client config verifying servers against `roots` (ring, the safe
/// default protocol versions), waiting for its client certificate choice.
pub(crate) fn client_config(
    roots: rustls::RootCertStore,
) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>, String> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("tls: {e}"))?
    .with_root_certificates(roots))
}

/// What the PEM file `bytes` holds, by section kind (never its contents),
/// for an error about a file of the wrong kind: "it holds a private key".
fn pem_contents(bytes: &[u8]) -> String {
    use rustls::pki_types::pem::SectionKind;
    let mut kinds: Vec<&str> = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(bytes) {
        let kind = match section {
            Ok((SectionKind::Certificate, _)) => "a certificate",
            Ok((
                SectionKind::PrivateKey | SectionKind::RsaPrivateKey | SectionKind::EcPrivateKey,
                _,
            )) => "a private key",
            Ok((SectionKind::PublicKey, _)) => "a public key",
            Ok((SectionKind::Csr, _)) => "a certificate request",
            Ok((SectionKind::Crl, _)) => "a revocation list",
            Ok(_) => "another PEM section",
            Err(_) => "malformed PEM",
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    match kinds.as_slice() {
        [] => "it holds no PEM section".to_owned(),
        kinds => format!("it holds {}", kinds.join(", ")),
    }
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("tls: cannot read {what} {}: {e}", path.display()))
}

impl TlsGrant {
    /// Read the files of `table` (relative to `base`) and build the client
    /// config. `hosts` are the hosts of the backend's peers and origins.
    pub fn load(table: &TlsTable, base: &Path, hosts: Vec<String>) -> Result<TlsGrant, String> {
        let mut roots = match table.ca_file.is_none() || table.ca_mode == CaMode::Extend {
            true => public_roots(),
            false => rustls::RootCertStore::empty(),
        };
        let ca = match &table.ca_file {
            Some(path) => {
                let path = base.join(path);
                let bytes = read("ca_file", &path)?;
                let certs = CertificateDer::pem_slice_iter(&bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("tls: ca_file {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "tls: ca_file {} holds no PEM certificate ({})",
                        path.display(),
                        pem_contents(&bytes)
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
        let builder = client_config(roots)?;
        let (config, client_cert) = match (&table.client_cert, &table.client_key) {
            (Some(cert), Some(key)) => {
                let (cert, key) = (base.join(cert), base.join(key));
                let cert_bytes = read("client_cert", &cert)?;
                let chain = CertificateDer::pem_slice_iter(&cert_bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("tls: client_cert {}: {e}", cert.display()))?;
                // Without this, an empty chain is sent and the server reports
                // "peer sent no certificates", which names neither file.
                if chain.is_empty() {
                    return Err(format!(
                        "tls: client_cert {} holds no PEM certificate ({}); it must be the \
                         client's certificate chain, its key goes in client_key",
                        cert.display(),
                        pem_contents(&cert_bytes)
                    ));
                }
                // Not echoed: the key's text.
                let key_bytes = read("client_key", &key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|_| {
                    format!(
                        "tls: client_key {} holds no PEM private key ({})",
                        key.display(),
                        pem_contents(&key_bytes)
                    )
                })?;
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
            https: std::sync::OnceLock::new(),
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
                .connect(
                    name,
                    Box::new(WholeWrites(transport)) as Box<dyn TlsTransport>,
                )
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

/// The guest's socket under the host's TLS session, sending every TLS
/// record rustls has queued in one write.
///
/// `wasi:sockets` 0.2 has no `TCP_NODELAY`, so a guest's socket keeps
/// Nagle's algorithm. Written one record per write (what the socket stream
/// does with a vectored write), a request larger than one 16 KiB record
/// ends in a short segment that waits for the peer's delayed ACK: about
/// 40 ms per request. One write per flight of records sends a request of
/// up to 64 KiB of records whole; a longer one still leaves in 64 KiB
/// writes, the most the socket stream takes at once.
struct WholeWrites(Box<dyn TlsTransport>);

/// The most bytes of queued records joined into one write: the socket
/// stream's own write permit (wasmtime-wasi's 64 KiB).
const WHOLE_WRITE_MAX: usize = 64 * 1024;

impl tokio::io::AsyncRead for WholeWrites {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for WholeWrites {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
        let (Some(first), true) = (nonempty.next(), bufs.len() > 1) else {
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
            return std::pin::Pin::new(&mut *self.0).poll_write(cx, first);
        };
        // The inner write copies what it accepts, so a short write simply
        // leaves the rest to the next call, as for any partial write.
        let mut joined =
            Vec::with_capacity(WHOLE_WRITE_MAX.min(bufs.iter().map(|b| b.len()).sum::<usize>()));
        joined.extend_from_slice(&first[..first.len().min(WHOLE_WRITE_MAX)]);
        for buf in nonempty {
            let room = WHOLE_WRITE_MAX - joined.len();
            if room == 0 {
                break;
            }
            joined.extend_from_slice(&buf[..buf.len().min(room)]);
        }
        std::pin::Pin::new(&mut *self.0).poll_write(cx, &joined)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_shutdown(cx)
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

    /// A transport that records the length of every write it is given, as
    /// the socket stream under the host's TLS session sees them.
    struct Recorded {
        io: tokio::io::DuplexStream,
        writes: Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl tokio::io::AsyncRead for Recorded {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for Recorded {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let written = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
            if let std::task::Poll::Ready(Ok(n)) = written {
                self.writes.lock().unwrap().push(n);
            }
            written
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    /// The writes that carry one 48 KiB request (three TLS records) from a
    /// client session over `transport` to a server, which must read it
    /// back intact.
    fn writes_of_one_request(whole: bool) -> Vec<usize> {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["redis.internal".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = || Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();

        let request: Vec<u8> = (0..48 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        let (near, far) = tokio::io::duplex(1 << 20);
        let writes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = Recorded {
            io: near,
            writes: writes.clone(),
        };
        let transport: Box<dyn TlsTransport> = if whole {
            Box::new(WholeWrites(Box::new(recorded)))
        } else {
            Box::new(recorded)
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let expected = request.clone();
        let served = runtime.spawn(async move {
            let mut tls = tokio_rustls::TlsAcceptor::from(Arc::new(server))
                .accept(far)
                .await
                .unwrap();
            let mut got = vec![0; expected.len()];
            let mut filled = 0;
            while filled < got.len() {
                let mut buf = ReadBuf::new(&mut got[filled..]);
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut tls).poll_read(cx, &mut buf))
                    .await
                    .unwrap();
                assert!(!buf.filled().is_empty(), "the request was cut short");
                filled += buf.filled().len();
            }
            assert!(got == expected, "the request arrived changed");
        });
        runtime.block_on(async {
            let name = ServerName::try_from("redis.internal").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
                .connect(name, transport)
                .await
                .unwrap();
            writes.lock().unwrap().clear();
            let mut sent = 0;
            while sent < request.len() {
                sent += std::future::poll_fn(|cx| {
                    std::pin::Pin::new(&mut tls).poll_write(cx, &request[sent..])
                })
                .await
                .unwrap();
            }
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut tls).poll_flush(cx))
                .await
                .unwrap();
            served.await.unwrap();
        });
        writes.lock().unwrap().clone()
    }

    /// Nagle's algorithm holds a short segment until the peer acknowledges
    /// the last one; a request sent record by record thus waits for the
    /// peer's delayed ACK. The host sends the records of one request in one
    /// write (the same request without it takes one write per record).
    #[test]
    fn a_request_of_several_tls_records_leaves_in_one_write() {
        let whole = writes_of_one_request(true);
        assert_eq!(whole.len(), 1, "{whole:?}");
        assert!(whole[0] > 48 * 1024, "{whole:?}");
        let one_by_one = writes_of_one_request(false);
        assert!(one_by_one.len() >= 3, "{one_by_one:?}");
        assert_eq!(one_by_one.iter().sum::<usize>(), whole[0]);
    }
}
