//! S3 backend: chunks and manifests as objects in one bucket of any
//! S3-compatible service (AWS, MinIO, Ceph, s3s), reached over `wasi:http`
//! at the one origin the operator granted, path-style, SigV4-signed.
//!
//! The store logic (staging, batched flush, prefetch cache) is the shared
//! [`RemoteStore`]; this crate supplies [`Remote`] as waves of concurrent
//! requests: `HEAD` for existence, `PUT`, `GET`, `DELETE`; and writes
//! behind: a new chunk's `PUT` starts during `put-chunk`, at most
//! `max_concurrency` in flight between calls, its bytes kept (a host copy
//! for long ones, sent by `payload-streams.write-all`) until the service
//! answered.
//!
//! Settings (`[backends.<name>.settings]`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `endpoint` | required | `http(s)://host[:port]` of the service (grant the same in `http`) |
//! | `bucket` | required | bucket name (it must exist) |
//! | `region` | `us-east-1` | signing region |
//! | `timeout_ms` | `5000` | deadline of one operation (all its requests); keep it under the host's `call_timeout_ms` |
//! | `max_concurrency` | `16` | requests in flight at once |
//! | `access_key_id_env`, `secret_access_key_env`, `session_token_env` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` | environment variables holding the credentials (grant them in `env`) |
//! | `prefix`, `dedup_check`, `max_pending_mib`, `prefetch_cache_mib`, `prefetch_wave` | | see `kvwasm_guest_support::remote` |

mod http;
mod sign;

use kvwasm_guest_support::remote::{Remote, RemoteStore, Value};
use kvwasm_guest_support::{BackendInfo, Error, Guest, Result, Settings, export_backend};

use std::collections::VecDeque;

use wasip2::http::outgoing_handler::FutureIncomingResponse;

use http::{Body, Client, Method, Request, Response};

struct S3Backend;

impl Guest for S3Backend {
    type Store = RemoteStore<S3>;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "s3".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // The data lives in the bucket: any instance sees it.
            shared_state: true,
        }
    }
}

/// One bucket of an S3-compatible service.
struct S3 {
    client: Client,
    bucket: String,
    /// `PUT`s written behind, oldest first, with their keys and values
    /// (kept until the service has them).
    behind: VecDeque<(String, FutureIncomingResponse, Value)>,
    /// Writes behind that failed, not yet given back by `settle`.
    failed: Vec<(String, Value, Error)>,
}

impl S3 {
    fn request<'a>(&self, method: Method, key: &str, body: Body<'a>) -> Request<'a> {
        Request {
            method,
            path: format!("/{}/{}", self.bucket, http::encode_key(key)),
            query: String::new(),
            body,
        }
    }

    /// One request per key, all in flight together.
    fn per_key(&self, method: Method, keys: &[String]) -> Result<Vec<Response>> {
        let requests = keys
            .iter()
            .map(|k| self.request(method, k, Body::EMPTY))
            .collect();
        self.client.send_all(requests)
    }
    /// Wait for the oldest write behind until `deadline`; keep its failure
    /// for `settle`.
    fn land_oldest(&mut self, deadline: u64) {
        let Some((key, response, value)) = self.behind.pop_front() else {
            return;
        };
        match self.client.finish(Method::Put, response, deadline) {
            Ok(r) if r.status == 200 => {}
            Ok(r) => self.failed.push((key, value, r.error("PUT"))),
            Err(e) => self.failed.push((key, value, e)),
        }
    }
}

impl Remote for S3 {
    fn connect(settings: &Settings) -> Result<Self> {
        let client = Client::from_settings(settings)?;
        let bucket = settings.required("bucket")?.to_owned();
        let s3 = S3 {
            client,
            bucket,
            behind: VecDeque::new(),
            failed: Vec::new(),
        };
        // One signed request now, so a wrong key, secret or bucket fails
        // the open instead of the first save: `HEAD` of the bucket, cheap on
        // every service (a listing, even of one key, walks the bucket on
        // some). Its answer has no body, so a refusal is asked again as a
        // listing, whose error document carries the service's reason. Both
        // within one `timeout_ms`.
        let deadline = s3.client.deadline();
        let ask = |method, query: &str| {
            let request = Request {
                method,
                path: format!("/{}", s3.bucket),
                query: query.into(),
                body: Body::EMPTY,
            };
            let response = s3.client.start(request, deadline)?;
            s3.client.finish(method, response, deadline)
        };
        if ask(Method::Head, "")?.status == 200 {
            return Ok(s3);
        }
        let response = ask(Method::Get, "list-type=2&max-keys=1")?;
        match response.status {
            200 => Ok(s3),
            _ => Err(response.error(&format!("checking bucket {:?}", s3.bucket))),
        }
    }

    fn exists(&mut self, keys: &[String]) -> Result<Vec<bool>> {
        self.per_key(Method::Head, keys)?
            .into_iter()
            .map(|r| match r.status {
                200 => Ok(true),
                404 => Ok(false),
                _ => Err(r.error("HEAD")),
            })
            .collect()
    }

    /// Request bodies go from host payloads to the connection.
    const SENDS_PAYLOADS: bool = true;

    fn put(&mut self, items: &[(String, &Value)]) -> Result<()> {
        let requests = items
            .iter()
            .map(|(key, value)| self.request(Method::Put, key, (*value).into()))
            .collect();
        for r in self.client.send_all(requests)? {
            if r.status != 200 {
                return Err(r.error("PUT"));
            }
        }
        Ok(())
    }

    /// `PUT`s in flight between calls, as many as `max_concurrency`: the
    /// oldest is answered before another starts. Every wait of one call is
    /// bounded by one `timeout_ms`, however long the writes have been in
    /// flight.
    fn put_behind(&mut self, key: String, value: Value) -> Result<(), (String, Value)> {
        let deadline = self.client.deadline();
        while self.behind.len() >= self.client.max_concurrency() {
            self.land_oldest(deadline);
        }
        let started = self
            .client
            .start(self.request(Method::Put, &key, (&value).into()), deadline);
        match started {
            Ok(response) => self.behind.push_back((key, response, value)),
            Err(e) => self.failed.push((key, value, e)),
        }
        Ok(())
    }

    fn settle(&mut self) -> Vec<(String, Value, Error)> {
        let deadline = self.client.deadline();
        while !self.behind.is_empty() {
            self.land_oldest(deadline);
        }
        std::mem::take(&mut self.failed)
    }

    fn get(&mut self, keys: &[String]) -> Result<Vec<Option<Value>>> {
        self.per_key(Method::Get, keys)?
            .into_iter()
            .map(Response::value)
            .collect()
    }

    fn delete(&mut self, key: &str) -> Result<()> {
        let r = self.per_key(Method::Delete, &[key.to_owned()])?.remove(0);
        match r.status {
            200 | 204 | 404 => Ok(()),
            _ => Err(r.error("DELETE")),
        }
    }
}

/// Errors for a refused or failed request: the service's own words.
impl Response {
    /// A `GET`'s value: the body, `None` if missing.
    fn value(self) -> Result<Option<Value>> {
        match self.status {
            200 => Ok(Some(self.body)),
            404 => Ok(None),
            _ => Err(self.error("GET")),
        }
    }

    fn error(&self, what: &str) -> Error {
        let reason = self.reason();
        let text = format!("s3 {what}: HTTP {} {reason}", self.status);
        match self.status {
            401 | 403 => Error::Denied(text),
            404 => Error::InvalidArgument(text),
            500.. => Error::Unavailable(text),
            _ => Error::Io(text),
        }
    }
}

export_backend!(S3Backend);
