//! The answer to a browser whose server-side join was refused.
//!
//! The waiting page joins the visitor through waitroom's own join route
//! (`waiting.rs`), whose refusals are API answers: JSON in the one error
//! shape. A browser asked for a page of the site, so it gets a page: the
//! same look as the waiting page (its stylesheet, masthead and card),
//! saying what happened in words, with the join's status and
//! `Retry-After`, and where waiting helps (a limit, the store away) a
//! `<meta http-equiv="refresh">` at about that time, so it needs no
//! script. Programs never come here: they are answered `503
//! pass_required` before any join.
//!
//! One refusal is not a dead end but a step: a join that needs a solved
//! challenge (`challenge_*`) gets the waiting page itself, whose scripts
//! solve the challenge and join (`waiting.rs` asks [`Refusal::needs_script`]).

use axum::http::header::{self, HeaderValue};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::error::{ErrorBody, ErrorCode};

/// The most a refusal's body may weigh (an error body is a few hundred
/// bytes).
const BODY_LIMIT: usize = 16 * 1024;

/// The longest wait a page asks the browser to come back after.
const LONGEST_REFRESH_SECS: u64 = 3_600;

/// What the join route refused with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    /// `None`: the body was not the error shape.
    pub code: Option<ErrorCode>,
    /// The answer's `Retry-After`, seconds.
    pub retry_after: Option<u64>,
}

impl Refusal {
    /// Reads the join route's refusal `answer` (status, `Retry-After`,
    /// the error code of its body).
    pub async fn read(answer: Response) -> Self {
        let status = answer.status();
        let retry_after = retry_after(answer.headers());
        let body = http_body_util::Limited::new(answer.into_body(), BODY_LIMIT)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let code = serde_json::from_slice::<ErrorBody>(&body)
            .ok()
            .map(|b| b.error);
        Self {
            status,
            code,
            retry_after,
        }
    }

    /// A failure of waitroom itself (an answer it could not read, a page
    /// it could not find).
    pub fn internal() -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: Some(ErrorCode::InternalError),
            retry_after: None,
        }
    }

    /// Whether the waiting page's scripts can get past it (a proof of
    /// work to solve before the join).
    pub fn needs_script(&self) -> bool {
        matches!(
            self.code,
            Some(
                ErrorCode::ChallengeRequired
                    | ErrorCode::ChallengeInvalid
                    | ErrorCode::ChallengeExpired
                    | ErrorCode::ChallengeReplayed
            )
        )
    }

    /// The title and the sentence that say what happened.
    fn words(&self) -> (&'static str, &'static str) {
        match self.code {
            Some(ErrorCode::AddressRateLimited) => (
                "Many people are joining from your network",
                "So many new places were taken from your network in the last minute that yours could not be made just now.",
            ),
            Some(ErrorCode::AddressPlacesLimited) => (
                "Your network holds many places already",
                "Your network already holds as many places in this line as it may. When one of them is let in or leaves, there is room for yours.",
            ),
            Some(ErrorCode::VisitorRateLimited) => (
                "Many new visitors from your network",
                "So many new visitors arrived from your network in the last minute that you could not be let into the line just now.",
            ),
            Some(ErrorCode::RateLimited) => (
                "You are asking very often",
                "This page was asked for many times in a short while. If you had a place in line, you keep it.",
            ),
            Some(ErrorCode::StoreUnavailable | ErrorCode::ServerBusy) => (
                "The waiting room is briefly unavailable",
                "Nobody new can join the line just now. If you already had a place, you keep it.",
            ),
            Some(
                ErrorCode::MissingUserId
                | ErrorCode::InvalidUserId
                | ErrorCode::MissingIdentity
                | ErrorCode::InvalidIdentity
                | ErrorCode::IdentityExpired,
            ) => (
                "We could not tell who you are",
                "The line needs to know who you are. Sign in to the site again, then come back to this page.",
            ),
            _ if self.status.is_server_error() => (
                "Something went wrong",
                "The waiting room could not take your place just now.",
            ),
            _ => (
                "You could not join the line",
                "The waiting room could not take your place.",
            ),
        }
    }

    /// Seconds until the page asks again: `Retry-After` and a little
    /// more, jittered so a crowd refused together does not come back
    /// together; none when waiting does not help.
    fn refresh_secs(&self) -> Option<u64> {
        let wait = self.retry_after?.clamp(1, LONGEST_REFRESH_SECS);
        Some(wait + rand::random_range(0..=wait.div_ceil(4)))
    }
}

/// `Retry-After` in seconds (the join route never sends a date).
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The page for `refusal`, for a browser that asked for `return_to`;
/// `prefix` is where the waiting page's files are.
pub fn page(prefix: &str, refusal: &Refusal, return_to: &str) -> Response {
    let code = refusal.code.map_or("unknown", ErrorCode::as_str);
    metrics::counter!("waitroom_front_joins_refused_total", "error" => code).increment(1);
    let (title, text) = refusal.words();
    let refresh = refusal.refresh_secs();
    let refresh_meta = refresh
        .map(|s| format!("\n  <meta http-equiv=\"refresh\" content=\"{s}\">"))
        .unwrap_or_default();
    let again = match refresh {
        Some(s) => format!("This page tries again by itself in about {s} seconds."),
        None => "Try again in a little while.".to_owned(),
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n  <meta charset=\"utf-8\">\n  \
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1, viewport-fit=cover\">\n  \
         <meta name=\"color-scheme\" content=\"light dark\">\n  \
         <meta name=\"waitroom-refused\" content=\"{code}\">{refresh_meta}\n  \
         <title>{title} · Waiting room</title>\n  \
         <link rel=\"icon\" href=\"{prefix}/favicon.svg\" type=\"image/svg+xml\">\n  \
         <link rel=\"stylesheet\" href=\"{prefix}/styles.css\">\n</head>\n\
         <body data-state=\"refused\">\n  <div class=\"page\">\n    <header class=\"masthead\">\n      \
         <span class=\"brand\"><svg class=\"brand-mark\" viewBox=\"0 0 32 32\" aria-hidden=\"true\" focusable=\"false\">\
         <rect x=\"2\" y=\"2\" width=\"28\" height=\"28\" rx=\"9\" fill=\"currentColor\"/>\
         <circle cx=\"11\" cy=\"16\" r=\"2.6\" fill=\"var(--surface)\"/>\
         <circle cx=\"17.5\" cy=\"16\" r=\"2.6\" fill=\"var(--surface)\" opacity=\".7\"/>\
         <circle cx=\"24\" cy=\"16\" r=\"2.6\" fill=\"var(--surface)\" opacity=\".4\"/></svg>\
         <span class=\"brand-name\">waitroom</span></span>\n    </header>\n    \
         <main class=\"card\" id=\"main\">\n      \
         <section class=\"view\" id=\"front-refused\" data-error=\"{code}\">\n        \
         <h1 class=\"view-title\">{title}</h1>\n        <p class=\"lede\">{text}</p>\n        \
         <p class=\"lede\">{again}</p>\n        \
         <p><a class=\"button secondary\" href=\"{url}\">Try again now</a></p>\n      \
         </section>\n    </main>\n  </div>\n</body>\n</html>\n",
        prefix = super::waiting::escape(prefix),
        url = super::waiting::escape(return_to),
    );
    let mut response = (
        refusal.status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response();
    if let Some(secs) = refusal.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    crate::http::security::apply(response.headers_mut(), false);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: ErrorCode, status: StatusCode, retry_after: Option<u64>) -> Refusal {
        Refusal {
            status,
            code: Some(code),
            retry_after,
        }
    }

    #[tokio::test]
    async fn a_refusal_is_read_from_the_error_shape() {
        let answer = crate::error::ApiError::ClientLimited {
            code: ErrorCode::AddressRateLimited,
            message: "x".into(),
            retry_after_secs: 7,
        }
        .into_response();
        let read = Refusal::read(answer).await;
        assert_eq!(
            read,
            refusal(
                ErrorCode::AddressRateLimited,
                StatusCode::TOO_MANY_REQUESTS,
                Some(7)
            )
        );
        let garbage = (StatusCode::BAD_GATEWAY, "not json").into_response();
        assert_eq!(Refusal::read(garbage).await.code, None);
    }

    #[test]
    fn the_page_comes_back_after_retry_after_jittered_and_only_when_waiting_helps() {
        let limited = refusal(
            ErrorCode::AddressRateLimited,
            StatusCode::TOO_MANY_REQUESTS,
            Some(20),
        );
        let seen: std::collections::BTreeSet<u64> =
            (0..200).map(|_| limited.refresh_secs().unwrap()).collect();
        assert!(seen.iter().all(|s| (20..=25).contains(s)), "{seen:?}");
        assert!(seen.len() > 2, "{seen:?}");
        let who = refusal(ErrorCode::MissingUserId, StatusCode::BAD_REQUEST, None);
        assert_eq!(who.refresh_secs(), None);
        assert!(
            refusal(
                ErrorCode::ChallengeRequired,
                StatusCode::PRECONDITION_REQUIRED,
                None
            )
            .needs_script()
        );
        assert!(!limited.needs_script());
    }

    #[tokio::test]
    async fn the_url_and_prefix_are_escaped_into_the_page() {
        let limited = refusal(
            ErrorCode::StoreUnavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            Some(2),
        );
        let response = page("/_w\"r", &limited, "/p?a=1&b=\"<x>\"");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let html = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            html.contains(r#"href="/p?a=1&amp;b=&quot;&lt;x&gt;&quot;""#),
            "{html}"
        );
        assert!(html.contains(r#"href="/_w&quot;r/styles.css""#), "{html}");
        assert!(!html.contains("<script"), "{html}");
    }
}
