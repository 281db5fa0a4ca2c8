//! What every webhook client shares, with or without TLS: the TCP
//! connector's settings, the connection pool, and how a failed request is
//! told in one line. `tls.rs` wraps the connector in TLS; `plain.rs` (a
//! build without the `https-webhooks` feature) uses it as it is.

use std::error::Error as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// How long a TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The TCP connector under every hook's client.
pub(crate) fn tcp() -> HttpConnector {
    let mut tcp = HttpConnector::new();
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_nodelay(true);
    tcp
}

/// A client over `connector`: HTTP/1.1, no redirects followed,
/// connections kept for reuse a little while.
pub(crate) fn pooled<C>(connector: C) -> Client<C, Full<Bytes>>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// An error and its causes on one line: hyper's own message ("client
/// error (Connect)") hides the useful part ("invalid peer certificate:
/// UnknownIssuer") in its sources.
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
