//! The admission pass over HTTP: the JWKS document, the exchange of an
//! admitted buyer's entry for a pass (a session), the gateway check that
//! nginx `auth_request`, Caddy `forward_auth`, Traefik `ForwardAuth` or
//! HAProxy call before every request to the protected site, and the
//! operator's end of a session.
//!
//! The check is the hot path: the pass from the cookie or bearer, a
//! signature check or a hit in the cache of verified passes, a clock read,
//! the local set of ended sessions, and a note of activity in memory (the
//! sessions task reports it in batches). No store call.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cookie::{Cookie, SameSite};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::AdminAuth;
use super::client::Client;
use super::extract::Member;
use crate::clock::now_ms;
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::pass::{PassClaims, PassRejection, Presented, ReturnTo, pass_from_headers};
use crate::queue::{QueueName, SessionId};
use crate::store::SessionStart;

/// The public routes: the keys, the pass, the check.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(jwks))
        .routes(routes!(take_pass))
        .routes(routes!(check))
}

/// The operator's route: ending a session.
pub fn admin_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(end_session))
}

// The check's own headers, made at compile time (a name given as a string
// is parsed again on every answer).
const VISITOR: HeaderName = HeaderName::from_static("x-waitroom-visitor");
const ROOM: HeaderName = HeaderName::from_static("x-waitroom-room");
const SESSION: HeaderName = HeaderName::from_static("x-waitroom-session");
const REASON: HeaderName = HeaderName::from_static("x-waitroom-reason");
const LOCATION: HeaderName = HeaderName::from_static("x-waitroom-location");

/// The path of the gateway check (any method routes there: a gateway may
/// forward the visitor's own).
pub const CHECK_PATH: &str = "/api/gate/check";

/// The public keys passes are signed with (RFC 7517), for gateways that
/// verify passes themselves.
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    tag = "pass",
    responses((status = 200, description = "The JWK set: Ed25519 keys (`kty` OKP, `alg` EdDSA), each with its `kid`; the current one first.", content_type = "application/json", body = Object)),
)]
async fn jwks(State(state): State<AppState>) -> Response {
    let set = state.passes().jwks(now_ms() / 1000);
    let mut response = Json(set).into_response();
    // Short: a rotated key shows up within minutes at a verifier.
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PassQuery {
    /// Where to go with the pass: a path (`/product/42?size=9`) or a URL
    /// on one of `--protected-origins`. Default `/`.
    #[serde(rename = "return")]
    return_to: Option<String>,
}

/// A pass, for JSON callers (an app sends it as a bearer).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct PassBody {
    /// The pass: an EdDSA JWT (`Authorization: Bearer`, or the cookie set
    /// with this answer).
    pass: String,
    /// The session it stands for (`jti`).
    session: String,
    /// When it expires, seconds since the epoch (`exp`); idle, it ends
    /// sooner.
    expires_at: u64,
    /// The validated return URL.
    #[serde(rename = "return")]
    return_to: String,
}

/// Exchanges an admitted buyer's entry for a pass: starts a session (the
/// entry token is spent; its slot under `maxActive` is the session's),
/// sets the pass cookie and sends the browser back (`303`) to the
/// validated return URL; `Accept: application/json` gets the pass in the
/// body too. Asked again while the session lives, it gives the same
/// session's pass.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/pass",
    tag = "pass",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
        PassQuery,
    ),
    responses(
        (status = 200, description = "The pass (for `Accept: application/json`); the cookie is set too.", body = PassBody),
        (status = 303, description = "The pass cookie is set; `Location` is the return URL. A browser (`Accept: text/html`, not JSON) whose pass cannot be given now (a missing or bad ticket, not admitted, the store away) is sent back to the return URL too, without a cookie: the gateway there shows it the waiting page again."),
        (status = 400, description = "`invalid_return`: not a path nor a URL on a protected origin.", body = ErrorBody),
        (status = 401, description = "`missing_ticket`, `invalid_ticket`, `foreign_ticket`, `ticket_expired`, `ticket_user_mismatch`.", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 409, description = "`not_admitted`: the buyer holds no live entry token (not admitted yet, or it expired or was used).", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (no new session while the store is away), `server_busy`.", body = ErrorBody),
    )
)]
async fn take_pass(
    State(state): State<AppState>,
    Client(client): Client,
    Query(query): Query<PassQuery>,
    headers: HeaderMap,
    member: Result<Member, ApiError>,
) -> Result<Response, ApiError> {
    let settings = state.settings();
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let wants_json = accept.contains("application/json");
    let target = crate::pass::validate_return(
        query.return_to.as_deref().unwrap_or("/"),
        &settings.protected_origins,
    )
    .map_err(|e| ApiError::bad_request(ErrorCode::InvalidReturn, e.to_string()));
    // A browser that cannot have its pass now is not left on a JSON error:
    // it goes back where it was going, where the gateway (or the built-in
    // proxy) shows the waiting page, which knows how to wait. Only an
    // unusable return URL is answered in place (there is nowhere safe to
    // send it).
    let browser = !wants_json && accept.contains("text/html");
    let refuse = |e: ApiError, target: &ReturnTo| {
        // A return URL that is this route again (under any prefix) would
        // bounce the browser between the two until it gives up.
        let loops = target
            .as_str()
            .split('?')
            .next()
            .is_some_and(|path| path.contains("/api/queues/") && path.ends_with("/pass"));
        if browser && !loops {
            tracing::debug!(error = %e, "pass refused; the browser goes back");
            Ok(back_without_pass(target))
        } else {
            Err(e)
        }
    };
    let member = match (member, &target) {
        (Ok(member), _) => member,
        (Err(e), Ok(target)) => return refuse(e, target),
        (Err(e), Err(_)) => return Err(e),
    };
    let target = target?;
    let limits = settings.sessions.for_queue(&member.queue);
    let started = state
        .store()
        .start_session(
            &member.queue,
            &member.user,
            member.entry,
            &SessionId::generate(),
            limits,
        )
        .await;
    let (id, exp_ms) = match started {
        Ok(SessionStart::Started { id, exp_ms } | SessionStart::Live { id, exp_ms }) => {
            (id, exp_ms)
        }
        Ok(SessionStart::NotAdmitted) => {
            let e = ApiError::conflict(
                ErrorCode::NotAdmitted,
                "not admitted: wait for your turn (or your entry has expired or was used)",
            );
            return refuse(e, &target);
        }
        Err(e) => return refuse(e.into(), &target),
    };
    let now = now_ms() / 1000;
    let claims = PassClaims {
        sub: member.user.clone(),
        room: member.queue.clone(),
        iat: now,
        exp: exp_ms / 1000,
        jti: id,
    };
    let token = state.passes().issue(&claims);
    let cookie = pass_cookie(&state, &token, claims.exp.saturating_sub(now), &client);
    tracing::info!(queue = %claims.room, session = %claims.jti, "pass issued");
    let mut response = if wants_json {
        Json(PassBody {
            pass: token,
            session: claims.jti.as_str().to_owned(),
            expires_at: claims.exp,
            return_to: target.as_str().to_owned(),
        })
        .into_response()
    } else {
        see_other(&target)
    };
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    Ok(response)
}

/// `303` back to `target` with no pass, never cached (the next visit may
/// well get one).
fn back_without_pass(target: &ReturnTo) -> Response {
    let mut response = see_other(target);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn see_other(target: &ReturnTo) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(location) = HeaderValue::from_str(target.as_str()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// The `Set-Cookie` of a pass: the configured name, `Domain` and `Path`,
/// `HttpOnly`, `SameSite=Lax` (a visitor following a link to the shop
/// still arrives with it), `Secure` per `--cookie-secure`.
fn pass_cookie(
    state: &AppState,
    token: &str,
    max_age_secs: u64,
    client: &super::client::ClientInfo,
) -> String {
    let settings = &state.settings().pass_cookie;
    let mut cookie = Cookie::build((settings.name.clone(), token.to_owned()))
        .path(settings.path.clone())
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.cookie_secure(client))
        .max_age(cookie::time::Duration::seconds(max_age_secs as i64));
    if let Some(domain) = &settings.domain {
        cookie = cookie.domain(domain.clone());
    }
    cookie.build().to_string()
}

#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct CheckQuery {
    /// The room (queue) the protected site belongs to. Optional when the
    /// instance has one queue.
    queue: Option<String>,
    /// `1`: answer a browser's page request (`Accept: text/html`) without
    /// a pass with `303` to the waiting page rather than `401` (Caddy
    /// `forward_auth`, Traefik, which pass the answer on as it is; nginx
    /// `auth_request` takes only 2xx, 401 and 403: leave it off there).
    redirect: Option<String>,
}

impl CheckQuery {
    /// Reads the check's query as the `Query` extractor would (unknown
    /// parameters ignored, a parameter named twice refused), without its
    /// serde machinery, which was a tenth of the check's time.
    fn from_query(query: Option<&str>) -> Result<Self, ApiError> {
        let mut out = Self {
            queue: None,
            redirect: None,
        };
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let slot = match key.as_ref() {
                "queue" => &mut out.queue,
                "redirect" => &mut out.redirect,
                _ => continue,
            };
            if slot.is_some() {
                return Err(ApiError::bad_request(
                    ErrorCode::InvalidCheckQuery,
                    format!("Failed to deserialize query string: duplicate field `{key}`"),
                ));
            }
            *slot = Some(value.into_owned());
        }
        Ok(out)
    }
}

/// The gateway check: `200` with `X-Waitroom-Visitor`, `X-Waitroom-Room`
/// and `X-Waitroom-Session` for a valid pass of the room; `401` (or `303`
/// with `redirect=1` for a browser) with `Location` and
/// `X-Waitroom-Location` naming the waiting page (carrying the visitor's
/// original URL as `return` when it is on a protected origin) and
/// `X-Waitroom-Reason` (`missing`, `expired`, `other_room`, `ended`, …).
/// The original URL is read from `X-Original-URI` (nginx) or
/// `X-Forwarded-Uri` (Caddy, Traefik), with `X-Forwarded-Proto` and
/// `X-Forwarded-Host` (else `Host`).
#[utoipa::path(
    get,
    path = "/api/gate/check",
    tag = "pass",
    params(CheckQuery),
    responses(
        (status = 200, description = "A valid pass for the room: go on. `X-Waitroom-Visitor`, `X-Waitroom-Room`, `X-Waitroom-Session` name it."),
        (status = 303, description = "No valid pass, `redirect=1` and a page request: `Location` is the waiting page."),
        (status = 401, description = "No valid pass: `X-Waitroom-Reason` says why, `Location` and `X-Waitroom-Location` name the waiting page."),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
    )
)]
pub(super) async fn check(
    State(state): State<AppState>,
    // The whole request, moved rather than its headers cloned: this runs
    // before every request to the protected site. Its query is read the
    // one way `check_lean` reads it.
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let query = CheckQuery::from_query(request.uri().query())?;
    answer_check(&state, &query, request.headers())
}

/// The methods the check answers: any a gateway may forward (nginx's
/// `auth_request` keeps the visitor's own, WebDAV's and custom ones
/// included), `GET` and `HEAD` the documented ones. `TRACE` and `CONNECT`
/// go through the router (`405 method_not_allowed`, with `Allow`).
pub(super) fn is_check_method(method: &Method) -> bool {
    !matches!(*method, Method::TRACE | Method::CONNECT)
}

/// Who reads a check's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    /// Anyone: the public listener, where a browser may ask too.
    Anyone,
    /// A gateway: the gateway listener (`--gate-addr`).
    Gateway,
}

/// The gateway check served outside the public router's layers (see
/// `super::router`): it runs before every request to the protected site,
/// and the layers are for waitroom's own API (cookie names, cross-origin
/// refusal, the request span). What of them concerns the check is kept
/// here: a repeated identity header is refused (`400 duplicate_header`),
/// every answer carries the security headers and `Cache-Control:
/// no-store`, bad input is the JSON error shape, and `HEAD` gets the
/// head alone.
///
/// `Reader::Gateway` (the gateway listener, whose only clients are
/// gateways): a `200` carries the check's own headers and `no-store`, not
/// the page's security headers. No gateway hands an accepting answer to
/// the browser (nginx and HAProxy read it, Caddy and Traefik copy named
/// headers from it), while a refusal may be passed on as it is (Caddy,
/// Traefik), so refusals keep every header.
pub(super) fn check_lean<B>(
    state: &AppState,
    request: &axum::http::Request<B>,
    reader: Reader,
) -> Response {
    let headers = request.headers();
    // One name per header line: a repeat is two lines of one name.
    let names = headers.iter().map(|(name, _)| name.as_str());
    let answer = match super::headers::repeated_identity_header(names) {
        Some(name) => Err(ApiError::bad_request(
            ErrorCode::DuplicateHeader,
            format!("the {name} header must be sent at most once"),
        )),
        None => CheckQuery::from_query(request.uri().query())
            .and_then(|query| answer_check(state, &query, headers)),
    };
    let mut response = answer.unwrap_or_else(IntoResponse::into_response);
    if reader == Reader::Gateway && response.status() == StatusCode::OK {
        const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, NO_STORE);
    } else {
        super::security::apply(response.headers_mut(), true);
    }
    if *request.method() == Method::HEAD {
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, axum::body::Body::empty());
    }
    response
}

/// The check's answer for `query` and the request's `headers`.
fn answer_check(
    state: &AppState,
    query: &CheckQuery,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let room = check_room(state, query.queue.as_deref())?;
    let passes = state.passes();
    let verdict = match pass_from_headers(headers, &state.settings().pass_cookie.name) {
        Presented::Nothing => Err(PassRejection::Missing),
        Presented::Oversized => Err(PassRejection::Oversized),
        Presented::Token(token) => passes.verify_for(token, &room, now_ms() / 1000),
    };
    match verdict {
        Ok(claims) => {
            passes.note_activity(&claims);
            let mut response = StatusCode::OK.into_response();
            let h = response.headers_mut();
            h.reserve(8);
            for (name, value) in [
                (VISITOR, claims.sub.as_str()),
                (ROOM, claims.room.as_str()),
                (SESSION, claims.jti.as_str()),
            ] {
                if let Ok(v) = HeaderValue::from_str(value) {
                    h.insert(name, v);
                }
            }
            Ok(response)
        }
        Err(why) => Ok(refused(
            state,
            &room,
            headers,
            why,
            query.redirect.as_deref() == Some("1"),
        )),
    }
}

/// The room a check is for: `?queue=`, or the instance's only queue.
fn check_room(state: &AppState, raw: Option<&str>) -> Result<QueueName, ApiError> {
    let unknown = || ApiError::not_found(ErrorCode::UnknownQueue, "no such queue");
    match raw {
        Some(raw) => QueueName::parse(raw)
            .ok()
            .filter(|q| state.has_queue(q))
            .ok_or_else(unknown),
        None => {
            let names = state.queue_names();
            match names.as_slice() {
                [only] => Ok(only.clone()),
                _ => Err(ApiError::not_found(
                    ErrorCode::UnknownQueue,
                    "name the room: ?queue=<queue> (this instance has several)",
                )),
            }
        }
    }
}

/// The answer to a request without a valid pass: where the waiting page
/// is, with the original URL to come back to when it may be.
fn refused(
    state: &AppState,
    room: &QueueName,
    headers: &HeaderMap,
    why: PassRejection,
    redirect: bool,
) -> Response {
    let page = waiting_page(state, room, headers);
    let html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    let status = if redirect && html {
        StatusCode::SEE_OTHER
    } else {
        StatusCode::UNAUTHORIZED
    };
    let mut response = status.into_response();
    let h = response.headers_mut();
    h.insert(REASON, HeaderValue::from_static(why.code()));
    if let Ok(location) = HeaderValue::from_str(&page) {
        h.insert(header::LOCATION, location.clone());
        h.insert(LOCATION, location);
    }
    response
}

/// The waiting page's URL for `room`, with `return` when the visitor's
/// original URL is one to send them back to.
fn waiting_page(state: &AppState, room: &QueueName, headers: &HeaderMap) -> String {
    let settings = state.settings();
    let base = settings
        .pass_page_url
        .clone()
        .unwrap_or_else(|| format!("{}/", settings.base_path));
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("queue", room.as_str());
    if let Some(back) = original_url(state, headers) {
        query.append_pair("return", back.as_str());
    }
    format!("{base}?{}", query.finish())
}

/// The URL the visitor asked the protected site for, validated: an
/// absolute URL when its origin is a protected one; only its path when
/// the waiting page is on the same host (no `--pass-page-url`), whatever
/// `Host` said; nothing otherwise.
fn original_url(state: &AppState, headers: &HeaderMap) -> Option<ReturnTo> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let raw = header("x-original-uri").or_else(|| header("x-forwarded-uri"))?;
    let settings = state.settings();
    let origins = &settings.protected_origins;
    // The path first, by the same rules as any return path (no `//`,
    // backslash or encoded tricks), normalised.
    let path = match crate::pass::validate_return(raw, origins).ok()? {
        ReturnTo::Path(path) => path,
        ReturnTo::Url(_) => return None,
    };
    if let Some(host) = header("x-forwarded-host").or_else(|| header("host")) {
        let proto = match header("x-forwarded-proto") {
            Some("https") => "https",
            _ => "http",
        };
        let absolute = format!("{proto}://{host}{path}");
        if let Ok(url @ ReturnTo::Url(_)) = crate::pass::validate_return(&absolute, origins) {
            return Some(url);
        }
    }
    settings
        .pass_page_url
        .is_none()
        .then_some(ReturnTo::Path(path))
}

/// A session ended by an operator.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct EndedBody {
    session: String,
    queue: String,
}

/// Ends a session now: its pass is refused by every instance within about
/// a second, and its slot goes to the next in line two seconds after the
/// end (once every instance refuses the pass).
#[utoipa::path(
    delete,
    path = "/api/admin/sessions/{id}",
    tag = "admin",
    security(("admin" = [])),
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{16,64}$", description = "The session's id (the pass's `jti`, `X-Waitroom-Session`).")),
    responses(
        (status = 200, description = "Ended.", body = EndedBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_session`: no live session has this id.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn end_session(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<EndedBody>, ApiError> {
    let unknown = || ApiError::not_found(ErrorCode::UnknownSession, "no live session has this id");
    let id = SessionId::parse(&raw).map_err(|_| unknown())?;
    for queue in state.queue_names() {
        if state.store().end_session(&queue, &id).await? {
            tracing::info!(%queue, session = %id, "session ended by an operator");
            return Ok(Json(EndedBody {
                session: id.as_str().to_owned(),
                queue: queue.as_str().to_owned(),
            }));
        }
    }
    Err(unknown())
}
