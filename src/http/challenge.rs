//! Proof of work at the door, over HTTP: `GET /api/queues/{queue}/challenge`
//! hands out an ALTCHA challenge while joins need one, and
//! [`check_join`] holds a join to the `X-Altcha` solution it must carry.
//!
//! The challenge endpoint needs no store call (issuing is two hashes), and
//! answers `204` while joins need no challenge, so the page asks first and
//! only solves when it must. A join that must carry a solution and does
//! not is `428 challenge_required`; one whose solution does not verify,
//! has expired or was used already is `403` (`challenge_invalid`,
//! `challenge_expired`, `challenge_replayed`); all three name
//! `challengeUrl`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::extract::Queue;
use crate::challenge::Refusal;
use crate::error::ErrorCode;
use crate::error::{ApiError, ErrorBody};
use crate::queue::QueueName;

/// The header a join carries its solution in.
pub const SOLUTION_HEADER: &str = "x-altcha";

/// `/api/queues/{queue}/challenge`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(challenge))
}

/// An ALTCHA challenge (the protocol's JSON): find `number` in
/// `0..=maxnumber` with `hex(SHA-256(salt + number)) == challenge`, then
/// join with `X-Altcha: base64({"algorithm","challenge","number","salt","signature"})`.
#[derive(Serialize, utoipa::ToSchema)]
struct ChallengeBody {
    /// Always `SHA-256`.
    #[schema(example = "SHA-256")]
    algorithm: String,
    /// The hash to find, 64 lower-case hex digits.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    challenge: String,
    /// The largest number to try (the difficulty).
    maxnumber: u64,
    /// The salt to hash before the number; carries the queue (`q`) and the
    /// expiry (`expires`, unix seconds), covered by the signature.
    salt: String,
    /// The server's HMAC of `challenge`, 64 hex digits.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    signature: String,
}

/// A join challenge, while joins of this queue need one.
#[utoipa::path(
    get,
    path = "/api/queues/{queue}/challenge",
    tag = "queue",
    operation_id = "challenge",
    params(
        ("queue" = String, Path, pattern = r"^[a-z0-9_-]{1,64}$", example = "default", description = "The queue's name."),
    ),
    responses(
        (status = 200, description = "Joins need a solved challenge now: this one, single use, for this queue only.", body = ChallengeBody),
        (status = 204, description = "Joins need no challenge now."),
        (status = 404, description = "`unknown_queue`.", body = ErrorBody),
        (status = 503, description = "`server_busy` (`Retry-After`).", body = ErrorBody),
    )
)]
async fn challenge(State(state): State<AppState>, Queue(queue): Queue) -> Response {
    let mut response = if state.door_switch().required(&queue) {
        let issued = state.door().issue(&queue);
        Json(ChallengeBody {
            algorithm: issued.algorithm.to_string(),
            challenge: issued.challenge,
            maxnumber: issued.maxnumber,
            salt: issued.salt,
            signature: issued.signature,
        })
        .into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    };
    // A challenge is single use, and whether one is needed changes.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Where a client gets a challenge for `queue`.
fn challenge_url(queue: &QueueName) -> String {
    format!("/api/queues/{queue}/challenge")
}

/// Holds a join of `queue` to its challenge: counts the join for `auto`
/// mode and, while a challenge is needed, checks and spends the `X-Altcha`
/// solution in `headers`. `Ok` lets the join go on.
pub(super) async fn check_join(
    state: &AppState,
    queue: &QueueName,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    if !state.door_switch().on_join(queue) {
        return Ok(());
    }
    let mut values = headers.get_all(SOLUTION_HEADER).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        if headers.contains_key(SOLUTION_HEADER) {
            return Err(ApiError::bad_request(
                ErrorCode::DuplicateHeader,
                "the X-Altcha header must be sent at most once",
            ));
        }
        return Err(ApiError::ChallengeRequired {
            challenge_url: challenge_url(queue),
        });
    };
    let refused = |code: ErrorCode, message: String| ApiError::ChallengeRefused {
        code,
        message,
        challenge_url: challenge_url(queue),
    };
    let solution = value
        .to_str()
        .map_err(|_| refused(ErrorCode::ChallengeInvalid, "X-Altcha is not text".into()))?;
    let outcome = state
        .door()
        .admit(state.store().as_ref(), queue, solution)
        .await;
    metrics::counter!(
        "waitroom_join_challenges_total",
        "result" => match &outcome {
            Ok(()) => "passed",
            Err(Refusal::Invalid(_)) => "invalid",
            Err(Refusal::Expired) => "expired",
            Err(Refusal::Replayed) => "replayed",
            Err(Refusal::Store(_)) => "store_error",
        }
    )
    .increment(1);
    match outcome {
        Ok(()) => Ok(()),
        Err(Refusal::Store(e)) => Err(ApiError::Unavailable(e)),
        Err(e @ Refusal::Invalid(_)) => Err(refused(ErrorCode::ChallengeInvalid, e.to_string())),
        Err(e @ Refusal::Expired) => Err(refused(ErrorCode::ChallengeExpired, e.to_string())),
        Err(e @ Refusal::Replayed) => Err(refused(ErrorCode::ChallengeReplayed, e.to_string())),
    }
}
