//! A WebSocket (or any `Upgrade`) through the proxy, for a request that
//! holds a pass.
//!
//! The upgrade gets a connection to the origin of its own (an upgraded
//! connection is never returned to a pool; TLS for an `https://` origin,
//! `tls.rs`): the handshake is sent with
//! `Upgrade` and `Connection: upgrade` kept and the other headers
//! rewritten as for any request; the origin's answer is passed back; on
//! `101` both sides are taken over and bytes are copied both ways until
//! either closes. Anything but `101` is passed back as an ordinary answer.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{StatusCode, uri::PathAndQuery};
use axum::response::Response;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::forward::{Asker, Upstream, origin_unreachable, strip_hop_by_hop};
use super::rooms::RoomSpec;
use crate::error::ApiError;

/// Whether `request` asks to switch protocols.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// HTTP/1 over `io`, a connection of its own to `room`'s origin (plain
/// or TLS), driven in the background with upgrades on.
pub(super) async fn handshake<T>(io: T, room: &RoomSpec) -> Result<SendRequest<Body>, ApiError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| origin_unreachable(room, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "upgraded origin connection ended");
        }
    });
    Ok(sender)
}

/// Carries `request`'s upgrade to `room`'s origin.
pub async fn forward(
    upstream: &Upstream,
    room: &RoomSpec,
    mut request: Request,
    path_and_query: PathAndQuery,
    who: &Asker,
) -> Result<Response, ApiError> {
    let protocol = request.headers().get(header::UPGRADE).cloned();
    let client_side = hyper::upgrade::on(&mut request);
    let timeouts = upstream.timeouts();
    let mut sender = match (room.origin.tls, upstream.tls()) {
        (true, Some(tls)) => tls.connect(room).await?,
        (true, None) => {
            return Err(origin_unreachable(
                room,
                &"no TLS client for an https:// origin",
            ));
        }
        (false, _) => {
            let connect = TcpStream::connect(room.origin.authority.as_str());
            let stream = match tokio::time::timeout(timeouts.connect, connect).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return Err(origin_unreachable(room, &e)),
                Err(_) => return Err(origin_unreachable(room, &"connect timed out")),
            };
            let _ = stream.set_nodelay(true);
            handshake(TokioIo::new(stream), room).await?
        }
    };

    let (mut parts, body) = request.into_parts();
    parts.uri = path_and_query
        .as_str()
        .parse()
        .map_err(|e| ApiError::Internal(format!("origin path: {e}")))?;
    parts.version = axum::http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    upstream.rewrite_request_headers(room, &mut parts.headers, who);
    if let Some(protocol) = protocol {
        parts.headers.insert(header::UPGRADE, protocol);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let asked = sender.send_request(Request::from_parts(parts, body));
    let mut answer = match tokio::time::timeout(timeouts.response, asked).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return Err(origin_unreachable(room, &e)),
        Err(_) => {
            return Err(ApiError::Origin {
                timeout: true,
                message: "the site did not answer in time; please retry".into(),
            });
        }
    };
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    let origin_side = hyper::upgrade::on(&mut answer);
    let room_name = room.name.clone();
    tokio::spawn(async move {
        let (client, origin) = match tokio::try_join!(client_side, origin_side) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(room = %room_name, error = %e, "upgrade not completed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut origin = TokioIo::new(origin);
        metrics::gauge!("waitroom_front_upgraded_connections").increment(1.0);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut origin).await;
        metrics::gauge!("waitroom_front_upgraded_connections").decrement(1.0);
    });
    // The origin's 101 as it was, its connection headers included (the
    // client needs `Upgrade` and `Connection` to switch).
    let (parts, _) = answer.into_parts();
    Ok(Response::from_parts(parts, Body::empty()))
}
