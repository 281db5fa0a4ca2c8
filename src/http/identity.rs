//! The API's side of the identity source ([`crate::identity`]): the
//! extractor of a join's buyer and the API's answer to a refused identity.
//!
//! Position, events and leave check the ticket's user against the same
//! source ([`super::extract::Member`]); the order routes go through the
//! gate, which holds the same source.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::AppState;
use super::client::{ClientInfo, client_of};
use crate::error::{ApiError, ErrorCode};
use crate::identity::IdentityError;
use crate::queue::UserId;
use crate::store::Rate;

/// The API's code for an identity refusal.
pub fn identity_code(e: &IdentityError) -> ErrorCode {
    match e {
        IdentityError::MissingUserHeader => ErrorCode::MissingUserId,
        IdentityError::InvalidUserHeader(_) => ErrorCode::InvalidUserId,
        IdentityError::Missing(_) => ErrorCode::MissingIdentity,
        IdentityError::Invalid(_) => ErrorCode::InvalidIdentity,
        IdentityError::Expired => ErrorCode::IdentityExpired,
    }
}

impl From<IdentityError> for ApiError {
    fn from(e: IdentityError) -> Self {
        let code = identity_code(&e);
        match e {
            // Header mode keeps the gateway contract's answers.
            IdentityError::MissingUserHeader | IdentityError::InvalidUserHeader(_) => {
                ApiError::bad_request(code, e.to_string())
            }
            _ => ApiError::unauthorized(code, e.to_string()),
        }
    }
}

/// The buyer of a join: the request's identity or, in visitor mode, a
/// visitor minted just now, whose cookie the answer must set; and the
/// client it came from.
pub struct Joiner {
    pub user: UserId,
    /// `Set-Cookie` value of a newly minted visitor.
    pub set_cookie: Option<String>,
    /// The client (address, HTTPS) of the request.
    pub client: ClientInfo,
}

impl FromRequestParts<AppState> for Joiner {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let client = client_of(parts, state);
        let resolved = state.identity().for_join(&parts.headers)?;
        let set_cookie = match resolved.minted {
            Some(value) => {
                allow_new_visitor(state, &client).await?;
                Some(state.visitor_cookie(value, &client))
            }
            None => None,
        };
        Ok(Joiner {
            user: resolved.user,
            set_cookie,
            client,
        })
    }
}

/// Counts one new visitor id against `client`'s address (all instances
/// together): `429 visitor_rate_limited` over
/// `--visitors-per-address-per-minute`, `503` when the store does not
/// answer (never an unlimited door).
pub async fn allow_new_visitor(state: &AppState, client: &ClientInfo) -> Result<(), ApiError> {
    let Some(rate) = Rate::per_minute(state.limits().address_policy().visitors_per_minute) else {
        return Ok(());
    };
    let bucket = format!("visitors:{}", client.key());
    match state.store().spend(&bucket, rate).await? {
        Ok(()) => Ok(()),
        Err(limited) => Err(super::limit::address_refused(
            limited.kind,
            std::time::Duration::from_millis(limited.retry_after_ms),
        )),
    }
}
