//! The keep-alive https clients: one per TLS grant, verifying servers with
//! the grant's config, and one for the process, trusting the public roots.
//! A TLS grant holds its client and the client's connector reads the grant,
//! so both live here, beside the grant.

use std::sync::Arc;

use wasmtime_wasi_http::WasiBody;

use super::{TlsGrant, client_config, public_roots};

/// Idle keep-alive connections kept per origin: the s3 guest's window of
/// requests in flight (`max_concurrency`, 16 by default) can reuse one each.
const MAX_IDLE_PER_ORIGIN: usize = 16;

/// How long an idle connection is kept before it is closed: under the
/// idle timeouts servers commonly apply (20 s and up), so the pool closes
/// a connection before the server does, not while a request goes out on it.
const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The longest a new https connection may take to connect and complete its
/// handshake. The request that asked for it is bounded by its own
/// timeouts; this bounds the attempt itself, which the pool finishes in the
/// background when another connection served the request first.
const CONNECT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The settings both pooled clients share: keep-alive connections per
/// origin, closed when idle, driven by tasks on the runtime that sends.
pub(crate) fn pooled() -> hyper_util::client::legacy::Builder {
    let mut builder =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    builder
        .pool_max_idle_per_host(MAX_IDLE_PER_ORIGIN)
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_timer(hyper_util::rt::TokioTimer::new());
    builder
}

/// The keep-alive https client of one TLS grant, made on its first
/// request: its connections were verified with that grant's roots (and
/// present its client certificate), so only backends holding the grant
/// reuse them, each request checked against its own `http` grant first.
/// A new TLS handshake per request, as before, cost a native client's
/// whole request time over again, and left thousands of connections in
/// `TIME_WAIT` (with a TLS proxy in between, twice as many).
pub(crate) type HttpsClient = hyper_util::client::legacy::Client<HttpsConnector, WasiBody>;

pub(crate) fn https_client(grant: &Arc<TlsGrant>) -> &HttpsClient {
    grant.https.get_or_init(|| {
        pooled().build(HttpsConnector {
            // Weak: the client lives in the grant.
            verify: Verify::Grant(Arc::downgrade(grant)),
        })
    })
}

/// The process's keep-alive https client for backends without a `tls`
/// grant: the public roots, the origin's host as the server name, no
/// client certificate. Shared by every such backend, as the plain-http
/// pool is: its connections carry nothing of one backend's (no
/// certificate, no other roots), and a request reaches it only after its
/// own backend's `http` grant allowed the origin.
pub(crate) fn public_https() -> Result<&'static HttpsClient, &'static String> {
    static CLIENT: std::sync::OnceLock<Result<HttpsClient, String>> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| https_trusting(public_roots()))
        .as_ref()
}

/// A keep-alive https client verifying servers against `roots` and the
/// request's host: [`public_https`] with the public roots.
pub(crate) fn https_trusting(roots: rustls::RootCertStore) -> Result<HttpsClient, String> {
    let config = client_config(roots)?.with_no_client_auth();
    Ok(pooled().build(HttpsConnector {
        verify: Verify::Roots(Arc::new(config)),
    }))
}

/// Connects to an https origin: TCP (`TCP_NODELAY`), then a rustls
/// handshake verifying the server as [`Verify`] says.
#[derive(Clone)]
pub(crate) struct HttpsConnector {
    verify: Verify,
}

/// How an [`HttpsConnector`] verifies the server.
#[derive(Clone)]
enum Verify {
    /// With the grant's config, against the grant's server name
    /// ([`TlsGrant::server_name`]).
    Grant(std::sync::Weak<TlsGrant>),
    /// With this config (its roots, no client certificate), against the
    /// host of the request's origin, which the `http` grant allowed.
    Roots(Arc<rustls::ClientConfig>),
}

/// Why a connection could not be made, for the guest's error code.
#[derive(Debug)]
pub(crate) enum ConnectError {
    Tcp(std::io::Error),
    Tls(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Tcp(e) => write!(f, "connect: {e}"),
            ConnectError::Tls(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ConnectError {}

type TlsIo = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// A verified TLS connection, as the pooled client uses it.
pub(crate) struct TlsConnection(TlsIo);

impl hyper_util::client::legacy::connect::Connection for TlsConnection {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

impl hyper::rt::Read for TlsConnection {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConnection {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl tower_service::Service<http::Uri> for HttpsConnector {
    type Response = TlsConnection;
    type Error = ConnectError;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<TlsConnection, ConnectError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        // What the handshake needs, taken now: the attempt holds no
        // reference to the grant (or its pool) while it waits.
        let prepared = (|| {
            let host = uri
                .host()
                .ok_or_else(|| ConnectError::Tls(format!("no host in {uri}")))?
                .trim_matches(['[', ']'])
                .to_owned();
            match &self.verify {
                Verify::Grant(grant) => {
                    let grant = grant.upgrade().ok_or_else(|| {
                        ConnectError::Tls("the backend's TLS grant is gone".into())
                    })?;
                    let name = grant.server_name(&host).map_err(ConnectError::Tls)?;
                    Ok((grant.config.clone(), host, name))
                }
                Verify::Roots(config) => {
                    let name =
                        rustls::pki_types::ServerName::try_from(host.clone()).map_err(|_| {
                            ConnectError::Tls(format!(
                                "TLS server name {host:?} is not a DNS name or an IP"
                            ))
                        })?;
                    Ok((config.clone(), host, name))
                }
            }
        })();
        let port = uri.port_u16().unwrap_or(443);
        Box::pin(async move {
            let (config, host, name) = prepared?;
            let shown = name.to_str().into_owned();
            let connect = async {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                    .await
                    .map_err(ConnectError::Tcp)?;
                tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
                tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| {
                        ConnectError::Tls(format!("TLS handshake with {shown} failed: {e}"))
                    })
            };
            let stream = tokio::time::timeout(CONNECT_LIMIT, connect)
                .await
                .map_err(|_| {
                    ConnectError::Tls(format!(
                        "TLS connection to {shown} not made within {} s",
                        CONNECT_LIMIT.as_secs()
                    ))
                })??;
            Ok(TlsConnection(hyper_util::rt::TokioIo::new(stream)))
        })
    }
}
