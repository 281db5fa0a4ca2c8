//! The public admission log on the buyers' listener, for anyone to read
//! (`crate::fairness` builds it; docs/fairness.md says how to check it):
//!
//! - `GET /.well-known/waitroom-keys.json`: the keys receipts and heads
//!   are signed with (JWKS, `kid`);
//! - `GET /api/queues/{queue}/log`: the latest signed head;
//! - `GET .../log/entries?start=&count=`: leaves, a page of at most 1,000;
//! - `GET .../log/inclusion?index=&size=`: a leaf's inclusion proof;
//! - `GET .../log/consistency?first=&second=`: that the tree of `second`
//!   leaves extends the one of `first`.
//!
//! Queries are checked whole before the store is asked (`400
//! invalid_log_query`, nothing read); with `--fairness-log` off every one
//! is `404 fairness_log_off`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use base64::Engine;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::extract::Queue;
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::fairness::{Fairness, log};
use crate::queue::fairness::MAX_LOG_PAGE;

/// The log's routes and the keys' well-known path.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(keys))
        .routes(routes!(head))
        .routes(routes!(entries))
        .routes(routes!(inclusion))
        .routes(routes!(consistency))
}

fn fairness(state: &AppState) -> Result<&Arc<Fairness>, ApiError> {
    state.fairness().ok_or_else(|| {
        ApiError::not_found(
            ErrorCode::FairnessLogOff,
            "this server keeps no public admission log (--fairness-log)",
        )
    })
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(ErrorCode::InvalidLogQuery, message)
}

/// The query's numbers, each of `names` at most once and nothing else.
fn numbers<const N: usize>(
    raw: Option<&str>,
    names: [&str; N],
) -> Result<[Option<u64>; N], ApiError> {
    let mut out = [None; N];
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let Some(i) = names.iter().position(|n| *n == k) else {
            return Err(bad(format!("unknown parameter `{k}`")));
        };
        if out[i].is_some() {
            return Err(bad(format!("`{k}` is given more than once")));
        }
        // Digits only: `u64::from_str` takes a leading `+`.
        if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("`{k}` must be a whole number")));
        }
        out[i] = Some(v.parse().map_err(|_| bad(format!("`{k}` is too large")))?);
    }
    Ok(out)
}

/// The published keys.
#[derive(Serialize, utoipa::ToSchema)]
struct Keys {
    /// Ed25519 public keys (RFC 8037 JWK: `kty` OKP, `crv` Ed25519, `x`, `kid`).
    #[schema(value_type = Vec<Object>)]
    keys: Vec<jsonwebtoken::jwk::Jwk>,
}

/// The keys receipts and log heads are signed with.
#[utoipa::path(
    get,
    path = "/.well-known/waitroom-keys.json",
    tag = "fairness",
    responses(
        (status = 200, description = "The signing keys (JWKS).", body = Keys),
        (status = 404, description = "`fairness_log_off`.", body = ErrorBody),
    )
)]
async fn keys(State(state): State<AppState>) -> Result<Json<Keys>, ApiError> {
    let now = crate::clock::now_ms() / 1000;
    Ok(Json(Keys {
        keys: fairness(&state)?.jwks(now).keys,
    }))
}

/// A signed head and what it says.
#[derive(Serialize, utoipa::ToSchema)]
struct HeadView {
    /// The head as signed: a compact JWS (`EdDSA`, `kid`) whose payload is
    /// `{queue, size, root, at}`. Save it to check later heads against.
    head: String,
    /// Its payload, decoded (the signature covers the JWS only).
    #[schema(value_type = Object)]
    payload: serde_json::Value,
}

/// The queue's latest signed head (signed every few seconds).
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/log",
    tag = "fairness",
    params(("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name.")),
    responses(
        (status = 200, description = "The latest signed head.", body = HeadView),
        (status = 404, description = "`unknown_queue`, `fairness_log_off`, `not_found` (no head signed yet).", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn head(
    State(state): State<AppState>,
    Queue(queue): Queue,
) -> Result<Json<HeadView>, ApiError> {
    fairness(&state)?;
    let head =
        state.store().log_head(&queue).await?.ok_or_else(|| {
            ApiError::not_found(ErrorCode::NotFound, "no head has been signed yet")
        })?;
    let payload = head
        .split('.')
        .nth(1)
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .ok()
        })
        .and_then(|p| serde_json::from_slice(&p).ok())
        .ok_or_else(|| ApiError::Internal("a stored head is not a JWS".into()))?;
    Ok(Json(HeadView { head, payload }))
}

/// A page of leaves.
#[derive(Serialize, utoipa::ToSchema)]
struct Leaves {
    /// The index of the first leaf.
    start: u64,
    /// The log's size now (may be ahead of the latest head).
    size: u64,
    /// The leaves, each the exact JSON text its leaf hash is over
    /// (`SHA-256(0x00 || text)`): `{kind, seq, fp, pass?, at, audit}`.
    leaves: Vec<String>,
}

/// Leaves of the log, oldest first, `count` (1-1000, default 1000) from
/// `start` (default 0).
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/log/entries",
    tag = "fairness",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
        ("start" = Option<u64>, Query, description = "The first leaf's index."),
        ("count" = Option<u64>, Query, minimum = 1, maximum = 1000, description = "Most leaves in the page."),
    ),
    responses(
        (status = 200, description = "The page.", body = Leaves),
        (status = 400, description = "`invalid_log_query` (nothing read).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`, `fairness_log_off`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn entries(
    State(state): State<AppState>,
    Queue(queue): Queue,
    RawQuery(raw): RawQuery,
) -> Result<Json<Leaves>, ApiError> {
    fairness(&state)?;
    let [start, count] = numbers(raw.as_deref(), ["start", "count"])?;
    let count = count.unwrap_or(MAX_LOG_PAGE);
    if !(1..=MAX_LOG_PAGE).contains(&count) {
        return Err(bad("`count` must be 1-1000"));
    }
    let start = start.unwrap_or(0);
    let size = state.store().log_state(&queue).await?.size;
    let leaves = if start < size {
        state.store().log_leaves(&queue, start, count).await?
    } else {
        Vec::new()
    };
    Ok(Json(Leaves {
        start,
        size,
        leaves,
    }))
}

/// A proof: node hashes, hex, in the order RFC 9162 lists them.
#[derive(Serialize, utoipa::ToSchema)]
struct Proof {
    /// The leaf (inclusion) or the earlier size (consistency).
    from: u64,
    /// The tree's size the proof is for.
    size: u64,
    path: Vec<String>,
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves
/// (RFC 9162 2.1.3): check it against a signed head of that size.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/log/inclusion",
    tag = "fairness",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
        ("index" = u64, Query, description = "The leaf."),
        ("size" = u64, Query, description = "The tree's size: a signed head's, at most the log's."),
    ),
    responses(
        (status = 200, description = "The proof.", body = Proof),
        (status = 400, description = "`invalid_log_query`: missing, not a number, or not `index < size <= the log's size` (nothing read but the size).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`, `fairness_log_off`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn inclusion(
    State(state): State<AppState>,
    Queue(queue): Queue,
    RawQuery(raw): RawQuery,
) -> Result<Json<Proof>, ApiError> {
    fairness(&state)?;
    let [index, size] = numbers(raw.as_deref(), ["index", "size"])?;
    let (Some(index), Some(size)) = (index, size) else {
        return Err(bad("give `index` and `size`"));
    };
    let logged = state.store().log_state(&queue).await?.size;
    if index >= size || size > logged {
        return Err(bad(format!(
            "need index < size <= {logged} (the log's size)"
        )));
    }
    let path = log::inclusion_proof(&**state.store(), &queue, index, size).await?;
    Ok(Json(Proof {
        from: index,
        size,
        path: path.iter().map(hex::encode).collect(),
    }))
}

/// The consistency proof from the tree of `first` leaves to the tree of
/// `second` (RFC 9162 2.1.4): a later head extends an earlier one.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/log/consistency",
    tag = "fairness",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
        ("first" = u64, Query, description = "The earlier head's size."),
        ("second" = u64, Query, description = "The later head's size, at most the log's."),
    ),
    responses(
        (status = 200, description = "The proof.", body = Proof),
        (status = 400, description = "`invalid_log_query`: missing, not a number, or not `1 <= first <= second <= the log's size` (nothing read but the size).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`, `fairness_log_off`.", body = ErrorBody),
        (status = 503, description = "`store_unavailable`, `server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn consistency(
    State(state): State<AppState>,
    Queue(queue): Queue,
    RawQuery(raw): RawQuery,
) -> Result<Json<Proof>, ApiError> {
    fairness(&state)?;
    let [first, second] = numbers(raw.as_deref(), ["first", "second"])?;
    let (Some(first), Some(second)) = (first, second) else {
        return Err(bad("give `first` and `second`"));
    };
    let logged = state.store().log_state(&queue).await?.size;
    if first == 0 || first > second || second > logged {
        return Err(bad(format!(
            "need 1 <= first <= second <= {logged} (the log's size)"
        )));
    }
    let path = log::consistency_proof(&**state.store(), &queue, first, second).await?;
    Ok(Json(Proof {
        from: first,
        size: second,
        path: path.iter().map(hex::encode).collect(),
    }))
}
