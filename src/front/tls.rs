//! `https://` origins: TLS from the proxy to a room's origin (the
//! `https-webhooks` cargo feature, which builds rustls with `ring`,
//! hyper-rustls and the webpki root list).
//!
//! Trust is the Mozilla root list compiled in (`webpki-roots`), so every
//! instance trusts the same roots whatever its host, plus the certificates
//! of `--origin-ca` for an origin behind a private CA. The certificate
//! must name the origin's host as written in the room (SNI and the check
//! use it). Plain `http://` origins never come here: their pooled client
//! and its path are unchanged (`forward.rs`).

use std::path::Path;

use axum::body::Body;
use axum::extract::Request;
use axum::http::Uri;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client as HyperClient, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use tower::Service;

use super::forward::{Timeouts, origin_unreachable};
use super::rooms::RoomSpec;
use crate::error::ApiError;

/// A certificate `--origin-ca` trusts, DER.
pub type Certificate = crate::tls::Certificate;

/// The client of the `https://` origins: pooled like the plain one, and
/// its connector for the upgrades' connections of their own.
#[derive(Clone)]
pub struct OriginTls {
    client: HyperClient<HttpsConnector<HttpConnector>, Body>,
    connector: HttpsConnector<HttpConnector>,
    timeouts: Timeouts,
}

/// Reads `--origin-ca` (see [`crate::tls::read_ca`]).
pub fn read_origin_ca(path: &Path) -> Result<Vec<Certificate>, String> {
    crate::tls::read_ca(path)
}

impl OriginTls {
    /// The built-in roots plus `ca`; connects within `timeouts.connect`.
    pub fn new(timeouts: Timeouts, ca: Vec<Certificate>) -> Self {
        let config = crate::tls::client_config(ca);
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(timeouts.connect));
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(tcp);
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .pool_max_idle_per_host(super::forward::IDLE_PER_ORIGIN)
            .build(connector.clone());
        Self {
            client,
            connector,
            timeouts,
        }
    }

    /// Sends `request` (its URI `https://…`) on a pooled connection.
    pub fn request(&self, request: Request) -> ResponseFuture {
        self.client.request(request)
    }

    /// A TLS connection of its own to `room`'s origin, HTTP/1 handshake
    /// done (for an upgrade).
    pub async fn connect(&self, room: &RoomSpec) -> Result<SendRequest<Body>, ApiError> {
        let uri: Uri = format!("https://{}/", room.origin.authority)
            .parse()
            .map_err(|e| ApiError::Internal(format!("origin URI: {e}")))?;
        let connecting = self.connector.clone().call(uri);
        let stream = match tokio::time::timeout(self.timeouts.connect, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(origin_unreachable(room, &e)),
            Err(_) => return Err(origin_unreachable(room, &"TLS connect timed out")),
        };
        super::upgrade::handshake(stream, room).await
    }
}
