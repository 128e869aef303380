//! The HTTP listener: host routes, and the indexer API forwarded to its guest.
//!
//! What clients can make the server hold is bounded: connections
//! (`max_connections`; more wait in the kernel's backlog), each guest
//! answer (`max_response_mib`) and the guest answers not yet written out,
//! in all (`held_response_mib`); a client that stops reading, or sends no
//! request head, is dropped after `client_timeout_ms`, and what it held
//! with it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use kvwasm_host::subscriber::Request;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::Service;

pub(crate) type Response = hyper::Response<Full<Bytes>>;

/// Paths named in `/metrics`; anything else counts as `other`.
const ENDPOINTS: &[&str] = &[
    "/health",
    "/metrics",
    "/register_peer",
    "/deregister_peer",
    "/peers",
    "/register",
    "/unregister",
    "/workers",
    "/query",
    "/query_by_hash",
    "/dump",
    "/restore",
];

/// Requests answered, by (endpoint, status class).
#[derive(Default)]
pub(crate) struct HttpStats(Mutex<BTreeMap<(&'static str, &'static str), u64>>);

impl HttpStats {
    fn count(&self, path: &str, status: StatusCode) {
        let endpoint = ENDPOINTS.iter().find(|e| **e == path).unwrap_or(&"other");
        let class = match status.as_u16() {
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        *self.lock().entry((endpoint, class)).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(&'static str, &'static str), u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The caps on what clients make the server hold.
pub(crate) struct Caps {
    connections: Arc<Semaphore>,
    /// KiB of guest answers held for clients.
    held: Arc<Semaphore>,
    held_kib: usize,
    max_response: usize,
    client_timeout: Duration,
}

impl Caps {
    pub fn new(settings: &crate::ServeConfig) -> Caps {
        let held_kib = settings.held_response_bytes() / 1024;
        Caps {
            connections: Arc::new(Semaphore::new(settings.max_connections)),
            held: Arc::new(Semaphore::new(held_kib)),
            held_kib,
            max_response: settings.max_response_bytes(),
            client_timeout: Duration::from_millis(settings.client_timeout_ms),
        }
    }

    /// Bytes of guest answers held now (KiB granularity).
    pub fn held_bytes(&self) -> u64 {
        (self.held_kib - self.held.available_permits()) as u64 * 1024
    }

    /// `body` as a response body charged to the held budget until the
    /// last of it is written out or the connection is dropped; `Err` with
    /// the reason for a 503 when it is too large or the budget is spent.
    fn hold(&self, body: Vec<u8>) -> Result<Bytes, String> {
        if body.len() > self.max_response {
            return Err(format!(
                "the guest's answer ({} bytes) exceeds [serve].max_response_mib",
                body.len()
            ));
        }
        let kib = u32::try_from(body.len().div_ceil(1024)).unwrap_or(u32::MAX);
        match self.held.clone().try_acquire_many_owned(kib) {
            Ok(permit) => Ok(Bytes::from_owner(HeldAnswer {
                body,
                _permit: permit,
            })),
            Err(_) => Err("answers not yet read by their clients fill \
                 [serve].held_response_mib; try again"
                .into()),
        }
    }
}

/// A guest answer and its share of the held budget, released together.
struct HeldAnswer {
    body: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for HeldAnswer {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

/// A connection whose writes fail once one has made no progress for
/// `timeout`: a client that stops reading cannot keep what it was sent.
struct WriteTimeout<T> {
    io: T,
    timeout: Duration,
    /// Running while a write (or flush) is pending.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteTimeout<T> {
    fn new(io: T, timeout: Duration) -> Self {
        WriteTimeout {
            io,
            timeout,
            stalled: None,
        }
    }

    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading ([serve].client_timeout_ms)",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    /// Forwarded so hyper queues large bodies instead of copying them.
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}

/// Serve connections from `listener` until the task is dropped, at most
/// `max_connections` at once.
pub(crate) async fn serve(listener: tokio::net::TcpListener, service: Arc<Service>) {
    loop {
        let Ok(slot) = service.caps.connections.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                kvwasm_host::log_limit::warn(
                    ("accept failed", ""),
                    format_args!("accept failed: {e}"),
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let client_timeout = service.caps.client_timeout;
            let stream = WriteTimeout::new(stream, client_timeout);
            let io = hyper_util::rt::TokioIo::new(stream);
            let handler = hyper::service::service_fn(move |request| {
                let service = service.clone();
                async move { Ok::<_, Infallible>(route(&service, request).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(client_timeout)
                // Bodies are queued, not copied into the write buffer.
                .writev(true)
                .serve_connection(io, handler)
                .await
            {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}

async fn route(service: &Arc<Service>, request: hyper::Request<Incoming>) -> Response {
    let path = request.uri().path().to_owned();
    let response = answer(service, request).await;
    service.http_stats.count(&path, response.status());
    response
}

async fn answer(service: &Arc<Service>, request: hyper::Request<Incoming>) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let body = match read_body(request, service.settings.max_body_bytes()).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    match (path.as_str(), &method) {
        ("/health", &Method::GET) => match service.diverged().as_slice() {
            [] => plain(StatusCode::OK, "", Bytes::new()),
            diverged => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({
                    "error": "events were lost to these guests: their state diverged from the \
                              sources until a peer's /dump (or a POST /restore) replaces it",
                    "diverged": diverged,
                    "rebuild": service.rebuild_status(),
                }),
            ),
        },
        ("/metrics", &Method::GET) => plain(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            service.metrics_text().into(),
        ),
        ("/peers", &Method::GET) => json_response(StatusCode::OK, &json!(service.peers.list())),
        ("/register_peer", &Method::POST) => match peer_url(&body) {
            Ok(url) => {
                service.peers.add(url.clone());
                if let Some(indexer) = service.indexer() {
                    indexer.want_rebuild();
                }
                json_response(StatusCode::CREATED, &json!({ "status": "ok", "url": url }))
            }
            Err(e) => error(StatusCode::BAD_REQUEST, &e),
        },
        ("/deregister_peer", &Method::POST) => match peer_url(&body) {
            Ok(url) if service.peers.remove(&url) => {
                json_response(StatusCode::OK, &json!({ "status": "ok", "url": url }))
            }
            Ok(_) => error(StatusCode::NOT_FOUND, "peer not found"),
            Err(e) => error(StatusCode::BAD_REQUEST, &e),
        },
        ("/health" | "/metrics" | "/peers" | "/register_peer" | "/deregister_peer", _) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} is not allowed on {path}"),
        ),
        _ => {
            let request = Request {
                method: method.to_string(),
                path,
                query,
                body: body.to_vec(),
            };
            forward(service, request).await
        }
    }
}

/// Hand `request` to the indexer guest on a blocking thread, then apply the
/// host's side effects of an accepted `/register` or `/unregister`.
async fn forward(service: &Arc<Service>, request: Request) -> Response {
    let Some(indexer) = service.indexer() else {
        return error(
            StatusCode::NOT_FOUND,
            "no such endpoint (no indexer is configured)",
        );
    };
    let call = {
        let service = service.clone();
        tokio::task::spawn_blocking(move || {
            let effect = crate::Effect::of(&request);
            let result = indexer.handle(request);
            if let (Ok(response), Some(effect)) = (&result, effect) {
                service.apply(effect, response.status);
            }
            result
        })
    };
    match call.await {
        Ok(Ok(response)) => {
            let status =
                StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let content_type = response
                .content_type
                .as_deref()
                .unwrap_or("application/json")
                .to_owned();
            match service.caps.hold(response.body) {
                Ok(body) => plain(status, &content_type, body),
                Err(reason) => error(StatusCode::SERVICE_UNAVAILABLE, &reason),
            }
        }
        Ok(Err(e)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the indexer guest failed: {e}"),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}")),
    }
}

/// The whole body, refused (413) past `max` without reading further.
async fn read_body(request: hyper::Request<Incoming>, max: usize) -> Result<Bytes, Response> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the request body exceeds {max} bytes ([serve].max_body_mib)"),
        )
    };
    let declared = request
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max as u64) {
        return Err(too_large());
    }
    match Limited::new(request.into_body(), max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read the body: {e}"),
        )),
    }
}

fn peer_url(body: &[u8]) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct Peer {
        url: String,
    }
    serde_json::from_slice::<Peer>(body)
        .map(|p| p.url)
        .map_err(|e| format!("invalid request: {e}"))
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({ "error": message }))
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    plain(status, "application/json", value.to_string().into())
}

fn plain(status: StatusCode, content_type: &str, body: Bytes) -> Response {
    let mut response = hyper::Response::new(Full::new(body));
    *response.status_mut() = status;
    if !content_type.is_empty()
        && let Ok(value) = hyper::header::HeaderValue::from_str(content_type)
    {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
