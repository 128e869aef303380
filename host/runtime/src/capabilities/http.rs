//! HTTP grants: outbound `wasi:http` requests, only to listed origins.
//!
//! The check runs in the host's outgoing-request hook, on the request the
//! guest built, before any connection is made. A request to any other
//! origin fails with `HTTP-request-denied`, which the guest sees as the
//! error of its request. So does any authority with userinfo
//! (`http://user@host/`): credentials do not belong in a URL, and an
//! origin is compared by host and port alone.
//!
//! An `https` request of a backend with a `tls` grant is sent with the
//! grant's client config (its roots, client certificate and server name;
//! see [`super::tls`]), through that grant's own pooled client (keep-alive
//! connections per origin, `TCP_NODELAY`). Without one it goes through the
//! process's https client ([`public_https`]), which verifies the server
//! against the public roots (webpki-roots) and the origin's host, and
//! presents no certificate. A plain-http request goes through one pooled
//! client for the process. Every request passes the same check first.

use std::sync::Arc;

use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::tls::TlsGrant;
use super::tls::https::{ConnectError, HttpsClient, https_client, pooled, public_https};
use crate::metrics::BackendMetrics;

/// The origins (`scheme://host:port`) a guest may send requests to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpGrant {
    pub origins: Vec<Origin>,
}

/// `scheme://host:port`, normalised (lowercase, explicit port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

impl Origin {
    /// Parse `http://host[:port]` or `https://host[:port]` (no path, no
    /// userinfo).
    pub fn parse(text: &str) -> Result<Origin, String> {
        if has_userinfo(text) {
            // Not echoed: the text before `@` may be a password.
            return Err(
                "an http origin has no userinfo (`user@`): credentials do not belong \
                        in the config; grant them with `env`"
                    .into(),
            );
        }
        let bad = |why: &str| format!("http origin {text:?}: {why}");
        let uri: http::Uri = text.parse().map_err(|e| bad(&format!("{e}")))?;
        let scheme = uri
            .scheme_str()
            .ok_or_else(|| bad("no scheme"))?
            .to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(bad("scheme must be http or https")),
        };
        if uri
            .path_and_query()
            .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
        {
            return Err(bad("an origin has no path"));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?
            .to_ascii_lowercase();
        // `http::Uri` lets odd hosts through (`a[`); an origin's host is a
        // DNS name or an IP address (IPv6 in brackets), nothing else.
        let valid = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')),
        };
        if !valid {
            return Err(bad("the host is not a DNS name or an IP address"));
        }
        Ok(Origin {
            scheme,
            host,
            port: uri.port_u16().unwrap_or(default_port),
        })
    }

    /// The origin of a request URI, if it has one (none with userinfo).
    fn of(uri: &http::Uri) -> Option<Origin> {
        if uri.authority().is_some_and(|a| has_userinfo(a.as_str())) {
            return None;
        }
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        Some(Origin {
            host: uri.host()?.to_ascii_lowercase(),
            port: uri.port_u16().unwrap_or(default_port),
            scheme,
        })
    }
}

/// Whether the authority in `text` (a URI or a bare authority) carries
/// userinfo. Any `@` counts: `http` accepts one only as the userinfo
/// separator, and an origin never needs one.
fn has_userinfo(text: &str) -> bool {
    text.contains('@')
}

impl HttpGrant {
    pub fn allows(&self, uri: &http::Uri) -> bool {
        Origin::of(uri).is_some_and(|o| self.origins.contains(&o))
    }
}

/// The hooks of one instance: the grant, checked on every request.
pub(crate) struct HttpPolicy {
    pub grant: Arc<HttpGrant>,
    pub metrics: Arc<BackendMetrics>,
    pub tls: Option<Arc<TlsGrant>>,
    /// The client for `https` without a `tls` grant: `None` is the
    /// process's, trusting the public roots ([`public_https`]). A test
    /// gives one trusting its own CA ([`https_trusting`]), made the way
    /// the public one is.
    pub https_without_grant: Option<HttpsClient>,
}

type ResponseFuture = Box<dyn Future<Output = Result<Sent, HttpError>> + Send>;

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> ResponseFuture {
        _ = fut;
        if !self.grant.allows(request.uri()) {
            self.metrics.denial();
            // Rate-limited per backend, and only the origin, cut short: the
            // guest chooses the URI, and its userinfo may be a password.
            let key = ("http denied", Arc::as_ptr(&self.metrics) as usize);
            match request.uri().authority() {
                Some(a) if has_userinfo(a.as_str()) => crate::log_limit::warn(
                    key,
                    format_args!("HTTP request denied: userinfo (`user@`) in the authority"),
                ),
                _ => {
                    let origin = Origin::of(request.uri()).map_or_else(
                        || "(no origin)".to_owned(),
                        |o| crate::log_limit::bounded(o.to_string()),
                    );
                    crate::log_limit::warn(
                        key,
                        format_args!("HTTP request denied: origin not granted: {origin}"),
                    )
                }
            }
            return Box::new(std::future::ready(Err(HttpError::HttpRequestDenied)));
        }
        self.metrics.http_request();
        let request = match pool_key(request) {
            Ok(request) => request,
            Err(e) => return Box::new(std::future::ready(Err(e))),
        };
        if request.uri().scheme() == Some(&http::uri::Scheme::HTTPS) {
            let (tls, metrics) = (self.tls.clone(), self.metrics.clone());
            let without_grant = self.https_without_grant.clone();
            return Box::new(crate::io::on_shared(async move {
                let sent = match (tls, without_grant) {
                    (Some(tls), _) => send_https(request, options, tls).await,
                    (None, Some(client)) => send_pooled(&client, request, options).await,
                    (None, None) => match public_https() {
                        Ok(client) => send_pooled(client, request, options).await,
                        Err(why) => Err(HttpError::Tls(std::io::Error::other(why.clone()))),
                    },
                };
                if let Err(e) = &sent {
                    crate::log_limit::warn(
                        ("https", Arc::as_ptr(&metrics) as usize),
                        format_args!("https request failed: {e}"),
                    );
                }
                sent
            }));
        }
        // On the shared runtime whatever loop the guest runs on: the pool's
        // connections outlive the instance, and serve others.
        Box::new(crate::io::on_shared(send_http(request, options)))
    }
}

/// The request with its URI's authority spelled as its origin (lowercase
/// host, explicit port), which is what the pools key connections by: a
/// guest that wrote one origin several ways (`h`, `h:443`, `H:0443`) would
/// otherwise open a pool of idle connections for each spelling. The
/// `Host` header the guest's request carries is left as it is.
fn pool_key(mut request: http::Request<WasiBody>) -> Result<http::Request<WasiBody>, HttpError> {
    let origin = Origin::of(request.uri()).ok_or(HttpError::HttpRequestUriInvalid)?;
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = format!("{origin}{path}")
        .parse()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;
    Ok(request)
}

type PlainClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    WasiBody,
>;

/// The process's pooled client for plain-http requests, shared by every
/// instance: a connection is keyed by its origin, and only ever used for a
/// request whose origin the sending instance's grant allows (checked in
/// [`HttpPolicy::send_request`] before this is reached). Reusing keep-alive
/// connections, with `TCP_NODELAY`, instead of wasmtime-wasi-http's new
/// connection per request is what a native client (reqwest) does.
fn plain_client() -> &'static PlainClient {
    static CLIENT: std::sync::OnceLock<PlainClient> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        pooled().build(connector)
    })
}

/// A response head and its (empty) I/O future, as wasmtime-wasi-http
/// expects from the hook.
type Sent = (
    http::Response<WasiBody>,
    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
);

/// One plain-http request through [`plain_client`].
async fn send_http(
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<Sent, HttpError> {
    send_pooled(plain_client(), request, options).await
}

/// One https request through the grant's keep-alive client
/// ([`https_client`]): connections verified with `tls`'s config, reused
/// like a native client's. A name the grant does not cover fails before
/// anything is sent.
async fn send_https(
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    tls: Arc<TlsGrant>,
) -> Result<Sent, HttpError> {
    let host = request
        .uri()
        .host()
        .ok_or(HttpError::HttpRequestUriInvalid)?;
    tls.server_name(host)
        .map_err(|e| HttpError::Tls(std::io::Error::other(e)))?;
    send_pooled(https_client(&tls), request, options).await
}

/// One request through a pooled `client`. The connect and first byte
/// timeouts together bound the wait for the response head (the pool may
/// hand out a live connection, leaving no connect to time); waits between
/// body bytes are bounded by the call's deadline, which abandons the whole
/// request. A failed connect says whether TCP or TLS failed.
async fn send_pooled<C>(
    client: &hyper_util::client::legacy::Client<C, WasiBody>,
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<Sent, HttpError>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    use http_body_util::BodyExt;
    use std::error::Error as _;
    use std::time::Duration;
    let limit = |t: Option<Duration>| t.unwrap_or(Duration::from_secs(600));
    let wait = limit(options.and_then(|o| o.connect_timeout))
        .saturating_add(limit(options.and_then(|o| o.first_byte_timeout)));
    let response = tokio::time::timeout(wait, client.request(request))
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)?
        .map_err(|e| {
            let failed = e.source().and_then(|s| s.downcast_ref::<ConnectError>());
            match failed {
                Some(ConnectError::Tcp(e)) => {
                    HttpError::Connect(std::io::Error::new(e.kind(), e.to_string()))
                }
                Some(ConnectError::Tls(why)) => HttpError::Tls(std::io::Error::other(why.clone())),
                None if e.is_connect() => HttpError::Connect(std::io::Error::other(e)),
                None => {
                    // The cause (hyper's error) is what says what went wrong.
                    let cause = e.source().map_or_else(|| e.to_string(), |s| s.to_string());
                    HttpError::InternalError(Some(cause))
                }
            }
        })?;
    // The pool drives the connection in a task of its own: no I/O future.
    let io: Box<dyn Future<Output = Result<(), HttpError>> + Send> =
        Box::new(std::future::ready(Ok(())));
    Ok((
        response.map(|body| body.map_err(HttpError::Hyper).boxed_unsync()),
        io,
    ))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;

    use super::*;
    use crate::capabilities::tls::https::https_trusting;

    /// An HTTP/1.1 server on loopback answering every request `ok` on a
    /// keep-alive connection, counting the connections it accepts.
    fn counting_server() -> (u16, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepts = Arc::new(AtomicUsize::new(0));
        let counted = accepts.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut writer = stream.try_clone().unwrap();
                    let mut lines = BufReader::new(stream).lines();
                    // Requests without bodies: a head ends at an empty line.
                    while let Some(Ok(line)) = lines.next() {
                        if line.is_empty()
                            && writer
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        (port, accepts)
    }

    fn policy(origin: &str) -> HttpPolicy {
        HttpPolicy {
            grant: Arc::new(HttpGrant {
                origins: vec![Origin::parse(origin).unwrap()],
            }),
            metrics: Arc::default(),
            tls: None,
            https_without_grant: None,
        }
    }

    /// Send a GET through the hook and read the whole response body.
    async fn get(policy: &mut HttpPolicy, url: &str) -> Result<Vec<u8>, HttpError> {
        let request = http::Request::get(url)
            .body(
                http_body_util::Empty::new()
                    .map_err(|e: std::convert::Infallible| match e {})
                    .boxed_unsync(),
            )
            .unwrap();
        let sent = Box::into_pin(policy.send_request(request, None, Box::new(async { Ok(()) })));
        let (response, _io) = sent.await?;
        let body = response.into_body().collect().await?;
        Ok(body.to_bytes().to_vec())
    }

    /// Every spelling of an origin keys the pools the same way (one set of
    /// idle connections), the path and query kept, the guest's `Host`
    /// header untouched.
    #[test]
    fn the_pool_key_is_the_origin_however_it_is_spelled() {
        let key = |url: &str| {
            let request = http::Request::get(url)
                .header(http::header::HOST, "as-signed")
                .body(
                    http_body_util::Empty::new()
                        .map_err(|e: std::convert::Infallible| match e {})
                        .boxed_unsync(),
                )
                .unwrap();
            let keyed = pool_key(request).unwrap();
            assert_eq!(keyed.headers()[http::header::HOST], "as-signed");
            keyed.uri().to_string()
        };
        for url in [
            "https://S3.Example/b/k?x=1",
            "https://s3.example:443/b/k?x=1",
        ] {
            assert_eq!(key(url), "https://s3.example:443/b/k?x=1");
        }
        assert_eq!(key("https://s3.example:0443/"), "https://s3.example:443/");
        assert_eq!(key("http://[::1]/p"), "http://[::1]:80/p");
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Plain-http requests to a granted origin reuse a keep-alive
    /// connection instead of connecting for each request (the pool may
    /// not have taken a connection back yet when the next request starts:
    /// a pause between requests, long for a loaded machine, and one spare
    /// connection allowed).
    #[test]
    fn plain_http_requests_reuse_connections() {
        let (port, accepts) = counting_server();
        let origin = format!("http://127.0.0.1:{port}");
        let mut policy = policy(&origin);
        runtime().block_on(async {
            for _ in 0..6 {
                let body = get(&mut policy, &format!("{origin}/object")).await.unwrap();
                assert_eq!(body, b"ok");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        let accepted = accepts.load(Ordering::SeqCst);
        assert!(
            (1..=2).contains(&accepted),
            "{accepted} connections for 6 requests"
        );
    }

    /// A CA made now, and an https server on loopback with a certificate
    /// it signed for 127.0.0.1, answering one request per connection `ok`.
    /// Returns the port and a root store holding only that CA.
    fn https_server() -> (u16, rustls::RootCertStore) {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
        let config = Arc::new(config);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let config = config.clone();
                std::thread::spawn(move || {
                    let session = rustls::ServerConnection::new(config).unwrap();
                    let mut tls = rustls::StreamOwned::new(session, stream);
                    let mut head = Vec::new();
                    let mut byte = [0];
                    // A handshake the client refuses ends here, with an error.
                    while !head.ends_with(b"\r\n\r\n") {
                        match std::io::Read::read(&mut tls, &mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let _ = tls.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    );
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
        (port, roots)
    }

    /// An `https` origin without a `tls` grant goes over TLS, verified
    /// against the roots the client for grantless https was made with: a
    /// server whose CA is in them is reached (a test CA, in a client made
    /// by [`https_trusting`] as [`public_https`] is with the public
    /// roots), and the public roots themselves refuse that server's
    /// certificate (a certificate error, not "scheme is not http").
    #[test]
    fn https_without_a_tls_grant_is_verified_against_the_public_roots() {
        let (port, test_ca) = https_server();
        let origin = format!("https://127.0.0.1:{port}");
        let url = format!("{origin}/object");
        let mut trusting = policy(&origin);
        trusting.https_without_grant = Some(https_trusting(test_ca).unwrap());
        let mut public = policy(&origin);
        runtime().block_on(async {
            assert_eq!(get(&mut trusting, &url).await.unwrap(), b"ok");
            match get(&mut public, &url).await {
                Err(HttpError::Tls(e)) => {
                    let why = e.to_string();
                    assert!(
                        why.contains("invalid peer certificate") && why.contains("UnknownIssuer"),
                        "{why}"
                    );
                }
                other => panic!("expected a certificate error, got {other:?}"),
            }
        });
    }

    /// A request to an origin outside the grant fails before any connect,
    /// also when the pool holds a connection to a granted origin.
    #[test]
    fn a_denied_origin_is_never_connected_to() {
        let (granted, _) = counting_server();
        let (other, accepts) = counting_server();
        let mut policy = policy(&format!("http://127.0.0.1:{granted}"));
        runtime().block_on(async {
            get(&mut policy, &format!("http://127.0.0.1:{granted}/a"))
                .await
                .unwrap();
            for url in [
                format!("http://127.0.0.1:{other}/b"),
                format!("http://localhost:{granted}/b"),
                format!("https://127.0.0.1:{granted}/b"),
            ] {
                let denied = get(&mut policy, &url).await.unwrap_err();
                assert!(
                    matches!(denied, HttpError::HttpRequestDenied),
                    "{url}: {denied:?}"
                );
            }
        });
        assert_eq!(accepts.load(Ordering::SeqCst), 0);
        assert_eq!(policy.metrics.snapshot().denials, 3);
    }
}
