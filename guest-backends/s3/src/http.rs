//! S3 requests over `wasi:http`: signed, sent in concurrent waves, every
//! wait bounded by the deadline (a stalled service costs `timeout_ms`,
//! never a hung call).

use std::time::Duration;

use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_streams::{ReadError, WriteError};
use kvwasm_guest_support::remote::{LONG_VALUE, Value};
use kvwasm_guest_support::{
    Error, Payload, Result, Settings, read_exact_by_handle, write_all_by_handle,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use wasip2::clocks::monotonic_clock;
use wasip2::http::outgoing_handler::{self, FutureIncomingResponse};
use wasip2::http::types::{
    ErrorCode, Fields, IncomingResponse, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::poll::{Pollable, poll};
use wasip2::io::streams::{InputStream, StreamError};

use crate::sign::Signer;

/// The HTTP methods the backend uses.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Method {
    Get,
    Head,
    Put,
    Delete,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }

    fn wasi(self) -> wasip2::http::types::Method {
        use wasip2::http::types::Method as M;
        match self {
            Method::Get => M::Get,
            Method::Head => M::Head,
            Method::Put => M::Put,
            Method::Delete => M::Delete,
        }
    }
}

/// One request: `path` is already percent-encoded. The body is borrowed
/// (a staged chunk is written from where it is staged, not copied again).
pub(crate) struct Request<'a> {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) body: Body<'a>,
}

/// A request body: bytes in guest memory, or a payload the host hands to
/// the connection without copying it through linear memory.
#[derive(Clone, Copy)]
pub(crate) enum Body<'a> {
    Bytes(&'a [u8]),
    Payload(&'a Payload),
}

impl Body<'_> {
    pub(crate) const EMPTY: Body<'static> = Body::Bytes(&[]);

    fn len(self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::Payload(p) => p.len(),
        }
    }
}

impl<'a> From<&'a Value> for Body<'a> {
    fn from(value: &'a Value) -> Body<'a> {
        match value {
            Value::Bytes(b) => Body::Bytes(b),
            Value::Payload(p) => Body::Payload(p),
        }
    }
}

/// A response with its whole body: a long `200` body read by the host
/// straight into a payload, anything else in guest memory.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

/// Longest explanation quoted from a response, in characters: a service
/// (or anything answering at its address) cannot flood the host's log.
const REASON_CHARS: usize = 300;

impl Response {
    /// The service's explanation: S3's `<Code>` and `<Message>`, or the
    /// start of the body, or nothing (HEAD responses have no body), at most
    /// [`REASON_CHARS`] characters.
    pub(crate) fn reason(&self) -> String {
        let Value::Bytes(body) = &self.body else {
            return String::new();
        };
        let text = String::from_utf8_lossy(body);
        let reason = match error_fields(&text) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code,
            _ => text.trim().to_owned(),
        };
        reason.chars().take(REASON_CHARS).collect()
    }
}

/// `Code` and `Message` of an S3 error document. Their text may arrive in
/// pieces: quick-xml reports each entity or character reference (`&amp;`,
/// `&#233;`) as an event of its own, between the text around it.
fn error_fields(xml: &str) -> (Option<String>, Option<String>) {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut code, mut message) = (None, None);
    // The innermost open element and its text so far.
    let mut inside: Option<(String, String)> = None;
    loop {
        match reader.read_event() {
            Ok(Event::Start(tag)) => {
                inside = Some((tag.local_name().as_ref().to_owned(), String::new()));
            }
            Ok(Event::Text(text)) => {
                if let Some((_, value)) = &mut inside {
                    value.push_str(&text.xml10_content());
                }
            }
            Ok(Event::GeneralRef(reference)) => {
                if let Some((_, value)) = &mut inside {
                    match reference.resolve_char_ref() {
                        Ok(Some(c)) => value.push(c),
                        Ok(None) => {
                            match quick_xml::escape::resolve_predefined_entity(&reference) {
                                Some(resolved) => value.push_str(resolved),
                                None => value.push_str(&format!("&{};", &*reference)),
                            }
                        }
                        Err(_) => {}
                    }
                }
            }
            Ok(Event::End(_)) => {
                if let Some((name, value)) = inside.take() {
                    let value = Some(value.trim().to_owned());
                    match name.as_str() {
                        "Code" => code = value,
                        "Message" => message = value,
                        _ => {}
                    }
                }
            }
            Ok(Event::Eof) | Err(_) => return (code, message),
            Ok(_) => {}
        }
    }
}

/// The characters left as they are in an object key: RFC 3986
/// unreserved, plus `/` between segments.
const KEY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `key` as a URL path.
pub(crate) fn encode_key(key: &str) -> String {
    utf8_percent_encode(key, KEY).to_string()
}

/// The service's origin, the signer and the limits.
pub(crate) struct Client {
    scheme: Scheme,
    /// `host[:port]`.
    authority: String,
    /// `scheme://authority`, for signing.
    origin: String,
    signer: Signer,
    timeout: Duration,
    max_concurrency: usize,
}

impl Client {
    pub(crate) fn from_settings(settings: &Settings) -> Result<Client> {
        let endpoint = settings.required("endpoint")?.trim_end_matches('/');
        if endpoint.contains('@') {
            // Not echoed: the text before `@` may be a secret.
            return Err(Error::InvalidArgument(
                "setting `endpoint` holds credentials (`user@host`): they do not belong in \
                 settings; grant AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY with `env`"
                    .into(),
            ));
        }
        let bad =
            |why: &str| Error::InvalidArgument(format!("setting `endpoint` = {endpoint:?}: {why}"));
        let (scheme, authority) = match endpoint.split_once("://") {
            Some(("http", rest)) => (Scheme::Http, rest),
            Some(("https", rest)) => (Scheme::Https, rest),
            _ => return Err(bad("expected http://host[:port] or https://host[:port]")),
        };
        if authority.is_empty() || authority.contains('/') {
            return Err(bad(
                "expected an origin, without a path (the bucket is `bucket`)",
            ));
        }
        let max_concurrency = settings.parse_or("max_concurrency", 16usize)?.max(1);
        Ok(Client {
            scheme,
            authority: authority.to_owned(),
            origin: endpoint.to_owned(),
            signer: Signer::from_settings(settings)?,
            timeout: Duration::from_millis(settings.parse_or("timeout_ms", 5000)?),
            max_concurrency,
        })
    }

    /// Send every request, at most `max_concurrency` in flight, and return
    /// the responses in order, all within one `timeout_ms`. Fails as a
    /// whole if any request cannot be completed (refused, unreachable, too
    /// late). A sliding window: as soon as the oldest request in flight is
    /// answered the next one starts, so a slow response holds up only its
    /// own slot, not a whole wave.
    pub(crate) fn send_all(&self, requests: Vec<Request<'_>>) -> Result<Vec<Response>> {
        let mut responses = Vec::with_capacity(requests.len());
        let mut requests = requests.into_iter();
        let deadline = self.deadline();
        let mut in_flight = std::collections::VecDeque::with_capacity(self.max_concurrency);
        loop {
            while in_flight.len() < self.max_concurrency {
                let Some(request) = requests.next() else {
                    break;
                };
                let method = request.method;
                in_flight.push_back((method, self.start(request, deadline)?));
            }
            let Some((method, oldest)) = in_flight.pop_front() else {
                return Ok(responses);
            };
            responses.push(self.finish(method, oldest, deadline)?);
        }
    }

    /// The deadline of an operation starting now.
    pub(crate) fn deadline(&self) -> u64 {
        monotonic_clock::now() + nanos(self.timeout)
    }

    /// Requests one operation keeps in flight at most.
    pub(crate) fn max_concurrency(&self) -> usize {
        self.max_concurrency
    }

    /// Sign and send one request, writing its body: when this returns, the
    /// host holds every byte of it.
    pub(crate) fn start(
        &self,
        request: Request<'_>,
        deadline: u64,
    ) -> Result<FutureIncomingResponse> {
        let method = request.method.as_str();
        let path_and_query = if request.query.is_empty() {
            request.path
        } else {
            format!("{}?{}", request.path, request.query)
        };
        let length = request.body.len().to_string();
        let mut headers = vec![];
        // S3 servers want a length on every request that may carry a body.
        if matches!(request.method, Method::Put | Method::Delete) {
            headers.push(("content-length", length.as_str()));
        }
        let url = format!("{}{path_and_query}", self.origin);
        let signed = self.signer.headers(method, &url, &headers)?;
        let fields = Fields::new();
        let all = headers
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(signed.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for (name, value) in all {
            fields
                .append(name, value.as_bytes())
                .map_err(|e| Error::Other(format!("header {name}: {e:?}")))?;
        }
        let outgoing = OutgoingRequest::new(fields);
        let fail = |what: &str| Error::Other(format!("building {method} {path_and_query}: {what}"));
        outgoing
            .set_method(&request.method.wasi())
            .map_err(|()| fail("method"))?;
        outgoing
            .set_scheme(Some(&self.scheme))
            .map_err(|()| fail("scheme"))?;
        outgoing
            .set_authority(Some(&self.authority))
            .map_err(|()| fail("authority"))?;
        outgoing
            .set_path_with_query(Some(&path_and_query))
            .map_err(|()| fail("path"))?;
        let body = outgoing.body().map_err(|()| fail("body"))?;
        let options = RequestOptions::new();
        let per_wait = Some(nanos(self.timeout));
        // Unsupported options are ignored: the deadline below still holds.
        let _ = options.set_connect_timeout(per_wait);
        let _ = options.set_first_byte_timeout(per_wait);
        let _ = options.set_between_bytes_timeout(per_wait);
        let future = outgoing_handler::handle(outgoing, Some(options))
            .map_err(|e| transport_error(method, &self.origin, &e))?;
        match request.body {
            Body::Payload(payload) => self.write_payload(&body, payload, deadline)?,
            Body::Bytes(bytes) => self.write_body(&body, bytes, deadline)?,
        }
        OutgoingBody::finish(body, None).map_err(|e| transport_error(method, &self.origin, &e))?;
        Ok(future)
    }

    /// Hand a payload to the request body: the host passes it to the
    /// connection without copying it through linear memory.
    fn write_payload(&self, body: &OutgoingBody, data: &Payload, deadline: u64) -> Result<()> {
        let stream = body
            .write()
            .map_err(|()| Error::Other("request body stream".into()))?;
        let left = deadline.saturating_sub(monotonic_clock::now());
        match write_all_by_handle(stream.handle(), data, left) {
            Ok(()) => Ok(()),
            Err(WriteError::TimedOut) => Err(self.timed_out()),
            Err(WriteError::Closed) => {
                Err(self.stream_error("sending a request body", StreamError::Closed))
            }
            Err(WriteError::Failed(why)) => Err(self.unavailable("sending a request body", &why)),
        }
    }

    fn write_body(&self, body: &OutgoingBody, mut data: &[u8], deadline: u64) -> Result<()> {
        let stream = body
            .write()
            .map_err(|()| Error::Other("request body stream".into()))?;
        while !data.is_empty() {
            let permitted = match stream.check_write() {
                Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
                Err(e) => return Err(self.stream_error("sending a request body", e)),
            };
            if permitted == 0 {
                self.wait(&stream.subscribe(), deadline)?;
                continue;
            }
            let n = permitted.min(data.len());
            stream
                .write(&data[..n])
                .map_err(|e| self.stream_error("sending a request body", e))?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Wait for a response and read its whole body.
    pub(crate) fn finish(
        &self,
        method: Method,
        future: FutureIncomingResponse,
        deadline: u64,
    ) -> Result<Response> {
        self.wait(&future.subscribe(), deadline)?;
        let response: IncomingResponse = match future.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(transport_error("request", &self.origin, &code)),
            Some(Err(())) | None => {
                return Err(Error::Other("wasi:http response taken twice".into()));
            }
        };
        let status = response.status();
        let length = response.headers().get("content-length");
        let length = length.first().map(Vec::as_slice);
        let body = response
            .consume()
            .map_err(|()| Error::Other("response body taken twice".into()))?;
        let stream = body
            .stream()
            .map_err(|()| Error::Other("response body stream".into()))?;
        // (A `HEAD` response announces the length of a body it has not.)
        if let Some(len) = content_length(length)
            && matches!(method, Method::Get)
            && status == 200
            && len >= LONG_VALUE
            && let Some(payload) = self.read_payload(&stream, len, deadline)?
        {
            return Ok(Response {
                status,
                body: Value::Payload(payload),
            });
        }
        let mut bytes = Vec::with_capacity(body_capacity(method, length));
        loop {
            match stream.read(1 << 20) {
                Ok(chunk) if chunk.is_empty() => self.wait(&stream.subscribe(), deadline)?,
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(self.stream_error("reading a response body", e)),
            }
        }
        Ok(Response {
            status,
            body: Value::Bytes(bytes),
        })
    }

    /// A body of `len` bytes read by the host straight into a payload;
    /// `None` if the host declined before reading (a payload limit).
    fn read_payload(
        &self,
        stream: &InputStream,
        len: usize,
        deadline: u64,
    ) -> Result<Option<Payload>> {
        let left = deadline.saturating_sub(monotonic_clock::now());
        let payload = match read_exact_by_handle(stream.handle(), &[], len as u64, left) {
            Ok(payload) => payload,
            Err(ReadError::Limit(_)) => return Ok(None),
            Err(ReadError::TimedOut) => return Err(self.timed_out()),
            Err(ReadError::Closed) => {
                return Err(self.stream_error("reading a response body", StreamError::Closed));
            }
            Err(ReadError::Failed(why)) => {
                return Err(self.unavailable("reading a response body", &why));
            }
        };
        // `content-length` is a claim (hyper keeps the header of a chunked
        // body): the body must end here.
        self.expect_end(stream, deadline)?;
        Ok(Some(payload))
    }

    /// Fail unless `stream` has nothing more than what was read.
    fn expect_end(&self, stream: &InputStream, deadline: u64) -> Result<()> {
        loop {
            match stream.read(1) {
                Ok(more) if more.is_empty() => self.wait(&stream.subscribe(), deadline)?,
                Ok(_) => {
                    return Err(Error::Io(format!(
                        "s3 at {}: a response body longer than its content-length",
                        self.origin
                    )));
                }
                Err(StreamError::Closed) => return Ok(()),
                Err(e) => return Err(self.stream_error("reading a response body", e)),
            }
        }
    }

    /// Block until `pollable` is ready or the deadline passes.
    fn wait(&self, pollable: &Pollable, deadline: u64) -> Result<()> {
        let timer = monotonic_clock::subscribe_instant(deadline);
        let ready = poll(&[pollable, &timer]);
        if ready.contains(&0) {
            Ok(())
        } else {
            Err(self.timed_out())
        }
    }

    fn timed_out(&self) -> Error {
        Error::Unavailable(format!(
            "s3 at {}: no response within {} ms",
            self.origin,
            self.timeout.as_millis()
        ))
    }

    fn stream_error(&self, what: &str, e: StreamError) -> Error {
        let detail = match e {
            StreamError::Closed => "connection closed".to_owned(),
            StreamError::LastOperationFailed(e) => e.to_debug_string(),
        };
        self.unavailable(what, &detail)
    }

    fn unavailable(&self, what: &str, detail: &str) -> Error {
        Error::Unavailable(format!("s3 at {}: {what}: {detail}", self.origin))
    }
}

/// Bytes to reserve for a body of the announced `content-length`, so a
/// 1 MiB body is read into one allocation instead of a doubling series;
/// a claim past [`MAX_PREALLOC`] reserves that much (the body still grows
/// to what really arrives, and a hostile length costs no more). None for
/// a `HEAD`, whose `content-length` is that of a body it does not carry:
/// a flush's existence checks would otherwise hold a chunk's size each.
fn body_capacity(method: Method, content_length: Option<&[u8]>) -> usize {
    if matches!(method, Method::Head) {
        return 0;
    }
    self::content_length(content_length)
        .unwrap_or(0)
        .min(MAX_PREALLOC)
}

/// A `content-length` header's value.
fn content_length(value: Option<&[u8]>) -> Option<usize> {
    value
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
}

/// The most a response body reserves before its bytes arrive.
const MAX_PREALLOC: usize = 64 << 20;

/// A `wasi:http` transport error: refused by the host's grant, or the
/// service is unreachable.
fn transport_error(method: &str, origin: &str, code: &ErrorCode) -> Error {
    let text = format!("s3 {method} to {origin}: {code:?}");
    match code {
        ErrorCode::HttpRequestDenied => {
            Error::Denied(format!("{text} (the origin is not granted in `http`)"))
        }
        _ => Error::Unavailable(text),
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An S3 error document, as services write it.
    fn error_document(code: &str, message: &str) -> String {
        use quick_xml::escape::escape;
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code>\
             <Message>{}</Message><Key>a/b</Key><RequestId>4442587FB7D0A2F9</RequestId></Error>",
            escape(code),
            escape(message)
        )
    }

    fn response(body: impl Into<Vec<u8>>) -> Response {
        Response {
            status: 403,
            body: Value::Bytes(body.into()),
        }
    }

    #[test]
    fn bodies_reserve_their_announced_length_up_to_a_cap() {
        assert_eq!(body_capacity(Method::Get, Some(b"1048576")), 1 << 20);
        assert_eq!(
            body_capacity(Method::Get, Some(b"999999999999")),
            MAX_PREALLOC
        );
        assert_eq!(body_capacity(Method::Get, Some(b"-1")), 0);
        assert_eq!(body_capacity(Method::Get, None), 0);
        // A `HEAD` announces the length of a body it does not carry.
        assert_eq!(body_capacity(Method::Head, Some(b"1048576")), 0);
    }

    #[test]
    fn references_in_a_message_are_resolved() {
        let body =
            "<Error><Code>Bad</Code><Message>a &amp; b &lt;c&gt; &#233;&#x41;</Message></Error>";
        assert_eq!(response(body).reason(), "Bad: a & b <c> éA");
    }

    #[test]
    fn a_huge_message_is_cut_for_the_log() {
        let reason = response(error_document("SlowDown", &"x".repeat(100_000))).reason();
        assert_eq!(reason.len(), REASON_CHARS);
        assert!(reason.starts_with("SlowDown: xxx"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the service puts in `Code` and `Message` (quotes,
        /// ampersands, angle brackets, any Unicode) is read back exactly.
        #[test]
        fn error_documents_are_read_back_exactly(
            code in "[A-Za-z]{1,32}",
            message in "\\PC{0,120}",
        ) {
            let (got_code, got_message) = error_fields(&error_document(&code, &message));
            prop_assert_eq!(got_code.as_deref(), Some(code.as_str()));
            prop_assert_eq!(got_message.as_deref(), Some(message.trim()));
        }

        /// Any body (garbage, truncated or huge XML): no panic, and the
        /// reason stays short enough for a log line.
        #[test]
        fn any_body_gives_a_bounded_reason(
            body in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..4096),
                ("[A-Za-z]{1,8}", "\\PC{0,5000}", 0usize..6000).prop_map(|(code, message, cut)| {
                    let mut doc = error_document(&code, &message).into_bytes();
                    doc.truncate(cut);
                    doc
                }),
                "(<[A-Za-z/!?]{0,3}|&[a-z#0-9]{0,4};?|[^<&]{0,5}){0,400}".prop_map(String::into_bytes),
            ]
        ) {
            prop_assert!(response(body).reason().chars().count() <= REASON_CHARS);
        }
    }
}
