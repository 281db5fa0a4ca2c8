//! The webhook HTTP client of a build without the `https-webhooks`
//! feature: HTTP/1.1 over plain TCP only, for the `http://` hooks the hook
//! rules allow (loopback, or `insecure-http=true`). An `https://` hook is
//! refused when `--webhook` is parsed ([`NO_HTTPS`]), so no TLS crate
//! (rustls, hyper-rustls, webpki-roots) is built. The full client is in
//! `tls.rs`.

use std::error::Error as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

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

/// How long a TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The client for a hook: HTTP/1.1, no redirects followed, connections
/// kept for reuse a little while (as `tls.rs`, without TLS).
pub(crate) fn client(_hook: &WebhookSpec) -> HookClient {
    let mut tcp = HttpConnector::new();
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(tcp)
}

/// An error and its causes on one line (see `tls.rs`).
pub(crate) fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Never called: a `ca=` needs an `https://` url, refused first.
pub(crate) fn read_ca(_path: &std::path::Path) -> Result<Vec<Certificate>, String> {
    Err(NO_HTTPS.into())
}
