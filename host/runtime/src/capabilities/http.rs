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
//! see [`super::tls`]); without one, wasmtime-wasi-http's default (the
//! public roots).

use std::sync::Arc;

use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::TlsGrant;
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
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

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
        if let Some(tls) = &self.tls
            && request.uri().scheme() == Some(&http::uri::Scheme::HTTPS)
        {
            let (tls, metrics) = (tls.clone(), self.metrics.clone());
            return Box::new(async move {
                let sent = send_https(request, options, &tls).await;
                if let Err(e) = &sent {
                    crate::log_limit::warn(
                        ("https", Arc::as_ptr(&metrics) as usize),
                        format_args!("https request failed: {e}"),
                    );
                }
                sent
            });
        }
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

/// One https request over a new connection, verified with `tls`'s config:
/// what `default_send_request` does for https, with the operator's roots.
/// The connect timeout bounds the TCP connect and the handshake; the first
/// byte timeout the response head. Waits between body bytes are bounded by
/// the call's deadline, which abandons the whole request.
async fn send_https(
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    tls: &TlsGrant,
) -> Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ),
    HttpError,
> {
    use http_body_util::BodyExt;
    use std::time::Duration;
    use tokio::time::timeout;
    let uri = request.uri();
    let host = uri.host().ok_or(HttpError::HttpRequestUriInvalid)?;
    let host = host.trim_matches(['[', ']']).to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let limit = |t: Option<Duration>| t.unwrap_or(Duration::from_secs(600));
    let connect_timeout = limit(options.and_then(|o| o.connect_timeout));
    let first_byte_timeout = limit(options.and_then(|o| o.first_byte_timeout));
    let name = tls
        .server_name(&host)
        .map_err(|e| HttpError::Tls(std::io::Error::other(e)))?;
    let shown = name.to_str().into_owned();
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(HttpError::Connect)?;
        tokio_rustls::TlsConnector::from(tls.config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| {
                HttpError::Tls(std::io::Error::other(format!(
                    "TLS handshake with {shown} failed: {e}"
                )))
            })
    };
    let stream = timeout(connect_timeout, handshake)
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(HttpError::Hyper)?;
    // The request line carries the path alone (no proxy in between).
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;
    // The connection must be driven while the response head is awaited,
    // then for the body: it is the request's I/O future.
    let mut conn = Box::pin(conn);
    let mut send = Box::pin(timeout(first_byte_timeout, sender.send_request(request)));
    let mut conn_done = None;
    let response = std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(r) = send.as_mut().poll(cx) {
            return std::task::Poll::Ready(r);
        }
        if conn_done.is_none()
            && let std::task::Poll::Ready(r) = conn.as_mut().poll(cx)
        {
            conn_done = Some(r);
        }
        std::task::Poll::Pending
    })
    .await
    .map_err(|_| HttpError::ConnectionReadTimeout)?
    .map_err(HttpError::Hyper)?;
    let io: Box<dyn Future<Output = Result<(), HttpError>> + Send> = match conn_done {
        Some(done) => Box::new(std::future::ready(done.map_err(HttpError::Hyper))),
        None => Box::new(async move { conn.await.map_err(HttpError::Hyper) }),
    };
    Ok((
        response.map(|body| body.map_err(HttpError::Hyper).boxed_unsync()),
        io,
    ))
}

/// `wasi:http/outgoing-handler.handle` as wasmtime-wasi-http implements it,
/// but releasing the `request-options` resource the guest hands over: the
/// stock function only reads it, so every request with options would keep
/// one table entry until the instance reaches `max_resources`.
pub(crate) fn add_guards_to_linker(
    linker: &mut wasmtime::component::Linker<crate::state::HostState>,
) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi_http::WasiHttpView;
    use wasmtime_wasi_http::p2::bindings::http::outgoing_handler::Host;
    use wasmtime_wasi_http::p2::types::{HostFutureIncomingResponse, HostOutgoingRequest};
    type Params = (
        Resource<HostOutgoingRequest>,
        Option<Resource<RequestOptions>>,
    );
    linker.allow_shadowing(true);
    linker.instance(OUTGOING_HANDLER)?.func_wrap(
        "handle",
        |mut store: wasmtime::StoreContextMut<'_, crate::state::HostState>,
         (request, options): Params| {
            let state = store.data_mut();
            let handed_over = options
                .as_ref()
                .map(|o| Resource::<RequestOptions>::new_own(o.rep()));
            let sent: Result<Resource<HostFutureIncomingResponse>, _> =
                state.http().handle(request, options);
            if let Some(options) = handed_over {
                let _ = state.table.delete(options);
            }
            match sent {
                Ok(future) => Ok((Ok(future),)),
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interface [`add_guards_to_linker`] replaces a function of, as
/// wasmtime-wasi-http 48 names it.
const OUTGOING_HANDLER: &str = "wasi:http/outgoing-handler@0.2.12";
