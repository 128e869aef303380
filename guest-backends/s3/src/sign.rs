//! SigV4 signing with `aws-sigv4`, the signer the AWS SDK uses, set up the
//! way S3 expects (`x-amz-content-sha256`, no path normalisation, the
//! already-encoded path taken as is).

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use kvwasm_guest_support::{Error, Result, Settings};

/// Credentials and region; signs one request at a time.
pub(crate) struct Signer {
    identity: Identity,
    region: String,
}

impl Signer {
    /// Credentials from the granted environment variables.
    pub(crate) fn from_settings(settings: &Settings) -> Result<Signer> {
        let missing = |var: &str| {
            Error::Denied(format!(
                "no S3 credentials: set {var} in the engine's environment and grant it with \
                 `env = [\"{var}\"]`"
            ))
        };
        let var = |key: &str, default: &'static str| -> String {
            settings
                .get(&format!("{key}_env"))
                .unwrap_or(default)
                .to_owned()
        };
        let key_var = var("access_key_id", "AWS_ACCESS_KEY_ID");
        let secret_var = var("secret_access_key", "AWS_SECRET_ACCESS_KEY");
        let key = settings
            .secret("access_key_id", "AWS_ACCESS_KEY_ID")
            .ok_or_else(|| missing(&key_var))?;
        let secret = settings
            .secret("secret_access_key", "AWS_SECRET_ACCESS_KEY")
            .ok_or_else(|| missing(&secret_var))?;
        let token = settings.secret("session_token", "AWS_SESSION_TOKEN");
        let credentials = Credentials::new(key, secret, token, None, "kvwasm-env");
        Ok(Signer {
            identity: credentials.into(),
            region: settings.get("region").unwrap_or("us-east-1").to_owned(),
        })
    }

    /// The headers that sign `method url` with `headers` and an unsigned
    /// payload (the payload is not hashed: at 1 MiB per chunk that would
    /// cost more than the request).
    pub(crate) fn headers(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>> {
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| Error::Other(format!("SigV4 parameters: {e}")))?
            .into();
        let signable = SignableRequest::new(
            method,
            url,
            headers.iter().copied(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| Error::InvalidArgument(format!("cannot sign {method} {url}: {e}")))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| Error::Other(format!("SigV4 signing failed: {e}")))?
            .into_parts();
        Ok(instructions
            .headers()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect())
    }
}
