//! Refuses browser requests from another origin to the endpoints that act
//! on the buyer's cookies: join, position, events and leave of a queue,
//! and the demo order API.
//!
//! Why: `SameSite` cookies are scoped per *site*, not per origin, so a page
//! on a sibling origin (another port or subdomain of the same site) gets
//! the buyer's cookies attached to its requests. Opening the buyer's stream
//! from there replaces the buyer's own (`gone: replaced`); a hidden form or
//! fetch can join, leave or order. Browsers say where a request comes
//! from: `Sec-Fetch-Site` (`same-origin`, `same-site`, `cross-site`, or
//! `none` for a typed URL) and, on anything but a same-origin `GET`,
//! `Origin`. A request is refused `403 cross_origin` when
//! `Sec-Fetch-Site` is present and neither `same-origin` nor `none`, or
//! when `Origin` is present and names neither the request's own origin
//! (`Host`, with the scheme from `X-Forwarded-Proto` when a proxy sets it)
//! nor one of `--allowed-origins`. Requests with neither header (curl,
//! services, older browsers' same-origin `GET`s) pass: those are not a
//! browser acting on a buyer's behalf from somewhere else.
//!
//! Behind a proxy, `Host` must be passed through (nginx: `proxy_set_header
//! Host $http_host;`, which keeps the port), or the public origin named in
//! `--allowed-origins`.

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::ApiError;

/// An origin as browsers serialize it: lower-case scheme and host, and the
/// port only when it is not the scheme's default. `None` for anything else
/// (a path, a missing host, another scheme, `null`).
pub fn parse_origin(text: &str) -> Option<(String, String)> {
    let (scheme, rest) = text.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = normalize_authority(&scheme, rest)?;
    Some((scheme, authority))
}

/// `host[:port]` lower-cased, the scheme's default port dropped; `None` if
/// it carries a path, user info or nothing.
fn normalize_authority(scheme: &str, authority: &str) -> Option<String> {
    if authority.is_empty()
        || authority
            .bytes()
            .any(|b| matches!(b, b'/' | b'?' | b'#' | b'@' | b' ') || b.is_ascii_control())
    {
        return None;
    }
    let lower = authority.to_ascii_lowercase();
    let default = if scheme == "https" { ":443" } else { ":80" };
    Some(match lower.strip_suffix(default) {
        Some(host) if !host.is_empty() => host.to_owned(),
        _ => lower,
    })
}

/// Whether the path (below the base path) is one the check guards.
fn guarded(path: &str) -> bool {
    path.starts_with("/api/queues/") || path == "/api/orders" || path.starts_with("/api/orders/")
}

/// Whether `headers` come from the request's own origin or an allowed one,
/// as far as the browser says (see the module doc).
pub fn same_origin(headers: &HeaderMap, allowed: &[String]) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("").trim();
        if !site.eq_ignore_ascii_case("same-origin") && !site.eq_ignore_ascii_case("none") {
            // `same-site` or `cross-site`; an allowed origin still passes
            // on its `Origin` below.
            return origin_allowed(headers, allowed, false);
        }
    }
    origin_allowed(headers, allowed, true)
}

/// The `Origin` check: no `Origin` passes only when `absent_ok`; a present
/// one must be the request's own origin or an allowed one.
fn origin_allowed(headers: &HeaderMap, allowed: &[String], absent_ok: bool) -> bool {
    let mut values = headers.get_all("origin").iter();
    let Some(origin) = values.next() else {
        return absent_ok;
    };
    if values.next().is_some() {
        return false;
    }
    let Some((scheme, authority)) = origin.to_str().ok().and_then(parse_origin) else {
        return false; // `null` (sandboxed frames, file:, redirects) or garbage
    };
    if allowed
        .iter()
        .filter_map(|a| parse_origin(a.trim()))
        .any(|(s, a)| s == scheme && a == authority)
    {
        return true;
    }
    // The request's own origin: its `Host`, in the scheme the proxy says
    // the client used (either one when no proxy says).
    let forwarded = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    if let Some(proto) = &forwarded
        && *proto != scheme
    {
        return false;
    }
    headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| normalize_authority(&scheme, h.trim()))
        .is_some_and(|host| host == authority)
}

/// The `403 cross_origin` answer to a guarded path asked from another
/// origin, given before any extractor runs (so a refused request changes
/// nothing and costs no store call): one of the public router's guards,
/// `super::public_guards`.
pub fn refuse_cross_origin(state: &AppState, request: &Request) -> Option<Response> {
    (guarded(request.uri().path())
        && !same_origin(request.headers(), &state.settings().allowed_origins))
    .then(|| ApiError::CrossOrigin.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn origins_parse_as_browsers_write_them() {
        assert_eq!(
            parse_origin("HTTPS://Shop.Example:443"),
            Some(("https".into(), "shop.example".into()))
        );
        assert_eq!(
            parse_origin("http://127.0.0.1:8080"),
            Some(("http".into(), "127.0.0.1:8080".into()))
        );
        for bad in [
            "null",
            "shop.example",
            "ftp://x",
            "https://",
            "https://a/b",
            "https://u@a",
        ] {
            assert_eq!(parse_origin(bad), None, "{bad}");
        }
    }

    #[test]
    fn own_origin_and_header_less_requests_pass_the_rest_are_refused() {
        let allowed = vec!["https://shop.example".to_owned()];
        let host = ("host", "127.0.0.1:8080");
        assert!(same_origin(&headers(&[host]), &allowed), "curl");
        assert!(same_origin(
            &headers(&[host, ("sec-fetch-site", "same-origin")]),
            &allowed
        ));
        assert!(same_origin(
            &headers(&[host, ("sec-fetch-site", "none")]),
            &allowed
        ));
        assert!(same_origin(
            &headers(&[host, ("origin", "http://127.0.0.1:8080")]),
            &allowed
        ));
        assert!(!same_origin(
            &headers(&[host, ("sec-fetch-site", "same-site")]),
            &allowed
        ));
        assert!(!same_origin(
            &headers(&[host, ("sec-fetch-site", "cross-site")]),
            &allowed
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "http://127.0.0.1:9090")]),
            &allowed
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "null")]),
            &allowed
        ));
        assert!(
            !same_origin(
                &headers(&[
                    host,
                    ("origin", "http://127.0.0.1:8080"),
                    ("origin", "http://127.0.0.1:8080")
                ]),
                &allowed
            ),
            "two origins"
        );
        // The proxy's scheme must match the page's.
        assert!(!same_origin(
            &headers(&[
                host,
                ("x-forwarded-proto", "https"),
                ("origin", "http://127.0.0.1:8080")
            ]),
            &allowed
        ));
        assert!(same_origin(
            &headers(&[
                ("host", "shop.example"),
                ("x-forwarded-proto", "https"),
                ("origin", "https://shop.example")
            ]),
            &[]
        ));
        // An allowed origin passes even from another site.
        assert!(same_origin(
            &headers(&[
                host,
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://shop.example")
            ]),
            &allowed
        ));
        assert!(
            !same_origin(
                &headers(&[host, ("sec-fetch-site", "cross-site")]),
                &allowed
            ),
            "cross-site without an Origin"
        );
    }

    #[test]
    fn guards_the_buyer_endpoints_only() {
        for p in [
            "/api/queues/default/events",
            "/api/queues/x/entries",
            "/api/orders",
            "/api/orders/o1",
        ] {
            assert!(guarded(p), "{p}");
        }
        for p in [
            "/",
            "/app.js",
            "/api/products",
            "/api/admin/queues",
            "/api/tokens/claim",
            "/healthz",
            "/api/ordersx",
        ] {
            assert!(!guarded(p), "{p}");
        }
    }
}
