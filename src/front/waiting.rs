//! The answer to a request for a protected path without a valid pass.
//!
//! A program (`Accept: application/json`, or `X-Requested-With:
//! XMLHttpRequest`) gets `503 pass_required` with `Retry-After`: it has no
//! page to wait on. A browser gets the waiting page in place of the page
//! it asked for, at the same URL, so that once admitted it lands back on
//! exactly that URL (path and query):
//!
//! 1. The visitor joins the room's queue here, server-side, through
//!    waitroom's own join route (the same identity, limits and ticket as
//!    the page's own join; joining again is idempotent), so the place and
//!    status are known before any script runs.
//! 2. Admitted (`READY`): a `303` to the pass endpoint (`crate::pass`,
//!    below the prefix), which starts the session, sets the pass cookie
//!    and sends the visitor back to this same URL, which now passes. The
//!    URL is the request's own resolved path and query, never one the
//!    visitor names, and the endpoint checks it again, so no redirect can
//!    lead off the site.
//! 3. Otherwise the page (`static/index.html`, from `--page-dir` when one
//!    is set) with `<base href="<prefix>/">`, so its scripts call the API
//!    under the reserved prefix, the room's queue named for them, and for
//!    browsers without JavaScript the place and status in the HTML and a
//!    `<meta http-equiv="refresh">` on a jittered interval (in
//!    `<noscript>`: with scripts on, the live page does not reload). With
//!    scripts on, the page reloads this URL when the visitor is admitted,
//!    which is step 2.
//! 4. The join refused (an address over its limits, the store away, no
//!    identity): a page in the same look saying so, with the join's status
//!    and `Retry-After` (`refused.rs`); a challenge to solve first: the
//!    page of step 3, whose scripts solve it and join.

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::refused::{self, Refusal};
use super::rooms::RoomSpec;
use crate::error::ApiError;
use crate::http::AppState;

/// The most the join's answer may weigh (a `QueueStatus` is a few hundred
/// bytes).
const STATUS_LIMIT: usize = 16 * 1024;

/// Whether the asker is a program rather than a browser.
pub fn wants_json(headers: &HeaderMap) -> bool {
    let xhr = headers
        .get("x-requested-with")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("xmlhttprequest"));
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    xhr || (accept.contains("application/json") && !accept.contains("text/html"))
}

/// `503 pass_required`, retry after a few seconds.
pub fn pass_required() -> Response {
    ApiError::PassRequired {
        retry_after_secs: 5,
    }
    .into_response()
}

/// What the join said.
struct Joined {
    status: String,
    position: Option<u64>,
    total_waiting: Option<u64>,
    wait_secs: Option<u64>,
    cookies: Vec<HeaderValue>,
}

/// The status shown while the page's scripts must join (a challenge to
/// solve first).
const NEEDS_SCRIPT: &str = "NEEDS_SCRIPT";

impl Joined {
    /// Not joined yet: the page's scripts join.
    fn needs_script() -> Self {
        Self {
            status: NEEDS_SCRIPT.to_owned(),
            position: None,
            total_waiting: None,
            wait_secs: None,
            cookies: Vec::new(),
        }
    }
}

/// The waiting page (or the redirect to the pass) for `request`, asked at
/// `return_to` (path and query) in `room`; `inner` is waitroom's own
/// router, below `prefix`; `pass_path` is where an admitted visitor gets
/// the pass for `return_to`.
pub async fn answer(
    state: &AppState,
    inner: &Router,
    prefix: &str,
    room: &RoomSpec,
    request: &Parts,
    return_to: &str,
) -> Response {
    let joined = match join(inner, prefix, room, request).await {
        Ok(joined) => joined,
        Err(answer) => {
            // A browser asked for a page: it gets one (`refused.rs`), or
            // for a challenge to solve, the waiting page whose scripts
            // solve it and join.
            let refusal = Refusal::read(answer).await;
            if !refusal.needs_script() {
                return refused::page(prefix, &refusal, return_to);
            }
            Joined::needs_script()
        }
    };
    if joined.status == "READY" {
        // The pass endpoint starts the session (the entry token spent, its
        // slot under `maxActive` the session's), sets the pass cookie and
        // sends the visitor on to `return_to`: the join's cookies ride on
        // this answer, so even a visitor this very join minted arrives
        // there named.
        let mut response = see_other(&pass_path(prefix, room, return_to));
        append_cookies(&mut response, &joined.cookies);
        metrics::counter!("waitroom_front_passes_issued_total").increment(1);
        return response;
    }
    let mut response = match page(state, prefix, room, &joined, return_to).await {
        Some(html) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            html,
        )
            .into_response(),
        None => {
            tracing::error!("the page's index.html is missing");
            return refused::page(prefix, &Refusal::internal(), return_to);
        }
    };
    crate::http::security::apply(response.headers_mut(), false);
    allow_own_base(response.headers_mut());
    append_cookies(&mut response, &joined.cookies);
    response
}

/// The page's policy with `base-uri 'self'`: the `<base href>` that points
/// its scripts at the prefix is the page's own (the policy's `'none'`
/// would drop it).
fn allow_own_base(headers: &mut HeaderMap) {
    let relaxed = headers
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.replace("base-uri 'none'", "base-uri 'self'"))
        .and_then(|v| HeaderValue::from_str(&v).ok());
    if let Some(policy) = relaxed {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
}

/// An origin failure as a browser should see it: the same status, a
/// short page saying to retry.
pub fn error_page(error: ApiError) -> Response {
    let status = error.into_response().status();
    let (title, text) = if status == StatusCode::GATEWAY_TIMEOUT {
        (
            "The site is slow to answer",
            "The site did not answer in time.",
        )
    } else {
        (
            "The site cannot be reached",
            "The site could not be reached just now.",
        )
    };
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"10\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p>{text} Your place is kept: this page tries again in a few seconds.</p></body></html>"
    );
    let mut response = (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
    crate::http::security::apply(response.headers_mut(), false);
    response
}

/// The pass endpoint under `prefix` for `room`'s queue, sending the
/// visitor back to `return_to` (the request's own resolved path and query).
fn pass_path(prefix: &str, room: &RoomSpec, return_to: &str) -> String {
    let back: String = form_urlencoded::byte_serialize(return_to.as_bytes()).collect();
    format!("{prefix}/api/queues/{}/pass?return={back}", room.queue)
}

fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn append_cookies(response: &mut Response, cookies: &[HeaderValue]) {
    for cookie in cookies {
        response
            .headers_mut()
            .append(header::SET_COOKIE, cookie.clone());
    }
}

/// Joins the visitor to `room`'s queue through waitroom's join route, with
/// the request's own headers (cookies, identity, forwarding) and peer. A
/// refusal (limits, a challenge to solve, the store away) is passed on as
/// the join answered it, for `refused.rs` to put in words.
async fn join(
    inner: &Router,
    prefix: &str,
    room: &RoomSpec,
    request: &Parts,
) -> Result<Joined, Response> {
    let mut join = Request::new(Body::empty());
    *join.method_mut() = Method::POST;
    *join.uri_mut() = format!("{prefix}/api/queues/{}/entries", room.queue)
        .parse()
        .map_err(|_| ApiError::Internal("join URI".into()).into_response())?;
    for name in [
        header::COOKIE,
        header::HOST,
        header::AUTHORIZATION,
        header::USER_AGENT,
        header::ACCEPT_LANGUAGE,
    ] {
        for value in request.headers.get_all(&name) {
            join.headers_mut().append(name.clone(), value.clone());
        }
    }
    for (name, value) in &request.headers {
        let forwarding = name.as_str().starts_with("x-forwarded-") || name == header::FORWARDED;
        let identity = name.as_str() == "x-user-id";
        if forwarding || identity {
            join.headers_mut().append(name.clone(), value.clone());
        }
    }
    if let Some(peer) = request
        .extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
    {
        join.extensions_mut().insert(*peer);
    }
    let answer = inner
        .clone()
        .oneshot(join)
        .await
        .unwrap_or_else(|never| match never {});
    if !answer.status().is_success() {
        return Err(answer);
    }
    let cookies: Vec<HeaderValue> = answer
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .cloned()
        .collect();
    let body = http_body_util::Limited::new(answer.into_body(), STATUS_LIMIT)
        .collect()
        .await
        .map_err(|e| ApiError::Internal(format!("join answer: {e}")).into_response())?
        .to_bytes();
    let status: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::Internal(format!("join answer: {e}")).into_response())?;
    Ok(Joined {
        status: status["status"].as_str().unwrap_or("").to_owned(),
        position: status["position"].as_u64(),
        total_waiting: status["totalWaiting"].as_u64(),
        wait_secs: status["estimatedWaitSeconds"].as_u64(),
        cookies,
    })
}

/// Seconds until a page without scripts asks again: sooner near the head
/// of the line, and jittered so a crowd that loaded together does not
/// come back together.
fn refresh_secs(position: Option<u64>) -> u64 {
    let (low, high) = match position {
        Some(p) if p <= 20 => (2, 5),
        Some(p) if p <= 1_000 => (5, 10),
        _ => (10, 20),
    };
    rand::random_range(low..=high)
}

/// `static/index.html` dressed for `return_to` in `room`.
async fn page(
    state: &AppState,
    prefix: &str,
    room: &RoomSpec,
    joined: &Joined,
    return_to: &str,
) -> Option<String> {
    let html = crate::http::page_index(state).await?;
    let html = String::from_utf8_lossy(&html).into_owned();
    let refresh = if joined.status == "READY" {
        1
    } else {
        refresh_secs(joined.position)
    };
    let head = format!(
        "\n  <base href=\"{base}/\">\n  <meta name=\"waitroom-queue\" content=\"{queue}\">\n  \
         <meta name=\"waitroom-front\" content=\"{url}\">\n  \
         <noscript><meta http-equiv=\"refresh\" content=\"{refresh}\"></noscript>",
        base = escape(prefix),
        queue = escape(room.queue.as_str()),
        url = escape(return_to),
    );
    let status = status_html(joined, refresh, return_to);
    let html = insert_after_tag(&html, "<head", &head)?;
    insert_after_tag(&html, "<body", &status)
}

/// The place and status for a browser without scripts.
fn status_html(joined: &Joined, refresh: u64, return_to: &str) -> String {
    let line = match (joined.status.as_str(), joined.position) {
        ("WAITING", Some(position)) => {
            let total = joined
                .total_waiting
                .map(|t| format!(" of {t}"))
                .unwrap_or_default();
            let wait = joined
                .wait_secs
                .map(|s| format!(" About {} to go.", duration_words(s)))
                .unwrap_or_default();
            format!(
                "You are <strong id=\"front-position\">number {position}</strong>{total} in line.{wait}"
            )
        }
        ("SOLD_OUT", _) => {
            "Everything is sold out for now; you keep your place in case of a restock.".to_owned()
        }
        ("PRE_QUEUE", _) => {
            "You are in the draw for the opening; your place is given when it opens.".to_owned()
        }
        (NEEDS_SCRIPT, _) => {
            "Before you join, this waiting room asks your browser to solve a short \
             check, which needs JavaScript: turn it on and reload this page."
                .to_owned()
        }
        _ => "You are in line.".to_owned(),
    };
    format!(
        "\n<noscript><section class=\"front-status\" id=\"front-status\" data-status=\"{status}\">\
         <h1>You are in the waiting room</h1><p>{line}</p>\
         <p>This page checks again by itself every {refresh} seconds; when it is your turn it takes you on.</p>\
         <p><a href=\"{url}\">Check now</a></p></section></noscript>",
        status = escape(&joined.status),
        url = escape(return_to),
    )
}

fn duration_words(secs: u64) -> String {
    match secs {
        0..=59 => "less than a minute".to_owned(),
        60..=119 => "a minute".to_owned(),
        _ if secs < 3_600 => format!("{} minutes", secs.div_ceil(60)),
        _ => format!("{} hours", secs.div_ceil(3_600)),
    }
}

/// `html` with `insert` right after the opening tag `tag` (its `>`).
fn insert_after_tag(html: &str, tag: &str, insert: &str) -> Option<String> {
    let start = html.find(tag)?;
    let end = start + html[start..].find('>')? + 1;
    let mut out = String::with_capacity(html.len() + insert.len());
    out.push_str(&html[..end]);
    out.push_str(insert);
    out.push_str(&html[end..]);
    Some(out)
}

/// Text for an HTML attribute or element.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_and_browsers_are_told_apart() {
        let mut h = HeaderMap::new();
        assert!(!wants_json(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(wants_json(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html,application/xhtml+xml,application/json;q=0.9"),
        );
        assert!(!wants_json(&h));
        h.insert(
            "x-requested-with",
            HeaderValue::from_static("XMLHttpRequest"),
        );
        assert!(wants_json(&h));
    }

    #[test]
    fn the_refresh_is_jittered_within_its_band() {
        let seen: std::collections::BTreeSet<u64> =
            (0..200).map(|_| refresh_secs(Some(5_000))).collect();
        assert!(seen.len() > 3, "{seen:?}");
        assert!(seen.iter().all(|s| (10..=20).contains(s)));
        assert!((2..=5).contains(&refresh_secs(Some(1))));
    }

    #[test]
    fn urls_are_escaped_into_the_page() {
        assert_eq!(
            escape("/p?a=1&b=\"<x>\""),
            "/p?a=1&amp;b=&quot;&lt;x&gt;&quot;"
        );
        let html = insert_after_tag("<html><head lang=x><title>", "<head", "!").unwrap();
        assert_eq!(html, "<html><head lang=x>!<title>");
    }
}
