//! Security headers on every answer the router gives (and the transport's
//! own `503 server_busy`), whichever path carries it.
//!
//! - A strict `Content-Security-Policy`: the page loads only its own
//!   scripts, styles, workers and images and talks only to its own origin;
//!   `frame-ancestors 'none'` (and `X-Frame-Options: DENY` for older
//!   browsers) keeps every answer out of frames, so a see-through frame
//!   cannot trick a buyer into a one-click order.
//! - `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`.
//! - `Cache-Control: no-store` on every answer of the API (tickets, entry
//!   tokens, orders) and on every answer that sets a cookie; the event
//!   stream keeps its `no-cache` and gains `no-store`. Static files keep
//!   their own `no-cache` (revalidated, nothing secret in them).
//!
//! hyper's own answers to requests it cannot parse (`431`, `400`) carry no
//! headers of ours; they carry no body either.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// The page's policy: everything from its own origin, nothing inline,
/// never framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self' data:; worker-src 'self'; \
    manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Adds the headers every answer carries (see the module doc).
pub fn apply(headers: &mut HeaderMap, api: bool) {
    // Values made at compile time: `from_static` outside a constant checks
    // every byte on every answer (the policy alone is 250 of them).
    const CSP: HeaderValue = HeaderValue::from_static(CONTENT_SECURITY_POLICY);
    const DENY: HeaderValue = HeaderValue::from_static("DENY");
    const NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");
    const NO_REFERRER: HeaderValue = HeaderValue::from_static("no-referrer");
    const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
    const NO_CACHE_NO_STORE: HeaderValue = HeaderValue::from_static("no-cache, no-store");
    // Room for ours at once: growing the map header by header reallocates
    // (and rehashes) it more than once per answer.
    headers.reserve(5);
    headers.insert(header::CONTENT_SECURITY_POLICY, CSP);
    headers.insert(header::X_FRAME_OPTIONS, DENY);
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF);
    headers.insert(header::REFERRER_POLICY, NO_REFERRER);
    if api || headers.contains_key(header::SET_COOKIE) {
        let value = match headers
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
        {
            Some(v) if v.contains("no-store") => return,
            Some(v) if v.contains("no-cache") => NO_CACHE_NO_STORE,
            _ => NO_STORE,
        };
        headers.insert(header::CACHE_CONTROL, value);
    }
}

pub async fn add_headers(request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let mut response = next.run(request).await;
    apply(response.headers_mut(), api);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_answers_and_cookies_are_never_stored_assets_keep_no_cache() {
        let mut h = HeaderMap::new();
        apply(&mut h, true);
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        let mut stream = HeaderMap::new();
        stream.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        apply(&mut stream, true);
        assert_eq!(stream[header::CACHE_CONTROL], "no-cache, no-store");
        let mut asset = HeaderMap::new();
        asset.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        apply(&mut asset, false);
        assert_eq!(asset[header::CACHE_CONTROL], "no-cache");
        asset.insert(header::SET_COOKIE, HeaderValue::from_static("a=b"));
        apply(&mut asset, false);
        assert_eq!(asset[header::CACHE_CONTROL], "no-cache, no-store");
        assert!(
            asset[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("frame-ancestors 'none'")
        );
    }
}
