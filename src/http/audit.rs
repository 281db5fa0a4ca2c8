//! The admin API of a queue's audit log: `GET
//! /api/admin/queues/{queue}/audit?after=&limit=&kind=`, one page at a
//! time, oldest first.
//!
//! Support looks up what became of a buyer, finance reconciles admissions
//! with orders: both page through the log with `next` as a cursor, which
//! stays valid however much is appended meanwhile (ids only grow). The
//! query is checked whole before the store is asked: a bad one is `400`
//! and reads nothing.

use axum::Json;
use axum::extract::{Path, RawQuery, State};

use super::AppState;
use super::auth::AdminAuth;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::queue::QueueName;
use crate::queue::audit::{AuditId, AuditKind, AuditPage, AuditQuery, MAX_AUDIT_PAGE};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// `/api/admin/queues/{queue}/audit`: `GET`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_audit))
}

/// Entries a page holds unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;

/// The query string, each parameter at most once and none other.
fn parse_query(raw: Option<&str>) -> Result<AuditQuery, ApiError> {
    let bad = |m: &str| ApiError::bad_request(ErrorCode::InvalidAuditQuery, m);
    let mut query = AuditQuery {
        after: None,
        limit: DEFAULT_LIMIT,
        kind: None,
    };
    let mut seen: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        if seen.iter().any(|s| *s == k) {
            return Err(bad(&format!("`{k}` is given more than once")));
        }
        seen.push(k.to_string());
        match k.as_ref() {
            "after" => {
                query.after = Some(
                    v.parse::<AuditId>()
                        .map_err(|_| bad("`after` must be an entry id, <ms>-<seq>"))?,
                )
            }
            "limit" => {
                query.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_AUDIT_PAGE).contains(n))
                    .ok_or_else(|| bad("`limit` must be 1-1000"))?
            }
            "kind" => {
                query.kind = Some(v.parse::<AuditKind>().map_err(|_| {
                    bad("`kind` must be admitted, consumed, released, abandoned, left or soldOut")
                })?)
            }
            _ => return Err(bad(&format!("unknown parameter `{k}`"))),
        }
    }
    Ok(query)
}

/// A page of the queue's audit log (admissions, consumes, releases,
/// abandonments, leaves, sold out), oldest first.
#[utoipa::path(
    get,
    path = "/api/admin/queues/{queue}/audit",
    tag = "admin",
    security(("admin" = [])),
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name (1-64 of `a-z 0-9 _ -`)."),
        ("after" = Option<String>, Query, pattern = r"^[0-9]{1,20}-[0-9]{1,20}$", description = "Entries after this id (a page's `next`); absent: from the oldest kept."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Most entries in the page (default 100)."),
        ("kind" = Option<AuditKind>, Query, description = "Only entries of this kind."),
    ),
    responses(
        (status = 200, description = "A page; `next` is null at the end of the log.", body = AuditPage),
        (status = 400, description = "`invalid_audit_query` (nothing read).", body = ErrorBody),
        (status = 401, description = "`unauthorized` (checked first).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`.", body = ErrorBody),
    )
)]
async fn get_audit(
    _: AdminAuth,
    State(state): State<AppState>,
    Path(raw): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<AuditPage>, ApiError> {
    let unknown = || ApiError::not_found(ErrorCode::UnknownQueue, "no such queue");
    let queue = QueueName::parse(&raw).map_err(|_| unknown())?;
    let query = parse_query(query.as_deref())?;
    state
        .store()
        .queue_settings(&queue)
        .await?
        .ok_or_else(unknown)?;
    Ok(Json(state.store().audit_page(&queue, query).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_checked_whole() {
        let q = parse_query(Some("after=5-1&limit=7&kind=soldOut")).unwrap();
        assert_eq!(q.after, Some(AuditId { ms: 5, seq: 1 }));
        assert_eq!((q.limit, q.kind), (7, Some(AuditKind::SoldOut)));
        assert_eq!(parse_query(None).unwrap().limit, DEFAULT_LIMIT);
        for bad in [
            "after=5",
            "after=",
            "limit=0",
            "limit=1001",
            "limit=-1",
            "kind=sold_out",
            "kind=",
            "limit=1&limit=2",
            "cursor=5-1",
        ] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }
}
