//! `https://` origins in a build without the `https-webhooks` cargo
//! feature: none. The configuration refuses an `https://` origin or
//! `--origin-ca` at start, naming the feature (`config::features`), so
//! nothing here is reached; it keeps the shape of `tls.rs` so the proxy
//! builds the same either way, and no TLS crate is built.

use std::path::Path;

use axum::body::Body;
use axum::extract::Request;
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client as HyperClient, ResponseFuture};
use hyper_util::rt::TokioExecutor;

use super::forward::{Timeouts, origin_unreachable};
use super::rooms::RoomSpec;
use crate::error::ApiError;

/// Why an `https://` origin cannot be reached in this build.
const NO_TLS: &str =
    "this build of waitroom has no TLS for origins (the `https-webhooks` cargo feature)";

/// A certificate `--origin-ca` would trust (never read in this build).
pub type Certificate = Vec<u8>;

/// Stands in for the `https://` origins' client: a plain client, which
/// refuses an `https://` URI.
#[derive(Clone)]
pub struct OriginTls {
    client: HyperClient<HttpConnector, Body>,
}

/// Never reads: `--origin-ca` needs the feature.
pub fn read_origin_ca(_path: &Path) -> Result<Vec<Certificate>, String> {
    Err(NO_TLS.into())
}

impl OriginTls {
    pub fn new(_timeouts: Timeouts, _ca: Vec<Certificate>) -> Self {
        Self {
            client: HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
        }
    }

    /// Answers an error (the plain connector takes no `https://` URI).
    pub fn request(&self, request: Request) -> ResponseFuture {
        self.client.request(request)
    }

    pub async fn connect(&self, room: &RoomSpec) -> Result<SendRequest<Body>, ApiError> {
        Err(origin_unreachable(room, &NO_TLS))
    }
}
