//! `reqwest` with SigV4 signing: the baseline of `builtin:s3`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use super::*;

/// `reqwest` with SigV4, [`S3_CONCURRENCY`] requests in flight.
pub(super) struct NativeS3 {
    http: reqwest::blocking::Client,
    endpoint: String,
    identity: aws_smithy_runtime_api::client::identity::Identity,
}

impl NativeS3 {
    pub(super) fn new(endpoint: &str) -> Result<NativeS3, String> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        let credentials = aws_credential_types::Credentials::new(
            var("AWS_ACCESS_KEY_ID")?,
            var("AWS_SECRET_ACCESS_KEY")?,
            None,
            None,
            "kvwasm-bench",
        );
        Ok(NativeS3 {
            http: reqwest::blocking::Client::builder()
                .pool_max_idle_per_host(S3_CONCURRENCY)
                .build()
                .map_err(|e| e.to_string())?,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            identity: credentials.into(),
        })
    }

    /// One signed request (unsigned payload, as the guest sends them).
    fn send(
        &self,
        method: reqwest::Method,
        key: &str,
        body: &[u8],
    ) -> Result<reqwest::blocking::Response, String> {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode, sign,
        };
        let url = format!("{}/{BUCKET}/{key}", self.endpoint);
        let length = body.len().to_string();
        let mut headers = vec![];
        if method == reqwest::Method::PUT || method == reqwest::Method::DELETE {
            headers.push(("content-length", length.as_str()));
        }
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&self.identity)
            .region("us-east-1")
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let signable = SignableRequest::new(
            method.as_str(),
            &url,
            headers.iter().copied(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| e.to_string())?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| e.to_string())?
            .into_parts();
        let mut request = self.http.request(method.clone(), &url);
        for (name, value) in headers.iter().copied().chain(instructions.headers()) {
            request = request.header(name, value);
        }
        let response = request
            .body(body.to_vec())
            .send()
            .map_err(|e| format!("s3 {method} {key}: {e}"))?;
        match response.status().as_u16() {
            200 | 204 => Ok(response),
            status => Err(format!("s3 {method} {key}: HTTP {status}")),
        }
    }

    /// `run(i)` for every `i < n`, [`S3_CONCURRENCY`] at a time.
    fn each(
        &self,
        n: usize,
        run: impl Fn(usize) -> Result<(), String> + Sync,
    ) -> Result<(), String> {
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..S3_CONCURRENCY.min(n))
                .map(|_| {
                    scope.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                return Ok(());
                            }
                            run(i)?;
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().map_err(|_| "an S3 worker panicked".to_string())?)
        })
    }

    pub(super) fn clean(&self, base: &str, load: &Load) -> Result<(), String> {
        self.each(load.hashes.len(), |i| {
            self.send(
                reqwest::Method::DELETE,
                &chunk_key(base, &load.hashes[i]),
                &[],
            )
            .map(drop)
        })?;
        self.send(reqwest::Method::DELETE, &manifest_key(base), &[])
            .map(drop)
    }
}

impl Side for NativeS3 {
    fn label(&self) -> String {
        format!("reqwest + aws-sigv4, {S3_CONCURRENCY} in flight")
    }

    fn exact_puts(&self) -> bool {
        false
    }

    fn baseline(&self) -> bool {
        true
    }

    fn save(&self, ns: &str, load: &Load, meter: Meter) -> Result<Measured, String> {
        let base = self.base(ns);
        let span = meter.start();
        self.each(load.hashes.len(), |i| {
            let key = chunk_key(&base, &load.hashes[i]);
            self.send(reqwest::Method::PUT, &key, &load.data).map(drop)
        })?;
        self.send(reqwest::Method::PUT, &manifest_key(&base), &load.manifest)?;
        Ok(span.stop())
    }

    fn restore(
        &self,
        ns: &str,
        load: &Load,
        meter: Meter,
        verify: bool,
    ) -> Result<Measured, String> {
        let base = self.base(ns);
        let span = meter.start();
        let body = |r: reqwest::blocking::Response| r.bytes().map_err(|e| e.to_string());
        let manifest = body(self.send(reqwest::Method::GET, &manifest_key(&base), &[])?)?;
        check_manifest(&manifest, load)?;
        let hashes = manifest_hashes(&manifest);
        self.each(hashes.len(), |i| {
            let key = chunk_key(&base, &hashes[i]);
            deliver(
                &body(self.send(reqwest::Method::GET, &key, &[])?)?,
                load,
                verify,
            )
        })?;
        Ok(span.stop())
    }

    fn base(&self, ns: &str) -> String {
        format!("native/{ns}")
    }
}
