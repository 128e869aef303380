//! The HTTP listener: host routes, and the indexer API forwarded to its guest.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use kvwasm_host::subscriber::Request;
use serde_json::json;

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

/// Serve connections from `listener` until the task is dropped.
pub(crate) async fn serve(listener: tokio::net::TcpListener, service: Arc<Service>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let service = service.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let handler = hyper::service::service_fn(move |request| {
                let service = service.clone();
                async move { Ok::<_, Infallible>(route(&service, request).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
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
        ("/health", &Method::GET) => plain(StatusCode::OK, "", Bytes::new()),
        ("/metrics", &Method::GET) => plain(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            service.metrics_text().into(),
        ),
        ("/peers", &Method::GET) => json_response(StatusCode::OK, &json!(service.peers.list())),
        ("/register_peer", &Method::POST) => match peer_url(&body) {
            Ok(url) => {
                service.peers.add(url.clone());
                json_response(StatusCode::CREATED, &json!({ "url": url }))
            }
            Err(e) => error(StatusCode::BAD_REQUEST, &e),
        },
        ("/deregister_peer", &Method::POST) => match peer_url(&body) {
            Ok(url) if service.peers.remove(&url) => {
                json_response(StatusCode::OK, &json!({ "url": url }))
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
                .unwrap_or("application/json");
            plain(status, content_type, response.body.into())
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
