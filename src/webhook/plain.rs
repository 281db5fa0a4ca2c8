//! The webhook HTTP client of a build without the `https-webhooks`
//! feature: HTTP/1.1 over plain TCP only, for the `http://` hooks the hook
//! rules allow (loopback, or `insecure_http = true`). An `https://` hook is
//! refused when its `[[webhooks]]` table is read ([`NO_HTTPS`]), so no TLS crate
//! (rustls, hyper-rustls, webpki-roots) is built. The full client is in
//! `tls.rs`.

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::WebhookSpec;

/// Whether this build speaks TLS to hooks (the `https-webhooks` feature).
pub(crate) const HTTPS: bool = false;

/// Why an `https://` hook (or a `ca=` file) cannot run in this build.
pub(crate) const NO_HTTPS: &str = "url is https://, and this build of waitroom has no TLS for \
     webhooks: rebuild with the `https-webhooks` cargo feature (on by default)";

/// A trusted certificate of a hook's `ca=` file (never read in this build).
pub type Certificate = Vec<u8>;

/// One hook's client.
pub(crate) type HookClient = Client<HttpConnector, Full<Bytes>>;

/// The client for a hook: plain TCP, pooled as `tls.rs`'s.
pub(crate) fn client(_hook: &WebhookSpec) -> HookClient {
    super::connect::pooled(super::connect::tcp())
}

/// Never called: a `ca=` needs an `https://` url, refused first.
pub(crate) fn read_ca(_path: &std::path::Path) -> Result<Vec<Certificate>, String> {
    Err(NO_HTTPS.into())
}
