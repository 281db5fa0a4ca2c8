//! Forwarding an admitted request to its room's origin.
//!
//! hyper's pooled client carries the request: both bodies stream (the
//! request's frames go up as they arrive, the origin's come down as they
//! arrive; nothing is buffered whole), connections are kept and reused
//! per origin. The request is rewritten the way a proxy must: hop-by-hop
//! headers (RFC 9110 §7.6.1: `Connection` and every header it names,
//! `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//! `Proxy-*`) are dropped both ways; `Host` becomes the origin's unless the
//! room keeps it; `X-Forwarded-For`/`-Proto`/`-Host` (or RFC 7239
//! `Forwarded`, per `--client-address-header`) say who asked, replacing
//! what the client sent unless the client is a trusted proxy, whose chain
//! is extended. A WebSocket upgrade goes over a connection of its own
//! (`upgrade.rs`).
//!
//! An `https://` origin's requests go through the same steps on the TLS
//! client of `tls.rs`.
//!
//! Failures are the gateway's: the origin unreachable or breaking off is
//! `502 origin_unreachable`, no response head within the room's timeout is
//! `504 origin_timeout`; a browser gets them as a short page.

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Uri, uri::PathAndQuery};
use axum::response::Response;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::rooms::RoomSpec;
use super::tls::OriginTls;
use crate::error::ApiError;
use crate::http::client::{ClientInfo, ForwardedHeader};

/// How long to wait for the origin.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A TCP connection to the origin.
    pub connect: Duration,
    /// The origin's response head, from the request sent (its body then
    /// streams as long as it takes).
    pub response: Duration,
}

/// The pooled client every room's requests share.
#[derive(Clone)]
pub struct Upstream {
    client: HyperClient<HttpConnector, Body>,
    /// The `https://` origins' client (`tls.rs`), when a room has one.
    tls: Option<OriginTls>,
    timeouts: Timeouts,
    forwarded: ForwardedHeader,
}

/// How many idle connections are kept per origin: enough for a busy
/// origin's steady load without a connect per request.
pub(super) const IDLE_PER_ORIGIN: usize = 256;

impl Upstream {
    pub fn new(timeouts: Timeouts, forwarded: ForwardedHeader) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeouts.connect));
        connector.set_nodelay(true);
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(IDLE_PER_ORIGIN)
            .build(connector);
        Self {
            client,
            tls: None,
            timeouts,
            forwarded,
        }
    }

    /// With `tls` for the `https://` origins.
    pub fn with_tls(mut self, tls: OriginTls) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The `https://` origins' client, if any room has one.
    pub fn tls(&self) -> Option<&OriginTls> {
        self.tls.as_ref()
    }

    /// Sends `request` (its path already normalized into `path_and_query`)
    /// to `room`'s origin and returns the origin's answer, streaming.
    pub async fn forward(
        &self,
        room: &RoomSpec,
        mut request: Request,
        path_and_query: PathAndQuery,
        who: &Asker,
    ) -> Result<Response, ApiError> {
        let uri = Uri::builder()
            .scheme(room.origin.scheme())
            .authority(room.origin.authority.as_str())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| ApiError::Internal(format!("origin URI: {e}")))?;
        *request.uri_mut() = uri;
        *request.version_mut() = axum::http::Version::HTTP_11;
        strip_hop_by_hop(request.headers_mut());
        self.rewrite_request_headers(room, request.headers_mut(), who);
        let sent = match &self.tls {
            Some(tls) if room.origin.tls => tls.request(request),
            _ => self.client.request(request),
        };
        let response = match tokio::time::timeout(self.timeouts.response, sent).await {
            Err(_) => return Err(origin_timeout(room)),
            Ok(Err(e)) => return Err(origin_unreachable(room, &e)),
            Ok(Ok(response)) => response,
        };
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, Body::new(body)))
    }

    /// `Host` and the forwarding headers, as the origin must see them.
    pub fn rewrite_request_headers(&self, room: &RoomSpec, headers: &mut HeaderMap, who: &Asker) {
        let asked_host = headers.get(header::HOST).cloned();
        if !room.preserve_host
            && let Ok(value) = HeaderValue::from_str(&room.origin.authority)
        {
            headers.insert(header::HOST, value);
        }
        let proto = if who.client.https { "https" } else { "http" };
        let from_proxy = who.peer_trusted;
        match self.forwarded {
            ForwardedHeader::XForwardedFor => {
                let chain = chain_with(
                    from_proxy
                        .then(|| joined(headers, "x-forwarded-for"))
                        .flatten(),
                    &who.peer.to_string(),
                );
                set(headers, "x-forwarded-for", &chain);
                headers.remove(header::FORWARDED);
            }
            ForwardedHeader::Forwarded => {
                let node = forwarded_node(who.peer);
                let mut element = format!("for={node};proto={proto}");
                if let Some(host) = asked_host.as_ref().and_then(|h| h.to_str().ok()) {
                    element.push_str(&format!(";host=\"{}\"", host.replace('"', "")));
                }
                let chain = chain_with(
                    from_proxy.then(|| joined(headers, "forwarded")).flatten(),
                    &element,
                );
                set(headers, "forwarded", &chain);
                headers.remove("x-forwarded-for");
            }
        }
        // What the client asked for, as this proxy was asked: a trusted
        // proxy's word on it is kept, anyone else's replaced.
        let asked_host = if from_proxy {
            headers
                .get("x-forwarded-host")
                .cloned()
                .or(asked_host.clone())
        } else {
            asked_host
        };
        match asked_host {
            Some(host) => {
                headers.insert("x-forwarded-host", host);
            }
            None => {
                headers.remove("x-forwarded-host");
            }
        }
        set(headers, "x-forwarded-proto", proto);
    }
}

/// Who asked: the socket's peer (whether it is a trusted proxy), and the
/// client as `crate::http::client` reads it.
pub struct Asker {
    pub peer: IpAddr,
    pub peer_trusted: bool,
    pub client: ClientInfo,
}

fn origin_timeout(room: &RoomSpec) -> ApiError {
    tracing::warn!(room = %room.name, origin = %room.origin.authority, "origin timed out");
    metrics::counter!("waitroom_front_origin_errors_total", "error" => "timeout").increment(1);
    ApiError::Origin {
        timeout: true,
        message: "the site did not answer in time; please retry".into(),
    }
}

pub(super) fn origin_unreachable(room: &RoomSpec, error: &dyn std::fmt::Display) -> ApiError {
    tracing::warn!(room = %room.name, origin = %room.origin.authority, %error, "origin unreachable");
    metrics::counter!("waitroom_front_origin_errors_total", "error" => "unreachable").increment(1);
    ApiError::Origin {
        timeout: false,
        message: "the site could not be reached; please retry".into(),
    }
}

/// Every value of `name`, comma-joined (a client may split a list over
/// several lines).
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

fn chain_with(existing: Option<String>, hop: &str) -> String {
    match existing {
        Some(chain) if !chain.trim().is_empty() => format!("{chain}, {hop}"),
        _ => hop.to_owned(),
    }
}

fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    } else {
        headers.remove(name);
    }
}

/// RFC 7239's node: IPv6 quoted in brackets.
fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// The hop-by-hop headers of RFC 9110 §7.6.1 and the ones `Connection`
/// names: they describe one connection, not the message.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn chains_extend_only_what_exists() {
        assert_eq!(chain_with(None, "1.2.3.4"), "1.2.3.4");
        assert_eq!(
            chain_with(Some("5.6.7.8".into()), "1.2.3.4"),
            "5.6.7.8, 1.2.3.4"
        );
        assert_eq!(forwarded_node("::1".parse().unwrap()), "\"[::1]\"");
    }
}
